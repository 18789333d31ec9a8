"""The Gym contract's own behaviour (``gym_adapter._contract``): its value types are frozen and
compare by value with the documented defaults, ``Topology.names`` keeps topology order, the
runtime-checkable protocols recognise what implements them, ``can_replace`` asks only for a
callable ``replace``, and the errors are the runtime's own classes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from gymckpt import runtime
from gymckpt.gym_adapter import _contract
from gymckpt.gym_adapter._contract import (
    ADMISSION_CLOSED,
    AgentSession,
    CommitReply,
    Completed,
    ExportedEpisode,
    Failed,
    InstanceTopology,
    Refused,
    ReplaceableGym,
    ReplyStream,
    RetireReply,
    RunRow,
    Topology,
    can_replace,
)


def test_every_exported_name_resolves() -> None:
    for name in _contract.__all__:
        assert hasattr(_contract, name), name


def test_errors_are_the_runtimes_own_and_retryable() -> None:
    assert _contract.GymControlError is runtime.GymControlError
    assert _contract.GymInstanceDead is runtime.GymInstanceDead
    assert issubclass(_contract.GymControlError, runtime.GymUnavailable)
    assert issubclass(_contract.GymInstanceDead, runtime.GymUnavailable)
    assert str(_contract.GymInstanceDead("gym-0", "run")) == "instance gym-0 is dead (during run)"


def test_defaults() -> None:
    assert ADMISSION_CLOSED == "admission_closed"
    assert Refused("r").code == ADMISSION_CLOSED
    assert RunRow("r", 1, 2, 0).restored_from is None
    assert Completed("r", 1.0, 3).payload is None
    assert ExportedEpisode("r", "cal").capture_keys == ()
    assert AgentSession("r", "agent", "agent", None).capture_keys == ()
    assert CommitReply("gym-0", "c1", (), (), ()).sessions == ()
    assert RetireReply("gym-0", ("a",)).unknown == ()


@pytest.mark.parametrize(
    "value",
    [
        RunRow("r", 1, 2, 0),
        Completed("r", 1.0, 3),
        Failed("r", "infra", "boom"),
        Refused("r"),
        ExportedEpisode("r", "cal"),
        Topology((InstanceTopology("gym-0", (("cal", "environment"),)),)),
    ],
)
def test_values_are_frozen_and_compare_by_value(value: Any) -> None:
    field = attrs.fields(type(value))[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, field, "other")
    twin = attrs.evolve(value)
    assert twin == value and hash(twin) == hash(value)
    assert attrs.evolve(value, **{field: ()}) != value


def test_restored_row_names_what_it_claims() -> None:
    row = RunRow("3-1-a1", 3, 1, 1, restored_from="3-1-a0")
    assert row != RunRow("3-1-a1", 3, 1, 1)
    assert row.restored_from == "3-1-a0"


def test_topology_names_in_order() -> None:
    topo = Topology(
        (InstanceTopology("gym-1", ()), InstanceTopology("gym-0", (("cal", "environment"),)))
    )
    assert topo.names == ("gym-1", "gym-0")
    assert Topology(()).names == ()


class _Stream:
    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Sequence[Any]:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


class _NoClose:
    def __aiter__(self) -> _NoClose:
        return self

    async def __anext__(self) -> Sequence[Any]:
        raise StopAsyncIteration


def test_reply_stream_protocol_needs_aclose() -> None:
    assert isinstance(_Stream(), ReplyStream)
    assert not isinstance(_NoClose(), ReplyStream)


class _Backend:
    instances = ("gym-0",)

    async def topology(self) -> Any: ...
    async def run(self, instance: str, rows: Any) -> Any: ...
    async def prepare(self, *a: Any) -> Any: ...
    async def commit(self, *a: Any) -> Any: ...
    async def resume(self, *a: Any) -> Any: ...
    async def retire(self, *a: Any) -> Any: ...
    async def restore(self, *a: Any) -> Any: ...
    async def retire_restored(self, *a: Any) -> Any: ...
    async def inventory(self, instance: str) -> Any: ...


class _Replaceable(_Backend):
    async def replace(self, instance: str, deadline_ts: float) -> None: ...


def test_replaceable_protocol_and_can_replace() -> None:
    assert isinstance(_Replaceable(), ReplaceableGym)
    assert not isinstance(_Backend(), ReplaceableGym)
    assert can_replace(_Replaceable())
    assert not can_replace(_Backend())


def test_can_replace_wants_a_callable() -> None:
    class Attr:
        replace = None

    class Flag:
        replace = True

    assert not can_replace(Attr())
    assert not can_replace(Flag())
    assert not can_replace(object())
    assert can_replace(type("Lambda", (), {"replace": staticmethod(lambda *a: None)})())
