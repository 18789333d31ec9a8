"""``Environment``: an agent, its environment participants and its model, as one hostable unit.

A deployment hosts one ``Environment`` on every instance. ``load_environment`` resolves an
import path (``package.module:name``) to one, which is how a Ray actor gets user code: the path
crosses Ray as a string and the actor imports it, so the environment need not pickle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from ._episode import AgentParticipant, Model, Participant, check_environment

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "Environment"]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 20


def _as_tuple(participants: Iterable[Participant]) -> tuple[Participant, ...]:
    return tuple(participants)


@attrs.frozen(kw_only=True)
class Environment:
    """What every instance hosts: the ``agent`` (the episode loop), environment
    ``participants`` (in topology order, after the agent) and an optional ``model`` reached
    through the host's model proxy. An episode's payload over ``max_payload_bytes`` (as JSON)
    fails the episode (data) with ``PayloadTooLarge``'s message."""

    agent: AgentParticipant
    participants: tuple[Participant, ...] = attrs.field(default=(), converter=_as_tuple)
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
