"""The polling drain the reference design used, reimplemented faithfully as the baseline.

Every ``period_s`` (50 ms) it rebuilds the full inventory from the ledger — it iterates every
attempt the ledger holds and groups the in-flight ones (DISPATCHED, the same ownership rule as
``RecoveryLedger.is_in_flight``) by instance — then checks whether any episode Gym reported on
the wire is still in that instance's inventory. It returns when none is. Each poll is one
synchronous O(ledger) step on the event loop, as it was in the reference design; its wake latency
is the remaining poll period plus one scan.

The scan is ``RecoveryLedger.dispatched()``, the ledger's one walk over every attempt it holds
(O(ledger), meant for checks and this baseline, never a per-reply path): it reads the columns
slot by slot and builds only the rollout ID of each attempt in flight, the cheapest faithful way
to "iterate every attempt" on that storage, far cheaper than ``to_snapshot()`` or a walk over
attempt views.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping

import trio

from gymckpt.runtime import DrainTimeout, RecoveryLedger

__all__ = ["full_inventory", "group_by_instance", "polling_drain"]


def full_inventory(ledger: RecoveryLedger) -> dict[str, set[str]]:
    """Rollout IDs in flight, by instance, from a walk over every attempt. O(ledger)."""
    inventory: dict[str, set[str]] = {}
    for rid, instance in ledger.dispatched():
        held = inventory.get(instance)
        if held is None:
            held = inventory[instance] = set()
        held.add(rid)
    return inventory


def group_by_instance(ledger: RecoveryLedger, on_wire: Iterable[str]) -> dict[str, list[str]]:
    """Episodes on the wire by the instance that reported them (commit replies are per
    instance)."""
    out: dict[str, list[str]] = {}
    for rid in on_wire:
        att = ledger.get(rid)
        if att is not None and att.replica is not None:
            out.setdefault(att.replica, []).append(rid)
    return out


async def polling_drain(
    ledger: RecoveryLedger,
    on_wire: Mapping[str, Collection[str]],
    timeout_s: float,
    *,
    period_s: float = 0.05,
    on_scan: Callable[[int, int], None] | None = None,
) -> int:
    """Poll until no episode of ``on_wire`` (by instance) is in flight; returns the poll count.

    ``on_scan(duration_ns, attempts_scanned)`` is called after every poll's scan.
    """
    polls = 0
    with trio.move_on_after(timeout_s) as scope:
        while True:
            t0 = time.perf_counter_ns()
            inventory = full_inventory(ledger)
            remaining = [
                rid
                for instance, rids in on_wire.items()
                for rid in rids
                if rid in inventory.get(instance, ())
            ]
            polls += 1
            if on_scan is not None:
                on_scan(time.perf_counter_ns() - t0, ledger.statistics().attempts)
            if not remaining:
                return polls
            await trio.sleep(period_s)
    assert scope.cancelled_caught
    raise DrainTimeout(set(remaining), timeout_s)
