"""DeadlineRegistry: per-request deadlines that stop ticking while a named holder pauses (S7).

Why this shape
--------------
A request's budget is spent only while the system can make progress on it. While a checkpoint
has Gym parked (from closing admission until Gym resumes), or while a colocated inference engine
refits its weights, no request can advance, so its deadline must not tick. Those pauses come from
different owners and overlap freely, so each pause is held under a *name*: releasing the
checkpoint's pause never releases the refit's, and the clock resumes only when the last holder
lets go.

The registry keeps one *virtual clock*: ``trio.current_time()`` minus all the time spent paused.
Each deadline is stored once, as an expiry on that virtual clock, so registering or discarding is
O(1) and nothing has to be rewritten when a pause starts or ends. Only ``scope()`` needs real
trio deadlines; its cancel scopes are recomputed on pause and release (``inf`` while paused), which
costs O(active scopes) there and nothing anywhere else — in slices for a caller that can await
(``pause_in_slices``, ``release_in_slices``: the checkpoint's pause at 1M in flight).

Invariants
----------
* ``remaining(key)`` never decreases while ``paused`` is true, and decreases at the rate of
  ``trio.current_time()`` otherwise.
* A ``scope()`` body is cancelled exactly when its virtual expiry passes; while paused its cancel
  scope's deadline is ``inf``.
* ``paused`` is true iff ``holders`` is non-empty; a holder pauses at most once at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, final

import attrs
import trio

from ._errors import DeadlineExpired

__all__ = ["RETARGET_HORIZON_S", "RETARGET_SLICE", "DeadlineRegistry", "DeadlineStatistics"]


RETARGET_SLICE: Final = 512
"""Cancel scopes retargeted per loop step by ``pause_in_slices`` and ``release_in_slices``."""
RETARGET_HORIZON_S: Final = 1.0
"""Scopes whose trio deadline is this close are retargeted before the loop runs again."""


@attrs.define(eq=False, slots=True)
class _Deadline:
    key: str
    what: str
    budget_s: float
    expiry: float  # on the registry's virtual clock
    scope: trio.CancelScope | None = None
    reported: bool = False


def _expiry(entry: _Deadline) -> float:
    return entry.expiry


@attrs.frozen
class DeadlineStatistics:
    """A read-only view of a registry, for tests and ``repr``."""

    active: int
    paused: bool
    holders: frozenset[str]
    expired_total: int


@final
@attrs.define(eq=False, slots=True)
class DeadlineRegistry:
    """Request deadlines keyed by request, paused by any number of named holders.

    The clock is ``trio.current_time()``, so every method except construction must run inside
    trio. ``expired_total`` counts each deadline once, the first time it is reported expired
    (by ``expired()`` or by a ``scope()`` that cancelled its body).
    """

    _deadlines: dict[str, _Deadline] = attrs.field(factory=dict, init=False)
    _scoped: dict[str, _Deadline] = attrs.field(factory=dict, init=False)
    _holders: set[str] = attrs.field(factory=set, init=False)
    _paused_since: float = attrs.field(default=0.0, init=False)
    _paused_total: float = attrs.field(default=0.0, init=False)
    _expired_total: int = attrs.field(default=0, init=False)

    # -- the virtual clock -------------------------------------------------------------------

    def _now(self) -> float:
        """Virtual time: real time minus time spent paused; frozen while paused."""
        if self._holders:
            return self._paused_since - self._paused_total
        return trio.current_time() - self._paused_total

    def _real_deadline(self, entry: _Deadline) -> float:
        """The trio deadline of ``entry`` if nothing pauses again; ``inf`` while paused."""
        if self._holders:
            return math.inf
        return entry.expiry + self._paused_total

    # -- deadlines ---------------------------------------------------------------------------

    def register(self, key: str, what: str, budget_s: float) -> None:
        """Start a deadline of ``budget_s`` (pause-aware) seconds for ``key``, made for ``what``.

        Raises ``ValueError`` if ``key`` already has a deadline or ``budget_s`` is not positive.
        """
        self._add(key, what, budget_s)

    def _add(self, key: str, what: str, budget_s: float) -> _Deadline:
        if not budget_s > 0:
            raise ValueError(f"deadline budget for {key!r} must be > 0, got {budget_s!r}")
        if key in self._deadlines:
            raise ValueError(f"deadline {key!r} already registered")
        entry = _Deadline(key, what, float(budget_s), self._now() + budget_s)
        self._deadlines[key] = entry
        return entry

    def discard(self, key: str) -> None:
        """Forget ``key``'s deadline; no error if it has none.

        Discarding the key of a running ``scope()`` lifts that scope's deadline.
        """
        self._deadlines.pop(key, None)
        entry = self._scoped.pop(key, None)
        if entry is not None and entry.scope is not None:
            entry.scope.deadline = math.inf

    def remaining(self, key: str) -> float:
        """Seconds of ``key``'s budget left (0.0 once used up); frozen while paused."""
        try:
            entry = self._deadlines[key]
        except KeyError:
            raise KeyError(f"no deadline registered for {key!r}") from None
        return max(0.0, entry.expiry - self._now())

    def __contains__(self, key: object) -> bool:
        return key in self._deadlines

    def expired(self) -> list[DeadlineExpired]:
        """Every registered deadline whose budget is used up, earliest expiry first.

        Expired deadlines stay registered until discarded; each is counted once in
        ``expired_total``.
        """
        now = self._now()
        gone = sorted(
            (e for e in self._deadlines.values() if e.expiry <= now), key=lambda e: e.expiry
        )
        for entry in gone:
            self._mark_reported(entry)
        return [DeadlineExpired(e.key, e.what, e.budget_s) for e in gone]

    def _mark_reported(self, entry: _Deadline) -> None:
        if not entry.reported:
            entry.reported = True
            self._expired_total += 1

    @contextmanager
    def scope(self, key: str, what: str, budget_s: float) -> Iterator[None]:
        """Run the body under ``key``'s deadline; raise ``DeadlineExpired`` if it passes.

        The key is registered on entry (``ValueError`` if already present) and always discarded
        on exit. If the pause-aware deadline passes while the body runs, the body is cancelled
        and ``DeadlineExpired(key, what, budget_s)`` is raised from the ``with`` statement. A
        body that finishes without reaching a checkpoint after the deadline is not an error
        (like ``trio.fail_at``).
        """
        entry = self._add(key, what, budget_s)
        cancel_scope = trio.CancelScope(deadline=self._real_deadline(entry))
        entry.scope = cancel_scope
        self._scoped[key] = entry
        try:
            with cancel_scope:
                yield
        finally:
            entry.scope = None
            if self._deadlines.get(key) is entry:
                self.discard(key)
        if cancel_scope.cancelled_caught:
            self._mark_reported(entry)
            raise DeadlineExpired(key, what, entry.budget_s)

    # -- pausing -----------------------------------------------------------------------------

    def pause(self, holder: str) -> None:
        """Stop every deadline from ticking until ``holder`` (and every other holder) releases.

        Raises ``RuntimeError`` if ``holder`` already pauses.
        """
        if holder in self._holders:
            raise RuntimeError(f"deadlines already paused by {holder!r}")
        if not self._holders:
            self._paused_since = trio.current_time()
            self._holders.add(holder)
            self._retarget_scopes()
        else:
            self._holders.add(holder)

    def release(self, holder: str) -> None:
        """Release ``holder``'s pause; deadlines tick again once no holder is left.

        Never releases another holder's pause. Raises ``RuntimeError`` if ``holder`` does not
        pause.
        """
        if holder not in self._holders:
            raise RuntimeError(f"deadlines are not paused by {holder!r}")
        self._holders.remove(holder)
        if not self._holders:
            self._paused_total += trio.current_time() - self._paused_since
            self._retarget_scopes()

    def _retarget_scopes(self) -> None:
        for entry in self._scoped.values():
            if entry.scope is not None:
                entry.scope.deadline = self._real_deadline(entry)

    async def pause_in_slices(self, holder: str) -> None:
        """``pause(holder)``, the cancel scopes retargeted ``RETARGET_SLICE`` at a time with a
        (cancel-shielded) checkpoint between slices: at 1M in flight a trainer holds ~8k
        scopes, and retargeting them in one step held the loop ~15 ms.

        Still exact: the virtual clock stops at once, and before each yield every scope whose
        trio deadline falls within ``RETARGET_HORIZON_S`` is retargeted (earliest expiry
        first), so none fires while paused unless one loop iteration outlasts the horizon."""
        if holder in self._holders:
            raise RuntimeError(f"deadlines already paused by {holder!r}")
        first = not self._holders
        if first:
            self._paused_since = trio.current_time()
        self._holders.add(holder)
        if first:
            await self._retarget_in_slices()

    async def release_in_slices(self, holder: str) -> None:
        """``release(holder)``, the cancel scopes retargeted in slices (``pause_in_slices``):
        a scope's deadline comes back at most a few loop iterations late, never early."""
        if holder not in self._holders:
            raise RuntimeError(f"deadlines are not paused by {holder!r}")
        self._holders.remove(holder)
        if not self._holders:
            self._paused_total += trio.current_time() - self._paused_since
            await self._retarget_in_slices()

    async def _retarget_in_slices(self) -> None:
        """Every scope to ``_real_deadline`` for the state *when it is set*, earliest expiry
        first; the scopes due within the horizon before each yield."""
        entries = sorted(self._scoped.values(), key=_expiry)
        i, n = 0, len(entries)
        while i < n:
            due = trio.current_time() + RETARGET_HORIZON_S - self._paused_total
            j = i + RETARGET_SLICE
            while j < n and entries[j].expiry <= due:
                j += 1
            for entry in entries[i:j]:
                if entry.scope is not None:
                    entry.scope.deadline = self._real_deadline(entry)
            i = j
            if i < n:
                await trio.lowlevel.cancel_shielded_checkpoint()

    @contextmanager
    def paused_by(self, holder: str) -> Iterator[None]:
        """Pause as ``holder`` for the body; release on exit, however the body ends."""
        self.pause(holder)
        try:
            yield
        finally:
            self.release(holder)

    @property
    def paused(self) -> bool:
        """True while at least one holder pauses."""
        return bool(self._holders)

    @property
    def holders(self) -> frozenset[str]:
        """Names of the holders pausing now."""
        return frozenset(self._holders)

    # -- introspection -----------------------------------------------------------------------

    def statistics(self) -> DeadlineStatistics:
        """Counts for tests: active deadlines, pause state, holders, deadlines expired so far."""
        return DeadlineStatistics(
            active=len(self._deadlines),
            paused=bool(self._holders),
            holders=frozenset(self._holders),
            expired_total=self._expired_total,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        holders = ",".join(sorted(s.holders)) or "-"
        return (
            f"<DeadlineRegistry active={s.active} paused={s.paused} holders={holders} "
            f"expired_total={s.expired_total}>"
        )
