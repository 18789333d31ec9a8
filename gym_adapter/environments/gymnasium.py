"""Gymnasium environments on the Gym host (needs the ``gymnasium`` extra).

    from gymckpt.gym_adapter.environments.gymnasium import gymnasium_environment
    env = gymnasium_environment("CartPole-v1", policy=my_policy)
    async with EmbeddedGym.host(env, instances=2) as gym: ...

Each episode of (row, slot) is ``gymnasium.make(env_id)`` reset with a seed drawn from the
deployment seed, the row and the slot; the agent asks the policy (through the model proxy, so
every action is captured under a capture key) and steps the environment until it terminates or
is truncated; the episode's payload is its ``Trajectory``. The environment participant's session
is exported through the id's state codec (``register_state_codec``), so a restored episode
continues exactly where it was parked: its trajectory equals an uninterrupted run's, bit for
bit (``reference_trajectory`` runs that uninterrupted run with plain Gymnasium).

The policy is ``policy(observation, rng, action_space) -> action``: ``rng`` is a
``numpy.random.Generator`` seeded by the deployment seed and the call's capture key, so a
stochastic policy is reproducible too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import anyio
import attrs
import gymnasium
import numpy as np

from gymckpt.gym_adapter import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Done,
    Environment,
    EnvironmentSpecError,
    EpisodeContext,
    EpisodeInfo,
    parse_call_id,
    split_capture_key,
)

from ._codecs import (
    AttributeCodec,
    ExportMemo,
    StateCodec,
    builtin_codec_names,
    codec_for,
    register_state_codec,
)
from ._seeding import derive_seed

__all__ = [
    "ENV_PARTICIPANT",
    "AttributeCodec",
    "GymnasiumAgent",
    "GymnasiumParticipant",
    "Policy",
    "StateCodec",
    "Trajectory",
    "builtin_codec_names",
    "episode_seed",
    "gymnasium_environment",
    "plain",
    "random_policy",
    "reference_trajectory",
    "register_state_codec",
    "trajectory_data",
]

ENV_PARTICIPANT: Final = "env"
Policy = Callable[[Any, np.random.Generator, gymnasium.Space[Any]], Any]


def plain(value: Any) -> Any:
    """An observation or action as JSON data (arrays as nested lists, numpy scalars as
    Python numbers, tuples as lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def episode_seed(seed: int, row: int, slot: int) -> int:
    """The ``reset`` seed of the episode of (row, slot) under deployment ``seed``."""
    return derive_seed("gymckpt-gymnasium", seed, row, slot) % (2**31)


def random_policy(observation: Any, rng: np.random.Generator, space: gymnasium.Space[Any]) -> Any:
    """A uniformly random action (Discrete and Box spaces)."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(space.start + rng.integers(int(space.n)))
    if isinstance(space, gymnasium.spaces.Box):
        return rng.uniform(space.low, space.high).astype(space.dtype)
    raise TypeError(f"random_policy supports Discrete and Box spaces, not {space}")


@attrs.define(slots=True)
class Trajectory:
    """An episode's full trajectory: ``observations`` has one more entry than ``actions`` and
    ``rewards`` (the reset observation first). Plain data: the episode's payload."""

    observations: list[Any] = attrs.field(factory=list)
    actions: list[Any] = attrs.field(factory=list)
    rewards: list[float] = attrs.field(factory=list)
    terminated: bool = False
    truncated: bool = False


def trajectory_data(trajectory: Trajectory) -> dict[str, Any]:
    """``trajectory`` as plain data, what the converter makes of it (a ``Done`` payload): its
    own lists, not copies (its episode has ended), with no walk of their entries, which are
    plain already (``plain``)."""
    return {
        "observations": trajectory.observations,
        "actions": trajectory.actions,
        "rewards": trajectory.rewards,
        "terminated": trajectory.terminated,
        "truncated": trajectory.truncated,
    }


def _make(env_id: str, max_episode_steps: int | None) -> gymnasium.Env[Any, Any]:
    if max_episode_steps is None:
        return gymnasium.make(env_id)
    return gymnasium.make(env_id, max_episode_steps=max_episode_steps)


def _to_action(action: Any, space: gymnasium.Space[Any]) -> Any:
    if isinstance(space, gymnasium.spaces.Box):
        return np.asarray(action, dtype=space.dtype).reshape(space.shape)
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(action)
    return action


@attrs.define(slots=True)
class GymSession:
    """The environment participant's session: the live environment and its last observation."""

    env: gymnasium.Env[Any, Any]
    observation: Any
    memo: ExportMemo | None = None
    """The codec's ``ExportMemo`` of ``env`` (an ``AttributeCodec``'s), made at the first
    export."""


@attrs.frozen
class GymnasiumParticipant:
    """The ``env`` participant: one ``gymnasium.make(env_id)`` per session, exported through
    ``codec``."""

    env_id: str
    codec: StateCodec
    max_episode_steps: int | None = None
    name: str = ENV_PARTICIPANT
    kind: str = "environment"

    def _make(self) -> gymnasium.Env[Any, Any]:
        return _make(self.env_id, self.max_episode_steps)

    def open(self, info: EpisodeInfo) -> GymSession:
        env = self._make()
        obs, _ = env.reset(seed=episode_seed(info.seed, info.row, info.slot))
        return GymSession(env, plain(obs))

    def export(self, state: GymSession) -> Any:
        codec = self.codec
        if type(codec) is AttributeCodec:  # its memo skips a wrapper walk and the RNG's encoding
            memo = state.memo
            if memo is None:
                memo = state.memo = codec.memo(state.env)
            return {"observation": state.observation, "env": codec.export(state.env, memo)}
        return {"observation": state.observation, "env": codec.export(state.env)}

    def restore(self, data: Any) -> GymSession:
        env = self._make()
        env.reset(seed=0)
        self.codec.restore(env, data["env"])
        return GymSession(env, data["observation"])


@attrs.frozen
class GymnasiumAgent:
    """The agent: per turn, ask the policy for an action and step the environment once.
    ``pace_s`` waits that long per turn (a policy's latency, for demos)."""

    pace_s: float = 0.0
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Trajectory:
        return Trajectory()

    def export(self, state: Trajectory) -> Any:
        # a copy of each list, not of its entries: an observation or action is a fresh value
        # from ``plain`` when appended and never changed in place (a deep copy costs a Python
        # walk of the whole history, at every step boundary of an unaligned host)
        return {
            "observations": list(state.observations),
            "actions": list(state.actions),
            "rewards": list(state.rewards),
            "terminated": state.terminated,
            "truncated": state.truncated,
        }

    def restore(self, data: Any) -> Trajectory:
        return Trajectory(**data)

    async def step(self, ctx: EpisodeContext, state: Trajectory) -> Done | None:
        session: GymSession = ctx.session(ENV_PARTICIPANT)
        if not state.observations:
            state.observations.append(session.observation)
        action = await ctx.model(session.observation)
        if self.pace_s > 0:
            await anyio.sleep(self.pace_s)
            session = ctx.session(ENV_PARTICIPANT)  # still the owner after the wait
        env = session.env  # (``ctx.model`` checked it after the model's answer)
        obs, reward, terminated, truncated, _ = env.step(_to_action(action, env.action_space))
        session.observation = plain(obs)
        state.actions.append(action)
        state.rewards.append(float(reward))
        state.observations.append(session.observation)
        if terminated or truncated:
            state.terminated, state.truncated = bool(terminated), bool(truncated)
            return Done(sum(state.rewards), payload=trajectory_data(state))
        return None


def _model(env_id: str, policy: Policy) -> Callable[[str, Any, EpisodeInfo], Any]:
    space = gymnasium.make(env_id).action_space

    def model(key: str, observation: Any, info: EpisodeInfo) -> Any:
        rng = np.random.default_rng(
            derive_seed("gymckpt-policy", info.seed, _policy_key(key, info))
        )
        return plain(policy(observation, rng, space))

    return model


def _policy_key(key: str, info: EpisodeInfo) -> str:
    """What the policy's RNG of call ``key`` is seeded from: the slot, the turn and the call's
    occurrence, the same for every attempt (a retried or restored attempt draws what an
    uninterrupted run draws), spelled ``"{row}-{slot}/t{turn}/c{n}"`` as it was before capture
    keys took NeMo Gym's shape (one call a turn: ``n`` is 0), so a seed's trajectories stay what
    they were. The observation is the request: its digest in the call id is not needed."""
    call = split_capture_key(key)[1]  # "t{turn}-{digest}-c{occurrence}", parsed by hand at
    turn, _, rest = call.partition("-")  # every step (``parse_call_id``'s regex and its
    occurrence = rest.rpartition("-c")[2]  # ``CallId`` cost a µs a step)
    if turn[:1] != "t" or not turn[1:].isdigit() or not occurrence.isdigit():
        parsed = parse_call_id(call)  # raises naming what is wrong with the key
        turn, occurrence = f"t{parsed.turn}", str(parsed.occurrence)
    return f"{info.session_key}/t{int(turn[1:])}/c{int(occurrence)}"


def gymnasium_environment(
    env_id: str,
    policy: Policy = random_policy,
    *,
    codec: StateCodec | None = None,
    pace_s: float = 0.0,
    max_episode_steps: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Environment:
    """An ``Environment`` running Gymnasium ``env_id`` with ``policy``; ``max_episode_steps``
    overrides the id's time limit (episodes are truncated there).

    ``codec`` defaults to the registered one; an id without any raises
    ``EnvironmentSpecError`` naming ``register_state_codec``.
    """
    try:  # an id Gymnasium does not know is that, whether or not a codec is registered
        gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise EnvironmentSpecError(f"no such Gymnasium environment {env_id!r}: {exc}") from None
    codec = codec if codec is not None else codec_for(env_id)
    if codec is None:
        raise EnvironmentSpecError(
            f"Gymnasium environment {env_id!r} has no state codec, so its episodes cannot be "
            "checkpointed; register one with gymckpt.gym_adapter.environments.gymnasium."
            "register_state_codec(name, codec) (built in: "
            f"{', '.join(builtin_codec_names())})"
        )
    return Environment(
        agent=GymnasiumAgent(pace_s=pace_s),
        participants=(GymnasiumParticipant(env_id, codec, max_episode_steps),),
        model=_model(env_id, policy),
        max_payload_bytes=max_payload_bytes,
    )


def reference_trajectory(
    env_id: str,
    seed: int,
    row: int,
    slot: int,
    policy: Policy = random_policy,
    max_episode_steps: int | None = None,
) -> Trajectory:
    """The uninterrupted run of episode (row, slot) with plain Gymnasium: the trajectory a
    hosted episode must reproduce exactly, crash and restore or not."""
    env = _make(env_id, max_episode_steps)
    obs, _ = env.reset(seed=episode_seed(seed, row, slot))
    traj = Trajectory(observations=[plain(obs)])
    info = EpisodeInfo("", row, slot, 0, seed, "")
    turn = 0
    while True:
        key = f"{info.session_key}/t{turn}/c0"
        rng = np.random.default_rng(derive_seed("gymckpt-policy", seed, key))
        action = plain(policy(traj.observations[-1], rng, env.action_space))
        obs, reward, terminated, truncated, _ = env.step(_to_action(action, env.action_space))
        traj.actions.append(action)
        traj.rewards.append(float(reward))
        traj.observations.append(plain(obs))
        turn += 1
        if terminated or truncated:
            traj.terminated, traj.truncated = bool(terminated), bool(truncated)
            return traj
