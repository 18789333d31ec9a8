"""Conformance of a ``GymBackend``: the contract the runtime relies on, checked from outside.

``check_backend(gym, workdir)`` drives an open backend through the data and control planes:

1. ``topology``: instances named once each, every one with participants.
2. ``replies``: every row of a run gets exactly one final reply (completed or failed).
3. ``commit``: after ``prepare`` on every instance, ``commit`` answers for the right instance and
   checkpoint, lists the topology's participants in order, with relative state directories
   whose records on disk carry the reported sha256 digest; exported episodes are parked ones.
4. ``retire_refused_while_prepared``: ``retire`` raises ``GymControlError`` during a checkpoint.
5. ``resume``: after ``resume`` every row of the run still gets exactly one final reply.
6. ``restore_refuses_mismatch``: ``restore`` of a record with a participant the instance does
   not have raises ``TopologyMismatch`` and leaves nothing unclaimed.
"""

from __future__ import annotations

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
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    records_digest,
    rollout_id_for,
)
from gymckpt.runtime.lowlevel import state_dir_problem

from ._report import Checks, ConformanceReport

__all__ = ["check_backend"]


async def _read(stream: ReplyStream, into: list[RunReply]) -> None:
    async for batch in stream:
        into.extend(batch)


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
        # 3-5. a checkpoint in the middle of a run
        run_rows = [RunRow(rollout_id_for(r, 1, 0), r, 1, 0) for r in range(rows)]
        replies: list[RunReply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read, await gym.run(first, run_rows), replies)
            await trio.lowlevel.checkpoint()
            deadline = trio.current_time() + 30
            for name in names:
                await gym.prepare(name, "conformance", deadline)
            root = workdir / "commit"
            commits = {n: await gym.commit(n, "conformance", str(root), deadline) for n in names}
            problems = _commit_problems(commits, topo, root)
            checks.check("commit", not problems, "; ".join(problems))
            try:
                await gym.retire(first, [run_rows[0].rollout_id], deadline)
            except GymControlError:
                checks.check("retire_refused_while_prepared", True)
            else:
                checks.check("retire_refused_while_prepared", False, "retire was accepted")
            for name in names:
                await gym.resume(name, "conformance", deadline)
        counts = _final(replies)
        checks.episodes += len(counts)
        checks.check(
            "resume",
            counts == {r.rollout_id: 1 for r in run_rows},
            f"final replies per row after resume: {counts}",
        )
        # 6. restore refuses a topology the instance does not have
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
    return checks.finish()


def _commit_problems(commits: dict[str, Any], topo: Any, root: Path) -> list[str]:
    problems: list[str] = []
    for inst in topo.instances:
        reply = commits[inst.name]
        if (reply.instance, reply.checkpoint_id) != (inst.name, "conformance"):
            problems.append(f"{inst.name}: reply for {reply.instance}/{reply.checkpoint_id}")
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
