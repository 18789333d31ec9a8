"""The demo on an environment from another project (``gymckpt demo --env gymnasium:ID``,
``textarena:ID``; the families are in ``demo_envs``): its trajectories and its policy's latency.

The trainer process journals, with every trained step, a digest of each episode's trajectory
payload (observations, actions, rewards, termination). The parent then runs every trained
episode again with the plain library (Gymnasium, TextArena), uninterrupted, with the same seed
and policy (the family's ``reference``), and compares digests: ``trajectories_match`` is true
when every trained episode's trajectory is bit-identical to its uninterrupted run.

Every turn takes time where an agent's turn does: the policy answers after
``MODEL_LATENCY_S`` (an inference call, awaited), and the agent then waits ``PACE_S`` before it
steps the environment. So an unaligned checkpoint finds episodes in the middle of a turn, either
awaiting the policy (the call in progress, asked again after a restore) or past it (the call
completed, answered from the capture after a restore); the policy's answer depends on the
capture key alone, so either way the trajectory stays bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import orjson

from gymckpt.gym_adapter import EpisodeInfo
from gymckpt.runtime import CompletedGroup

__all__ = [
    "MAX_EPISODE_STEPS",
    "MODEL_LATENCY_S",
    "PACE_S",
    "journal_episodes",
    "slow_model",
    "trajectory_digest",
]

PACE_S = 0.001
"""Per-turn wait of the demo's agent after the policy answered, before it steps (a tool's
latency): a checkpoint finds episodes here with the turn's model call completed."""
MODEL_LATENCY_S = 0.001
"""How long the demo's policy takes to answer (an inference call's latency): a checkpoint finds
episodes here with the turn's model call in progress."""
MAX_EPISODE_STEPS = 200
"""The demo truncates every Gymnasium episode here (some ids have no time limit of their own)."""


def trajectory_digest(payload: Any) -> str:
    """sha256 of a trajectory's canonical JSON (sorted keys)."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def journal_episodes(batch: Sequence[CompletedGroup]) -> list[list[Any]]:
    """``[row, slot, digest]`` of every episode of a trained batch."""
    return [
        [g.row, slot, trajectory_digest(r.payload)]
        for g in batch
        for slot, r in enumerate(g.results)
    ]


Model = Callable[[str, Any, EpisodeInfo], Any]
"""``Environment.model``: ``model(capture_key, request, info)`` returns or awaits the answer."""


def slow_model(model: Model, latency_s: float) -> Callable[[str, Any, EpisodeInfo], Awaitable[Any]]:
    """``model`` answering after ``latency_s`` (awaited, like a call to an inference server).

    The answer is ``model``'s for the same capture key and request, so a call asked again after
    a restore answers as the first asking would have."""

    async def answer(key: str, request: Any, info: EpisodeInfo) -> Any:
        await anyio.sleep(latency_s)
        response = model(key, request, info)
        if inspect.isawaitable(response):
            response = await response
        return response

    return answer
