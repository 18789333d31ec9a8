"""``HttpReplyStream``: the consumer's side of one ``POST /run`` (a ``ReplyStream``).

The response body is NDJSON (``http/_wire``): line 1 the admission header (``HttpGym.run``
returns once it is read, so a checkpoint never overtakes a submission the ledger counts, S1),
then one ``ReplyBatch`` per line, then the end line ``{"end": true}``. Replies stay *on the
wire* until the consumer asks for the next batch, exactly as on Ray (``_acks``):
``__anext__`` records the acknowledgement of the batch it returned last time in the deployment's
``AckBook`` (the instance's next control or ``/run`` request carries it), and every
``ACK_INTERVAL_S`` at most also sends it on its own (``ack``, not awaited).

**How a stream ends.** The end line: every row replied (or the server ended the stream early on
purpose, a ``drop``: then rows are missing, and the runtime resends them). A body that stops
*without* the end line is the connection lost mid-stream; the deployment tells what that was
(``StreamPeer.broken``): the server process died (a spawned server that exited, or a server
that answers with another incarnation) raises ``GymInstanceDead`` and marks the incarnation
dead; anything else is an early end (``StopAsyncIteration``, rows missing). ``aclose``
acknowledges what was received (``close_stream(sid, upto)``, bounded by ``CLOSE_TIMEOUT_S``),
has the server discard the rest and end the stream (its rows keep running), then closes the
response.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import suppress
from typing import Final, Protocol, final

import httpx
import trio

from gymckpt.runtime import GymCheckpointUnavailable

from ..._contract import RunReply
from ...host._environment import DEFAULT_MAX_PAYLOAD_BYTES
from .._acks import AckBook, StreamAcks
from .._admission import ReplyBatch
from ._wire import WireFormatError, decode_stream_line

__all__ = [
    "ACK_INTERVAL_S",
    "CLOSE_TIMEOUT_S",
    "MAX_LINE_BYTES",
    "HttpReplyStream",
    "LineTooLong",
    "NdjsonBody",
    "StreamPeer",
]

ACK_INTERVAL_S: Final = 0.05
"""A stream sends its latest acknowledgement on its own at most this often."""
CLOSE_TIMEOUT_S: Final = 2.0
"""How long ``aclose`` waits for the server's ``close_stream`` answer (it runs shielded in the
dispatcher: keep it bounded)."""
MAX_LINE_BYTES: Final = 2 * 1024 * DEFAULT_MAX_PAYLOAD_BYTES
"""The longest line (newline excluded) a trainer reads from a streamed answer: 2 GiB. The
longest legitimate line is a batch of replies: at most ``HttpGym(max_batch_replies=...)``
(1,024 by default) replies, each carrying a payload of at most the server's
``Environment(max_payload_bytes=...)`` (1 MiB by default) plus a few fields; a commit part
(``_parts.PART_RECORDS`` records) is smaller than the restore body that must carry those
records back (``--max-body-bytes``, 64 MiB by default). Twice the default batch leaves room
for the fields and for JSON escapes; a line past it is refused (``LineTooLong``), never
buffered further."""


class StreamPeer(Protocol):
    """What a stream may use of its deployment (``HttpGym``), for incarnation ``incarnation``
    of ``instance``."""

    @property
    def acks(self) -> AckBook: ...

    def serving(self, instance: str, incarnation: int) -> bool: ...

    def send_ack(self, instance: str, incarnation: int, sid: int, upto: int) -> None:
        """Send ``ack(sid, upto)`` without waiting for it (lost if the server is gone)."""
        ...

    async def close_stream(self, instance: str, incarnation: int, sid: int, upto: int) -> bool:
        """``close_stream(sid, upto)``, bounded by the caller; whether the server answered."""
        ...

    def opened(self, stream: HttpReplyStream) -> None:
        """``stream``'s response is open: the deployment closes it on exit if its consumer
        does not."""
        ...

    def released(self, stream: HttpReplyStream) -> None:
        """``stream``'s response is closed."""
        ...

    async def broken(
        self, instance: str, incarnation: int, exc: BaseException | None
    ) -> BaseException | None:
        """The body of a stream ended without its end line (``exc``: the transport's error,
        None if the body just stopped): the error to raise (the instance is dead), or None
        (an early end)."""
        ...


class LineTooLong(WireFormatError):
    """A streamed answer's line passed the reader's bound (``MAX_LINE_BYTES``): the server is
    not speaking the wire form (or is another program). Every reader of a stream handles it as
    the bad line it is: the instance is unavailable for that stream (``GymUnavailable``), the
    stream's rows are re-sent after the outage's backoff. ``size``: the bytes of the line read
    when it was refused (at most ``bound`` plus one chunk); ``bound``: the reader's bound."""

    def __init__(self, message: str, size: int, bound: int) -> None:
        super().__init__(message)
        self.size = size
        self.bound = bound


@final
class NdjsonBody:
    """The lines of a streamed NDJSON response body, read as its chunks arrive (a ``/run``
    stream's, a reply channel's, a commit's parts). Invariants: ``_buffer[:_scanned]`` holds no
    newline, so a long line is scanned once; the buffer never holds more than ``max_line_bytes``
    bytes of one line plus one chunk: past that the body is refused (``LineTooLong``), the
    buffer emptied, and every later ``next_line`` raises the same refusal."""

    __slots__ = ("_buffer", "_chunks", "_max_line_bytes", "_refused", "_response", "_scanned")

    def __init__(self, response: httpx.Response, max_line_bytes: int | None = None) -> None:
        """``max_line_bytes``: the bound on one line (default ``MAX_LINE_BYTES``, read when the
        body is made)."""
        bound = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
        if bound < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {bound!r}")
        self._response = response
        # no chunk size: a chunk size makes httpx wait until that many bytes arrived
        self._chunks: AsyncIterator[bytes] = response.aiter_raw()
        self._buffer = bytearray()
        self._scanned = 0
        self._max_line_bytes = bound
        self._refused: LineTooLong | None = None

    @property
    def buffered(self) -> int:
        """Bytes read but not yet returned as a line."""
        return len(self._buffer)

    async def next_line(self) -> bytes | None:
        """The next complete line of the body, or None if the body stopped before one;
        ``LineTooLong`` once a line passes ``max_line_bytes``."""
        if self._refused is not None:
            await trio.lowlevel.checkpoint()
            raise self._refused
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                if end > self._max_line_bytes:
                    raise self._refuse(end)
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > self._max_line_bytes:
                raise self._refuse(self._scanned)
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                return None
            self._buffer += chunk

    def _refuse(self, size: int) -> LineTooLong:
        request = self._response.request
        self._refused = LineTooLong(
            f"a line of the answer to {request.method} {request.url} reached {size} bytes, "
            f"over the trainer's bound of {self._max_line_bytes} bytes per "
            "line: the server is not speaking the wire form (check the URL and the server's "
            "version), or its replies are too large (lower HttpGym(max_batch_replies=...))",
            size,
            self._max_line_bytes,
        )
        self._buffer = bytearray()  # let go of what was read: the body is not read further
        self._scanned = 0
        return self._refused

    async def aclose(self) -> None:
        """Close the response and finish its body's iterator. httpx reads a body through a chain
        of async generators: closing the response closes the connection, and advancing the
        iterator once more then ends every generator of the chain (at the end of the body, or
        with the closed connection's error), so none is left for the garbage collector to
        finalise."""
        with suppress(httpx.HTTPError, RuntimeError):
            await self._response.aclose()
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            while True:
                try:
                    await self._chunks.__anext__()
                except (StopAsyncIteration, httpx.HTTPError, RuntimeError, OSError):
                    break


@final
class HttpReplyStream:
    """The consumer's side of one ``/run`` (``ReplyStream``), see the module docstring.

    Invariant: once ``_ended``, nothing more is read from the response; once ``_closed``, the
    response is closed (or being closed) and the server was told how far the consumer got,
    unless the stream ended naturally or its incarnation is gone.
    """

    __slots__ = (
        "_acks",
        "_body",
        "_closed",
        "_ended",
        "_incarnation",
        "_instance",
        "_natural_end",
        "_peer",
        "_sid",
    )

    def __init__(
        self,
        peer: StreamPeer,
        instance: str,
        incarnation: int,
        sid: int,
        response: httpx.Response,
    ) -> None:
        self._peer = peer
        self._instance = instance
        self._incarnation = incarnation
        self._sid = sid
        self._body = NdjsonBody(response)
        self._acks = StreamAcks(interval_s=ACK_INTERVAL_S, sent_at=time.monotonic())
        self._ended = False
        self._natural_end = False
        self._closed = False
        peer.opened(self)

    @property
    def sid(self) -> int:
        return self._sid

    # -- reading lines ---------------------------------------------------------------------------

    async def _next_item(self) -> ReplyBatch | None:
        """The next line decoded: a batch, or None for the end line. A body that stopped (or a
        transport error) raises what ``StreamPeer.broken`` says, or ``StopAsyncIteration``; a
        line not in the wire form or over the bound (``LineTooLong``) raises
        ``GymCheckpointUnavailable``."""
        failure: BaseException | None = None
        try:
            line = await self._body.next_line()
            if line is not None:
                return decode_stream_line(line)
        except httpx.TransportError as exc:
            line, failure = None, exc
        except trio.Cancelled:
            self._ended = True  # the connection is in an unknown state: read nothing more
            raise
        except WireFormatError as exc:  # a line not in the wire form, or one over the bound
            self._ended = True
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: the server sent a bad stream line ({exc})",
                self._instance,
                "run",
            ) from None
        self._ended = True
        error = await self._peer.broken(self._instance, self._incarnation, failure)
        if error is not None:
            raise error from None
        raise StopAsyncIteration

    async def admitted(self) -> None:
        """Read the admission header (``HttpGym.run`` calls this before returning)."""
        try:
            item = await self._next_item()
        except StopAsyncIteration:
            self._ended = True
            await self.close_response()
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: the stream ended before admission",
                self._instance,
                "run",
            ) from None
        except BaseException:
            self._ended = True
            with trio.CancelScope(shield=True):
                await self.close_response()
            raise
        if item is None or not item.is_header:
            self._ended = self._closed = True
            await self.close_response()
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: the stream did not start with the admission "
                "header",
                self._instance,
                "run",
            )

    # -- ReplyStream -----------------------------------------------------------------------------

    def __aiter__(self) -> HttpReplyStream:
        return self

    def _send_ack(self) -> None:
        seq = self._acks.mark_sent(time.monotonic())
        if self._peer.serving(self._instance, self._incarnation):
            self._peer.send_ack(self._instance, self._incarnation, self._sid, seq)

    def _stop(self) -> None:
        """Nothing more is delivered: the book forgets the stream once a call carried it."""
        self._peer.acks.ended(self._instance, self._sid)

    async def __anext__(self) -> Sequence[RunReply]:
        if self._ended:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        if self._acks.on_ask(self._peer.acks, self._instance, self._sid, time.monotonic()):
            self._send_ack()
        try:
            item = await self._next_item()
        except BaseException:
            if self._ended:
                self._stop()
            raise
        if item is None:
            self._ended = self._natural_end = True
            self._stop()
            if self._acks.unsent:
                self._send_ack()  # the last one, so the server lets go of the stream
            with trio.CancelScope(shield=True):
                await self.close_response()
            raise StopAsyncIteration
        if item.is_header:
            self._ended = True
            self._stop()
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: a second admission header in the stream",
                self._instance,
                "run",
            )
        self._acks.deliver(item.seq)
        return item.replies

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = self._ended = True
        self._stop()
        try:
            if not self._natural_end and self._peer.serving(self._instance, self._incarnation):
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    if await self._peer.close_stream(
                        self._instance, self._incarnation, self._sid, self._acks.delivered
                    ):
                        self._peer.acks.closed(self._instance, self._sid)
            else:
                await trio.lowlevel.checkpoint()
        finally:
            with trio.CancelScope(shield=True):
                await self.close_response()

    async def close_response(self) -> None:
        """Close the response and finish its body's iterator (``NdjsonBody.aclose``)."""
        self._closed = self._ended = True
        self._peer.released(self)
        await self._body.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "open"
        return (
            f"<HttpReplyStream of {self._instance} #{self._sid} {state} "
            f"delivered={self._acks.delivered} acked={self._acks.acked}>"
        )
