"""The demo on a Gymnasium environment (``gymckpt demo --env gymnasium:ID``).

The trainer process journals, with every trained step, a digest of each episode's trajectory
payload (observations, actions, rewards, termination). The parent then runs every trained
episode again with plain Gymnasium, uninterrupted, with the same seed and policy
(``reference_trajectory``), and compares digests: ``trajectories_match`` is true when every
trained episode's trajectory is bit-identical to its uninterrupted run.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
import orjson

from gymckpt.gym_adapter import EmbeddedGym, EpisodeInfo, GymBackend, HostConfig
from gymckpt.runtime import CompletedGroup

__all__ = [
    "GYMNASIUM_PREFIX",
    "environment_id",
    "journal_episodes",
    "open_gymnasium_gym",
    "trajectory_digest",
    "trajectory_verdict",
]

GYMNASIUM_PREFIX = "gymnasium:"
PACE_S = 0.001
"""Per-turn wait of the demo's agent after the policy answered, before it steps (a tool's
latency): a checkpoint finds episodes here with the turn's model call completed."""
MODEL_LATENCY_S = 0.001
"""How long the demo's policy takes to answer (an inference call's latency): a checkpoint finds
episodes here with the turn's model call in progress."""
MAX_EPISODE_STEPS = 200
"""The demo truncates every episode here (some ids have no time limit of their own)."""


def environment_id(env: str) -> str | None:
    """The Gymnasium id of ``--env gymnasium:ID``, None for the calendar; ValueError else."""
    if env == "calendar":
        return None
    if env.startswith(GYMNASIUM_PREFIX) and len(env) > len(GYMNASIUM_PREFIX):
        return env[len(GYMNASIUM_PREFIX) :]
    raise ValueError(f"--env must be calendar or gymnasium:ID, got {env!r}")


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


@asynccontextmanager
async def open_gymnasium_gym(
    env_id: str, instances: int, seed: int, work_dir: Path, faults: Sequence[str], lease_s: float
) -> AsyncIterator[GymBackend]:
    from gymckpt.gym_adapter.gymnasium_env import gymnasium_environment

    env = gymnasium_environment(env_id, pace_s=PACE_S, max_episode_steps=MAX_EPISODE_STEPS)
    assert env.model is not None
    env = attrs.evolve(env, model=slow_model(env.model, MODEL_LATENCY_S))
    async with EmbeddedGym.host(
        env,
        instances=instances,
        seed=seed,
        work_dir=work_dir,
        config=HostConfig(lease_s=lease_s),
        faults=faults,
    ) as gym:
        yield gym


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


def trajectory_verdict(
    env_id: str, seed: int, lineage: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """``episodes`` trained in the lineage and whether each equals its uninterrupted run."""
    from gymckpt.gym_adapter.gymnasium_env import reference_trajectory

    got: dict[tuple[int, int], list[str]] = {}
    for step in lineage:
        for row, slot, digest in step.get("episodes", ()):
            got.setdefault((row, slot), []).append(digest)
    mismatched = 0
    for (row, slot), digests in got.items():
        ref = trajectory_digest(
            _plain_trajectory(
                reference_trajectory(env_id, seed, row, slot, max_episode_steps=MAX_EPISODE_STEPS)
            )
        )
        mismatched += sum(1 for d in digests if d != ref)
    return {
        "env": f"{GYMNASIUM_PREFIX}{env_id}",
        "episodes": sum(len(d) for d in got.values()),
        "trajectories_mismatched": mismatched,
        "trajectories_match": bool(got) and mismatched == 0,
    }


def _plain_trajectory(traj: Any) -> Any:
    from gymckpt.runtime.lowlevel import converter

    return converter.unstructure(traj)
