"""The client's side of reply channels (``/mux/v1``): one body, the replies of many streams.

``MuxChannel`` is one ``POST /mux/v1/open`` response: a reader task (of the deployment's
nursery) reads its NDJSON lines and routes each to the stream it names (``HttpMuxStream``, the
``ReplyStream`` of one ``POST /mux/v1/run``). A stream is registered on its channel *before*
its rows are submitted, so a reply that overtakes the submission's answer waits in the stream.

**Decoding off the loop's long steps.** A line's replies arrive as JSON (one C call parses the
line); their conversion to ``RunReply``s, the Python part, is done ``DECODE_SLICE`` replies at a
time with a trio checkpoint between slices, so no step of the trainer's loop converts more than
``DECODE_SLICE`` replies however large the server's batches (``MuxChannel.largest_step``).

**Acknowledgements** are exactly ``HttpReplyStream``'s (``_acks``): a batch handed to the
consumer is acknowledged when the consumer asks for the next one, recorded in the deployment's
``AckBook`` (every later request to the instance carries it) and sent on its own at most every
``ACK_INTERVAL_S``; ``aclose`` sends ``close_stream(sid, upto)``.

**How a stream ends.** Its end line ``{"sid", "end": true}``: every row replied (or a ``drop``
ended it early on purpose). The channel's body stopping (the server died, stopped, or a newer
trainer took the instance over) or breaking ends every stream on it; each then asks the
deployment what that was (``StreamPeer.broken``): ``GymInstanceDead`` or an early end
(``StopAsyncIteration``, rows missing), exactly as a ``/run`` body that stops.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Final, final

import httpx
import trio

from gymckpt.runtime import GymCheckpointUnavailable

from ..._contract import RunReply
from .._acks import StreamAcks
from ._stream import ACK_INTERVAL_S, CLOSE_TIMEOUT_S, NdjsonBody, StreamPeer
from ._wire import WireFormatError, decode_mux_channel_line, decode_mux_line, decode_reply

__all__ = ["DECODE_SLICE", "HttpMuxStream", "MuxChannel"]

DECODE_SLICE: Final = 128
"""The most replies converted in one step of the trainer's loop (then a checkpoint)."""


_between_slices = trio.lowlevel.checkpoint
"""Where a conversion lets the loop run other tasks (a name of its own, for the tests)."""


class _End:
    """A stream's end line was read."""


_END: Final = _End()


@final
class _Broken:
    """The channel's body stopped (``exc`` None) or broke (``exc``, the transport's error)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException | None) -> None:
        self.exc = exc


_Item = tuple[int, tuple[RunReply, ...]] | _End | _Broken


@final
class HttpMuxStream:
    """The consumer's side of one ``/mux/v1/run`` (``ReplyStream``): the batches its channel
    routed to it, in order. Invariant: once ``_ended``, nothing more is delivered to the
    consumer; the channel forgets the stream when it ends or is closed."""

    __slots__ = (
        "_acks",
        "_channel",
        "_closed",
        "_ended",
        "_incarnation",
        "_instance",
        "_items",
        "_natural_end",
        "_peer",
        "_sid",
        "_wake",
    )

    def __init__(
        self, peer: StreamPeer, instance: str, incarnation: int, sid: int, channel: MuxChannel
    ) -> None:
        self._peer = peer
        self._instance = instance
        self._incarnation = incarnation
        self._sid = sid
        self._channel = channel
        self._items: deque[_Item] = deque()
        self._wake = trio.Event()
        self._acks = StreamAcks(interval_s=ACK_INTERVAL_S, sent_at=time.monotonic())
        self._ended = False
        self._natural_end = False
        self._closed = False

    @property
    def sid(self) -> int:
        return self._sid

    # -- the channel's side ----------------------------------------------------------------------

    def put(self, item: _Item) -> None:
        """The channel routes ``item`` (a batch, the end, or the body's end) to this stream."""
        self._items.append(item)
        self._wake.set()

    # -- ReplyStream -----------------------------------------------------------------------------

    def __aiter__(self) -> HttpMuxStream:
        return self

    def _send_ack(self) -> None:
        seq = self._acks.mark_sent(time.monotonic())
        if self._peer.serving(self._instance, self._incarnation):
            self._peer.send_ack(self._instance, self._incarnation, self._sid, seq)

    def _stop(self) -> None:
        """Nothing more is delivered: the book forgets the stream once a call carried it."""
        self._ended = True
        self._channel.forget(self._sid)
        self._peer.acks.ended(self._instance, self._sid)

    async def _next(self) -> _Item:
        while not self._items:
            self._wake = trio.Event()
            await self._wake.wait()
        await trio.lowlevel.checkpoint()
        return self._items.popleft()

    async def __anext__(self) -> Sequence[RunReply]:
        if self._ended:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        if self._acks.on_ask(self._peer.acks, self._instance, self._sid, time.monotonic()):
            self._send_ack()
        item = await self._next()  # cancelled: the items wait here, nothing is lost
        if isinstance(item, _End):
            self._natural_end = True
            self._stop()
            if self._acks.unsent:
                self._send_ack()  # the last one, so the server lets go of the stream
            raise StopAsyncIteration
        if isinstance(item, _Broken):
            self._stop()
            if isinstance(item.exc, GymCheckpointUnavailable):  # a bad line: not a transport's
                raise GymCheckpointUnavailable(str(item.exc), self._instance, "run")
            error = await self._peer.broken(self._instance, self._incarnation, item.exc)
            if error is not None:
                raise error from None
            raise StopAsyncIteration
        seq, replies = item
        self._acks.deliver(seq)
        return replies

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._stop()
        if not self._natural_end and self._peer.serving(self._instance, self._incarnation):
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                if await self._peer.close_stream(
                    self._instance, self._incarnation, self._sid, self._acks.delivered
                ):
                    self._peer.acks.closed(self._instance, self._sid)
        else:
            await trio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "open"
        return (
            f"<HttpMuxStream of {self._instance} #{self._sid} {state} "
            f"delivered={self._acks.delivered} acked={self._acks.acked}>"
        )


@final
class MuxChannel:
    """One open reply channel of incarnation ``incarnation`` of ``instance`` (its response is
    open from ``opened`` until ``read`` returns). Invariant: once not ``alive``, every stream
    registered on it was given the body's end (``_Broken``) and nothing more is routed."""

    __slots__ = (
        "_body",
        "_streams",
        "alive",
        "cid",
        "incarnation",
        "instance",
        "largest_step",
    )

    def __init__(self, instance: str, incarnation: int, cid: int, response: httpx.Response) -> None:
        self.instance = instance
        self.incarnation = incarnation
        self.cid = cid
        self._body = NdjsonBody(response)
        self._streams: dict[int, HttpMuxStream] = {}
        self.alive = True
        self.largest_step = 0
        """The most replies converted in one step so far (at most ``DECODE_SLICE``)."""

    @property
    def load(self) -> int:
        """Streams open on this channel."""
        return len(self._streams)

    def register(self, stream: HttpMuxStream) -> None:
        """Route the lines of ``stream.sid`` to ``stream`` (before its rows are submitted)."""
        if not self.alive:
            stream.put(_Broken(None))
            return
        self._streams[stream.sid] = stream

    def forget(self, sid: int) -> None:
        """Route nothing more to stream ``sid`` (its lines, if any still come, are dropped)."""
        self._streams.pop(sid, None)

    async def opened(self) -> None:
        """Read the channel line (the first); ``GymCheckpointUnavailable`` if it is not this
        channel's."""
        try:
            line = await self._body.next_line()
            if line is None or decode_mux_channel_line(line) != self.cid:
                raise WireFormatError(f"expected the channel line of channel {self.cid}")
        except (WireFormatError, httpx.TransportError) as exc:
            self.alive = False
            raise GymCheckpointUnavailable(
                f"instance {self.instance} run: reply channel {self.cid} did not open ({exc})",
                self.instance,
                "run",
            ) from None

    async def read(self) -> None:
        """Route every line to its stream until the body stops, breaks, or the read is
        cancelled; then end every stream still registered and close the response."""
        failure: BaseException | None = None
        try:
            while (line := await self._body.next_line()) is not None:
                await self._route(line)
        except httpx.TransportError as exc:
            failure = exc
        except WireFormatError as exc:
            failure = GymCheckpointUnavailable(
                f"instance {self.instance} run: the server sent a bad channel line ({exc})",
                self.instance,
                "run",
            )
        finally:
            self.alive = False
            streams, self._streams = self._streams, {}
            for stream in streams.values():
                stream.put(_Broken(failure))
            with trio.CancelScope(shield=True):
                await self.close()

    async def _route(self, line: bytes) -> None:
        item = decode_mux_line(line)
        if item.end:
            stream = self._streams.get(item.sid)
            if stream is not None:
                stream.put(_END)
            return
        raw = item.raw
        replies: list[RunReply] = []
        for start in range(0, len(raw), DECODE_SLICE):
            piece = raw[start : start + DECODE_SLICE]
            replies.extend(decode_reply(r) for r in piece)
            self.largest_step = max(self.largest_step, len(piece))
            await _between_slices()
        stream = self._streams.get(item.sid)  # looked up after the slices: it may have closed
        if stream is not None:
            stream.put((item.seq, tuple(replies)))

    async def close(self) -> None:
        """Close the response and finish its body's iterator (as ``HttpReplyStream`` does)."""
        self.alive = False
        await self._body.aclose()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "ended"
        return f"<MuxChannel {self.instance} #{self.cid} {state} streams={len(self._streams)}>"
