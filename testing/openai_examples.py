"""A tool-using chat agent on a model behind an OpenAI-compatible server, as an environment a
deployment can name by import path (``EnvironmentRef("gymckpt.testing.openai_examples:
tool_agent_environment", {"base_url": ..., "model": ...})``): a Ray actor builds it itself.

Turn 0 asks the model with one tool (``move``); turn 1 sends the tool's result back and asks for
the final answer. The trajectory payload is every response the episode got, whole (so a test
compares it with what the server answers), and ``first_request(row)`` is turn 0's request.
"""

from __future__ import annotations

from typing import Any, Final

from gymckpt.gym_adapter import Done, Environment, EpisodeContext, EpisodeInfo
from gymckpt.gym_adapter.environments.openai_model import openai_model

__all__ = ["TOOLS", "ToolAgent", "first_request", "tool_agent_environment"]

TOOLS: Final = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {
                "type": "object",
                "properties": {"dir": {"type": "string", "enum": ["left", "right"]}},
            },
        },
    }
]


def first_request(row: int) -> dict[str, Any]:
    """Turn 0's chat-completions request of row ``row`` (asks for logprobs and token ids)."""
    return {
        "messages": [{"role": "user", "content": f"row {row}: move"}],
        "tools": TOOLS,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
    }


class ToolAgent:
    """The agent (see the module docstring). ``asked`` and ``gate`` (events, optional): after
    turn 1's calls it sets ``asked`` and waits for ``gate``, so a checkpoint can cut the turn."""

    name, kind = "agent", "simple_agent"

    def __init__(self, asked: Any = None, gate: Any = None) -> None:
        self.asked, self.gate = asked, gate

    def open(self, info: EpisodeInfo) -> Any:
        return {"seen": []}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        request = first_request(ctx.info.row)
        first = await ctx.model(request)
        state["seen"].append(first)
        if ctx.turn == 0:
            return None
        call = first["choices"][0]["message"]["tool_calls"][0]
        messages = [*request["messages"], first["choices"][0]["message"]]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
        final = await ctx.model({**request, "messages": messages})
        state["seen"].append(final)
        if self.asked is not None and self.gate is not None:
            self.asked.set()
            await self.gate.wait()
        return Done(1.0, payload=state["seen"])


def tool_agent_environment(*, base_url: str, model: str, api_key: str | None = None) -> Environment:
    """``ToolAgent`` on ``openai_model(base_url=..., model=..., api_key=...)``."""
    return Environment(
        agent=ToolAgent(), model=openai_model(base_url=base_url, model=model, api_key=api_key)
    )
