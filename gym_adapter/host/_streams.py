"""Reply streams of the Gym host: batching, the on-the-wire list, acknowledgements.

A ``run`` gets one stream. Final replies are batched (one batch per flush interval, or as soon
as ``max_batch`` are pending) and every batch is sorted by rollout ID, so the same calls give
the same batches. A reply is *on the wire* from the moment it is pushed until the consumer asks
for the batch after the one that carried it (``HostReplyStream.__anext__`` acknowledges the
previous batch); ``commit`` reports that list and the runtime drains it. Replies that can no
longer be delivered (the stream was dropped, closed or the instance died) are discarded and
leave the list. Written against anyio only: the same code under trio and under asyncio.

*Holding* (an unaligned checkpoint's cut): from ``hold()`` until ``release()`` a pushed reply
waits beside its stream, not on the wire and not delivered, so nothing the instance produces
after its cut reaches the trainer before the checkpoint resumes it; replies pushed before the
cut flow on as usual (the checkpoint drains them). A stream with held replies does not end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import final

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._contract import GymInstanceDead, RunReply

__all__ = ["HostReplyStream", "ReplyStreams", "RunStream"]

Batch = tuple[RunReply, ...]


@attrs.define(eq=False, slots=True)
class RunStream:
    """The host's side of one ``run``."""

    send: MemoryObjectSendStream[Batch]
    receive: MemoryObjectReceiveStream[Batch]
    rows_left: int
    drop_after: int | None
    wake: anyio.Event
    scope: anyio.CancelScope
    pending: list[RunReply] = attrs.field(factory=list)
    held: list[RunReply] = attrs.field(factory=list)
    """Replies pushed while the instance holds (after an unaligned cut), in push order."""
    sent: int = 0
    ended: bool = False


@final
@attrs.define(eq=False, slots=True)
class ReplyStreams:
    """Every open stream of one instance and the replies on the wire.

    Invariant: ``on_wire[rid]`` is the stream that carries ``rid``'s final reply, for every reply
    pushed outside a hold and neither acknowledged nor discarded; while ``holding``, a pushed
    reply goes to its stream's ``held`` list instead, and ``release`` puts every held reply on
    the wire.
    """

    flush_interval_s: float
    max_batch: int
    on_wire: dict[str, RunStream] = attrs.field(factory=dict, init=False)
    streams: dict[RunStream, None] = attrs.field(factory=dict, init=False)
    batches: int = attrs.field(default=0, init=False)
    discarded: int = attrs.field(default=0, init=False)
    dead_instance: str | None = attrs.field(default=None, init=False)
    """Set when the instance died: its streams then raise ``GymInstanceDead``."""
    holding: bool = attrs.field(default=False, init=False)
    _holders: dict[RunStream, None] = attrs.field(factory=dict, init=False)
    """The streams with held replies, in the order they first held one."""

    def open(self, rows: int, drop_after: int | None) -> RunStream:
        send, receive = anyio.create_memory_object_stream[Batch](math.inf)
        st = RunStream(send, receive, rows, drop_after, anyio.Event(), anyio.CancelScope())
        self.streams[st] = None
        return st

    def start(self, tg: anyio.abc.TaskGroup, st: RunStream) -> None:
        if st.drop_after is not None and st.drop_after <= 0:
            self.end(st)
        tg.start_soon(self._flush_loop, st)

    def push(self, st: RunStream, reply: RunReply) -> None:
        """Queue a final reply; it is on the wire from now on (held, while ``holding``)."""
        if st.ended:
            self.discarded += 1
            return
        if self.holding:
            if not st.held:
                self._holders[st] = None
            st.held.append(reply)
            return
        st.pending.append(reply)
        self.on_wire[reply.rollout_id] = st
        if len(st.pending) == 1 or len(st.pending) >= self.max_batch:
            st.wake.set()

    def hold(self) -> None:
        """From now on pushed replies are held (see the module docstring)."""
        self.holding = True

    def release(self) -> int:
        """End the hold: every held reply goes on the wire, in push order; how many."""
        self.holding = False
        holders, self._holders = self._holders, {}
        n = 0
        for st in holders:
            held, st.held = st.held, []
            for reply in held:
                n += 1
                self.push(st, reply)
            st.wake.set()
        return n

    @property
    def held(self) -> int:
        """Replies held now."""
        return sum(len(st.held) for st in self._holders)

    def row_done(self, st: RunStream) -> None:
        st.rows_left -= 1
        if st.rows_left <= 0:
            st.wake.set()

    async def _flush_loop(self, st: RunStream) -> None:
        with st.scope:
            try:
                while not st.ended:
                    if not st.pending:
                        if st.rows_left <= 0 and not st.held:
                            break
                        st.wake = anyio.Event()
                        await st.wake.wait()
                        continue
                    if len(st.pending) < self.max_batch and st.rows_left > 0:
                        st.wake = anyio.Event()
                        with anyio.move_on_after(self.flush_interval_s):
                            await st.wake.wait()
                    self._deliver(st)
            finally:
                self.end(st)

    def _deliver(self, st: RunStream) -> None:
        if st.ended or not st.pending:
            return
        size = self.max_batch
        if st.drop_after is not None:
            size = min(size, st.drop_after - st.sent)
        if len(st.pending) > size:  # replies of one instant arrive in scheduler order
            st.pending.sort(key=lambda r: r.rollout_id)
        batch = sorted(st.pending[:size], key=lambda r: r.rollout_id)
        del st.pending[:size]
        if batch:
            try:
                st.send.send_nowait(tuple(batch))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._discard(st, batch)
            else:
                st.sent += len(batch)
                self.batches += 1
        if st.drop_after is not None and st.sent >= st.drop_after:
            self.end(st)

    def discard(self, st: RunStream, replies: Sequence[RunReply]) -> None:
        """Replies that will never be delivered leave the wire."""
        self._discard(st, replies)

    def _discard(self, st: RunStream, replies: Sequence[RunReply]) -> None:
        for r in replies:
            if self.on_wire.get(r.rollout_id) is st:
                del self.on_wire[r.rollout_id]
            self.discarded += 1

    def end(self, st: RunStream, *, hard: bool = False) -> None:
        """No more replies go out on ``st``; with ``hard``, sent batches are lost too."""
        if not st.ended:
            st.ended = True
            self._discard(st, st.pending)
            st.pending.clear()
            self.discarded += len(st.held)
            st.held.clear()
            self._holders.pop(st, None)
            st.send.close()
            st.wake.set()
            st.scope.cancel()
        if hard:
            while True:
                try:
                    batch = st.receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                self._discard(st, batch)
            st.receive.close()
            self.forget(st)

    def end_all(self) -> None:
        """Every stream ends hard, and nothing is on the wire any more: a reply in a batch a
        transport took from its stream and its trainer never acknowledged (a Ray actor's or an
        HTTP server's pump) leaves the wire too, since no stream is left to carry it (a fence,
        a shutdown)."""
        for st in list(self.streams):
            self.end(st, hard=True)
        self.discarded += len(self.on_wire)
        self.on_wire.clear()

    def forget(self, st: RunStream) -> None:
        self.streams.pop(st, None)

    def ack(self, st: RunStream, rollout_ids: Sequence[str]) -> None:
        for rid in rollout_ids:
            if self.on_wire.get(rid) is st:
                del self.on_wire[rid]


@final
class HostReplyStream:
    """The consumer's side of one ``run`` (a ``ReplyStream``).

    ``__anext__`` first acknowledges the batch it returned last time, then waits for the next;
    the stream ends when every row replied, or early (drop fault, dead instance). ``aclose``
    acknowledges the last batch, discards the undelivered ones and leaves the rows running.
    """

    __slots__ = ("_closed", "_delivered", "_st", "_streams")

    def __init__(self, streams: ReplyStreams, st: RunStream) -> None:
        self._streams = streams
        self._st = st
        self._delivered: tuple[str, ...] = ()
        self._closed = False

    @property
    def run_stream(self) -> RunStream:
        """The host's side of this ``run``, for a consumer that reads its batches itself and
        reports back through ``GymHost.ack_replies``, ``discard_replies``, ``forget_stream``
        and ``close_consumer``."""
        return self._st

    def __aiter__(self) -> HostReplyStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        self._streams.ack(self._st, self._delivered)
        self._delivered = ()
        try:
            batch = await self._st.receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._st.receive.close()
            self._streams.forget(self._st)
            if self._streams.dead_instance is not None:
                raise GymInstanceDead(self._streams.dead_instance, "run") from None
            raise StopAsyncIteration from None
        self._delivered = tuple(r.rollout_id for r in batch)
        return batch

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._streams.ack(self._st, self._delivered)
            self._delivered = ()
            self._streams.end(self._st, hard=True)
        await anyio.lowlevel.checkpoint()

    def __del__(self) -> None:
        self._st.receive.close()

    def __repr__(self) -> str:
        st = self._st
        return (
            f"<HostReplyStream rows_left={st.rows_left} pending={len(st.pending)} ended={st.ended}>"
        )
