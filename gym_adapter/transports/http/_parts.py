"""A commit's answer in parts: an NDJSON body the server encodes, and the client decodes, one
part per scheduler step (``PARTS_FEATURE``).

A ``CommitReply`` at 50k episodes is 100k records. Answered in one piece (``encode_result``),
the server encodes all of them in one step of its loop, which steps the instance's episodes
too, and the client decodes all of them in one piece. In parts, neither side holds its loop
for more than ``PART_RECORDS`` records: the server sends each part as it encodes it, with a
scheduler checkpoint between two parts (its episodes go on meanwhile), and the client decodes
each line as it arrives, with a checkpoint between two lines.

The body (``Content-Type: application/x-ndjson``), one JSON object per line:

1. ``{"head": {"instance", "checkpoint_id", "participants", "on_wire", "mid_turn",
   "exported", "sessions"}}``: the reply's fields but its records, in their one-piece wire
   form, with ``exported`` and ``sessions`` the number of records each kind has;
2. ``{"exported": [...]}`` lines, then ``{"sessions": [...]}`` lines: at most
   ``PART_RECORDS`` records each, every record in its one-piece wire form, in the reply's
   order.

A client asks for it with ``Accept: application/x-ndjson`` on ``POST /control/v1/commit``, and
only of a server whose ``GET /health`` advertises ``PARTS_FEATURE``; an older server (or any
other answer than a 200) answers as before. A body that stops before the head's counts are
reached, that carries more, or a line out of this order is not the wire form
(``WireFormatError``): the commit failed and is retried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, final

import trio

from gymckpt.runtime.lowlevel import collector_paused, records_promoted

from ..._contract import AgentSession, CommitReply, ExportedEpisode, ParticipantInfo
from .._wire import WireFormatError
from ._wire import _dumps, _loads, _structure, _unstructure

__all__ = [
    "NDJSON",
    "PARTS_FEATURE",
    "PART_RECORDS",
    "CommitParts",
    "decode_in_steps",
    "encode_commit_parts",
]

PARTS_FEATURE: Final = "parts/1"
"""The feature (``Gymckpt-Features`` of ``GET /health``) of a commit answered in parts."""
NDJSON: Final = "application/x-ndjson"
"""The media type a client accepts to get a commit's answer in parts, and the answer's."""
PART_RECORDS: Final = 1024
"""The most records in one part: what one side encodes or decodes in one scheduler step
(about 2 ms decoding ``AgentSession`` records)."""

_HEAD_KEYS: Final = frozenset(
    {"instance", "checkpoint_id", "participants", "on_wire", "mid_turn", "exported", "sessions"}
)
_KINDS: Final = (("exported", ExportedEpisode), ("sessions", AgentSession))
_CLASSES: Final = dict(_KINDS)


def encode_commit_parts(reply: CommitReply) -> Iterator[bytes]:
    """The lines of ``reply``'s answer in parts (module docstring), each ending in a newline,
    encoded one at a time as the caller takes them."""
    head = {
        "instance": reply.instance,
        "checkpoint_id": reply.checkpoint_id,
        "participants": _unstructure(
            reply.participants, tuple[ParticipantInfo, ...], "commit participants"
        ),
        "on_wire": list(reply.on_wire),
        "mid_turn": reply.mid_turn,
        "exported": len(reply.exported),
        "sessions": len(reply.sessions),
    }
    yield _dumps({"head": head}, "commit head") + b"\n"
    for kind, cls in _KINDS:
        records: Sequence[Any] = getattr(reply, kind)
        for start in range(0, len(records), PART_RECORDS):
            part = records[start : start + PART_RECORDS]
            raw = _unstructure(part, tuple[cls, ...], f"commit {kind}")  # type: ignore[valid-type]
            yield _dumps({kind: raw}, f"commit {kind}") + b"\n"


@final
class CommitParts:
    """A commit's answer in parts being decoded, one line per ``feed``. Invariant: the head
    came first; records of a kind arrive only once every earlier kind is complete, and never
    past the head's count."""

    __slots__ = ("_counts", "_head", "_records", "largest_part")

    def __init__(self) -> None:
        self._head: dict[str, Any] | None = None
        self._counts: dict[str, int] = {}
        self._records: dict[str, list[Any]] = {kind: [] for kind, _ in _KINDS}
        self.largest_part = 0
        """The most records one ``feed`` decoded."""

    def feed(self, line: bytes) -> None:
        """Decode one line of the body, strictly (``WireFormatError`` if it is not the next
        line the wire form allows)."""
        what = "wire commit part"
        raw = _loads(line, what)
        if not isinstance(raw, dict) or len(raw) != 1:
            raise WireFormatError(f"{what}: expected an object with exactly one key")
        ((key, value),) = raw.items()
        if self._head is None:
            self._take_head(key, value)
            return
        cls = _CLASSES.get(key)
        if cls is None:
            raise WireFormatError(f"{what}: unknown part {key!r} (exported or sessions)")
        for kind, _ in _KINDS[: [k for k, _ in _KINDS].index(key)]:
            if len(self._records[kind]) != self._counts[kind]:
                raise WireFormatError(f"{what}: {key} before every one of the {kind} records")
        if not isinstance(value, list) or not value:
            raise WireFormatError(f"{what}: {key} must be a non-empty array of records")
        got = self._records[key]
        if len(got) + len(value) > self._counts[key]:
            raise WireFormatError(f"{what}: more {key} records than the head's {self._counts[key]}")
        got.extend(_structure(value, tuple[cls, ...], f"{what} {key}"))  # type: ignore[valid-type]
        self.largest_part = max(self.largest_part, len(value))

    def _take_head(self, key: str, value: Any) -> None:
        what = "wire commit head"
        if key != "head":
            raise WireFormatError(f"wire commit part: {key!r} before the head")
        if not isinstance(value, dict) or set(value) != _HEAD_KEYS:
            raise WireFormatError(f"{what}: expected exactly the keys {sorted(_HEAD_KEYS)}")
        for kind, _ in _KINDS:
            count = value[kind]
            if type(count) is not int or count < 0:
                raise WireFormatError(f"{what}: {kind} must be a count, got {count!r}")
            self._counts[kind] = count
        self._head = value

    def reply(self) -> CommitReply:
        """The ``CommitReply`` the body carried, once it ended (``WireFormatError`` if it
        stopped short of the head's counts)."""
        if self._head is None:
            raise WireFormatError("wire commit parts: the body ended before its head")
        for kind, _ in _KINDS:
            if len(self._records[kind]) != self._counts[kind]:
                raise WireFormatError(
                    f"wire commit parts: the body ended after {len(self._records[kind])} of "
                    f"{self._counts[kind]} {kind} records"
                )
        head = {k: v for k, v in self._head.items() if k not in self._counts}
        head["exported"] = []
        head["sessions"] = []
        shell: CommitReply = _structure(head, CommitReply, "wire commit head")
        return CommitReply(
            shell.instance,
            shell.checkpoint_id,
            shell.participants,
            tuple(self._records["exported"]),
            shell.on_wire,
            tuple(self._records["sessions"]),
            shell.mid_turn,
        )


async def decode_in_steps(next_line: Callable[[], Awaitable[bytes | None]]) -> CommitParts:
    """The body whose lines ``next_line`` gives (None at its end) decoded one line per
    scheduler step, even for lines that arrived together, with no full collection while its
    records are made (``collector_paused``) and no collection at all while one line's are
    (``records_promoted``: the young generations the trainer's loop filled are not walked once
    per thousand records). ``WireFormatError`` as ``CommitParts.feed``."""
    parts = CommitParts()
    with collector_paused():
        while (line := await next_line()) is not None:
            with records_promoted():
                parts.feed(line)
            await trio.lowlevel.checkpoint()
    return parts
