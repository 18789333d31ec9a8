"""The instance's side of remote ``run`` streams: replies taken from the host, acknowledged later.

A remote transport (the Ray actor, the HTTP server) serves one ``GymHost`` and streams each
``run``'s replies to a consumer in another process. ``Outbox`` is one such stream on the
instance's side: it takes the instance's batches *without* acknowledging them
(``UnackedBatches``, ``_acks``), so a reply stays on the wire (listed by ``commit``)
after it left the instance and until the consumer asks for the batch after the one that carried
it. ``Outboxes`` is the transport's registry of them, by stream id: it applies the consumer's
acknowledgements (they ride every later call), closes a stream the consumer closed
(``close_stream``: acknowledge what was received, discard the rest, the rows run on), and
forgets a stream once it is settled: nothing more will be produced and nothing waits for an
acknowledgement.

A transport whose sending side ends without the consumer (a cancelled Ray generator, an HTTP
client that disconnected) calls ``finish(sid, box, completed=False)``: what was sent but never
acknowledged stays on the wire until the consumer's next call acknowledges it or closes the
stream, exactly as on Ray; the rows keep running in the instance.

Everything here runs in the instance's trio run, synchronously between awaits, so no lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import final

import anyio
import attrs

from .._contract import RunReply
from ..host._host import GymHost
from ..host._streams import HostReplyStream, RunStream
from ._acks import UnackedBatches
from ._admission import HEADER_SEQ

__all__ = ["Outbox", "Outboxes"]

_STREAM_ENDED = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


@final
@attrs.define(eq=False, slots=True)
class Outbox:
    """The transport's side of one ``run``: batches taken from the instance, acknowledged
    later. Invariant: every reply taken and registered is either acknowledged to the instance,
    discarded (``close``), or still in ``unacked``."""

    sim: GymHost
    stream: HostReplyStream
    """Kept alive: its finaliser closes the instance's receive side."""
    unacked: UnackedBatches[RunReply] = attrs.field(factory=UnackedBatches)
    finished: bool = False
    closed: bool = False

    @property
    def _st(self) -> RunStream:
        return self.stream.run_stream

    async def take(self, cap: int) -> list[RunReply] | None:
        """The next replies (one or more of the instance's batches, up to about ``cap``), or
        None once the stream has ended."""
        receive = self._st.receive
        try:
            replies = list(await receive.receive())
        except _STREAM_ENDED:
            self._ended()
            return None
        while len(replies) < cap:
            try:
                replies.extend(receive.receive_nowait())
            except anyio.WouldBlock:
                break
            except _STREAM_ENDED:
                self._ended()
                break
        return replies

    def take_ready(self, cap: int) -> list[RunReply]:
        """The replies already produced (up to about ``cap``, possibly none), without waiting
        (the Ray actor's fast path, called between the guest run's ticks: the instance's stream
        is unbounded, so no sender ever waits and ``receive_nowait`` sets no trio event); an
        ended or closed stream is left to ``take``."""
        receive = self._st.receive
        replies: list[RunReply] = []
        while len(replies) < cap:
            try:
                replies.extend(receive.receive_nowait())
            except (anyio.WouldBlock, *_STREAM_ENDED):
                break
        return replies

    def register(self, replies: Sequence[RunReply]) -> int:
        """Number ``replies`` as the next batch; they stay on the wire until acknowledged."""
        return self.unacked.register(replies)

    def _ended(self) -> None:
        self._st.receive.close()
        self.sim.forget_stream(self._st)

    def ack(self, upto: int) -> None:
        """The consumer asked for the batch after ``upto``: every batch up to it is received."""
        for replies in self.unacked.ack(upto):
            self.sim.ack_replies(self._st, [r.rollout_id for r in replies])

    def close(self, upto: int) -> None:
        """Acknowledge up to ``upto``, discard the rest and end the stream (rows run on)."""
        if self.closed:
            return
        self.closed = True
        self.ack(upto)
        lost = self.unacked.take_rest()
        if lost:
            self.sim.discard_replies(self._st, lost)
        self.sim.close_consumer(self._st)

    @property
    def settled(self) -> bool:
        """Nothing more will be produced and nothing waits for an acknowledgement."""
        return self.closed or (self.finished and not self.unacked)


@final
@attrs.define(eq=False, slots=True)
class Outboxes:
    """A transport's open streams on one instance, by stream id (the consumer's)."""

    _boxes: dict[int, Outbox] = attrs.field(factory=dict, init=False)

    def open(self, sid: int, sim: GymHost, stream: HostReplyStream) -> Outbox:
        """Register the stream ``sid`` of ``sim`` (a reused id replaces the old box)."""
        box = self._boxes[sid] = Outbox(sim, stream)
        return box

    def __contains__(self, sid: int) -> bool:
        return sid in self._boxes

    def __len__(self) -> int:
        return len(self._boxes)

    def apply_acks(self, acks: Mapping[int, int]) -> None:
        """The consumer's acknowledgements (sid -> seq); unknown streams are ignored (settled,
        or of another incarnation)."""
        for sid, seq in acks.items():
            box = self._boxes.get(sid)
            if box is not None:
                box.ack(seq)
                if box.settled:
                    del self._boxes[sid]

    def finish(self, sid: int, box: Outbox, completed: bool, *, discard: bool = True) -> None:
        """The sending side of ``box`` ended: ``completed`` (the instance's stream ended and
        every batch was sent) or not. Not completed and ``discard``: the consumer is gone (a
        cancelled Ray generator), nothing more is delivered, so what it never received is
        discarded. Not completed and not ``discard`` (an HTTP client that disconnected): the
        box stays registered and its replies on the wire until an acknowledgement or a
        ``close_stream`` settles them."""
        box.finished = True
        if not completed and discard:
            box.close(HEADER_SEQ)
        if box.settled and self._boxes.get(sid) is box:
            del self._boxes[sid]

    def forget_all(self) -> None:
        """A trainer of a newer term fenced the instance: every stream of the older one is
        forgotten (the instance ended them and discarded what they carried), so a stream id
        of the newer trainer never names one of them."""
        self._boxes.clear()

    def close(self, sid: int, upto: int) -> None:
        """The consumer closed stream ``sid`` having received every batch up to ``upto``."""
        box = self._boxes.pop(sid, None)
        if box is not None:
            box.close(upto)

    def __repr__(self) -> str:
        return f"<Outboxes open={len(self._boxes)}>"
