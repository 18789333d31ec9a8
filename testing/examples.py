"""Small environments on the episode API, importable by path (``gymckpt.testing.examples:NAME``)
so Ray actors and the conformance kit can load them: the README's guess-the-number game, an
agent that reads its task from the trainer's dataset, an agent that makes its model calls
at once (``parallel_calls``), and an agent that works in a sandbox tree with a captured step
(``sandbox_scribe``, which takes the directory its template and trees go under)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio

from gymckpt.gym_adapter import (
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    parse_call_id,
    split_capture_key,
)

__all__ = [
    "PARALLEL_REQUESTS",
    "SCRIBE_TURNS",
    "Game",
    "Notebook",
    "ParallelAgent",
    "Player",
    "Scribe",
    "TaskReader",
    "guess_the_number",
    "parallel_calls",
    "sandbox_scribe",
    "scribe_template",
    "slow_task_reader",
    "task_reader",
]


class Game:
    """The environment participant: one secret number per session."""

    name, kind = "game", "environment"

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {"secret": random.Random(f"{info.seed}:{info.session_key}").randint(1, 100)}

    def export(self, state: dict[str, int]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, int]:
        return dict(data)


class Player:
    """The agent: one guess per turn between the bounds it knows; the payload is its guesses."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"low": 1, "high": 100, "guesses": []}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        guess = await ctx.model([state["low"], state["high"]])
        secret = ctx.session("game")["secret"]
        state["guesses"].append(guess)
        if guess == secret:
            return Done(reward=1 / len(state["guesses"]), payload=state["guesses"])
        if guess < secret:
            state["low"] = guess + 1
        else:
            state["high"] = guess - 1
        return None


def _bisect(key: str, bounds: list[int], info: EpisodeInfo) -> int:
    return (bounds[0] + bounds[1]) // 2


def guess_the_number() -> Environment:
    """Guess-the-number with a bisecting policy."""
    return Environment(agent=Player(), participants=(Game(),), model=_bisect)


class TaskReader:
    """An agent that reads its task from the trainer's dataset (``ctx.info.task``) at every
    turn, ``turns`` turns of ``turn_s`` seconds each; the payload is the row, the attempt and
    the task each turn saw, so a test can check that every attempt, restored ones included,
    got its own row's task."""

    name, kind = "agent", "simple_agent"

    def __init__(self, turns: int = 3, turn_s: float = 0.0) -> None:
        self.turns, self.turn_s = turns, turn_s

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"seen": []}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        if self.turn_s:
            await anyio.sleep(self.turn_s)
        state["seen"].append(ctx.info.task)
        if len(state["seen"]) < self.turns:
            return None
        info = ctx.info
        return Done(
            reward=1.0, payload={"row": info.row, "attempt": info.attempt, "seen": state["seen"]}
        )


def task_reader(turns: int = 3, turn_s: float = 0.0) -> Environment:
    """``TaskReader``'s environment (no model)."""
    return Environment(agent=TaskReader(turns, turn_s))


def slow_task_reader() -> Environment:
    """``TaskReader`` whose one turn takes an hour: its rows stay running until cancelled (a
    ``/run`` stream that stays open, for tests of disconnects, limits and shutdown)."""
    return task_reader(turns=1, turn_s=3600.0)


PARALLEL_REQUESTS: Final = ("plan", "search", "plan")
"""What ``ParallelAgent`` asks each turn, at once: ``plan`` twice (identical requests)."""


class Notebook:
    """The environment participant of ``parallel_calls``: a slot's notes, one line a turn."""

    name, kind = "notebook", "environment"

    def open(self, info: EpisodeInfo) -> list[str]:
        return []

    def export(self, state: list[str]) -> Any:
        return state

    def restore(self, data: Any) -> list[str]:
        return list(data)


class ParallelAgent:
    """An agent that makes its model calls at once, as agents with parallel tool calls do:
    each turn asks ``PARALLEL_REQUESTS`` in an anyio task group (two of them identical), each
    after a short wait of its own (a tool's latency), then writes the answers, sorted (which
    task got which of two identical requests' answers is the scheduler's choice), to the
    notebook. Four turns."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"turns": 0}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        answers: list[Any] = []

        info = ctx.info

        async def ask(i: int, what: str) -> None:
            # a tool's latency, which is not the same on the next attempt
            await anyio.sleep(0.001 * ((i + info.row + ctx.turn + info.attempt) % 3))
            answers.append(await ctx.model({"turn": ctx.turn, "ask": what}))

        async with anyio.create_task_group() as tg:
            for i, what in enumerate(PARALLEL_REQUESTS):
                tg.start_soon(ask, i, what)
        await anyio.sleep(0.01 * (1 + info.row % 3))  # thinks it over: a cut may land here
        notes = ctx.session("notebook")
        notes.append(" ".join(sorted(answers)))
        state["turns"] += 1
        if state["turns"] < 4:
            return None
        return Done(reward=float(len(notes)), payload=notes)


async def _answer(key: str, request: Any, info: EpisodeInfo) -> str:
    """A deterministic model of ``parallel_calls``: answers the call (its request and its
    occurrence in the turn), the same for every attempt; it takes a moment that depends on
    the request, so calls complete in another order than they started."""
    call = parse_call_id(split_capture_key(key)[1])
    await anyio.sleep(0.002 * (len(request["ask"]) % 3 + call.occurrence))
    return f"{request['ask']}#{call.occurrence}@{info.session_key}/t{call.turn}"


def parallel_calls() -> Environment:
    """``ParallelAgent`` with its notebook and model: concurrent model calls across a cut."""
    return Environment(agent=ParallelAgent(), participants=(Notebook(),), model=_answer)


SCRIBE_TURNS: Final = 3


def _lookup(args: dict[str, int]) -> str:
    """``Scribe``'s side effect (a search, a remote tool): a deterministic answer."""
    return "r{row}s{slot}t{turn}".format(**args)


class Scribe:
    """An agent that works in a sandbox (participant ``sandbox``): each turn it asks a captured
    step (``lookup``, or the ``lookup`` given), asks the model, appends a line to ``notes.txt``
    and (``commands``) runs a real command that appends to ``ran.txt``, then thinks a moment (a
    cut may land there). After ``SCRIBE_TURNS`` turns its payload is both files and the
    tree's listing: a line there twice, or missing, is a turn replayed wrong."""

    name, kind = "agent", "simple_agent"

    def __init__(
        self, commands: bool = True, lookup: Callable[[dict[str, int]], Any] = _lookup
    ) -> None:
        self.commands, self.lookup = commands, lookup

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        box, info, turn = ctx.session("sandbox"), ctx.info, ctx.turn
        if turn == SCRIBE_TURNS:
            payload = {
                "notes": box.read("notes.txt").decode(),
                "ran": box.read("ran.txt").decode(),
                "files": box.list(),
            }
            return Done(reward=1.0, payload=payload)
        args = {"row": info.row, "slot": info.slot, "turn": turn}
        hit = await ctx.captured_step("lookup", args, self.lookup)
        word = await ctx.model({"turn": turn})
        box.append("notes.txt", f"turn {turn} {hit} {word}\n")
        if self.commands:
            done = await box.run(["sh", "-c", "echo ran >> ran.txt"])
            if done.returncode != 0:
                raise RuntimeError(f"the command failed: {done.as_plain()}")
        await anyio.sleep(0.01 * (1 + info.row % 3))
        return None


def scribe_template(root: Path) -> Path:
    """``Scribe``'s template under ``root``: its two files, an executable and a link to it."""
    template = root / "template"
    (template / "bin").mkdir(parents=True, exist_ok=True)
    (template / "notes.txt").write_text("")
    (template / "ran.txt").write_text("")
    (template / "bin" / "tool.sh").write_text("echo tool\n")
    os.chmod(template / "bin" / "tool.sh", 0o755)
    if not (template / "tool").is_symlink():
        os.symlink("bin/tool.sh", template / "tool")
    return template


def sandbox_scribe(root: Path, *, commands: bool = True, sandbox: Any = None) -> Environment:
    """``Scribe`` in a ``Sandbox`` whose template and trees go under ``root`` (or in
    ``sandbox``, a participant named ``sandbox``), with a model that answers ``ok``."""
    from gymckpt.gym_adapter.environments.sandbox import Sandbox

    if sandbox is None:
        sandbox = Sandbox(scribe_template(root), root / "work")
    return Environment(
        agent=Scribe(commands), participants=(sandbox,), model=lambda key, request, info: "ok"
    )
