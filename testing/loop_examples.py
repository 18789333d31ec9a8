"""Environments whose code calls one async library each, importable by path
(``gymckpt.testing.loop_examples:NAME``) so Ray actors and the conformance kit can load them.

Environment code may call trio, anyio or asyncio (``gym_adapter.host._user_calls``): each of these
agents waits in its ``step`` and through its model with one of them, and must play the same
episodes embedded and on Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import trio

from gymckpt.gym_adapter import Done, Environment, EpisodeContext, EpisodeInfo

__all__ = ["Sleeper", "anyio_sleeper", "asyncio_sleeper", "mixed_sleeper", "trio_sleeper"]

_SLEEPS: dict[str, Any] = {"trio": trio.sleep, "asyncio": asyncio.sleep, "anyio": anyio.sleep}


class Sleeper:
    """The agent: ``turns`` turns, each a short sleep with ``library`` (``mixed``: all three),
    then a model call; the payload is the model's answers."""

    name, kind = "agent", "simple_agent"

    def __init__(self, library: str, turns: int = 3, sleep_s: float = 0.001) -> None:
        self.library, self.turns, self.sleep_s = library, turns, sleep_s

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"answers": []}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return {"answers": list(data["answers"])}

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        for library in _SLEEPS if self.library == "mixed" else (self.library,):
            await _SLEEPS[library](self.sleep_s)
        state["answers"].append(await ctx.model(ctx.turn))
        if len(state["answers"]) >= self.turns:
            return Done(reward=float(sum(state["answers"])), payload=state["answers"])
        return None


def _model(library: str) -> Any:
    async def model(key: str, request: Any, info: EpisodeInfo) -> int:
        await _SLEEPS["asyncio" if library == "mixed" else library](0.0001)
        return int(request) + info.row

    return model


def _sleeper(library: str) -> Environment:
    return Environment(agent=Sleeper(library), model=_model(library))


def trio_sleeper() -> Environment:
    """Step and model wait with ``trio.sleep``."""
    return _sleeper("trio")


def asyncio_sleeper() -> Environment:
    """Step and model wait with ``asyncio.sleep``."""
    return _sleeper("asyncio")


def anyio_sleeper() -> Environment:
    """Step and model wait with ``anyio.sleep``."""
    return _sleeper("anyio")


def mixed_sleeper() -> Environment:
    """Each step waits with trio, then asyncio, then anyio."""
    return _sleeper("mixed")
