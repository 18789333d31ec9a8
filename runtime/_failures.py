"""One classification of failures, by type: what kind of failure an error is.

Every place that decides what a failure means asks ``failure_kind``: the checkpoint coordinator
(retry the checkpoint or abort the run), ``gymckpt.run`` (which exit code ends the program) and
the simulation (how an incarnation ended). The kinds follow the error family of
``runtime._errors``: each is an ``isinstance`` check against one base class, so a backend's own
subclass of ``GymUnavailable`` or ``BadInput`` is classified without being listed anywhere.

``FailureKind`` is a ``str`` enum whose values are the names the metrics, the log lines and
``CheckpointOutcome.reason`` carry (``checkpoint/gym_unavailable_total``,
``reason == "snapshot_io"``).

``TopologyMismatch`` is ``BAD_INPUT``, like every ``BadInput``: the deployment (or the state on
disk) is not what the manifest says, so gymckpt refuses it; it never means that the runtime broke
its own rules. What a caller does with a kind is the caller's decision: a restore that meets it
ends the run with exit code 2 (the input was refused, nothing was installed), while a checkpoint
that meets it — or any other kind that is not retryable — cannot prove it changed nothing, so it
aborts the run as an invariant violation (``CheckpointInvariantError``, exit code 3).
"""

from __future__ import annotations

import enum
import errno

from ._errors import (
    BadInput,
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    GymConnectionLost,
    GymUnavailable,
    InfraOutage,
    Preempted,
    ReplacementsExhausted,
    TrainerFilesRefused,
)

__all__ = ["STORAGE_ERRNOS", "FailureKind", "failure_kind", "is_storage_error"]

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
"""Errors writing a snapshot (full disk, quota, I/O error) that fail the checkpoint, retryably:
the snapshot is staged out of sight and published by one rename, so nothing changed."""


def is_storage_error(exc: BaseException) -> bool:
    """A full disk, an exceeded quota or an I/O error (``STORAGE_ERRNOS``)."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


class FailureKind(enum.StrEnum):
    """What kind of failure one error is (``failure_kind``); the value is its metric name."""

    INVARIANT = "invariant"
    """The runtime's own rules broke (``CheckpointInvariantError``): the run aborts."""
    BAD_INPUT = "bad_input"
    """gymckpt refused what it was given (``BadInput``: a manifest, a topology, a
    configuration, a work directory in use)."""
    TRAINER_FILES = "trainer_files"
    """The trainer's ``files=`` writer left something that cannot be a file of the snapshot
    (``TrainerFilesRefused``): that checkpoint fails, the next one is tried."""
    GYM_UNAVAILABLE = "gym_unavailable"
    """Gym could not serve a call and changed nothing (``GymUnavailable``): retryable."""
    SNAPSHOT_IO = "snapshot_io"
    """A full disk or an I/O error writing a snapshot (``STORAGE_ERRNOS``): retryable."""
    CHECKPOINTS_FAILED = "checkpoints_failed"
    """Checkpoints failed too often in a row (``CheckpointsFailed``)."""
    REPLACEMENTS_EXHAUSTED = "replacements_exhausted"
    """An instance died past its replacement budget (``ReplacementsExhausted``)."""
    INFRA_OUTAGE = "infra_outage"
    """Infrastructure (a model server, a Gym instance) stayed down past ``outage_budget_s``
    (``InfraOutage``)."""
    CLUSTER_LOST = "cluster_lost"
    """The cluster Gym runs on is out of reach (``GymConnectionLost``)."""
    DATA_FAILURES = "data_failures"
    """Episodes failed as data past the budget (``BudgetExhausted``)."""
    PREEMPTED = "preempted"
    """SIGTERM or SIGINT ended the run after its final checkpoint (``Preempted``)."""
    UNKNOWN = "unknown"
    """Not one of gymckpt's failures: a bug, or an error of the trainer's own code."""


_BY_TYPE: tuple[tuple[type[BaseException], FailureKind], ...] = (
    (CheckpointInvariantError, FailureKind.INVARIANT),
    (TrainerFilesRefused, FailureKind.TRAINER_FILES),  # a BadInput with a kind of its own
    (BadInput, FailureKind.BAD_INPUT),
    (GymConnectionLost, FailureKind.CLUSTER_LOST),
    (GymUnavailable, FailureKind.GYM_UNAVAILABLE),
    (CheckpointsFailed, FailureKind.CHECKPOINTS_FAILED),
    (ReplacementsExhausted, FailureKind.REPLACEMENTS_EXHAUSTED),
    (InfraOutage, FailureKind.INFRA_OUTAGE),
    (BudgetExhausted, FailureKind.DATA_FAILURES),
    (Preempted, FailureKind.PREEMPTED),
)
"""First match wins: a subclass with a kind of its own comes before its base."""


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of ``exc`` itself, by type (its cause and an exception group's members are not
    looked at: callers that combine several errors decide how)."""
    for cls, kind in _BY_TYPE:
        if isinstance(exc, cls):
            return kind
    if is_storage_error(exc):
        return FailureKind.SNAPSHOT_IO
    return FailureKind.UNKNOWN
