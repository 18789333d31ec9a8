"""A commit's reply as it crosses Ray (``gym_adapter.transports.ray._commit_wire``): packed, it
carries its per-episode records as JSON chunks of at most ``CUT_SLICE`` records and no record
object (so Ray's serialiser copies a few buffers, not 100k objects in one piece); unpacked, one
chunk per scheduler step, it equals the reply the host gave; the actor packs one chunk per
scheduler step on its loop, in no worker thread; and the actor hands every commit reply to Ray
packed. No Ray cluster: the actor's control path runs in this trio run.
"""

from __future__ import annotations

import math
import pickle
import time
from pathlib import Path

import anyio.to_thread
import attrs
import pytest
import trio
import trio.testing
from collections_seen import collections_seen

from gymckpt.gym_adapter import EnvironmentRef, RunRow
from gymckpt.gym_adapter._contract import (
    AgentSession,
    CommitReply,
    ExportedEpisode,
    ParticipantInfo,
)
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.gym_adapter.host._cut import CUT_SLICE
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports.ray._actor import GymActor
from gymckpt.gym_adapter.transports.ray._commit_wire import (
    PackedCommit,
    pack_commit,
    unpack_commit,
)
from gymckpt.runtime import CheckpointMode, rollout_id_for


def a_reply(n: int) -> CommitReply:
    rids = [rollout_id_for(r, 0, r % 3) for r in range(n)]
    keys = [tuple(f"{rid}:t{t}" for t in range(i % 4)) for i, rid in enumerate(rids)]
    return CommitReply(
        "gym-0",
        "c7",
        (ParticipantInfo("agent", "simple_agent", "gym-0/agent", "ab" * 32),),
        tuple(ExportedEpisode(rid, "calendar", k) for rid, k in zip(rids, keys, strict=True)),
        (rids[0], rids[-1]),
        tuple(
            AgentSession(rid, "agent", "simple_agent", None if i == 1 else i % 50, k)
            for i, (rid, k) in enumerate(zip(rids, keys, strict=True))
        ),
        mid_turn=n // 2,
    )


class Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_a_packed_reply_is_json_chunks_and_unpacks_to_the_same_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    n = 2 * CUT_SLICE + 5
    reply = a_reply(n)
    packed = await pack_commit([reply])
    assert len(packed.exported) == len(packed.sessions) == math.ceil(n / CUT_SLICE)
    for chunk in (*packed.exported, *packed.sessions):
        assert type(chunk) is bytes
    wire = pickle.dumps(packed)
    assert b"ExportedEpisode" not in wire and b"AgentSession" not in wire, (
        "a record object crosses Ray as an object"
    )
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        unpacked = await unpack_commit(pickle.loads(wire))
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert unpacked == reply
    assert steps.steps >= 2 * math.ceil(n / CUT_SLICE), "unpacking did not yield per chunk"


async def test_the_actor_packs_a_chunk_per_step_on_its_loop(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing yields to the instance's episodes between two chunks (no step encodes more
    than ``CUT_SLICE`` records), in no worker thread (which would compete with them for the
    interpreter), and empties the box it was handed."""

    def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("the commit reply was packed in a worker thread")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    monkeypatch.setattr(trio.to_thread, "run_sync", no_thread)
    n = 3 * CUT_SLICE + 1
    box = [a_reply(n)]
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        packed = await pack_commit(box)
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert box == []
    assert len(packed.exported) == len(packed.sessions) == math.ceil(n / CUT_SLICE)
    assert steps.steps >= 2 * math.ceil(n / CUT_SLICE), "packing did not yield per chunk"


async def test_an_empty_and_a_legacy_reply_round_trip(
    autojump_clock: trio.testing.MockClock,
) -> None:
    empty = CommitReply("gym-0", "c", (), (), ())
    legacy = attrs.evolve(a_reply(3), exported=())  # a legacy environment exports none
    for reply in (empty, legacy):
        assert await unpack_commit(await pack_commit([reply])) == reply


async def test_the_actor_hands_a_commit_reply_to_ray_packed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The actor's control path (what Ray calls, here without Ray): an unaligned checkpoint's
    commit returns a ``PackedCommit`` holding every running episode."""
    cfg = CalendarConfig()
    env = EnvironmentRef.to(calendar_environment, agent_kind="simple_agent", config=cfg)
    actor = GymActor("gym-0", env, 0, str(tmp_path), cfg.host_config())

    def deadline() -> WireDeadline:
        return WireDeadline.send(trio.current_time() + 30.0, trio.current_time(), time.time())

    async with actor._sim as host:
        rows = [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(5)]
        await host.run(rows)
        await trio.sleep(0.001)
        args = {"checkpoint_id": "c1", "mode": CheckpointMode.UNALIGNED}
        await actor._control("prepare", args, deadline(), None, {}, None)
        args = {"checkpoint_id": "c1", "state_root": str(tmp_path / "snap")}
        packed = await actor._control("commit", args, deadline(), None, {}, None)
        assert isinstance(packed, PackedCommit)
        reply = await unpack_commit(packed)
        assert sorted(s.rollout_id for s in reply.sessions) == [r.rollout_id for r in rows]
        await actor._control("resume", {"checkpoint_id": "c1"}, deadline(), None, {}, None)


async def test_no_collection_runs_while_a_commit_reply_is_unpacked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each chunk's records are made with no garbage collection and then promoted
    (``records_promoted``): on the trainer's loop a young collection walks whatever CPython
    put back in the young generations uncounted (tens of ms at 200k in flight), several times
    per chunk on main. The unpacked reply is unchanged."""
    reply = a_reply(8 * CUT_SLICE)
    packed = await pack_commit([reply])
    with collections_seen() as collections:
        unpacked = await unpack_commit(packed)
    assert collections == [], f"{len(collections)} collections while 16k records were unpacked"
    assert unpacked == a_reply(8 * CUT_SLICE)
