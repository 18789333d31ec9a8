"""Gym instances spread over a real multi-node Ray cluster, and nodes lost under them.

``ray_nodes`` (conftest) runs a head and three worker nodes on this machine, each a raylet with
its own worker processes; ``remove`` kills a node's processes with SIGKILL, as losing a machine
does. Instances are placed ``SPREAD`` over the workers (the head offers no CPU).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from gymckpt.gym_adapter import GymInstanceDead, RunRow, SimConfig
from gymckpt.runtime import GymUnavailable, rollout_id_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

CONFIG = SimConfig(turns=(2, 3), turn_s=(0.2, 0.3), mutation_p=0.5, lease_s=10.0)


def rows(n: int, start: int = 0) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(start, start + n)]


async def seen_dead(gym: Any, instance: str, timeout_s: float = 30.0) -> None:
    """Wait until ``instance``'s calls fail with ``GymInstanceDead``. Until Ray's health checks
    declare its node dead, they fail as *unavailable* (retryable), and never succeed."""
    with trio.fail_after(timeout_s):
        while True:
            try:
                await gym.prepare(instance, "probe", trio.current_time() + 5)
            except GymInstanceDead:
                return
            except GymUnavailable as exc:
                assert "unavailable" in str(exc), exc
            else:
                raise AssertionError(f"{instance} answered after its node was lost")
            await trio.sleep(0.1)


async def test_a_lost_node_kills_its_instances_and_replace_lands_on_a_live_node(
    ray_nodes: Any, tmp_path: Path
) -> None:
    from gymckpt.gym_adapter import RayGym

    async with RayGym.open(instances=3, seed=2, work_dir=tmp_path, config=CONFIG) as gym:
        before = gym.placement
        assert set(before.values()) <= set(ray_nodes.workers)  # none on the CPU-less head
        assert len(set(before.values())) >= 2  # spread
        lost = before["gym-1"]
        doomed = sorted(name for name, node in before.items() if node == lost)
        stream = await gym.run("gym-1", rows(4))

        t0 = trio.current_time()
        ray_nodes.remove(lost)
        got = [r async for batch in stream for r in batch]
        assert len(got) < 4  # ended early: the actor died with its node
        for name in doomed:
            await seen_dead(gym, name)
        dead_s = trio.current_time() - t0
        for name in doomed:
            await gym.replace(name, trio.current_time() + 60)
        serving_s = trio.current_time() - t0

        after = gym.placement
        alive = ray_nodes.alive()
        assert lost not in alive
        for name in doomed:
            assert after[name] != lost and after[name] in alive
        for name in set(before) - set(doomed):
            assert after[name] == before[name]  # the others were not touched
        for name in gym.instances:  # every instance serves a whole run
            stream = await gym.run(name, rows(2, start=10))
            replies = [r async for batch in stream for r in batch]
            assert sorted(r.rollout_id for r in replies) == [r.rollout_id for r in rows(2, 10)]
        record = gym.replacements[0]
        log.warning("node lost -> seen dead %.3f s -> %d replacement(s) serving %.3f s "
                    "(first: fence %.3f s, start %.3f s)", dead_s, len(doomed), serving_s,
                    record.fence_s, record.start_s)
