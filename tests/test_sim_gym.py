"""The scenario's Gym (``gym``): host generations told apart, what each installed, stream
ends delivered late, and the embedded Gym a scenario opens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from gymckpt.app.simulation.gym import LateEnds, generations, installs, open_gym
from gymckpt.app.simulation.scenario import Scenario
from gymckpt.gym_adapter import EmbeddedGym, GymStatistics, RunReply, RunRow
from gymckpt.testing.hostile import HostileAct, HostileActs


def host(name: str, restored: int) -> SimpleNamespace:
    return SimpleNamespace(instance=name, restored=restored)


def stats() -> GymStatistics:
    # gym-0 replaced twice, gym-1 once; the live hosts come last
    replaced = (host("gym-0", 1), host("gym-1", 2), host("gym-0", 3))
    live = (host("gym-0", 4), host("gym-1", 5))
    return cast(GymStatistics, SimpleNamespace(replaced=replaced, instances=live))


def test_generations_count_the_replacements_of_each_name() -> None:
    assert generations(stats()) == [
        ("gym-0", 0),
        ("gym-1", 0),
        ("gym-0", 1),
        ("gym-0", 2),
        ("gym-1", 1),
    ]
    assert installs(stats()) == {
        ("gym-0", 0): 1,
        ("gym-1", 0): 2,
        ("gym-0", 1): 3,
        ("gym-0", 2): 4,
        ("gym-1", 1): 5,
    }


class Stream:
    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches, self.closed = batches, False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        if not self.batches:
            raise StopAsyncIteration
        return self.batches.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class Gym:
    stream = Stream([["a"], ["b"]])
    instances = ("gym-0",)

    async def run(self, instance: str, rows: Sequence[RunRow]) -> Stream:
        return self.stream


async def test_a_late_end_arrives_late_and_replies_do_not(autojump_clock: trio.abc.Clock) -> None:
    gym = LateEnds(cast(EmbeddedGym, Gym()), 3.0)
    assert gym.instances == ("gym-0",)  # everything else is the Gym's
    stream = await gym.run("gym-0", [])
    seen = [(batch, trio.current_time()) async for batch in stream]
    assert seen == [(["a"], 0.0), (["b"], 0.0)] and trio.current_time() == 3.0
    await stream.aclose()
    assert Gym.stream.closed


async def test_the_scenario_gym_has_its_instances_and_kinds(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    sc = Scenario(instances=2, agent_kinds=("simple_agent", "legacy_agent"))
    async with open_gym(sc, tmp_path / "plain", ("run:drop@1",), None) as gym:
        assert list(gym.instances) == ["gym-0", "gym-1"]
    acts = HostileActs((HostileAct(kind="export_raises", n=1),), active=True)
    async with open_gym(sc, tmp_path / "hostile", (), acts) as gym:
        assert list(gym.instances) == ["gym-0", "gym-1"]
        assert all(not gym.sim(name).dead for name in gym.instances)
