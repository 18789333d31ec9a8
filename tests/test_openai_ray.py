"""The model participant on a Ray actor: the actor builds ``tool_agent_environment`` by import
path and its episodes call the real test server process from the actor's trio guest run."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from gymckpt.gym_adapter import Completed, EnvironmentRef, RunRow
from gymckpt.testing.openai_examples import first_request
from gymckpt.testing.openai_server import chat_completion, open_openai_test_server

pytestmark = pytest.mark.ray
RayGym = pytest.importorskip("gymckpt.gym_adapter.transports.ray._gym").RayGym


async def test_episodes_on_a_ray_actor_call_the_server(tmp_path: Path) -> None:
    async with open_openai_test_server(api_key="k") as server:
        ref = EnvironmentRef(
            "gymckpt.testing.openai_examples:tool_agent_environment",
            {"base_url": server.base_url, "model": server.model, "api_key": "k"},
        )
        async with RayGym.host(ref, work_dir=tmp_path) as gym:
            stream = await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(3)])
            got = {}
            async with aclosing(stream):
                async for batch in stream:
                    got.update({r.rollout_id: r for r in batch})
        stats = server.stats()
    assert sorted(got) == ["0-0", "1-0", "2-0"]
    for rid, reply in got.items():
        assert isinstance(reply, Completed), reply
        request = {**first_request(int(rid.split("-")[0])), "model": server.model}
        assert reply.payload[0] == chat_completion(request, server.model)
    assert stats["requests"] == 9 and set(stats["by_capture_key"].values()) == {1}, stats
