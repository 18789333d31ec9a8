"""The JSON wire form of everything that crosses a process boundary: no pickle needed.

A transport sends a contract record or an error as JSON bytes and the other side decodes them
strictly, with validation, through the project's converter (``runtime.converter``: strict
scalar types, unknown keys refused), copied here with the hooks the wire adds:

- ``RunReply`` (``Completed | Failed | Refused``) crosses tagged, ``{"type": "Completed", …}``;
- an error crosses as its class and its constructor arguments (``WireError``): every error of
  ``WIRE_ERRORS`` is rebuilt as itself on the other side. Any other error crosses as what the
  runtime sees for any error that cannot cross: ``GymCheckpointUnavailable`` naming it
  (retryable, S6), so the ``GymUnavailable`` family is all a remote Gym can raise besides
  ``WIRE_ERRORS``.

``WIRE_RECORDS`` lists every record with a wire form; ``tests/test_wire.py`` round-trips each
one and fails on a contract record that is missing from it. ``SessionView`` has none on purpose:
its ``state`` is a participant's live object, which stays in its process (``RetainedSession``
carries the same session exported as plain data).

Malformed input (not JSON, a missing or unknown key, a value of the wrong type, an unknown error
class on decode) raises ``WireFormatError`` naming the record and the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs
import cattrs
import orjson
from cattrs.strategies import configure_tagged_union
from cattrs.v import format_exception

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
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    StrandedSessionError,
    TopologyMismatch,
    TrainerTerm,
)
from gymckpt.runtime._shared import converter

from .._contract import (
    AgentSession,
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
    RunReply,
    RunRow,
    Topology,
)
from .._faults import FaultSpec
from ..host._episode import EnvironmentSpecError
from ..host._host import HostConfig, HostStatistics
from ..host._views import RetainedSession
from ._admission import ReplyBatch, RunShape
from ._deadlines import WireDeadline
from ._statistics import GymStatistics

__all__ = [
    "WIRE_ERRORS",
    "WIRE_RECORDS",
    "WireError",
    "WireFormatError",
    "decode",
    "decode_error",
    "encode",
    "encode_error",
    "wire_converter",
]

T = TypeVar("T")


class WireFormatError(ValueError):
    """Bytes received from another process are not the wire form of what was expected."""


@attrs.frozen
class WireError:
    """An error as it crosses: its class name (a key of ``WIRE_ERRORS``) and its constructor
    arguments (each error's ``args`` are exactly those)."""

    type: str
    args: tuple[Any, ...]


WIRE_RECORDS: Final[tuple[type, ...]] = (
    RunRow,
    Completed,
    Failed,
    Refused,
    ReplyBatch,
    RunShape,
    ParticipantInfo,
    ExportedEpisode,
    AgentSession,
    PrepareReply,
    CommitReply,
    RetireReply,
    RestoreReply,
    TrainerTerm,
    AttachReply,
    InstanceTopology,
    Topology,
    InstanceInventory,
    ParticipantRecord,
    InstanceRecord,
    EpisodeRecord,
    HostConfig,
    HostStatistics,
    RetainedSession,
    GymStatistics,
    FaultSpec,
    WireDeadline,
    WireError,
)
"""Every record with a wire form (``encode``/``decode``)."""

WIRE_ERRORS: Final[Mapping[str, tuple[type[Exception], tuple[Any, ...]]]] = {
    cls.__name__: (cls, sig)
    for cls, sig in (
        (GymCheckpointUnavailable, (str, str, str)),
        (GymControlError, (str, str, str)),
        (GymInstanceDead, (str, str)),
        (GymCallTimeout, (str, str, str)),
        (GymConnectionLost, (str, str)),
        (GymAdmissionClosed, (str, str)),
        (DrainTimeout, (tuple[str, ...], float)),
        (StrandedSessionError, (str, tuple[str, ...])),
        (TopologyMismatch, (tuple[str, ...],)),
        (ManifestError, (str,)),
        (EnvironmentSpecError, (str,)),
        (GymInUse, (str, str, str)),
    )
}
"""Error class name -> (class, the types of its constructor arguments): the errors that cross
as themselves."""

wire_converter = converter.copy()
"""The project's strict converter with the wire's hooks (``RunReply`` tagged by class)."""
configure_tagged_union(RunReply, wire_converter, tag_name="type")


def _describe(exc: BaseException, type_: Any) -> str:
    """cattrs' description of one problem, with the validator's own message when it has one."""
    text = format_exception(exc, type_)
    own = str(exc)
    if isinstance(exc, (TypeError, ValueError)) and own and own not in text:
        text = f"{text} ({own})"
    return text


def _fail(what: str, exc: Exception) -> WireFormatError:
    if isinstance(exc, (cattrs.BaseValidationError, cattrs.errors.ForbiddenExtraKeysError)):
        problems = "; ".join(
            cattrs.transform_error(exc, path="$", format_exception=_describe)
        ) or str(exc)
    else:
        problems = str(exc)
    return WireFormatError(f"{what}: {problems}")


def _name(cls: Any) -> str:
    return getattr(cls, "__name__", None) or str(cls)


def encode(obj: Any, as_: Any = None) -> bytes:
    """``obj`` as JSON bytes. ``as_`` is its declared type when that is not ``type(obj)`` (a
    ``RunReply``, a tuple of records…); a value that has no JSON form raises
    ``WireFormatError``."""
    try:
        raw = wire_converter.unstructure(obj, unstructure_as=as_ if as_ is not None else type(obj))
        return orjson.dumps(raw)
    except (TypeError, ValueError) as exc:
        raise _fail(f"cannot encode {type(obj).__name__}", exc) from None


def decode(data: bytes, cls: Any) -> Any:
    """Parse the JSON bytes ``data`` strictly as ``cls``; ``WireFormatError`` names what is
    wrong."""
    what = f"wire {_name(cls)}"
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireFormatError(f"{what}: not valid JSON ({exc})") from None
    try:
        return wire_converter.structure(raw, cls)
    except (cattrs.BaseValidationError, cattrs.errors.ForbiddenExtraKeysError) as exc:
        raise _fail(what, exc) from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise WireFormatError(f"{what}: {exc}") from None


def encode_error(exc: BaseException, instance: str, op: str) -> bytes:
    """``exc`` (raised by Gym for ``op`` on ``instance``) as JSON bytes: an error of
    ``WIRE_ERRORS`` as itself, any other as ``GymCheckpointUnavailable`` describing it."""
    entry = WIRE_ERRORS.get(type(exc).__name__)
    if entry is not None and entry[0] is type(exc):
        try:
            return encode(WireError(type(exc).__name__, tuple(exc.args)))
        except WireFormatError:
            pass
    stand_in = GymCheckpointUnavailable(
        f"Gym raised an error that cannot cross: {type(exc).__name__}: {exc}", instance, op
    )
    return encode(WireError(GymCheckpointUnavailable.__name__, tuple(stand_in.args)))


def decode_error(data: bytes) -> Exception:
    """The error ``encode_error`` encoded, rebuilt as its class; ``WireFormatError`` if
    ``data`` is not one of ``WIRE_ERRORS`` with arguments of the right types."""
    wire: WireError = decode(data, WireError)
    entry = WIRE_ERRORS.get(wire.type)
    if entry is None:
        raise WireFormatError(
            f"wire error: unknown error class {wire.type!r} (known: {', '.join(WIRE_ERRORS)})"
        )
    cls, signature = entry
    if len(wire.args) != len(signature):
        raise WireFormatError(
            f"wire error {wire.type}: {len(wire.args)} arguments, expected {len(signature)}"
        )
    try:
        args = [
            wire_converter.structure(arg, typ)
            for arg, typ in zip(wire.args, signature, strict=True)
        ]
    except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
        raise _fail(f"wire error {wire.type}", exc) from None
    return cls(*args)
