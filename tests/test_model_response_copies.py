"""A model response the episode changes in place never changes its capture.

``ctx.model`` stages a response and hands the episode its own copy (a restored episode gets a
copy of the staged one too): an agent that appends to the message it got, as chat agents do
with a history, must not change what the commit writes, nor what a replay answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from gymckpt.gym_adapter import Done, Environment, GymHost, RunRow
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.runtime import CheckpointMode
from gymckpt.runtime._shared import StagedRecords, read_snapshot_records

pytestmark = pytest.mark.trio


class Agent:
    """One model call a turn; the response is changed in place after it arrives."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"seen": []}

    def export(self, state: Any) -> Any:
        return {"seen": list(state["seen"])}

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Done | None:
        message = await ctx.model({"turn": ctx.turn})
        state["seen"].append(list(message["tokens"]))
        message["tokens"].append("changed by the episode")
        await trio.sleep(1.0)
        return Done(1.0) if ctx.turn >= 5 else None


def model(key: str, request: Any, info: EpisodeInfo) -> Any:
    return {"tokens": [key]}


@pytest.mark.parametrize("mode", list(CheckpointMode))
async def test_the_committed_response_is_the_one_the_model_gave(
    tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    env = Environment(agent=Agent(), model=model)
    async with GymHost("gym-0", env) as host:
        stream = await host.run([RunRow("1-0", 1, 0, 0)])
        await trio.sleep(2.5)
        await host.prepare("c1", trio.current_time() + 30.0, mode)
        reply = await host.commit("c1", str(root), trio.current_time() + 30.0)
        await stream.aclose()
    proxy = next(p for p in reply.participants if p.server_name == "model_proxy")
    staged = read_snapshot_records(root, proxy.state_dir, StagedRecords).staged
    calls = [(c.key, c.response) for e in staged for c in e.calls]
    assert calls and all(response == {"tokens": [key]} for key, response in calls), calls
