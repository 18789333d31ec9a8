"""``RayGym.replace``: a dead instance's actor is fenced off and a fresh one serves its name.

On the session's single-node cluster: the ``dead`` fault ends an actor's process for real, the
instance's calls fail with ``GymInstanceDead``, and ``replace`` brings up a new actor under the
same name. The multi-node versions (a node removed under the deployment, the whole run going on
across it) are in ``test_ray_multinode.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gymckpt.gym_adapter import (
    EnvironmentRef,
    GymInstanceDead,
    InstanceInventory,
    RayGym,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.runtime import GymCallTimeout, rollout_id_for

pytestmark = pytest.mark.ray

CONFIG = CalendarConfig(turns=(2, 3), turn_s=(0.2, 0.3), mutation_p=0.5, lease_s=10.0)


def rows(n: int, start: int = 0) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(start, start + n)]


def holds_nothing(inv: InstanceInventory) -> bool:
    return inv.admission_open and not (inv.running or inv.parked or inv.unclaimed or inv.on_wire)


async def test_replace_serves_the_name_again_and_the_old_incarnation_marks_nothing(
    tmp_path: Path,
) -> None:
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=CONFIG),
        instances=2,
        seed=1,
        work_dir=tmp_path,
        faults=["prepare:dead@1"],
        config=CONFIG.host_config(),
    ) as gym:
        before = await gym.topology()
        old_stream = await gym.run("gym-0", rows(3))  # in flight when the actor dies
        with pytest.raises(GymInstanceDead):
            await gym.prepare("gym-0", "c1", trio.current_time() + 10)
        with pytest.raises(GymInstanceDead):  # dead: nothing reaches Ray any more
            await gym.run("gym-0", rows(1, start=10))

        await gym.replace("gym-0", trio.current_time() + 30)

        # the old stream says its actor died, and marks the replacement nothing
        with pytest.raises(GymInstanceDead):
            [r async for batch in old_stream for r in batch]
        await old_stream.aclose()
        assert await gym.topology() == before  # same name, same participants
        assert holds_nothing(await gym.inventory("gym-0"))  # fresh
        stream = await gym.run("gym-0", rows(2, start=20))
        replies = [r async for batch in stream for r in batch]
        assert sorted(r.rollout_id for r in replies) == [r.rollout_id for r in rows(2, 20)]
        reply = await gym.prepare("gym-0", "c2", trio.current_time() + 10)  # fault was @1
        await gym.resume("gym-0", reply.checkpoint_id, trio.current_time() + 10)
        (done,) = gym.replacements
        assert done.instance == "gym-0" and done.new_location == gym.placement["gym-0"]
        assert 0 < done.total_s < 30
        stats = await gym.statistics()
        assert not any(s.dead for s in stats.instances)
        assert gym.bridge_statistics().calls_pending == 0


async def test_replace_past_its_deadline_leaves_the_instance_dead(tmp_path: Path) -> None:
    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=CONFIG),
        instances=1,
        seed=1,
        work_dir=tmp_path,
        faults=["prepare:dead@1"],
        config=CONFIG.host_config(),
    ) as gym:
        with pytest.raises(GymInstanceDead):
            await gym.prepare("gym-0", "c1", trio.current_time() + 10)
        with pytest.raises(GymCallTimeout, match="gym-0 replace"):
            await gym.replace("gym-0", trio.current_time())  # no time at all
        with pytest.raises(GymInstanceDead):
            await gym.inventory("gym-0")
        assert gym.replacements == ()
        await gym.replace("gym-0", trio.current_time() + 30)  # and again, in time
        assert holds_nothing(await gym.inventory("gym-0"))
        assert gym.bridge_statistics().calls_pending == 0
