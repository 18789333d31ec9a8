"""Cheaper boundary marks: a participant that declares ``state_version(state)`` is not exported
again at a step boundary where its state's version (and the state object) is the one of the
episode's previous mark; the mark reuses that state's bytes. The mark is the same bytes as a
full export's, a changed or replaced state is exported, a participant that declares nothing is
exported at every mark, and an unaligned cut through reused bytes restores exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import orjson
import trio
import trio.testing

from gymckpt.gym_adapter import Completed, Done, Environment, GymHost, HostConfig, RunRow
from gymckpt.gym_adapter.host._cut import mark_boundary
from gymckpt.gym_adapter.host._environment import Roles
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import BOUNDARY, Episode
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    rollout_id_for,
)

INFO = EpisodeInfo("3-1", 3, 1, 0, 7, "i-0")


@attrs.define
class Box:
    """A session state with a version the participant bumps on every change."""

    data: dict[str, Any]
    version: int = 0

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.version += 1


@attrs.define
class Versioned:
    name: str = "big"
    kind: str = "environment"
    exports: int = 0

    def open(self, info: EpisodeInfo) -> Box:
        return Box({"files": {f"f{i}": "x" * 64 for i in range(50)}})

    def export(self, state: Box) -> Any:
        self.exports += 1
        return {"data": state.data, "version": state.version}

    def restore(self, data: Any) -> Box:
        return Box(dict(data["data"]), data["version"])

    def state_version(self, state: Box) -> int:
        return state.version


@attrs.define
class Plain:
    """Declares nothing: exported at every mark."""

    name: str = "agent"
    kind: str = "simple_agent"
    exports: int = 0
    gate: dict[int, trio.Event] = attrs.field(factory=dict)
    reached: dict[int, trio.Event] = attrs.field(factory=dict)

    def open(self, info: EpisodeInfo) -> Any:
        return {"turns": 0}

    def export(self, state: Any) -> Any:
        self.exports += 1
        return dict(state)

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: Any, state: Any) -> Done | None:
        if ctx.turn == 1:
            ctx.session("big").set("changed", ctx.turn)
        if ctx.turn in self.gate:
            self.reached[ctx.turn].set()
            await self.gate[ctx.turn].wait()
        state["turns"] += 1
        return Done(1.0, payload=state["turns"]) if ctx.turn == 4 else None


def episode(agent: Any, big: Any, turn: int = 0) -> Episode:
    return Episode(INFO, {"agent": agent, "big": big}, BOUNDARY, turn=turn)


def test_an_unchanged_state_is_not_exported_again_and_the_mark_is_the_same_bytes() -> None:
    plain, big = Plain(), Versioned()
    roles = Roles.of(Environment(agent=plain, participants=(big,)))
    assert roles.versions is not None and roles.versions[0] is None
    ep = episode({"turns": 0}, big.open(INFO))
    ep.mark = first = mark_boundary(roles.sessions, ep, roles.versions)
    full = mark_boundary(roles.sessions, ep)  # every state exported
    assert first.states == full.states and (plain.exports, big.exports) == (2, 2)

    ep.turn, ep.sessions["agent"]["turns"] = 1, 1
    ep.mark = second = mark_boundary(roles.sessions, ep, roles.versions)
    assert (plain.exports, big.exports) == (3, 2), "an unchanged state was exported again"
    # (the full mark below exports it once more, for the comparison)
    assert second.states == mark_boundary(roles.sessions, ep).states

    ep.sessions["big"].set("k", 1)  # a change: exported again
    ep.turn = 2
    ep.mark = third = mark_boundary(roles.sessions, ep, roles.versions)
    assert big.exports == 4 and orjson.loads(third.states)[1]["data"]["k"] == 1

    replaced = Box(dict(ep.sessions["big"].data), ep.sessions["big"].version)
    replaced.data["other"] = True
    ep.sessions["big"] = replaced  # same version, another object (ctx.replace_session)
    ep.turn = 3
    ep.mark = fourth = mark_boundary(roles.sessions, ep, roles.versions)
    assert big.exports == 5 and orjson.loads(fourth.states)[1]["data"]["other"] is True


def test_a_non_finite_state_behind_a_version_is_refused_naming_it() -> None:
    plain, big = Plain(), Versioned()
    roles = Roles.of(Environment(agent=plain, participants=(big,)))
    box = big.open(INFO)
    box.set("x", float("nan"))
    mark = mark_boundary(roles.sessions, episode({"turns": 0}, box), roles.versions)
    assert mark.states is None and mark.problem is not None
    assert "big session state" in mark.problem, mark.problem


async def test_an_unaligned_cut_through_reused_bytes_restores_exactly(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Five turns; turn 1 changes the versioned state, the others do not. The versioned
    participant is exported at boundaries 0 and 2 only. A cut inside turn 3 takes boundary 3,
    whose bytes of that state were reused from boundary 2: the restore has turn 1's change,
    and the episode ends with each turn once."""
    plain, big = Plain(), Versioned()
    plain.gate[3], plain.reached[3] = trio.Event(), trio.Event()
    env = Environment(agent=plain, participants=(big,))
    root = tmp_path / "snap"
    config = HostConfig(lease_s=600.0)
    async with GymHost("gym-0", env, work_dir=tmp_path / "a", config=config) as h:
        await h.run([RunRow(rollout_id_for(0, 0, 0), 0, 0, 0)])
        await plain.reached[3].wait()
        assert big.exports == 2, f"{big.exports} exports of a state that changed once"
        await h.prepare("c1", trio.current_time() + 30, CheckpointMode.UNALIGNED)
        reply = await h.commit("c1", str(root), trio.current_time() + 30)
        assert reply.mid_turn == 1
        plain.gate[3].set()
        await h.resume("c1", trio.current_time() + 30)
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
    plain2, big2 = Plain(), Versioned()
    env2 = Environment(agent=plain2, participants=(big2,))
    async with GymHost("gym-0", env2, work_dir=tmp_path / "b", config=config) as h:
        restored = await h.restore(str(root), record, episodes, trio.current_time() + 30)
        assert "0-0" in restored.restored
        box = h.session_states("big")["0-0"].state
        assert box.data["changed"] == 1 and box.version == 1
        assert h.session_states("agent")["0-0"].state == {"turns": 3}
        stream = await h.run([RunRow("0-0-a1", 0, 0, 1, restored_from="0-0")])
        with trio.fail_after(60):
            got = [x async for batch in stream for x in batch]
        assert len(got) == 1 and isinstance(got[0], Completed) and got[0].payload == 5
