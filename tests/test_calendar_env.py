"""Tests of ``gym_adapter.environments.calendar``: the workplace on ``EmbeddedGym.host`` (as
on any deployment's own constructor), ``calendar_sessions_of``, ``plan_episode`` and
``sentinel`` (an episode's plan is a function of (seed, row, slot) only), and what
``CalendarConfig`` and the workplace builders refuse.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    EmbeddedGym,
    EpisodeInfo,
    ReplyStream,
    RunReply,
    RunRow,
    load_environment,
)
from gymckpt.gym_adapter.environments.calendar import (
    CALENDAR,
    CONFIG_ENV,
    CalendarAgent,
    CalendarConfig,
    CalendarEvent,
    CalendarServer,
    CalendarState,
    calendar_environment,
    calendar_from_environ,
    calendar_from_environ_path,
    calendar_sessions_of,
    plan_episode,
    sentinel,
    session_key,
)

FAST = CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.02), mutation_p=0.5)


async def drain(stream: ReplyStream) -> list[RunReply]:
    return [reply async for batch in stream for reply in batch]


def planned_sentinels(seed: int, row: int, slot: int, config: CalendarConfig) -> tuple[str, ...]:
    plan = plan_episode(seed, row, slot, config)
    return tuple(sentinel(row, slot, t) for t in range(plan.turns) if plan.mutates[t])


# -- plan_episode and sentinel -----------------------------------------------------------------


def test_a_plan_is_a_function_of_seed_row_and_slot_only() -> None:
    forward = [plan_episode(3, row, slot, FAST) for row in range(20) for slot in range(2)]
    backward = [plan_episode(3, row, slot, FAST) for row in reversed(range(20)) for slot in (1, 0)]
    assert forward == list(reversed(backward))  # the order of the calls does not matter
    draws = [(p.durations, tuple(pl.split(":")[1] for pl in p.payloads)) for p in forward]
    assert len(set(draws)) == len(forward)  # each (row, slot) draws its own numbers
    other_seed = [plan_episode(4, row, slot, FAST) for row in range(20) for slot in range(2)]
    assert all(a != b for a, b in zip(forward, other_seed, strict=True))


def test_a_plan_is_the_same_in_another_process() -> None:
    """No hash randomisation or process state enters a plan: a restored run in a new process
    checks the same sentinels."""
    code = (
        "from gymckpt.gym_adapter.environments.calendar import CalendarConfig, plan_episode\n"
        "print(repr(plan_episode(9, 4, 1, CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.02)))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    here = plan_episode(9, 4, 1, CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.02)))
    assert out == repr(here)


def test_a_plan_keeps_within_its_config() -> None:
    cfg = CalendarConfig(turns=(3, 6), turn_s=(0.5, 0.75), mutation_p=0.5)
    plans = [plan_episode(1, row, 0, cfg) for row in range(200)]
    assert {p.turns for p in plans} == {3, 4, 5, 6}
    for row, p in enumerate(plans):
        assert len(p.durations) == len(p.mutates) == len(p.payloads) == p.turns
        assert all(0.5 <= d <= 0.75 for d in p.durations)
        assert all(pl.startswith(f"{row}-0/t{t}:") for t, pl in enumerate(p.payloads))
        assert 0.0 <= p.reward < 1.0
    assert 0.3 < sum(m for p in plans for m in p.mutates) / sum(p.turns for p in plans) < 0.7
    never = CalendarConfig(turns=(2, 2), mutation_p=0.0)
    always = CalendarConfig(turns=(2, 2), mutation_p=1.0)
    assert all(not any(plan_episode(1, r, 0, never).mutates) for r in range(20))
    assert all(all(plan_episode(1, r, 0, always).mutates) for r in range(20))
    fixed = CalendarConfig(turns=(1, 1), turn_s=(0.25, 0.25))
    assert plan_episode(1, 0, 0, fixed).durations == (0.25,)


def test_sentinels_and_session_keys_name_their_turn() -> None:
    assert sentinel(12, 3, 4) == "sentinel:12-3:t4"
    assert session_key(12, 3) == "12-3"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"turns": (0, 2)}, "turns must be at least 1"),
        ({"turns": (3, 2)}, r"turns must be a \(low, high\) pair"),
        ({"turns": (1, True)}, r"turns must be a \(low, high\) pair"),
        ({"turns": [1, 2]}, r"turns must be a \(low, high\) pair"),
        ({"turn_s": (-0.1, 0.2)}, r"turn_s must be a \(low, high\) pair"),
        ({"turn_s": (1, 2)}, r"turn_s must be a \(low, high\) pair"),
        ({"mutation_p": 1.5}, "mutation_p"),
        ({"mutation_p": -0.1}, "mutation_p"),
        ({"lease_s": 0.0}, "lease_s"),
        ({"max_batch": 0}, "max_batch"),
    ],
)
def test_sim_config_refuses_bad_knobs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CalendarConfig(**kwargs)


def test_the_calendar_server_exports_and_restores_its_events() -> None:
    state = CalendarState([CalendarEvent(0, "m 0", "s0"), CalendarEvent(2, "m 2", "s2")])
    server = CalendarServer()
    assert (server.name, server.kind, server.retained) == (CALENDAR, "environment", True)
    again = server.restore(server.export(state))
    assert again.events == state.events
    assert server.restore(server.export(CalendarState())).events == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: calendar_environment("robot"), "agent kind must be one of simple_agent"),
        (lambda: calendar_from_environ_path("robot"), "legacy_agent, got 'robot'"),
    ],
)
def test_the_workplace_builders_refuse_bad_kinds_and_counts(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_the_config_crosses_to_a_server_process_in_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HttpGym.spawn(calendar_from_environ_path(kind), environ=cfg.environ())``: the server
    loads the workplace with that agent kind and an equal config."""
    ((name, value),) = FAST.environ().items()
    assert name == CONFIG_ENV
    for kind in ("simple_agent", "legacy_agent"):
        monkeypatch.setenv(name, value)
        env = load_environment(calendar_from_environ_path(kind))
        assert env.agent == calendar_environment(kind, FAST).agent
        monkeypatch.setenv(name, '{"turns": 3}')
        with pytest.raises(ValueError, match="is not a CalendarConfig"):
            calendar_from_environ(kind)


# -- the workplace on a deployment and calendar_sessions_of ----------------------------------


async def test_the_workplace_serves_with_its_agent_kinds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kinds = ["legacy_agent", "simple_agent"]
    async with EmbeddedGym.host(
        [calendar_environment(kind, FAST) for kind in kinds],
        instances=2,
        seed=5,
        config=FAST.host_config(),
    ) as gym:
        assert gym.instances == ("gym-0", "gym-1")
        topo = await gym.topology()
        assert [i.participants for i in topo.instances] == [
            (("agent", kind), ("calendar", "environment"), ("model_proxy", "model_proxy"))
            for kind in kinds
        ]
        host = gym.sim("gym-1")
        assert host.seed == 5 and host.config == FAST.host_config()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instances": 0}, "instances must be >= 1"),
        ({"instances": 2, "environment": [calendar_environment()]}, "got 1 environments for 2"),
        ({"faults": ["commit:vanish"]}, "vanish"),
    ],
)
async def test_the_workplace_on_a_deployment_refuses_bad_input_before_serving(
    kwargs: dict, message: str
) -> None:
    kwargs.setdefault("environment", calendar_environment())
    with pytest.raises(ValueError, match=message):
        async with EmbeddedGym.host(**kwargs):
            pytest.fail("served bad input")


async def test_calendar_sessions_hold_exactly_the_planned_sentinels(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    seed = 7
    async with EmbeddedGym.host(
        calendar_environment(config=FAST),
        instances=2,
        seed=seed,
        work_dir=tmp_path,
        config=FAST.host_config(),
    ) as gym:
        assert await calendar_sessions_of(gym, "gym-0") == {}
        rows = [RunRow(f"{r}-{s}", r, s, 0) for r in range(6) for s in range(2)]
        replies = await drain(await gym.run("gym-0", rows))
        assert len(replies) == len(rows)
        sessions = await calendar_sessions_of(gym, "gym-0")
        assert set(sessions) == {session_key(r.row, r.slot) for r in rows}
        for row in rows:
            got = sessions[session_key(row.row, row.slot)]
            assert (got.key, got.rollout_id, got.attempt) == (
                f"{row.row}-{row.slot}",
                row.rollout_id,
                0,
            )
            assert got.sentinels == planned_sentinels(seed, row.row, row.slot, FAST)
            assert [e.turn for e in got.events] == [
                int(s.rsplit(":t", 1)[1]) for s in got.sentinels
            ]
        assert any(s.sentinels for s in sessions.values())
        assert await calendar_sessions_of(gym, "gym-1") == {}  # per instance
        rewards = {r.rollout_id: r.reward for r in replies}  # type: ignore[union-attr]
        assert rewards["3-1"] == plan_episode(seed, 3, 1, FAST).reward


async def test_the_same_seed_plays_the_same_calendar(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def play(seed: int) -> dict[str, tuple[str, ...]]:
        async with EmbeddedGym.host(
            calendar_environment(config=FAST), seed=seed, config=FAST.host_config()
        ) as gym:
            await drain(await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(8)]))
            return {k: s.sentinels for k, s in (await calendar_sessions_of(gym, "gym-0")).items()}

    first, again, other = await play(1), await play(1), await play(2)
    assert first == again
    assert first != other


# -- the turn's sleep ----------------------------------------------------------------------------


async def test_a_turn_under_trio_sleeps_by_trio_not_through_anyio(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every deployment hosts episodes under trio: a turn's work sleeps by ``trio.sleep``
    directly (anyio's backend lookup is not paid per turn), for the plan's duration."""
    through_anyio: list[float] = []
    slept: list[float] = []
    trio_sleep = trio.sleep

    async def anyio_sleep(seconds: float) -> None:
        through_anyio.append(seconds)
        await trio_sleep(seconds)

    async def counted(seconds: float) -> None:
        slept.append(seconds)
        await trio_sleep(seconds)

    monkeypatch.setattr(anyio, "sleep", anyio_sleep)
    monkeypatch.setattr(trio, "sleep", counted)
    cfg = CalendarConfig(turns=(1, 1), turn_s=(0.01, 0.02), mutation_p=0.5)
    async with EmbeddedGym.host(calendar_environment(config=cfg), seed=3) as gym:
        replies = await drain(await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(4)]))
    assert len(replies) == 4
    assert through_anyio == []
    turns = sorted(s for s in slept if s != float("inf"))  # the host's own waits are endless
    assert turns == sorted(plan_episode(3, r, 0, cfg).durations[0] for r in range(4))


class _Ctx:
    """The part of an ``EpisodeContext`` a calendar turn reaches."""

    def __init__(self) -> None:
        self.info = EpisodeInfo("0-0", 0, 0, 0, 3, "gym-0")
        self.turn = 0
        self.state = CalendarState()

    async def model(self, request: object) -> object:
        return request

    def session(self, name: str) -> CalendarState:
        return self.state

    def count(self, name: str, n: int = 1) -> int:
        return 1


def test_a_turn_under_asyncio_sleeps_through_anyio() -> None:
    """Under asyncio (a host served by anyio's asyncio backend) the same turn sleeps by anyio:
    trio's sleep would raise there."""
    cfg = CalendarConfig(turns=(1, 1), turn_s=(0.001, 0.001), mutation_p=1.0)
    agent = CalendarAgent(cfg)
    ctx = _Ctx()

    async def turn() -> object:
        return await agent.step(ctx, agent.open(ctx.info))  # type: ignore[arg-type]

    assert anyio.run(turn, backend="asyncio") is None
    assert [e.turn for e in ctx.state.events] == [0]
