"""Boundary marks on demand (``HostConfig(boundary_marks="on_demand")``): a run that never cuts
exports nothing at its step boundaries; the first prepare that may cut arms the marks, and its
cut, which has no mark for a turn that started before, retries that episode from its start
(failed as infrastructure, its reply drained), while every later turn is marked and taken at
its boundary, restoring exactly once.

The environment: each turn appends its number to the ``tally`` participant's session and, for a
gated (row, turn), waits on a ``trio.Event`` the test sets, so a checkpoint lands inside a turn.
Every ``export`` is counted. Virtual time throughout (trio's ``MockClock``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import Completed, Done, Environment, GymHost, HostConfig, RunRow
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    rollout_id_for,
)

TURNS = 3


@attrs.define
class World:
    """The test's side of the environment: export counts, and the gated turns' events."""

    exports: int = 0
    gates: dict[tuple[int, int], trio.Event] = attrs.field(factory=dict)
    reached: dict[tuple[int, int], trio.Event] = attrs.field(factory=dict)

    def gate(self, row: int, turn: int) -> None:
        self.gates[(row, turn)] = trio.Event()
        self.reached[(row, turn)] = trio.Event()


@attrs.define
class Tally:
    """Each turn appends its number to the session (a mutation that must happen once)."""

    world: World
    name: str = "tally"
    kind: str = "environment"

    def open(self, info: EpisodeInfo) -> Any:
        return {"turns": []}

    def export(self, state: Any) -> Any:
        self.world.exports += 1
        return {"turns": list(state["turns"])}

    def restore(self, data: Any) -> Any:
        return {"turns": list(data["turns"])}


@attrs.define
class Agent:
    world: World
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"seen": 0}

    def export(self, state: Any) -> Any:
        self.world.exports += 1
        return dict(state)

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: Any, state: Any) -> Done | None:
        ctx.session("tally")["turns"].append(ctx.turn)
        gate = (ctx.info.row, ctx.turn)
        if gate in self.world.gates:
            self.world.reached[gate].set()
            await self.world.gates[gate].wait()
        state["seen"] += 1
        return Done(1.0, payload=state["seen"]) if ctx.turn + 1 == TURNS else None


def host(world: World, tmp_path: Path, marks: str, name: str = "w") -> GymHost:
    env = Environment(agent=Agent(world), participants=(Tally(world),))
    config = HostConfig(lease_s=600.0, boundary_marks=marks)
    return GymHost("gym-0", env, work_dir=tmp_path / name, config=config)


def row(r: int, attempt: int = 0) -> RunRow:
    return RunRow(rollout_id_for(r, 0, attempt), r, 0, attempt)


def deadline(seconds: float = 30.0) -> float:
    return trio.current_time() + seconds


@pytest.mark.parametrize("marks", ["on_demand", "always"])
async def test_an_aligned_run_exports_nothing_at_its_step_boundaries(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, marks: str
) -> None:
    """Four episodes of three turns, an aligned checkpoint while they wait at a gate: on
    demand, every export is the commit's (two per parked episode), none a boundary's;
    always, every boundary exports too."""
    world = World()
    for r in range(4):
        world.gate(r, 1)
    async with host(world, tmp_path, marks) as h:
        stream = await h.run([row(r) for r in range(4)])
        for r in range(4):
            await world.reached[(r, 1)].wait()
        at_prepare = world.exports
        for r in range(4):
            world.gates[(r, 1)].set()
        await h.prepare("c1", deadline(), CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
        before_commit = world.exports
        reply = await h.commit("c1", str(tmp_path / "snap"), deadline())
        assert len(reply.exported) == 4 and reply.mid_turn == 0
        assert world.exports - before_commit == 4 * 2
        await h.resume("c1", deadline())
        with trio.fail_after(60):
            got = [x async for batch in stream for x in batch]
        assert sorted(type(x).__name__ for x in got) == ["Completed"] * 4
        boundary_exports = world.exports - (world.exports - before_commit)
    if marks == "on_demand":
        assert at_prepare == 0 and boundary_exports == 0, (
            f"an aligned run exported {boundary_exports} times at its step boundaries"
        )
    else:
        assert at_prepare == 4 * 2 * 2  # boundaries 0 and 1 of each episode, two participants
        assert boundary_exports > at_prepare


async def test_the_first_cut_retries_a_turn_started_unmarked_and_the_next_restores_exactly(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Row 0 is inside turn 1 when the first unaligned checkpoint comes: no mark of boundary
    1 exists, so the cut cannot take it. The prepare returns at once (nothing parks, no wait);
    the commit ends row 0 failed as infrastructure (retried from its start, spending nothing),
    its reply on the wire for the drain, and exports nothing of it. Row 1, started after, is
    marked at every boundary: the next cut takes it inside turn 1 at boundary 1, and a restore
    replays turn 1 with each turn's mutation once."""
    world = World()
    world.gate(0, 1)
    world.gate(1, 1)
    root = tmp_path / "snap"
    async with host(world, tmp_path, "on_demand") as h:
        first = await h.run([row(0)])
        await world.reached[(0, 1)].wait()
        assert world.exports == 0
        prepared = await h.prepare("c1", deadline(), CheckpointMode.UNALIGNED)
        assert prepared.parked == 0
        reply = await h.commit("c1", str(root / "c1"), deadline())
        assert reply.exported == () and reply.mid_turn == 0
        assert reply.on_wire == ("0-0",), "the retried episode's reply is not for the drain"
        with trio.fail_after(30):
            got = [x async for batch in first for x in batch]
        assert [(type(x).__name__, getattr(x, "failure_class", None)) for x in got] == [
            ("Failed", "infra")
        ]
        await h.resume("c1", deadline())

        await h.run([row(1)])
        await world.reached[(1, 1)].wait()
        assert world.exports == 2 * 2  # boundaries 0 and 1 of row 1, two participants
        await h.prepare("c2", deadline(), CheckpointMode.UNALIGNED)
        reply = await h.commit("c2", str(root / "c2"), deadline())
        assert reply.mid_turn == 1
        assert [(s.rollout_id, s.step_boundary) for s in reply.sessions] == [("1-0", 1)]
        world.gates[(1, 1)].set()
        await h.resume("c2", deadline())
    record = InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, reply.instance, e.capture_keys) for e in reply.exported
    ]
    again = World()
    async with host(again, tmp_path, "on_demand", name="b") as h:
        restored = await h.restore(str(root / "c2"), record, episodes, deadline())
        assert "1-0" in restored.restored
        assert h.session_states("tally")["1-0"].state == {"turns": [0]}, "not boundary 1's"
        stream = await h.run([RunRow("1-0-a1", 1, 0, 1, restored_from="1-0")])
        with trio.fail_after(60):
            got = [x async for batch in stream for x in batch]
        assert len(got) == 1 and isinstance(got[0], Completed), got
        assert got[0].payload == TURNS, "a turn replayed twice, or one lost"


async def test_an_alignment_timeout_arms_the_marks(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An aligned run exports nothing until its alignment timeout runs out with a turn still
    in flight; that cut retries the turn (infra), and every boundary after is marked."""
    world = World()
    world.gate(0, 1)
    async with host(world, tmp_path, "on_demand") as h:
        first = await h.run([row(0)])
        await world.reached[(0, 1)].wait()
        await h.prepare("c1", deadline(), CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
        reply = await h.commit("c1", str(tmp_path / "snap"), deadline())
        assert reply.exported == () and reply.on_wire == ("0-0",)
        assert world.exports == 0
        await h.resume("c1", deadline())
        with trio.fail_after(30):
            got = [x async for batch in first for x in batch]
        assert [getattr(x, "failure_class", None) for x in got] == ["infra"]
        second = await h.run([row(1)])
        with trio.fail_after(30):
            got = [x async for batch in second for x in batch]
        assert isinstance(got[0], Completed)
        assert world.exports == TURNS * 2, "the boundaries after the arming cut were not marked"
