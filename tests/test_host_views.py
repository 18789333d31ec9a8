"""What a host reports (``gym_adapter.host._views``): ``HostStatistics`` is the host's one tally
(``HostCounts``) plus the gauges of the moment; ``HostViews`` reads the host's parts (episode
table, slot table, parking, streams) and changes none of them.

The parts are built directly; no host runs.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import GymInstanceDead
from gymckpt.gym_adapter.host._environment import Roles
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import BOUNDARY, MOVING, UNCLAIMED, Episode, EpisodeTable
from gymckpt.gym_adapter.host._parking import Parking
from gymckpt.gym_adapter.host._slots import SlotTable
from gymckpt.gym_adapter.host._streams import ReplyStreams
from gymckpt.gym_adapter.host._views import HostCounts, HostStatistics, HostViews


class Cal:
    name, kind, retained = "cal", "environment", True

    def open(self, info: EpisodeInfo) -> Any:
        return {"events": []}

    def export(self, state: Any) -> Any:
        if "broken" in state:
            raise ValueError("broken calendar")
        return {"events": list(state["events"])}

    def restore(self, data: Any) -> Any:
        return data


@attrs.define
class Parts:
    table: EpisodeTable
    slots: SlotTable
    parking: Parking
    streams: ReplyStreams
    count: HostCounts
    dead: list[bool]
    views: HostViews


def parts() -> Parts:
    cal = Cal()
    roles = Roles(
        sessions=(cal,),
        retained=(cal,),
        retained_names=frozenset({"cal"}),
        legacy=False,
        owner="cal",
    )
    table, slots = EpisodeTable(), SlotTable("gym-0", (cal,))
    parking, streams = Parking(60.0, False), ReplyStreams(0.01, 8)
    count, dead = HostCounts(), [False]
    views = HostViews(
        "gym-0",
        (("agent", "simple_agent"), ("cal", "environment")),
        roles,
        table,
        slots,
        parking,
        streams,
        count,
        {"mine": 3},
        lambda: dead[0],
    )
    return Parts(table, slots, parking, streams, count, dead, views)


def episode(p: Parts, row: int, state: str, attempt: int = 0) -> Episode:
    info = EpisodeInfo(f"r{row}", row, 0, attempt, 0, "gym-0")
    ep = Episode(info, {"agent": {}, "cal": {"events": [row]}}, state)
    p.slots.open(ep.key, ep.rollout_id, attempt, ep.sessions)
    return ep


def test_statistics_are_the_counts_and_the_gauges_each_declared_once() -> None:
    counts = {f.name for f in attrs.fields(HostCounts)}
    stats = {f.name for f in attrs.fields(HostStatistics)}
    assert counts < stats and issubclass(HostStatistics, HostCounts)
    snapshot = parts().views.statistics()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snapshot.completed = 1  # type: ignore[misc]


async def test_statistics_count_parked_episodes_only_while_prepared() -> None:
    p = parts()
    async with trio.open_nursery() as nursery:
        p.parking.open(nursery.start_soon, lambda ep: None)
        for row in range(3):
            p.table.add(episode(p, row, MOVING))
            p.parking.started()
        p.count.completed = 5
        before = p.views.statistics()
        assert (before.running, before.parked, before.completed) == (3, 0, 5)
        assert before.counters == {"mine": 3} and before.admission_open
        p.parking.prepare("ckpt-1")
        assert await p.parking.boundary(p.table.active["r0"], lambda ep: False) is False
        assert p.table.active["r0"].state == BOUNDARY  # one parked, two still moving
        during = p.views.statistics()
        assert (during.running, during.parked, during.prepared) == (2, 1, True)
        assert not during.admission_open
        inventory = p.views.inventory()
        assert inventory.parked == ("r0",) and inventory.running == ("r1", "r2")
        p.parking.close()
        nursery.cancel_scope.cancel()


def test_session_states_read_active_unclaimed_and_kept_sessions_sorted_by_slot() -> None:
    p = parts()
    p.table.add(episode(p, 2, MOVING))
    p.table.install_unclaimed({"r1": episode(p, 1, UNCLAIMED)})
    done = episode(p, 0, MOVING)
    p.slots.finish(done)  # ended and kept
    states = p.views.session_states("cal")
    assert list(states) == ["0-0", "1-0", "2-0"]
    assert [v.state for v in states.values()] == [{"events": [r]} for r in (0, 1, 2)]
    assert p.views.session_states("agent").keys() == {"1-0", "2-0"}  # the agent is not kept
    with pytest.raises(KeyError, match="no participant 'x' on instance gym-0"):
        p.views.session_states("x")


def test_retained_sessions_are_plain_data_and_a_failing_export_names_the_slot() -> None:
    p = parts()
    ep = episode(p, 4, MOVING)
    p.table.add(ep)
    got = p.views.retained_sessions()["cal"]["4-0"]
    assert (got.rollout_id, got.attempt, got.state) == ("r4", 0, {"events": [4]})
    ep.sessions["cal"]["broken"] = True
    with pytest.raises(ValueError, match="participant cal could not export the session of slot"):
        p.views.retained_sessions()


def test_a_dead_instance_answers_no_view_but_its_statistics() -> None:
    p = parts()
    p.dead[0] = True
    for view in (p.views.topology, p.views.inventory, p.views.retained_sessions):
        with pytest.raises(GymInstanceDead):
            view()
    assert p.views.statistics().dead


async def test_a_held_episode_waiting_before_any_prepare_counts_as_running() -> None:
    p = parts()
    async with trio.open_nursery() as nursery:
        p.parking.open(nursery.start_soon, lambda ep: None)
        ep = episode(p, 0, MOVING)
        p.table.add(ep)
        p.parking.started()
        ep.hold = True  # ctx.hold(): waits at its boundary until a checkpoint is prepared
        nursery.start_soon(p.parking.boundary, ep, lambda ep: False)
        await trio.testing.wait_all_tasks_blocked()
        assert ep.state == BOUNDARY and p.parking.moving == 0
        stats = p.views.statistics()
        assert (stats.running, stats.parked) == (1, 0)
        assert p.views.inventory().running == ("r0",)
        p.parking.close()
        nursery.cancel_scope.cancel()
