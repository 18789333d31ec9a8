"""A commit's reply as it crosses Ray: its per-episode records in JSON chunks, not objects.

A ``CommitReply`` at 50k episodes holds 100k record objects (``ExportedEpisode``,
``AgentSession``); handed to Ray as it is, Ray's serialiser pickles them in one piece on the
actor's loop, and the driver unpickles them in one piece, each a step of tens of milliseconds
that holds the loop it runs on. ``PackedCommit`` carries the same reply as a few fields and
tuples of ``bytes``: each chunk the JSON of at most ``CUT_SLICE`` records, so pickling it is a
copy of a few buffers. The actor packs on its loop, one chunk per scheduler step
(``pack_commit``: one short ``orjson.dumps`` per chunk, whose records are freed in that step);
the driver unpacks on its loop, one chunk per scheduler step (``unpack_commit``). Packing in a
worker thread instead had that thread compete with the instance's episodes for the
interpreter (each handover of the GIL costs the loop up to the switch interval). Unpacked, it
equals the reply the host gave.
"""

from __future__ import annotations

from typing import Any, final

import anyio.lowlevel
import attrs
import orjson

from gymckpt.runtime.lowlevel import collector_paused, records_promoted

from ..._contract import AgentSession, CommitReply, ExportedEpisode, ParticipantInfo
from ...host._cut import CUT_SLICE

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


async def _chunks_in_slices(rows: list[Any], fields: Any) -> tuple[bytes, ...]:
    """``rows`` as JSON chunks of at most ``CUT_SLICE`` records, one chunk per scheduler step;
    each chunk's records are taken out of ``rows`` once encoded (``rows`` ends empty), so the
    last reference to them dies in that step, not all at once."""
    chunks: list[bytes] = []
    while rows:
        chunks.append(orjson.dumps([fields(r) for r in rows[:CUT_SLICE]]))
        del rows[:CUT_SLICE]
        await anyio.lowlevel.checkpoint()
    return tuple(chunks)


async def pack_commit(box: list[CommitReply]) -> PackedCommit:
    """The reply in ``box`` (its only reference: the box is emptied) packed for Ray on the
    calling loop, one chunk of records per scheduler step (``_chunks_in_slices``), so the
    instance's episodes step between two chunks and no thread competes with them for the
    interpreter; no full collection runs meanwhile (``collector_paused``)."""
    reply = box.pop()
    exported, sessions = list(reply.exported), list(reply.sessions)
    instance, checkpoint_id = reply.instance, reply.checkpoint_id
    participants, on_wire, mid_turn = reply.participants, reply.on_wire, reply.mid_turn
    del reply  # the lists are now the records' only holders
    with collector_paused():
        exported_chunks = await _chunks_in_slices(
            exported, lambda e: (e.rollout_id, e.owner, e.capture_keys)
        )
        session_chunks = await _chunks_in_slices(
            sessions,
            lambda s: (s.rollout_id, s.participant, s.kind, s.step_boundary, s.capture_keys),
        )
    return PackedCommit(
        instance,
        checkpoint_id,
        participants,
        exported_chunks,
        orjson.dumps(on_wire),
        session_chunks,
        mid_turn,
    )


async def unpack_commit(packed: PackedCommit) -> CommitReply:
    """The ``CommitReply`` ``packed`` carries, one chunk of records per scheduler step, with no
    full collection of what the process holds while its records are made
    (``collector_paused``), and no collection at all while one chunk's are
    (``records_promoted``: the young generations the trainer's loop filled are not walked once
    per thousand records)."""
    exported: list[ExportedEpisode] = []
    sessions: list[AgentSession] = []
    with collector_paused():
        for chunk in packed.exported:
            with records_promoted():
                exported.extend(ExportedEpisode(r, o, tuple(k)) for r, o, k in orjson.loads(chunk))
            await anyio.lowlevel.checkpoint()
        for chunk in packed.sessions:
            with records_promoted():
                sessions.extend(
                    AgentSession(r, p, kind, b, tuple(k))
                    for r, p, kind, b, k in orjson.loads(chunk)
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
