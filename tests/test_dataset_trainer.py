"""The trainer's dataset through ``open_rollouts`` on an embedded Gym: every trained episode got
its own row's task, fresh, retried and restored attempts alike; ``rows`` checked against it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym, FaultSpec
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import CompletedGroup, DatasetError, RuntimeConfig
from gymckpt.testing.examples import task_reader

CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0)
TASKS = [{"prompt": f"question {i}", "answer": i * 7, "tags": ["t", i]} for i in range(12)]
GROUP = 2


def _check_tasks(groups: list[CompletedGroup], tasks: list[Any]) -> None:
    for group in groups:
        assert len(group.results) == GROUP
        for result in group.results:
            assert result.payload["row"] == group.row
            assert result.payload["seen"] == [tasks[group.row]] * 3, group.row


async def _train_all(gym: EmbeddedGym, workdir: Path, **kw: Any) -> list[CompletedGroup]:
    trained: list[CompletedGroup] = []
    async with open_rollouts(gym, workdir, group_size=GROUP, config=CONFIG, **kw) as ro:
        async for batch in ro.batches(groups_per_step=3):
            trained += batch
    return trained


async def test_every_episode_gets_its_rows_task(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(task_reader(turn_s=0.5), instances=2) as gym:
        trained = await _train_all(gym, tmp_path, dataset=TASKS, max_rows_in_flight=4)
    assert sorted(g.row for g in trained) == list(range(len(TASKS)))
    _check_tasks(trained, TASKS)


async def test_retried_attempts_carry_the_task_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    faults = [FaultSpec("run", "drop", nth=1)]  # the first stream ends early: re-sent
    async with EmbeddedGym.host(task_reader(turn_s=0.5), instances=1, faults=faults) as gym:
        trained = await _train_all(gym, tmp_path, dataset=TASKS, rows=[3, 5, 8])
    assert any(r.payload["attempt"] > 0 for g in trained for r in g.results)
    assert sorted(g.row for g in trained) == [3, 5, 8]
    _check_tasks(trained, TASKS)


async def test_restored_claims_carry_their_rows_task(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A checkpoint with episodes parked mid-episode; a new Gym restores it and the claims (and
    every later turn) see the task their row had."""
    first: list[CompletedGroup] = []
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        async with open_rollouts(
            gym, tmp_path, dataset=TASKS, group_size=GROUP, config=CONFIG, max_rows_in_flight=4
        ) as ro:
            first += await ro.next_batch(1)
            await trio.sleep(1.5)  # every episode in flight is mid-way
            outcome = await ro.checkpoint()
            assert outcome.ok and outcome.episodes > 0
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        async with open_rollouts(
            gym, tmp_path, dataset=TASKS, group_size=GROUP, config=CONFIG, max_rows_in_flight=4
        ) as ro:
            summary = ro.restore_summary
            assert summary is not None and summary.restored > 0
            rest: list[CompletedGroup] = []
            async for batch in ro.batches(groups_per_step=3):
                rest += batch
    trained = first + rest
    assert sorted(g.row for g in trained) == list(range(len(TASKS)))
    _check_tasks(trained, TASKS)


async def test_without_a_dataset_rows_are_indices_and_the_task_none(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(task_reader(), instances=1) as gym:
        trained = await _train_all(gym, tmp_path, rows=3)
    assert sorted(g.row for g in trained) == [0, 1, 2]
    _check_tasks(trained, [None] * 3)


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"rows": 13}, r"rows=13, but the dataset \(.*\) has 12 rows"),
        ({"rows": [0, 12]}, r"rows\[1\] is 12, not a row of the dataset \(.*rows 0\.\.11\)"),
        ({"rows": [True]}, r"rows\[0\] is True, not a row"),
    ],
)
async def test_rows_outside_the_dataset_are_refused(
    tmp_path: Path, kw: dict[str, Any], said: str
) -> None:
    async with EmbeddedGym.host(task_reader(), instances=1) as gym:
        with pytest.raises(DatasetError, match=said):
            async with open_rollouts(gym, tmp_path, dataset=TASKS, group_size=GROUP, **kw):
                pytest.fail("opened")
        assert (await gym.statistics()).instances[0].episodes_started == 0


async def test_a_bad_row_is_refused_before_anything_runs(tmp_path: Path) -> None:
    tasks = [*TASKS, {"prompt": float("nan")}]
    async with EmbeddedGym.host(task_reader(), instances=1) as gym:
        with pytest.raises(DatasetError, match=r"dataset\[12\]\.prompt is nan"):
            async with open_rollouts(gym, tmp_path, dataset=tasks, group_size=GROUP):
                pytest.fail("opened")
        assert (await gym.statistics()).instances[0].episodes_started == 0


async def test_rows_or_a_dataset_is_required(tmp_path: Path) -> None:
    async with EmbeddedGym.host(task_reader(), instances=1) as gym:
        with pytest.raises(TypeError, match="needs rows="):
            async with open_rollouts(gym, tmp_path, group_size=GROUP):
                pytest.fail("opened")


def test_an_asyncio_trainer_passes_its_dataset_too(tmp_path: Path) -> None:
    import gymckpt.aio

    trained: list[CompletedGroup] = []

    async def main() -> None:
        async with (
            gymckpt.aio.open_gym(lambda: EmbeddedGym.host(task_reader(), instances=2)) as gym,
            gymckpt.aio.open_rollouts(
                gym, tmp_path, dataset=TASKS[:4], group_size=GROUP, handle_signals=False
            ) as ro,
        ):
            async for batch in ro.batches(2):
                trained.extend(batch)

    gymckpt.aio.run(main)
    assert sorted(g.row for g in trained) == [0, 1, 2, 3]
    _check_tasks(trained, TASKS)


@pytest.mark.ray
async def test_tasks_reach_episodes_in_ray_actors(tmp_path: Path) -> None:
    from gymckpt.gym_adapter import RayGym

    env = "gymckpt.testing.examples:task_reader"
    async with RayGym.host(env, instances=2, work_dir=tmp_path / "gym") as gym:
        trained = await _train_all(gym, tmp_path / "w", dataset=TASKS[:6])
    assert sorted(g.row for g in trained) == list(range(6))
    _check_tasks(trained, TASKS)
