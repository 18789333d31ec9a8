"""Gym instances spread over a real multi-node Ray cluster, and nodes lost under them.

``ray_nodes`` (conftest) runs a head and three worker nodes on this machine, each a raylet with
its own worker processes; ``remove`` kills a node's processes with SIGKILL, as losing a machine
does. Instances are placed ``SPREAD`` over the workers (the head offers no CPU).
"""

from __future__ import annotations

import logging
from contextlib import aclosing, suppress
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from gymckpt.app.verdict import judge
from gymckpt.gym_adapter import (
    EnvironmentRef,
    GymInstanceDead,
    RayGym,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import CheckpointOutcome, open_rollouts
from gymckpt.runtime import GymUnavailable, RuntimeConfig, rollout_id_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

CONFIG = CalendarConfig(turns=(2, 3), turn_s=(0.2, 0.3), mutation_p=0.5, lease_s=10.0)


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
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=CONFIG),
        instances=3,
        seed=2,
        work_dir=tmp_path,
        config=CONFIG.host_config(),
    ) as gym:
        before = gym.placement
        assert set(before.values()) <= set(ray_nodes.workers)  # none on the CPU-less head
        assert len(set(before.values())) >= 2  # spread
        lost = before["gym-1"]
        doomed = sorted(name for name, node in before.items() if node == lost)
        stream = await gym.run("gym-1", rows(4))

        t0 = trio.current_time()
        ray_nodes.remove(lost)
        got: list[Any] = []
        with suppress(GymInstanceDead):  # its actor died with the node; or, while Ray still
            async for batch in stream:  # calls it unreachable, the stream ends early
                got.extend(batch)
        assert len(got) < 4
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
        log.warning(
            "node lost -> seen dead %.3f s -> %d replacement(s) serving %.3f s "
            "(first: fence %.3f s, start %.3f s)",
            dead_s,
            len(doomed),
            serving_s,
            record.fence_s,
            record.start_s,
        )


ROWS = 48
SIM = CalendarConfig(turns=(2, 3), turn_s=(0.05, 0.15), mutation_p=0.5, lease_s=10.0)
RUN = RuntimeConfig(
    control_timeout_s=3.0,
    reply_grace_s=0.5,
    drain_timeout_s=3.0,
    lease_s=10.0,
    max_consecutive_failures=4,
    replace_timeout_s=30.0,
)


async def test_the_run_goes_on_exactly_once_across_a_node_lost_mid_run_and_mid_checkpoint(
    ray_nodes: Any, tmp_path: Path
) -> None:
    """Instances spread over three worker nodes; the node of one is lost between two
    checkpoints (and a new node joins), the node of another while a checkpoint has Gym parked.
    Every instance on them is replaced on a live node, and the run finishes with every row
    trained once and every calendar mutation (sentinel) in the final snapshot once."""

    lineage: list[tuple[int, list[int]]] = []
    outcomes: list[CheckpointOutcome] = []
    lost: dict[str, tuple[str, str]] = {}  # when -> (instance, node)
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=SIM),
        instances=3,
        seed=5,
        work_dir=tmp_path / "gym-live",
        config=SIM.host_config(),
    ) as gym:
        assert len(set(gym.placement.values())) >= 2  # spread (SPREAD is best effort)

        def lose_node_of(instance: str, when: str) -> None:
            node = gym.placement[instance]
            lost[when] = (instance, node)
            ray_nodes.remove(node)

        def on_stage(checkpoint_id: str, point: str) -> None:
            if point == "after_prepare" and "mid-checkpoint" not in lost and len(outcomes) >= 3:
                lose_node_of("gym-1", "mid-checkpoint")  # Gym parked, nothing committed yet

        async with open_rollouts(
            gym, tmp_path / "work", rows=ROWS, group_size=2, config=RUN, max_rows_in_flight=12
        ) as ro:
            ro.coordinator.on_stage = on_stage
            step = 0
            async with aclosing(ro.batches(4)) as batches:  # closed on error too
                async for batch in batches:
                    step += 1
                    lineage.append((step, [g.row for g in batch]))
                    if step == 2:
                        lose_node_of("gym-0", "mid-run")
                        ray_nodes.add()  # a node joins back: the next loss leaves two
                    if step % 2 == 0:
                        outcomes.append(await ro.checkpoint(str(step).encode()))
            for _ in range(RUN.max_consecutive_failures + 1):  # a last one, for the verdict
                outcomes.append(await ro.checkpoint(str(step).encode()))
                if outcomes[-1].ok:
                    break
        final = outcomes[-1]
        assert final.ok and final.snapshot is not None
        assert set(lost) == {"mid-run", "mid-checkpoint"}
        replaced = {r.instance for r in gym.replacements}
        assert {"gym-0", "gym-1"} <= replaced
        alive = ray_nodes.alive()
        assert all(node in alive for node in gym.placement.values())
        assert not {node for _, node in lost.values()} & set(gym.placement.values())

    failed = [o for o in outcomes if not o.ok]
    assert failed and all(o.reason == "gym_unavailable" for o in failed)
    verdict = judge(lineage, ROWS, final.snapshot.path, seed=5, config=SIM, group_size=2)
    assert verdict.ok, verdict.violations()
    assert verdict.rows_trained == ROWS and verdict.sentinels_expected > 0
    log.warning(
        "lost %s; %d checkpoints, %d failed; replacements %s",
        lost,
        len(outcomes),
        len(failed),
        [(r.instance, round(r.total_s, 3)) for r in gym.replacements],
    )


SOAK_ROWS = 400
SOAK_LOSSES = 6


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_soak_many_node_losses_with_nodes_joining_back(
    ray_nodes: Any, tmp_path: Path
) -> None:
    """The long version, not in CI (a few minutes):
    ``.venv/bin/python -m pytest --slow -k soak tests/test_ray_multinode.py``.
    ``SOAK_LOSSES`` nodes lost, every 4 steps, in turn between checkpoints and
    while a checkpoint has Gym parked; a new worker node joins after each (as an autoscaler
    would bring one), so three stay up."""
    from gymckpt.testing.ray_nodes import WORKER_NODES

    config = attrs.evolve(RUN, max_replacements=3 * SOAK_LOSSES)
    lineage: list[tuple[int, list[int]]] = []
    outcomes: list[CheckpointOutcome] = []
    lost: list[tuple[str, str, str]] = []  # (when, instance, node)
    due_in_checkpoint = False
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=SIM),
        instances=3,
        seed=7,
        work_dir=tmp_path / "gym-live",
        config=SIM.host_config(),
    ) as gym:

        def lose(when: str) -> None:
            live = [n for n in gym.instances if gym.placement[n] in ray_nodes.workers]
            instance = live[len(lost) % len(live)]
            lost.append((when, instance, gym.placement[instance]))
            ray_nodes.remove(gym.placement[instance])

        def on_stage(checkpoint_id: str, point: str) -> None:
            nonlocal due_in_checkpoint
            if point == "after_prepare" and due_in_checkpoint:
                due_in_checkpoint = False
                lose("mid-checkpoint")

        async with open_rollouts(
            gym,
            tmp_path / "work",
            rows=SOAK_ROWS,
            group_size=2,
            config=config,
            max_rows_in_flight=12,
        ) as ro:
            ro.coordinator.on_stage = on_stage
            step = 0
            async with aclosing(ro.batches(4)) as batches:  # closed on error too
                async for batch in batches:
                    step += 1
                    lineage.append((step, [g.row for g in batch]))
                    if step % 4 == 0 and len(lost) < SOAK_LOSSES and not due_in_checkpoint:
                        if len(lost) % 2 == 0:
                            lose("mid-run")
                        else:
                            due_in_checkpoint = True
                    if step % 2 == 0:
                        outcomes.append(await ro.checkpoint(str(step).encode()))
                    if len(ray_nodes.workers) < WORKER_NODES:
                        ray_nodes.add()  # a few seconds; on this thread (Ray sets signal handlers)
            for _ in range(RUN.max_consecutive_failures + 1):
                outcomes.append(await ro.checkpoint(str(step).encode()))
                if outcomes[-1].ok:
                    break
        final = outcomes[-1]
        assert final.ok and final.snapshot is not None
        assert len(lost) == SOAK_LOSSES
        assert all(node in ray_nodes.alive() for node in gym.placement.values())
    verdict = judge(lineage, SOAK_ROWS, final.snapshot.path, seed=7, config=SIM, group_size=2)
    assert verdict.ok, verdict.violations()
    assert verdict.rows_trained == SOAK_ROWS
    log.warning(
        "soak: lost %d nodes; %d checkpoints, %d failed; %d replacements",
        len(lost),
        len(outcomes),
        sum(not o.ok for o in outcomes),
        len(gym.replacements),
    )
