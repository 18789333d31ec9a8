"""The HTTP wire of one Gym instance (``gymckpt-http/2``): request and response bodies as bytes.

Both sides of ``gymckpt serve`` build on this module and nothing else of the HTTP transport:
the server (``http/_app``) decodes requests and encodes replies with it, the client (``HttpGym``)
the other way round. Everything goes through the strict wire converter (``_wire``): unknown keys,
missing keys, values of the wrong type and bytes that are not JSON raise ``WireFormatError``
naming the body and the field. ``docs/http-wire.md`` is the contract in prose.

The data plane speaks NeMo Gym 0.7.0's episode shapes
-----------------------------------------------------
The released package's models (``nemo_gym.episode_types``, ``NEMO_GYM_VERSION``), field for
field; ``tests/data/nemo_gym_0.7.0_episode_types.json`` holds their JSON schemas as released and
``tests/test_http_wire.py`` checks every row and reply against them.

- A ``RunRow`` crosses as a ``BaseEpisodeRequest``: ``{"episode_id": {"rollout_id", "attempt"},
  "task": {"task_id": {"taskset", "task_id"}, "task_input"}}``, and beside it, what NeMo Gym's
  request has no place for, ``"gymckpt": {"slot", "restored_from", "policy_version"}`` (all
  optional: a row without it is slot 0, restores nothing, policy version 0).
  ``episode_id.rollout_id`` is the attempt's *base* key and ``RunRow.rollout_id`` the
  attempt-qualified key NeMo Gym builds from it (``EpisodeId.capture_key``, ``qualified_key``
  here: the base for attempt 0, ``"{base}-a{n}"`` after), so a canonical row
  ``"{position}-{slot}[-aN]"`` (its position in the trainer's row order) crosses as
  ``{"rollout_id": "{position}-{slot}", "attempt": N}``; a base that is not a NeMo Gym
  rollout id (its pattern, its reserved ``-aN`` suffix) cannot cross.
  The task is the trainer's row: ``taskset`` ``TASKSET``, ``task_id`` the dataset row index in
  decimal, ``task_input`` the row's task as the trainer gives it (NeMo Gym types it with the
  environment's task model; gymckpt's is any JSON value, null when the environment reads its
  own data).
- A reply crosses as a ``BaseEpisodeResponse``: ``{"episode_id", "task_id", "result" |
  "failure"}``, exactly one of the two (the other left out, as NeMo Gym's serializer does).
  Completed: ``result`` ``{"reward", "turns", "payload"}`` (NeMo Gym's ``EpisodeResultT`` is
  the environment's). Failed and refused: ``failure`` is an ``EpisodeFailure``
  ``{"failure_reason", "terminal", "failure_kind"?, "stage"?}`` (``failure_of``): gymckpt's
  class is the namespaced ``failure_kind`` ``gymckpt:infra``, ``gymckpt:data`` or
  ``gymckpt:config`` (terminal, stage ``agent``: the trainer stops the run), and a
  refused row (a sidecar row) is ``gymckpt:admission_closed`` at stage ``admission``, not
  terminal. A decoder takes the class from the kind; another producer's kind is a data failure
  if ``terminal``, else infra.

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

from ..._contract import (
    ADMISSION_CLOSED,
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
from ..._faults import FaultSpec
from ...host._host import HostStatistics
from ...host._views import RetainedSession
from .._admission import HEADER_SEQ, ReplyBatch, RunShape
from .._deadlines import WireDeadline
from .._wire import WireFormatError, decode_error, wire_converter

__all__ = [
    "CONTROL_OPS",
    "DEADLINE_OPS",
    "END_LINE",
    "EXPECT_INCARNATION_HEADER",
    "FAILURE_REASON_MAX",
    "FEATURES_HEADER",
    "INCARNATION_HEADER",
    "INSTANCE_HEADER",
    "KIND_CONFIG",
    "KIND_DATA",
    "KIND_INFRA",
    "KIND_PREFIX",
    "MUX_FEATURE",
    "MUX_OPEN",
    "MUX_RUN",
    "NEMO_GYM_VERSION",
    "PROTOCOL",
    "REFUSAL_CODES",
    "TASKSET",
    "TRAINER_HEADER",
    "ControlRequest",
    "Health",
    "MuxLine",
    "MuxOpenRequest",
    "MuxRunRequest",
    "Refusal",
    "RunRequest",
    "WireFormatError",
    "decode_control_request",
    "decode_error_body",
    "decode_health",
    "decode_mux_channel_line",
    "decode_mux_line",
    "decode_mux_open",
    "decode_mux_run_request",
    "decode_reply",
    "decode_result",
    "decode_run_request",
    "decode_stream_line",
    "encode_batch_line",
    "encode_control_request",
    "encode_health",
    "encode_mux_batch_line",
    "encode_mux_channel_line",
    "encode_mux_end_line",
    "encode_mux_open",
    "encode_mux_run_request",
    "encode_refusal",
    "encode_result",
    "encode_run_request",
    "failure_of",
    "qualified_key",
    "split_key",
    "task_id_of",
]

PROTOCOL: Final = "gymckpt-http/2"
"""The protocol's name and version; ``GET /health`` says it, a client refuses any other.
Version 2: ``/run`` rows and replies in NeMo Gym 0.7.0's episode shapes (version 1 had them
flat: ``task_input``, ``task_id`` beside ``episode_id``, a reply's fields at its top)."""
NEMO_GYM_VERSION: Final = "0.7.0"
"""The released NeMo Gym whose episode shapes (``nemo_gym.episode_types``) ``/run`` speaks."""
TASKSET: Final = "gymckpt:rows"
"""The ``taskset`` of every task gymckpt sends: its tasks are the rows of the trainer's
dataset, and a ``task_id`` is the row index in decimal (``task_id_of``)."""
KIND_PREFIX: Final = "gymckpt:"
"""gymckpt's ``failure_kind`` names, namespaced as NeMo Gym asks of names it does not register."""
KIND_INFRA: Final = "gymckpt:infra"
"""``failure_kind`` of an infra failure (the instance, a model server): not the row's fault."""
KIND_DATA: Final = "gymckpt:data"
"""``failure_kind`` of a data failure: the episode's own problem."""
KIND_CONFIG: Final = "gymckpt:config"
"""``failure_kind`` of a configuration failure (an ``EpisodeConfigError``: wrong for every row,
the trainer stops the run); terminal, as a data failure is."""
_CLASS_OF_KIND: Final = {KIND_INFRA: "infra", KIND_DATA: "data", KIND_CONFIG: "config"}
REFUSAL_CODES: Final = frozenset({ADMISSION_CLOSED})
"""The codes a refused row (a sidecar row) may carry, as ``failure_kind`` ``gymckpt:<code>``."""
FAILURE_REASON_MAX: Final = 2000
"""NeMo Gym's longest ``failure_reason``."""
INCARNATION_HEADER: Final = "Gymckpt-Incarnation"
"""Response header on every reply: 32 hex digits, random per server process start."""
INSTANCE_HEADER: Final = "Gymckpt-Instance"
"""Response header on every reply: the instance's name."""
FEATURES_HEADER: Final = "Gymckpt-Features"
"""Response header of ``GET /health``: the additions to ``PROTOCOL`` this server serves, comma
separated (``MUX_FEATURE``); a server without it serves none (a client falls back to ``/run``).
A header, not a body field: the health body's keys are pinned (decoders refuse unknown keys)."""
MUX_FEATURE: Final = "mux/1"
"""The feature of ``/mux/v1/open`` and ``/mux/v1/run``: many streams' replies over one
long-lived reply channel, rows submitted by short requests."""
MUX_OPEN: Final = "/mux/v1/open"
"""Opens a reply channel (``MUX_FEATURE``): one long-lived body for many streams' replies."""
MUX_RUN: Final = "/mux/v1/run"
"""Submits rows whose replies go to an open reply channel; answered once they are admitted."""
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
_BASE_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
"""NeMo Gym's ``EpisodeId.rollout_id`` pattern."""
_ROW_INDEX: Final = re.compile(r"(0|[1-9][0-9]*)\Z")


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


def _non_empty(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"{attr.name} must not be empty")


def _base_key(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not _BASE_KEY.match(value):
        raise ValueError(
            f"episode_id.rollout_id {value!r} is not a NeMo Gym rollout id "
            "(letters, digits, '.', '_', '-', starting with a letter or digit)"
        )
    if _ATTEMPT_SUFFIX.search(value):
        raise ValueError(
            f"episode_id.rollout_id {value!r} ends with the attempt suffix '-aN' NeMo Gym "
            "reserves: the attempt goes in episode_id.attempt"
        )


def _reason(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if len(value) > FAILURE_REASON_MAX:
        raise ValueError(f"{attr.name} has {len(value)} characters, over {FAILURE_REASON_MAX}")


@attrs.frozen
class _EpisodeId:
    """NeMo Gym's ``EpisodeId``."""

    rollout_id: str = attrs.field(validator=_base_key)
    attempt: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class _TaskId:
    """NeMo Gym's ``TaskId``."""

    taskset: str = attrs.field(validator=_non_empty)
    task_id: str = attrs.field(validator=_non_empty)


@attrs.frozen
class _Task:
    """NeMo Gym's ``MaterializedTask``."""

    task_id: _TaskId
    task_input: Any


@attrs.frozen
class _RowExtras:
    """What a row of gymckpt's carries where NeMo Gym's request has no place for it."""

    slot: int = attrs.field(default=0, validator=_non_negative)
    restored_from: str | None = None
    policy_version: int = 0


@attrs.frozen
class _WireRow:
    """NeMo Gym's ``BaseEpisodeRequest`` (``episode_id``, ``task``), ``gymckpt`` beside."""

    episode_id: _EpisodeId
    task: _Task
    gymckpt: _RowExtras = attrs.field(factory=_RowExtras)


@attrs.frozen
class _Result:
    """The ``result`` of a completed episode (NeMo Gym's ``EpisodeResultT``: gymckpt's)."""

    reward: float
    turns: int = attrs.field(validator=_non_negative)
    payload: Any


FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]
"""NeMo Gym's ``failure_kinds.FailureStage``."""


@attrs.frozen
class _Failure:
    """NeMo Gym's ``EpisodeFailure``."""

    failure_reason: str = attrs.field(validator=_reason)
    terminal: bool
    failure_kind: str | None = None
    stage: FailureStage | None = None


def _exactly_one(inst: _WireReply, _attr: attrs.Attribute[Any], _value: Any) -> None:
    if (inst.result is None) == (inst.failure is None):
        raise ValueError("a reply carries exactly one of result or failure")


@attrs.frozen
class _WireReply:
    """NeMo Gym's ``BaseEpisodeResponse``: exactly one of ``result`` and ``failure``."""

    episode_id: _EpisodeId
    task_id: _TaskId
    result: _Result | None = None
    failure: _Failure | None = attrs.field(default=None, validator=_exactly_one)


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


def task_id_of(row: int) -> tuple[str, str]:
    """``(taskset, task_id)`` of the trainer's row ``row``: ``(TASKSET, str(row))``."""
    return TASKSET, str(row)


def _row_of(task_id: _TaskId, what: str) -> int:
    """The row index a ``TaskId`` names (see ``TASKSET``), or ``WireFormatError``."""
    if task_id.taskset != TASKSET or not _ROW_INDEX.match(task_id.task_id):
        raise WireFormatError(
            f"{what}: task_id {{taskset: {task_id.taskset!r}, task_id: {task_id.task_id!r}}} "
            f"names no row: gymckpt's tasks are rows of the trainer's dataset, taskset "
            f"{TASKSET!r} and task_id the row index in decimal"
        )
    return int(task_id.task_id)


def failure_of(reply: Failed | Refused) -> tuple[str, bool, str, FailureStage | None]:
    """``(failure_reason, terminal, failure_kind, stage)``: NeMo Gym's failure record of a
    failed or refused reply. A data failure (the episode's own problem) is terminal (this
    attempt is not run again), kind ``gymckpt:data``, stage ``agent``; a config failure
    likewise, kind ``gymckpt:config``; an infra failure (the
    instance, a model server) is not, kind ``gymckpt:infra``, stage unknown (omitted); a
    refused row (a sidecar row) is not terminal either, kind ``gymckpt:<code>``, stage
    ``admission``. A reason over NeMo Gym's 2000 characters is cut, ending in '…'."""
    if isinstance(reply, Refused):
        reason = f"{reply.code}: the instance refused the row at admission; send it again"
        return reason, False, f"{KIND_PREFIX}{reply.code}", "admission"
    message = reply.message
    if len(message) > FAILURE_REASON_MAX:
        message = message[: FAILURE_REASON_MAX - 1] + "\u2026"
    if reply.failure_class == "infra":
        return message, False, KIND_INFRA, None
    return message, True, KIND_CONFIG if reply.failure_class == "config" else KIND_DATA, "agent"


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
    try:
        return _EpisodeId(base, row.attempt)
    except ValueError as exc:
        raise WireFormatError(f"run row {row.rollout_id!r}: {exc}") from None


def _row_to_wire(row: RunRow) -> _WireRow:
    if isinstance(row.row, bool) or row.row < 0:
        raise WireFormatError(f"run row {row.rollout_id!r}: row {row.row!r} is not a row index")
    return _WireRow(
        _episode_id_of_row(row),
        _Task(_TaskId(*task_id_of(row.row)), row.task),
        _RowExtras(row.slot, row.restored_from, row.policy_version),
    )


def _row_from_wire(w: _WireRow, what: str) -> RunRow:
    return RunRow(
        qualified_key(w.episode_id.rollout_id, w.episode_id.attempt),
        _row_of(w.task.task_id, what),
        w.gymckpt.slot,
        w.episode_id.attempt,
        restored_from=w.gymckpt.restored_from,
        task=w.task.task_input,
        policy_version=w.gymckpt.policy_version,
    )


def _reply_to_wire(reply: RunReply, row: int) -> dict[str, Any]:
    """NeMo Gym's ``BaseEpisodeResponse`` of ``reply`` (of the trainer's row ``row``), as its
    serializer writes it: the absent one of ``result``/``failure`` left out, and so are a
    failure's ``failure_kind`` and ``stage`` when unknown."""
    try:
        eid = _EpisodeId(*split_key(reply.rollout_id))
    except ValueError as exc:
        raise WireFormatError(f"reply for {reply.rollout_id!r}: {exc}") from None
    if isinstance(reply, Completed):
        wire = _WireReply(eid, _TaskId(*task_id_of(row)), result=_Result(*_completed(reply)))
    else:
        wire = _WireReply(eid, _TaskId(*task_id_of(row)), failure=_Failure(*failure_of(reply)))
    raw: dict[str, Any] = _unstructure(wire, _WireReply, "reply")
    for key in ("result", "failure"):
        if raw[key] is None:
            del raw[key]
    failure = raw.get("failure")
    if failure is not None:
        for key in ("failure_kind", "stage"):
            if failure[key] is None:
                del failure[key]
    return raw


def _completed(reply: Completed) -> tuple[float, int, Any]:
    return reply.reward, reply.turns, reply.payload


def _reply_from_raw(raw: Any) -> RunReply:
    what = "wire reply"
    if not isinstance(raw, dict):
        raise WireFormatError(f"{what}: expected an object, got {type(raw).__name__}")
    w: _WireReply = _structure(raw, _WireReply, what)
    _row_of(w.task_id, what)
    rid = qualified_key(w.episode_id.rollout_id, w.episode_id.attempt)
    if w.result is not None:
        return Completed(rid, w.result.reward, w.result.turns, w.result.payload)
    f = w.failure
    assert f is not None  # _exactly_one
    kind = f.failure_kind
    failure_class = _CLASS_OF_KIND.get(kind or "")
    if failure_class is not None:
        return Failed(rid, failure_class, f.failure_reason)  # type: ignore[arg-type]
    if kind is not None and kind.startswith(KIND_PREFIX):
        code = kind[len(KIND_PREFIX) :]
        if code in REFUSAL_CODES and f.stage == "admission" and not f.terminal:
            return Refused(rid, code)
        raise WireFormatError(
            f"{what}: failure_kind {kind!r} (stage {f.stage!r}, terminal {f.terminal}) is not "
            f"one of gymckpt's ({KIND_INFRA}, {KIND_DATA}, {KIND_CONFIG}, or a refusal "
            f"{', '.join(KIND_PREFIX + c for c in sorted(REFUSAL_CODES))} at stage admission)"
        )
    # another producer's kind: terminal is all NeMo Gym says about running it again
    return Failed(rid, "data" if f.terminal else "infra", f.failure_reason)


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
            tuple(_row_from_wire(r, what) for r in wire.rows),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, WireFormatError):
            raise
        raise WireFormatError(f"{what}: {exc}") from None


def encode_batch_line(batch: ReplyBatch, rows: Mapping[str, int]) -> bytes:
    """One line of a ``/run`` body (newline-terminated): the admission header or a batch.
    ``rows``: the trainer's row of each rollout ID the stream carries (a reply names its
    task, as NeMo Gym's does); a reply of a rollout it does not hold is ``WireFormatError``."""
    replies = []
    for reply in batch.replies:
        row = rows.get(reply.rollout_id)
        if row is None:
            raise WireFormatError(
                f"reply for {reply.rollout_id!r}, a rollout this stream did not submit"
            )
        replies.append(_reply_to_wire(reply, row))
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


# -- /mux/v1: many streams over one reply channel -------------------------------------------------


@attrs.frozen
class MuxOpenRequest:
    """One ``POST /mux/v1/open``: open reply channel ``channel`` (the client's id, unique per
    incarnation while open); its body is NDJSON: the channel line, then ``MuxLine``s."""

    channel: int = attrs.field(validator=_non_negative)


@attrs.frozen
class MuxRunRequest:
    """One ``POST /mux/v1/run``: ``run`` (a ``/run`` request's every field) whose replies go
    to the open reply channel ``channel`` as ``MuxLine``s of stream ``run.sid``; the answer
    (200, once every row's fate is decided) is the admission header line."""

    channel: int = attrs.field(validator=_non_negative)
    run: RunRequest


@attrs.frozen
class _WireMuxRunRequest:
    channel: int
    sid: int
    acks: dict[str, int]
    shape: RunShape
    per_row: bool
    max_replies: int
    rows: tuple[_WireRow, ...]


@attrs.frozen
class _WireMuxBatch:
    sid: int
    seq: int
    replies: tuple[dict[str, Any], ...]


@attrs.frozen
class MuxLine:
    """One line of a reply channel after its first: batch ``seq`` of stream ``sid`` (its
    replies still in their JSON form, ``raw``: the client converts them in slices,
    ``decode_reply``), or ``end``: stream ``sid`` replied every row (its end line)."""

    sid: int
    seq: int = HEADER_SEQ
    raw: tuple[dict[str, Any], ...] = ()
    end: bool = False


def encode_mux_open(req: MuxOpenRequest) -> bytes:
    """The body of a ``POST /mux/v1/open``."""
    return _dumps({"channel": req.channel}, "mux open request")


def decode_mux_open(data: bytes) -> MuxOpenRequest:
    """A ``POST /mux/v1/open`` body, strictly."""
    what = "wire mux open request"
    try:
        req: MuxOpenRequest = _structure(_loads(data, what), MuxOpenRequest, what)
    except ValueError as exc:
        if isinstance(exc, WireFormatError):
            raise
        raise WireFormatError(f"{what}: {exc}") from None
    return req


def encode_mux_run_request(req: MuxRunRequest) -> bytes:
    """The body of a ``POST /mux/v1/run``."""
    run = req.run
    wire = _WireMuxRunRequest(
        req.channel,
        run.sid,
        _acks_to_wire(run.acks),
        run.shape,
        run.per_row,
        run.max_replies,
        tuple(_row_to_wire(r) for r in run.rows),
    )
    return _dumps(_unstructure(wire, _WireMuxRunRequest, "mux run request"), "mux run request")


def decode_mux_run_request(data: bytes) -> MuxRunRequest:
    """A ``POST /mux/v1/run`` body, strictly; ``WireFormatError`` says what is wrong."""
    what = "wire mux run request"
    wire: _WireMuxRunRequest = _structure(_loads(data, what), _WireMuxRunRequest, what)
    try:
        run = RunRequest(
            wire.sid,
            _acks_from_wire(wire.acks, what),
            wire.shape,
            wire.per_row,
            wire.max_replies,
            tuple(_row_from_wire(r, what) for r in wire.rows),
        )
        return MuxRunRequest(wire.channel, run)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, WireFormatError):
            raise
        raise WireFormatError(f"{what}: {exc}") from None


def encode_mux_channel_line(channel: int) -> bytes:
    """The first line of a reply channel: ``{"channel": <id>}`` (the channel is open)."""
    return _dumps({"channel": channel}, "mux channel line") + b"\n"


def decode_mux_channel_line(line: bytes) -> int:
    """The channel id of a reply channel's first line, strictly."""
    what = "wire mux channel line"
    raw = _loads(line, what)
    if (
        not isinstance(raw, dict)
        or set(raw) != {"channel"}
        or type(raw["channel"]) is not int
        or raw["channel"] < 0
    ):
        raise WireFormatError(f'{what}: expected {{"channel": <int >= 0>}}, got {raw!r}')
    return int(raw["channel"])


def encode_mux_batch_line(sid: int, batch: ReplyBatch, rows: Mapping[str, int]) -> bytes:
    """One batch of stream ``sid`` on a reply channel (newline-terminated); ``rows`` as for
    ``encode_batch_line``. The replies are NeMo Gym's ``BaseEpisodeResponse``, as on ``/run``."""
    body = encode_batch_line(batch, rows)  # b'{"seq":N,"replies":[...]}\n'
    return b'{"sid":' + str(int(sid)).encode() + b"," + body[1:]


def encode_mux_end_line(sid: int) -> bytes:
    """Stream ``sid`` replied every row: ``{"sid": <id>, "end": true}``."""
    return b'{"sid":' + str(int(sid)).encode() + b',"end":true}\n'


def decode_mux_line(line: bytes) -> MuxLine:
    """One line of a reply channel after the first, strictly, its replies left raw (each one is
    checked when ``decode_reply`` converts it)."""
    what = "wire mux line"
    raw = _loads(line, what)
    if isinstance(raw, dict) and "end" in raw:
        sid = raw.get("sid")
        if set(raw) != {"sid", "end"} or raw["end"] is not True or type(sid) is not int or sid < 0:
            raise WireFormatError(
                f'{what}: a stream\'s end line is exactly {{"sid": <int>, "end": true}}, '
                f"got {raw!r}"
            )
        return MuxLine(sid, end=True)
    wire: _WireMuxBatch = _structure(raw, _WireMuxBatch, what)
    if wire.sid < 0 or wire.seq <= HEADER_SEQ:
        raise WireFormatError(
            f"{what}: sid must be >= 0 and seq > {HEADER_SEQ}, got sid {wire.sid} seq {wire.seq}"
        )
    return MuxLine(wire.sid, wire.seq, wire.replies)


def decode_reply(raw: Any) -> RunReply:
    """One reply of a ``MuxLine`` (NeMo Gym's ``BaseEpisodeResponse``), strictly."""
    return _reply_from_raw(raw)


# -- /control/v1/<op> -----------------------------------------------------------------------------


def _seconds_or_none(_inst: object, attr: attrs.Attribute[float | None], value: object) -> None:
    if value is not None and not (isinstance(value, float) and value >= 0.0):
        raise ValueError(f"{attr.name} must be a number of seconds >= 0 or null, got {value!r}")


@attrs.frozen
class _PrepareArgs:
    checkpoint_id: str
    mode: CheckpointMode = CheckpointMode.ALIGNED
    alignment_timeout_s: float | None = attrs.field(default=None, validator=_seconds_or_none)


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
    ``MethodNotAllowed``, ``UnknownChannel``), ``message`` says what differs and what to do.
    Nothing changed."""

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
