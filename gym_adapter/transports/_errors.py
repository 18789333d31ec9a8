"""Error translation across a process boundary: what the runtime sees when a remote call fails.

A remote call fails in one of two ways. Either Gym raised an error, which crosses as itself
(``GymControlError``, ``GymCallTimeout``, ``TopologyMismatch``…) when it can (S6: it pickles,
or has a JSON wire form, ``_wire``), else is replaced by ``GymCheckpointUnavailable``. Or the
transport failed, and the transport says how (``TransportFailure``): the instance is gone for
good (``GymInstanceDead``: nothing will bring it back but a replacement), unreachable for now,
the call was cancelled, or anything else; each but the first is a retryable
``GymCheckpointUnavailable`` naming the instance and the call.

Every translated error is raised ``from None`` by the transports: a transport exception in the
cause chain would make the runtime classify a retryable failure as an invariant.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

from gymckpt.runtime import GymCheckpointUnavailable, GymInstanceDead
from gymckpt.runtime.lowlevel import crossable_error, unpicklable_error

__all__ = [
    "TransportFailure",
    "as_if_no_nursery",
    "first_line",
    "remote_error",
    "transport_error",
]


class TransportFailure(enum.Enum):
    """How a transport failed a call (the transport's own errors, classified by it)."""

    GONE = "gone"
    """The instance (its process, or its host) is gone for good."""
    UNREACHABLE = "unreachable"
    """The instance cannot be reached for now; it may be again."""
    CANCELLED = "cancelled"
    """The transport cancelled the call."""
    BROKEN = "broken"
    """Any other failure of the transport."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its class name if it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def transport_error(
    failure: TransportFailure,
    instance: str,
    op: str,
    exc: BaseException,
    *,
    transport: str,
    peer: str,
) -> Exception:
    """The runtime's error for ``exc``, a failure of kind ``failure`` of the transport named
    ``transport`` (``"Ray"``) whose instances are ``peer``s (``"actor"``)."""
    if failure is TransportFailure.GONE:
        return GymInstanceDead(instance, op)
    if failure is TransportFailure.UNREACHABLE:
        message = f"{peer} unavailable ({first_line(exc)})"
    elif failure is TransportFailure.CANCELLED:
        message = f"the {transport} call was cancelled"
    else:
        message = f"{type(exc).__name__}: {first_line(exc)}"
    return GymCheckpointUnavailable(f"instance {instance} {op}: {message}", instance, op)


def remote_error(cause: BaseException | None, detail: str, instance: str, op: str) -> Exception:
    """The runtime's error for an error Gym raised remotely: ``cause`` itself when the
    transport delivered it and it can cross again, else ``GymCheckpointUnavailable`` describing
    it with ``detail``."""
    if isinstance(cause, Exception):
        return crossable_error(cause, instance, op)
    return unpicklable_error(detail, instance, op)


@contextmanager
def as_if_no_nursery() -> Iterator[None]:
    """A deployment's own nursery wraps whatever leaves it in an exception group: an error of
    the ``async with`` body (or of the deployment's own tasks) comes out as it went in."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
