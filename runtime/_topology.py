"""How a live deployment's topology differs from the one a manifest recorded (S8).

One comparison, used by the runtime before a restore (``verify_snapshot`` with ``live``) and by
every Gym instance before it installs committed state: the same participants by name, of the
same kinds, in the same order, for the same instances. Each difference is one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._snapshot_format import GymManifest, ParticipantRecord

__all__ = ["LiveTopology", "participant_differences", "topology_differences"]

LiveTopology = Mapping[str, Sequence[tuple[str, str]]]
"""Instance name -> ``[(server_name, kind)]`` of its live participants, in topology order."""


def participant_differences(
    where: str, committed: Sequence[ParticipantRecord], live: Sequence[tuple[str, str]]
) -> list[str]:
    """How one instance's live participants differ from the committed ones: missing, extra,
    another kind, another order, or listed twice live. ``where`` names the instance."""
    diffs: list[str] = []
    live_kinds: dict[str, str] = {}
    live_order: list[str] = []
    for server_name, live_kind in live:
        if server_name in live_kinds:
            diffs.append(f"{where}: live participant {server_name} listed twice")
            continue
        live_kinds[server_name] = live_kind
        live_order.append(server_name)
    committed_order = [p.server_name for p in committed]
    for p in committed:
        kind = live_kinds.get(p.server_name)
        if kind is None:
            diffs.append(f"{where}: participant {p.server_name} missing from the live deployment")
        elif kind != p.kind:
            diffs.append(
                f"{where}: participant {p.server_name} kind {p.kind} committed, {kind} live"
            )
    committed_names = set(committed_order)
    for server_name in live_order:
        if server_name not in committed_names:
            diffs.append(f"{where}: extra live participant {server_name}")
    common_committed = [n for n in committed_order if n in live_kinds]
    common_live = [n for n in live_order if n in committed_names]
    if common_committed != common_live:
        diffs.append(
            f"{where}: participant order {', '.join(common_committed)} committed, "
            f"{', '.join(common_live)} live"
        )
    return diffs


def topology_differences(manifest: GymManifest, live: LiveTopology) -> list[str]:
    """How the live deployment differs from the manifest's topology, one line each."""
    diffs: list[str] = []
    for instance in manifest.instances:
        if instance.name not in live:
            diffs.append(f"instance {instance.name}: missing from the live deployment")
            continue
        diffs += participant_differences(
            f"instance {instance.name}", instance.participants, live[instance.name]
        )
    recorded = {instance.name for instance in manifest.instances}
    for name in sorted(set(live) - recorded):
        diffs.append(f"instance {name}: live but not in the manifest")
    return diffs
