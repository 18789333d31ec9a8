"""One environment, both event loops, on Ray: an environment whose code calls trio, asyncio or
anyio completes its episodes on a real Ray actor (whose methods run on asyncio), exactly as it
does embedded under trio (tests/test_event_loops.py)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from gymckpt.gym_adapter import Completed, HostConfig
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig

pytestmark = pytest.mark.ray
RayGym = pytest.importorskip("gymckpt.gym_adapter.transports.ray._gym").RayGym

ROWS = 6


@pytest.mark.parametrize("library", ["trio", "asyncio", "anyio", "mixed"])
async def test_an_environment_calling_each_library_trains_on_ray(
    tmp_path: Path, library: str
) -> None:
    """Every row completes with the reward and payload the environment computes (the model's
    answers, row + turn), through a checkpoint in the middle."""
    rewards: dict[tuple[int, int], float] = {}
    config = RuntimeConfig(control_timeout_s=10.0, drain_timeout_s=10.0)
    async with (
        RayGym.host(
            f"gymckpt.testing.loop_examples:{library}_sleeper",
            instances=1,
            work_dir=tmp_path / "gym",
            config=HostConfig(lease_s=30),
        ) as gym,
        open_rollouts(
            gym, tmp_path / "run", rows=ROWS, group_size=2, max_rows_in_flight=3, config=config
        ) as ro,
    ):
        async with aclosing(ro.batches(2)) as batches:  # type: ignore[type-var]
            async for batch in batches:
                for g in batch:
                    for slot, r in enumerate(g.results):
                        assert r.payload == [g.row, g.row + 1, g.row + 2], r
                        rewards[(g.row, slot)] = r.reward
                assert (await ro.checkpoint()).ok
    assert rewards == {(row, s): float(3 * row + 3) for row in range(ROWS) for s in range(2)}


async def test_the_actor_answers_a_trio_environment_directly(tmp_path: Path) -> None:
    """The Gym contract itself (no trainer): a trio.sleep agent's rows complete on the actor,
    and its statistics show no call left running."""
    async with RayGym.host("gymckpt.testing.loop_examples:trio_sleeper", work_dir=tmp_path) as gym:
        from gymckpt.gym_adapter import RunRow

        stream = await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(4)])
        got = {}
        async with aclosing(stream):
            async for batch in stream:
                got.update({r.rollout_id: r for r in batch})
        assert sorted(got) == ["0-0", "1-0", "2-0", "3-0"]
        assert all(isinstance(r, Completed) for r in got.values()), got
