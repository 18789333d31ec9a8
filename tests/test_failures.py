"""One failure classification by type: ``failure_kind``, and how a run's end is decided by it."""

from __future__ import annotations

import errno

import pytest

from gymckpt.gym_adapter import EnvironmentSpecError
from gymckpt.nurseries import ExitCode, run_exit, run_failure
from gymckpt.nurseries._calls import classify
from gymckpt.nurseries._run import EXIT_CODES
from gymckpt.runtime import (
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    DeadlineExpired,
    DrainTimeout,
    EpisodeConfigFailed,
    FailureKind,
    GymAdmissionClosed,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    GymControlError,
    GymInstanceDead,
    GymUnavailable,
    InfraOutage,
    ManifestError,
    Preempted,
    ReplacementsExhausted,
    StrandedSessionError,
    TopologyMismatch,
    TrainerFilesRefused,
    WorkDirLocked,
    failure_kind,
)

K = FailureKind

EVERY_ERROR: list[tuple[BaseException, FailureKind]] = [
    (CheckpointInvariantError("reply mismatch"), K.INVARIANT),
    (StrandedSessionError("gym-0", ["r-1"]), K.INVARIANT),
    (TopologyMismatch(["gym-1: missing"]), K.BAD_INPUT),
    (ManifestError("ledger.json: bad"), K.BAD_INPUT),
    (WorkDirLocked("/w", 42), K.BAD_INPUT),
    (EnvironmentSpecError("cannot be hosted"), K.BAD_INPUT),
    (EpisodeConfigFailed("r-1", "gym-0", "server refuses a field"), K.BAD_INPUT),
    (TrainerFilesRefused("trainer/x: a fifo"), K.TRAINER_FILES),
    (GymCheckpointUnavailable("lease lost", "gym-0", "commit"), K.GYM_UNAVAILABLE),
    (GymControlError("gym-0", "prepare", "refused"), K.GYM_UNAVAILABLE),
    (GymInstanceDead("gym-0", "commit"), K.GYM_UNAVAILABLE),
    (GymCallTimeout("gym-0 did not answer", "gym-0", "prepare"), K.GYM_UNAVAILABLE),
    (DrainTimeout(["r-1"], 1.0), K.GYM_UNAVAILABLE),
    (GymConnectionLost("GCS gone", "10.0.0.1:6379"), K.CLUSTER_LOST),
    (CheckpointsFailed("5 in a row"), K.CHECKPOINTS_FAILED),
    (ReplacementsExhausted("gym-0", 3, 60.0), K.REPLACEMENTS_EXHAUSTED),
    (InfraOutage("gym instance gym-0", 301.0, 300.0), K.INFRA_OUTAGE),
    (BudgetExhausted("data"), K.DATA_FAILURES),
    (Preempted("SIGTERM", 3, None, "preempted"), K.PREEMPTED),
    (OSError(errno.ENOSPC, "No space left on device"), K.SNAPSHOT_IO),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), K.SNAPSHOT_IO),
    (OSError(errno.EIO, "Input/output error"), K.SNAPSHOT_IO),
    (OSError(errno.EACCES, "Permission denied"), K.UNKNOWN),
    (TimeoutError("some other clock"), K.UNKNOWN),
    (DeadlineExpired("r-1", "a row", 5.0), K.UNKNOWN),
    (GymAdmissionClosed("r-1", "gym-0"), K.UNKNOWN),
    (ValueError("the trainer's own"), K.UNKNOWN),
    (KeyError("episodes"), K.UNKNOWN),
]


@pytest.mark.parametrize(("error", "kind"), EVERY_ERROR, ids=lambda v: type(v).__name__)
def test_every_error_has_one_kind_by_type(error: BaseException, kind: FailureKind) -> None:
    assert failure_kind(error) is kind


def test_a_backends_own_subclass_is_classified_by_its_base() -> None:
    class PluginOutage(GymUnavailable):
        pass

    class PluginRefusal(ManifestError):
        pass

    assert failure_kind(PluginOutage("restarting")) is K.GYM_UNAVAILABLE
    assert failure_kind(PluginRefusal("bad")) is K.BAD_INPUT


def test_kinds_are_their_metric_names() -> None:
    assert K.GYM_UNAVAILABLE == "gym_unavailable"
    assert f"checkpoint/{K.SNAPSHOT_IO}_total" == "checkpoint/snapshot_io_total"
    assert str(K.TRAINER_FILES) == "trainer_files"


def test_failure_kind_looks_at_the_error_itself_only() -> None:
    wrapped = GymCheckpointUnavailable("commit failed")
    wrapped.__cause__ = ValueError("unknown")
    assert failure_kind(wrapped) is K.GYM_UNAVAILABLE
    assert failure_kind(ExceptionGroup("x", [CheckpointInvariantError("y")])) is K.UNKNOWN


def test_topology_mismatch_is_refused_input_and_aborts_a_checkpoint() -> None:
    mismatch = TopologyMismatch(["gym-1: missing"])
    assert failure_kind(mismatch) is K.BAD_INPUT
    assert run_exit(ExceptionGroup("run", [mismatch])) == (ExitCode.BAD_INPUT, mismatch)
    # a checkpoint cannot prove it changed nothing: not retryable, so the run aborts
    assert classify(mismatch) is K.INVARIANT
    assert classify(ExceptionGroup("x", [GymInstanceDead("gym-0"), mismatch])) is K.INVARIANT


def test_checkpoint_classification_over_causes_and_groups() -> None:
    assert classify(TrainerFilesRefused("trainer/x: a fifo")) is K.TRAINER_FILES
    nested = ExceptionGroup("x", [TrainerFilesRefused("trainer/x")])
    assert classify(nested) is K.INVARIANT
    disk = OSError(errno.ENOSPC, "full")
    assert classify(ExceptionGroup("x", [GymInstanceDead("gym-0"), disk])) is K.SNAPSHOT_IO
    assert classify(ExceptionGroup("x", [GymInstanceDead("gym-0")])) is K.GYM_UNAVAILABLE
    for not_retryable in (
        CheckpointsFailed("x"),
        Preempted("SIGTERM", 0, None, "p"),
        GymConnectionLost("gone", "a"),
    ):
        assert classify(not_retryable) is K.INVARIANT


def test_every_kind_that_ends_a_run_has_one_exit_code() -> None:
    assert set(EXIT_CODES) == set(K) - {K.SNAPSHOT_IO, K.UNKNOWN}
    for error, kind in EVERY_ERROR:
        got = run_failure(ExceptionGroup("run", [error]))
        if kind in EXIT_CODES:
            assert got == (kind, error)
            assert run_exit(error) == (EXIT_CODES[kind], error)
        else:
            assert got is None and run_exit(error) is None


def test_run_failure_precedence_between_kinds() -> None:
    dead, failed = GymInstanceDead("gym-0"), CheckpointsFailed("x")
    invariant, lost = CheckpointInvariantError("y"), GymConnectionLost("gone", "a")
    exhausted = [BudgetExhausted("first"), BudgetExhausted("last")]
    assert run_failure(ExceptionGroup("r", [dead, failed])) == (K.CHECKPOINTS_FAILED, failed)
    assert run_failure(ExceptionGroup("r", [dead, lost, invariant])) == (K.INVARIANT, invariant)
    assert run_failure(ExceptionGroup("r", [dead, lost])) == (K.CLUSTER_LOST, lost)
    assert run_failure(ExceptionGroup("r", [dead, *exhausted])) == (K.DATA_FAILURES, exhausted[-1])
    two_refusals = ExceptionGroup("r", [ManifestError("a"), ManifestError("b")])
    assert run_failure(two_refusals) is None
    preempted = Preempted("SIGTERM", 3, None, "p")
    assert run_failure(ExceptionGroup("r", [preempted, ValueError("x")])) is None
