"""``RayReplyStream``: the consumer's side of one ``run`` on Ray (a ``ReplyStream``).

The actor's streaming generator yields the admission header first (``_admission``),
then one ``ReplyBatch`` per object (several timer-flushed batches of the instance coalesce into
one object, because Ray charges about 0.4 ms per streamed object). Replies stay *on the wire*
until the consumer asks for the next batch: ``__anext__`` then acknowledges the batch it
returned last time (``_acks``): it records the acknowledgement in the deployment's
``AckBook``, which hands it to the instance's next control or view call, and every
``ACK_INTERVAL_S`` it also sends its latest one on its own (an ``ack`` call, not awaited), so the
actor frees what was delivered; no batch costs a round trip. ``aclose`` acknowledges what was
received, and Gym discards what was not.

The stream reaches the deployment only through its ``StreamLink``: the bridge, the
acknowledgement book and the incarnations, for its own instance and incarnation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, final

import attrs
import outcome
import trio

from gymckpt.runtime import GymCheckpointUnavailable, GymInstanceDead

from ..._contract import RunReply
from .._acks import AckBook, StreamAcks
from .._admission import ReplyBatch
from .._incarnations import Incarnations
from ._bridge import END, Bridge, GeneratorCursor
from ._errors import actor_gone, stream_ends, translate

__all__ = ["ACK_INTERVAL_S", "CLOSE_TIMEOUT_S", "RayReplyStream", "StreamLink"]

ACK_INTERVAL_S: Final = 0.05
"""A stream sends its latest acknowledgement on its own at most this often (they also travel
with every control and view call): it frees the actor's copies of delivered replies."""
CLOSE_TIMEOUT_S: Final = 2.0
"""How long ``aclose`` waits for the actor (it runs shielded in the dispatcher: keep it bounded)."""


@final
@attrs.frozen
class StreamLink:
    """What a stream may use of its deployment: incarnation ``incarnation`` of ``instance``."""

    instance: str
    incarnation: int
    bridge: Bridge
    acks: AckBook
    incarnations: Incarnations

    def serving(self) -> bool:
        """Is the stream's incarnation still the live one?"""
        return self.incarnations.serving(self.instance, self.incarnation)

    def mark_dead(self) -> None:
        self.incarnations.mark_dead(self.instance, self.incarnation)

    def translate(self, op: str, exc: BaseException) -> BaseException:
        return translate(self.incarnations, self.instance, op, exc, self.incarnation)


@final
class RayReplyStream:
    """The consumer's side of one ``run`` on Ray (``ReplyStream``).

    ``__anext__`` acknowledges the batch it returned last time, then returns the next batch;
    the stream ends when the instance has replied to every row, or early (drop fault,
    unreachable actor, cancelled generator, a batch lost with its node); it raises
    ``GymInstanceDead`` if its actor died (its process or its node). ``aclose`` is idempotent:
    it acknowledges what was received, has Gym discard the rest and end the stream (its rows
    keep running), and cancels the Ray generator; it waits at most ``CLOSE_TIMEOUT_S`` for the
    actor.
    """

    __slots__ = ("_acks", "_actor", "_closed", "_cursor", "_ended", "_link", "_natural_end", "_sid")

    def __init__(self, link: StreamLink, actor: Any, sid: int, gen: Any) -> None:
        self._link = link
        self._actor = actor
        self._sid = sid
        self._cursor = GeneratorCursor(gen)
        self._acks = StreamAcks(interval_s=ACK_INTERVAL_S, sent_at=time.monotonic())
        self._ended = False
        self._natural_end = False
        self._closed = False

    @property
    def _instance(self) -> str:
        return self._link.instance

    async def admitted(self) -> None:
        """Wait for the admission header (errors of the ``run`` itself surface here)."""
        try:
            item = await self._link.bridge.advance(self._cursor)
        except BaseException:
            self._ended = self._closed = True
            self._cursor.cancel()
            raise
        if isinstance(item, outcome.Error):
            self._ended = self._closed = True
            raise self._link.translate("run", item.error) from None
        batch = item.value
        if batch is END or not (isinstance(batch, ReplyBatch) and batch.is_header):
            self._ended = self._closed = True
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: the stream ended before admission",
                self._instance,
                "run",
            )

    def __aiter__(self) -> RayReplyStream:
        return self

    def _send_ack(self) -> None:
        seq = self._acks.mark_sent(time.monotonic())
        if self._link.serving():
            self._actor.ack.remote(self._sid, seq)  # not awaited

    def _stop(self) -> None:
        """Nothing more is delivered: the book forgets the stream once a call carried it."""
        self._link.acks.ended(self._instance, self._sid)

    async def __anext__(self) -> Sequence[RunReply]:
        if self._ended:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        if self._acks.on_ask(self._link.acks, self._instance, self._sid, time.monotonic()):
            self._send_ack()
        item = await self._link.bridge.advance(self._cursor)
        if isinstance(item, outcome.Error):
            self._ended = True
            self._stop()
            exc = item.error
            if actor_gone(exc):  # the runtime tells a death from an early end by this
                self._link.mark_dead()
                raise GymInstanceDead(self._instance, "run") from None
            if stream_ends(exc):
                raise StopAsyncIteration
            raise self._link.translate("run", exc) from None
        if item.value is END:
            self._ended = self._natural_end = True
            self._stop()
            if self._acks.unsent:
                self._send_ack()  # the last one, so the actor lets go of the stream
            raise StopAsyncIteration
        batch: ReplyBatch = item.value
        self._acks.deliver(batch.seq)
        return batch.replies

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = self._ended = True
        link = self._link
        self._stop()
        if self._natural_end or not link.serving():
            await trio.lowlevel.checkpoint()  # its actor is gone (dead, or replaced)
            return
        ref = self._actor.close_stream.remote(self._sid, self._acks.delivered)
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                closed = await link.bridge.resolve(ref)
                if isinstance(closed, outcome.Value):
                    link.acks.closed(self._instance, self._sid)
        finally:
            self._cursor.cancel()  # a generator held by backpressure lets go too

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "open"
        return (
            f"<RayReplyStream of {self._instance} #{self._sid} {state} "
            f"delivered={self._acks.delivered} acked={self._acks.acked}>"
        )
