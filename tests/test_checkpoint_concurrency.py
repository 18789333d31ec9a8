"""Two ``checkpoint()`` calls at once: they serialize, they do not abort the run.

A trainer may checkpoint from two tasks (its loop, and a timer or an evaluation task). The
second call waits for the first to finish, then takes its own checkpoint: both return ok, with
consecutive ids and snapshots, admission reopens, and the run still trains every row once.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from gymckpt.gym_adapter import (
    EmbeddedGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import CheckpointOutcome, open_rollouts, snapshot_problems
from gymckpt.runtime import RuntimeConfig, load_snapshot

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=0,
)
ROWS = 12


async def test_two_concurrent_checkpoints_serialize(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym,
            tmp_path,
            rows=ROWS,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=6,
            keep_snapshots=0,
        ) as ro:
            await trio.sleep(1.5)  # episodes in flight, mid-turn
            outcomes: dict[str, CheckpointOutcome] = {}
            order: list[str] = []
            first_running = trio.Event()

            def on_stage(checkpoint_id: str, point: str) -> None:
                order.append(f"{checkpoint_id}:{point}")
                if point == "after_commit":
                    first_running.set()

            ro.coordinator.on_stage = on_stage

            async def take(name: str, state: bytes) -> None:
                outcomes[name] = await ro.checkpoint(state)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(take, "first", b'{"who": "first"}')
                await first_running.wait()  # the first one has parked Gym and committed
                nursery.start_soon(take, "second", b'{"who": "second"}')
            ro.coordinator.on_stage = None

            first, second = outcomes["first"], outcomes["second"]
            assert first.ok and second.ok, (first.error, second.error)
            assert (first.checkpoint_id, second.checkpoint_id) == ("run-0001", "run-0002")
            # the second started only once the first had resumed Gym
            assert order.index("run-0002:before_prepare") > order.index("run-0001:before_resume")
            assert first.snapshot is not None and second.snapshot is not None
            assert second.snapshot.seq == first.snapshot.seq + 1
            assert load_snapshot(first.snapshot.path).files["trainer.json"] == b'{"who": "first"}'
            assert load_snapshot(second.snapshot.path).files["trainer.json"] == (
                b'{"who": "second"}'
            )
            assert snapshot_problems(load_snapshot(second.snapshot.path)).all == []
            assert ro.coordinator.consecutive_failures == 0
            assert ro.coordinator.gate.statistics().open

            rows: list[int] = []
            async for batch in ro.batches(2):
                rows.extend(g.row for g in batch)
    assert sorted(rows) == list(range(ROWS))  # every row trained once


async def test_a_checkpoint_waiting_for_another_can_be_cancelled(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym,
            tmp_path,
            rows=ROWS,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=6,
            keep_snapshots=0,
        ) as ro:
            await trio.sleep(1.5)
            committed = trio.Event()
            ro.coordinator.on_stage = lambda _cid, point: (
                committed.set() if point == "after_commit" else None
            )
            outcome: list[CheckpointOutcome] = []
            async with trio.open_nursery() as nursery:

                async def first() -> None:
                    outcome.append(await ro.checkpoint())

                nursery.start_soon(first)
                await committed.wait()
                with trio.move_on_after(0) as waiting:  # gives up while the first runs
                    await ro.checkpoint()
                assert waiting.cancelled_caught
            ro.coordinator.on_stage = None
            assert outcome[0].ok and outcome[0].checkpoint_id == "run-0001"
            again = await ro.checkpoint()  # the abandoned wait took no number and left no lock
            assert again.ok and again.checkpoint_id == "run-0002", again.error
