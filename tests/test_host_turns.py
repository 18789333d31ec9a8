"""One episode's turns (``gym_adapter.host._turns``): ``Turns.play`` runs the agent's ``step``
from a step boundary until the episode ends (its reply) or parks (None); a failure of the user's
code is a data failure, logged; an attempt that lost its slot is fenced; the retained sessions a
turn fetched are journaled after it.

``Turns`` is built from its parts directly (a slot table, a parking, counts); no host runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from plain_state import CountState, PlainState

from gymckpt.gym_adapter import Done, Environment
from gymckpt.gym_adapter._contract import Completed, Failed
from gymckpt.gym_adapter.host._environment import Roles
from gymckpt.gym_adapter.host._episode import EpisodeFenced, EpisodeInfo, ModelUnavailable
from gymckpt.gym_adapter.host._episodes import BOUNDARY, MOVING, Episode, StagedModelCall
from gymckpt.gym_adapter.host._journal import replay_journal
from gymckpt.gym_adapter.host._log import FailureLog
from gymckpt.gym_adapter.host._parking import Parking
from gymckpt.gym_adapter.host._slots import SlotTable
from gymckpt.gym_adapter.host._turns import Turns
from gymckpt.gym_adapter.host._user_calls import UserCalls
from gymckpt.gym_adapter.host._views import HostCounts


def S(key: str, response: object) -> StagedModelCall:
    """A staged call of a request with digest 0...0 at policy version 0."""
    return StagedModelCall(key, response, "0" * 64, 0)


class Cal(CountState):
    name, kind, retained = "cal", "environment", True


@attrs.define
class Agent(PlainState):
    """``turns`` turns, each adding 1 to the calendar; ``fail_at``: that turn raises;
    ``on_turn``: called with the turn number before it returns."""

    turns: int = 3
    fail_at: int | None = None
    error: type[Exception] = RuntimeError
    on_turn: Any = None
    name: str = "agent"
    kind: str = "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await trio.sleep(1.0)
        if ctx.turn == self.fail_at:
            raise self.error(f"turn {ctx.turn} broke")
        ctx.session("cal")["n"] += 1
        if self.on_turn is not None:
            self.on_turn(ctx.turn)
        return (
            Done(1.0, payload={"n": ctx.session("cal")["n"]})
            if ctx.turn + 1 >= self.turns
            else None
        )


@attrs.define
class Rig:
    turns: Turns
    slots: SlotTable
    parking: Parking
    count: HostCounts


def rig(agent: Agent, journal: Path | None = None) -> Rig:
    env = Environment(agent=agent, participants=(Cal(),))
    roles = Roles.of(env)
    slots = SlotTable("gym-0", roles.retained)
    if journal is not None:
        slots.open_journal(journal, recover=False, on_failure=lambda _: None)
    parking, count = Parking(60.0, False), HostCounts()
    calls = UserCalls()
    calls.open()
    turns = Turns(
        name="gym-0",
        environment=env,
        retained_names=roles.retained_names,
        slots=slots,
        parking=parking,
        count=count,
        user_calls=calls,
        failure_log=FailureLog(trio.current_time),
        sessions=roles.sessions,
    )
    return Rig(turns, slots, parking, count)


def started(r: Rig, attempt: int = 0, **kw: Any) -> Episode:
    info = EpisodeInfo(f"r-a{attempt}", 1, 0, attempt, 0, "gym-0")
    ep = Episode(info, {"agent": {}, "cal": {"n": 0}}, MOVING, **kw)
    r.slots.open(ep.key, ep.rollout_id, attempt, ep.sessions)
    r.parking.started()
    return ep


async def test_an_episode_plays_its_turns_to_its_completed_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(Agent(turns=3))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        reply = await r.turns.play(ep)
        nursery.cancel_scope.cancel()
    assert reply == Completed(ep.rollout_id, 1.0, 3, {"n": 3})
    assert ep.turn == 3 and r.count.turns == 3 and trio.current_time() == 3.0


async def test_a_step_that_raises_fails_the_episode_as_data_and_logs_it(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = rig(Agent(turns=5, fail_at=1))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        reply = await r.turns.play(started(r))
        nursery.cancel_scope.cancel()
    assert isinstance(reply, Failed) and reply.failure_class == "data"
    assert "turn 1: step raised RuntimeError('turn 1 broke')" in reply.message
    assert r.count.turns == 1 and "turn 1 broke" in caplog.text


async def test_a_model_that_is_unavailable_fails_the_episode_as_infra_and_logs_it(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``ModelUnavailable`` (the model's server is down after every retry) is not the episode's
    data: the trainer retries the row on a fresh attempt."""
    r = rig(Agent(turns=5, fail_at=1, error=ModelUnavailable))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        reply = await r.turns.play(started(r))
        nursery.cancel_scope.cancel()
    assert isinstance(reply, Failed) and reply.failure_class == "infra"
    assert "turn 1: model unavailable: turn 1 broke" in reply.message
    assert "turn 1 broke" in caplog.text


async def test_an_episode_parks_at_its_boundary_once_prepared(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(Agent(turns=10, on_turn=lambda turn: turn == 1 and r.parking.prepare("ckpt-1")))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        assert await r.turns.play(ep) is None
        nursery.cancel_scope.cancel()
    assert ep.state == BOUNDARY and ep.turn == 2 and r.parking.moving == 0


async def test_an_attempt_that_loses_its_slot_during_a_turn_is_fenced_and_not_journaled(
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
) -> None:
    r = rig(Agent(turns=10), journal=tmp_path / "j")

    def newer_attempt(turn: int) -> None:
        if turn == 1:
            r.slots.open("1-0", "r-a1", 1, {"cal": {"n": 100}})

    r.turns.environment.agent.on_turn = newer_attempt  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        with pytest.raises(EpisodeFenced):
            await r.turns.play(ep)
        nursery.cancel_scope.cancel()
    slots = replay_journal((tmp_path / "j").read_bytes())
    assert slots["1-0"].rollout_id == "r-a1" and slots["1-0"].states == {"cal": {"n": 100}}
    assert ep.turn == 1  # turn 0 counted and journaled; turn 1 was the fenced one


async def test_a_restored_episode_whose_staged_calls_differ_from_the_manifest_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(Agent(turns=3))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r, staged=[S("1-0:t0-c0", 1)], replay=("1-0:t0-c9",))
        reply = await r.turns.play(ep)
        nursery.cancel_scope.cancel()
    assert (
        isinstance(reply, Failed) and "capture keys ['1-0:t0-c9'] in the manifest" in reply.message
    )
    assert r.count.turns == 0


def test_turns_count_the_environments_own_counters_and_model_calls() -> None:
    r = rig(Agent())
    assert r.turns.add_count("x", 2) == 2 and r.turns.add_count("x", 3) == 5
    r.turns.model_called(replayed=False)
    r.turns.model_called(replayed=True)
    assert (r.count.model_calls, r.count.model_replays) == (1, 1)
    assert r.turns.user_counts == {"x": 5} and r.turns.model is None


async def test_each_boundary_leaves_a_mark_of_its_turn_and_a_turn_runs_stepping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[int, int | None, bool, Any]] = []

    def look(turn: int) -> None:  # inside the turn: the mark is of its boundary
        mark = ep.mark
        seen.append((turn, mark.turn, ep.stepping, orjson.loads(mark.states)))

    r = rig(Agent(turns=3, on_turn=look))
    r.parking.arm_marks()  # as a host of the default config does (boundary_marks="always")
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        await r.turns.play(ep)
        nursery.cancel_scope.cancel()
    # the calendar was at n == turn at each boundary; the turn had added 1 when it looked
    assert seen == [(t, t, True, [{}, {"n": t}]) for t in range(3)]
    assert not ep.stepping


async def test_an_environment_that_opts_out_keeps_no_marks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(Agent(turns=2))
    r.turns.environment = attrs.evolve(r.turns.environment, unaligned=False)
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        assert isinstance(await r.turns.play(ep), Completed)
        nursery.cancel_scope.cancel()
    assert ep.mark is None


@attrs.define
class ConcurrentAgent(Agent):
    """Turn 1 runs two calls in a trio nursery; ``errors`` are what they raise."""

    errors: tuple[type[Exception], ...] = (ModelUnavailable, ModelUnavailable)

    async def step(self, ctx: Any, state: Any) -> Done | None:
        if ctx.turn == 1:

            async def call(error: type[Exception]) -> None:
                with trio.CancelScope(shield=True):  # each raises, whichever raised first
                    await trio.sleep(0.5)
                raise error("server down")

            async with trio.open_nursery() as nursery:
                for error in self.errors:
                    nursery.start_soon(call, error)
        return await super().step(ctx, state)


@pytest.mark.parametrize(
    ("errors", "failure_class"),
    [
        ((ModelUnavailable, ModelUnavailable), "infra"),
        ((ModelUnavailable,), "infra"),
        ((ModelUnavailable, KeyError), "data"),
    ],
)
async def test_concurrent_calls_that_all_find_the_model_down_fail_as_infra(
    autojump_clock: trio.testing.MockClock,
    errors: tuple[type[Exception], ...],
    failure_class: str,
) -> None:
    """Parallel model calls in a nursery fail the step with an exception group: every error
    in it ``ModelUnavailable`` is the model's outage (infra, waited out by the trainer); any
    other error in it is the episode's own (data)."""
    r = rig(ConcurrentAgent(turns=5, errors=errors))
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        reply = await r.turns.play(started(r))
        nursery.cancel_scope.cancel()
    assert isinstance(reply, Failed) and reply.failure_class == failure_class, reply
    if failure_class == "infra":
        assert "turn 1: model unavailable: server down" in reply.message, reply.message


@attrs.define
class NurseryAgent(Agent):
    """Each turn fetches the calendar inside a trio nursery, as an agent running its tool calls
    at once does; ``on_turn`` runs before the fetch."""

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await trio.sleep(1.0)
        if self.on_turn is not None:
            self.on_turn(ctx.turn)

        async def tool() -> None:
            ctx.session("cal")["n"] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tool)
            nursery.start_soon(trio.sleep, 0.5)
        return Done(1.0) if ctx.turn + 1 >= self.turns else None


async def test_an_attempt_fenced_inside_a_nursery_is_fenced_not_a_data_failure(
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
) -> None:
    """The fence raised by ``ctx.session`` inside the agent's own nursery reaches the host
    wrapped in an exception group: it is still the fence (no reply, nothing journaled), not the
    episode's data failure."""
    r = rig(NurseryAgent(turns=10), journal=tmp_path / "j")

    def newer_attempt(turn: int) -> None:
        if turn == 1:
            r.slots.open("1-0", "r-a1", 1, {"cal": {"n": 100}})

    r.turns.environment.agent.on_turn = newer_attempt  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        r.parking.open(nursery.start_soon, lambda ep: None)
        ep = started(r)
        with pytest.raises(EpisodeFenced):
            await r.turns.play(ep)
        nursery.cancel_scope.cancel()
    slots = replay_journal((tmp_path / "j").read_bytes())
    assert slots["1-0"].rollout_id == "r-a1" and slots["1-0"].states == {"cal": {"n": 100}}
