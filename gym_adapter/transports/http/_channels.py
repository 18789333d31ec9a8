"""The server's side of reply channels (``/mux/v1``): many streams' replies over one body.

A ``/run`` body carries the replies of one stream and holds one connection until its episodes
end. A reply channel (``POST /mux/v1/open``) is one long-lived NDJSON body that carries the
replies of every stream submitted to it (``POST /mux/v1/run``, a short request answered with
the admission header), each line tagged with its stream id. ``ReplyChannel`` is one such body:

- one *pump* per stream, a task of the channel's nursery, takes the stream's replies from the
  instance (``Outbox.take``), registers them as the stream's next batch (on the wire until the
  client acknowledges it, exactly as on ``/run``) and queues the line; when the instance's
  stream ends it queues the stream's end line;
- one *writer* sends the queued lines, joined, as body chunks, in queue order (so a stream's
  lines keep their order).

The queue is bounded (``QUEUE_LINES``): a client that stops reading holds the pumps, which stop
taking from the instance, as a ``/run`` body's reader would. A channel ends when the client goes
away, the server stops, a newer trainer term takes the instance over, or the instance dies;
the body then stops without any end line (a dead server's would) and every pump's stream is
``finish``-ed not completed: its rows run on and what was sent but not acknowledged stays on the
wire until an acknowledgement or ``close_stream`` settles it (``Outboxes.finish``).

Everything here runs in the server's trio run, synchronously between awaits, so no lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Final, final

import attrs
import trio

from gymckpt.runtime import TrainerTerm

from ...host._host import GymHost
from .._admission import ReplyBatch
from .._outbox import Outbox, Outboxes
from ._wire import RunRequest, encode_mux_batch_line, encode_mux_end_line

__all__ = ["QUEUE_LINES", "WRITE_BYTES", "ReplyChannel"]

QUEUE_LINES: Final = 256
"""Lines queued for a channel's writer before its pumps wait."""
WRITE_BYTES: Final = 1 << 20
"""The writer joins queued lines into chunks of about this many bytes at most."""

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


@final
@attrs.define(eq=False, slots=True)
class ReplyChannel:
    """One open reply channel. Invariant: a pump runs only inside ``serve`` (its nursery), so
    none outlives the channel's body; every stream given to ``start`` is ``finish``-ed exactly
    once, completed only if its end line was queued."""

    cid: int
    trainer: TrainerTerm | None
    host: GymHost
    outboxes: Outboxes
    _send_q: trio.MemorySendChannel[bytes] = attrs.field(init=False)
    _recv_q: trio.MemoryReceiveChannel[bytes] = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    streams: int = attrs.field(default=0, init=False)
    """Pumps running now."""

    def __attrs_post_init__(self) -> None:
        self._send_q, self._recv_q = trio.open_memory_channel[bytes](QUEUE_LINES)

    @property
    def open(self) -> bool:
        """Whether a stream started now is served (the body is being written)."""
        return self._nursery is not None and not self._ended

    def end(self) -> None:
        """End the channel now: its body stops without an end line, its pumps stop."""
        self._ended = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def serve(self, first: bytes, send: Send) -> None:
        """Write the body (``first``, then every queued line) until ``end`` or cancellation."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._ended:
                    nursery.cancel_scope.cancel()
                await send({"type": "http.response.body", "body": first, "more_body": True})
                await self._write(send)
        finally:
            self._ended = True
            self._nursery = None

    async def _write(self, send: Send) -> None:
        async for line in self._recv_q:
            parts, size = [line], len(line)
            while size < WRITE_BYTES:
                try:
                    more = self._recv_q.receive_nowait()
                except trio.WouldBlock:
                    break
                parts.append(more)
                size += len(more)
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})

    def start(self, req: RunRequest, box: Outbox) -> None:
        """Serve stream ``req.sid``'s replies on this channel (it must be ``open``)."""
        assert self._nursery is not None, "start on a channel that is not open"
        self.streams += 1
        self._nursery.start_soon(self._pump, req, box)

    async def _pump(self, req: RunRequest, box: Outbox) -> None:
        completed = False
        try:
            completed = await self._lines(req, box)
        finally:
            self.streams -= 1
            self.outboxes.finish(req.sid, box, completed, discard=False)
        if self.host.dead:  # the instance died: the body stops as a dead server's would
            self.end()

    async def _lines(self, req: RunRequest, box: Outbox) -> bool:
        """Queue the stream's lines; True once its end line is queued."""
        cap = 1 if req.per_row else req.max_replies
        rows: Mapping[str, int] = {r.rollout_id: r.row for r in req.rows}
        sid = req.sid
        while True:
            replies = await box.take(cap)
            if replies is None:
                if self.host.dead:
                    return False
                await self._send_q.send(encode_mux_end_line(sid))
                return True
            if req.per_row:
                for r in replies:
                    line = encode_mux_batch_line(sid, ReplyBatch(box.register((r,)), (r,)), rows)
                    await self._send_q.send(line)
            else:
                seq = box.register(replies)
                line = encode_mux_batch_line(sid, ReplyBatch(seq, tuple(replies)), rows)
                await self._send_q.send(line)

    def __repr__(self) -> str:
        state = "open" if self.open else "ended" if self._ended else "opening"
        return f"<ReplyChannel #{self.cid} {state} streams={self.streams}>"
