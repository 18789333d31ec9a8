"""Fault injection on real Ray calls, through the runtime (S5, S6), on a local Ray cluster.

Each test runs the trainer facade (``nurseries.open_rollouts``) on a 2-instance ``RayGym`` with
one fault and asserts: the checkpoint fails (``gym_unavailable``) or succeeds as S5/S6 say,
within deadline + reply grace (real time, generous bound), consecutive failures stay bounded,
every row is trained exactly once, and the next checkpoint succeeds once the fault is gone.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from gymckpt.gym_adapter import (
    EnvironmentRef,
    RayGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import Rollouts, open_rollouts
from gymckpt.runtime import RuntimeConfig

pytestmark = pytest.mark.ray

SIM = CalendarConfig(turns=(2, 3), turn_s=(0.05, 0.15), mutation_p=0.5, lease_s=3.0)
CONFIG = RuntimeConfig(
    control_timeout_s=1.0,
    alignment_timeout_s=0.5,
    reply_grace_s=0.3,
    drain_timeout_s=2.0,
    lease_s=3.0,
    max_consecutive_failures=2,
)
BOUND = CONFIG.control_timeout_s + CONFIG.reply_grace_s
SLACK = 1.0  # generous: real time on a busy 2-core machine
ROWS = 12


@asynccontextmanager
async def running(
    tmp_path: Path,
    *,
    faults: Sequence[str] = (),
    stuck_loop_s: float = 0.0,
    max_rows_in_flight: int = 6,
    restore: bool = True,
    sim: CalendarConfig = SIM,
) -> AsyncIterator[tuple[Any, Rollouts]]:
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=sim),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym",
        faults=faults,
        stuck_loop_s=stuck_loop_s,
        config=sim.host_config(),
    ) as gym:
        async with open_rollouts(
            gym,
            tmp_path,
            rows=ROWS,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=max_rows_in_flight,
            restore=restore,
        ) as ro:
            yield gym, ro


async def train_all(ro: Rollouts, per_step: int = 2) -> list[int]:
    rows: list[int] = []
    async for batch in ro.batches(per_step):
        rows.extend(g.row for g in batch)
    return rows


def unanswered(error: str | None, operation: str) -> str:
    """The instance a checkpoint error names as not answering ``operation``."""
    found = re.search(
        rf"instance (gym-\d) did not answer {operation} within 1s \+ 0.3s grace", error or ""
    )
    assert found, error
    return found.group(1)


async def settled(gym: Any, instance: str) -> Any:
    """The actor's call statistics once nothing runs there (fails after 10 s)."""
    with trio.fail_after(10):
        while True:
            calls = await gym.calls(instance)
            if not calls.in_progress:
                return calls
            await trio.sleep(0.05)


def assert_released(ro: Rollouts) -> None:
    assert ro.coordinator.gate.is_open
    assert "gym-checkpoint" not in ro.coordinator.deadlines.holders


@pytest.mark.parametrize("operation", ["prepare", "commit"])
async def test_stuck_event_loop_fails_the_checkpoint_in_time(
    tmp_path: Path, operation: str
) -> None:
    stuck = BOUND + 0.7  # the loop stays blocked past the caller's whole bound
    async with running(tmp_path, faults=[f"{operation}:hang@1"], stuck_loop_s=stuck) as (gym, ro):
        await trio.sleep(0.3)
        t0 = trio.current_time()
        outcome = await ro.checkpoint()
        elapsed = trio.current_time() - t0
        assert not outcome.ok and outcome.reason == "gym_unavailable"
        victim = unanswered(outcome.error, operation)
        assert BOUND - 0.05 <= outcome.stage_s[operation] <= BOUND + SLACK
        assert elapsed <= 2 * BOUND + SLACK  # plus at most one bounded best-effort resume
        assert ro.coordinator.consecutive_failures == 1
        assert_released(ro)
        calls = await settled(gym, victim)  # once its loop runs again
        assert dict(calls.cancelled).get(operation) == 1
        assert gym.bridge_statistics().calls_pending == 0
        again = await ro.checkpoint()
        assert again.ok and ro.coordinator.consecutive_failures == 0
        rows = await train_all(ro)
        assert sorted(rows) == list(range(ROWS))  # nothing lost, nothing twice


async def test_a_call_ray_never_schedules_fails_the_checkpoint_in_time(tmp_path: Path) -> None:
    async with running(tmp_path, max_rows_in_flight=ROWS) as (gym, ro):
        with trio.fail_after(10):  # every row reached Gym: nothing is dispatched meanwhile
            while True:
                if ro.dispatcher.statistics().rows_sent == 2 * ROWS:
                    break
                await trio.sleep(0.02)
        # The coordinator asks for the topology once, unbounded, at its first checkpoint.
        assert (await ro.checkpoint()).ok
        async with gym.unschedulable("gym-1"):
            t0 = trio.current_time()
            outcome = await ro.checkpoint()
            elapsed = trio.current_time() - t0
            assert not outcome.ok and outcome.reason == "gym_unavailable"
            assert unanswered(outcome.error, "prepare") == "gym-1"
            assert BOUND - 0.05 <= outcome.stage_s["prepare"] <= BOUND + SLACK
            assert elapsed <= 2 * BOUND + SLACK  # the best-effort resume is never scheduled too
            assert gym.bridge_statistics().calls_pending == 0
            cancelled = gym.cancelled_refs
            assert len(cancelled) == 2  # prepare and resume, both to the unplaced actor
        from test_ray_backend import cancelled_in_ray

        for ref in cancelled:
            assert await trio.to_thread.run_sync(cancelled_in_ray, ref)
        assert_released(ro)
        again = await ro.checkpoint()
        assert again.ok and ro.coordinator.consecutive_failures == 0
        assert sorted(await train_all(ro)) == list(range(ROWS))


async def test_actor_killed_in_the_middle_of_a_checkpoint_is_replaced(tmp_path: Path) -> None:
    # commit #3 is the first commit of the second checkpoint: that instance's actor dies there
    rows: list[int] = []
    outcomes = []
    trained_at: dict[str, list[int]] = {}
    async with running(tmp_path, faults=["commit:dead@3"]) as (gym, ro):
        step = 0
        while batch := await ro.next_batch(2):
            rows.extend(g.row for g in batch)
            step += 1
            if step >= 2:
                outcome = await ro.checkpoint()
                outcomes.append(outcome)
                trained_at[outcome.checkpoint_id] = list(rows)
        first, met_death, *after_death = outcomes
        assert first.ok
        assert not met_death.ok and met_death.reason == "gym_unavailable"
        assert "is dead" in (met_death.error or "")
        assert after_death and all(o.ok for o in after_death)  # with the replacement
        (replaced,) = gym.replacements
        assert replaced.instance in (met_death.error or "")
        assert not any(s.dead for s in (await gym.statistics()).instances)
        assert sorted(rows) == list(range(ROWS))  # nothing lost, nothing twice
    # a fresh deployment (same topology) restores the last checkpoint, taken after the death
    async with running(tmp_path) as (_gym, ro):
        assert ro.restored is not None
        last = ro.restored.snapshot.checkpoint_id
        assert last == after_death[-1].checkpoint_id
        after = await train_all(ro)
        assert sorted(trained_at[last] + after) == list(range(ROWS))  # the lineage: each once


async def test_unpicklable_gym_error_is_retryable(tmp_path: Path) -> None:
    async with running(tmp_path, faults=["prepare:unpicklable@1"]) as (_gym, ro):
        await trio.sleep(0.3)
        outcome = await ro.checkpoint()
        assert not outcome.ok and outcome.reason == "gym_unavailable"
        assert "cannot be pickled" in (outcome.error or "")
        assert outcome.stage_s["prepare"] < BOUND
        assert ro.coordinator.consecutive_failures == 1
        assert_released(ro)
        assert (await ro.checkpoint()).ok
        assert ro.coordinator.consecutive_failures == 0
        assert sorted(await train_all(ro)) == list(range(ROWS))


async def test_lost_resume_the_lease_reopens_gym(tmp_path: Path) -> None:
    # Episodes long enough (3-4 turns of 0.2-0.3 s) that both instances still hold some when the
    # checkpoint parks them, so the instance whose resume is lost keeps rows the trainer needs:
    # they can only finish once its lease reopens it. (With short episodes the other instance
    # could train every row before the lease ran out, and nothing would show the lease at work.)
    slow = attrs.evolve(SIM, turns=(3, 4), turn_s=(0.2, 0.3))
    async with running(tmp_path, faults=["resume:hang@1"], sim=slow, max_rows_in_flight=ROWS) as (
        gym,
        ro,
    ):
        await both_running(gym)
        outcome = await ro.checkpoint()
        assert outcome.ok  # the snapshot is published before resume (S5)
        assert BOUND - 0.05 <= outcome.stage_s["resume"] <= BOUND + SLACK
        assert ro.metrics.get("checkpoint/resume_failures_total") == 1
        assert_released(ro)
        before = {n: await gym.inventory(n) for n in gym.instances}
        lost = [n for n, inv in before.items() if inv.prepared]
        assert len(lost) == 1, before  # only the first resume call hangs
        assert before[lost[0]].parked, before  # it holds rows: they wait for its lease
        assert sorted(await train_all(ro)) == list(range(ROWS))  # only once the lease reopened
        reopened = {n: (await gym.inventory(n)).lease_reopened for n in gym.instances}
        assert reopened == {n: int(n in lost) for n in gym.instances}
        assert (await ro.checkpoint()).ok


async def both_running(gym: Any, timeout_s: float = 30.0) -> None:
    """Return once every instance runs an episode (checked every 50 ms, failing after
    ``timeout_s``): a condition on Gym's state, not a guess at how long dispatch takes."""
    with trio.fail_after(timeout_s):
        while True:
            held = [(await gym.inventory(n)).running for n in gym.instances]
            if all(held):
                return
            await trio.sleep(0.05)


async def test_a_stream_that_ends_early(tmp_path: Path) -> None:
    async with running(tmp_path, faults=["run:drop@2"]) as (_gym, ro):
        rows = []
        async for batch in ro.batches(2):
            rows.extend(g.row for g in batch)
            if len(rows) == 4:
                outcome = await ro.checkpoint()
                assert outcome.ok
        assert ro.metrics.get("rollout/early_stream_ends_total") >= 1
        assert sorted(rows) == list(range(ROWS))  # the missing rows went again, fresh
        assert (await ro.checkpoint()).ok
        stats = ro.dispatcher.statistics()
        assert stats.retire_failures == 0 and stats.early_ends >= 1
