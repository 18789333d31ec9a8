"""The JSON wire form: every record and error that crosses a process round-trips exactly, and
malformed input is refused with an error naming what is wrong."""

from __future__ import annotations

import inspect
import pickle
from types import ModuleType
from typing import Any

import attrs
import pytest

import gymckpt.runtime as runtime
from gymckpt.gym_adapter import (
    AgentSession,
    AttachReply,
    CommitReply,
    Completed,
    EnvironmentSpecError,
    ExportedEpisode,
    Failed,
    FaultSpec,
    GymStatistics,
    HostConfig,
    HostStatistics,
    InstanceInventory,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    Refused,
    RestoreReply,
    RetainedSession,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
    _contract,
)
from gymckpt.gym_adapter.transports import _admission as _transport_admission
from gymckpt.gym_adapter.transports import _deadlines as _transport_deadlines
from gymckpt.gym_adapter.transports import _statistics
from gymckpt.gym_adapter.transports._admission import ReplyBatch, RunShape, admission_header
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports._wire import (
    WIRE_ERRORS,
    WIRE_RECORDS,
    WireError,
    WireFormatError,
    decode,
    decode_error,
    encode,
    encode_error,
)
from gymckpt.runtime import (
    DrainTimeout,
    EpisodeRecord,
    GymAdmissionClosed,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    GymControlError,
    GymInstanceDead,
    GymInUse,
    GymUnavailable,
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    StrandedSessionError,
    TopologyMismatch,
    TrainerTerm,
)


def _host_stats(name: str, dead: bool = False) -> HostStatistics:
    counts = {f.name: i for i, f in enumerate(attrs.fields(HostStatistics)) if f.type == "int"}
    return HostStatistics(
        instance=name,
        dead=dead,
        admission_open=not dead,
        prepared=False,
        counters={"mutations": 3},
        **counts,
    )


_COMPLETED = Completed("r0-0-a0", 0.5, 3, {"trajectory": [1, "two", None, {"k": 1.5}]})
_FAILED = Failed("r0-1-a0", "data", "bad turn")
_REFUSED = Refused("r0-2-a0")
_TERM = TrainerTerm("0123456789abcdef0123456789abcdef", 4, "/work/run")

SAMPLES: dict[type, Any] = {
    RunRow: RunRow("r1-0-a1", 1, 0, 1, restored_from="r1-0-a0"),
    Completed: _COMPLETED,
    Failed: _FAILED,
    Refused: _REFUSED,
    ReplyBatch: ReplyBatch(3, (_COMPLETED, _FAILED, _REFUSED)),
    RunShape: RunShape(drop_after=4),
    ParticipantInfo: ParticipantInfo("calendar", "environment", "gym-0/calendar", "ab12"),
    ExportedEpisode: ExportedEpisode("r2-0-a0", "calendar", ("k1", "k2")),
    AgentSession: AgentSession("r2-0-a0", "agent", "legacy_agent", 4, ("k1",)),
    PrepareReply: PrepareReply("gym-0", "ckpt-1", 3, 2),
    CommitReply: CommitReply(
        "gym-0",
        "ckpt-1",
        (ParticipantInfo("agent", "simple_agent", "gym-0/agent", "d1"),),
        (ExportedEpisode("r2-0-a0", "agent"),),
        ("r0-0-a0",),
        (AgentSession("r2-0-a0", "agent", "legacy_agent", None),),
    ),
    RetireReply: RetireReply("gym-0", ("a", "b"), ("c",)),
    RestoreReply: RestoreReply("gym-1", ("r2-0-a0",)),
    TrainerTerm: _TERM,
    AttachReply: AttachReply("gym-0", True, _TERM, 3, 5, "run-0002"),
    InstanceTopology: InstanceTopology("gym-0", (("agent", "simple_agent"), ("calendar", "env"))),
    Topology: Topology((InstanceTopology("gym-0", (("agent", "simple_agent"),)),)),
    InstanceInventory: InstanceInventory("gym-0", False, True, ("a",), ("b",), (), ("c",), 1),
    ParticipantRecord: ParticipantRecord("calendar", "environment", "gym-0/calendar", "ab"),
    InstanceRecord: InstanceRecord(
        "gym-0", (ParticipantRecord("calendar", "environment", "gym-0/calendar", "ab"),)
    ),
    EpisodeRecord: EpisodeRecord("r2-0-a0", "calendar", "gym-0", ("k",)),
    HostConfig: HostConfig(lease_s=5.0, max_batch=7, freeze_survivors=False),
    HostStatistics: _host_stats("gym-0"),
    RetainedSession: RetainedSession("2-0", "r2-0-a0", 0, {"events": [{"turn": 1}]}),
    GymStatistics: GymStatistics(
        (_host_stats("gym-0"), _host_stats("gym-1", dead=True)),
        (("prepare:hang@1", 1),),
        (_host_stats("gym-1"),),
    ),
    FaultSpec: FaultSpec("prepare", "delay", 2, 0.25),
    WireDeadline: WireDeadline(1.5, 1_700_000_000.25),
    WireError: WireError("GymInstanceDead", ("gym-0", "run")),
}

ERROR_SAMPLES: list[Exception] = [
    GymCheckpointUnavailable("could not park", "gym-0", "prepare"),
    GymControlError("gym-0", "retire", "checkpoint open"),
    GymInstanceDead("gym-1", "run"),
    GymCallTimeout("instance gym-0 did not answer", "gym-0", "commit"),
    GymConnectionLost("lost the cluster", "127.0.0.1:6379"),
    GymAdmissionClosed("r0-0-a0", "gym-0"),
    DrainTimeout(["r1", "r0"], 2.5),
    StrandedSessionError("gym-0", ["r3", "r1"]),
    TopologyMismatch(["gym-0: agent kind simple_agent expected, legacy_agent found"]),
    ManifestError("manifest: version 9 unsupported"),
    GymInUse("gym-0", "attach", "the instance serves another training run"),
    EnvironmentSpecError("agent has no step"),
]


def _attrs_classes(module: ModuleType) -> set[type]:
    return {
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if attrs.has(obj) and obj.__module__ == module.__name__
    }


def test_every_crossing_record_has_a_wire_form_and_a_sample() -> None:
    crossing = set().union(
        *(
            _attrs_classes(m)
            for m in (_contract, _statistics, _transport_admission, _transport_deadlines)
        )
    )
    crossing |= {
        ParticipantRecord,
        InstanceRecord,
        EpisodeRecord,
        HostStatistics,
        RetainedSession,
        HostConfig,
        FaultSpec,
    }
    missing = crossing - set(WIRE_RECORDS)
    assert not missing, f"records without a wire form: {sorted(c.__name__ for c in missing)}"
    assert set(SAMPLES) == set(WIRE_RECORDS)


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.__name__)
def test_record_round_trips_exactly(cls: type) -> None:
    sample = SAMPLES[cls]
    data = encode(sample)
    assert isinstance(data, bytes)
    back = decode(data, cls)
    assert back == sample and type(back) is cls
    assert encode(back) == data


def test_run_replies_cross_tagged_by_class() -> None:
    replies = (_COMPLETED, _FAILED, _REFUSED)
    data = encode(replies, tuple[RunReply, ...])
    back = decode(data, tuple[RunReply, ...])
    assert back == replies
    assert [type(r) for r in back] == [Completed, Failed, Refused]
    assert decode(encode(_FAILED, RunReply), RunReply) == _FAILED
    assert decode(encode(admission_header()), ReplyBatch).is_header


def test_every_unavailable_error_and_topology_mismatch_has_a_wire_form() -> None:
    family = {
        obj
        for obj in vars(runtime).values()
        if isinstance(obj, type) and issubclass(obj, GymUnavailable) and obj is not GymUnavailable
    }
    assert family | {TopologyMismatch} <= {cls for cls, _ in WIRE_ERRORS.values()}
    assert {type(e) for e in ERROR_SAMPLES} == {cls for cls, _ in WIRE_ERRORS.values()}


@pytest.mark.parametrize("exc", ERROR_SAMPLES, ids=lambda e: type(e).__name__)
def test_error_round_trips_as_its_class(exc: Exception) -> None:
    back = decode_error(encode_error(exc, "gym-0", "commit"))
    assert type(back) is type(exc)
    assert back.args == exc.args and str(back) == str(exc)
    assert vars(back) == vars(exc)


def test_an_error_without_a_wire_form_crosses_as_gym_checkpoint_unavailable() -> None:
    class Private(RuntimeError):
        pass

    for exc in (KeyError("slot"), Private("lock held"), GymControlError("i", "o", object())):  # type: ignore[arg-type]
        back = decode_error(encode_error(exc, "gym-2", "retire"))
        assert type(back) is GymCheckpointUnavailable
        assert (back.instance, back.operation) == ("gym-2", "retire")
        assert type(exc).__name__ in str(back)
        assert pickle.loads(pickle.dumps(back)).args == back.args


@pytest.mark.parametrize(
    ("data", "cls", "expected"),
    [
        (b"{", RunRow, "not valid JSON"),
        (b'{"rollout_id": 1, "row": 1, "slot": 0, "attempt": 0}', RunRow, "rollout_id"),
        (b'{"rollout_id": "r", "row": true, "slot": 0, "attempt": 0}', RunRow, "row"),
        (b'{"rollout_id": "r", "row": 1, "slot": 0}', RunRow, "attempt"),
        (b'{"rollout_id": "r", "row": 1, "slot": 0, "attempt": 0, "x": 1}', RunRow, "x"),
        (
            b'{"rollout_id": "r", "failure_class": "disk", "message": "m", "type": "Failed"}',
            RunReply,
            "failure_class",
        ),
        (b'{"rollout_id": "r", "type": "Exploded"}', RunReply, "Exploded"),
        (b'{"op": "prepare", "kind": "explode", "nth": null, "arg": null}', FaultSpec, "explode"),
        (b'{"remaining_s": 1.0, "sent_wall": "now"}', WireDeadline, "sent_wall"),
        (b'{"seq": -1, "replies": []}', ReplyBatch, "seq"),
    ],
)
def test_malformed_input_is_refused_naming_the_problem(
    data: bytes, cls: Any, expected: str
) -> None:
    with pytest.raises(WireFormatError, match=expected):
        decode(data, cls)


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (WireError("SystemExit", ("bye",)), "unknown error class 'SystemExit'"),
        (WireError("GymInstanceDead", ("gym-0",)), "1 arguments, expected 2"),
        (WireError("GymInstanceDead", ("gym-0", 3)), "GymInstanceDead"),
        (WireError("DrainTimeout", (["r1"], "soon")), "DrainTimeout"),
    ],
)
def test_malformed_errors_are_refused(wire: WireError, expected: str) -> None:
    with pytest.raises(WireFormatError, match=expected):
        decode_error(encode(wire))


def test_a_value_without_a_json_form_is_refused_on_encode() -> None:
    with pytest.raises(WireFormatError, match="Completed"):
        encode(Completed("r", 1.0, 1, payload=object()))
