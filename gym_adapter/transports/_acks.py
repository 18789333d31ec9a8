"""Acknowledgement on the next call: how a remote stream's replies leave the wire.

A reply is *on the wire* (listed by every commit reply) from the moment Gym produced it until
the consumer asks for the batch after the one that carried it (``ReplyStream.__anext__``).
Across a process boundary that moment is known only to the consumer, so it travels back, with
three parts here, one per side:

- ``StreamAcks`` (the consumer's stream): which batch was handed over last, which one was
  acknowledged, and when an acknowledgement was last *sent on its own* (at most every
  ``interval_s``, so no batch costs a round trip);
- ``AckBook`` (the deployment): every acknowledgement recorded per instance, handed to that
  instance's next control or view call, which applies them before anything else. So by the time
  a ``commit`` or ``inventory`` runs, every batch the consumer asked past is off the wire,
  whatever order the transport delivered the calls in. A recorded acknowledgement is dropped once
  its stream has ended and a call carried its last value;
- ``UnackedBatches`` (the instance's side of one stream): the batches sent but not yet
  acknowledged, in order.

An acknowledgement is never early (only sent once the consumer asked for more) and may be late
or repeated (the wire list is then a superset: the drain waits for a reply the ledger already
holds, harmless).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, TypeVar, final

import attrs

from ._admission import HEADER_SEQ

__all__ = ["AckBook", "StreamAcks", "UnackedBatches"]

T = TypeVar("T")


@final
@attrs.define(eq=False)
class StreamAcks:
    """The consumer's side of one stream. Invariant: ``sent <= acked <= delivered``."""

    interval_s: float
    sent_at: float
    """When an acknowledgement was last sent on its own (the stream's clock)."""
    delivered: int = HEADER_SEQ
    """Seq of the last batch handed to the consumer."""
    acked: int = HEADER_SEQ
    """Seq up to which the consumer asked past (recorded with the deployment)."""
    sent: int = HEADER_SEQ
    """Seq last sent on its own."""

    def deliver(self, seq: int) -> None:
        """Batch ``seq`` is handed to the consumer."""
        if seq <= self.delivered:
            raise ValueError(f"batch {seq} delivered after batch {self.delivered}")
        self.delivered = seq

    def asked_next(self) -> int | None:
        """The consumer asks for the next batch: the seq it acknowledges now (to record), or
        None if it acknowledges nothing new."""
        if self.delivered <= self.acked:
            return None
        self.acked = self.delivered
        return self.acked

    def on_ask(self, book: AckBook, instance: str, sid: int, now: float) -> bool:
        """The consumer of stream ``sid`` asks for its next batch: what that acknowledges is
        recorded in ``book`` (the instance's next call carries it); True if the latest
        acknowledgement should also be sent on its own now (``mark_sent``)."""
        seq = self.asked_next()
        if seq is None:
            return False
        book.record(instance, sid, seq)
        return self.due(now)

    def due(self, now: float) -> bool:
        """Should the latest acknowledgement be sent on its own now?"""
        return self.acked > self.sent and now - self.sent_at >= self.interval_s

    @property
    def unsent(self) -> bool:
        """An acknowledgement was recorded but never sent on its own."""
        return self.acked > self.sent

    def mark_sent(self, now: float) -> int:
        """The latest acknowledgement goes out on its own now; its seq."""
        self.sent_at = now
        self.sent = self.acked
        return self.sent


@final
@attrs.define(eq=False)
class AckBook:
    """A deployment's recorded acknowledgements, per instance (sid -> seq)."""

    _pending: dict[str, dict[int, int]] = attrs.field(init=False, factory=dict)
    _ended: dict[str, set[int]] = attrs.field(init=False, factory=dict)

    @classmethod
    def of(cls, names: Iterable[str]) -> AckBook:
        book = cls()
        for name in names:
            book.reset(name)
        return book

    def record(self, instance: str, sid: int, seq: int) -> None:
        """Stream ``sid`` asked past batch ``seq``: the instance's next call says so."""
        self._pending[instance][sid] = seq

    def ended(self, instance: str, sid: int) -> None:
        """Stream ``sid`` will acknowledge nothing more: forget it once a call carried it."""
        self._ended[instance].add(sid)

    def outgoing(self, instance: str) -> dict[int, int]:
        """What ``instance``'s next call carries (a copy: the book may change meanwhile)."""
        return dict(self._pending[instance])

    def carried(self, instance: str, acks: Mapping[int, int]) -> None:
        """A call to the live incarnation that carried ``acks`` succeeded: the ended streams
        among them whose last acknowledgement it carried are settled."""
        pending, ended = self._pending[instance], self._ended[instance]
        for sid in ended & acks.keys():
            if pending.get(sid) == acks[sid]:
                del pending[sid]
                ended.discard(sid)
        ended &= pending.keys()

    def closed(self, instance: str, sid: int) -> None:
        """Stream ``sid`` was closed by a call that said how far it got: nothing to carry."""
        self._pending[instance].pop(sid, None)

    def reset(self, instance: str) -> None:
        """A new incarnation of ``instance``: nothing recorded for the old one applies."""
        self._pending[instance] = {}
        self._ended[instance] = set()

    def pending(self, instance: str) -> int:
        return len(self._pending[instance])

    def __repr__(self) -> str:
        n = sum(len(p) for p in self._pending.values())
        return f"<AckBook instances={len(self._pending)} pending={n}>"


@final
@attrs.define(eq=False)
class UnackedBatches(Generic[T]):
    """The batches of one stream sent but not yet acknowledged, oldest first; numbered from
    ``HEADER_SEQ + 1``."""

    _batches: deque[tuple[int, tuple[T, ...]]] = attrs.field(init=False, factory=deque)
    seq: int = attrs.field(init=False, default=HEADER_SEQ)
    """Seq of the last batch registered."""

    def register(self, items: Sequence[T]) -> int:
        """Number ``items`` as the next batch; they stay unacknowledged until ``ack``."""
        self.seq += 1
        self._batches.append((self.seq, tuple(items)))
        return self.seq

    def ack(self, upto: int) -> list[tuple[T, ...]]:
        """Every batch up to ``upto`` is received: those not acknowledged before, in order."""
        done: list[tuple[T, ...]] = []
        while self._batches and self._batches[0][0] <= upto:
            done.append(self._batches.popleft()[1])
        return done

    def take_rest(self) -> list[T]:
        """Every item not acknowledged (the stream is closed: they were never received)."""
        rest = [item for _, items in self._batches for item in items]
        self._batches.clear()
        return rest

    def __len__(self) -> int:
        return len(self._batches)

    def __repr__(self) -> str:
        return f"<UnackedBatches seq={self.seq} unacked={len(self._batches)}>"
