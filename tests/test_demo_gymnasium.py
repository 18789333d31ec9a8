"""The Gymnasium demo's policy (``demo_gymnasium.slow_model``): it answers after an awaited
latency, so an unaligned cut can find an episode with its turn's call in progress, and its
answer is the wrapped policy's for the capture key, so a call asked again after a restore
answers as the first asking would have."""

from __future__ import annotations

from typing import Any

import trio

from gymckpt.app.demo.gymnasium import MODEL_LATENCY_S, slow_model
from gymckpt.gym_adapter import EpisodeInfo

INFO = EpisodeInfo("3-1", 3, 1, 0, 7, "")


def policy(key: str, request: Any, info: EpisodeInfo) -> Any:
    return [key, request, info.seed]


async def test_the_policy_answers_after_its_latency_with_the_policys_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert MODEL_LATENCY_S > 0
    slow = slow_model(policy, 0.25)
    t0 = trio.current_time()
    assert await slow("3-1:t0-c0", [0.5], INFO) == ["3-1:t0-c0", [0.5], 7]
    assert trio.current_time() - t0 == 0.25  # suspended at an await for that long
    again = await slow("3-1:t0-c0", [0.5], INFO)  # asked again after a restore
    assert again == policy("3-1:t0-c0", [0.5], INFO)


async def test_an_awaitable_policy_is_awaited_after_the_latency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def answer(key: str, request: Any, info: EpisodeInfo) -> Any:
        await trio.sleep(0.5)
        return key

    t0 = trio.current_time()
    assert await slow_model(answer, 0.25)("k", None, INFO) == "k"
    assert trio.current_time() - t0 == 0.75
