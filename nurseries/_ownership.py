"""What a checkpoint's commit replies say, checked against the topology and the ledger.

Pure rules over data, run off the event loop (``offload``) while Gym is parked:

* ``check_replies``: every instance answered for this checkpoint with exactly the topology's
  participants, sha256 digests and state directories inside the snapshot; any difference is a
  ``CheckpointInvariantError`` listing all of them.
* ``ownership`` (S10): an episode is owned by the participant that exported it, else by a legacy
  agent session with a step boundary; a parked session nobody owns and whose reply is not on the
  wire is a ``StrandedSessionError`` (it could never reply while Gym is prepared).
* ``cut``: under the barrier's hold, the ledger's inventory per instance equals what Gym exported
  (allowing for drops after the retire stage and for streams whose end the consumer has not read
  yet), and the ledger is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from gymckpt.gym_adapter import CommitReply, Topology
from gymckpt.runtime import (
    CheckpointInvariantError,
    InstanceRecord,
    ParticipantRecord,
    RecoveryLedger,
    StrandedSessionError,
)
from gymckpt.runtime._shared import (
    GYM_STATE_DIR,
    EpisodeColumns,
    sample_ids,
    set_in_slices,
    state_dir_problem,
)

__all__ = ["Cut", "Ownership", "check_replies", "cut", "ownership"]


@attrs.frozen
class Ownership:
    """Who owns each episode of a checkpoint (S10), from the commit replies."""

    episodes: EpisodeColumns
    by_instance: Mapping[str, frozenset[str]]
    on_wire: Mapping[str, frozenset[str]]
    """Per instance: replies on the wire for episodes it did not export."""


@attrs.frozen
class Cut:
    """A consistent cut of the ledger, or what keeps it from being one (``unaccounted``)."""

    ledger_bytes: bytes
    episodes: EpisodeColumns
    unaccounted: Mapping[str, frozenset[str]]
    """Per instance: in flight in the ledger, neither exported nor on the wire."""


def ownership(replies: Mapping[str, CommitReply], order: Sequence[str]) -> Ownership:
    """The ownership rule (S10), a pure function of the commit replies (runs off the loop).

    Built as columns (``EpisodeColumns``): a pass per field over each reply's exported
    episodes, no object per episode; legacy agent sessions (rare) one by one after them."""
    columns: tuple[list[str], list[str], list[str], list[Sequence[str]]] = ([], [], [], [])
    ids, owners, replicas, keys = columns
    by_instance: dict[str, frozenset[str]] = {}
    on_wire: dict[str, frozenset[str]] = {}
    for name in order:
        reply = replies[name]
        exported = reply.exported
        got = [ep.rollout_id for ep in exported]
        owned = frozenset(set_in_slices(got))
        if len(owned) != len(got):
            seen: set[str] = set()
            twice = next(r for r in got if r in seen or seen.add(r))  # type: ignore[func-returns-value]
            raise CheckpointInvariantError(f"instance {name}: episode {twice} exported twice")
        ids += got
        owners += [ep.owner for ep in exported]
        keys += [ep.capture_keys for ep in exported]
        replicas += [name] * len(got)
        if reply.sessions:
            owned = _legacy_owned(name, reply, owned, columns)
        by_instance[name] = owned
        on_wire[name] = frozenset(reply.on_wire) - owned
    return Ownership(EpisodeColumns(*columns), by_instance, on_wire)


def _legacy_owned(
    name: str,
    reply: CommitReply,
    owned: frozenset[str],
    columns: tuple[list[str], list[str], list[str], list[Sequence[str]]],
) -> frozenset[str]:
    """``owned`` plus the episodes of ``reply``'s legacy agent sessions with a step boundary
    that no participant exported (appended to ``columns``); ``StrandedSessionError`` for a
    parked session nobody owns whose reply is not on the wire."""
    legacy: dict[str, None] = {}
    stranded: list[str] = []
    for sess in reply.sessions:
        if sess.rollout_id in owned or sess.rollout_id in legacy:
            continue
        if sess.kind == "legacy_agent" and sess.step_boundary is not None:
            legacy[sess.rollout_id] = None
            for column, value in zip(
                columns, (sess.rollout_id, sess.participant, name, sess.capture_keys), strict=True
            ):
                column.append(value)  # type: ignore[arg-type]
        elif sess.rollout_id not in reply.on_wire:
            stranded.append(sess.rollout_id)
    if stranded:
        raise StrandedSessionError(name, stranded)
    return owned | frozenset(legacy)


def check_replies(
    replies: Mapping[str, CommitReply], topology: Topology, checkpoint_id: str
) -> tuple[InstanceRecord, ...]:
    """Validate commit replies against the live topology; build the manifest's instances."""
    records: list[InstanceRecord] = []
    problems: list[str] = []
    for inst in topology.instances:
        reply = replies[inst.name]
        if reply.instance != inst.name or reply.checkpoint_id != checkpoint_id:
            problems.append(
                f"instance {inst.name}: reply is for {reply.instance}/{reply.checkpoint_id}, "
                f"expected {inst.name}/{checkpoint_id}"
            )
            continue
        got = tuple((p.server_name, p.kind) for p in reply.participants)
        if got != inst.participants:
            problems.append(
                f"instance {inst.name}: committed participants {list(got)}, "
                f"topology {list(inst.participants)}"
            )
            continue
        parts = []
        for p in reply.participants:
            if not p.records_digest.startswith("sha256:"):
                problems.append(
                    f"instance {inst.name}: participant {p.server_name} digest "
                    f"{p.records_digest!r} is not a sha256 digest"
                )
            outside = state_dir_problem(p.state_dir)
            if outside is not None:
                problems.append(
                    f"instance {inst.name}: participant {p.server_name} state_dir {outside}"
                )
                continue
            rel = Path(p.state_dir)
            parts.append(
                ParticipantRecord(
                    p.server_name, p.kind, f"{GYM_STATE_DIR}/{rel.as_posix()}", p.records_digest
                )
            )
        records.append(InstanceRecord(inst.name, tuple(parts)))
    if problems:
        raise CheckpointInvariantError("commit reply mismatch: " + "; ".join(problems))
    return tuple(records)


def cut(ledger: RecoveryLedger, owned: Ownership, names: Sequence[str]) -> Cut:
    """Inventory check and ledger copy; runs in a thread while the barrier is held.

    Per instance, what the ledger holds there must equal what Gym exported, except:

    * an exported episode the ledger dropped after the retire stage (an early stream end
      during the checkpoint: S4's "a drop recorded meanwhile waits for the next
      checkpoint") is in the retire queue. It is not recorded in the manifest (not ours to
      restore); the ledger copy carries the retire queue, so a restore retires it before
      dispatching its replacement;
    * an episode the ledger has in flight that Gym neither exported nor listed on the wire
      is *unaccounted*: its stream ended and the consumer has not read the end yet. Nothing
      is copied; the caller waits for them and cuts again.

    An exported episode the ledger neither holds nor dropped is an ownership violation.
    """
    queued = ledger.retire_queue()
    dropped: set[str] = set()
    unaccounted: dict[str, frozenset[str]] = {}
    for name in names:
        held = ledger.held_by(name)
        exported = owned.by_instance.get(name, frozenset())
        gone = exported & {item.rollout_id for item in queued.get(name, ())}
        dropped |= gone
        # comprehensions, not set differences: one C call over 250k IDs would hold the GIL
        missing = [r for r in held if r not in exported]
        extra = [r for r in exported if r not in held and r not in gone]
        if extra:
            raise CheckpointInvariantError(
                f"instance {name}: Gym exported {sample_ids(extra)} episodes the ledger "
                "does not hold"
            )
        if missing:
            unaccounted[name] = frozenset(missing)
    if unaccounted:
        return Cut(b"", EpisodeColumns((), (), (), ()), unaccounted)
    return Cut(ledger.snapshot_bytes(), owned.episodes.without(dropped), {})
