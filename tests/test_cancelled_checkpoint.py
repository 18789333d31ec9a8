"""The trainer cancels its own scope around a checkpoint: at every await point of the
checkpoint's task, at each hook point, and in the middle of a slow Gym call.

Whatever point the cancellation lands on: admission reopens, the deadline pause is released,
the barrier is free, no task of the checkpoint is left behind, no staging directory is left,
Gym is resumed (not left parked until its lease), a following checkpoint works, and the run
still trains every row exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import HOOK_POINTS, Rollouts, open_rollouts, snapshot_problems
from gymckpt.runtime import RuntimeConfig, SnapshotStore, load_snapshot

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)
ROWS = 12


@asynccontextmanager
async def running(
    workdir: Path, faults: Sequence[str] = ()
) -> AsyncIterator[tuple[EmbeddedGym, Rollouts]]:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=workdir / "gym",
        faults=faults,
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, workdir, rows=ROWS, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            yield gym, ro


class CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` just before ``task`` resumes for the ``k``-th time, so the
    cancellation is delivered at the task's next await point."""

    def __init__(self, task: trio.lowlevel.Task, k: int, scope: trio.CancelScope) -> None:
        self.task, self.k, self.scope, self.steps = task, k, scope, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.k:
                self.scope.cancel()


def checkpoint_tasks() -> list[str]:
    """Names of live tasks started by a checkpoint (per-instance control calls)."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    names, stack = [], [root]
    while stack:
        task = stack.pop()
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    ours = ("gymckpt.nurseries._calls", "gymckpt.nurseries._coordinator")
    return [n for n in names if any(m in n for m in ours)]


async def assert_released(gym: EmbeddedGym, ro: Rollouts, workdir: Path) -> None:
    gate = ro.coordinator.gate.statistics()
    assert gate.open and gate.admitting == 0, gate
    assert ro.coordinator.deadlines.statistics().holders == frozenset()
    barrier = ro.ledger.barrier.statistics()
    assert not barrier.held and barrier.queued_mutations == 0, barrier
    assert checkpoint_tasks() == []
    assert not list((workdir / "snapshots").glob(".staging-*"))
    for name in gym.instances:  # resumed at once by the shielded clean-up, not by the lease
        inv = await gym.inventory(name)
        assert inv.admission_open and not inv.prepared, inv


async def finish_exactly_once(ro: Rollouts, dropped: Sequence[int] = ()) -> None:
    again = await ro.checkpoint()
    assert again.ok, again.error
    assert snapshot_problems(load_snapshot(again.snapshot.path)).all == []  # type: ignore[union-attr]
    rows: list[int] = []
    async for batch in ro.batches(2):
        rows.extend(g.row for g in batch)
    assert sorted(rows) == [r for r in range(ROWS) if r not in dropped]


async def test_cancel_at_every_await_point_of_a_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    last_point: list[str] = []
    k = 0
    while True:
        k += 1
        workdir = tmp_path / f"k{k}"
        async with running(workdir) as (gym, ro):
            await trio.sleep(1.5)  # rows in flight, some replies on the wire
            reached: list[str] = []
            ro.coordinator.on_stage = lambda _cid, point, seen=reached: seen.append(point)
            with trio.CancelScope() as scope:
                cancel = CancelAtStep(trio.lowlevel.current_task(), k, scope)
                trio.lowlevel.add_instrument(cancel)
                try:
                    outcome = await ro.checkpoint()
                finally:
                    trio.lowlevel.remove_instrument(cancel)
            await assert_released(gym, ro, workdir)
            published = SnapshotStore(workdir / "snapshots").list_complete()
            if not scope.cancelled_caught:  # past the last await point: it completed
                assert outcome.ok and len(published) == 1
                break
            last_point.append(reached[-1] if reached else "close/retire")
            assert len(published) == ("after_publish" in reached)  # published, or nothing
            await finish_exactly_once(ro)
    assert k > 10  # a checkpoint has many await points, and each was tried
    assert set(last_point) == {"close/retire", *HOOK_POINTS} - {"after_publish"}
    # (after_publish and before_resume are consecutive, with no await point between them)


@pytest.mark.parametrize("point", HOOK_POINTS)
async def test_cancel_at_each_hook_point(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, point: str
) -> None:
    async with running(tmp_path) as (gym, ro):
        await trio.sleep(1.5)
        with trio.CancelScope() as scope:

            def on_stage(_cid: str, p: str) -> None:
                if p == point:
                    scope.cancel()

            ro.coordinator.on_stage = on_stage
            await ro.checkpoint()
        assert scope.cancelled_caught
        ro.coordinator.on_stage = None
        await assert_released(gym, ro, tmp_path)
        published = SnapshotStore(tmp_path / "snapshots").list_complete()
        assert len(published) == (point in ("after_publish", "before_resume"))
        await finish_exactly_once(ro)


@pytest.mark.parametrize("op", ["retire", "prepare", "commit", "resume"])
async def test_cancel_in_the_middle_of_a_slow_gym_call(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, op: str
) -> None:
    async with running(tmp_path, faults=[f"{op}:delay@1:1.5"]) as (gym, ro):
        ledger = ro.ledger
        dropped: list[int] = []
        await trio.sleep(1.5)
        if op == "retire":  # give the retire stage work (S4)
            row = next(
                r for r in ledger.rows() if all(ledger.is_in_flight(f"{r}-{s}") for s in range(2))
            )
            await ledger.barrier.mutate(lambda: ledger.drop_row(row))
            dropped.append(row)
        with trio.CancelScope() as scope:
            before = {
                "retire": None,
                "prepare": "before_prepare",
                "commit": "after_prepare",
                "resume": "before_resume",
            }[op]
            if before is None:  # the retire stage starts at once
                scope.deadline = trio.current_time() + 1.0

            def on_stage(_cid: str, p: str) -> None:
                if p == before:  # cancel 1s into the slow call
                    scope.deadline = trio.current_time() + 1.0

            ro.coordinator.on_stage = on_stage
            await ro.checkpoint()
        assert scope.cancelled_caught
        assert gym.faults.fired == ((f"{op}:delay@1:1.5", 1),)
        ro.coordinator.on_stage = None
        await assert_released(gym, ro, tmp_path)
        if op == "retire":  # what the cancelled call did not retire stays queued (S4)
            left = {i.rollout_id for items in ledger.retire_queue().values() for i in items}
            assert left and left <= {f"{dropped[0]}-0", f"{dropped[0]}-1"}
        else:
            assert ledger.statistics().retire_queue == 0
        await finish_exactly_once(ro, dropped)
        assert ledger.statistics().retire_queue == 0
