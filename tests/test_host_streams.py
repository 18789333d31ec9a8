"""Reply streams of the Gym host (``gym_adapter.host._streams``): batches go out per flush
interval, at once when ``max_batch`` are pending or every row replied, sorted by rollout ID; a
reply is on the wire from ``push`` until the consumer asks for the next batch; a drop fault, a
closed consumer or a dead instance end the stream and take what cannot be delivered off the
wire. Run under trio with pytest-trio's ``autojump_clock``; the streams are built directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter._contract import Completed, GymInstanceDead
from gymckpt.gym_adapter.host._streams import HostReplyStream, ReplyStreams, RunStream


def done(rid: str) -> Completed:
    return Completed(rid, 1.0, 1)


def ids(batch: object) -> list[str]:
    return [r.rollout_id for r in batch]  # type: ignore[attr-defined]


@asynccontextmanager
async def running(
    streams: ReplyStreams, rows: int, drop_after: int | None = None
) -> AsyncIterator[tuple[RunStream, HostReplyStream]]:
    async with anyio.create_task_group() as tg:
        st = streams.open(rows, drop_after)
        streams.start(tg, st)
        yield st, HostReplyStream(streams, st)
        streams.end_all()


async def test_batch_per_interval_on_wire_until_the_next_ask(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 3) as (st, stream):
        t0 = trio.current_time()
        for rid in ("b", "a"):
            streams.push(st, done(rid))
            streams.row_done(st)
        assert set(streams.on_wire) == {"a", "b"}
        assert ids(await stream.__anext__()) == ["a", "b"]
        assert trio.current_time() - t0 == pytest.approx(1.0)
        assert set(streams.on_wire) == {"a", "b"}  # delivered, not yet acknowledged
        streams.push(st, done("c"))
        streams.row_done(st)  # every row replied: no wait for the interval
        assert ids(await stream.__anext__()) == ["c"]
        assert set(streams.on_wire) == {"c"}
        assert trio.current_time() - t0 == pytest.approx(1.0)
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert streams.on_wire == {}
        assert st not in streams.streams
        assert (streams.batches, streams.discarded) == (2, 0)


async def test_max_batch_goes_out_at_once_sorted_across_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(10.0, 2)
    async with running(streams, 5) as (st, stream):
        t0 = trio.current_time()
        streams.push(st, done("b"))
        streams.push(st, done("a"))
        assert ids(await stream.__anext__()) == ["a", "b"]
        assert trio.current_time() == t0
        for rid in ("e", "d", "c"):
            streams.push(st, done(rid))
        assert ids(await stream.__anext__()) == ["c", "d"]
        assert trio.current_time() == t0
        assert ids(await stream.__anext__()) == ["e"]  # alone: waits for the interval
        assert trio.current_time() - t0 == pytest.approx(10.0)
        assert set(streams.on_wire) == {"e"}


async def test_drop_after_ends_the_stream_and_discards_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 4, drop_after=2) as (st, stream):
        for rid in ("d", "c", "b", "a"):
            streams.push(st, done(rid))
        assert ids(await stream.__anext__()) == ["a", "b"]
        assert st.ended and st.pending == []
        assert set(streams.on_wire) == {"a", "b"}
        assert streams.discarded == 2
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert streams.on_wire == {}
        streams.push(st, done("x"))  # a late reply of a running row
        assert "x" not in streams.on_wire
        assert streams.discarded == 3


async def test_drop_after_zero_ends_before_any_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 2, drop_after=0) as (st, stream):
        assert st.ended
        streams.push(st, done("a"))
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert streams.on_wire == {} and streams.discarded == 1


async def test_rows_without_final_replies_end_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 2) as (st, stream):
        streams.row_done(st)
        streams.row_done(st)
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert streams.batches == 0


async def test_aclose_acks_discards_undelivered_and_is_idempotent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 1)
    async with running(streams, 3) as (st, stream):
        streams.push(st, done("a"))
        assert ids(await stream.__anext__()) == ["a"]
        streams.push(st, done("b"))
        await trio.testing.wait_all_tasks_blocked()
        assert streams.batches == 2  # b's batch is sent, not received
        assert set(streams.on_wire) == {"a", "b"}
        await stream.aclose()
        assert streams.on_wire == {}
        assert streams.discarded == 1
        assert st not in streams.streams and st.ended
        await stream.aclose()
        assert streams.discarded == 1
        streams.push(st, done("c"))  # the row kept running; its reply has nowhere to go
        assert streams.on_wire == {} and streams.discarded == 2
        assert repr(stream) == "<HostReplyStream rows_left=3 pending=0 ended=True>"


async def test_dead_instance_raises_and_clears_the_wire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 1)
    async with running(streams, 3) as (st, stream):
        streams.push(st, done("a"))
        await trio.testing.wait_all_tasks_blocked()
        streams.dead_instance = "gym-0"
        streams.end_all()
        assert streams.on_wire == {} and streams.streams == {}
        with pytest.raises(GymInstanceDead, match=r"instance gym-0 is dead \(during run\)"):
            await stream.__anext__()


async def test_ack_and_discard_touch_only_their_own_stream() -> None:
    streams = ReplyStreams(1.0, 8)
    old, new = streams.open(1, None), streams.open(1, None)
    streams.push(old, done("r"))
    streams.push(new, done("r"))  # a later attempt's reply now carries the rollout ID
    assert streams.on_wire["r"] is new
    streams.ack(old, ["r"])
    streams.discard(old, [done("r")])
    assert streams.on_wire["r"] is new
    assert streams.discarded == 1
    streams.ack(new, ["r", "unknown"])
    assert streams.on_wire == {}
    streams.end_all()


# -- holding (an unaligned checkpoint's cut) ------------------------------------------------------


async def test_held_replies_are_neither_on_the_wire_nor_delivered_until_release(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 4) as (st, stream):
        streams.push(st, done("a"))  # before the cut: on the wire, delivered as usual
        streams.hold()
        for rid in ("d", "b", "c"):
            streams.push(st, done(rid))
            streams.row_done(st)
        streams.row_done(st)  # every row replied: a stream without held replies would end
        assert set(streams.on_wire) == {"a"} and streams.held == 3
        assert ids(await stream.__anext__()) == ["a"]
        with trio.move_on_after(100) as scope:
            await stream.__anext__()  # nothing more until the release, and no end either
        assert scope.cancelled_caught and not st.ended
        assert streams.on_wire == {}  # the ask acknowledged a; the held are not on it
        assert streams.release() == 3
        assert not streams.holding and streams.held == 0
        assert set(streams.on_wire) == {"b", "c", "d"}
        assert [r.rollout_id for r in st.pending] == ["d", "b", "c"]  # in push order
        assert ids(await stream.__anext__()) == ["b", "c", "d"]
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert streams.on_wire == {} and streams.discarded == 0


async def test_release_puts_each_streams_held_replies_on_its_own_wire() -> None:
    streams = ReplyStreams(1.0, 8)
    one, two = streams.open(2, None), streams.open(2, None)
    streams.hold()
    streams.push(two, done("x"))
    streams.push(one, done("y"))
    streams.push(two, done("z"))
    assert streams.release() == 3
    assert streams.on_wire == {"x": two, "y": one, "z": two}
    assert ids(two.pending) == ["x", "z"] and ids(one.pending) == ["y"]
    assert streams.release() == 0  # nothing held: a no-op
    streams.push(one, done("w"))  # released: pushed replies go on the wire again
    assert streams.on_wire["w"] is one
    streams.end_all()


async def test_ending_a_stream_discards_its_held_replies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = ReplyStreams(1.0, 8)
    async with running(streams, 3) as (st, stream):
        streams.hold()
        streams.push(st, done("a"))
        streams.push(st, done("b"))
        await stream.aclose()  # the consumer went away while they were held
        assert streams.held == 0 and streams.discarded == 2
        assert streams.release() == 0
        assert streams.on_wire == {} and st.pending == []
