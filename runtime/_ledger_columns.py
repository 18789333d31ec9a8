"""The ledger's storage: every attempt in typed columns, and the one writer of them.

Columns, not objects
--------------------
A trainer holds 200k to 1M attempts. Kept as one Python object per attempt (plus its ID string,
dict entries and sets), they cost ~300 B each and — worse — millions of objects the cyclic
garbage collector walks on every full collection (0.5 s at 1M, a stall of the event loop).
So the ledger keeps no object per attempt. A row owns a *block* of ``group_size`` consecutive
*slots*; each slot is one generation slot's current attempt, stored in typed columns
(``array``/``bytearray``: attempt number, state, replica as an interned instance index, gate ID,
result) that the collector never traverses. A rollout ID is not stored: it is derived from
``(row, slot, attempt)`` and parsed back on lookup (``row → block`` is one dict of ints, which
the collector does not track either). What each instance holds is an intrusive doubly linked
list over slots, so ``held_by`` stays O(held) without a set of IDs. A block is recycled when its
row leaves (trained, or failed as a whole); an ended attempt's slot is reused by its successor.

``Attempt`` (``_ledger_views``) is a view of one slot, reading it through the store's public
reads. The store hands out one view per slot while someone holds it (a weak cache:
``view(s) is view(s)``); when the attempt ends, its held view is detached and keeps the values
of that moment. Sparse data stays in dicts of ints and strings (the restored
Gym state by slot, only after a restore; spent attempts by ``row * group_size + slot``; the
retire queue as rollout ID → instance index and restored flag; trained and failed rows as
dicts, not sets). CPython tracks no dict whose keys and values are all untracked atoms, and a
tuple of strings is untracked by the collector's first pass; a set or an attrs record is always
tracked. So the restored state is kept as a plain tuple of ``RestoredGymState``'s fields and
the records (``RestoredGymState``, ``RetireItem``) are built when asked for. What the collector
walks for a ledger is a few dozen objects, however many attempts it holds
(``tests/test_ledger_storage.py`` counts them). A completed attempt's trajectory payload is
the episode's own data and is held as given.

One writer
----------
``LedgerColumns`` is the only writer of its columns, and knows no policy: it never checks the
barrier, spends no budget, and refuses nothing a caller asked for in the right state. Each
change is one slot-level step (reserve a block, dispatch, refuse, complete, end an attempt,
start the next, queue a retirement, fail a row, hand ready rows over) that keeps the store's
own invariants: the state counts match the state column, an instance's held list holds exactly
its DISPATCHED attempts and its unclaimed restored ones, ``unclaimed`` counts the unclaimed
column, a row is ready exactly when every slot of its block completed. ``RecoveryLedger``
(``_ledger``) decides which step a reply or a decision makes; ``LedgerColumns.load`` builds a
store from what a snapshot held, so the snapshot layer writes nothing itself.
"""

from __future__ import annotations

import itertools
import weakref
from array import array
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, final

import attrs

from ._ledger_records import (
    AttemptState,
    CompletedGroup,
    EpisodeResult,
    RestoredGymState,
    RetireItem,
    parse_rollout_id,
    rollout_id_for,
)
from ._ledger_views import Attempt, AttemptIndex, RowIndex, RowView, detach
from ._slices import extend_in_slices, map_in_slices, set_in_slices

__all__ = ["LedgerColumns", "SlotLoad", "SlotValues"]

# State codes in the ``_state`` column, in ``AttemptState`` order. FAILED and ABANDONED only
# ever mark a slot whose attempt just ended (a view detaches with them); a live slot is current.
_STATES: tuple[AttemptState, ...] = tuple(AttemptState)
_RESERVED, _DISPATCHED, _COMPLETED, _FAILED, _ABANDONED = range(5)
_CODE: Final = {s: i for i, s in enumerate(_STATES)}
_STATE_VALUES: Final = tuple(s.value for s in _STATES)
_RESTORED_FIELDS: Final = tuple(attrs.fields_dict(RestoredGymState))
_NO_GATE = -(1 << 63)  # gate_id None
_NO_LINK = -1

# Restored Gym state is held as a plain tuple of RestoredGymState's fields: an attrs instance is
# always collector-tracked, a tuple of strings is untracked by the collector's first pass.
_PackedRestore = tuple[str, str, str, tuple[str, ...]]
_INSTANCE: Final = 0
_FROM: Final = 2
assert tuple(f.name for f in attrs.fields(RestoredGymState)) == (
    "instance",
    "owner",
    "from_rollout_id",
    "capture_keys",
)


def _pack_restore(r: RestoredGymState) -> _PackedRestore:
    return (r.instance, r.owner, r.from_rollout_id, r.capture_keys)


# The result columns hold exactly EpisodeResult's fields; a new field needs a column here.
# The payload (a JSON value, None for most environments) is sparse: a dict keyed by slot, held
# only while the result waits to be trained.
assert tuple(f.name for f in attrs.fields(EpisodeResult)) == ("reward", "turns", "payload")


class SlotLoad(NamedTuple):
    """One current attempt for ``LedgerColumns.load``: RESERVED without a ``result``,
    COMPLETED with one. ``unclaimed`` (RESERVED with ``restored`` only) pins it, unclaimed, to
    ``restored.instance``; ``replica`` and ``gate_id`` are kept for a COMPLETED attempt."""

    slot: int
    attempt: int
    result: EpisodeResult | None = None
    restored: RestoredGymState | None = None
    unclaimed: bool = False
    replica: str | None = None
    gate_id: int | None = None


SlotValues = tuple[
    int,  # row
    int,  # slot
    int,  # attempt
    AttemptState,
    "str | None",  # replica
    "int | None",  # gate ID
    "RestoredGymState | None",
    bool,  # unclaimed
    "tuple[float, int, Any] | None",  # (reward, turns, payload) of a COMPLETED attempt
]
"""One current attempt as the store holds it (``LedgerColumns.current``): a plain tuple, as a
snapshot builds one per attempt."""


def _no_payload(_slot: int) -> None:
    return None


def _column(typecode: str) -> array[Any]:
    return array(typecode)


@final
@attrs.define(eq=False, slots=True)
class LedgerColumns:
    """The attempts of every untrained row, in columns; the only writer of them (see the
    module docstring for the layout and the invariants each change keeps)."""

    group_size: int = attrs.field(validator=attrs.validators.ge(1))

    # rows → blocks of ``group_size`` slots; a slot is one generation slot's current attempt
    _row_block: dict[int, int] = attrs.field(factory=dict, init=False)
    _blk_row: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    _blk_done: array[int] = attrs.field(factory=lambda: _column("I"), init=False)
    _free_blocks: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    # per-slot columns
    _att: array[int] = attrs.field(factory=lambda: _column("I"), init=False)
    _state: bytearray = attrs.field(factory=bytearray, init=False)
    _unclaimed_col: bytearray = attrs.field(factory=bytearray, init=False)
    _rep: array[int] = attrs.field(factory=lambda: _column("h"), init=False)
    _gate: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    _reward: array[float] = attrs.field(factory=lambda: _column("d"), init=False)
    _turns: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    # what each instance holds (S9's inventory): intrusive doubly linked lists over slots
    _hlist: array[int] = attrs.field(factory=lambda: _column("h"), init=False)
    _hnext: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    _hprev: array[int] = attrs.field(factory=lambda: _column("q"), init=False)
    _hhead: list[int] = attrs.field(factory=list, init=False)
    _inst_names: list[str] = attrs.field(factory=list, init=False)
    _inst_index: dict[str, int] = attrs.field(factory=dict, init=False)
    # sparse: restored Gym state (after a restore only), views someone holds
    _restored: dict[int, _PackedRestore] = attrs.field(factory=dict, init=False)
    """Restored Gym state by slot, as plain tuples (``_pack_restore``) the collector untracks."""
    _payload: dict[int, Any] = attrs.field(factory=dict, init=False)
    """Trajectory payloads of completed, untrained attempts, by slot."""
    _views: weakref.WeakValueDictionary[int, Attempt] = attrs.field(
        factory=weakref.WeakValueDictionary, init=False
    )
    by_id: Mapping[str, Attempt] = attrs.field(init=False)
    """The current attempts by rollout ID, as views (no entry per attempt is stored)."""

    # Sets and records are always collector-tracked; these are dicts of ints and strings only,
    # which CPython does not track. Keys of ``_spent`` are ``row * group_size + slot``.
    _spent: dict[int, int] = attrs.field(factory=dict, init=False)
    _ready: dict[int, None] = attrs.field(factory=dict, init=False)
    _trained: dict[int, None] = attrs.field(factory=dict, init=False)
    _failed_rows: dict[int, None] = attrs.field(factory=dict, init=False)
    _retire: dict[str, int] = attrs.field(factory=dict, init=False)
    """The retire queue: the ID Gym knows → ``instance index << 1 | restored``."""
    _counts: list[int] = attrs.field(factory=lambda: [0] * len(_STATES), init=False)
    """Current attempts by state code (FAILED and ABANDONED stay 0)."""
    _ended: list[int] = attrs.field(factory=lambda: [0] * len(_STATES), init=False)
    """Ended attempts by state code (FAILED, ABANDONED)."""
    _unclaimed: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.by_id = AttemptIndex(self)

    # -- building a store from a snapshot ----------------------------------------------------

    @classmethod
    def load(
        cls,
        group_size: int,
        rows: Iterable[tuple[int, Sequence[SlotLoad]]],
        *,
        trained: Iterable[int] = (),
        failed: Iterable[int] = (),
        spent: Iterable[tuple[int, int, int]] = (),
        retire: Iterable[RetireItem] = (),
    ) -> LedgerColumns:
        """A store holding exactly these current attempts, row by row, with these trained and
        failed rows, attempts spent ``(row, slot, n)`` and retire queue.

        Raises ``ValueError`` naming what does not fit: a row twice, a row without exactly
        one attempt per slot ``0..group_size-1``, spent attempts of a slot out of range, an
        attempt queued for retirement that is also current. O(attempts).
        """
        cols = cls(group_size)
        cols._trained = dict.fromkeys(sorted(trained))
        cols._failed_rows = dict.fromkeys(sorted(failed))
        g = group_size
        for row, loads in rows:
            cols._load_row(row, loads)
        for r, sl, n in spent:
            if not 0 <= sl < g:
                raise ValueError(
                    f"spent attempts of row {r} slot {sl}, but a row has slots 0..{g - 1}"
                )
            cols._spent[r * g + sl] = n
        for item in retire:
            if cols.slot_of(item.rollout_id) >= 0:
                raise ValueError(f"{item.rollout_id} is queued for retirement and also current")
            cols._retire[item.rollout_id] = cols._intern(item.instance) << 1 | item.restored
        return cols

    def _load_row(self, row: int, loads: Sequence[SlotLoad]) -> None:
        g = self.group_size
        if row in self._row_block:
            raise ValueError(f"row {row} is stored twice")
        if sorted(sl.slot for sl in loads) != list(range(g)):
            raise ValueError(
                f"row {row} has slots {sorted(sl.slot for sl in loads)}, expected 0..{g - 1}"
            )
        b = self._new_block(row)
        done = 0
        for sl in loads:
            s = b * g + sl.slot
            self._reset_slot(s, sl.attempt)
            self._counts[_RESERVED] += 1
            if sl.restored is not None:
                self._restored[s] = _pack_restore(sl.restored)
            result = sl.result
            if result is not None:
                self._set_state(s, _COMPLETED)
                self._reward[s] = result.reward
                self._turns[s] = result.turns
                if result.payload is not None:
                    self._payload[s] = result.payload
                if sl.replica is not None:
                    self._rep[s] = self._intern(sl.replica)
                if sl.gate_id is not None:
                    self._gate[s] = sl.gate_id
                done += 1
            elif sl.restored is not None and sl.unclaimed:
                self._unclaimed_col[s] = 1
                self._unclaimed += 1
                self._hold(s, sl.restored.instance)
        self._blk_done[b] = done
        if done == g:
            self._ready[row] = None

    # -- reads ---------------------------------------------------------------------------------

    def slot_of(self, rollout_id: str) -> int:
        """The slot of the current attempt with this ID, or -1. O(1)."""
        parsed = parse_rollout_id(rollout_id)
        if parsed is None:
            return -1
        row, slot, attempt = parsed
        b = self._row_block.get(row)
        if b is None or not 0 <= slot < self.group_size:
            return -1
        s = b * self.group_size + slot
        return s if self._att[s] == attempt else -1

    def reserved_slot(self, rollout_id: str) -> int:
        """The slot of the current attempt with this ID if it is RESERVED, else -1. O(1)."""
        s = self.slot_of(rollout_id)
        return s if s >= 0 and self._state[s] == _RESERVED else -1

    def in_flight_slot(self, rollout_id: str) -> int:
        """The slot of the current attempt with this ID if it is DISPATCHED, else -1. O(1)."""
        s = self.slot_of(rollout_id)
        return s if s >= 0 and self._state[s] == _DISPATCHED else -1

    def fenced_slot(self, rollout_id: str, gate_id: int) -> int:
        """The slot of the current attempt with this ID if it is DISPATCHED under ``gate_id``,
        else -1: a reply of an older attempt, of another dispatch or of an attempt not in
        flight is stale (fencing). O(1)."""
        s = self.slot_of(rollout_id)
        if s < 0 or self._state[s] != _DISPATCHED or self._gate[s] != gate_id:
            return -1
        return s

    def need(self, rollout_id: str) -> int:
        """``slot_of``, or ``KeyError`` for an ID that is not a current attempt."""
        s = self.slot_of(rollout_id)
        if s < 0:
            raise KeyError(f"unknown rollout ID {rollout_id!r}")
        return s

    def view(self, s: int) -> Attempt:
        """The view of slot ``s`` (the same object while someone holds it)."""
        view = self._views.get(s)
        if view is None:
            view = self._views[s] = Attempt(self, s)
        return view

    def block_views(self, b: int) -> list[Attempt]:
        g = self.group_size
        return [self.view(s) for s in range(b * g, b * g + g)]

    def rid(self, s: int) -> str:
        g = self.group_size
        return rollout_id_for(self._blk_row[s // g], s % g, self._att[s])

    def row_at(self, s: int) -> int:
        return self._blk_row[s // self.group_size]

    def attempt_at(self, s: int) -> int:
        return self._att[s]

    def state_at(self, s: int) -> AttemptState:
        return _STATES[self._state[s]]

    def replica_at(self, s: int) -> str | None:
        i = self._rep[s]
        return None if i < 0 else self._inst_names[i]

    def gate_at(self, s: int) -> int | None:
        g = self._gate[s]
        return None if g == _NO_GATE else g

    def result_at(self, s: int) -> EpisodeResult | None:
        if self._state[s] != _COMPLETED:
            return None
        return EpisodeResult(self._reward[s], self._turns[s], self._payload.get(s))

    def restored_at(self, s: int) -> RestoredGymState | None:
        packed = self._restored.get(s)
        return None if packed is None else RestoredGymState(*packed)

    def pinned_to(self, s: int) -> str | None:
        """The original replica of a restored attempt (where it must be dispatched), else
        None."""
        packed = self._restored.get(s)
        return None if packed is None else packed[_INSTANCE]

    @property
    def any_restored(self) -> bool:
        """Whether any slot holds restored Gym state (only after a restore)."""
        return bool(self._restored)

    def fields_at(
        self, s: int, state: int | None = None, failure: str | None = None
    ) -> tuple[Any, ...]:
        g = self.group_size
        rep, gate = self._rep[s], self._gate[s]
        return (
            self._blk_row[s // g],
            s % g,
            self._att[s],
            self.rid(s),
            _STATES[self._state[s] if state is None else state],
            None if rep < 0 else self._inst_names[rep],
            None if gate == _NO_GATE else gate,
            self.restored_at(s),
            bool(self._unclaimed_col[s]),
            self.result_at(s),
            failure,
        )

    def unclaimed_at(self, s: int) -> bool:
        return bool(self._unclaimed_col[s])

    def block_of(self, row: int) -> int:
        """The block of a row in flight (``KeyError`` for another row)."""
        return self._row_block[row]

    def done_in(self, b: int) -> int:
        """How many slots of block ``b`` completed."""
        return self._blk_done[b]

    def gym_id(self, s: int) -> str:
        """The ID Gym knows this attempt by: an unclaimed restored attempt is still the
        exported attempt it will replace."""
        if self._unclaimed_col[s]:
            restored = self._restored.get(s)
            if restored is not None:
                return restored[_FROM]
        return self.rid(s)

    def live_slots(self) -> Iterator[int]:
        """Every current attempt's slot, rows in reservation order."""
        g = self.group_size
        for b in list(self._row_block.values()):
            yield from range(b * g, b * g + g)

    def n_current(self) -> int:
        c = self._counts
        return c[_RESERVED] + c[_DISPATCHED] + c[_COMPLETED]

    def count(self, state: AttemptState) -> int:
        """Current attempts in ``state`` (0 for FAILED and ABANDONED, which are never
        current)."""
        return self._counts[_CODE[state]]

    def ended(self, state: AttemptState) -> int:
        """Attempts that ended as ``state`` (FAILED or ABANDONED) in this store's life."""
        return self._ended[_CODE[state]]

    @property
    def unclaimed_count(self) -> int:
        return self._unclaimed

    def is_known_row(self, row: int) -> bool:
        """The row is in flight, trained or failed (a row is reserved once)."""
        return row in self._row_block or row in self._trained or row in self._failed_rows

    def rows(self) -> Collection[int]:
        """Rows in flight, in reservation order."""
        return self._row_block.keys()

    @property
    def row_views(self) -> Mapping[int, RowView]:
        """Rows in flight with their attempts, as views (for inspection; O(row) per row)."""
        return RowIndex(self)

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def trained(self) -> Collection[int]:
        return self._trained.keys()

    def failed(self) -> Collection[int]:
        return self._failed_rows.keys()

    def spent(self, row: int, slot: int) -> int:
        g = self.group_size
        return self._spent.get(row * g + slot, 0) if 0 <= slot < g else 0

    def spent_in_flight(self) -> Iterator[tuple[int, int, int]]:
        """``(row, slot, attempts spent)`` of the rows in flight."""
        g = self.group_size
        for key, n in self._spent.items():
            r, sl = divmod(key, g)
            if r in self._row_block:
                yield r, sl, n

    @property
    def spent_total(self) -> int:
        return sum(self._spent.values())

    def held_slots(self, instance: str) -> list[int]:
        """The slots ``instance`` holds (its held list), newest first. O(held there)."""
        i = self._inst_index.get(instance)
        if i is None:
            return []
        out: list[int] = []
        s, nxt = self._hhead[i], self._hnext
        while s != _NO_LINK:
            out.append(s)
            s = nxt[s]
        return out

    def held_ids(self, instance: str) -> frozenset[str]:
        """The IDs Gym knows ``instance``'s held attempts by (``gym_id``). O(held there).

        Without restored state (every run until a restore's attempts are claimed), an ID is
        ``rollout_id_for`` of the slot, formatted in one comprehension (a cut of 1M in flight
        builds 1M IDs: no method call each), the set built in slices (``_slices``)."""
        slots = self.held_slots(instance)
        if self._restored:
            return frozenset([self.gym_id(s) for s in slots])
        g, blk_row, att = self.group_size, self._blk_row, self._att
        ids = [
            f"{blk_row[s // g]}-{s % g}" if not att[s] else f"{blk_row[s // g]}-{s % g}-a{att[s]}"
            for s in slots
        ]
        return frozenset(set_in_slices(ids))

    def retire_items(self) -> Iterator[RetireItem]:
        names = self._inst_names
        for rid, code in self._retire.items():
            yield RetireItem(rid, names[code >> 1], bool(code & 1))

    @property
    def retire_count(self) -> int:
        return len(self._retire)

    def unclaimed_views(self) -> list[Attempt]:
        """Restored attempts no replacement has claimed yet. O(restored)."""
        col = self._unclaimed_col
        return [self.view(s) for s in sorted(self._restored) if col[s]]

    def reserved_views(self) -> Iterator[Attempt]:
        """Current RESERVED attempts, rows in reservation order. O(store)."""
        state = self._state
        for s in self.live_slots():
            if state[s] == _RESERVED:
                yield self.view(s)

    def dispatched(self) -> Iterator[tuple[str, str]]:
        """``(rollout ID, instance)`` of every DISPATCHED attempt, from a walk over every
        slot of every row in flight. O(store)."""
        g = self.group_size
        state, rep, att, names = self._state, self._rep, self._att, self._inst_names
        for row, b in self._row_block.items():
            base = b * g
            for slot in range(g):
                s = base + slot
                if state[s] == _DISPATCHED:
                    yield rollout_id_for(row, slot, att[s]), names[rep[s]]

    def current(self) -> Iterator[SlotValues]:
        """Every current attempt's values, rows in reservation order (for a snapshot).
        O(store); builds no record but the restored state of a restored attempt."""
        g = self.group_size
        names = self._inst_names
        att, state, rep, gate, unclaimed = (
            self._att,
            self._state,
            self._rep,
            self._gate,
            self._unclaimed_col,
        )
        reward, turns, payload, packed = self._reward, self._turns, self._payload, self._restored
        states = _STATES
        for row, b in self._row_block.items():
            base = b * g
            for s in range(base, base + g):
                code, r, gid = state[s], rep[s], gate[s]
                restored = packed.get(s) if packed else None
                yield (
                    row,
                    s - base,
                    att[s],
                    states[code],
                    None if r < 0 else names[r],
                    None if gid == _NO_GATE else gid,
                    None if restored is None else RestoredGymState(*restored),
                    bool(unclaimed[s]),
                    None if code != _COMPLETED else (reward[s], turns[s], payload.get(s)),
                )

    def _row_runs(self) -> list[tuple[int, int]]:
        """The slots of the rows in flight, in reservation order, as ``[lo, hi)`` runs of
        consecutive slots (one run while blocks were handed out in order and none was
        recycled)."""
        g = self.group_size
        runs: list[tuple[int, int]] = []
        lo = hi = 0
        for b in self._row_block.values():
            s = b * g
            if s != hi:
                if hi > lo:
                    runs.append((lo, hi))
                lo = s
            hi = s + g
        if hi > lo:
            runs.append((lo, hi))
        return runs

    def current_columns(self) -> dict[str, list[Any]]:
        """Every current attempt as ``ledger.json``'s columns (``LEDGER_COLUMNS``): rows in
        reservation order, each with its ``group_size`` slots; ``state`` by value, ``replica``
        by name, ``restored`` and ``result`` sparse as ``[i, value]``.

        Each dense column is slices of the typed columns (``_row_runs``), then a ``map``, in
        calls of ``_slices.SLICE`` items (the loop waits one slice for the GIL, not 1M): no
        Python step and no container per attempt (a cut of 1M attempts allocates nothing the
        collector tracks but the lists themselves), except per restored attempt and per
        completed one."""
        runs = self._row_runs()

        def column(values: Sequence[int]) -> list[int]:
            out: list[int] = []
            for lo, hi in runs:
                extend_in_slices(out, values[lo:hi])
            return out

        codes = column(self._state)
        names: dict[int, str | None] = dict(enumerate(self._inst_names))
        names[-1] = None
        no_gate = _NO_GATE
        order: list[int] = []
        if self._restored or self._counts[_COMPLETED]:
            order = [s for lo, hi in runs for s in range(lo, hi)]
        packed = self._restored
        restored = [
            [i, dict(zip(_RESTORED_FIELDS, packed[s], strict=True))]
            for i, s in enumerate(order)
            if s in packed
        ]
        reward, turns, payload = self._reward, self._turns, self._payload
        result = [
            [i, reward[s], turns[s]]
            if (p := payload.get(s)) is None
            else [i, reward[s], turns[s], p]
            for i, s in enumerate(order)
            if codes[i] == _COMPLETED
        ]
        return {
            "rows": list(self._row_block),
            "attempt": column(self._att),
            "state": map_in_slices(_STATE_VALUES.__getitem__, codes),
            "replica": map_in_slices(names.__getitem__, column(self._rep)),
            "gate_id": [None if x == no_gate else x for x in column(self._gate)],
            "unclaimed": map_in_slices(bool, column(self._unclaimed_col)),
            "restored": restored,
            "result": result,
        }

    def settled_check(
        self, rollout_ids: Iterable[str], is_in_flight: Callable[[str], bool]
    ) -> Callable[[Hashable], bool]:
        """``RecoveryLedger.settled_check``: each ID located once, here; ``is_in_flight``
        answers for an ID that is not current here or was found settled."""
        g = self.group_size
        blk_row, att = self._blk_row, self._att
        where: dict[Hashable, tuple[int, int, int, int]] = {}
        for rid in rollout_ids:
            s = self.slot_of(rid)
            if s >= 0:
                where[rid] = (s, s // g, blk_row[s // g], att[s])
        state, row_block = self._state, self._row_block

        def settled(rid: Hashable) -> bool:
            loc = where.get(rid)
            if loc is None:
                return not (isinstance(rid, str) and is_in_flight(rid))
            s, b, row, attempt = loc
            if state[s] == _DISPATCHED and att[s] == attempt and row_block.get(row) == b:
                return False
            del where[rid]  # settled for good: free its entry now, not when the check is freed
            return True

        return settled

    # -- slot-level changes --------------------------------------------------------------------

    def reserve(self, row: int) -> int:
        """A block for ``row`` (which must not be in flight), every slot RESERVED attempt 0;
        its block index."""
        b = self._new_block(row)
        self._counts[_RESERVED] += self.group_size
        return b

    def dispatch(self, slots: Iterable[int], instance: str, gate_id: int) -> None:
        """RESERVED slots (checked by the caller) become DISPATCHED on ``instance``; a slot
        named twice is dispatched once."""
        i = self._intern(instance)
        state, rep, gate, unclaimed = self._state, self._rep, self._gate, self._unclaimed_col
        hlist, hnext, hprev, hhead = self._hlist, self._hnext, self._hprev, self._hhead
        n = 0
        for s in slots:
            if state[s] == _DISPATCHED:
                continue  # named twice
            state[s] = _DISPATCHED
            rep[s] = i
            gate[s] = gate_id
            if unclaimed[s]:
                unclaimed[s] = 0
                self._unclaimed -= 1
            if hlist[s] >= 0:
                self._unhold(s)
            # _hold(s, instance), inlined: push s on the instance's held list
            head = hhead[i]
            hlist[s] = i
            hprev[s] = _NO_LINK
            hnext[s] = head
            if head != _NO_LINK:
                hprev[head] = s
            hhead[i] = s
            n += 1
        self._counts[_RESERVED] -= n
        self._counts[_DISPATCHED] += n

    def refuse(self, s: int) -> None:
        """DISPATCHED slot ``s`` goes back to RESERVED with its identity; a restored attempt
        is unclaimed again, held by its original replica."""
        self._unhold(s)
        self._set_state(s, _RESERVED)
        self._rep[s] = -1
        self._gate[s] = _NO_GATE
        restored = self._restored.get(s)
        if restored is not None:
            self._unclaimed_col[s] = 1
            self._unclaimed += 1
            self._hold(s, restored[_INSTANCE])

    def complete(self, s: int, reward: float, turns: int, payload: Any) -> None:
        """DISPATCHED slot ``s`` completed with this result; its row is ready once every slot
        completed."""
        self._unhold(s)
        self._set_state(s, _COMPLETED)
        self._reward[s] = reward
        self._turns[s] = turns
        if payload is not None:
            self._payload[s] = payload
        b = s // self.group_size
        done = self._blk_done[b] = self._blk_done[b] + 1
        if done == self.group_size:
            self._ready[self._blk_row[b]] = None

    def end(self, s: int, final: AttemptState, failure: str | None = None) -> None:
        """Slot ``s``'s attempt ends as ``final`` (FAILED or ABANDONED): a held view keeps its
        values, ``failure`` included; the slot is no longer current until ``renew`` or the
        row's ``fail_row``."""
        code = _CODE[final]
        self._unhold(s)
        self._clear_unclaimed(s)
        self._counts[self._state[s]] -= 1
        self._ended[code] += 1
        view = self._views.pop(s, None)
        if view is not None:
            detach(view, self.fields_at(s, code, failure))
        self._state[s] = code  # not current: a row failure skips it

    def spend(self, s: int) -> int:
        """Spend one attempt of slot ``s``'s generation slot; the attempts spent so far."""
        g = self.group_size
        key = self._blk_row[s // g] * g + s % g
        n = self._spent[key] = self._spent.get(key, 0) + 1
        return n

    def renew(self, s: int) -> Attempt:
        """Slot ``s``, whose attempt ended, holds the next attempt, RESERVED."""
        self._reset_slot(s, self._att[s] + 1)
        self._counts[_RESERVED] += 1
        return self.view(s)

    def retire_later(self, s: int) -> None:
        """Queue slot ``s``'s attempt for retirement if Gym may still hold it (S4).

        A dispatched claim of a restored episode is queued under the exported ID as well: Gym
        may hold the episode under that ID still, unclaimed (the claim never arrived) or, on
        the replacement of an instance that died inside the claim, as the session its journal
        holds (a claim the journal could not record is not in it). The slot forgets its
        restored state when it moves on, so this is the one moment the exported ID is known.
        """
        code, rep = self._state[s], self._rep[s]
        restored = self._restored.get(s)
        if code == _DISPATCHED and rep >= 0:
            self._retire[self.rid(s)] = rep << 1
            if restored is not None:  # pinned: dispatched to its replica, ``rep``
                # a plain retire frees either; a queued retire_restored (a claim whose
                # submission timed out) stays, and becomes plain if the instance dies
                self._retire.setdefault(restored[_FROM], rep << 1)
        elif code == _RESERVED and restored is not None and self._unclaimed_col[s]:
            # keyed by the ID Gym knows: the exported attempt it holds unclaimed
            self._retire[restored[_FROM]] = self._intern(restored[_INSTANCE]) << 1 | 1

    def unpin(self, s: int) -> None:
        """RESERVED restored slot ``s`` loses its restored state (its replica died): it runs
        from scratch anywhere; the exported ID stays queued for a plain retire there."""
        restored = self._restored[s]
        self._retire[restored[_FROM]] = self._inst_index[restored[_INSTANCE]] << 1
        self._unhold(s)
        self._clear_unclaimed(s)
        del self._restored[s]

    def retire_plainly(self, instance: str) -> None:
        """Every ``retire_restored`` queued on ``instance`` becomes a plain retire (its
        replacement holds no unclaimed episodes: a plain retire frees the session)."""
        i = self._inst_index.get(instance)
        if i is None:
            return
        retire, restored_code = self._retire, i << 1 | 1
        for rid, code in list(retire.items()):
            if code == restored_code:
                retire[rid] = i << 1

    def record_orphans(self, rollout_ids: Iterable[str], instance: str, restored: bool) -> None:
        """Queue these IDs (not current here) for retirement on ``instance``."""
        code = self._intern(instance) << 1 | int(restored)
        for rid in rollout_ids:
            self._retire[rid] = code

    def forget_retired(self, rollout_ids: Iterable[str]) -> None:
        for rid in rollout_ids:
            self._retire.pop(rid, None)

    def fail_row(self, row: int) -> None:
        """``row`` fails as a whole: what Gym may still hold is queued for retirement, the
        row is failed and leaves (its block recycled)."""
        b = self._row_block[row]
        self._failed_rows[row] = None
        self._ready.pop(row, None)
        g = self.group_size
        for s in range(b * g, b * g + g):
            code = self._state[s]
            if code >= _FAILED:
                continue  # already ended
            self.retire_later(s)
            self._unhold(s)
            self._clear_unclaimed(s)
            self._counts[code] -= 1
        self._free_block(row, b)

    def take_ready(
        self, limit: int, row_of: Callable[[int], int] | None = None
    ) -> list[CompletedGroup]:
        """Up to ``limit`` ready rows, oldest first, leave as trained; ``row_of`` names the
        dataset row of each (the identity if None). O(groups taken)."""
        out: list[CompletedGroup] = []
        g = self.group_size
        reward, turns, att, payload = self._reward, self._turns, self._att, self._payload
        for row_index in list(itertools.islice(self._ready, limit)):
            del self._ready[row_index]
            b = self._row_block[row_index]
            slots = range(b * g, b * g + g)
            get = payload.get if payload else _no_payload
            results = tuple([EpisodeResult(reward[s], turns[s], get(s)) for s in slots])
            ids = tuple([rollout_id_for(row_index, k, att[b * g + k]) for k in range(g)])
            self._counts[_COMPLETED] -= g
            self._free_block(row_index, b)
            self._trained[row_index] = None
            row = row_index if row_of is None else row_of(row_index)
            out.append(CompletedGroup(row, results, ids, row_index))
        return out

    # -- storage -------------------------------------------------------------------------------

    def _intern(self, instance: str) -> int:
        i = self._inst_index.get(instance)
        if i is None:
            i = self._inst_index[instance] = len(self._inst_names)
            self._inst_names.append(instance)
            self._hhead.append(_NO_LINK)
        return i

    def _new_block(self, row: int) -> int:
        g = self.group_size
        if self._free_blocks:
            b = self._free_blocks.pop()
            self._blk_row[b] = row
            self._blk_done[b] = 0
            for s in range(b * g, b * g + g):
                self._reset_slot(s, 0)
        else:
            b = len(self._blk_row)
            self._blk_row.append(row)
            self._blk_done.append(0)
            self._att.extend(array("I", bytes(4 * g)))
            self._state.extend(bytes(g))
            self._unclaimed_col.extend(bytes(g))
            self._rep.extend(array("h", [-1]) * g)
            self._gate.extend(array("q", [_NO_GATE]) * g)
            self._reward.extend(array("d", bytes(8 * g)))
            self._turns.extend(array("q", bytes(8 * g)))
            self._hlist.extend(array("h", [-1]) * g)
            self._hnext.extend(array("q", [_NO_LINK]) * g)
            self._hprev.extend(array("q", [_NO_LINK]) * g)
        self._row_block[row] = b
        return b

    def _reset_slot(self, s: int, attempt: int) -> None:
        """Slot ``s`` holds a fresh RESERVED attempt (no replica, gate, result or restore)."""
        self._att[s] = attempt
        self._state[s] = _RESERVED
        self._unclaimed_col[s] = 0
        self._rep[s] = -1
        self._gate[s] = _NO_GATE
        self._restored.pop(s, None)
        self._payload.pop(s, None)

    def _free_block(self, row: int, b: int) -> None:
        """The row left the ledger: detach held views, recycle the block."""
        del self._row_block[row]
        g = self.group_size
        slots = range(b * g, b * g + g)
        views, restored, payload = self._views, self._restored, self._payload
        if views:  # the dispatch path holds none: skip the weak mapping's per-slot cost
            for s in slots:
                view = views.pop(s, None)
                if view is not None:
                    detach(view, self.fields_at(s))
        if restored:
            for s in slots:
                restored.pop(s, None)
        if payload:
            for s in slots:
                payload.pop(s, None)
        self._free_blocks.append(b)

    def _set_state(self, s: int, code: int) -> None:
        self._counts[self._state[s]] -= 1
        self._counts[code] += 1
        self._state[s] = code

    def _hold(self, s: int, instance: str) -> None:
        self._unhold(s)
        i = self._intern(instance)
        head = self._hhead[i]
        self._hlist[s] = i
        self._hprev[s] = _NO_LINK
        self._hnext[s] = head
        if head != _NO_LINK:
            self._hprev[head] = s
        self._hhead[i] = s

    def _unhold(self, s: int) -> None:
        i = self._hlist[s]
        if i < 0:
            return
        prv, nxt = self._hprev[s], self._hnext[s]
        if prv == _NO_LINK:
            self._hhead[i] = nxt
        else:
            self._hnext[prv] = nxt
        if nxt != _NO_LINK:
            self._hprev[nxt] = prv
        self._hlist[s] = -1

    def _clear_unclaimed(self, s: int) -> None:
        if self._unclaimed_col[s]:
            self._unclaimed_col[s] = 0
            self._unclaimed -= 1

    def __repr__(self) -> str:
        return (
            f"<LedgerColumns rows={len(self._row_block)} attempts={self.n_current()} "
            f"blocks={len(self._blk_row)} free={len(self._free_blocks)}>"
        )
