"""A commit's reply as it crosses Ray: its per-episode records in JSON chunks, not objects.

A ``CommitReply`` at 50k episodes holds 100k record objects (``ExportedEpisode``,
``AgentSession``); handed to Ray as it is, Ray's serialiser pickles them in one piece on the
actor's loop, and the driver unpickles them in one piece, each a step of tens of milliseconds
that holds the loop it runs on. ``PackedCommit`` carries the same reply as a few fields and
tuples of ``bytes``: each chunk the JSON of at most ``CUT_SLICE`` records, so pickling it is a
copy of a few buffers. The actor packs in a worker thread (``pack_commit``: one short
``orjson.dumps`` per chunk, the reply freed there too); the driver unpacks on its loop, one
chunk per scheduler step (``unpack_commit``). Unpacked, it equals the reply the host gave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import anyio.lowlevel
import attrs
import orjson

from gymckpt.runtime.lowlevel import collector_paused

from ..._contract import AgentSession, CommitReply, ExportedEpisode, ParticipantInfo
from ...host._cut import CUT_SLICE
from ...host._records import offload

__all__ = ["PackedCommit", "pack_commit", "unpack_commit"]


@final
@attrs.frozen
class PackedCommit:
    """A ``CommitReply`` packed for Ray (module docstring). ``exported`` and ``sessions``: JSON
    arrays of at most ``CUT_SLICE`` records each, a record an array of its fields in order
    (``capture_keys`` an array); ``on_wire``: one JSON array of rollout IDs. Invariant:
    ``unpack_commit(pack(reply)) == reply``."""

    instance: str
    checkpoint_id: str
    participants: tuple[ParticipantInfo, ...]
    exported: tuple[bytes, ...]
    on_wire: bytes
    sessions: tuple[bytes, ...]
    mid_turn: int


def _chunks(rows: Sequence[Any], fields: Any) -> tuple[bytes, ...]:
    return tuple(
        orjson.dumps([fields(r) for r in rows[start : start + CUT_SLICE]])
        for start in range(0, len(rows), CUT_SLICE)
    )


def _packed(box: list[CommitReply]) -> PackedCommit:
    """Pack the reply ``box`` holds, taking it out of the box: its last reference dies here,
    so its records are freed in this (worker) thread, not on the loop."""
    reply = box.pop()
    packed = PackedCommit(
        reply.instance,
        reply.checkpoint_id,
        reply.participants,
        _chunks(reply.exported, lambda e: (e.rollout_id, e.owner, e.capture_keys)),
        orjson.dumps(reply.on_wire),
        _chunks(
            reply.sessions,
            lambda s: (s.rollout_id, s.participant, s.kind, s.step_boundary, s.capture_keys),
        ),
        reply.mid_turn,
    )
    del reply
    return packed


async def pack_commit(box: list[CommitReply]) -> PackedCommit:
    """The reply in ``box`` (its only reference: the box is emptied) packed for Ray, in a
    worker thread (``offload``)."""
    return await offload(lambda: _packed(box))


async def unpack_commit(packed: PackedCommit) -> CommitReply:
    """The ``CommitReply`` ``packed`` carries, one chunk of records per scheduler step, with no
    full collection of what the process holds while its records are made
    (``collector_paused``)."""
    exported: list[ExportedEpisode] = []
    sessions: list[AgentSession] = []
    with collector_paused():
        for chunk in packed.exported:
            exported.extend(ExportedEpisode(r, o, tuple(k)) for r, o, k in orjson.loads(chunk))
            await anyio.lowlevel.checkpoint()
        for chunk in packed.sessions:
            sessions.extend(
                AgentSession(r, p, kind, b, tuple(k)) for r, p, kind, b, k in orjson.loads(chunk)
            )
            await anyio.lowlevel.checkpoint()
    return CommitReply(
        packed.instance,
        packed.checkpoint_id,
        packed.participants,
        tuple(exported),
        tuple(orjson.loads(packed.on_wire)),
        tuple(sessions),
        packed.mid_turn,
    )
