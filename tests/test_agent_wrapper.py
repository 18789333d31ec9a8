"""``AgentWrapper``: an agent wrapping another keeps its name, kind and session state, and a
subclass acts around the inner agent's turn (as the hostile kit and the simulation's real-usage
agent do, through the public API only)."""

from __future__ import annotations

from typing import Any

import attrs

from gymckpt.gym_adapter import AgentWrapper, Done, EpisodeContext, EpisodeInfo


@attrs.define
class _Counter:
    name: str = "counter"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        return {"exported": state["n"]}

    def restore(self, data: Any) -> Any:
        return {"n": data["exported"]}

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        state["n"] += 1
        return None


@attrs.frozen
class _Logged(AgentWrapper):
    log: list[str] = attrs.field(kw_only=True)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        self.log.append("before")
        done = await self.inner.step(ctx, state)
        self.log.append("after")
        return done


async def test_a_wrapper_is_its_inner_agent_but_for_its_step() -> None:
    inner, log = _Counter(), []
    agent = _Logged(inner, log=log)
    assert (agent.name, agent.kind) == ("counter", "simple_agent")
    state = agent.open(None)  # type: ignore[arg-type]
    assert state == {"n": 0}
    await agent.step(None, state)  # type: ignore[arg-type]
    assert state == {"n": 1} and log == ["before", "after"]
    assert agent.export(state) == {"exported": 1}
    assert agent.restore({"exported": 7}) == {"n": 7}
    assert await AgentWrapper(inner).step(None, state) is None  # type: ignore[arg-type]
    assert state == {"n": 2}  # the default step is the inner agent's
