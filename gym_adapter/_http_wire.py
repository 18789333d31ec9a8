"""The HTTP wire of one Gym instance (``gymckpt-http/1``): request and response bodies as bytes.

Both sides of ``gymckpt serve`` build on this module and nothing else of the HTTP transport:
the server (``_http_app``) decodes requests and encodes replies with it, the client (``HttpGym``)
the other way round. Everything goes through the strict wire converter (``_wire``): unknown keys,
missing keys, values of the wrong type and bytes that are not JSON raise ``WireFormatError``
naming the body and the field. ``docs/http-wire.md`` is the contract in prose.

The data plane speaks NeMo Gym's episode shapes
-----------------------------------------------
A ``RunRow`` crosses as ``{"episode_id": {"rollout_id", "attempt"}, "task_input", "task_id",
"gymckpt": {"row", "slot", "restored_from", "policy_version"}}``. ``episode_id.rollout_id`` is the
attempt's *base* key and ``RunRow.rollout_id`` the attempt-qualified key NeMo Gym builds from it
(``qualified_key``: the base for attempt 0, ``"{base}-a{n}"`` after), so a canonical row
``"{row}-{slot}[-aN]"`` crosses as ``{"rollout_id": "{row}-{slot}", "attempt": N}``. A reply
names its episode the same way (``split_key`` recovers the pair from the qualified key, which is
all a reply carries). Replies are NeMo-shaped results: completed ``{episode_id, reward, turns,
payload}``, failed ``{episode_id, failure_reason, terminal, failure_kind, stage, failure_class}``,
refused (a sidecar row) ``{episode_id, refused: "admission_closed"}``.

What was confirmed in NeMo Gym's source (github NVIDIA-NeMo/Gym, main at 2026-08-22, no 0.7 tag
in the mirror): its ``/run`` takes the agent's request body and correlates model calls by a
capture key built in ``nemo_gym/rollout_correlation.py`` (``maybe_rollout_id_from_run_body``):
``"{_ng_task_index}-{_ng_rollout_index}"`` (or an explicit ``_ng_rollout_id``), with ``-a{n}``
appended for ``_ng_attempt_index`` n > 0 — exactly ``runtime.rollout_id_for(row, slot, attempt)``
and ``qualified_key`` here. Its results carry ``reward`` (``BaseVerifyResponse``). The names
``episode_id``, ``task_input``/``task_id`` and the failure record ``{failure_reason, terminal,
failure_kind, stage}`` were NOT found in that source; they are the names the issue and the brief
fix, used as given. ``failure_kind``, ``terminal`` and ``stage`` are derived from the ``Failed``
record (``failure_fields``) and validated but not trusted on decode; ``task_id`` is accepted and
dropped (a ``RunRow`` has no task identity beyond its row).

The control plane is gymckpt's own: ``POST /control/v1/<op>`` with a ``ControlRequest`` body,
answered ``{"result": ...}`` (``encode_result``), or an error body.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs
import cattrs
import orjson

from gymckpt.runtime import CheckpointMode, EpisodeRecord, InstanceRecord, TrainerTerm

from ._contract import (
    AttachReply,
    CommitReply,
    Completed,
    Failed,
    InstanceInventory,
    InstanceTopology,
    PrepareReply,
    Refused,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
)
from ._faults import FaultSpec
from ._host import HostStatistics
from ._host_views import RetainedSession
from ._transport_admission import HEADER_SEQ, ReplyBatch, RunShape
from ._transport_deadlines import WireDeadline
from ._wire import WireFormatError, decode_error, wire_converter

__all__ = [
    "CONTROL_OPS",
    "DEADLINE_OPS",
    "END_LINE",
    "EXPECT_INCARNATION_HEADER",
    "INCARNATION_HEADER",
    "INSTANCE_HEADER",
    "PROTOCOL",
    "TRAINER_HEADER",
    "ControlRequest",
    "Health",
    "Refusal",
    "RunRequest",
    "WireFormatError",
    "decode_control_request",
    "decode_error_body",
    "decode_health",
    "decode_result",
    "decode_run_request",
    "decode_stream_line",
    "encode_batch_line",
    "encode_control_request",
    "encode_health",
    "encode_refusal",
    "encode_result",
    "encode_run_request",
    "failure_fields",
    "qualified_key",
    "split_key",
]

PROTOCOL: Final = "gymckpt-http/1"
"""The protocol's name and version; ``GET /health`` says it, a client refuses any other."""
INCARNATION_HEADER: Final = "Gymckpt-Incarnation"
"""Response header on every reply: 32 hex digits, random per server process start."""
INSTANCE_HEADER: Final = "Gymckpt-Instance"
"""Response header on every reply: the instance's name."""
EXPECT_INCARNATION_HEADER: Final = "Gymckpt-Expect-Incarnation"
"""Optional request header: the incarnation the client means. A server of another incarnation
(restarted under the same name) refuses the request with 409 ``IncarnationMismatch`` before it
acts, so a call meant for the old process never reaches the new one."""
TRAINER_HEADER: Final = "Gymckpt-Trainer"
"""Request header on every request of a trainer that attached: its term as
``"{lineage}.{term}"`` (``TrainerTerm.header``). The instance refuses the request (409
``GymInUse``) before it acts when another lineage, or a newer term, holds it. Not an
incarnation: the incarnation is the server process's, the term is the trainer process's."""
END_LINE: Final = b'{"end":true}\n'
"""The last line of every complete ``/run`` body: a body that stops without it ended early."""

_ATTEMPT_SUFFIX: Final = re.compile(r"-a([1-9][0-9]*)\Z")


# -- attempt keys ------------------------------------------------------------------------------


def qualified_key(base: str, attempt: int) -> str:
    """NeMo Gym's attempt-qualified key: ``base`` for attempt 0, ``"{base}-a{attempt}"`` after."""
    return base if attempt == 0 else f"{base}-a{attempt}"


def split_key(rollout_id: str) -> tuple[str, int]:
    """``(base, attempt)`` with ``qualified_key(base, attempt) == rollout_id``: a trailing
    ``-aN`` (N > 0, no leading zero) is the attempt, anything else is attempt 0."""
    m = _ATTEMPT_SUFFIX.search(rollout_id)
    if m is None:
        return rollout_id, 0
    return rollout_id[: m.start()], int(m.group(1))


# -- the NeMo-shaped records (private: the wire's own spelling) ----------------------------------


def _non_negative(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"{attr.name} must be an integer >= 0, got {value!r}")


@attrs.frozen
class _EpisodeId:
    rollout_id: str
    attempt: int = attrs.field(validator=_non_negative)


@attrs.frozen
class _TaskId:
    taskset: str
    task_id: str | int


@attrs.frozen
class _RowExtras:
    row: int
    slot: int
    restored_from: str | None
    policy_version: int


@attrs.frozen
class _WireRow:
    episode_id: _EpisodeId
    task_input: Any
    task_id: _TaskId | None
    gymckpt: _RowExtras


@attrs.frozen
class _WireCompleted:
    episode_id: _EpisodeId
    reward: float
    turns: int
    payload: Any


FailureKind = Literal["infrastructure_error", "environment_error"]


@attrs.frozen
class _WireFailed:
    episode_id: _EpisodeId
    failure_reason: str
    terminal: bool
    failure_kind: FailureKind
    stage: Literal["rollout"]
    failure_class: Literal["infra", "data"]


@attrs.frozen
class _WireRefused:
    episode_id: _EpisodeId
    refused: str


@attrs.frozen
class _WireRunRequest:
    sid: int
    acks: dict[str, int]
    shape: RunShape
    per_row: bool
    max_replies: int
    rows: tuple[_WireRow, ...]


@attrs.frozen
class _WireBatch:
    seq: int
    replies: tuple[dict[str, Any], ...]


def failure_fields(reply: Failed) -> tuple[bool, FailureKind, Literal["rollout"]]:
    """``(terminal, failure_kind, stage)`` of a failed reply, in NeMo Gym's failure record: a
    data failure (the episode's own problem) is terminal, an infra failure (the instance, a
    model server) is not — the attempt may run again elsewhere."""
    if reply.failure_class == "infra":
        return False, "infrastructure_error", "rollout"
    return True, "environment_error", "rollout"


def _episode_id_of_row(row: RunRow) -> _EpisodeId:
    base, attempt = split_key(row.rollout_id)
    if attempt != row.attempt:
        if row.attempt == 0:
            base = row.rollout_id
        else:
            raise WireFormatError(
                f"run row {row.rollout_id!r}: attempt {row.attempt} but the key does not end "
                f"with -a{row.attempt}; the wire carries NeMo Gym's attempt-qualified keys "
                "(rollout_id_for(row, slot, attempt))"
            )
    return _EpisodeId(base, row.attempt)


def _row_to_wire(row: RunRow) -> _WireRow:
    return _WireRow(
        _episode_id_of_row(row),
        row.task,
        None,
        _RowExtras(row.row, row.slot, row.restored_from, row.policy_version),
    )


def _row_from_wire(w: _WireRow) -> RunRow:
    return RunRow(
        qualified_key(w.episode_id.rollout_id, w.episode_id.attempt),
        w.gymckpt.row,
        w.gymckpt.slot,
        w.episode_id.attempt,
        restored_from=w.gymckpt.restored_from,
        task=w.task_input,
        policy_version=w.gymckpt.policy_version,
    )


def _episode_id_of(rollout_id: str) -> _EpisodeId:
    return _EpisodeId(*split_key(rollout_id))


def _reply_to_wire(reply: RunReply) -> _WireCompleted | _WireFailed | _WireRefused:
    eid = _episode_id_of(reply.rollout_id)
    if isinstance(reply, Completed):
        return _WireCompleted(eid, reply.reward, reply.turns, reply.payload)
    if isinstance(reply, Failed):
        terminal, kind, stage = failure_fields(reply)
        return _WireFailed(eid, reply.message, terminal, kind, stage, reply.failure_class)
    return _WireRefused(eid, reply.code)


def _reply_from_raw(raw: Any) -> RunReply:
    if not isinstance(raw, dict):
        raise WireFormatError(f"wire reply: expected an object, got {type(raw).__name__}")
    if "refused" in raw:
        r: _WireRefused = _structure(raw, _WireRefused, "wire refused reply")
        return Refused(qualified_key(r.episode_id.rollout_id, r.episode_id.attempt), r.refused)
    if "failure_reason" in raw:
        f: _WireFailed = _structure(raw, _WireFailed, "wire failed reply")
        rid = qualified_key(f.episode_id.rollout_id, f.episode_id.attempt)
        return Failed(rid, f.failure_class, f.failure_reason)
    c: _WireCompleted = _structure(raw, _WireCompleted, "wire completed reply")
    rid = qualified_key(c.episode_id.rollout_id, c.episode_id.attempt)
    return Completed(rid, c.reward, c.turns, c.payload)


# -- helpers ------------------------------------------------------------------------------------


def _loads(data: bytes, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireFormatError(f"{what}: not valid JSON ({exc})") from None


def _structure(raw: Any, cls: Any, what: str) -> Any:
    try:
        return wire_converter.structure(raw, cls)
    except (cattrs.BaseValidationError, cattrs.errors.ForbiddenExtraKeysError) as exc:
        problems = "; ".join(cattrs.transform_error(exc, path="$")) or str(exc)
        raise WireFormatError(f"{what}: {problems}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise WireFormatError(f"{what}: {exc}") from None


def _dumps(raw: Any, what: str) -> bytes:
    try:
        return orjson.dumps(raw)
    except TypeError as exc:
        raise WireFormatError(f"cannot encode {what}: {exc}") from None


def _unstructure(obj: Any, as_: Any, what: str) -> Any:
    try:
        return wire_converter.unstructure(obj, unstructure_as=as_)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"cannot encode {what}: {exc}") from None


def _acks_to_wire(acks: Mapping[int, int]) -> dict[str, int]:
    return {str(int(sid)): int(seq) for sid, seq in acks.items()}


def _acks_from_wire(acks: Mapping[str, int], what: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, seq in acks.items():
        if not key.isdigit() or str(int(key)) != key:
            raise WireFormatError(f"{what}: acks key {key!r} is not a stream id (a decimal int)")
        if seq < HEADER_SEQ:
            raise WireFormatError(f"{what}: acks[{key}] = {seq} is below {HEADER_SEQ}")
        out[int(key)] = seq
    return out


# -- /run -------------------------------------------------------------------------------------


def _positive(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or value < 1:
        raise ValueError(f"{attr.name} must be an integer >= 1, got {value!r}")


@attrs.frozen
class RunRequest:
    """One ``POST /run``: stream ``sid`` (the client's id, unique per incarnation) submits
    ``rows``; ``acks`` are the client's latest acknowledgements (sid -> seq), applied before the
    rows are admitted; ``shape`` what the fault plan decided; ``per_row`` one reply per line;
    ``max_replies`` the most replies one line carries otherwise."""

    sid: int = attrs.field(validator=_non_negative)
    acks: dict[int, int]
    shape: RunShape
    per_row: bool
    max_replies: int = attrs.field(validator=_positive)
    rows: tuple[RunRow, ...]


def encode_run_request(req: RunRequest) -> bytes:
    """The body of a ``POST /run``."""
    wire = _WireRunRequest(
        req.sid,
        _acks_to_wire(req.acks),
        req.shape,
        req.per_row,
        req.max_replies,
        tuple(_row_to_wire(r) for r in req.rows),
    )
    return _dumps(_unstructure(wire, _WireRunRequest, "run request"), "run request")


def decode_run_request(data: bytes) -> RunRequest:
    """A ``POST /run`` body, strictly; ``WireFormatError`` says what is wrong."""
    what = "wire run request"
    wire: _WireRunRequest = _structure(_loads(data, what), _WireRunRequest, what)
    try:
        return RunRequest(
            wire.sid,
            _acks_from_wire(wire.acks, what),
            wire.shape,
            wire.per_row,
            wire.max_replies,
            tuple(_row_from_wire(r) for r in wire.rows),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, WireFormatError):
            raise
        raise WireFormatError(f"{what}: {exc}") from None


def encode_batch_line(batch: ReplyBatch) -> bytes:
    """One line of a ``/run`` body (newline-terminated): the admission header or a batch."""
    replies = [_unstructure(_reply_to_wire(r), None, "reply") for r in batch.replies]
    return _dumps({"seq": batch.seq, "replies": replies}, "reply batch") + b"\n"


def decode_stream_line(line: bytes) -> ReplyBatch | None:
    """One line of a ``/run`` body (with or without its newline): a ``ReplyBatch``, or None
    for the end line."""
    what = "wire stream line"
    raw = _loads(line, what)
    if raw == {"end": True}:
        return None
    if isinstance(raw, dict) and "end" in raw:
        raise WireFormatError(f"{what}: the end line is exactly {END_LINE!r}, got {raw!r}")
    wire: _WireBatch = _structure(raw, _WireBatch, what)
    replies = tuple(_reply_from_raw(r) for r in wire.replies)
    try:
        return ReplyBatch(wire.seq, replies)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"{what}: {exc}") from None


# -- /control/v1/<op> -----------------------------------------------------------------------------


@attrs.frozen
class _PrepareArgs:
    checkpoint_id: str
    mode: CheckpointMode = CheckpointMode.ALIGNED


@attrs.frozen
class _CommitArgs:
    checkpoint_id: str
    state_root: str


@attrs.frozen
class _ResumeArgs:
    checkpoint_id: str


@attrs.frozen
class _RetireArgs:
    rollout_ids: tuple[str, ...]


@attrs.frozen
class _RestoreArgs:
    state_root: str
    record: InstanceRecord
    episodes: tuple[EpisodeRecord, ...]


@attrs.frozen
class _AttachArgs:
    trainer: TrainerTerm


@attrs.frozen
class _NoArgs:
    pass


@attrs.frozen
class _StreamArgs:
    sid: int = attrs.field(validator=_non_negative)
    upto: int = attrs.field(validator=_non_negative)


_RetainedMap = dict[str, dict[str, RetainedSession]]

_OPS: Final[Mapping[str, tuple[type, Any]]] = {
    "prepare": (_PrepareArgs, PrepareReply),
    "commit": (_CommitArgs, CommitReply),
    "resume": (_ResumeArgs, None),
    "retire": (_RetireArgs, RetireReply),
    "retire_restored": (_RetireArgs, RetireReply),
    "restore": (_RestoreArgs, RestoreReply),
    "attach": (_AttachArgs, AttachReply),
    "release": (_AttachArgs, None),
    "topology": (_NoArgs, InstanceTopology),
    "inventory": (_NoArgs, InstanceInventory),
    "statistics": (_NoArgs, HostStatistics),
    "retained_sessions": (_NoArgs, _RetainedMap),
    "ack": (_StreamArgs, None),
    "close_stream": (_StreamArgs, None),
}
"""op -> (its args record, the type of its result; None: the result is JSON null)."""

CONTROL_OPS: Final = tuple(_OPS)
"""Every ``<op>`` of ``POST /control/v1/<op>``."""
DEADLINE_OPS: Final = frozenset(
    {"prepare", "commit", "resume", "retire", "retire_restored", "restore", "attach", "release"}
)
"""The ops that run by a deadline: their request must carry one."""


@attrs.frozen
class ControlRequest:
    """One ``POST /control/v1/<op>``. ``deadline``: the time left (re-anchored by the server;
    required for ``DEADLINE_OPS``, may be None for the views); ``acks``: the client's latest
    acknowledgements (sid -> seq), applied before the op; ``fault``: the fault the client's plan
    drew for this call (honoured only by a server started with ``--allow-faults``); ``args``:
    the op's named arguments as Python values (``checkpoint_id``, ``mode`` as a
    ``CheckpointMode``, ``record`` as an ``InstanceRecord``...)."""

    deadline: WireDeadline | None
    acks: dict[int, int]
    fault: FaultSpec | None
    args: dict[str, Any]


@attrs.frozen
class _WireControl:
    deadline: WireDeadline | None
    acks: dict[str, int]
    fault: FaultSpec | None
    args: dict[str, Any]


def _op(op: str) -> tuple[type, Any]:
    entry = _OPS.get(op)
    if entry is None:
        raise WireFormatError(f"unknown control op {op!r} (known: {', '.join(CONTROL_OPS)})")
    return entry


def _args_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in attrs.fields(type(obj))}


def encode_control_request(
    op: str,
    *,
    deadline: WireDeadline | None,
    acks: Mapping[int, int],
    fault: FaultSpec | None = None,
    args: Mapping[str, Any] | None = None,
) -> bytes:
    """The body of ``POST /control/v1/<op>``; ``args`` are ``op``'s named arguments (a missing
    or unknown one raises ``WireFormatError``)."""
    args_cls, _ = _op(op)
    if deadline is None and op in DEADLINE_OPS:
        raise WireFormatError(f"control {op}: needs a deadline")
    try:
        args_obj = args_cls(**dict(args or {}))
    except TypeError as exc:
        raise WireFormatError(f"control {op}: bad args ({exc})") from None
    raw = {
        "deadline": _unstructure(deadline, WireDeadline | None, "deadline"),
        "acks": _acks_to_wire(acks),
        "fault": _unstructure(fault, FaultSpec | None, "fault"),
        "args": _unstructure(args_obj, args_cls, f"control {op} args"),
    }
    return _dumps(raw, f"control {op} request")


def decode_control_request(op: str, data: bytes) -> ControlRequest:
    """A ``POST /control/v1/<op>`` body, strictly (the args as ``op`` takes them)."""
    args_cls, _ = _op(op)
    what = f"wire control {op} request"
    wire: _WireControl = _structure(_loads(data, what), _WireControl, what)
    if wire.deadline is None and op in DEADLINE_OPS:
        raise WireFormatError(f"{what}: deadline is required for {op}")
    args_obj = _structure(wire.args, args_cls, f"{what} args")
    return ControlRequest(
        wire.deadline, _acks_from_wire(wire.acks, what), wire.fault, _args_dict(args_obj)
    )


def encode_result(op: str, value: Any) -> bytes:
    """A 200 answer of ``op``: ``{"result": <value's wire form>}``."""
    _, result_type = _op(op)
    if result_type is None:
        if value is not None:
            raise WireFormatError(f"control {op} answers null, got {type(value).__name__}")
        return b'{"result":null}'
    raw = _unstructure(value, result_type, f"control {op} result")
    return _dumps({"result": raw}, f"control {op} result")


def decode_result(op: str, data: bytes) -> Any:
    """The value of a 200 answer of ``op``, strictly."""
    _, result_type = _op(op)
    what = f"wire control {op} result"
    raw = _loads(data, what)
    if not isinstance(raw, dict) or set(raw) != {"result"}:
        raise WireFormatError(f"{what}: expected an object with exactly the key 'result'")
    if result_type is None:
        if raw["result"] is not None:
            raise WireFormatError(f"{what}: expected null, got {raw['result']!r}")
        return None
    return _structure(raw["result"], result_type, what)


# -- errors and health -----------------------------------------------------------------------------


@attrs.frozen
class Refusal:
    """A request the server refused before it reached the instance (4xx): ``type`` is the
    reason (``Unauthorized``, ``BodyTooLarge``, ``TooManyRows``, ``TooManyStreams``,
    ``BadRequest``, ``PathOutsideStateRoot``, ``FaultsNotAllowed``, ``NotFound``,
    ``MethodNotAllowed``), ``message`` says what differs and what to do. Nothing changed."""

    type: str
    message: str


@attrs.frozen
class _RefusalBody:
    error: Refusal


def encode_refusal(refusal: Refusal) -> bytes:
    """``{"error": {"type": ..., "message": ...}}``."""
    return _dumps(_unstructure(_RefusalBody(refusal), _RefusalBody, "refusal"), "refusal")


def decode_error_body(data: bytes) -> Exception | Refusal:
    """The body of a non-200 answer: a Gym error rebuilt as its class (``{"error": <WireError>}``,
    409/503), or the server's ``Refusal`` (``{"error": {"type", "message"}}``, 4xx)."""
    what = "wire error body"
    raw = _loads(data, what)
    if not isinstance(raw, dict) or set(raw) != {"error"} or not isinstance(raw["error"], dict):
        raise WireFormatError(f"{what}: expected an object with exactly the key 'error'")
    if "message" in raw["error"]:
        body: _RefusalBody = _structure(raw, _RefusalBody, what)
        return body.error
    return decode_error(orjson.dumps(raw["error"]))


@attrs.frozen
class Health:
    """``GET /health``: the protocol, the instance, its incarnation (32 hex, per process start),
    whether it serves, and its topology."""

    protocol: str
    instance: str
    incarnation: str
    serving: bool
    topology: InstanceTopology


def encode_health(health: Health) -> bytes:
    return _dumps(_unstructure(health, Health, "health"), "health")


def decode_health(data: bytes) -> Health:
    what = "wire health"
    health: Health = _structure(_loads(data, what), Health, what)
    return health
