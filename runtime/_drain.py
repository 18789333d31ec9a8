"""The drain: wait for the few episodes whose reply is on the wire (S9), without polling.

After a commit, Gym reports the episodes it did not export because their reply was already on
the wire. Of those, the ledger says which are still in flight (``pending_among``, the same
ownership rule as the inventory). ``wait_drained`` parks on the ledger's barrier under exactly
those rollout IDs: a mutation that touches none of them never evaluates the predicate, and each
evaluation drops what has landed, so a wakeup costs O(still pending), never O(in-flight).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from ._errors import DrainTimeout
from ._ledger import RecoveryLedger

__all__ = ["wait_drained"]


async def wait_drained(ledger: RecoveryLedger, on_wire: Iterable[str], timeout_s: float) -> int:
    """Return once no episode of ``on_wire`` is in flight; the number that was pending.

    Raises ``DrainTimeout`` (count and a short sample) if some are still pending after
    ``timeout_s``.
    """
    pending = ledger.pending_among(on_wire)
    if not pending:
        await trio.lowlevel.checkpoint()
        return 0
    keys = frozenset(pending)
    is_in_flight = ledger.is_in_flight

    def drained() -> bool:
        for rid in [r for r in pending if not is_in_flight(r)]:
            pending.discard(rid)
        return not pending

    with trio.move_on_after(timeout_s) as scope:
        await ledger.barrier.wait_until(drained, keys)
    if scope.cancelled_caught:
        raise DrainTimeout(pending, timeout_s)
    return len(keys)
