"""Crash control of one life (``crashes``): the crash's cancel scope, and the stream
drops and instance deaths the scenario draws between checkpoint stages."""

from __future__ import annotations

import random
from typing import Any, cast

import attrs
import trio

from gymckpt.app.simulation.crashes import CrashControl
from gymckpt.app.simulation.scenario import Crash, Scenario
from gymckpt.gym_adapter import EmbeddedGym


@attrs.define
class FakeSim:
    dead: bool = False
    drops: int = 0

    def drop_stream(self, randrange: Any) -> None:
        self.drops += 1

    def kill(self) -> None:
        self.dead = True


@attrs.define
class FakeGym:
    sims: dict[str, FakeSim]

    @property
    def instances(self) -> list[str]:
        return list(self.sims)

    def sim(self, name: str) -> FakeSim:
        return self.sims[name]


def control(sc: Scenario, crash: Crash | None = None, races: bool = True) -> CrashControl:
    c = CrashControl(sc, random.Random(0), crash, races)
    c.gym = cast(EmbeddedGym, FakeGym({"gym-0": FakeSim(), "gym-1": FakeSim(dead=True)}))
    return c


def sims(c: CrashControl) -> dict[str, FakeSim]:
    return cast(FakeGym, c.gym).sims


def test_checkpoints_are_counted_by_first_hook_point_reached() -> None:
    c = control(Scenario(stage_drops=((2, "after_commit"),)))
    for cid, point in [
        ("i0-0003", "before_prepare"),
        ("i0-0003", "after_commit"),
        ("i0-0004", "before_prepare"),
    ]:
        c.on_stage(cid, point)
    assert c.checkpoint_ids == ["i0-0003", "i0-0004"]
    assert sims(c)["gym-0"].drops == 0  # checkpoint 2 has not reached before_commit
    c.on_stage("i0-0004", "after_commit")
    assert sims(c)["gym-0"].drops == 1 and sims(c)["gym-1"].drops == 0  # the live one


def test_a_stage_death_kills_a_live_instance_only_with_races() -> None:
    sc = Scenario(stage_deaths=((1, "before_prepare"),))
    calm = control(sc, races=False)
    calm.on_stage("i3-0001", "before_prepare")
    assert not sims(calm)["gym-0"].dead
    racy = control(sc)
    racy.on_stage("i3-0001", "before_prepare")
    assert sims(racy)["gym-0"].dead


async def test_a_crash_at_a_hook_point_cancels_the_scope_there() -> None:
    c = control(Scenario(), Crash(checkpoint=2, point="after_publish"), races=False)
    c.on_stage("a", "after_publish")
    c.on_stage("b", "before_prepare")
    assert not c.scope.cancel_called
    c.on_stage("b", "after_publish")
    assert c.scope.cancel_called


def test_kill_without_a_gym_does_nothing() -> None:
    c = CrashControl(Scenario(), random.Random(0), None, True)
    c.kill("gym-0")
    c.gym = cast(EmbeddedGym, FakeGym({"gym-0": FakeSim()}))
    c.kill("gym-0")
    assert sims(c)["gym-0"].dead


async def test_a_crash_in_time_fires_that_long_after_arm(autojump_clock: trio.abc.Clock) -> None:
    await trio.sleep(10)
    c = CrashControl(Scenario(), random.Random(0), Crash(at_s=2.5), True)
    c.arm()
    with c.scope:
        await trio.sleep(100)
    assert c.scope.cancelled_caught and trio.current_time() == 12.5
    idle = CrashControl(Scenario(), random.Random(0), None, True)
    idle.arm()
    assert idle.scope.deadline == float("inf")
