"""MutationBarrier: every ledger change runs inside a barrier mutation (S9).

Why this shape
--------------
The checkpoint has two needs that pull in different directions. It must *stop* the ledger from
changing while it copies a consistent cut, and it must *wait* for a handful of pending replies
without looking at the whole ledger. One object serves both:

* ``mutate_nowait(fn, touched)`` runs a synchronous change. Because the change is synchronous, no
  other task can observe the ledger half-changed, and a hold can never interrupt one.
* ``hold()`` is taken by a checkpoint. While it is held, ``mutate()`` queues its change and
  ``mutate_nowait()`` raises ``trio.WouldBlock``; queued changes are otherwise undisturbed and
  run in FIFO order within the release itself, before any task can observe the ledger.
* ``wait_until(predicate, keys)`` parks a waiter under the keys its predicate depends on (the
  drain uses rollout IDs). After a mutation, only waiters registered under a key the mutation
  touched have their predicate evaluated — trio-util's AsyncValue, made O(touched) rather than
  O(waiters) so the drain's per-wakeup cost is O(pending) and never O(in-flight). A waiter
  registered under ``ANY`` is evaluated after every mutation.
* ``wait_settled(keys, settled)`` is the drain's sharper form: a per-key predicate, checked
  only for the keys a mutation touched, with settled keys removed from the caller's set as they
  land — O(1) per reply and an O(1) final wake (one reschedule, nothing left to free),
  however many episodes were pending.

No wakeup can be missed: a waiter checks its predicate before it parks, and every later change
goes through ``_after_mutation``, which runs before any other task can run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import Final, TypeVar, cast, final

import attrs
import trio

__all__ = ["ANY", "BarrierStatistics", "MutationBarrier"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
_reschedule = trio.lowlevel.reschedule


@final
class _AnyKey:
    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _AnyKey()
"""Register a waiter under ``ANY`` to have its predicate checked after every mutation."""


@attrs.define(eq=False, slots=True)
class _Waiter:
    predicate: Callable[[], bool]
    event: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False, slots=True)
class _SettleWaiter:
    """A parked ``wait_settled`` call. ``task`` is the parked task while it may still be woken,
    and None once it has been rescheduled (all keys settled) or its wait was aborted
    (cancelled): whoever clears it owns the task's wakeup, so it happens exactly once."""

    settled: Callable[[Hashable], bool]
    remaining: set[Hashable]
    task: trio.lowlevel.Task | None


def _settle_key(sw: _SettleWaiter, key: Hashable) -> None:
    """``key`` settled for ``sw``: wake its task when it was the last key outstanding."""
    remaining = sw.remaining
    remaining.discard(key)
    if not remaining and (task := sw.task) is not None:
        sw.task = None
        _reschedule(task)  # the drain's wake: it runs in the next batch


@attrs.define(eq=False, slots=True)
class _Queued:
    fn: Callable[[], object]
    touched: Iterable[Hashable]
    done: trio.Event = attrs.field(factory=trio.Event)
    result: object = None
    error: Exception | None = None
    cancelled: bool = False


@attrs.frozen
class BarrierStatistics:
    """A read-only view of a barrier, for tests and ``repr``."""

    held: bool
    holder: str | None
    mutations: int
    queued_mutations: int
    waiters: int
    predicate_evaluations: int


@final
@attrs.define(eq=False, slots=True)
class MutationBarrier:
    """Serialises ledger changes, lets a checkpoint hold them, and wakes waiters selectively."""

    _holder: str | None = attrs.field(default=None, init=False)
    _queue: deque[_Queued] = attrs.field(factory=deque, init=False)
    _holders: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _by_key: dict[Hashable, set[_Waiter]] = attrs.field(factory=dict, init=False)
    _settle: dict[Hashable, _SettleWaiter | set[_SettleWaiter]] = attrs.field(
        factory=dict, init=False
    )
    """``wait_settled`` waiters by key: the waiter itself while it is the key's only one (the
    drain's case: no collector-tracked set per pending key), a set once there are more."""
    _mutating: bool = attrs.field(default=False, init=False)
    _mutations: int = attrs.field(default=0, init=False)
    _evaluations: int = attrs.field(default=0, init=False)

    # -- mutations -----------------------------------------------------------------------------

    @property
    def in_mutation(self) -> bool:
        """True while a mutation's function runs (the ledger asserts this on every change)."""
        return self._mutating

    def mutate_nowait(self, fn: Callable[[], T], touched: Iterable[Hashable] = ()) -> T:
        """Run ``fn()`` as one mutation, then wake waiters on the keys it ``touched``.

        Raises ``trio.WouldBlock`` while a checkpoint holds the barrier. ``touched`` is read after
        ``fn`` returns, so a mutation may pass a collection it fills in.
        """
        if self._holder is not None:
            raise trio.WouldBlock
        if self._mutating:
            raise RuntimeError("mutations do not nest")
        self._mutating = True
        try:
            result = fn()
        finally:
            self._mutating = False
            self._mutations += 1
            self._after_mutation(touched)
        return result

    async def mutate(self, fn: Callable[[], T], touched: Iterable[Hashable] = ()) -> T:
        """Run ``fn()`` as one mutation; while the barrier is held, queue it (FIFO).

        Queued mutations run, in order, inside the release of the hold — before any other task
        can see the ledger — and their callers get each result or exception back. A caller
        cancelled while queued is skipped: its mutation never runs.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._holder is None:
            try:
                return self.mutate_nowait(fn, touched)
            finally:
                await trio.lowlevel.cancel_shielded_checkpoint()
        item = _Queued(fn, touched)
        self._queue.append(item)
        try:
            await item.done.wait()
        except BaseException:
            item.cancelled = True  # single-threaded: it has not run, and now never will
            raise
        if item.error is not None:
            raise item.error
        return cast(T, item.result)

    def _run_queued(self) -> None:
        queue = self._queue
        while queue and self._holder is None:
            item = queue.popleft()
            if item.cancelled:
                continue
            try:
                item.result = self.mutate_nowait(item.fn, item.touched)
            except Exception as exc:
                item.error = exc
            item.done.set()

    def _after_mutation(self, touched: Iterable[Hashable]) -> None:
        by_key, settle = self._by_key, self._settle
        if not by_key and not settle:
            return
        if not isinstance(touched, (list, tuple, set, frozenset)):
            touched = list(touched)
        if settle:
            for key in touched:
                group = settle.get(key)
                if group is None:
                    continue
                if type(group) is _SettleWaiter:
                    self._evaluations += 1
                    if group.settled(key):
                        del settle[key]
                        _settle_key(group, key)
                    continue
                assert isinstance(group, set)
                for sw in tuple(group):
                    self._evaluations += 1
                    if sw.settled(key):
                        group.discard(sw)
                        _settle_key(sw, key)
                if not group:
                    del settle[key]
        if not by_key:
            return
        candidates: set[_Waiter] = set(by_key.get(ANY, ()))
        for key in touched:
            waiters = by_key.get(key)
            if waiters:
                candidates.update(waiters)
        for waiter in candidates:
            if waiter.event.is_set():
                continue
            self._evaluations += 1
            if waiter.predicate():
                waiter.event.set()

    # -- holding ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def hold(self, holder: str) -> AsyncIterator[None]:
        """Hold the barrier as ``holder``: mutations queue until the block exits.

        Holders exclude each other (a second holder parks). Exiting, even by cancellation,
        releases the hold and lets queued mutations run in order.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._holder is not None:
            await self._holders.park()
        self._holder = holder
        try:
            yield
        finally:
            self._holder = None
            self._run_queued()
            self._holders.unpark()

    @property
    def holder(self) -> str | None:
        """Name of the current holder, or None."""
        return self._holder

    # -- waiting ---------------------------------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], bool], keys: Collection[Hashable]) -> None:
        """Return once ``predicate()`` is true, checking it after mutations that touch ``keys``.

        The predicate is checked once on entry (with a checkpoint, like trio-util's
        ``wait_value``). It must depend only on ledger state reached through ``keys`` — that is
        what lets unrelated mutations skip it. Cancellation unregisters the waiter at once.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._evaluations += 1
        if predicate():
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(predicate)
        for key in keys:
            self._by_key.setdefault(key, set()).add(waiter)
        try:
            await waiter.event.wait()
        finally:
            for key in keys:
                group = self._by_key.get(key)
                if group is not None:
                    group.discard(waiter)
                    if not group:
                        del self._by_key[key]

    async def wait_settled(self, keys: set[K], settled: Callable[[K], bool]) -> None:
        """Return once ``settled(key)`` holds for every key of ``keys``; the drain's wait (S9).

        Each key is checked once on entry, then only after a mutation that touches it. The
        waiter works on ``keys`` itself: a key found settled is removed from the set at once,
        so the set is empty on return, and after a cancellation it holds exactly the keys still
        unsettled. Nothing is left to release when the last key lands: a wakeup costs O(keys
        the mutation touched) — O(1) per reply — and the final wake is one reschedule of the
        parked task, however many keys there were. A key must not become unsettled again (a
        landed reply stays landed). Cancellation unregisters the keys still outstanding.
        """
        if not isinstance(keys, set):
            raise TypeError(
                f"wait_settled takes a set of keys (it removes them as they settle), "
                f"not {type(keys).__name__}; pass set(keys)"
            )
        await trio.lowlevel.checkpoint_if_cancelled()
        done = [key for key in keys if settled(key)]
        self._evaluations += len(keys)
        keys.difference_update(done)
        del done
        if not keys:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _SettleWaiter(
            cast(Callable[[Hashable], bool], settled),
            cast(set[Hashable], keys),
            trio.lowlevel.current_task(),
        )
        settle = self._settle
        for key in keys:
            group = settle.get(key)
            if group is None:
                settle[key] = waiter
            elif isinstance(group, set):
                group.add(waiter)
            else:
                settle[key] = {group, waiter}

        def abort(_: object) -> trio.lowlevel.Abort:
            waiter.task = None  # cancelled while parked: no mutation may wake it any more
            return trio.lowlevel.Abort.SUCCEEDED

        # Parked on the task itself rather than a trio.Event: the wake is one reschedule, and
        # no other task runs between the registration above and the park.
        try:
            await trio.lowlevel.wait_task_rescheduled(abort)
        finally:
            for key in keys:  # empty after a normal wake
                group = settle.get(key)
                if group is waiter:
                    del settle[key]
                elif isinstance(group, set):
                    group.discard(waiter)
                    if not group:
                        del settle[key]

    def statistics(self) -> BarrierStatistics:
        """Counts for tests: mutations run, mutations queued, distinct waiters, evaluations."""
        waiters: set[object] = set()
        for group in self._by_key.values():
            waiters.update(group)
        for sgroup in self._settle.values():
            if isinstance(sgroup, set):
                waiters.update(sgroup)
            else:
                waiters.add(sgroup)
        return BarrierStatistics(
            held=self._holder is not None,
            holder=self._holder,
            mutations=self._mutations,
            queued_mutations=sum(not q.cancelled for q in self._queue),
            waiters=len(waiters),
            predicate_evaluations=self._evaluations,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<MutationBarrier holder={s.holder!r} mutations={s.mutations} "
            f"queued={s.queued_mutations} waiters={s.waiters}>"
        )
