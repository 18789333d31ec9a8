"""Conformance of a ``GymBackend``: the contract the runtime relies on, checked from outside.

``check_backend(gym, workdir)`` drives an open backend through the data and control planes:

1. ``topology``: instances named once each, every one with participants.
2. ``replies``: every row of a run gets exactly one final reply (completed or failed).
3. ``commit``: after ``prepare`` on every instance, ``commit`` answers for the right instance and
   checkpoint, lists the topology's participants in order, with relative state directories
   whose records on disk carry the reported sha256 digest; no episode is both exported and on
   the wire.
4. ``retire_refused_while_prepared``: ``retire`` raises ``GymControlError`` during a checkpoint.
5. ``cut``: between the commits and the resume, the only replies delivered are ones a commit
   listed on the wire (a reply produced after an instance's cut waits for the resume).
6. ``resume``: after ``resume`` every row of the run still gets exactly one final reply.
7. ``restore_refuses_mismatch``: ``restore`` of a record with a participant the instance does
   not have raises ``TopologyMismatch`` and leaves nothing unclaimed.

8-12. The real-usage checks of ``_backend_usage``: ``trainer_terms``,
   ``trainer_restart[running]`` and ``trainer_restart[prepared]`` (a trainer abandoned as a
   SIGKILL leaves it, with its episodes running or its checkpoint open, and the next term of
   its run attaching: everything of the old term fenced, every row ending once),
   ``second_trainer`` (another run refused with ``GymInUse``, the holder's run unaffected) and
   ``shuffled_restore`` (a shuffled two-epoch order through ``open_rollouts``, checkpointed,
   abandoned and restored: every position once). They leave the instances released.

Checks 3-6 run once per ``CheckpointMode`` (``commit[aligned]``, ``commit[unaligned]``, ...): the
aligned checkpoint calls ``prepare(instance, checkpoint_id, deadline_ts)``, the unaligned one
passes ``CheckpointMode.UNALIGNED`` as the fourth argument. A backend whose ``prepare`` takes no
``mode`` fails ``prepare_mode`` (naming the contract's signature) and its unaligned checks are
not run; one whose ``prepare`` takes no ``alignment_timeout_s`` keyword (the trainer passes it
to every prepare) fails ``prepare_alignment_timeout``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import trio

from gymckpt.gym_adapter import (
    Completed,
    Failed,
    GymBackend,
    GymControlError,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.runtime import (
    CheckpointMode,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    records_digest,
    rollout_id_for,
)
from gymckpt.runtime._shared import state_dir_problem

from ._backend_usage import check_usage
from ._report import Checks, ConformanceReport

__all__ = ["check_backend"]


async def _read(stream: ReplyStream, into: list[RunReply]) -> None:
    async for batch in stream:
        into.extend(batch)


async def _read_phased(
    stream: ReplyStream, into: list[tuple[str, RunReply]], phase: list[str]
) -> None:
    """Each reply with the phase of the checkpoint (``phase[0]``) its batch arrived in."""
    async for batch in stream:
        into.extend((phase[0], r) for r in batch)


def _mode_problem(gym: GymBackend) -> str | None:
    """Why ``gym.prepare`` cannot take a ``mode`` (None if it can)."""
    prepare = gym.prepare
    try:
        signature = inspect.signature(prepare)
    except (TypeError, ValueError):  # no signature to read: the call itself will tell
        return None
    try:
        signature.bind("instance", "checkpoint", 0.0, CheckpointMode.UNALIGNED)
    except TypeError as exc:
        return (
            f"{type(gym).__name__}.prepare{signature} takes no mode ({exc}); the contract is "
            "prepare(instance, checkpoint_id, deadline_ts, mode=CheckpointMode.ALIGNED): take "
            "the mode and pass it to the host's prepare (or park as aligned whatever it says)"
        )
    return None


def _alignment_problem(gym: GymBackend) -> str | None:
    """Why ``gym.prepare`` cannot take an ``alignment_timeout_s`` (None if it can)."""
    try:
        signature = inspect.signature(gym.prepare)
    except (TypeError, ValueError):  # no signature to read: the call itself will tell
        return None
    try:
        signature.bind(
            "instance", "checkpoint", 0.0, CheckpointMode.ALIGNED, alignment_timeout_s=1.0
        )
    except TypeError as exc:
        return (
            f"{type(gym).__name__}.prepare{signature} takes no alignment_timeout_s ({exc}); the "
            "contract is prepare(instance, checkpoint_id, deadline_ts, "
            "mode=CheckpointMode.ALIGNED, alignment_timeout_s=None): take it and pass it to the "
            "host's prepare"
        )
    return None


def _final(replies: list[RunReply]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in replies:
        if isinstance(r, (Completed, Failed)):
            counts[r.rollout_id] = counts.get(r.rollout_id, 0) + 1
    return counts


async def check_backend(
    gym: GymBackend, workdir: str | Path, *, rows: int = 8, timeout_s: float = 120.0
) -> ConformanceReport:
    """Run the checks above on an open backend; files go under ``workdir`` (absolute). Raises
    ``ConformanceError`` listing every failed check."""
    workdir = Path(workdir)
    if not workdir.is_absolute():
        raise ValueError(f"workdir must be absolute, got {workdir}")
    checks = Checks(f"backend {type(gym).__name__}")
    with trio.fail_after(timeout_s):
        topo = await gym.topology()
        names = topo.names
        checks.check(
            "topology",
            bool(names)
            and len(set(names)) == len(names)
            and all(i.participants for i in topo.instances),
            f"instances {names}, participants {[i.participants for i in topo.instances]}",
        )
        first = names[0]
        # 2. a plain run
        plain: list[RunReply] = []
        await _read(
            await gym.run(first, [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(rows)]),
            plain,
        )
        counts = _final(plain)
        checks.episodes += len(counts)
        checks.check(
            "replies",
            counts == {rollout_id_for(r, 0, 0): 1 for r in range(rows)},
            f"final replies per row: {counts}",
        )
        # 3-6. a checkpoint in the middle of a run, in each mode
        problem = _mode_problem(gym)
        checks.check("prepare_mode", problem is None, problem or "")
        alignment = _alignment_problem(gym)
        checks.check("prepare_alignment_timeout", alignment is None, alignment or "")
        modes = [CheckpointMode.ALIGNED] + ([CheckpointMode.UNALIGNED] if problem is None else [])
        for slot, mode in enumerate(modes, start=1):
            checks.episodes += await _checkpoint(checks, gym, topo, workdir, rows, slot, mode)
        # 7. restore refuses a topology the instance does not have
        bogus = InstanceRecord(
            first,
            (
                *(
                    ParticipantRecord(s, k, f"{first}/{s}", "sha256:" + "0" * 64)
                    for s, k in topo.instances[0].participants
                ),
                ParticipantRecord(
                    "no_such_participant", "environment", f"{first}/x", "sha256:" + "0" * 64
                ),
            ),
        )
        try:
            await gym.restore(first, str(workdir / "nothing"), bogus, (), trio.current_time() + 30)
        except TopologyMismatch as exc:
            inv = await gym.inventory(first)
            checks.check(
                "restore_refuses_mismatch",
                "no_such_participant" in str(exc) and not inv.unclaimed,
                f"{exc}; unclaimed {inv.unclaimed}",
            )
        else:
            checks.check("restore_refuses_mismatch", False, "restore accepted a bad topology")
        # 8-12. real usage: trainer restarts, a second trainer, a shuffled order restored
        checks.episodes += await check_usage(checks, gym, names, workdir, rows)
    return checks.finish()


async def _checkpoint(
    checks: Checks,
    gym: GymBackend,
    topo: Any,
    workdir: Path,
    rows: int,
    slot: int,
    mode: CheckpointMode,
) -> int:
    """Checks 3-6 in ``mode``, on rows of ``slot``; the number of episodes that replied."""
    names, first = topo.names, topo.names[0]
    checkpoint_id = f"conformance-{mode.value}"
    tag = f"[{mode.value}]"
    run_rows = [RunRow(rollout_id_for(r, slot, 0), r, slot, 0) for r in range(rows)]
    replies: list[tuple[str, RunReply]] = []
    phase = ["before"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_phased, await gym.run(first, run_rows), replies, phase)
        await trio.lowlevel.checkpoint()
        deadline = trio.current_time() + 30
        for name in names:
            if mode is CheckpointMode.ALIGNED:  # the reference call, as any backend takes it
                await gym.prepare(name, checkpoint_id, deadline)
            else:
                await gym.prepare(name, checkpoint_id, deadline, mode)
        root = workdir / f"commit-{mode.value}"
        commits = {n: await gym.commit(n, checkpoint_id, str(root), deadline) for n in names}
        phase[0] = "between"
        problems = _commit_problems(commits, topo, root, checkpoint_id)
        checks.check("commit" + tag, not problems, "; ".join(problems))
        try:
            await gym.retire(first, [run_rows[0].rollout_id], deadline)
        except GymControlError:
            checks.check("retire_refused_while_prepared" + tag, True)
        else:
            checks.check("retire_refused_while_prepared" + tag, False, "retire was accepted")
        # a window for a reply produced after a cut to reach the trainer, where it must not
        # (not a wait for anything to happen: nothing here needs it to)
        await trio.sleep(0.2)
        phase[0] = "after"
        for name in names:
            await gym.resume(name, checkpoint_id, deadline)
    on_wire = {rid for reply in commits.values() for rid in reply.on_wire}
    early = sorted(
        r.rollout_id for p, r in replies if p == "between" and r.rollout_id not in on_wire
    )
    checks.check(
        "cut" + tag,
        not early,
        f"replies {early} reached the trainer after the commits and before the resume, though "
        f"no commit listed them on the wire (on the wire: {sorted(on_wire)})",
    )
    counts = _final([r for _, r in replies])
    checks.check(
        "resume" + tag,
        counts == {r.rollout_id: 1 for r in run_rows},
        f"final replies per row after resume: {counts}",
    )
    return len(counts)


def _commit_problems(
    commits: dict[str, Any], topo: Any, root: Path, checkpoint_id: str
) -> list[str]:
    problems: list[str] = []
    for inst in topo.instances:
        reply = commits[inst.name]
        if (reply.instance, reply.checkpoint_id) != (inst.name, checkpoint_id):
            problems.append(f"{inst.name}: reply for {reply.instance}/{reply.checkpoint_id}")
        both = sorted({e.rollout_id for e in reply.exported} & set(reply.on_wire))
        if both:
            problems.append(f"{inst.name}: episodes {both} both exported and on the wire")
        got = tuple((p.server_name, p.kind) for p in reply.participants)
        if got != inst.participants:
            problems.append(f"{inst.name}: participants {got}, topology {inst.participants}")
        for p in reply.participants:
            outside = state_dir_problem(p.state_dir, root)
            if outside is not None:
                problems.append(f"{inst.name}/{p.server_name}: state_dir {outside}")
                continue
            rel = Path(p.state_dir)
            on_disk = records_digest(root / rel)
            if on_disk != p.records_digest:
                problems.append(
                    f"{inst.name}/{p.server_name}: digest {p.records_digest} reported, "
                    f"{on_disk} on disk"
                )
    return problems
