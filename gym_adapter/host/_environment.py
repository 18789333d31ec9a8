"""``Environment``: an agent, its environment participants and its model, as one hostable unit.

A deployment hosts one ``Environment`` on every instance. ``load_environment`` resolves an
import path (``package.module:name``) to one, which is how a Ray actor gets user code: the path
crosses Ray as a string and the actor imports it, so the environment need not pickle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import attrs

from ._episode import (
    AgentParticipant,
    Model,
    Participant,
    check_environment,
    is_retained,
    participant_kinds,
)

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "Environment", "Roles"]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 20


def _as_tuple(participants: Iterable[Participant]) -> tuple[Participant, ...]:
    return tuple(participants)


@attrs.frozen(kw_only=True)
class Environment:
    """What every instance hosts: the ``agent`` (the episode loop), environment
    ``participants`` (in topology order, after the agent) and an optional ``model`` reached
    through the host's model proxy. An episode's payload over ``max_payload_bytes`` (as JSON)
    fails the episode (data) with ``PayloadTooLarge``'s message.

    ``unaligned``: every step boundary exports and serialises the episode's session states
    (one ``export`` per participant, one ``orjson.dumps``), so an unaligned checkpoint can take
    an episode in the middle of a turn at its last boundary. False saves that per-step cost:
    an unaligned checkpoint then parks this environment's episodes at their next boundary, as
    an aligned one does."""

    agent: AgentParticipant
    participants: tuple[Participant, ...] = attrs.field(default=(), converter=_as_tuple)
    model: Model | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    unaligned: bool = True

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


@attrs.frozen
class Roles:
    """What a host does with each participant of a checked ``Environment``, decided once (a
    kind's role never changes once registered).

    ``sessions``: every participant that opens a session per episode, the agent first.
    ``retained``: those whose sessions outlive their episode (``retained = True``).
    ``legacy``: the agent has the ``legacy_agent`` role (its sessions own their episodes).
    ``owner``: the participant that exports parked episodes: the first environment, else
    the agent.
    ``versions``: each of ``sessions``' ``state_version`` method (None where it declares
    none), or None if none declares one: what a boundary mark may skip exporting."""

    sessions: tuple[Participant, ...]
    retained: tuple[Participant, ...]
    retained_names: frozenset[str]
    legacy: bool
    owner: str
    versions: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, environment: Environment) -> Roles:
        kinds = participant_kinds()
        legacy = kinds[environment.agent.kind] == "legacy_agent"
        owner = environment.agent.name
        if not legacy:
            owner = next(
                (p.name for p in environment.participants if kinds[p.kind] == "environment"),
                owner,
            )
        retained = tuple(p for p in environment.participants if is_retained(p))
        sessions = (environment.agent, *environment.participants)
        found = tuple(getattr(p, "state_version", None) for p in sessions)
        return cls(
            sessions=sessions,
            versions=found if any(v is not None for v in found) else None,
            retained=retained,
            retained_names=frozenset(p.name for p in retained),
            legacy=legacy,
            owner=owner,
        )
