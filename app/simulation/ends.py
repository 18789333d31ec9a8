"""How a life of a simulated scenario ended (``LifeEnd``), told from what stopped
it: the error its trainer's run raised, classified by its kind of failure
(``gymckpt.nurseries.run_failure`` over ``gymckpt.runtime.FailureKind``: the same
classification as the coordinator, ``gymckpt.run`` and the demo).

Some ends are aborts the contract documents (checkpoints failing too often, every instance
dead, a restore Gym could not serve, an instance dying past its replacement budget): the next
life restores, as after a crash; they are violations only when nothing in the scenario
could have caused them. The others are violations whatever the scenario: an invariant abort,
one of our own snapshots refused, no progress, any other error.
"""

from __future__ import annotations

import enum

import attrs

from gymckpt.gym_adapter import GymInstanceDead
from gymckpt.nurseries import run_failure
from gymckpt.runtime import FailureKind

__all__ = ["FailedEnd", "LifeEnd", "failed_end", "restore_may_retry", "single_error"]


class LifeEnd(enum.StrEnum):
    """``LifeReport.end``: what ended one life."""

    FINISHED = "finished"
    """The dataset is done and the final snapshot published."""
    CRASHED = "crashed"
    """Abandoned by the scenario (``Crash``)."""
    CHECKPOINTS_FAILED = "checkpoints_failed"
    """Checkpoints failed too often in a row (exit 4)."""
    GYM_DEAD = "gym_dead"
    """Every Gym instance dead (exit 4)."""
    RESTORE_FAILED = "restore_failed"
    """Gym could not restore the snapshot (exit 4, before ``open_rollouts`` yielded)."""
    REPLACEMENTS_EXHAUSTED = "replacements_exhausted"
    """An instance died past its replacement budget (exit 5)."""
    INFRA_OUTAGE = "infra_outage"
    """Infrastructure down past ``outage_budget_s`` (exit 8): an instance that could not be
    brought back, or every episode failing as infra."""
    INVARIANT = "invariant"
    """The run aborted on an invariant violation (exit 3): a violation."""
    BAD_SNAPSHOT = "bad_snapshot"
    """One of our own snapshots did not load (exit 2): a violation."""
    NO_PROGRESS = "no_progress"
    """Nothing moved within the liveness bound (``liveness``): a violation."""
    STALLED = "stalled"
    """Moved, but did not end within the life's total-time cap: a violation."""
    ERROR = "error"
    """Anything else: a violation."""

    @property
    def documented_abort(self) -> bool:
        """An abort the contract documents: a fault in the scenario must account for it."""
        return self in _DOCUMENTED_ABORTS


_DOCUMENTED_ABORTS = frozenset(
    {
        LifeEnd.CHECKPOINTS_FAILED,
        LifeEnd.GYM_DEAD,
        LifeEnd.RESTORE_FAILED,
        LifeEnd.REPLACEMENTS_EXHAUSTED,
        LifeEnd.INFRA_OUTAGE,
    }
)


_GYM_GAVE_UP = frozenset({FailureKind.CHECKPOINTS_FAILED, FailureKind.GYM_UNAVAILABLE})
"""Run failures that end a run with exit code 4: checkpoints failed too often in a row, every
instance dead, or a restore Gym could not serve."""
_REFUSED = frozenset({FailureKind.BAD_INPUT, FailureKind.TRAINER_FILES})
"""Run failures that are gymckpt refusing its input (exit code 2)."""


def single_error(exc: BaseException) -> BaseException:
    """The one error inside nested single-error exception groups, else ``exc`` itself.

    Trio nurseries (``open_rollouts``, the Gym's task groups) wrap an error raised in their body
    in an ``ExceptionGroup``; exit codes are decided on the error itself.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@attrs.frozen
class FailedEnd:
    """A life's end by an error: the end, the error (``Type: message``) and, when the
    end is a violation whatever the scenario, the violation's line."""

    end: LifeEnd
    error: str
    violation: str | None = None


def failed_end(exc: BaseException, *, opened: bool) -> FailedEnd:
    """Classify the error that ended a life (``opened``: ``open_rollouts`` had
    yielded, so the restore, if any, succeeded)."""
    decided = run_failure(exc)
    err = decided[1] if decided is not None else single_error(exc)
    error = f"{type(err).__name__}: {err}"
    kind = decided[0] if decided is not None else None
    if kind is FailureKind.REPLACEMENTS_EXHAUSTED:
        return FailedEnd(LifeEnd.REPLACEMENTS_EXHAUSTED, error)
    if kind is FailureKind.INFRA_OUTAGE:
        return FailedEnd(LifeEnd.INFRA_OUTAGE, error)
    if kind in _GYM_GAVE_UP:
        if not opened:  # open_rollouts never yielded: the restore gave up
            return FailedEnd(LifeEnd.RESTORE_FAILED, error)
        if isinstance(err, GymInstanceDead):
            return FailedEnd(LifeEnd.GYM_DEAD, error)
        return FailedEnd(LifeEnd.CHECKPOINTS_FAILED, error)
    if kind is FailureKind.INVARIANT:
        return FailedEnd(
            LifeEnd.INVARIANT, error, f"run aborted by an invariant violation: {error}"
        )
    if kind in _REFUSED:
        return FailedEnd(LifeEnd.BAD_SNAPSHOT, error, f"our own snapshot was refused: {error}")
    return FailedEnd(LifeEnd.ERROR, error, f"unexpected error {error}")


def restore_may_retry(exc: BaseException) -> bool:
    """The error is one a restore Gym could not serve (``GYM_UNAVAILABLE``, or checkpoints
    failing): with ``Scenario.restore_retry``, the trainer restarts into the same Gym, which
    rolled back."""
    decided = run_failure(exc)
    return decided is not None and decided[0] in _GYM_GAVE_UP
