"""Acknowledgement on the next call: the stream's counters, the deployment's book, the
instance's unacknowledged batches."""

from __future__ import annotations

import pytest

from gymckpt.gym_adapter.transports._acks import AckBook, StreamAcks, UnackedBatches
from gymckpt.gym_adapter.transports._admission import HEADER_SEQ


def test_a_stream_acknowledges_only_what_it_handed_over_and_asked_past() -> None:
    acks = StreamAcks(interval_s=0.05, sent_at=0.0)
    assert acks.asked_next() is None  # nothing delivered: nothing to acknowledge
    acks.deliver(1)
    assert acks.acked == HEADER_SEQ  # handed over, not yet asked past: still on the wire
    assert acks.asked_next() == 1
    assert acks.asked_next() is None  # asked again without a new batch: nothing new
    acks.deliver(3)
    assert acks.asked_next() == 3
    with pytest.raises(ValueError, match="after batch 3"):
        acks.deliver(2)


def test_a_stream_sends_its_acknowledgement_on_its_own_at_most_every_interval() -> None:
    acks = StreamAcks(interval_s=0.05, sent_at=10.0)
    acks.deliver(1)
    acks.asked_next()
    assert not acks.due(10.04) and acks.unsent
    assert acks.due(10.05)
    assert acks.mark_sent(10.05) == 1
    assert not acks.unsent and not acks.due(11.0)  # nothing new since
    acks.deliver(2)
    acks.asked_next()
    assert not acks.due(10.09) and acks.due(10.2)


def test_asking_for_the_next_batch_records_it_in_the_book_and_says_when_to_send() -> None:
    """``on_ask``: what both transports' streams do when their consumer asks for a batch."""
    book, acks = AckBook.of(["gym-0"]), StreamAcks(interval_s=0.05, sent_at=10.0)
    assert not acks.on_ask(book, "gym-0", 7, 10.0) and book.outgoing("gym-0") == {}
    acks.deliver(1)
    assert not acks.on_ask(book, "gym-0", 7, 10.01)  # recorded, not due on its own yet
    assert book.outgoing("gym-0") == {7: 1}
    acks.deliver(2)
    assert acks.on_ask(book, "gym-0", 7, 10.06) and book.outgoing("gym-0") == {7: 2}
    assert acks.mark_sent(10.06) == 2
    assert not acks.on_ask(book, "gym-0", 7, 11.0)  # nothing new since


def test_the_book_hands_acknowledgements_to_the_next_call_until_settled() -> None:
    book = AckBook.of(["gym-0", "gym-1"])
    book.record("gym-0", 1, 4)
    book.record("gym-0", 2, 1)
    sent = book.outgoing("gym-0")
    assert sent == {1: 4, 2: 1} and book.outgoing("gym-1") == {}
    book.record("gym-0", 1, 5)  # meanwhile: the copy handed to the call is unchanged
    assert sent == {1: 4, 2: 1}
    book.ended("gym-0", 1)
    book.ended("gym-0", 2)
    book.carried("gym-0", sent)
    # stream 2's last acknowledgement was carried: settled; stream 1's latest (5) was not
    assert book.outgoing("gym-0") == {1: 5}
    book.carried("gym-0", book.outgoing("gym-0"))
    assert book.outgoing("gym-0") == {} and book.pending("gym-0") == 0


def test_a_stream_that_goes_on_stays_in_the_book_after_a_call_carried_it() -> None:
    book = AckBook.of(["gym-0"])
    book.record("gym-0", 7, 2)
    book.carried("gym-0", book.outgoing("gym-0"))
    assert book.outgoing("gym-0") == {7: 2}  # repeated until the stream ends: harmless
    book.closed("gym-0", 7)
    assert book.outgoing("gym-0") == {}


def test_a_new_incarnation_forgets_the_old_ones_acknowledgements() -> None:
    book = AckBook.of(["gym-0"])
    book.record("gym-0", 1, 3)
    book.ended("gym-0", 1)
    book.reset("gym-0")
    assert book.outgoing("gym-0") == {}
    book.record("gym-0", 1, 1)
    book.carried("gym-0", {1: 1})
    assert book.outgoing("gym-0") == {1: 1}  # the old "ended" mark is gone with the reset


def test_unacked_batches_are_numbered_after_the_header_and_acked_in_order() -> None:
    box: UnackedBatches[str] = UnackedBatches()
    assert box.register(["a", "b"]) == HEADER_SEQ + 1
    assert box.register(["c"]) == 2
    assert box.register(["d"]) == 3
    assert box.ack(HEADER_SEQ) == []
    assert box.ack(2) == [("a", "b"), ("c",)]
    assert box.ack(2) == []  # repeated: nothing more
    assert len(box) == 1
    assert box.take_rest() == ["d"]
    assert len(box) == 0 and box.take_rest() == []
