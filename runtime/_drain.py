"""The drain: wait for the few episodes whose reply is on the wire (S9), without polling.

After a commit, Gym reports the episodes it did not export because their reply was already on
the wire. Of those, the ledger says which are still in flight (``pending_among``, the same
ownership rule as the inventory). ``wait_drained`` parks on the ledger's barrier under exactly
those rollout IDs (``MutationBarrier.wait_settled``): a mutation that touches none of them costs
the drain nothing, and each reply that lands is checked and dropped on its own, so a wakeup costs
O(1) — never O(pending), let alone O(in-flight).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import trio

from ._errors import DrainTimeout
from ._ledger import RecoveryLedger

__all__ = ["wait_drained"]


async def wait_drained(
    ledger: RecoveryLedger,
    on_wire: Iterable[str] | Mapping[str, Iterable[str]],
    timeout_s: float,
) -> int:
    """Return once no episode of ``on_wire`` is in flight; the number that was pending.

    ``on_wire`` is a set of rollout IDs, or a mapping instance → IDs that instance lists on
    the wire (then only attempts in flight on that very instance are waited for).

    Raises ``DrainTimeout`` (count and a short sample) if some are still pending after
    ``timeout_s``. Cost: O(len(on_wire)) on entry, then O(1) per reply that lands.
    """
    if isinstance(on_wire, Mapping):
        pending: set[str] = set()
        for instance, ids in on_wire.items():
            pending |= ledger.pending_among(ids, instance)
    else:
        pending = ledger.pending_among(on_wire)
    if not pending:
        await trio.lowlevel.checkpoint()
        return 0
    count = len(pending)
    settled = ledger.settled_check(pending)  # locates each ID now: no parsing per reply
    with trio.move_on_after(timeout_s) as scope:
        # the barrier removes each ID from ``pending`` as its reply lands, so the wake has
        # nothing left to free, and a timeout finds exactly the IDs still outstanding
        await ledger.barrier.wait_settled(pending, settled)
    if scope.cancelled_caught:
        raise DrainTimeout(ledger.pending_among(pending), timeout_s)
    return count
