"""Ledgers at scale for the benchmarks, built only through the ledger's public changes inside
barrier mutations (``mutate_nowait`` during setup, ``await mutate`` for traffic during a
measurement), exactly as the runtime makes them.

``InFlightFixture`` keeps a ledger with N attempts DISPATCHED over K instances and produces
*unrelated data-plane traffic*: it completes the oldest in-flight attempt that is not a pending
one, and after every ``group_size`` completions reserves and dispatches one new row and hands
finished groups to the trainer, so the number in flight stays at N however long a measurement
runs. ``build_mixed_ledger`` builds the realistic mix of states the memory benchmark weighs.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import attrs

from gymckpt.runtime import EpisodeResult, RecoveryLedger

__all__ = ["RESULT", "InFlightFixture", "build_mixed_ledger"]

RESULT = EpisodeResult(reward=1.0, turns=3)
GATE_ID = 1
_CHUNK_ROWS = 2048


def instance_names(k: int) -> tuple[str, ...]:
    return tuple(f"gym-{i}" for i in range(k))


@attrs.define(eq=False)
class InFlightFixture:
    """A ledger with ``in_flight`` attempts DISPATCHED, and a source of unrelated traffic."""

    ledger: RecoveryLedger
    instances: tuple[str, ...]
    rng: random.Random
    gate_id: int = GATE_ID
    # Dispatched attempts in dispatch order; [head:] are candidates for traffic and for picks.
    _pool: list[str] = attrs.field(factory=list)
    _head: int = 0
    # Picked as pending by a trial: traffic must not complete them (the trial delivers them).
    _picked: set[str] = attrs.field(factory=set)
    _since_refill: int = 0
    unrelated_completions: int = 0
    rows_dispatched: int = 0

    @classmethod
    def build(
        cls,
        in_flight: int,
        *,
        group_size: int = 8,
        instances: int = 16,
        seed: int = 0,
        progress: Callable[[str], None] | None = None,
    ) -> InFlightFixture:
        ledger = RecoveryLedger(group_size=group_size, max_row_attempts=3)
        fx = cls(ledger=ledger, instances=instance_names(instances), rng=random.Random(seed))
        rows = -(-in_flight // group_size)
        for start in range(0, rows, _CHUNK_ROWS):
            stop = min(rows, start + _CHUNK_ROWS)
            ledger.barrier.mutate_nowait(functools.partial(fx._dispatch_rows, stop - start))
            if progress is not None and (start // _CHUNK_ROWS) % 64 == 63:
                progress(f"  building ledger: {stop * group_size:,}/{rows * group_size:,}")
        return fx

    @property
    def in_flight(self) -> int:
        return self.ledger.statistics().by_state["dispatched"]

    def _dispatch_rows(self, count: int, out: list[str] | None = None) -> None:
        """Inside a mutation: reserve ``count`` new rows and dispatch every slot (gate admitted)."""
        ledger = self.ledger
        k = len(self.instances)
        for _ in range(count):
            row = ledger.next_row
            ids = [a.rollout_id for a in ledger.reserve_row(row)]
            ledger.mark_dispatched(ids, self.instances[row % k], self.gate_id)
            self._pool.extend(ids)
            if out is not None:
                out.extend(ids)
            self.rows_dispatched += 1

    def pick_pending(self, count: int) -> list[str]:
        """``count`` random in-flight attempts, none picked before: the episodes on the wire."""
        lo, hi = self._head, len(self._pool)
        if hi - lo < 2 * count:
            raise ValueError(f"cannot pick {count} pending from {hi - lo} in flight")
        out: list[str] = []
        chosen: set[str] = set()
        while len(out) < count:
            rid = self._pool[self.rng.randrange(lo, hi)]
            if rid in self._picked or rid in chosen:
                continue
            chosen.add(rid)
            out.append(rid)
        self._picked.update(out)
        return out

    def _next_unrelated(self) -> str:
        pool, picked = self._pool, self._picked
        while pool[self._head] in picked:
            picked.discard(pool[self._head])
            self._head += 1
        rid = pool[self._head]
        self._head += 1
        return rid

    def maintain(self, in_flight: int) -> None:
        """Between measurements (never inside one): dispatch rows until ``in_flight`` attempts
        are in flight again (pending replies take some away), and drop consumed pool entries."""
        deficit = in_flight - self.in_flight
        if deficit > 0:
            rows = -(-deficit // self.ledger.group_size)
            self.ledger.barrier.mutate_nowait(functools.partial(self._dispatch_rows, rows))
        if self._head > 4096:
            del self._pool[: self._head]
            self._head = 0

    def _complete(self, rid: str) -> bool:
        return self.ledger.complete(rid, self.gate_id, RESULT)

    def _refill(self, out: list[str]) -> None:
        self._dispatch_rows(1, out)
        self.ledger.take_ready(1 << 30)

    async def unrelated_mutation(self) -> None:
        """One unit of other traffic: complete the oldest unpicked in-flight attempt; every
        ``group_size`` completions, dispatch a new row (and train finished groups)."""
        rid = self._next_unrelated()
        barrier = self.ledger.barrier
        await barrier.mutate(functools.partial(self._complete, rid), touched=(rid,))
        self.unrelated_completions += 1
        self._since_refill += 1
        if self._since_refill >= self.ledger.group_size:
            self._since_refill = 0
            new: list[str] = []
            # ``touched`` is read after the function returns, so it may be filled in by it.
            await barrier.mutate(functools.partial(self._refill, new), touched=new)

    def complete_pending_fn(self, rid: str) -> Callable[[], bool]:
        """The mutation function delivering a pending reply."""
        return functools.partial(self._complete, rid)


def build_mixed_ledger(
    attempts: int, *, group_size: int = 8, instances: int = 16, seed: int = 0
) -> RecoveryLedger:
    """A ledger of about ``attempts`` current attempts in the mix a busy run has.

    Per row: 15 % of rows still RESERVED (waiting for admission). The others are dispatched, and
    then per slot: 25 % COMPLETED with a result (not yet trained), 2 % failed (infra; the slot's
    next attempt is RESERVED under a new rollout ID), 1 % refused by ``admission_closed`` (back to
    RESERVED with its identity), 1 % abandoned (queued for retirement, re-sent fresh), the rest
    DISPATCHED.
    """
    ledger = RecoveryLedger(group_size=group_size, max_row_attempts=3, data_failure_budget=1 << 30)
    names = instance_names(instances)
    rng = random.Random(seed)
    rows = attempts // group_size

    def chunk(first: int, last: int) -> None:
        for row in range(first, last):
            atts = ledger.reserve_row(row)
            if rng.random() < 0.15:
                continue
            ids = [a.rollout_id for a in atts]
            ledger.mark_dispatched(ids, names[row % instances], GATE_ID)
            for rid in ids:
                u = rng.random()
                if u < 0.25:
                    ledger.complete(rid, GATE_ID, RESULT)
                elif u < 0.27:
                    ledger.fail(rid, GATE_ID, "infra", "transport reset")
                elif u < 0.28:
                    ledger.refuse(rid)
                elif u < 0.29:
                    ledger.abandon([rid])

    for start in range(0, rows, _CHUNK_ROWS):
        ledger.barrier.mutate_nowait(
            functools.partial(chunk, start, min(rows, start + _CHUNK_ROWS))
        )
    return ledger
