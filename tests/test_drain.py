"""wait_drained: sleeps on exactly the pending episodes; O(pending) per wakeup; clear timeout."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from gymckpt.runtime import (
    DrainTimeout,
    EpisodeResult,
    RecoveryLedger,
    rollout_id_for,
    wait_drained,
)

R = EpisodeResult(1.0, 1)


def _ledger(rows: int) -> tuple[RecoveryLedger, list[str]]:
    ledger = RecoveryLedger(group_size=1)
    ids = [rollout_id_for(r, 0, 0) for r in range(rows)]

    def fill() -> None:
        for r in range(rows):
            ledger.reserve_row(r)
        ledger.mark_dispatched(ids, "gym-0", 1)

    ledger.barrier.mutate_nowait(fill)
    return ledger, ids


async def test_returns_when_the_last_pending_reply_lands(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger, ids = _ledger(1000)
    pending = ids[:3]
    done_at: list[float] = []

    async def drain() -> None:
        assert await wait_drained(ledger, [*pending, "not-in-ledger"], 10.0) == 3
        done_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        for i, rid in enumerate(pending):
            await trio.sleep(1)
            # unrelated replies in between never evaluate the drain's predicate
            before = ledger.barrier.statistics().predicate_evaluations
            for other in ids[100 + 10 * i : 110 + 10 * i]:
                await ledger.barrier.mutate(lambda o=other: ledger.complete(o, 1, R), [other])
            assert ledger.barrier.statistics().predicate_evaluations == before
            await ledger.barrier.mutate(lambda r=rid: ledger.complete(r, 1, R), [rid])
    assert done_at == [3.0]


async def test_nothing_pending_returns_at_once() -> None:
    ledger, ids = _ledger(5)
    await ledger.barrier.mutate(lambda: ledger.complete(ids[0], 1, R), [ids[0]])
    assert await wait_drained(ledger, [ids[0]], 1.0) == 0


async def test_timeout_reports_count_and_short_sample(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger, ids = _ledger(50)
    with pytest.raises(DrainTimeout) as info:
        await wait_drained(ledger, ids[:40], 2.5)
    assert trio.current_time() == 2.5
    msg = str(info.value)
    assert "40 (" in msg and ", …)" in msg and "after 2.5s" in msg
    assert msg.count("-0") == 5  # a sample of five IDs, not all forty
    assert ledger.barrier.statistics().waiters == 0


async def test_wakes_on_the_reply_that_settles_the_last_pending_id_not_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger, ids = _ledger(100)
    pending = ids[:4]
    returned: list[int] = []

    async def drain() -> None:
        returned.append(await wait_drained(ledger, pending, 10.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        last = pending[-1]
        # a stale reply names the last ID but does not settle it: no wake
        await ledger.barrier.mutate(lambda: ledger.complete(last, 99, R), [last])
        for rid in pending[:-1]:
            await ledger.barrier.mutate(lambda r=rid: ledger.complete(r, 1, R), [rid])
            await trio.testing.wait_all_tasks_blocked()
            assert returned == []
        # the last one landing wakes the drain: it returns before any time passes
        await ledger.barrier.mutate(lambda: ledger.complete(last, 1, R), [last])
        await trio.testing.wait_all_tasks_blocked()
        assert returned == [4] and trio.current_time() == 0.0
    assert ledger.barrier.statistics().waiters == 0


async def test_a_pending_attempt_whose_row_is_dropped_is_settled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Dropping a row frees its block (its slots keep their last state) and a new row may
    reuse it at once: the drain must see the dropped attempt as settled, not the new one's."""
    ledger = RecoveryLedger(group_size=2)
    ledger.barrier.mutate_nowait(lambda: ledger.reserve_row(0))
    old = [rollout_id_for(0, s, 0) for s in range(2)]
    ledger.barrier.mutate_nowait(lambda: ledger.mark_dispatched(old, "gym-0", 1))
    returned: list[float] = []

    async def drain() -> None:
        await wait_drained(ledger, old[:1], 10.0)
        returned.append(trio.current_time())

    def drop_and_reuse() -> None:
        ledger.drop_row(0)
        ledger.reserve_row(1)  # reuses row 0's block: same slots, attempt 0, dispatched
        ledger.mark_dispatched([rollout_id_for(1, s, 0) for s in range(2)], "gym-0", 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.sleep(1)
        await ledger.barrier.mutate(drop_and_reuse, old)
    assert returned == [1.0]


async def test_timeouts_of_concurrent_drains_each_at_their_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger, ids = _ledger(10)
    ended: dict[str, tuple[str, float]] = {}

    async def drain(name: str, rid: str, timeout_s: float) -> None:
        try:
            await wait_drained(ledger, [rid], timeout_s)
            ended[name] = ("drained", trio.current_time())
        except DrainTimeout:
            ended[name] = ("timeout", trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, "long", ids[0], 100.0)
        await trio.sleep(1)
        nursery.start_soon(drain, "short", ids[1], 3.0)
        await trio.sleep(49)
        await ledger.barrier.mutate(lambda: ledger.complete(ids[0], 1, R), [ids[0]])
    assert ended == {"short": ("timeout", 4.0), "long": ("drained", 50.0)}
    assert ledger.barrier.statistics().waiters == 0


async def test_a_failed_attempt_redispatched_in_the_same_mutation_is_settled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The replacement takes the same slot (attempt + 1) and may be in flight again before the
    drain is asked: the attempt the drain waits for is still settled."""
    ledger, ids = _ledger(3)
    rid = ids[0]
    returned: list[float] = []

    async def drain() -> None:
        await wait_drained(ledger, [rid], 10.0)
        returned.append(trio.current_time())

    def fail_and_resend() -> None:
        nxt = ledger.fail(rid, 1, "infra", "replica lost")
        assert nxt is not None
        ledger.mark_dispatched([nxt.rollout_id], "gym-1", 2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.sleep(1)
        await ledger.barrier.mutate(fail_and_resend, [rid])
    assert returned == [1.0]
