"""Ray's errors, classified and translated (no cluster needed: the errors are built here)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("ray")

from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    NodeDiedError,
    ObjectLostError,
    RaySystemError,
    RayTaskError,
    TaskCancelledError,
)

from gymckpt.gym_adapter.transports._incarnations import Incarnations
from gymckpt.gym_adapter.transports.ray._errors import actor_gone, stream_ends, translate
from gymckpt.runtime import (
    GymCheckpointUnavailable,
    GymControlError,
    GymInstanceDead,
    TopologyMismatch,
)


def _task_error(cause: BaseException) -> RayTaskError:
    return RayTaskError("GymActor.control", "Traceback …", cause)


def test_a_dead_actor_or_node_is_gone_an_unavailable_one_is_not() -> None:
    assert actor_gone(ActorDiedError()) and actor_gone(NodeDiedError("node 1 died"))
    assert not actor_gone(ActorUnavailableError("unreachable", None))
    assert not actor_gone(TaskCancelledError())
    assert stream_ends(ActorUnavailableError("unreachable", None))
    assert stream_ends(ObjectLostError("ab" * 14, None, "")) and stream_ends(TaskCancelledError())
    assert not stream_ends(_task_error(ValueError("x")))


def test_a_gone_actor_marks_its_own_incarnation_dead_only() -> None:
    gens = Incarnations.of(["gym-0"])
    new = gens.begin_replacement("gym-0")
    gens.installed("gym-0", new)
    err = translate(gens, "gym-0", "commit", ActorDiedError(), incarnation=0)  # the old one
    assert type(err) is GymInstanceDead and not gens.is_dead("gym-0")
    translate(gens, "gym-0", "commit", ActorDiedError(), incarnation=new)
    assert gens.is_dead("gym-0")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            ActorUnavailableError("node unreachable", None),
            "actor unavailable (The actor None is unavailable: node",
        ),
        (TaskCancelledError(), "the Ray call was cancelled"),
        (RaySystemError("gcs down"), "RaySystemError"),
    ],
)
def test_other_ray_failures_are_retryable(exc: BaseException, expected: str) -> None:
    gens = Incarnations.of(["gym-1"])
    err = translate(gens, "gym-1", "prepare", exc, incarnation=0)
    assert type(err) is GymCheckpointUnavailable and expected in str(err)
    assert not gens.is_dead("gym-1")


def test_a_gym_error_carried_by_ray_crosses_as_itself() -> None:
    gens = Incarnations.of(["gym-0"])
    for cause in (GymControlError("gym-0", "retire", "open"), TopologyMismatch(["x"])):
        err = translate(gens, "gym-0", "retire", _task_error(cause), incarnation=0)
        assert err is cause


def test_a_gym_error_that_cannot_cross_is_replaced() -> None:
    class Locked(RuntimeError):
        def __init__(self) -> None:
            super().__init__("state lock")
            self.lock = threading.Lock()

    gens = Incarnations.of(["gym-0"])
    err = translate(gens, "gym-0", "commit", _task_error(Locked()), incarnation=0)
    assert type(err) is GymCheckpointUnavailable and "cannot be pickled" in str(err)
    nested = translate(gens, "gym-0", "commit", _task_error(TaskCancelledError()), incarnation=0)
    assert type(nested) is GymCheckpointUnavailable and "cannot be pickled" in str(nested)


def test_an_error_that_is_not_ray_s_passes_through() -> None:
    exc = KeyError("x")
    assert translate(Incarnations.of(["gym-0"]), "gym-0", "run", exc, incarnation=0) is exc
