"""User environments on Ray: the same Gym host inside each actor, user code named by import path."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from gymckpt.gym_adapter import EnvironmentSpecError, HostConfig
from gymckpt.gym_adapter.environments.gymnasium import Trajectory, reference_trajectory
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig
from gymckpt.testing import check_backend

pytestmark = pytest.mark.ray
RayGym = pytest.importorskip("gymckpt.gym_adapter.transports.ray._gym").RayGym


async def test_gymnasium_on_ray_restores_bit_identically(tmp_path: Path) -> None:
    seen: dict[tuple[int, int], Trajectory] = {}
    config = RuntimeConfig(control_timeout_s=10.0, drain_timeout_s=10.0)
    for phase in (1, 2):
        async with (
            RayGym.host(
                "gymnasium:CartPole-v1",
                instances=2,
                seed=3,
                work_dir=tmp_path / "live",
                config=HostConfig(lease_s=30),
            ) as gym,
            open_rollouts(
                gym, tmp_path, rows=16, group_size=2, max_rows_in_flight=8, config=config
            ) as ro,
        ):
            async with aclosing(ro.batches(2)) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    for g in batch:
                        for slot, r in enumerate(g.results):
                            assert (g.row, slot) not in seen
                            seen[(g.row, slot)] = r.payload_as(Trajectory)
                    assert (await ro.checkpoint()).ok
                    if phase == 1 and len(seen) >= 12:
                        break
    assert sorted(seen) == [(r, s) for r in range(16) for s in range(2)]
    for (row, slot), traj in seen.items():
        assert traj == reference_trajectory("CartPole-v1", 3, row, slot)


async def test_backend_kit_on_ray_hosting_a_user_environment(tmp_path: Path) -> None:
    async with RayGym.host(
        "gymckpt.testing.examples:guess_the_number", instances=2, work_dir=tmp_path / "live"
    ) as gym:
        report = await check_backend(gym, tmp_path)  # both modes: each actor takes its cut
    assert {"commit[aligned]", "commit[unaligned]", "cut[unaligned]"} <= set(report.checks)


async def test_bad_environment_path_fails_before_any_actor_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no_such_module"):
        async with RayGym.host("no_such_module:env", work_dir=tmp_path):
            pass
    with pytest.raises(EnvironmentSpecError, match="no such Gymnasium environment"):
        async with RayGym.host("gymnasium:GymckptNoSuchEnv-v0", work_dir=tmp_path):
            pass
    with pytest.raises(EnvironmentSpecError, match="register_state_codec"):
        async with RayGym.host("gymnasium:LunarLander-v3", work_dir=tmp_path):  # no codec
            pass
