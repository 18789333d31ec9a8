"""Restore: from the latest complete rollout snapshot back to a running ledger (S8, S11, S13).

Order matters, and each step leaves Gym untouched until the one that installs state:

1. pick the latest complete snapshot and **copy it first** (pin), so trainer-checkpoint
   retention can never prune what we restore from (S13);
2. load it strictly (marker, digests of its files, manifest structure, paths inside it);
3. check the live topology and every participant's on-disk digest against the manifest — any
   difference raises ``TopologyMismatch`` listing all of them, and Gym is untouched (S8);
4. ask every instance, concurrently and each bounded, to restore its committed state;
5. rebuild the ledger: each exported episode becomes attempt + 1, pinned to its original
   replica and **unclaimed** until its dispatch claims it (S11); completed-but-untrained
   results go straight to the trainer.
"""

from __future__ import annotations

import functools
from pathlib import Path

import attrs

from gymckpt.gym_adapter import GymBackend
from gymckpt.runtime import (
    GymManifest,
    LoadedSnapshot,
    ManifestError,
    RecoveryLedger,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    check_snapshot,
    load_snapshot,
)
from gymckpt.runtime._ledger import LedgerSnapshot, RestoreSummary, load_ledger_snapshot, rollout_id_for

from ._calls import fan_out
from ._offload import offload

__all__ = ["RestoredRun", "ledger_manifest_differences", "restore_latest"]

LEDGER_FILE = "ledger.json"


@attrs.frozen
class RestoredRun:
    """What a restore hands to the facade."""

    snapshot: SnapshotInfo
    pinned: SnapshotInfo
    ledger: RecoveryLedger
    summary: RestoreSummary
    files: dict[str, bytes]


def ledger_manifest_differences(manifest: GymManifest, ledger: LedgerSnapshot) -> list[str]:
    """Where ``ledger.json`` and ``gym_checkpoint.json`` of one snapshot disagree (a short
    sample of each kind): every attempt in flight must be exported, and every exported episode
    must be in flight or held unclaimed by a restored attempt."""
    dispatched = {rollout_id_for(a.row, a.slot, a.attempt) for a in ledger.attempts
                  if a.state == "dispatched"}
    unclaimed = {a.restored.from_rollout_id for a in ledger.attempts
                 if a.unclaimed and a.restored is not None}
    exported = {e.rollout_id for e in manifest.episodes}
    problems = [f"ledger.json: {rid} in flight but not exported in gym_checkpoint.json"
                for rid in sorted(dispatched - exported)[:5]]
    problems += [f"gym_checkpoint.json: episode {rid} exported but not in flight in the ledger"
                 for rid in sorted(exported - dispatched - unclaimed)[:5]]
    return problems


async def restore_latest(
    gym: GymBackend, store: SnapshotStore, pin_dir: Path, config: RuntimeConfig
) -> RestoredRun | None:
    """Restore the latest complete snapshot in ``store``; None when there is none."""
    info = await offload(store.latest_complete)
    if info is None:
        return None
    dest = pin_dir / info.path.name
    pinned = await offload(lambda: store.pin(info, dest))
    snap: LoadedSnapshot = await offload(lambda: load_snapshot(pinned.path))
    topology = await gym.topology()
    live = {i.name: list(i.participants) for i in topology.instances}
    await offload(lambda: check_snapshot(snap, live))
    if LEDGER_FILE not in snap.files:
        raise ManifestError(f"{pinned.path}: {LEDGER_FILE} missing from the snapshot")
    ledger_snap = await offload(lambda: load_ledger_snapshot(snap.files[LEDGER_FILE]))
    problems = ledger_manifest_differences(snap.manifest, ledger_snap)
    if problems:  # before Gym installs anything
        raise ManifestError(f"{pinned.path}: " + "; ".join(problems))
    episodes_by_replica: dict[str, list] = {}
    for ep in snap.manifest.episodes:
        episodes_by_replica.setdefault(ep.replica, []).append(ep)
    state_root = str(await offload(pinned.path.resolve))
    await fan_out(
        "restore",
        {
            rec.name: functools.partial(
                gym.restore, rec.name, state_root, rec, tuple(episodes_by_replica.get(rec.name, ()))
            )
            for rec in snap.manifest.instances
        },
        config,
    )
    ledger, summary = RecoveryLedger.from_snapshot(ledger_snap, snap.manifest.episodes)
    return RestoredRun(info, pinned, ledger, summary, dict(snap.files))
