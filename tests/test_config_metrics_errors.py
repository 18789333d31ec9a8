"""RuntimeConfig invariants, Metrics, and that every runtime error pickles unchanged."""

from __future__ import annotations

import inspect
import pickle

import pytest

from gymckpt.runtime import ADMISSION_CLOSED_ROWS, Metrics, RuntimeConfig, _errors

# -- config ------------------------------------------------------------------------------------


def test_config_defaults_are_valid() -> None:
    config = RuntimeConfig()
    assert config.control_timeout_s + config.reply_grace_s < config.lease_s
    assert config.drain_timeout_s < config.lease_s


@pytest.mark.parametrize(("timeout", "grace"), [(59.0, 1.0), (60.0, 0.0), (50.0, 20.0)])
def test_control_call_must_fit_in_lease(timeout: float, grace: float) -> None:
    with pytest.raises(ValueError) as info:
        RuntimeConfig(control_timeout_s=timeout, reply_grace_s=grace, lease_s=60.0)
    message = str(info.value)
    assert "control_timeout_s" in message
    assert "reply_grace_s" in message
    assert "lease_s" in message


def test_drain_must_fit_in_lease() -> None:
    with pytest.raises(ValueError) as info:
        RuntimeConfig(drain_timeout_s=60.0, lease_s=60.0)
    assert "drain_timeout_s" in str(info.value) and "lease_s" in str(info.value)


def test_config_rejects_non_positive_knobs() -> None:
    with pytest.raises(ValueError, match="'control_timeout_s' must be > 0"):
        RuntimeConfig(control_timeout_s=0.0)
    with pytest.raises(ValueError, match="'reply_grace_s' must be >= 0"):
        RuntimeConfig(reply_grace_s=-1.0)


def test_backoff_is_exponential_and_capped() -> None:
    config = RuntimeConfig(infra_backoff_initial_s=0.5, infra_backoff_max_s=3.0)
    assert [config.backoff_s(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_stays_capped_after_thousands_of_failures() -> None:
    """An outage of many episodes counts a failure per reply: past 1025 failures the doubling
    overflowed a float (``OverflowError`` out of the dispatcher, an unclassified crash; found
    by the simulation, seed 89 with a 330 s model-server outage)."""
    config = RuntimeConfig()
    assert config.backoff_s(1025) == config.backoff_s(10**6) == config.infra_backoff_max_s


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_snapshot() -> None:
    metrics = Metrics()
    metrics.inc(ADMISSION_CLOSED_ROWS)
    metrics.inc(ADMISSION_CLOSED_ROWS, 2)
    metrics.set("checkpoint/drain_pending", 7)
    metrics.set("checkpoint/drain_pending", 3)
    snap = metrics.snapshot()
    assert snap == {
        "rollout/gym_admission_closed_rows_total": 3.0,
        "checkpoint/drain_pending": 3.0,
    }
    snap["checkpoint/drain_pending"] = 99.0  # a copy: the registry is unchanged
    assert metrics.get("checkpoint/drain_pending") == 3.0
    assert metrics.get("checkpoint/unknown") == 0.0


def test_metric_names_are_validated() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="must start with"):
        metrics.inc("gym_admission_closed_rows_total")
    with pytest.raises(ValueError, match="must start with"):
        metrics.set("drain_pending", 1.0)
    with pytest.raises(ValueError, match="cannot decrease"):
        metrics.inc(ADMISSION_CLOSED_ROWS, -1)
    assert metrics.snapshot() == {}


# -- errors ------------------------------------------------------------------------------------

SAMPLE_ARGS: dict[str, tuple[object, ...]] = {
    "BadInput": ("gymckpt refused its input",),
    "Preempted": ("SIGTERM", 5, "/w/snapshots/ckpt-000004", "gymckpt: SIGTERM: stopped"),
    "GymAdmissionClosed": ("r-1-0-1", "gym-0"),
    "GymUnavailable": ("gym-0 is restarting",),
    "GymCheckpointUnavailable": ("lease lost", "gym-1", "commit"),
    "GymControlError": ("gym-0", "prepare", "checkpoint c-1 reopened before it parked"),
    "GymInstanceDead": ("gym-1", "commit"),
    "GymCallTimeout": ("instance gym-0 did not answer prepare within 2s", "gym-0", "prepare"),
    "GymConnectionLost": (
        "lost the Ray cluster: its GCS at 10.0.0.1:6379 has not answered",
        "10.0.0.1:6379",
    ),
    "CheckpointInvariantError": ("owner mismatch",),
    "DrainTimeout": (("r-2", "r-1", "r-3"), 2.5),
    "StrandedSessionError": ("gym-0", ("s-1", "s-2")),
    "ManifestError": ("gym_checkpoint.json: file is empty",),
    "TrainerFilesRefused": ("trainer/weights: a link to a directory",),
    "DatasetError": ("dataset[12].prompt is nan",),
    "DatasetMismatch": ("row 1 differs: snapshot 0a1b..., dataset 9f8e...",),
    "TopologyMismatch": (("instance gym-2: missing from the live deployment",),),
    "DeadlineExpired": ("row-1", "generate", 3.0),
    "BudgetExhausted": ("row 4 ran out of attempts",),
    "EpisodeConfigFailed": ("4-0", "gym-0", "the model server refuses 'return_token_ids'"),
    "CheckpointsFailed": ("3 consecutive failures",),
    "WorkDirLocked": ("/data/work", 4242),
    "GymInUse": ("gym-0", "attach", "the instance serves another training run"),
    "ReplacementsExhausted": ("gym-2", 3, 600.0, "instance gym-2 replace: not serving"),
    "InfraOutage": ("gym instance gym-1", 301.5, 300.0, "died: instance gym-1 is dead"),
    "InstanceDirLocked": ("/data/gym-live/gym-0", 4242),
}


def _error_classes() -> list[type[BaseException]]:
    return [
        obj
        for name in _errors.__all__
        if inspect.isclass(obj := getattr(_errors, name)) and issubclass(obj, BaseException)
    ]


def test_every_error_class_has_sample_args() -> None:
    assert {cls.__name__ for cls in _error_classes()} == set(SAMPLE_ARGS)


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_errors_round_trip_through_pickle(cls: type[BaseException]) -> None:
    exc = cls(*SAMPLE_ARGS[cls.__name__])
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is cls
    assert str(clone) == str(exc)
    assert clone.args == exc.args
    assert vars(clone) == vars(exc)


def test_classify_unknown_errors_are_invariants_and_io_errors_retryable() -> None:
    from gymckpt.gym_adapter import GymControlError, GymInstanceDead
    from gymckpt.nurseries._calls import classify
    from gymckpt.runtime import CheckpointInvariantError, GymCallTimeout, GymCheckpointUnavailable

    assert classify(RuntimeError("reply from another protocol version")) == "invariant"
    assert classify(KeyError("episodes")) == "invariant"
    assert classify(GymControlError("gym-0", "commit", "x")) == "gym_unavailable"
    assert classify(OSError(28, "No space left on device")) == "snapshot_io"
    assert classify(GymCallTimeout("gym-1 did not answer", "gym-1", "prepare")) == (
        "gym_unavailable"
    )
    # a bare TimeoutError is not ours to retry; bounded_call turns a backend's into the above
    assert classify(TimeoutError("gym-1 did not answer")) == "invariant"
    both = ExceptionGroup("commit", [GymInstanceDead("gym-0"), ValueError("bad reply")])
    assert classify(both) == "invariant"
    wrapped = GymCheckpointUnavailable("x")
    wrapped.__cause__ = CheckpointInvariantError("owned twice")
    assert classify(wrapped) == "invariant"


def test_exit_codes_of_the_errors_that_end_a_run() -> None:
    from gymckpt.app.demo.main import run_exit
    from gymckpt.gym_adapter import GymInstanceDead
    from gymckpt.nurseries import ExitCode
    from gymckpt.runtime import (
        CheckpointInvariantError,
        CheckpointsFailed,
        GymConnectionLost,
        GymInUse,
        ManifestError,
    )

    def code(exc: BaseException) -> int | None:
        got = run_exit(exc)
        return None if got is None else got[0]

    assert code(ExceptionGroup("run", [CheckpointInvariantError("x")])) == 3
    both = ExceptionGroup("run", [CheckpointsFailed("x"), CheckpointInvariantError("y")])
    assert code(both) == 3
    assert code(CheckpointsFailed("3 in a row")) == 4
    assert code(ExceptionGroup("run", [GymInstanceDead("gym-0")])) == 4
    assert code(ManifestError("ledger.json: bad")) == 2
    assert code(GymInUse("gym-0", "attach", "another training run holds it")) == 2
    assert code(ZeroDivisionError()) is None
    lost = GymConnectionLost("lost the Ray cluster", "10.0.0.1:6379")
    assert code(lost) == ExitCode.CLUSTER_LOST == 6
    # whatever failed with it (instances unreachable, checkpoints failing) was the cluster going
    assert code(ExceptionGroup("run", [CheckpointsFailed("x"), lost])) == 6
    assert code(ExceptionGroup("run", [CheckpointInvariantError("y"), lost])) == 3
