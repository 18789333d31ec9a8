"""The "Gym is unavailable" error family, the process-boundary helper, and ``classify``."""

from __future__ import annotations

import pickle
import threading

import pytest
import trio
import trio.testing

from gymckpt.nurseries._calls import bounded_call, classify
from gymckpt.runtime import (
    CheckpointInvariantError,
    DrainTimeout,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymControlError,
    GymInstanceDead,
    GymUnavailable,
    RuntimeConfig,
    TopologyMismatch,
)
from gymckpt.runtime.lowlevel import crossable_error, crossing_boundary

CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0, lease_s=30.0)


class Unpicklable(RuntimeError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def test_every_gym_unavailable_error_is_one_family() -> None:
    family = [
        GymControlError("gym-0", "prepare", "refused"),
        GymInstanceDead("gym-0", "commit"),
        GymCheckpointUnavailable("lease lost", "gym-0", "commit"),
        GymCallTimeout("instance gym-0 did not answer prepare", "gym-0", "prepare"),
        DrainTimeout(["r-1"], 1.0),
    ]
    for exc in family:
        assert isinstance(exc, GymUnavailable)
        assert classify(exc) == "gym_unavailable"
    assert isinstance(family[3], TimeoutError)


def test_classify_is_a_type_check_over_the_cause_chain() -> None:
    class PluginOutage(GymUnavailable):
        """A backend's own unavailable error: retryable without being listed anywhere."""

    assert classify(PluginOutage("restarting")) == "gym_unavailable"
    assert classify(TimeoutError("some other clock")) == "invariant"
    assert classify(ValueError("bad reply")) == "invariant"
    wrapped = GymCheckpointUnavailable("commit failed")
    wrapped.__cause__ = ValueError("unknown")
    assert classify(wrapped) == "invariant"
    group = ExceptionGroup("x", [GymInstanceDead("gym-0"), TopologyMismatch(["gym-1: gone"])])
    assert classify(group) == "invariant"
    assert classify(ExceptionGroup("x", [GymInstanceDead("gym-0"), PluginOutage()])) == (
        "gym_unavailable"
    )


def test_crossable_error_replaces_only_what_cannot_be_pickled() -> None:
    ok = GymControlError("gym-0", "prepare", "refused")
    assert crossable_error(ok, "gym-0", "prepare") is ok
    bad = Unpicklable("gym state lock")
    with pytest.raises(TypeError):
        pickle.dumps(bad)
    replaced = crossable_error(bad, "gym-1", "commit")
    assert isinstance(replaced, GymCheckpointUnavailable)
    assert (replaced.instance, replaced.operation) == ("gym-1", "commit")
    assert "cannot be pickled" in str(replaced) and "Unpicklable" in str(replaced)
    assert pickle.loads(pickle.dumps(replaced)).args == replaced.args


def test_crossing_boundary_keeps_a_picklable_error_and_its_cause() -> None:
    cause = ValueError("root")
    with pytest.raises(CheckpointInvariantError) as info, crossing_boundary("gym-0", "commit"):
        raise CheckpointInvariantError("owner mismatch") from cause
    assert info.value.__cause__ is cause

    with pytest.raises(GymCheckpointUnavailable) as replaced, crossing_boundary("gym-0", "run"):
        raise Unpicklable("gym state lock")
    assert replaced.value.__cause__ is None and replaced.value.__suppress_context__


async def test_bounded_call_timeout_names_the_instance_and_is_retryable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hang(deadline: float) -> None:
        await trio.sleep_forever()

    t0 = trio.current_time()
    with pytest.raises(GymCallTimeout, match="instance gym-2 did not answer prepare") as info:
        await bounded_call("gym-2", "prepare", hang, CONFIG)
    assert trio.current_time() - t0 == pytest.approx(2.5)
    assert (info.value.instance, info.value.operation) == ("gym-2", "prepare")
    assert classify(info.value) == "gym_unavailable"


async def test_bounded_call_replaces_an_unpicklable_error() -> None:
    async def broken(deadline: float) -> None:
        raise Unpicklable("gym state lock")

    with pytest.raises(GymCheckpointUnavailable, match="gym-0 commit: Gym raised an error"):
        await bounded_call("gym-0", "commit", broken, CONFIG)


async def test_bounded_call_turns_a_backends_plain_timeout_into_a_gym_call_timeout() -> None:
    async def slow_backend(deadline: float) -> None:
        raise TimeoutError("no reply from the environment server")

    with pytest.raises(GymCallTimeout, match="instance gym-1 commit: no reply") as info:
        await bounded_call("gym-1", "commit", slow_backend, CONFIG)
    assert classify(info.value) == "gym_unavailable"
