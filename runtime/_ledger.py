"""RecoveryLedger: the record of every attempt, and the one source of truth a checkpoint copies.

Identity and states
-------------------
An attempt is ``(row, slot, attempt)`` with a stable rollout ID ``"{row}-{slot}"`` (attempt 0) or
``"{row}-{slot}-a{n}"``. Each generation slot of a row has exactly one *current* attempt; an
older attempt is never current again (fencing, DESIGN §2b). States::

    RESERVED ──admit──▶ DISPATCHED ──reply──▶ COMPLETED
        ▲                   │  │──failure──▶ FAILED     (next attempt RESERVED, or the row fails)
        └──admission_closed─┘  └──stream end / drop──▶ ABANDONED (next attempt RESERVED)

Invariants (checked by the stateful test):

* rollout IDs are unique; one current attempt per slot; a RESERVED attempt has no replica and no
  gate ID, a DISPATCHED one has both;
* a refusal (``admission_closed``) returns the attempt to RESERVED with its identity and spends
  neither a row attempt nor data budget (S2);
* the retire queue holds every dropped attempt Gym may still run (dispatched, or reserved with
  restored Gym state) and forgets only what ``forget_retired`` names (S4); it is memory-only;
* a restored attempt is RESERVED, pinned to its original replica, and *unclaimed* until the
  dispatch of its replacement claims it (S11);
* every change runs inside a ``MutationBarrier`` mutation (asserted), and names the rollout IDs it
  touched so drain waiters wake on exactly those (S9).

Costs: every change is O(attempts it names). ``pending_among(ids)`` is O(len(ids)).
``held_by(instance)`` and snapshots are O(in-flight) and are meant for a thread or a check, never
for a per-reply path.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Collection, Iterable, Iterator
from typing import Any, Literal, cast, final

import attrs
import orjson

from ._barrier import MutationBarrier
from ._converter import converter as _conv
from ._converter import loads
from ._errors import BudgetExhausted, ManifestError
from ._manifest import EpisodeRecord

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

FailureClass = Literal["infra", "data"]
LEDGER_SNAPSHOT_VERSION = 1


def rollout_id_for(row: int, slot: int, attempt: int) -> str:
    """The stable rollout ID of an attempt: ``"{row}-{slot}"``, plus ``"-a{n}"`` for n > 0."""
    base = f"{row}-{slot}"
    return base if attempt == 0 else f"{base}-a{attempt}"


class AttemptState(enum.Enum):
    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


@attrs.frozen
class EpisodeResult:
    """What a completed episode gives the trainer."""

    reward: float
    turns: int


@attrs.frozen
class RestoredGymState:
    """Gym state an attempt continues from after a restore (S11).

    ``from_rollout_id`` is the attempt Gym parked and exported; ``instance`` is its original
    replica, where the replacement must be dispatched; ``owner`` is the participant that exported
    it; ``capture_keys`` are the model calls staged for it.
    """

    instance: str
    owner: str
    from_rollout_id: str
    capture_keys: tuple[str, ...] = ()


@attrs.define(eq=False, slots=True)
class Attempt:
    """One attempt. Read it; change it only through the ledger."""

    row: int
    slot: int
    attempt: int
    rollout_id: str
    state: AttemptState = AttemptState.RESERVED
    replica: str | None = None
    gate_id: int | None = None
    restored: RestoredGymState | None = None
    unclaimed: bool = False
    result: EpisodeResult | None = None
    failure: str | None = None


@attrs.frozen
class RetireItem:
    """A dropped attempt Gym may still hold, and where."""

    rollout_id: str
    instance: str
    restored: bool = False


@attrs.frozen
class CompletedGroup:
    """A row whose every generation slot completed: ready to train."""

    row: int
    results: tuple[EpisodeResult, ...]
    rollout_ids: tuple[str, ...]


@attrs.frozen
class LedgerStatistics:
    attempts: int
    by_state: dict[str, int]
    failed_total: int
    abandoned_total: int
    rows_reserved: int
    rows_trained: int
    rows_failed: int
    groups_ready: int
    retire_queue: int
    unclaimed: int
    row_attempts_spent: int
    data_failures: int
    stale_replies: int


@attrs.frozen
class AttemptRow:
    """One attempt in the on-disk ledger (stored as a JSON array for compactness)."""

    row: int
    slot: int
    attempt: int
    state: str
    replica: str | None = None
    gate_id: int | None = None
    restored: RestoredGymState | None = None
    unclaimed: bool = False
    result: EpisodeResult | None = None


@attrs.frozen
class LedgerSnapshot:
    """The versioned on-disk form of a ledger (``ledger.json``).

    ``trained`` and ``failed`` are rows as inclusive ``[first, last]`` ranges; ``spent`` lists
    ``[row, slot, attempts_spent]``. The retire queue is memory-only by design (S4) and absent.
    """

    version: int
    group_size: int
    max_row_attempts: int
    data_failure_budget: int
    data_failures: int
    next_row: int
    trained: tuple[tuple[int, int], ...]
    failed: tuple[tuple[int, int], ...]
    spent: tuple[tuple[int, int, int], ...]
    attempts: tuple[AttemptRow, ...]


@attrs.frozen
class RestoreSummary:
    """What ``RecoveryLedger.from_snapshot`` did with the snapshot's attempts."""

    restored: int
    completed_untrained: int
    reserved: int
    redispatched_fresh: int


def _to_ranges(rows: Iterable[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for r in sorted(rows):
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return tuple(out)


def _from_ranges(ranges: Iterable[tuple[int, int]]) -> set[int]:
    out: set[int] = set()
    for first, last in ranges:
        if last < first:
            raise ManifestError(f"ledger.json: bad row range [{first}, {last}]")
        out.update(range(first, last + 1))
    return out


@attrs.define(eq=False, slots=True)
class _Row:
    slots: list[Attempt]
    completed: int = 0


@final
@attrs.define(eq=False, slots=True)
class RecoveryLedger:
    """Every attempt of every untrained row; see the module docstring for invariants."""

    group_size: int
    max_row_attempts: int = 3
    data_failure_budget: int = 16
    barrier: MutationBarrier = attrs.field(factory=MutationBarrier)

    _rows: dict[int, _Row] = attrs.field(factory=dict, init=False)
    _by_id: dict[str, Attempt] = attrs.field(factory=dict, init=False)
    _held: dict[str, set[str]] = attrs.field(factory=dict, init=False)
    _spent: dict[tuple[int, int], int] = attrs.field(factory=dict, init=False)
    _ready: dict[int, None] = attrs.field(factory=dict, init=False)
    _trained: set[int] = attrs.field(factory=set, init=False)
    _failed_rows: set[int] = attrs.field(factory=set, init=False)
    _retire: dict[str, RetireItem] = attrs.field(factory=dict, init=False)
    _counts: dict[AttemptState, int] = attrs.field(init=False)
    _ended: dict[AttemptState, int] = attrs.field(init=False)
    _unclaimed: int = attrs.field(default=0, init=False)
    _data_failures: int = attrs.field(default=0, init=False)
    _stale: int = attrs.field(default=0, init=False)
    _next_row: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_row_attempts < 1:
            raise ValueError(f"max_row_attempts must be >= 1, got {self.max_row_attempts}")
        self._counts = dict.fromkeys(AttemptState, 0)
        self._ended = dict.fromkeys(AttemptState, 0)

    # -- internal helpers ------------------------------------------------------------------------

    def _assert_mutating(self) -> None:
        if not self.barrier.in_mutation:
            raise RuntimeError("ledger changes must run inside barrier.mutate()")

    def _set_state(self, att: Attempt, state: AttemptState) -> None:
        self._counts[att.state] -= 1
        self._counts[state] += 1
        att.state = state

    @staticmethod
    def _gym_id(att: Attempt) -> str:
        """The ID Gym knows this attempt by: an unclaimed restored attempt is still the
        exported attempt it will replace."""
        if att.unclaimed and att.restored is not None:
            return att.restored.from_rollout_id
        return att.rollout_id

    def _hold(self, att: Attempt, instance: str) -> None:
        self._held.setdefault(instance, set()).add(self._gym_id(att))

    def _unhold(self, att: Attempt) -> None:
        if att.state is AttemptState.DISPATCHED and att.replica is not None:
            instance: str | None = att.replica
        elif att.unclaimed and att.restored is not None:
            instance = att.restored.instance
        else:
            instance = None
        if instance is not None:
            held = self._held.get(instance)
            if held is not None:
                held.discard(self._gym_id(att))

    def _new_attempt(self, row: int, slot: int, attempt: int) -> Attempt:
        rid = rollout_id_for(row, slot, attempt)
        if rid in self._by_id:
            raise RuntimeError(f"rollout ID {rid} already exists")
        att = Attempt(row=row, slot=slot, attempt=attempt, rollout_id=rid)
        self._by_id[rid] = att
        self._counts[AttemptState.RESERVED] += 1
        return att

    def _current(self, rollout_id: str) -> Attempt:
        att = self._by_id.get(rollout_id)
        if att is None:
            raise KeyError(f"unknown rollout ID {rollout_id!r}")
        return att

    def _retire_later(self, att: Attempt) -> None:
        """Queue ``att`` for retirement if Gym may still hold it (S4)."""
        if att.state is AttemptState.DISPATCHED and att.replica is not None:
            item = RetireItem(att.rollout_id, att.replica)
        elif att.state is AttemptState.RESERVED and att.restored is not None and att.unclaimed:
            item = RetireItem(att.restored.from_rollout_id, att.restored.instance, restored=True)
        else:
            return
        self._retire[item.rollout_id] = item  # keyed by the ID Gym knows

    def _replace(self, att: Attempt, final: AttemptState, *, spend: bool) -> Attempt | None:
        """Retire ``att`` from the ledger as ``final``; start the slot's next attempt unless the
        slot's row attempts are spent (then the whole row fails)."""
        self._unhold(att)
        if att.unclaimed:
            att.unclaimed = False
            self._unclaimed -= 1
        self._counts[att.state] -= 1
        att.state = final
        self._ended[final] += 1
        del self._by_id[att.rollout_id]
        key = (att.row, att.slot)
        if spend:
            self._spent[key] = self._spent.get(key, 0) + 1
            if self._spent[key] >= self.max_row_attempts:
                self._fail_row(att.row)
                return None
        nxt = self._new_attempt(att.row, att.slot, att.attempt + 1)
        self._rows[att.row].slots[att.slot] = nxt
        return nxt

    def _fail_row(self, row_index: int) -> None:
        row = self._rows.pop(row_index)
        self._failed_rows.add(row_index)
        self._ready.pop(row_index, None)
        for att in row.slots:
            if self._by_id.get(att.rollout_id) is not att:
                continue  # already ended
            self._retire_later(att)
            self._unhold(att)  # before the unclaimed flag changes: it picks the Gym-side ID
            if att.unclaimed:
                att.unclaimed = False
                self._unclaimed -= 1
            self._counts[att.state] -= 1
            del self._by_id[att.rollout_id]

    # -- changes (each inside barrier.mutate) ------------------------------------------------------

    def reserve_row(self, row: int) -> list[Attempt]:
        """Reserve attempt 0 of every generation slot of ``row``."""
        self._assert_mutating()
        if row in self._rows or row in self._trained or row in self._failed_rows:
            raise ValueError(f"row {row} is already in the ledger")
        atts = [self._new_attempt(row, slot, 0) for slot in range(self.group_size)]
        self._rows[row] = _Row(slots=atts)
        self._next_row = max(self._next_row, row + 1)
        return atts

    def mark_dispatched(self, rollout_ids: Iterable[str], instance: str, gate_id: int) -> None:
        """RESERVED → DISPATCHED on ``instance`` under ``gate_id`` (inside gate admission, S1).

        A restored attempt must go to its original replica; dispatching it claims it.
        """
        self._assert_mutating()
        atts = [self._current(rid) for rid in rollout_ids]
        for att in atts:
            if att.state is not AttemptState.RESERVED:
                raise ValueError(f"{att.rollout_id} is {att.state.value}, not reserved")
            if att.restored is not None and att.restored.instance != instance:
                raise ValueError(
                    f"{att.rollout_id} was restored on {att.restored.instance}; "
                    f"it cannot be dispatched to {instance}"
                )
        for att in atts:
            self._unhold(att)
            self._set_state(att, AttemptState.DISPATCHED)
            att.replica = instance
            att.gate_id = gate_id
            if att.unclaimed:
                att.unclaimed = False
                self._unclaimed -= 1
            self._hold(att, instance)

    def sendable(self, rollout_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Split IDs into (current RESERVED attempts, the rest). O(len(rollout_ids))."""
        ok: list[str] = []
        stale: list[str] = []
        for rid in rollout_ids:
            att = self._by_id.get(rid)
            (ok if att is not None and att.state is AttemptState.RESERVED else stale).append(rid)
        return ok, stale

    def record_orphans(
        self, rollout_ids: Iterable[str], instance: str, *, restored: bool = False
    ) -> None:
        """Gym accepted rows the ledger dropped meanwhile: queue them for retirement (S4).

        With ``restored``, the IDs are restored episodes Gym may still hold unclaimed (retired
        with ``retire_restored``).
        """
        self._assert_mutating()
        for rid in rollout_ids:
            self._retire[rid] = RetireItem(rid, instance, restored)

    def refuse(self, rollout_id: str) -> bool:
        """``admission_closed``: DISPATCHED → RESERVED, identity kept, nothing spent (S2).

        Returns False (and changes nothing) for a refusal that is not about a current
        dispatched attempt.
        """
        self._assert_mutating()
        att = self._by_id.get(rollout_id)
        if att is None or att.state is not AttemptState.DISPATCHED:
            self._stale += 1
            return False
        self._unhold(att)
        self._set_state(att, AttemptState.RESERVED)
        att.replica = None
        att.gate_id = None
        if att.restored is not None:
            att.unclaimed = True
            self._unclaimed += 1
            self._hold(att, att.restored.instance)
        return True

    def complete(self, rollout_id: str, gate_id: int, result: EpisodeResult) -> bool:
        """Accept a streamed completion if it is the current attempt under the same gate ID.

        Returns False for a stale reply (older attempt, other gate ID, not dispatched): it is
        counted and ignored.
        """
        self._assert_mutating()
        att = self._by_id.get(rollout_id)
        if att is None or att.state is not AttemptState.DISPATCHED or att.gate_id != gate_id:
            self._stale += 1
            return False
        self._unhold(att)
        self._set_state(att, AttemptState.COMPLETED)
        att.result = result
        row = self._rows[att.row]
        row.completed += 1
        if row.completed == self.group_size:
            self._ready[att.row] = None
        return True

    def fail(self, rollout_id: str, gate_id: int, cls: FailureClass, reason: str) -> Attempt | None:
        """A failed episode: spend a row attempt (and data budget for ``"data"``).

        Returns the slot's next attempt (RESERVED, new rollout ID), or None when the reply was
        stale or the row ran out of attempts (the row then fails as a whole). Raises
        ``BudgetExhausted`` when the run's data-failure budget is spent.
        """
        self._assert_mutating()
        att = self._by_id.get(rollout_id)
        if att is None or att.state is not AttemptState.DISPATCHED or att.gate_id != gate_id:
            self._stale += 1
            return None
        att.failure = f"{cls}: {reason}"
        if cls == "data":
            self._data_failures += 1
        nxt = self._replace(att, AttemptState.FAILED, spend=True)
        if cls == "data" and self._data_failures > self.data_failure_budget:
            raise BudgetExhausted(
                f"data-failure budget of {self.data_failure_budget} spent "
                f"(last: {rollout_id}: {reason}); raise data_failure_budget or fix the data"
            )
        return nxt

    def abandon(self, rollout_ids: Iterable[str]) -> list[Attempt]:
        """Rows a stream never returned (S3): abandon, queue for retirement, re-send fresh.

        Each abandoned attempt spends one row attempt; its replacement gets a new rollout ID.
        Attempts that are not DISPATCHED (never reached Gym) are left alone and keep their
        identity. Returns the replacements.
        """
        self._assert_mutating()
        out: list[Attempt] = []
        for rid in rollout_ids:
            att = self._by_id.get(rid)
            if att is None or att.state is not AttemptState.DISPATCHED:
                continue
            self._retire_later(att)
            nxt = self._replace(att, AttemptState.ABANDONED, spend=True)
            if nxt is not None:
                out.append(nxt)
        return out

    def unpin(self, rollout_id: str) -> None:
        """Forget the restored Gym state of a RESERVED attempt whose replica died: it will run
        from scratch on any instance (its episode's state died with the replica)."""
        self._assert_mutating()
        att = self._current(rollout_id)
        if att.state is not AttemptState.RESERVED or att.restored is None:
            raise ValueError(f"{rollout_id} is not a reserved restored attempt")
        self._unhold(att)
        if att.unclaimed:
            att.unclaimed = False
            self._unclaimed -= 1
        att.restored = None

    def drop_row(self, row: int) -> None:
        """Discard a whole group; queue what Gym may still hold for retirement (S4)."""
        self._assert_mutating()
        if row not in self._rows:
            raise KeyError(f"row {row} is not in flight")
        self._fail_row(row)

    def take_ready(self, limit: int) -> list[CompletedGroup]:
        """Hand up to ``limit`` complete groups to the trainer, oldest first; they leave the
        ledger as trained rows. O(groups taken)."""
        self._assert_mutating()
        out: list[CompletedGroup] = []
        for row_index in list(itertools.islice(self._ready, limit)):
            del self._ready[row_index]
            row = self._rows.pop(row_index)
            results = []
            for att in row.slots:
                assert att.result is not None
                results.append(att.result)
                self._counts[att.state] -= 1
                del self._by_id[att.rollout_id]
            self._trained.add(row_index)
            out.append(
                CompletedGroup(row_index, tuple(results), tuple(a.rollout_id for a in row.slots))
            )
        return out

    def forget_retired(self, rollout_ids: Iterable[str]) -> None:
        """Forget exactly these retired attempts; a drop queued meanwhile stays (S4)."""
        self._assert_mutating()
        for rid in rollout_ids:
            self._retire.pop(rid, None)

    # -- questions ---------------------------------------------------------------------------

    def get(self, rollout_id: str) -> Attempt | None:
        """The current attempt with this rollout ID, or None."""
        return self._by_id.get(rollout_id)

    def is_in_flight(self, rollout_id: str) -> bool:
        """The ownership rule shared by the inventory and the drain: Gym runs this current
        attempt for us and owes us its reply (DISPATCHED). O(1)."""
        att = self._by_id.get(rollout_id)
        return att is not None and att.state is AttemptState.DISPATCHED

    def pending_among(self, rollout_ids: Iterable[str], instance: str | None = None) -> set[str]:
        """The drain's question: which of these are still in flight (on ``instance``, if
        given). O(len(rollout_ids)).

        The instance matters because a refused attempt keeps its rollout ID: an
        ``admission_closed`` reply one instance still lists on the wire may name an attempt
        that has since been re-sent to another instance, whose reply it is not.
        """
        by_id = self._by_id
        out: set[str] = set()
        for rid in rollout_ids:
            att = by_id.get(rid)
            if att is not None and att.state is AttemptState.DISPATCHED and (
                instance is None or att.replica == instance
            ):
                out.add(rid)
        return out

    def held_by(self, instance: str) -> frozenset[str]:
        """Inventory of one instance, by the IDs Gym knows: every attempt in flight there
        (``is_in_flight``), plus each unclaimed restored episode under its exported ID.
        Maintained incrementally; the copy is O(held)."""
        return frozenset(self._held.get(instance, ()))

    def reserved(self) -> Iterator[Attempt]:
        """Current RESERVED attempts of untrained rows (restored ones included). O(ledger)."""
        for row in self._rows.values():
            for att in row.slots:
                if att.state is AttemptState.RESERVED:
                    yield att

    def retire_queue(self) -> dict[str, list[RetireItem]]:
        """The dropped attempts Gym may still hold, grouped by instance (a copy)."""
        out: dict[str, list[RetireItem]] = {}
        for item in self._retire.values():
            out.setdefault(item.instance, []).append(item)
        return out

    def unclaimed(self) -> list[Attempt]:
        """Restored attempts no replacement has claimed yet. O(ledger)."""
        return [a for a in self._by_id.values() if a.unclaimed]

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    @property
    def rows_trained(self) -> frozenset[int]:
        return frozenset(self._trained)

    @property
    def rows_failed(self) -> frozenset[int]:
        return frozenset(self._failed_rows)

    def rows(self) -> Collection[int]:
        """Rows in flight (reserved and untrained)."""
        return self._rows.keys()

    def row_attempts_spent(self, row: int, slot: int) -> int:
        return self._spent.get((row, slot), 0)

    @property
    def data_failures(self) -> int:
        return self._data_failures

    @property
    def next_row(self) -> int:
        """One past the highest row ever reserved (the dataset cursor)."""
        return self._next_row

    # -- snapshot and restore ------------------------------------------------------------------

    def to_snapshot(self) -> LedgerSnapshot:
        """A consistent copy of the ledger. O(ledger): call it while holding the barrier, from a
        thread (``trio.to_thread.run_sync``) so the event loop keeps running."""
        rows: list[AttemptRow] = []
        for row in self._rows.values():
            for a in row.slots:
                rows.append(
                    AttemptRow(
                        a.row, a.slot, a.attempt, a.state.value, a.replica, a.gate_id,
                        a.restored, a.unclaimed, a.result,
                    )
                )
        return LedgerSnapshot(
            version=LEDGER_SNAPSHOT_VERSION,
            group_size=self.group_size,
            max_row_attempts=self.max_row_attempts,
            data_failure_budget=self.data_failure_budget,
            data_failures=self._data_failures,
            next_row=self._next_row,
            trained=_to_ranges(self._trained),
            failed=_to_ranges(self._failed_rows),
            spent=tuple((r, s, n) for (r, s), n in self._spent.items() if r in self._rows),
            attempts=tuple(rows),
        )

    @classmethod
    def from_snapshot(
        cls,
        snap: LedgerSnapshot,
        exported: Iterable[EpisodeRecord] = (),
        barrier: MutationBarrier | None = None,
    ) -> tuple[RecoveryLedger, RestoreSummary]:
        """Rebuild a ledger after a crash (S11).

        * COMPLETED attempts stay completed: untrained results go straight to the trainer.
        * A DISPATCHED attempt that Gym exported becomes its replacement: attempt + 1, RESERVED,
          pinned to the original replica, carrying the exported state, **unclaimed** until its
          dispatch claims it. It spends no row attempt: it continues the same episode.
        * A DISPATCHED attempt Gym did not export cannot continue; it is re-sent fresh as
          attempt + 1 (counted in ``RestoreSummary.redispatched_fresh``).
        * RESERVED attempts keep their identity (and restored state, if any).
        """
        if snap.version != LEDGER_SNAPSHOT_VERSION:
            raise ManifestError(
                f"ledger.json: version {snap.version} found, {LEDGER_SNAPSHOT_VERSION} supported"
            )
        ledger = cls(
            group_size=snap.group_size,
            max_row_attempts=snap.max_row_attempts,
            data_failure_budget=snap.data_failure_budget,
            barrier=barrier if barrier is not None else MutationBarrier(),
        )
        by_id = {e.rollout_id: e for e in exported}
        ledger._data_failures = snap.data_failures
        ledger._next_row = snap.next_row
        ledger._trained = _from_ranges(snap.trained)
        ledger._failed_rows = _from_ranges(snap.failed)
        restored = completed = reserved = fresh = 0
        grouped: dict[int, list[AttemptRow]] = {}
        for ar in snap.attempts:
            grouped.setdefault(ar.row, []).append(ar)
        for row_index, ars in grouped.items():
            if sorted(a.slot for a in ars) != list(range(snap.group_size)):
                raise ManifestError(
                    f"ledger.json: row {row_index} has slots {sorted(a.slot for a in ars)}, "
                    f"expected 0..{snap.group_size - 1}"
                )
            slots: list[Attempt] = [None] * snap.group_size  # type: ignore[list-item]
            done = 0
            for ar in ars:
                try:
                    state = AttemptState(ar.state)
                except ValueError:
                    raise ManifestError(
                        f"ledger.json: unknown attempt state {ar.state!r}"
                    ) from None
                if state is AttemptState.DISPATCHED:
                    old_id = rollout_id_for(ar.row, ar.slot, ar.attempt)
                    att = ledger._new_attempt(ar.row, ar.slot, ar.attempt + 1)
                    ep = by_id.get(old_id)
                    if ep is not None:
                        att.restored = RestoredGymState(
                            ep.replica, ep.owner, old_id, tuple(ep.capture_keys)
                        )
                        att.unclaimed = True
                        ledger._unclaimed += 1
                        ledger._hold(att, ep.replica)
                        restored += 1
                    else:
                        fresh += 1
                elif state in (AttemptState.RESERVED, AttemptState.COMPLETED):
                    att = ledger._new_attempt(ar.row, ar.slot, ar.attempt)
                    att.restored = ar.restored
                    if state is AttemptState.COMPLETED:
                        if ar.result is None:
                            raise ManifestError(
                                f"ledger.json: completed attempt {att.rollout_id} has no result"
                            )
                        ledger._set_state(att, AttemptState.COMPLETED)
                        att.result = ar.result
                        att.replica, att.gate_id = ar.replica, ar.gate_id
                        done += 1
                        completed += 1
                    else:
                        if ar.restored is not None and ar.unclaimed:
                            att.unclaimed = True
                            ledger._unclaimed += 1
                            ledger._hold(att, ar.restored.instance)
                        reserved += 1
                else:
                    raise ManifestError(
                        f"ledger.json: attempt {rollout_id_for(ar.row, ar.slot, ar.attempt)} is "
                        f"{state.value}; only current attempts are stored"
                    )
                slots[ar.slot] = att
            ledger._rows[row_index] = _Row(slots=slots, completed=done)
            if done == snap.group_size:
                ledger._ready[row_index] = None
        for r, sl, n in snap.spent:
            ledger._spent[(r, sl)] = n
        return ledger, RestoreSummary(restored, completed, reserved, fresh)

    def statistics(self) -> LedgerStatistics:
        return LedgerStatistics(
            attempts=len(self._by_id),
            by_state={s.value: n for s, n in self._counts.items()},
            failed_total=self._ended[AttemptState.FAILED],
            abandoned_total=self._ended[AttemptState.ABANDONED],
            rows_reserved=len(self._rows),
            rows_trained=len(self._trained),
            rows_failed=len(self._failed_rows),
            groups_ready=len(self._ready),
            retire_queue=len(self._retire),
            unclaimed=self._unclaimed,
            row_attempts_spent=sum(self._spent.values()),
            data_failures=self._data_failures,
            stale_replies=self._stale,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<RecoveryLedger attempts={s.attempts} in_flight_rows={s.rows_reserved} "
            f"trained={s.rows_trained} retire_queue={s.retire_queue} unclaimed={s.unclaimed}>"
        )


# -- on-disk form ----------------------------------------------------------------------------------

_ATTEMPT_FIELDS = ("row", "slot", "attempt", "state", "replica", "gate_id", "restored",
                   "unclaimed", "result")


def _unstructure_attempt_row(a: AttemptRow) -> list[object]:
    return [
        a.row, a.slot, a.attempt, a.state, a.replica, a.gate_id,
        None if a.restored is None else _conv.unstructure(a.restored),
        a.unclaimed,
        None if a.result is None else [a.result.reward, a.result.turns],
    ]


def _structure_attempt_row(value: object, _t: object) -> AttemptRow:
    if not isinstance(value, list) or len(value) != len(_ATTEMPT_FIELDS):
        raise ValueError(f"an attempt is an array of {len(_ATTEMPT_FIELDS)} {_ATTEMPT_FIELDS}")
    row, slot, attempt, state, replica, gate_id, restored, unclaimed, result = value
    res = None
    if result is not None:
        if not isinstance(result, list) or len(result) != 2:
            raise ValueError("an attempt's result is [reward, turns]")
        res = EpisodeResult(
            _conv.structure(result[0], float), _conv.structure(result[1], int)
        )
    return AttemptRow(
        _conv.structure(row, int),
        _conv.structure(slot, int),
        _conv.structure(attempt, int),
        _conv.structure(state, str),
        _conv.structure(replica, cast(Any, str | None)),
        _conv.structure(gate_id, cast(Any, int | None)),
        _conv.structure(restored, cast(Any, RestoredGymState | None)),
        _conv.structure(unclaimed, bool),
        res,
    )


_conv.register_unstructure_hook(AttemptRow, _unstructure_attempt_row)
_conv.register_structure_hook(AttemptRow, _structure_attempt_row)


def dump_ledger_snapshot(snap: LedgerSnapshot) -> bytes:
    """``ledger.json`` bytes (compact JSON through the library converter)."""
    return orjson.dumps(_conv.unstructure(snap))


def load_ledger_snapshot(data: bytes) -> LedgerSnapshot:
    """Parse ``ledger.json`` strictly; any problem is a ``ManifestError`` naming the field."""
    return loads(data, LedgerSnapshot, "ledger.json")
