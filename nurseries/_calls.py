"""Bounded Gym control calls, one cancel scope per call, fanned out over instances (S5, S6).

Every control call gets an absolute ``deadline_ts`` (the Gym enforces it once it runs the call)
and is itself bounded by that deadline plus a short reply grace, in its own cancel scope. An
instance that does not answer is reported as a ``GymCallTimeout`` naming it; the cancelled call is
abandoned (a Ray backend cancels the task) and Gym's lease covers a lost resume.

``fan_out`` runs one call per instance concurrently in a nursery, in the shape of trio's
``open_tcp_stream``: each call in its own scope, failures gathered, one error raised ``from`` an
``ExceptionGroup`` of the per-instance errors. The error is a ``CheckpointInvariantError`` if any
instance's reply broke an invariant (the run must abort), else ``GymCheckpointUnavailable`` (the
checkpoint is retried, S6).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import trio

from gymckpt.runtime import (
    CheckpointInvariantError,
    FailureKind,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymInUse,
    GymUnavailable,
    RuntimeConfig,
    TopologyMismatch,
    failure_kind,
)
from gymckpt.runtime.lowlevel import crossing_boundary

__all__ = ["bounded_call", "classify", "fan_out"]

T = TypeVar("T")

_RETRYABLE = frozenset({FailureKind.GYM_UNAVAILABLE, FailureKind.SNAPSHOT_IO})
"""The kinds of error a checkpoint can fail with and still be retried: they changed nothing."""


def classify(exc: BaseException) -> FailureKind:
    """What a checkpoint's failure ``exc`` is: ``INVARIANT`` (the run aborts),
    ``GYM_UNAVAILABLE`` or ``SNAPSHOT_IO`` (retried), or ``TRAINER_FILES`` (the trainer's
    ``files=`` writer was refused, retried).

    Follows the cause chain and exception groups, classifying each error by type
    (``failure_kind``): an invariant or a refused input (a ``TopologyMismatch``) anywhere wins;
    any kind that is not retryable is an invariant (we cannot prove it changed nothing); a full
    disk or I/O error while writing the snapshot (in our publish or in Gym's commit into the
    staging directory) is ``SNAPSHOT_IO``; otherwise every error is a ``GymUnavailable``, and
    the failure is ``GYM_UNAVAILABLE``.
    """
    if failure_kind(exc) is FailureKind.TRAINER_FILES:  # the store refused the trainer's files
        return FailureKind.TRAINER_FILES
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    kinds: set[FailureKind] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
            continue
        kind = failure_kind(e)
        if kind in (FailureKind.INVARIANT, FailureKind.BAD_INPUT):
            return FailureKind.INVARIANT
        kinds.add(kind)
        if e.__cause__ is not None:
            stack.append(e.__cause__)
    if not kinds or not kinds <= _RETRYABLE:
        return FailureKind.INVARIANT
    if FailureKind.SNAPSHOT_IO in kinds:
        return FailureKind.SNAPSHOT_IO
    return FailureKind.GYM_UNAVAILABLE


async def bounded_call(
    instance: str,
    operation: str,
    call: Callable[[float], Awaitable[T]],
    config: RuntimeConfig,
) -> T:
    """Run ``call(deadline_ts)`` bounded by ``deadline_ts + reply_grace_s``.

    Raises ``GymCallTimeout`` naming the instance when no reply came in time (or the backend
    raised a plain ``TimeoutError``), and ``GymCheckpointUnavailable`` in place of a Gym error
    that cannot be pickled.
    """
    deadline = trio.current_time() + config.control_timeout_s
    with trio.move_on_at(deadline + config.reply_grace_s) as scope:
        with crossing_boundary(instance, operation):
            try:
                return await call(deadline)
            except TimeoutError as exc:
                if isinstance(exc, GymUnavailable):
                    raise
                # a backend's own timeout: Gym did not answer in time, retryable like ours
                raise GymCallTimeout(
                    f"instance {instance} {operation}: {exc}", instance, operation
                ) from None
    assert scope.cancelled_caught
    raise GymCallTimeout(
        f"instance {instance} did not answer {operation} within "
        f"{config.control_timeout_s:g}s + {config.reply_grace_s:g}s grace; call cancelled",
        instance,
        operation,
    )


async def fan_out(
    operation: str,
    calls: Mapping[str, Callable[[float], Awaitable[T]]],
    config: RuntimeConfig,
) -> dict[str, T]:
    """Run one bounded call per instance concurrently; return replies by instance or raise."""
    results: dict[str, T] = {}
    errors: dict[str, Exception] = {}

    async def one(instance: str, call: Callable[[float], Awaitable[T]]) -> None:
        try:
            results[instance] = await bounded_call(instance, operation, call, config)
        except Exception as exc:
            errors[instance] = exc

    async with trio.open_nursery() as nursery:
        for instance, call in calls.items():
            nursery.start_soon(one, instance, call)
    if errors:
        raise _gathered(operation, errors)
    return results


def _gathered(operation: str, errors: Mapping[str, Exception]) -> Exception:
    order: Sequence[str] = sorted(errors)
    group = ExceptionGroup(
        f"{operation} failed on {len(errors)} instance(s)", [errors[i] for i in order]
    )
    detail = "; ".join(
        str(errors[i]) if i in str(errors[i]) else f"{i}: {errors[i]}" for i in order
    )
    err: Exception
    mismatches = [e for e in errors.values() if isinstance(e, TopologyMismatch)]
    in_use = [errors[i] for i in order if isinstance(errors[i], GymInUse)]
    if in_use:  # another trainer holds the instance: that decides, as itself (exit code 2)
        err = in_use[0]
    elif mismatches:
        err = TopologyMismatch(d for m in mismatches for d in m.differences)
    elif classify(group) is FailureKind.INVARIANT:
        err = CheckpointInvariantError(f"{operation}: {detail}")
    else:
        err = GymCheckpointUnavailable(detail, "", operation)
    err.__cause__ = group
    return err
