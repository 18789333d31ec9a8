"""``Environment``: an agent, its environment participants and its model, as one hostable unit.

A deployment hosts one ``Environment`` on every instance. ``load_environment`` resolves an
import path (``package.module:name``) to one, which is how a Ray actor gets user code: the path
crosses Ray as a string and the actor imports it, so the environment need not pickle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final

import attrs

from ._episode import AgentParticipant, Model, Participant, check_environment

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "Environment", "load_environment"]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 20


@attrs.frozen(kw_only=True)
class Environment:
    """What every instance hosts: the ``agent`` (the episode loop), environment
    ``participants`` (in topology order, after the agent) and an optional ``model`` reached
    through the host's model proxy. An episode's payload over ``max_payload_bytes`` (as JSON)
    fails the episode (data) with ``PayloadTooLarge``'s message."""

    agent: AgentParticipant
    participants: tuple[Participant, ...] = attrs.field(default=(), converter=tuple)
    model: Model | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def check(self) -> None:
        """Raise ``EnvironmentSpecError`` naming what cannot be hosted."""
        check_environment(self.agent, self.participants, self.model is not None)
        if self.max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be >= 1, got {self.max_payload_bytes}")

    @property
    def topology(self) -> tuple[tuple[str, str], ...]:
        """``(server_name, kind)`` of each participant as the host reports them."""
        parts = [(self.agent.name, self.agent.kind)]
        parts.extend((p.name, p.kind) for p in self.participants)
        if self.model is not None:
            parts.append(("model_proxy", "model_proxy"))
        return tuple(parts)


def load_environment(path: str | Environment | Callable[[], Environment]) -> Environment:
    """An ``Environment`` from ``"package.module:name"`` (an ``Environment`` or a zero-argument
    factory of one), ``"gymnasium:ID"`` (that Gymnasium id with a random policy), a factory, or
    an environment (returned as is)."""
    if isinstance(path, Environment):
        return path
    if isinstance(path, str) and path.startswith("gymnasium:"):
        from .gymnasium_env import gymnasium_environment

        return gymnasium_environment(path.removeprefix("gymnasium:"))
    if callable(path):
        env: Any = path()
    else:
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise ValueError(f"environment path {path!r} must look like 'package.module:name'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"environment path {path!r}: cannot import {module_name}: {exc}"
            ) from None
        try:
            env = getattr(module, attr)
        except AttributeError:
            raise ValueError(f"environment path {path!r}: {module_name} has no {attr}") from None
        if not isinstance(env, Environment) and callable(env):
            env = env()
    if not isinstance(env, Environment):
        raise ValueError(f"environment {path!r} is a {type(env).__name__}, not an Environment")
    return env
