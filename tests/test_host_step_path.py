"""The hosted step path's cost rules (issue 34): what a Gym host does per step and per episode
that plain code would not, pinned by counting rather than timing.

- Every episode runs in the host's episodes nursery (trio's own tasks and cancel scopes), also
  those of a ``run`` asked for right after entry, before that nursery's task ran: they wait for
  it, never start through anyio's task group (a task handle, a cancel scope and an event more
  per episode, a frame more per step), which trio's scheduler let happen half the time.
- A step boundary is a scheduling point taken with trio's own checkpoint (anyio's looks its
  backend up at every call), unless the task passed the scheduler since its last boundary (it
  just started, or its turn waited): then it only raises a cancel that came meanwhile. An
  episode of N turns that never waits takes N scheduler passes, not N + 1; one whose turns
  each wait once, N + 1, not 2N + 1; a stopped episode still stops at its next boundary.
- A model request is serialised once (``checked_json``, which names what is wrong, runs only
  when that ``orjson.dumps`` cannot tell: it failed or wrote a ``null``); a non-finite request
  is still refused. A payload of None, True or False is not serialised to be measured.
- The Gymnasium environment's policy key is parsed by hand (the same key as the regex's) and its
  payload is the trajectory's plain data (what the converter made of it).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
import trio
import trio.testing
from plain_state import CountState, PlainState

from gymckpt.gym_adapter import (
    Completed,
    Done,
    Environment,
    Failed,
    GymHost,
    GymInstanceDead,
    RunRow,
)
from gymckpt.gym_adapter.host import _episodes
from gymckpt.gym_adapter.host._episode import EpisodeInfo, parse_call_id, split_capture_key


@attrs.define
class Agent(CountState):
    """``turns`` turns; each records the name of the task owning the nursery its task runs in."""

    turns: int = 2
    waits: bool = False
    """Each turn waits once (a checkpoint)."""
    owners: list[str] = attrs.field(factory=list)
    name: str = "agent"
    kind: str = "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        if self.waits:
            await trio.lowlevel.checkpoint()
        nursery = trio.lowlevel.current_task().parent_nursery
        assert nursery is not None and nursery.parent_task is not None
        self.owners.append(nursery.parent_task.name)
        state["n"] += 1
        return Done(1.0, payload=state["n"]) if state["n"] == self.turns else None


async def test_a_run_asked_right_after_entry_runs_every_episode_in_the_episodes_nursery(
    tmp_path: Path,
) -> None:
    agent = Agent()
    for n in range(24):  # main: each entry had a one-in-two chance of starting them elsewhere
        env = Environment(agent=agent)
        async with GymHost(f"g{n}", env, 0, tmp_path / str(n)) as host:
            replies = []
            async for batch in await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(4)]):
                replies.extend(batch)
        assert all(isinstance(r, Completed) for r in replies), replies
    assert len(agent.owners) == 24 * 4 * 2
    assert {owner.rsplit(".", 1)[-1] for owner in agent.owners} == {"_trio_episodes"}, set(
        agent.owners
    )


class TaskSteps(trio.abc.Instrument):
    """Counts the scheduler's steps of each task whose name ends with ``_episode_main``."""

    def __init__(self) -> None:
        self.steps: Counter[int] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("_episode_main"):
            self.steps[id(task)] += 1


async def _run(host: GymHost, rows: int, first: int = 0) -> list[Any]:
    replies: list[Any] = []
    ids = range(first, first + rows)
    async for batch in await host.run([RunRow(f"{r}-0", r, 0, 0) for r in ids]):
        replies.extend(batch)
    return replies


async def test_a_turn_passes_the_scheduler_once_at_least_and_once_only(
    tmp_path: Path,
) -> None:
    steps = TaskSteps()
    for turns, waits in ((1, False), (3, False), (1, True), (3, True)):
        steps.steps.clear()
        env = Environment(agent=Agent(turns=turns, waits=waits))
        name = f"g{turns}{waits}"
        async with GymHost(name, env, 0, tmp_path / name) as host:
            await _run(host, 1)  # the host's first episode waits for the asyncio loop
            trio.lowlevel.add_instrument(steps)
            try:
                replies = await _run(host, 4, first=1)
            finally:
                trio.lowlevel.remove_instrument(steps)
        assert all(isinstance(r, Completed) for r in replies), replies
        # a turn that waits passes the scheduler there, and not again at its boundary; main:
        # one pass more per boundary (2 * turns + 1 for a waiting one, turns + 1 otherwise)
        passes = turns + 1 if waits else turns
        assert sorted(steps.steps.values()) == [passes] * 4, (turns, waits, steps.steps)


async def test_a_step_boundary_takes_trios_checkpoint_not_anyios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Counter[str]()
    real = anyio.lowlevel.checkpoint

    async def counted() -> None:
        calls["anyio"] += 1
        await real()

    monkeypatch.setattr(anyio.lowlevel, "checkpoint", counted)
    async with GymHost("g", Environment(agent=Agent(turns=5)), 0, tmp_path) as host:
        await trio.lowlevel.checkpoint()
        before = calls["anyio"]
        replies = await _run(host, 3)
        during = calls["anyio"] - before
    assert all(isinstance(r, Completed) for r in replies), replies
    # the run call's own, none per step (main: one per boundary, 15 more)
    assert during <= 1, f"{during} anyio checkpoints for 3 episodes of 5 turns"


@attrs.define
class Asker(PlainState):
    """One turn: asks the model ``request``, ends with ``payload``."""

    request: Any
    payload: Any = None
    name: str = "agent"
    kind: str = "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await ctx.model(self.request)
        return Done(1.0, payload=self.payload)


async def test_a_request_and_a_constant_payload_are_serialised_once_and_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    real = _episodes.checked_json

    def counted(value: Any, where: str) -> bytes:
        checked.append(where)
        return real(value, where)

    monkeypatch.setattr(_episodes, "checked_json", counted)
    asked: list[Any] = []

    def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        asked.append(request)
        return 0

    for n, payload in enumerate((None, True, False)):
        env = Environment(agent=Asker({"b": [1.5, 2], "a": "x"}, payload), model=model)
        async with GymHost(f"g{n}", env, 0, tmp_path / str(n)) as host:
            (reply,) = await _run(host, 1)
        assert isinstance(reply, Completed) and reply.payload is payload, reply
    # main: a request checked, then serialised again sorted; every payload checked
    assert checked == [], checked
    assert len(asked) == 3
    # what cannot be told from one dumps is still checked, and refused naming why
    for n, request in enumerate(({"t": float("nan")}, {"t": {1, 2}}, [None, float("inf")])):
        env = Environment(agent=Asker(request), model=model)
        async with GymHost(f"bad{n}", env, 0, tmp_path / f"bad{n}") as host:
            (reply,) = await _run(host, 1)
        assert isinstance(reply, Failed) and "model request of turn 0 is refused" in reply.message
    assert len(asked) == 3 and len(checked) == 3
    # a request holding a null is checked and asked
    env = Environment(agent=Asker({"t": None}), model=model)
    async with GymHost("null", env, 0, tmp_path / "null") as host:
        (reply,) = await _run(host, 1)
    assert isinstance(reply, Completed) and asked[-1] == {"t": None}


def test_the_gymnasium_policy_key_is_the_call_ids_and_a_bad_key_is_refused() -> None:
    pytest.importorskip("gymnasium")
    from gymckpt.gym_adapter.environments.gymnasium import _policy_key

    info = EpisodeInfo("3-0-a2", 3, 0, 2, 100, "g")
    for key in ("3-0-a2:t12-0123456789abcdef-c0", "3-0-a2:t0-0123456789abcdef-c13"):
        call = parse_call_id(split_capture_key(key)[1])
        assert _policy_key(key, info) == f"3-0/t{call.turn}/c{call.occurrence}"
    for bad in (
        "3-0:t1-c0",
        "3-0/t1/c0",
        "3-0:x1-0123456789abcdef-c0",
        "3-0:t1-0123456789abcdef-cx",
    ):
        with pytest.raises(ValueError, match="is not"):
            _policy_key(bad, info)


def test_the_gymnasium_payload_is_what_the_converter_makes_of_the_trajectory() -> None:
    pytest.importorskip("gymnasium")
    from gymckpt.gym_adapter.environments.gymnasium import Trajectory, trajectory_data
    from gymckpt.runtime._shared import converter

    t = Trajectory([[0.5, 1.0], [1.5, 2.0]], [1], [1.0], terminated=True)
    assert trajectory_data(t) == converter.unstructure(t)
    assert list(trajectory_data(t)) == list(converter.unstructure(t))


@attrs.define
class Gated(PlainState):
    """Turn 0 waits for ``gate``; every turn records its number in ``ran``."""

    gate: trio.Event = attrs.field(factory=trio.Event)
    waiting: trio.Event = attrs.field(factory=trio.Event)
    ran: list[int] = attrs.field(factory=list)
    name: str = "agent"
    kind: str = "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        if ctx.turn == 0:
            self.waiting.set()
            await self.gate.wait()
        self.ran.append(ctx.turn)
        return Done(1.0) if ctx.turn == 3 else None


async def test_an_episode_stopped_while_its_waiting_turn_was_let_go_stops_at_its_boundary(
    tmp_path: Path,
) -> None:
    agent = Gated()
    async with GymHost("g", Environment(agent=agent), 0, tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await agent.waiting.wait()
        agent.gate.set()  # the episode's task is runnable: a cancel now waits for a checkpoint
        host.kill()
        with pytest.raises(GymInstanceDead):
            async for _ in stream:
                pass
        await trio.testing.wait_all_tasks_blocked()
    # turn 0 ended (it was let go before the stop); its boundary raised the stop
    assert agent.ran == [0]


@attrs.define
class Recorder(PlainState):
    """``turns`` turns that never wait; each records (row, turn) in ``order``."""

    turns: int = 3
    order: list[tuple[int, int]] = attrs.field(factory=list)
    name: str = "agent"
    kind: str = "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        self.order.append((ctx.info.row, ctx.turn))
        return Done(1.0) if ctx.turn == self.turns - 1 else None


def test_under_asyncio_a_turn_that_never_waits_still_lets_the_others_run(tmp_path: Path) -> None:
    agent = Recorder()

    async def main() -> None:
        async with GymHost("g", Environment(agent=agent), 0, tmp_path) as host:
            replies = await _run(host, 2)
        assert all(isinstance(r, Completed) for r in replies), replies

    anyio.run(main, backend="asyncio")
    # each boundary after a turn is a scheduling point: the two episodes take turns
    firsts = [row for row, _ in agent.order]
    assert sorted(agent.order) == [(r, t) for r in (0, 1) for t in range(3)]
    assert firsts != sorted(firsts), agent.order


async def test_an_aligned_run_with_marks_on_demand_calls_no_mark_function_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gymckpt.gym_adapter import HostConfig
    from gymckpt.gym_adapter.host import _turns

    marks = Counter[str]()
    real = _turns.mark_boundary

    def counted(*args: Any) -> Any:
        marks["marks"] += 1
        return real(*args)

    monkeypatch.setattr(_turns, "mark_boundary", counted)
    for config in ("on_demand", "always"):
        marks.clear()
        env = Environment(agent=Agent(turns=5))
        cfg = HostConfig(boundary_marks=config)
        async with GymHost(config, env, 0, tmp_path / config, config=cfg) as host:
            replies = await _run(host, 4)
        assert all(isinstance(r, Completed) for r in replies), replies
        # on demand, nothing armed them: no mark at all; always: one at each of the 20 turns
        assert marks["marks"] == (0 if config == "on_demand" else 20), (config, marks)
