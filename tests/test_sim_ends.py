"""How a life of a simulated scenario ended (``ends``): told from the error that
stopped it, by the exit code it maps to; which ends are documented aborts, which violations."""

from __future__ import annotations

import pytest

from gymckpt.app.simulation.ends import (
    LifeEnd,
    failed_end,
    restore_may_retry,
    single_error,
)
from gymckpt.runtime import (
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    GymConnectionLost,
    GymInstanceDead,
    GymUnavailable,
    ManifestError,
    ReplacementsExhausted,
)


def group(*errors: Exception) -> ExceptionGroup[Exception]:
    return ExceptionGroup("nursery", list(errors))


@pytest.mark.parametrize(
    ("error", "opened", "end"),
    [
        (CheckpointsFailed("3 in a row"), True, LifeEnd.CHECKPOINTS_FAILED),
        (group(GymInstanceDead("gym-0", "run")), True, LifeEnd.GYM_DEAD),
        (GymUnavailable("restore: no"), False, LifeEnd.RESTORE_FAILED),
        (CheckpointsFailed("3 in a row"), False, LifeEnd.RESTORE_FAILED),
        (ReplacementsExhausted("gym-1", 3, 600.0), True, LifeEnd.REPLACEMENTS_EXHAUSTED),
    ],
)
def test_documented_aborts_are_ends_not_violations(
    error: Exception, opened: bool, end: LifeEnd
) -> None:
    failed = failed_end(error, opened=opened)
    assert failed.end is end and end.documented_abort
    assert failed.violation is None
    assert failed.error.startswith(f"{type(single_error(error)).__name__}: ")


@pytest.mark.parametrize(
    ("error", "end", "line"),
    [
        (
            group(CheckpointInvariantError("owner differs"), CheckpointsFailed("x")),
            LifeEnd.INVARIANT,
            "run aborted by an invariant violation: CheckpointInvariantError: owner differs",
        ),
        (
            ManifestError("bad key 'x'"),
            LifeEnd.BAD_SNAPSHOT,
            "our own snapshot was refused: ManifestError: bad key 'x'",
        ),
        (
            group(group(KeyError("k"))),
            LifeEnd.ERROR,
            "unexpected error KeyError: 'k'",
        ),
        (GymConnectionLost("gone", "gcs:6379"), LifeEnd.ERROR, "unexpected error"),
        (BudgetExhausted("row 3"), LifeEnd.ERROR, "unexpected error BudgetExhausted"),
    ],
)
def test_other_ends_are_violations_whatever_the_scenario(
    error: Exception, end: LifeEnd, line: str
) -> None:
    failed = failed_end(error, opened=True)
    assert failed.end is end and not end.documented_abort
    assert failed.violation is not None and failed.violation.startswith(line)


def test_an_end_reads_as_its_report_string() -> None:
    assert LifeEnd.CHECKPOINTS_FAILED == "checkpoints_failed"
    assert f"{LifeEnd.GYM_DEAD}" == "gym_dead"
    assert not LifeEnd.FINISHED.documented_abort
    assert not LifeEnd.CRASHED.documented_abort


def test_single_error_unwraps_single_groups_only() -> None:
    inner = ValueError("x")
    assert single_error(group(group(inner))) is inner
    two = group(inner, KeyError("y"))
    assert single_error(group(two)) is two


def test_only_a_restore_gym_could_not_serve_is_retried() -> None:
    assert restore_may_retry(group(GymUnavailable("restore: hang")))
    assert not restore_may_retry(CheckpointInvariantError("x"))
    assert not restore_may_retry(ValueError("x"))
