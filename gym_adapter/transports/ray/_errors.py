"""Ray's errors, classified for the transport-neutral translation (``_errors``).

A dead actor (``ActorDiedError``, its node gone) is the instance gone for good: it marks the
incarnation dead (``Incarnations``) and raises ``GymInstanceDead``; an unavailable actor, a
cancelled task or any other Ray failure is a retryable ``GymCheckpointUnavailable``; a Gym error
carried by a ``RayTaskError`` crosses as itself when it pickles, else as
``GymCheckpointUnavailable`` (the actor replaces it before it crosses; if Ray itself cannot
serialise an error, the same replacement happens here).
"""

from __future__ import annotations

from ray.exceptions import (
    ActorUnavailableError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    TaskCancelledError,
)

from .._errors import TransportFailure, first_line, remote_error, transport_error
from .._incarnations import Incarnations

__all__ = ["actor_gone", "stream_ends", "translate"]


def actor_gone(exc: BaseException) -> bool:
    """Ray says the actor is gone for good: it died (its process, or its node), or its node
    did. (``ActorUnavailableError`` is not: Ray may reach the actor again.)"""
    if isinstance(exc, ActorUnavailableError):
        return False
    return isinstance(exc, (RayActorError, NodeDiedError))


def stream_ends(exc: BaseException) -> bool:
    """Ray failures that end a stream early (its rows are missing) rather than raise: the actor
    is gone or unreachable, the generator was cancelled, or a batch was lost with its node."""
    return isinstance(exc, (RayActorError, TaskCancelledError, NodeDiedError, ObjectLostError))


def _failure(exc: BaseException) -> TransportFailure | None:
    if actor_gone(exc):
        return TransportFailure.GONE
    if isinstance(exc, ActorUnavailableError):
        return TransportFailure.UNREACHABLE
    if isinstance(exc, TaskCancelledError):
        return TransportFailure.CANCELLED
    if isinstance(exc, RayTaskError):
        return None
    if isinstance(exc, RayError):
        return TransportFailure.BROKEN
    return None


def translate(
    incarnations: Incarnations, instance: str, op: str, exc: BaseException, incarnation: int
) -> BaseException:
    """The error the runtime sees for ``exc``, raised by Ray for ``op`` on incarnation
    ``incarnation`` of ``instance``. An actor or node that is gone marks that incarnation dead:
    Ray will not bring it back (actors never restart by themselves here); ``replace`` does."""
    failure = _failure(exc)
    if failure is TransportFailure.GONE:
        incarnations.mark_dead(instance, incarnation)
    if failure is not None:
        return transport_error(failure, instance, op, exc, transport="Ray", peer="actor")
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RayError):
            cause = None
        detail = first_line(getattr(exc, "cause", None) or exc)
        return remote_error(cause, detail, instance, op)
    return exc
