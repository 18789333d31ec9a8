"""The HTTP wire (``gymckpt-http/2``): every message round-trips exactly, in NeMo Gym 0.7.0's
episode shapes on ``/run`` (checked against the JSON schemas of the released package's models,
``tests/data/nemo_gym_0.7.0_episode_types.json``), and malformed bodies (bad JSON, unknown keys,
wrong types, NeMo Gym's own constraints) are refused with ``WireFormatError``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from gymckpt.gym_adapter._contract import (
    AttachReply,
    CommitReply,
    Completed,
    ExportedEpisode,
    Failed,
    InstanceInventory,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    Refused,
    RestoreReply,
    RetireReply,
    RunRow,
)
from gymckpt.gym_adapter._faults import FaultSpec
from gymckpt.gym_adapter.host._host import HostStatistics
from gymckpt.gym_adapter.host._views import RetainedSession
from gymckpt.gym_adapter.transports._admission import ReplyBatch, RunShape, admission_header
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports._wire import encode_error
from gymckpt.gym_adapter.transports.http._wire import (
    CONTROL_OPS,
    END_LINE,
    NEMO_GYM_VERSION,
    PROTOCOL,
    ControlRequest,
    Health,
    MuxLine,
    MuxOpenRequest,
    MuxRunRequest,
    Refusal,
    RunRequest,
    WireFormatError,
    decode_control_request,
    decode_error_body,
    decode_health,
    decode_mux_channel_line,
    decode_mux_line,
    decode_mux_open,
    decode_mux_run_request,
    decode_reply,
    decode_result,
    decode_run_request,
    decode_stream_line,
    encode_batch_line,
    encode_control_request,
    encode_health,
    encode_mux_batch_line,
    encode_mux_channel_line,
    encode_mux_end_line,
    encode_mux_open,
    encode_mux_run_request,
    encode_refusal,
    encode_result,
    encode_run_request,
    qualified_key,
    split_key,
)
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymAdmissionClosed,
    GymCallTimeout,
    GymInstanceDead,
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    StrandedSessionError,
    TopologyMismatch,
    TrainerTerm,
    rollout_id_for,
)

DEADLINE = WireDeadline(2.5, 1_700_000_000.5)
ROWS = (
    RunRow(rollout_id_for(3, 1, 0), 3, 1, 0, task={"prompt": "hi", "n": [1, 2]}, policy_version=7),
    RunRow(rollout_id_for(3, 1, 2), 3, 1, 2, restored_from=rollout_id_for(3, 1, 1)),
    RunRow("free-form", 9, 0, 0),
)
REPLIES = (
    Completed("3-1", 0.75, 4, {"trajectory": [1, "two", None]}),
    Failed("3-1-a2", "infra", "instance gym-0 is dead"),
    Failed("4-0", "data", "bad turn"),
    Refused("5-0-a1"),
)
REPLY_ROWS = {"3-1": 3, "3-1-a2": 3, "4-0": 4, "5-0-a1": 5}
"""The row of each reply's rollout (what the server's stream knows from its request)."""
NEMO = json.loads(
    (Path(__file__).parent / "data" / f"nemo_gym_{NEMO_GYM_VERSION}_episode_types.json").read_text()
)


def _host_stats() -> HostStatistics:
    import attrs

    counts = {f.name: i for i, f in enumerate(attrs.fields(HostStatistics)) if f.type == "int"}
    return HostStatistics(
        instance="gym-0",
        dead=False,
        admission_open=True,
        prepared=False,
        counters={"m": 1},
        **counts,
    )


RECORD = InstanceRecord("gym-0", (ParticipantRecord("cal", "environment", "gym-0/cal", "ab"),))
CONTROL_SAMPLES: dict[str, tuple[dict[str, Any], Any]] = {
    "prepare": (
        {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED, "alignment_timeout_s": 0.5},
        PrepareReply("gym-0", "c1", 2, 1),
    ),
    "commit": (
        {"checkpoint_id": "c1", "state_root": "snap/c1"},
        CommitReply(
            "gym-0",
            "c1",
            (ParticipantInfo("cal", "environment", "gym-0/cal", "ab"),),
            (ExportedEpisode("3-1", "cal", ("k",)),),
            ("4-0",),
        ),
    ),
    "resume": ({"checkpoint_id": "c1"}, None),
    "retire": ({"rollout_ids": ("3-1", "4-0")}, RetireReply("gym-0", ("3-1",), ("4-0",))),
    "retire_restored": ({"rollout_ids": ("3-1",)}, RetireReply("gym-0", ("3-1",))),
    "restore": (
        {
            "state_root": "snap/c1",
            "record": RECORD,
            "episodes": (EpisodeRecord("3-1", "cal", "gym-0", ("k",)),),
        },
        RestoreReply("gym-0", ("3-1",)),
    ),
    "attach": (
        {"trainer": TrainerTerm("0123456789abcdef0123456789abcdef", 2, "/work/run")},
        AttachReply("gym-0", True, TrainerTerm("0123456789abcdef0123456789abcdef", 1), 3, 4),
    ),
    "release": ({"trainer": TrainerTerm("0123456789abcdef0123456789abcdef", 2)}, None),
    "topology": ({}, InstanceTopology("gym-0", (("cal", "environment"),))),
    "inventory": ({}, InstanceInventory("gym-0", True, False, ("a",), (), (), ("b",), 0)),
    "statistics": ({}, _host_stats()),
    "retained_sessions": (
        {},
        {"cal": {"3-1": RetainedSession("3-1", "3-1-a2", 2, {"events": [1]})}},
    ),
    "ack": ({"sid": 4, "upto": 7}, None),
    "close_stream": ({"sid": 4, "upto": 0}, None),
}


def test_every_op_has_a_sample() -> None:
    assert set(CONTROL_SAMPLES) == set(CONTROL_OPS)


def test_attempt_keys_are_nemo_gyms() -> None:
    assert qualified_key("3-1", 0) == "3-1" == rollout_id_for(3, 1, 0)
    assert qualified_key("3-1", 2) == "3-1-a2" == rollout_id_for(3, 1, 2)
    for rid in ("3-1", "3-1-a2", "x-a0", "x-a01", "a", "-a5", "r0-0-a0"):
        assert qualified_key(*split_key(rid)) == rid
    assert split_key("3-1-a12") == ("3-1", 12)
    assert split_key("x-a0") == ("x-a0", 0)


def test_run_request_round_trips_in_nemo_shapes() -> None:
    req = RunRequest(5, {1: 3, 4: 0}, RunShape(drop_after=2), True, 16, ROWS)
    data = encode_run_request(req)
    back = decode_run_request(data)
    assert back == req
    assert encode_run_request(back) == data
    raw = orjson.loads(data)
    assert raw["acks"] == {"1": 3, "4": 0}
    first, second, _ = raw["rows"]
    assert first == {
        "episode_id": {"rollout_id": "3-1", "attempt": 0},
        "task": {
            "task_id": {"taskset": "gymckpt:rows", "task_id": "3"},
            "task_input": {"prompt": "hi", "n": [1, 2]},
        },
        "gymckpt": {"slot": 1, "restored_from": None, "policy_version": 7},
    }
    assert second["episode_id"] == {"rollout_id": "3-1", "attempt": 2}
    assert second["gymckpt"] == {"slot": 1, "restored_from": "3-1-a1", "policy_version": 0}


def test_a_nemo_gym_row_without_gymckpts_fields_runs_as_slot_0() -> None:
    """Our fields sit beside NeMo Gym's and are optional: its own request (no ``gymckpt``, no
    ``attempt``) decodes as attempt 0, slot 0, nothing restored, policy version 0."""
    row = {
        "episode_id": {"rollout_id": "7-0"},
        "task": {"task_id": {"taskset": "gymckpt:rows", "task_id": "7"}, "task_input": {"q": 1}},
    }
    req = decode_run_request(orjson.dumps(_run_body(rows=[row])))
    assert req.rows == (RunRow("7-0", 7, 0, 0, task={"q": 1}),)


def _validate(instance: Any, model: str) -> None:
    """``instance`` against the released model's JSON schema (``jsonschema``), and against its
    validators the schema cannot say (the fixture's ``validators_outside_the_schema``)."""
    jsonschema.validate(instance, NEMO["schemas"][model])
    if model in ("BaseEpisodeRequest", "BaseEpisodeResponse"):
        assert not re.search(r"-a[1-9][0-9]*$", instance["episode_id"]["rollout_id"]), instance
    if model == "BaseEpisodeResponse":
        assert ("result" in instance) != ("failure" in instance), instance
        assert instance.get("result", instance.get("failure")) is not None, instance


def test_rows_and_replies_are_nemo_gyms_released_shapes_field_for_field() -> None:
    """Every row and reply we send is valid against NeMo Gym 0.7.0's own models, with our
    fields only where theirs have no place: a row's one extra key ``gymckpt`` (their request
    forbids extra keys: it is taken off before the check, and must be all there is to take
    off), nothing extra in a reply. And the shapes are exactly theirs: a NeMo-valid row or
    reply with any key of theirs removed, renamed or flattened does not decode."""
    assert NEMO["source"]["package"] == "nemo_gym"
    assert NEMO["source"]["version"] == NEMO_GYM_VERSION == "0.7.0"
    assert PROTOCOL == "gymckpt-http/2"
    rows = [*ROWS, RunRow("0-0", 0, 0, 0, task={"prompt": "p"}, policy_version=2)]
    rows = [RunRow(r.rollout_id, r.row, r.slot, r.attempt, r.restored_from, {"t": i},
                   r.policy_version) for i, r in enumerate(rows)]  # fmt: skip
    raw_rows = orjson.loads(encode_run_request(RunRequest(1, {}, RunShape(), False, 8, rows)))
    for raw in raw_rows["rows"]:
        assert set(raw) == {"episode_id", "task", "gymckpt"}
        _validate({k: v for k, v in raw.items() if k != "gymckpt"}, "BaseEpisodeRequest")
        with pytest.raises(jsonschema.ValidationError):  # theirs has no place for ours
            _validate(raw, "BaseEpisodeRequest")
    long = Failed("6-0", "data", "x" * 5000)
    replies = (*REPLIES, long)
    line = encode_batch_line(ReplyBatch(1, replies), {**REPLY_ROWS, "6-0": 6})
    decoded = decode_stream_line(line)
    assert decoded is not None
    assert decoded.replies[:4] == REPLIES
    assert decoded.replies[4] == Failed("6-0", "data", "x" * 1999 + "\u2026")
    raw_replies = orjson.loads(line)["replies"]
    for raw in raw_replies:
        _validate(raw, "BaseEpisodeResponse")
        if "failure" in raw:
            _validate(raw["failure"], "EpisodeFailure")
            assert raw["failure"].get("stage", "agent") in NEMO["failure_stages"]
    completed, infra, data, refused, _ = raw_replies
    assert completed == {
        "episode_id": {"rollout_id": "3-1", "attempt": 0},
        "task_id": {"taskset": "gymckpt:rows", "task_id": "3"},
        "result": {"reward": 0.75, "turns": 4, "payload": {"trajectory": [1, "two", None]}},
    }
    assert infra == {
        "episode_id": {"rollout_id": "3-1", "attempt": 2},
        "task_id": {"taskset": "gymckpt:rows", "task_id": "3"},
        "failure": {
            "failure_reason": "instance gym-0 is dead",
            "terminal": False,
            "failure_kind": "gymckpt:infra",
        },
    }
    assert data["failure"] == {
        "failure_reason": "bad turn",
        "terminal": True,
        "failure_kind": "gymckpt:data",
        "stage": "agent",
    }
    assert refused["episode_id"] == {"rollout_id": "5-0", "attempt": 1}
    assert refused["failure"]["failure_kind"] == "gymckpt:admission_closed"
    assert (refused["failure"]["stage"], refused["failure"]["terminal"]) == ("admission", False)
    # the flat shapes of gymckpt-http/1 are not theirs, and do not decode
    flat_row = {"episode_id": {"rollout_id": "3-1", "attempt": 0}, "task_input": {"t": 0},
                "task_id": None, "gymckpt": {"row": 3, "slot": 1, "restored_from": None,
                                              "policy_version": 0}}  # fmt: skip
    with pytest.raises(jsonschema.ValidationError):
        _validate(flat_row, "BaseEpisodeRequest")
    with pytest.raises(WireFormatError):
        decode_run_request(orjson.dumps(_run_body(rows=[flat_row])))
    flat_reply = {"episode_id": {"rollout_id": "3-1", "attempt": 0}, "reward": 0.75, "turns": 4,
                  "payload": None}  # fmt: skip
    with pytest.raises(jsonschema.ValidationError):
        _validate(flat_reply, "BaseEpisodeResponse")
    with pytest.raises(WireFormatError):
        decode_stream_line(orjson.dumps({"seq": 1, "replies": [flat_reply]}))


def test_another_producers_failure_kind_is_classed_by_terminal() -> None:
    def reply(**failure: Any) -> bytes:
        body = {"episode_id": {"rollout_id": "1-0"},
                "task_id": {"taskset": "gymckpt:rows", "task_id": "1"},
                "failure": {"failure_reason": "r", **failure}}  # fmt: skip
        return orjson.dumps({"seq": 1, "replies": [body]})

    for failure, expect in (
        ({"terminal": True, "failure_kind": "agent_run_error"}, Failed("1-0", "data", "r")),
        ({"terminal": False, "failure_kind": "transport_timeout"}, Failed("1-0", "infra", "r")),
        ({"terminal": False}, Failed("1-0", "infra", "r")),
        ({"terminal": False, "failure_kind": "gymckpt:infra", "stage": None},
         Failed("1-0", "infra", "r")),
    ):  # fmt: skip
        batch = decode_stream_line(reply(**failure))
        assert batch is not None and batch.replies == (expect,), failure


def test_run_request_with_faulty_shape_round_trips() -> None:
    shape = RunShape(inject=FaultSpec("run", "delay", 2, 0.5))
    req = RunRequest(0, {}, shape, False, 1, ())
    assert decode_run_request(encode_run_request(req)) == req


def test_a_row_whose_key_does_not_name_its_attempt_cannot_be_sent() -> None:
    req = RunRequest(0, {}, RunShape(), False, 8, (RunRow("0-0", 0, 0, 1),))
    with pytest.raises(WireFormatError, match="-a1"):
        encode_run_request(req)


def test_batch_lines_round_trip_and_the_end_line_is_none() -> None:
    for batch in (admission_header(), ReplyBatch(1, REPLIES), ReplyBatch(2, (REPLIES[0],))):
        line = encode_batch_line(batch, REPLY_ROWS)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode_stream_line(line) == batch
        assert decode_stream_line(line.rstrip(b"\n")) == batch
    assert decode_stream_line(END_LINE) is None
    with pytest.raises(WireFormatError, match="did not submit"):
        encode_batch_line(ReplyBatch(1, REPLIES), {"3-1": 3})


@pytest.mark.parametrize("op", CONTROL_OPS)
def test_control_request_and_result_round_trip(op: str) -> None:
    args, result = CONTROL_SAMPLES[op]
    fault = FaultSpec("commit", "error", 1) if op == "commit" else None
    data = encode_control_request(op, deadline=DEADLINE, acks={2: 5}, fault=fault, args=args)
    req = decode_control_request(op, data)
    assert req == ControlRequest(DEADLINE, {2: 5}, fault, dict(args))
    out = encode_result(op, result)
    assert decode_result(op, out) == result
    assert orjson.loads(out).keys() == {"result"}


def test_views_need_no_deadline_control_ops_do() -> None:
    data = encode_control_request("inventory", deadline=None, acks={})
    assert decode_control_request("inventory", data).deadline is None
    with pytest.raises(WireFormatError, match="deadline"):
        encode_control_request("resume", deadline=None, acks={}, args={"checkpoint_id": "c"})
    body = orjson.dumps(
        {"deadline": None, "acks": {}, "fault": None, "args": {"checkpoint_id": "c"}}
    )
    with pytest.raises(WireFormatError, match="deadline"):
        decode_control_request("resume", body)


def test_prepare_mode_defaults_to_aligned() -> None:
    body = orjson.dumps(
        {
            "deadline": {"remaining_s": 1, "sent_wall": 2},
            "acks": {},
            "fault": None,
            "args": {"checkpoint_id": "c"},
        }
    )
    args = decode_control_request("prepare", body).args
    assert args["mode"] is CheckpointMode.ALIGNED
    assert args["alignment_timeout_s"] is None  # absent: wait until the deadline


def test_errors_and_refusals_cross_as_themselves() -> None:
    for exc in (
        GymInstanceDead("gym-0", "run"),
        GymCallTimeout("late", "gym-0", "commit"),
        GymAdmissionClosed("3-1", "gym-0"),
        TopologyMismatch(("gym-0: differs",)),
        StrandedSessionError("gym-0", ("r",)),
        ManifestError("bad"),
    ):
        body = b'{"error":' + encode_error(exc, "gym-0", "commit") + b"}"
        back = decode_error_body(body)
        assert type(back) is type(exc) and back.args == exc.args
    refusal = Refusal("Unauthorized", "missing bearer token")
    assert decode_error_body(encode_refusal(refusal)) == refusal
    assert orjson.loads(encode_refusal(refusal)) == {
        "error": {"type": "Unauthorized", "message": "missing bearer token"}
    }


def test_health_round_trips() -> None:
    health = Health(PROTOCOL, "gym-0", "ab" * 16, True, CONTROL_SAMPLES["topology"][1])
    assert decode_health(encode_health(health)) == health


# -- refusals -----------------------------------------------------------------------------------


def _run_body(**change: Any) -> dict[str, Any]:
    raw: dict[str, Any] = orjson.loads(
        encode_run_request(RunRequest(1, {}, RunShape(), False, 8, ROWS[:1]))
    )
    raw.update(change)
    return raw


def _row(**change: Any) -> dict[str, Any]:
    row: dict[str, Any] = _run_body()["rows"][0]
    for key, value in change.items():
        if "." in key:
            outer, inner = key.split(".")
            row[outer] = {**row[outer], inner: value}
        else:
            row[key] = value
    return row


BAD_RUN_BODIES: dict[str, bytes] = {
    "not json": b"{not json",
    "not an object": b"[1, 2]",
    "empty": b"",
    "unknown top key": orjson.dumps(_run_body(extra=1)),
    "missing key": orjson.dumps({k: v for k, v in _run_body().items() if k != "shape"}),
    "sid a string": orjson.dumps(_run_body(sid="1")),
    "sid negative": orjson.dumps(_run_body(sid=-1)),
    "per_row an int": orjson.dumps(_run_body(per_row=1)),
    "max_replies zero": orjson.dumps(_run_body(max_replies=0)),
    "acks key not an int": orjson.dumps(_run_body(acks={"x": 1})),
    "acks seq negative": orjson.dumps(_run_body(acks={"1": -1})),
    "acks value a float": orjson.dumps(_run_body(acks={"1": 1.5})),
    "rows not a list": orjson.dumps(_run_body(rows={"a": 1})),
    "unknown row key": orjson.dumps(_run_body(rows=[_row(extra=True)])),
    "unknown episode_id key": orjson.dumps(_run_body(rows=[_row(**{"episode_id.x": 1})])),
    "attempt negative": orjson.dumps(_run_body(rows=[_row(**{"episode_id.attempt": -1})])),
    "attempt a string": orjson.dumps(_run_body(rows=[_row(**{"episode_id.attempt": "0"})])),
    "slot a string": orjson.dumps(_run_body(rows=[_row(**{"gymckpt.slot": "3"})])),
    "the flat row key": orjson.dumps(_run_body(rows=[_row(**{"gymckpt.row": 3})])),
    "task_input beside task": orjson.dumps(_run_body(rows=[_row(task_input=1)])),
    "task without task_input": orjson.dumps(
        _run_body(rows=[_row(task={"task_id": {"taskset": "gymckpt:rows", "task_id": "3"}})])
    ),
    "task_id not a row": orjson.dumps(
        _run_body(rows=[_row(**{"task.task_id": {"taskset": "gymckpt:rows", "task_id": "x"}})])
    ),
    "task_id an int": orjson.dumps(
        _run_body(rows=[_row(**{"task.task_id": {"taskset": "gymckpt:rows", "task_id": 3}})])
    ),
    "task_id with a leading zero": orjson.dumps(
        _run_body(rows=[_row(**{"task.task_id": {"taskset": "gymckpt:rows", "task_id": "03"}})])
    ),
    "another taskset": orjson.dumps(
        _run_body(rows=[_row(**{"task.task_id": {"taskset": "math:gsm8k", "task_id": "3"}})])
    ),
    "empty taskset": orjson.dumps(
        _run_body(rows=[_row(**{"task.task_id": {"taskset": "", "task_id": "3"}})])
    ),
    "rollout_id with the attempt suffix": orjson.dumps(
        _run_body(rows=[_row(**{"episode_id.rollout_id": "3-1-a2"})])
    ),
    "rollout_id not NeMo's pattern": orjson.dumps(
        _run_body(rows=[_row(**{"episode_id.rollout_id": "-3/1"})])
    ),
    "unknown gymckpt key": orjson.dumps(_run_body(rows=[_row(**{"gymckpt.pickle": "x"})])),
    "unknown shape key": orjson.dumps(_run_body(shape={"refuse_all": True, "boom": 1})),
    "bad fault in shape": orjson.dumps(
        _run_body(
            shape={
                "refuse_all": False,
                "drop_after": None,
                "inject": {"op": "run", "kind": "explode", "nth": None, "arg": None},
            }
        )
    ),
}


@pytest.mark.parametrize("name", BAD_RUN_BODIES)
def test_malformed_run_request_is_refused(name: str) -> None:
    with pytest.raises(WireFormatError):
        decode_run_request(BAD_RUN_BODIES[name])


def _line(**change: Any) -> dict[str, Any]:
    raw: dict[str, Any] = orjson.loads(encode_batch_line(ReplyBatch(1, REPLIES), REPLY_ROWS))
    raw.update(change)
    return raw


def _reply(i: int, **change: Any) -> dict[str, Any]:
    """Reply ``i`` of the sample line with keys changed (None: the key removed)."""
    reply: dict[str, Any] = {**_line()["replies"][i], **change}
    return {k: v for k, v in reply.items() if v is not None}


def _failure(i: int) -> dict[str, Any]:
    failure: dict[str, Any] = _line()["replies"][i]["failure"]
    return failure


BAD_LINES: dict[str, bytes] = {
    "not json": b"{",
    "end false": b'{"end":false}',
    "end with more": b'{"end":true,"seq":1}',
    "unknown key": orjson.dumps(_line(x=1)),
    "seq negative": orjson.dumps(_line(seq=-1)),
    "header with replies": orjson.dumps(_line(seq=0)),
    "reply not an object": orjson.dumps(_line(replies=[1])),
    "completed unknown key": orjson.dumps(_line(replies=[{**_line()["replies"][0], "x": 1}])),
    "reward a string": orjson.dumps(
        _line(replies=[_reply(0, result={**_line()["replies"][0]["result"], "reward": "1"})])
    ),
    "the flat reward": orjson.dumps(_line(replies=[_reply(0, reward=0.5)])),
    "no task_id": orjson.dumps(
        _line(replies=[{k: v for k, v in _line()["replies"][0].items() if k != "task_id"}])
    ),
    "task_id not a row": orjson.dumps(
        _line(replies=[_reply(0, task_id={"taskset": "gymckpt:rows", "task_id": "a"})])
    ),
    "result and failure": orjson.dumps(
        _line(replies=[_reply(0, failure=_line()["replies"][1]["failure"])])
    ),
    "neither result nor failure": orjson.dumps(_line(replies=[_reply(0, result=None)])),
    "unknown gymckpt kind": orjson.dumps(
        _line(replies=[_reply(1, failure={**_failure(1), "failure_kind": "gymckpt:cosmic"})])
    ),
    "a refusal that is terminal": orjson.dumps(
        _line(replies=[_reply(3, failure={**_failure(3), "terminal": True})])
    ),
    "terminal a string": orjson.dumps(
        _line(replies=[_reply(1, failure={**_failure(1), "terminal": "yes"})])
    ),
    "stage not NeMo's": orjson.dumps(
        _line(replies=[_reply(2, failure={**_failure(2), "stage": "rollout"})])
    ),
    "failure_reason over 2000": orjson.dumps(
        _line(replies=[_reply(2, failure={**_failure(2), "failure_reason": "x" * 2001})])
    ),
    "the flat failure_class": orjson.dumps(
        _line(replies=[_reply(1, failure={**_failure(1), "failure_class": "infra"})])
    ),
    "failure unknown key": orjson.dumps(
        _line(replies=[_reply(3, failure={**_failure(3), "why": 1})])
    ),
}


@pytest.mark.parametrize("name", BAD_LINES)
def test_malformed_stream_line_is_refused(name: str) -> None:
    with pytest.raises(WireFormatError):
        decode_stream_line(BAD_LINES[name])


def _control(op: str, **change: Any) -> bytes:
    args, _ = CONTROL_SAMPLES[op]
    raw = orjson.loads(encode_control_request(op, deadline=DEADLINE, acks={}, args=args))
    raw.update(change)
    return orjson.dumps(raw)


BAD_CONTROL: dict[str, tuple[str, bytes]] = {
    "not json": ("prepare", b"nope"),
    "unknown top key": ("prepare", _control("prepare", x=1)),
    "unknown arg": (
        "commit",
        _control("commit", args={"checkpoint_id": "c", "state_root": "s", "rm_rf": True}),
    ),
    "missing arg": ("commit", _control("commit", args={"checkpoint_id": "c"})),
    "arg of wrong type": ("retire", _control("retire", args={"rollout_ids": "3-1"})),
    "bad mode": ("prepare", _control("prepare", args={"checkpoint_id": "c", "mode": "sideways"})),
    "negative alignment timeout": (
        "prepare",
        _control("prepare", args={"checkpoint_id": "c", "alignment_timeout_s": -1.0}),
    ),
    "alignment timeout not a number": (
        "prepare",
        _control("prepare", args={"checkpoint_id": "c", "alignment_timeout_s": "1"}),
    ),
    "deadline not finite": (
        "resume",
        _control("resume", deadline={"remaining_s": "inf", "sent_wall": 1}),
    ),
    "unknown fault key": (
        "resume",
        _control(
            "resume", fault={"op": "resume", "kind": "hang", "nth": None, "arg": None, "x": 1}
        ),
    ),
    "args for a view": ("inventory", _control("inventory", args={"x": 1})),
    "negative upto": ("ack", _control("ack", args={"sid": 1, "upto": -2})),
}


@pytest.mark.parametrize("name", BAD_CONTROL)
def test_malformed_control_request_is_refused(name: str) -> None:
    op, body = BAD_CONTROL[name]
    with pytest.raises(WireFormatError):
        decode_control_request(op, body)


def test_unknown_op_is_refused() -> None:
    with pytest.raises(WireFormatError, match="unknown control op"):
        decode_control_request("format_disk", b"{}")
    with pytest.raises(WireFormatError, match="unknown control op"):
        encode_control_request("format_disk", deadline=DEADLINE, acks={})
    with pytest.raises(WireFormatError, match="bad args"):
        encode_control_request("resume", deadline=DEADLINE, acks={}, args={"nope": 1})


def test_malformed_results_and_error_bodies_are_refused() -> None:
    for op, body in (
        ("resume", b'{"result": 1}'),
        ("prepare", b'{"result": {"instance": "g"}}'),
        ("prepare", b'{"value": null}'),
        ("topology", b"[]"),
    ):
        with pytest.raises(WireFormatError):
            decode_result(op, body)
    for body in (
        b"{}",
        b'{"error": "x"}',
        b'{"error": {"type": "Unauthorized", "message": 3}}',
        b'{"error": {"type": "NoSuchError", "args": []}}',
        b'{"error": {"type": "GymInstanceDead", "args": ["only one"]}}',
    ):
        with pytest.raises(WireFormatError):
            decode_error_body(body)
    with pytest.raises(WireFormatError):
        decode_health(b'{"protocol": "gymckpt-http/2"}')


# -- reply channels (/mux/v1) ------------------------------------------------------------------


def test_mux_lines_carry_run_lines_replies_in_nemo_shapes_tagged_with_their_stream() -> None:
    """A channel's batch line is ``/run``'s line with ``sid`` in front: the same NeMo Gym
    ``BaseEpisodeResponse`` replies, byte for byte, and they decode back to the replies."""
    batch = ReplyBatch(3, REPLIES)
    line = encode_mux_batch_line(12, batch, REPLY_ROWS)
    assert line == b'{"sid":12,' + encode_batch_line(batch, REPLY_ROWS)[1:]
    item = decode_mux_line(line)
    assert (item.sid, item.seq, item.end) == (12, 3, False)
    assert item.raw == tuple(orjson.loads(encode_batch_line(batch, REPLY_ROWS))["replies"])
    for raw in item.raw:
        _validate(raw, "BaseEpisodeResponse")
    assert tuple(decode_reply(r) for r in item.raw) == REPLIES
    assert decode_mux_line(encode_mux_end_line(12)) == MuxLine(12, end=True)
    assert decode_mux_channel_line(encode_mux_channel_line(4)) == 4


def test_mux_requests_round_trip() -> None:
    run = RunRequest(7, {3: 2}, RunShape(), False, 16, ROWS)
    assert decode_mux_run_request(encode_mux_run_request(MuxRunRequest(2, run))) == (
        MuxRunRequest(2, run)
    )
    raw = orjson.loads(encode_mux_run_request(MuxRunRequest(2, run)))
    assert raw == {"channel": 2, **orjson.loads(encode_run_request(run))}
    assert decode_mux_open(encode_mux_open(MuxOpenRequest(5))) == MuxOpenRequest(5)


@pytest.mark.parametrize(
    "line",
    [
        b'{"sid":1,"end":false}',
        b'{"sid":-1,"end":true}',
        b'{"sid":1,"end":true,"x":1}',
        b'{"end":true}',
        b'{"sid":1,"seq":0,"replies":[]}',
        b'{"seq":1,"replies":[]}',
        b'{"sid":1,"seq":1,"replies":[],"x":1}',
        b'{"sid":"1","seq":1,"replies":[]}',
        b"[]",
        b"{",
    ],
)
def test_malformed_mux_line_is_refused(line: bytes) -> None:
    with pytest.raises(WireFormatError):
        decode_mux_line(line)


@pytest.mark.parametrize(
    "body",
    [
        b'{"channel":-1}',
        b'{"channel":"1"}',
        b'{"channel":1,"x":1}',
        b"{}",
    ],
)
def test_malformed_mux_open_is_refused(body: bytes) -> None:
    with pytest.raises(WireFormatError):
        decode_mux_open(body)
    with pytest.raises(WireFormatError):
        decode_mux_channel_line(body)
