"""RecoveryLedger: the record of every attempt, and the one source of truth a checkpoint copies.

Identity and states
-------------------
An attempt is ``(row, slot, attempt)`` with a stable rollout ID ``"{row}-{slot}"`` (attempt 0) or
``"{row}-{slot}-a{n}"``. Each generation slot of a row has exactly one *current* attempt; an
older attempt is never current again (fencing). A ledger row is a *position* in the run's row
order (``_row_order``): the dataset row it trains is the order's business (``take_ready`` names
it), and in the default order the two are the same number. Positions are reserved in ascending
order, so ``next_row`` is where the order stands. States::

    RESERVED ──admit──▶ DISPATCHED ──reply──▶ COMPLETED
        ▲                   │  │──failure──▶ FAILED     (next attempt RESERVED, or the row fails)
        └──admission_closed─┘  └──stream end / drop──▶ ABANDONED (next attempt RESERVED)

Invariants (checked by the stateful test):

* rollout IDs are unique; one current attempt per slot; a RESERVED attempt has no replica and no
  gate ID, a DISPATCHED one has both;
* a reply counts only for the current DISPATCHED attempt under the gate ID it was dispatched
  with; any other is stale, counted and ignored (fencing);
* a refusal (``admission_closed``) returns the attempt to RESERVED with its identity and spends
  neither a row attempt nor data budget (S2);
* a failure spends a row attempt only when it is the episode's own (``"data"``); an
  ``"infra"`` failure (a model server or an instance down) ends the attempt and starts the
  slot's next one, spending nothing: outages are bounded by time, not by giving rows up;
* the retire queue holds every dropped attempt Gym may still run (dispatched, or reserved with
  restored Gym state) and forgets only what ``forget_retired`` names (S4); between checkpoints it
  lives in memory, and a snapshot carries what it holds at the cut (Gym committed those
  attempts' state too, so a restore must retire them before it dispatches);
* a restored attempt is RESERVED, pinned to its original replica, and *unclaimed* until the
  dispatch of its replacement claims it (S11);
* every change runs inside a ``MutationBarrier`` mutation (asserted), and names the rollout IDs it
  touched so drain waiters wake on exactly those (S9).

Costs: every change is O(attempts it names). ``pending_among(ids)`` is O(len(ids)).
``held_by(instance)`` is O(held there); snapshots and ``dispatched()`` are O(ledger) and are
meant for a thread, a check or a baseline, never for a per-reply path.

Layers
------
The ledger is four modules below this one, each importing only those under it:
``_ledger_records`` (identity, states and the frozen values handed out), ``_ledger_views``
(``Attempt`` and the read-only mappings, over the store's read side), ``_ledger_columns`` (the
storage — typed columns, no object per attempt — and the slot-level steps, written only
there), and ``_ledger_snapshot`` (writing ``ledger.json``, whose records live with every other
file's in ``_snapshot_format``, and the restore rules). This module holds the transitions:
which step a reply, a refusal or a decision makes, the fencing checks, the spending rules and
the budgets.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from typing import final

import attrs

from ._barrier import MutationBarrier
from ._errors import BudgetExhausted
from ._ledger_columns import LedgerColumns
from ._ledger_records import (
    AttemptState,
    CompletedGroup,
    EpisodeResult,
    FailureClass,
    LedgerStatistics,
    RestoredGymState,
    RestoreSummary,
    RetireItem,
    rollout_id_for,
)
from ._ledger_snapshot import (
    LEDGER_SNAPSHOT_VERSION,
    AttemptRow,
    LedgerSnapshot,
    dump_ledger_snapshot,
    ledger_snapshot,
    ledger_snapshot_bytes,
    load_ledger_snapshot,
    restore_columns,
)
from ._ledger_views import Attempt, RowView
from ._snapshot_format import EpisodeRecord

__all__ = [
    "LEDGER_SNAPSHOT_VERSION",
    "Attempt",
    "AttemptRow",
    "AttemptState",
    "CompletedGroup",
    "EpisodeResult",
    "FailureClass",
    "LedgerSnapshot",
    "LedgerStatistics",
    "RecoveryLedger",
    "RestoreSummary",
    "RestoredGymState",
    "RetireItem",
    "dump_ledger_snapshot",
    "load_ledger_snapshot",
    "rollout_id_for",
]

_RESERVED = AttemptState.RESERVED
_DISPATCHED = AttemptState.DISPATCHED
_FAILED = AttemptState.FAILED
_ABANDONED = AttemptState.ABANDONED


@final
@attrs.define(eq=False, slots=True)
class RecoveryLedger:
    """Every attempt of every untrained row; see the module docstring for invariants."""

    group_size: int
    max_row_attempts: int = 3
    data_failure_budget: int = 16
    barrier: MutationBarrier = attrs.field(factory=MutationBarrier)

    _cols: LedgerColumns = attrs.field(init=False)
    """The storage; only its own steps write it."""
    _data_failures: int = attrs.field(default=0, init=False)
    _stale: int = attrs.field(default=0, init=False)
    _released: int = attrs.field(default=0, init=False)
    _next_row: int = attrs.field(default=0, init=False)
    last_failure: str | None = attrs.field(default=None, init=False)
    """The latest failed attempt in this process, ``"<rollout id>: <class>: <reason>"``, for
    the line that ends a run whose rows failed (not saved in snapshots)."""

    def __attrs_post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_row_attempts < 1:
            raise ValueError(f"max_row_attempts must be >= 1, got {self.max_row_attempts}")
        self._cols = LedgerColumns(self.group_size)

    @property
    def _by_id(self) -> Mapping[str, Attempt]:
        """The current attempts by rollout ID, as views (for inspection)."""
        return self._cols.by_id

    @property
    def _rows(self) -> Mapping[int, RowView]:
        """Rows in flight with their attempts, as views (for inspection; O(row) per row)."""
        return self._cols.row_views

    def _assert_mutating(self) -> None:
        if not self.barrier.in_mutation:
            raise RuntimeError("ledger changes must run inside barrier.mutate()")

    def _replace(
        self, s: int, final: AttemptState, *, spend: bool, failure: str | None = None
    ) -> Attempt | None:
        """End slot ``s``'s attempt as ``final``; start the slot's next attempt unless the
        slot's row attempts are spent (then the whole row fails)."""
        cols = self._cols
        cols.end(s, final, failure)
        if not spend:  # an instance death or an infra failure: released at no cost
            self._released += 1
        if spend and cols.spend(s) >= self.max_row_attempts:
            cols.fail_row(cols.row_at(s))
            return None
        return cols.renew(s)

    # -- changes (each inside barrier.mutate) ------------------------------------------------------

    def reserve_row(self, row: int) -> list[Attempt]:
        """Reserve attempt 0 of every generation slot of ``row``."""
        return self._cols.block_views(self._reserve(row))

    def reserve_row_ids(self, row: int) -> list[str]:
        """``reserve_row`` for the dispatch path: the new attempts' rollout IDs, in slot order,
        and no view objects (no per-attempt allocation beyond the ID strings)."""
        self._reserve(row)
        return [f"{row}-{k}" for k in range(self.group_size)]  # attempt 0: rollout_id_for

    def _reserve(self, row: int) -> int:
        self._assert_mutating()
        if self._cols.is_known_row(row):
            raise ValueError(f"row {row} is already in the ledger")
        b = self._cols.reserve(row)
        if row >= self._next_row:
            self._next_row = row + 1
        return b

    def mark_dispatched(self, rollout_ids: Iterable[str], instance: str, gate_id: int) -> None:
        """RESERVED → DISPATCHED on ``instance`` under ``gate_id`` (inside gate admission, S1).

        A restored attempt must go to its original replica; dispatching it claims it.
        """
        self._assert_mutating()
        cols = self._cols
        slots = [cols.need(rid) for rid in rollout_ids]
        for s in slots:
            state = cols.state_at(s)
            if state is not _RESERVED:
                raise ValueError(f"{cols.rid(s)} is {state.value}, not reserved")
            pinned = cols.pinned_to(s)
            if pinned is not None and pinned != instance:
                raise ValueError(
                    f"{cols.rid(s)} was restored on {pinned}; it cannot be dispatched to {instance}"
                )
        cols.dispatch(slots, instance, gate_id)

    def dispatch_sendable(
        self, rollout_ids: Iterable[str], instance: str, gate_id: int
    ) -> tuple[list[str], list[str]]:
        """``sendable`` and ``mark_dispatched`` of the sendable part, in one pass (each ID is
        located once): the current RESERVED attempts become DISPATCHED on ``instance`` under
        ``gate_id`` (inside gate admission, S1). Returns (dispatched, the rest). Raises
        ``ValueError`` and changes nothing if a restored attempt would leave its replica."""
        self._assert_mutating()
        cols = self._cols
        ok: list[str] = []
        rest: list[str] = []
        slots: dict[int, None] = {}
        reserved_slot = cols.reserved_slot
        pinned_to = cols.pinned_to if cols.any_restored else None
        for rid in rollout_ids:
            s = reserved_slot(rid)
            if s >= 0 and s not in slots:
                if pinned_to is not None:
                    pinned = pinned_to(s)
                    if pinned is not None and pinned != instance:
                        raise ValueError(
                            f"{rid} was restored on {pinned}; it cannot be dispatched to {instance}"
                        )
                ok.append(rid)
                slots[s] = None
            else:
                rest.append(rid)
        cols.dispatch(slots, instance, gate_id)
        return ok, rest

    def reserved_attempt(
        self, rollout_id: str
    ) -> tuple[int, int, int, RestoredGymState | None] | None:
        """``(row, slot, attempt, restored)`` of the current RESERVED attempt with this ID, or
        None (not current, or not RESERVED). O(1); no view object (the dispatch path)."""
        cols = self._cols
        s = cols.reserved_slot(rollout_id)
        if s < 0:
            return None
        restored = cols.restored_at(s) if cols.any_restored else None
        return cols.row_at(s), s % self.group_size, cols.attempt_at(s), restored

    def sendable(self, rollout_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Split IDs into (current RESERVED attempts, the rest). O(len(rollout_ids))."""
        ok: list[str] = []
        stale: list[str] = []
        reserved_slot = self._cols.reserved_slot
        for rid in rollout_ids:
            (ok if reserved_slot(rid) >= 0 else stale).append(rid)
        return ok, stale

    def record_orphans(
        self, rollout_ids: Iterable[str], instance: str, *, restored: bool = False
    ) -> None:
        """Gym accepted rows the ledger dropped meanwhile: queue them for retirement (S4).

        With ``restored``, the IDs are restored episodes Gym may still hold unclaimed (retired
        with ``retire_restored``).
        """
        self._assert_mutating()
        self._cols.record_orphans(rollout_ids, instance, restored)

    def refuse(self, rollout_id: str) -> bool:
        """``admission_closed``: DISPATCHED → RESERVED, identity kept, nothing spent (S2).

        Returns False (and changes nothing) for a refusal that is not about a current
        dispatched attempt.
        """
        self._assert_mutating()
        s = self._cols.in_flight_slot(rollout_id)
        if s < 0:
            self._stale += 1
            return False
        self._cols.refuse(s)
        return True

    def complete(self, rollout_id: str, gate_id: int, result: EpisodeResult) -> bool:
        """Accept a streamed completion if it is the current attempt under the same gate ID.

        Returns False for a stale reply (older attempt, other gate ID, not dispatched): it is
        counted and ignored.
        """
        return self.complete_with(rollout_id, gate_id, result.reward, result.turns, result.payload)

    def complete_with(
        self, rollout_id: str, gate_id: int, reward: float, turns: int, payload: object = None
    ) -> bool:
        """``complete`` with the result's fields (no ``EpisodeResult`` built per reply)."""
        self._assert_mutating()
        s = self._cols.fenced_slot(rollout_id, gate_id)
        if s < 0:
            self._stale += 1
            return False
        self._cols.complete(s, reward, turns, payload)
        return True

    def fail(self, rollout_id: str, gate_id: int, cls: FailureClass, reason: str) -> Attempt | None:
        """A failed episode. ``"data"`` (the episode's own problem) spends a row attempt and
        data budget; ``"infra"`` (its infrastructure was down: a model server, the instance)
        spends neither — the row did nothing wrong, and an outage is bounded by time
        (``outage_budget_s``, the dispatcher's ``OutageClock``), never by giving rows up.

        Returns the slot's next attempt (RESERVED, new rollout ID), or None when the reply was
        stale or the row ran out of attempts (the row then fails as a whole). Raises
        ``BudgetExhausted`` when the run's data-failure budget is spent.
        """
        self._assert_mutating()
        s = self._cols.fenced_slot(rollout_id, gate_id)
        if s < 0:
            self._stale += 1
            return None
        if cls == "data":
            self._data_failures += 1
        self.last_failure = f"{rollout_id}: {cls}: {reason}"
        nxt = self._replace(s, _FAILED, spend=cls == "data", failure=f"{cls}: {reason}")
        if cls == "data" and self._data_failures > self.data_failure_budget:
            raise BudgetExhausted(
                f"data-failure budget of {self.data_failure_budget} spent "
                f"(last: {rollout_id}: {reason}); fix the environment or the data (its WARNINGs "
                "under the gymckpt.gym logger carry the tracebacks), or raise data_failure_budget"
            )
        return nxt

    def abandon(self, rollout_ids: Iterable[str], *, spend: bool = True) -> list[Attempt]:
        """Rows a stream never returned (S3): abandon, queue for retirement, re-send fresh.

        Each abandoned attempt spends one row attempt (not with ``spend=False``: its instance
        died, the row did nothing wrong); its replacement gets a new rollout ID.
        Attempts that are not DISPATCHED (never reached Gym) are left alone and keep their
        identity. Returns the replacements.
        """
        self._assert_mutating()
        cols = self._cols
        out: list[Attempt] = []
        for rid in rollout_ids:
            s = cols.in_flight_slot(rid)
            if s < 0:
                continue
            cols.retire_later(s)
            nxt = self._replace(s, _ABANDONED, spend=spend)
            if nxt is not None:
                out.append(nxt)
        return out

    def release_instance(self, instance: str) -> tuple[list[Attempt], list[Attempt]]:
        """Instance ``instance`` died: nothing it ran or held for us comes back. O(held there).

        * Each attempt in flight there (DISPATCHED) is abandoned and replaced by a fresh attempt
          under a new rollout ID, spending **no** row attempt and no data budget (the row did
          nothing wrong); the stale attempt's late replies are rejected by identity (fencing).
        * Each unclaimed restored episode pinned there loses its restored state and will run
          from scratch, anywhere, under its own identity (never both claimed and re-run).
        * Both stay queued for retirement on ``instance`` under the ID Gym knew them by (a
          claimed restored attempt under its exported ID as well): a replacement that continues
          the dead one's environment state frees their sessions there before the next
          checkpoint commits, so the fresh attempts' mutations are the only ones kept.

        Returns (fresh attempts, unpinned attempts): both are RESERVED and must be dispatched.
        """
        self._assert_mutating()
        cols = self._cols
        fresh: list[Attempt] = []
        unpinned: list[Attempt] = []
        for s in cols.held_slots(instance):
            state = cols.state_at(s)
            if state is _DISPATCHED:
                cols.retire_later(s)  # a claim under its exported ID too
                nxt_att = self._replace(s, _ABANDONED, spend=False)
                if nxt_att is not None:
                    fresh.append(nxt_att)
            elif state is _RESERVED and cols.pinned_to(s) is not None:
                cols.unpin(s)
                unpinned.append(cols.view(s))
        cols.retire_plainly(instance)
        return fresh, unpinned

    def drop_row(self, row: int) -> None:
        """Discard a whole group; queue what Gym may still hold for retirement (S4)."""
        self._assert_mutating()
        if row not in self._cols.rows():
            raise KeyError(f"row {row} is not in flight")
        self._cols.fail_row(row)

    def take_ready(
        self, limit: int, row_of: Callable[[int], int] | None = None
    ) -> list[CompletedGroup]:
        """Hand up to ``limit`` complete groups to the trainer, oldest first; they leave the
        ledger as trained rows. ``row_of(position)`` is the dataset row of a ledger row (the
        run's ``RowOrder.row_at``; the identity if None). O(groups taken)."""
        self._assert_mutating()
        return self._cols.take_ready(limit, row_of)

    def forget_retired(self, rollout_ids: Iterable[str]) -> None:
        """Forget exactly these retired attempts; a drop queued meanwhile stays (S4)."""
        self._assert_mutating()
        self._cols.forget_retired(rollout_ids)

    # -- questions ---------------------------------------------------------------------------

    def get(self, rollout_id: str) -> Attempt | None:
        """The current attempt with this rollout ID, or None."""
        s = self._cols.slot_of(rollout_id)
        return None if s < 0 else self._cols.view(s)

    def is_in_flight(self, rollout_id: str) -> bool:
        """The ownership rule shared by the inventory and the drain: Gym runs this current
        attempt for us and owes us its reply (DISPATCHED). O(1)."""
        return self._cols.in_flight_slot(rollout_id) >= 0

    def settled_check(self, rollout_ids: Iterable[str]) -> Callable[[Hashable], bool]:
        """The drain's per-reply check (S9): ``settled(rid)`` is ``not is_in_flight(rid)``,
        without parsing ``rid`` on every call.

        Each ID is located once, here (O(len(rollout_ids))): its slot, block, row and attempt.
        A call then reads two columns and the row's block. That is exact for as long as the
        check lives: a row keeps its block until it leaves the ledger (``row_block[row]`` is
        then gone, and a row never comes back), and a slot's attempt number only grows, so
        the located attempt is current and in flight exactly when the row still owns the block,
        the slot still holds that attempt number, and its state is DISPATCHED. An ID found
        settled is forgotten (its entry freed as its reply lands, not at the drain's wake), and
        from then on, like an ID not current here, is asked through ``is_in_flight`` — so a
        refused attempt sent again under its ID is seen in flight again. O(1) per call.
        """
        return self._cols.settled_check(rollout_ids, self.is_in_flight)

    def pending_among(self, rollout_ids: Iterable[str], instance: str | None = None) -> set[str]:
        """The drain's question: which of these are still in flight (on ``instance``, if
        given). O(len(rollout_ids)).

        The instance matters because a refused attempt keeps its rollout ID: an
        ``admission_closed`` reply one instance still lists on the wire may name an attempt
        that has since been re-sent to another instance, whose reply it is not.
        """
        in_flight_slot, replica_at = self._cols.in_flight_slot, self._cols.replica_at
        out: set[str] = set()
        for rid in rollout_ids:
            s = in_flight_slot(rid)
            if s >= 0 and (instance is None or replica_at(s) == instance):
                out.add(rid)
        return out

    def held_by(self, instance: str) -> frozenset[str]:
        """Inventory of one instance, by the IDs Gym knows: every attempt in flight there
        (``is_in_flight``), plus each unclaimed restored episode under its exported ID.
        Maintained incrementally (a linked list per instance); the copy is O(held)."""
        return self._cols.held_ids(instance)

    def dispatched(self) -> Iterator[tuple[str, str]]:
        """``(rollout ID, instance)`` of every attempt in flight (``is_in_flight``), from a
        walk over every attempt the ledger holds, rows in reservation order. O(ledger): for a
        check, a test or a baseline that scans the whole ledger, never for a per-reply path
        (``held_by`` answers for one instance in O(held there))."""
        return self._cols.dispatched()

    def reserved(self) -> Iterator[Attempt]:
        """Current RESERVED attempts of untrained rows (restored ones included). O(ledger)."""
        return self._cols.reserved_views()

    def retire_queue(self) -> dict[str, list[RetireItem]]:
        """The dropped attempts Gym may still hold, grouped by instance (a copy)."""
        out: dict[str, list[RetireItem]] = {}
        for item in self._cols.retire_items():
            out.setdefault(item.instance, []).append(item)
        return out

    def unclaimed(self) -> list[Attempt]:
        """Restored attempts no replacement has claimed yet. O(restored)."""
        return self._cols.unclaimed_views()

    @property
    def ready_groups(self) -> int:
        return self._cols.ready_count

    @property
    def rows_trained(self) -> frozenset[int]:
        return frozenset(self._cols.trained())

    @property
    def rows_failed(self) -> frozenset[int]:
        return frozenset(self._cols.failed())

    def rows(self) -> Collection[int]:
        """Rows in flight (reserved and untrained)."""
        return self._cols.rows()

    def row_attempts_spent(self, row: int, slot: int) -> int:
        return self._cols.spent(row, slot)

    @property
    def data_failures(self) -> int:
        return self._data_failures

    @property
    def next_row(self) -> int:
        """One past the highest row ever reserved: where the run's row order stands (rows are
        positions in it, reserved in ascending order)."""
        return self._next_row

    # -- snapshot and restore ------------------------------------------------------------------

    def to_snapshot(self) -> LedgerSnapshot:
        """A consistent copy of the ledger. O(ledger): call it while holding the barrier, from a
        thread (``trio.to_thread.run_sync``) so the event loop keeps running."""
        return ledger_snapshot(
            self._cols,
            max_row_attempts=self.max_row_attempts,
            data_failure_budget=self.data_failure_budget,
            data_failures=self._data_failures,
            next_row=self._next_row,
        )

    def snapshot_bytes(self) -> bytes:
        """``dump_ledger_snapshot(self.to_snapshot())``, in one pass over the columns: no
        record per attempt is built. Same rules as ``to_snapshot`` (barrier held, a thread)."""
        return ledger_snapshot_bytes(
            self._cols,
            max_row_attempts=self.max_row_attempts,
            data_failure_budget=self.data_failure_budget,
            data_failures=self._data_failures,
            next_row=self._next_row,
        )

    @classmethod
    def from_snapshot(
        cls,
        snap: LedgerSnapshot,
        exported: Iterable[EpisodeRecord] = (),
        barrier: MutationBarrier | None = None,
    ) -> tuple[RecoveryLedger, RestoreSummary]:
        """Rebuild a ledger after a crash (S11), by the restore rules of
        ``_ledger_snapshot.restore_columns``: completed attempts stay completed, an exported
        DISPATCHED attempt becomes its unclaimed replacement pinned to its replica, one Gym
        did not export is re-sent fresh, reserved ones keep their identity. ``ManifestError``
        for a snapshot that does not fit."""
        cols, summary = restore_columns(snap, exported)
        ledger = cls(
            group_size=snap.group_size,
            max_row_attempts=snap.max_row_attempts,
            data_failure_budget=snap.data_failure_budget,
            barrier=barrier if barrier is not None else MutationBarrier(),
        )
        ledger._cols = cols
        ledger._data_failures = snap.data_failures
        ledger._next_row = snap.next_row
        return ledger, summary

    def statistics(self) -> LedgerStatistics:
        cols = self._cols
        return LedgerStatistics(
            attempts=cols.n_current(),
            by_state={s.value: cols.count(s) for s in AttemptState},
            failed_total=cols.ended(_FAILED),
            abandoned_total=cols.ended(_ABANDONED),
            rows_reserved=len(cols.rows()),
            rows_trained=len(cols.trained()),
            rows_failed=len(cols.failed()),
            groups_ready=cols.ready_count,
            retire_queue=cols.retire_count,
            unclaimed=cols.unclaimed_count,
            row_attempts_spent=cols.spent_total,
            data_failures=self._data_failures,
            stale_replies=self._stale,
            released_total=self._released,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<RecoveryLedger attempts={s.attempts} in_flight_rows={s.rows_reserved} "
            f"trained={s.rows_trained} retire_queue={s.retire_queue} unclaimed={s.unclaimed}>"
        )
