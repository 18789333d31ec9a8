"""Error translation: transport failures become the GymUnavailable family; Gym's own errors
cross as themselves when they can."""

from __future__ import annotations

import threading

import pytest

from gymckpt.gym_adapter.transports._errors import (
    TransportFailure,
    first_line,
    remote_error,
    transport_error,
)
from gymckpt.runtime import (
    GymCheckpointUnavailable,
    GymControlError,
    GymInstanceDead,
    GymUnavailable,
    TopologyMismatch,
)


def _translate(failure: TransportFailure, exc: BaseException) -> Exception:
    return transport_error(failure, "gym-1", "commit", exc, transport="Ray", peer="actor")


def test_a_gone_instance_is_dead() -> None:
    err = _translate(TransportFailure.GONE, RuntimeError("actor died"))
    assert type(err) is GymInstanceDead
    assert (err.instance, err.operation) == ("gym-1", "commit")


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (TransportFailure.UNREACHABLE, "gym-1 commit: actor unavailable (node down)"),
        (TransportFailure.CANCELLED, "gym-1 commit: the Ray call was cancelled"),
        (TransportFailure.BROKEN, "gym-1 commit: OSError: node down"),
    ],
)
def test_other_transport_failures_are_retryable_and_name_the_call(
    failure: TransportFailure, expected: str
) -> None:
    err = _translate(failure, OSError("node down\nmore detail"))
    assert type(err) is GymCheckpointUnavailable and isinstance(err, GymUnavailable)
    assert expected in str(err)
    assert (err.instance, err.operation) == ("gym-1", "commit")


def test_gym_errors_cross_as_themselves_when_they_can() -> None:
    control = GymControlError("gym-1", "commit", "no")
    assert remote_error(control, "x", "gym-1", "commit") is control
    mismatch = TopologyMismatch(["a"])
    assert remote_error(mismatch, "x", "gym-1", "commit") is mismatch


def test_an_error_that_cannot_cross_is_replaced() -> None:
    class Locked(RuntimeError):
        def __init__(self) -> None:
            super().__init__("locked")
            self.lock = threading.Lock()

    err = remote_error(Locked(), "Locked: locked", "gym-1", "commit")
    assert type(err) is GymCheckpointUnavailable and "cannot be pickled" in str(err)
    lost = remote_error(None, "Unserialisable: gym state", "gym-1", "commit")
    assert type(lost) is GymCheckpointUnavailable and "Unserialisable" in str(lost)


def test_first_line() -> None:
    assert first_line(ValueError("one\ntwo")) == "one"
    assert first_line(ValueError()) == "ValueError"
