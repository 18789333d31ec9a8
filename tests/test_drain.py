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
            for other in ids[100 + 10 * i: 110 + 10 * i]:
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
