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
  restored Gym state) and forgets only what ``forget_retired`` names (S4); between checkpoints it
  lives in memory, and a snapshot carries what it holds at the cut (Gym committed those
  attempts' state too, so a restore must retire them before it dispatches);
* a restored attempt is RESERVED, pinned to its original replica, and *unclaimed* until the
  dispatch of its replacement claims it (S11);
* every change runs inside a ``MutationBarrier`` mutation (asserted), and names the rollout IDs it
  touched so drain waiters wake on exactly those (S9).

Costs: every change is O(attempts it names). ``pending_among(ids)`` is O(len(ids)).
``held_by(instance)`` is O(held there); snapshots are O(in-flight) and are meant for a thread or a
check, never for a per-reply path.

Storage: columns, not objects
-----------------------------
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

``Attempt`` is a view of one slot. The ledger hands out one view per slot while someone holds
it (a weak cache: ``get(rid) is att``); when the attempt ends, its held view is detached and
keeps the values of that moment. Sparse data stays in dicts of ints and strings (the restored
Gym state by slot, only after a restore; spent attempts by ``row * group_size + slot``; the
retire queue as rollout ID → instance index and restored flag; trained and failed rows as
dicts, not sets). CPython tracks no dict whose keys and values are all untracked atoms, and a
tuple of strings is untracked by the collector's first pass; a set or an attrs record is always
tracked. So the restored state is kept as a plain tuple of ``RestoredGymState``'s fields and
the records (``RestoredGymState``, ``RetireItem``) are built when asked for. What the collector
walks for a ledger is a few dozen objects, however many attempts it holds
(``tests/test_ledger_storage.py`` counts them). A completed attempt's trajectory payload is
the episode's own data and is held as given.
"""

from __future__ import annotations

import enum
import itertools
import math
import weakref
from array import array
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, TypeVar, cast, final

import attrs
import orjson

from ._barrier import MutationBarrier
from ._converter import converter as _conv
from ._converter import dumps_chunked, loads
from ._converter import structure as _conv_structure
from ._errors import BudgetExhausted, ManifestError
from ._layout import LEDGER_FILE
from ._manifest import EpisodeRecord
from ._plain import NotPlainData, checked_json

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

T = TypeVar("T")
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
    """What a completed episode gives the trainer: its reward, turns and trajectory payload
    (a JSON value from the episode, or None). Held with its completed attempt until trained,
    and part of the rollout snapshot meanwhile."""

    reward: float
    turns: int
    payload: Any = None

    def payload_as(self, cls: type[T]) -> T:
        """The payload structured as ``cls`` (an attrs class) through the project's converter;
        ``ManifestError`` naming the field if it does not fit."""
        return _conv_structure(self.payload, cls, "episode payload")


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
    released_total: int = 0
    """Attempts abandoned because their instance died (``release_instance``,
    ``abandon(spend=False)``): counted in ``abandoned_total`` but spending no row attempt."""


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
    ``[row, slot, attempts_spent]``. ``retire`` is the retire queue at the cut: dropped
    attempts Gym may still hold in the state it committed with this snapshot (an attempt dropped
    between the checkpoint's retire stage and its cut). A restore retires them before it
    dispatches anything, so a dropped episode's environment mutations never stay next to its
    replacement's.
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
    retire: tuple[RetireItem, ...] = ()


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


def _parse_rollout_id(rollout_id: str) -> tuple[int, int, int] | None:
    """``(row, slot, attempt)`` of a canonical rollout ID (``rollout_id_for``), else None."""
    head, _, tail = rollout_id.rpartition("-")
    try:
        if tail[:1] == "a":
            attempt = int(tail[1:])
            head, _, tail = head.rpartition("-")
        else:
            attempt = 0
        row, slot = int(head), int(tail)
    except ValueError:
        return None
    if rollout_id_for(row, slot, attempt) != rollout_id:  # "01-0", "1-0-a0", " 1-0", …
        return None
    return row, slot, attempt


# State codes in the ``_state`` column, in ``AttemptState`` order. FAILED and ABANDONED only
# ever mark a slot whose attempt just ended (a view detaches with them); a live slot is current.
_STATES: tuple[AttemptState, ...] = tuple(AttemptState)
_CODE = {s: i for i, s in enumerate(_STATES)}
_RESERVED, _DISPATCHED, _COMPLETED, _FAILED, _ABANDONED = range(5)
_NO_GATE = -(1 << 63)  # gate_id None
_NO_LINK = -1

# Restored Gym state is held as a plain tuple of RestoredGymState's fields: an attrs instance is
# always collector-tracked, a tuple of strings is untracked by the collector's first pass.
_PackedRestore = tuple[str, str, str, tuple[str, ...]]
_INSTANCE: Final = 0
_FROM: Final = 2
assert tuple(f.name for f in attrs.fields(RestoredGymState)) == (
    "instance", "owner", "from_rollout_id", "capture_keys"
)


def _pack_restore(r: RestoredGymState) -> _PackedRestore:
    return (r.instance, r.owner, r.from_rollout_id, r.capture_keys)

# The result columns hold exactly EpisodeResult's fields; a new field needs a column here.
# The payload (a JSON value, None for most environments) is sparse: a dict keyed by slot, held
# only while the result waits to be trained.
assert tuple(f.name for f in attrs.fields(EpisodeResult)) == ("reward", "turns", "payload")


@final
class Attempt:
    """One attempt, as a read-only view of the ledger's columns. Change it only through the
    ledger.

    While you hold a view, the ledger hands out the same object for the same attempt
    (``ledger.get(rid) is att``). Once the attempt ends (completed and trained, failed,
    abandoned, its row dropped) the view keeps the values it had at that moment, as a record
    of what happened, and no longer follows the slot (which the ledger reuses).
    """

    __slots__ = ("__weakref__", "_final", "_ledger", "_slot")

    _ledger: RecoveryLedger | None
    _slot: int
    _final: tuple[Any, ...]

    def __init__(self, ledger: RecoveryLedger, slot: int) -> None:
        self._ledger = ledger
        self._slot = slot
        self._final = ()

    def _detach(self, fields: tuple[Any, ...]) -> None:
        self._final = fields
        self._ledger = None

    def _fields(self) -> tuple[Any, ...]:
        led = self._ledger
        return self._final if led is None else led._fields(self._slot)

    @property
    def row(self) -> int:
        led = self._ledger
        return self._final[0] if led is None else led._blk_row[self._slot // led.group_size]

    @property
    def slot(self) -> int:
        led = self._ledger
        return self._final[1] if led is None else self._slot % led.group_size

    @property
    def attempt(self) -> int:
        led = self._ledger
        return self._final[2] if led is None else led._att[self._slot]

    @property
    def rollout_id(self) -> str:
        led = self._ledger
        return self._final[3] if led is None else led._rid(self._slot)

    @property
    def state(self) -> AttemptState:
        led = self._ledger
        return self._final[4] if led is None else _STATES[led._state[self._slot]]

    @property
    def replica(self) -> str | None:
        led = self._ledger
        if led is None:
            return cast("str | None", self._final[5])
        i = led._rep[self._slot]
        return None if i < 0 else led._inst_names[i]

    @property
    def gate_id(self) -> int | None:
        led = self._ledger
        if led is None:
            return cast("int | None", self._final[6])
        g = led._gate[self._slot]
        return None if g == _NO_GATE else g

    @property
    def restored(self) -> RestoredGymState | None:
        led = self._ledger
        if led is None:
            return cast("RestoredGymState | None", self._final[7])
        return led._restored_at(self._slot)

    @property
    def unclaimed(self) -> bool:
        led = self._ledger
        return bool(self._final[8] if led is None else led._unclaimed_col[self._slot])

    @property
    def result(self) -> EpisodeResult | None:
        led = self._ledger
        if led is None:
            return cast("EpisodeResult | None", self._final[9])
        return led._result(self._slot)

    @property
    def failure(self) -> str | None:
        """Why the attempt failed (``"infra: …"`` / ``"data: …"``), once it has."""
        return None if self._ledger is not None else cast("str | None", self._final[10])

    def __repr__(self) -> str:
        f = self._fields()
        return f"<Attempt {f[3]} {f[4].value} replica={f[5]!r} gate_id={f[6]!r}>"


@final
class _AttemptIndex(Mapping[str, Attempt]):
    """The current attempts by rollout ID: a read-only mapping of views over the columns
    (no entry per attempt is stored). ``get`` parses the ID; iteration walks rows in order."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: RecoveryLedger) -> None:
        self._ledger = ledger

    def get(self, key: object, default: Any = None) -> Any:
        led = self._ledger
        s = led._slot_of(key) if isinstance(key, str) else -1
        return default if s < 0 else led._view(s)

    def __getitem__(self, key: str) -> Attempt:
        att = self.get(key)
        if att is None:
            raise KeyError(key)
        return cast(Attempt, att)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._ledger._slot_of(key) >= 0

    def __iter__(self) -> Iterator[str]:
        led = self._ledger
        for s in led._live_slots():
            yield led._rid(s)

    def __len__(self) -> int:
        return self._ledger._n_current()


@final
@attrs.frozen
class _RowView:
    slots: list[Attempt]
    completed: int


@final
class _RowIndex(Mapping[int, _RowView]):
    """Rows in flight, each with its current attempts (views), in reservation order."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: RecoveryLedger) -> None:
        self._ledger = ledger

    def __getitem__(self, row: int) -> _RowView:
        led = self._ledger
        b = led._row_block[row]
        g = led.group_size
        return _RowView([led._view(s) for s in range(b * g, b * g + g)], led._blk_done[b])

    def __iter__(self) -> Iterator[int]:
        return iter(self._ledger._row_block)

    def __len__(self) -> int:
        return len(self._ledger._row_block)


def _no_payload(_slot: int) -> None:
    return None


def _column(typecode: str) -> array[Any]:
    return array(typecode)


@final
@attrs.define(eq=False, slots=True)
class RecoveryLedger:
    """Every attempt of every untrained row; see the module docstring for invariants."""

    group_size: int
    max_row_attempts: int = 3
    data_failure_budget: int = 16
    barrier: MutationBarrier = attrs.field(factory=MutationBarrier)

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
    _by_id: Mapping[str, Attempt] = attrs.field(init=False)

    # Sets and records are always collector-tracked; these are dicts of ints and strings only,
    # which CPython does not track. Keys of ``_spent`` are ``row * group_size + slot``.
    _spent: dict[int, int] = attrs.field(factory=dict, init=False)
    _ready: dict[int, None] = attrs.field(factory=dict, init=False)
    _trained: dict[int, None] = attrs.field(factory=dict, init=False)
    _failed_rows: dict[int, None] = attrs.field(factory=dict, init=False)
    _retire: dict[str, int] = attrs.field(factory=dict, init=False)
    """The retire queue: the ID Gym knows → ``instance index << 1 | restored``."""
    _counts: dict[AttemptState, int] = attrs.field(init=False)
    _ended: dict[AttemptState, int] = attrs.field(init=False)
    _unclaimed: int = attrs.field(default=0, init=False)
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
        self._counts = dict.fromkeys(AttemptState, 0)
        self._ended = dict.fromkeys(AttemptState, 0)
        self._by_id = _AttemptIndex(self)

    # -- storage ---------------------------------------------------------------------------------

    @property
    def _rows(self) -> Mapping[int, _RowView]:
        """Rows in flight with their attempts, as views (for inspection; O(row) per row)."""
        return _RowIndex(self)

    def _assert_mutating(self) -> None:
        if not self.barrier.in_mutation:
            raise RuntimeError("ledger changes must run inside barrier.mutate()")

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
                    view._detach(self._fields(s))
        if restored:
            for s in slots:
                restored.pop(s, None)
        if payload:
            for s in slots:
                payload.pop(s, None)
        self._free_blocks.append(b)

    def _fields(self, s: int, state: int | None = None, failure: str | None = None) -> tuple[
        Any, ...
    ]:
        g = self.group_size
        rep, gate = self._rep[s], self._gate[s]
        return (
            self._blk_row[s // g], s % g, self._att[s], self._rid(s),
            _STATES[self._state[s] if state is None else state],
            None if rep < 0 else self._inst_names[rep], None if gate == _NO_GATE else gate,
            self._restored_at(s), bool(self._unclaimed_col[s]), self._result(s), failure,
        )

    def _rid(self, s: int) -> str:
        g = self.group_size
        return rollout_id_for(self._blk_row[s // g], s % g, self._att[s])

    def _result(self, s: int) -> EpisodeResult | None:
        if self._state[s] != _COMPLETED:
            return None
        return EpisodeResult(self._reward[s], self._turns[s], self._payload.get(s))

    def _restored_at(self, s: int) -> RestoredGymState | None:
        packed = self._restored.get(s)
        return None if packed is None else RestoredGymState(*packed)

    def _slot_of(self, rollout_id: str) -> int:
        """The slot of the current attempt with this ID, or -1. O(1)."""
        parsed = _parse_rollout_id(rollout_id)
        if parsed is None:
            return -1
        row, slot, attempt = parsed
        b = self._row_block.get(row)
        if b is None or not 0 <= slot < self.group_size:
            return -1
        s = b * self.group_size + slot
        return s if self._att[s] == attempt else -1

    def _need(self, rollout_id: str) -> int:
        s = self._slot_of(rollout_id)
        if s < 0:
            raise KeyError(f"unknown rollout ID {rollout_id!r}")
        return s

    def _view(self, s: int) -> Attempt:
        view = self._views.get(s)
        if view is None:
            view = self._views[s] = Attempt(self, s)
        return view

    def _live_slots(self) -> Iterator[int]:
        g = self.group_size
        for b in list(self._row_block.values()):
            yield from range(b * g, b * g + g)

    def _n_current(self) -> int:
        c = self._counts
        return c[AttemptState.RESERVED] + c[AttemptState.DISPATCHED] + c[AttemptState.COMPLETED]

    def _set_state(self, s: int, code: int) -> None:
        self._counts[_STATES[self._state[s]]] -= 1
        self._counts[_STATES[code]] += 1
        self._state[s] = code

    def _gym_id(self, s: int) -> str:
        """The ID Gym knows this attempt by: an unclaimed restored attempt is still the
        exported attempt it will replace."""
        if self._unclaimed_col[s]:
            restored = self._restored.get(s)
            if restored is not None:
                return restored[_FROM]
        return self._rid(s)

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

    def _retire_later(self, s: int) -> None:
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
            self._retire[self._rid(s)] = rep << 1
            if restored is not None:  # pinned: dispatched to its replica, ``rep``
                # a plain retire frees either; a queued retire_restored (a claim whose
                # submission timed out) stays, and becomes plain if the instance dies
                self._retire.setdefault(restored[_FROM], rep << 1)
        elif code == _RESERVED and restored is not None and self._unclaimed_col[s]:
            # keyed by the ID Gym knows: the exported attempt it holds unclaimed
            self._retire[restored[_FROM]] = self._intern(restored[_INSTANCE]) << 1 | 1

    def _replace(
        self, s: int, final: int, *, spend: bool, failure: str | None = None
    ) -> Attempt | None:
        """End slot ``s``'s attempt as ``final``; start the slot's next attempt unless the
        slot's row attempts are spent (then the whole row fails)."""
        self._unhold(s)
        self._clear_unclaimed(s)
        self._counts[_STATES[self._state[s]]] -= 1
        self._ended[_STATES[final]] += 1
        view = self._views.pop(s, None)
        if view is not None:
            view._detach(self._fields(s, final, failure))
        g = self.group_size
        row, slot = self._blk_row[s // g], s % g
        self._state[s] = final  # not current: a row failure below skips it
        if not spend and final == _ABANDONED:
            self._released += 1
        if spend:
            key = row * g + slot
            n = self._spent[key] = self._spent.get(key, 0) + 1
            if n >= self.max_row_attempts:
                self._fail_row(row)
                return None
        self._reset_slot(s, self._att[s] + 1)
        self._counts[AttemptState.RESERVED] += 1
        return self._view(s)

    def _fail_row(self, row_index: int) -> None:
        b = self._row_block[row_index]
        self._failed_rows[row_index] = None
        self._ready.pop(row_index, None)
        g = self.group_size
        for s in range(b * g, b * g + g):
            code = self._state[s]
            if code >= _FAILED:
                continue  # already ended
            self._retire_later(s)
            self._unhold(s)
            self._clear_unclaimed(s)
            self._counts[_STATES[code]] -= 1
        self._free_block(row_index, b)

    # -- changes (each inside barrier.mutate) ------------------------------------------------------

    def reserve_row(self, row: int) -> list[Attempt]:
        """Reserve attempt 0 of every generation slot of ``row``."""
        b = self._reserve(row)
        g = self.group_size
        return [self._view(s) for s in range(b * g, b * g + g)]

    def reserve_row_ids(self, row: int) -> list[str]:
        """``reserve_row`` for the dispatch path: the new attempts' rollout IDs, in slot order,
        and no view objects (no per-attempt allocation beyond the ID strings)."""
        self._reserve(row)
        return [f"{row}-{k}" for k in range(self.group_size)]  # attempt 0: rollout_id_for

    def _reserve(self, row: int) -> int:
        self._assert_mutating()
        if row in self._row_block or row in self._trained or row in self._failed_rows:
            raise ValueError(f"row {row} is already in the ledger")
        b = self._new_block(row)
        self._counts[AttemptState.RESERVED] += self.group_size
        if row >= self._next_row:
            self._next_row = row + 1
        return b

    def mark_dispatched(self, rollout_ids: Iterable[str], instance: str, gate_id: int) -> None:
        """RESERVED → DISPATCHED on ``instance`` under ``gate_id`` (inside gate admission, S1).

        A restored attempt must go to its original replica; dispatching it claims it.
        """
        self._assert_mutating()
        slots = [self._need(rid) for rid in rollout_ids]
        state, restored_of = self._state, self._restored
        for s in slots:
            if state[s] != _RESERVED:
                raise ValueError(f"{self._rid(s)} is {_STATES[state[s]].value}, not reserved")
            restored = restored_of.get(s)
            if restored is not None and restored[_INSTANCE] != instance:
                raise ValueError(
                    f"{self._rid(s)} was restored on {restored[_INSTANCE]}; "
                    f"it cannot be dispatched to {instance}"
                )
        self._dispatch_slots(slots, instance, gate_id)

    def dispatch_sendable(
        self, rollout_ids: Iterable[str], instance: str, gate_id: int
    ) -> tuple[list[str], list[str]]:
        """``sendable`` and ``mark_dispatched`` of the sendable part, in one pass (each ID is
        located once): the current RESERVED attempts become DISPATCHED on ``instance`` under
        ``gate_id`` (inside gate admission, S1). Returns (dispatched, the rest). Raises
        ``ValueError`` and changes nothing if a restored attempt would leave its replica."""
        self._assert_mutating()
        ok: list[str] = []
        rest: list[str] = []
        slots: dict[int, None] = {}
        state, restored_of, slot_of = self._state, self._restored, self._slot_of
        for rid in rollout_ids:
            s = slot_of(rid)
            if s >= 0 and state[s] == _RESERVED and s not in slots:
                if restored_of:
                    restored = restored_of.get(s)
                    if restored is not None and restored[_INSTANCE] != instance:
                        raise ValueError(
                            f"{rid} was restored on {restored[_INSTANCE]}; "
                            f"it cannot be dispatched to {instance}"
                        )
                ok.append(rid)
                slots[s] = None
            else:
                rest.append(rid)
        self._dispatch_slots(slots, instance, gate_id)
        return ok, rest

    def _dispatch_slots(self, slots: Iterable[int], instance: str, gate_id: int) -> None:
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
        self._counts[AttemptState.RESERVED] -= n
        self._counts[AttemptState.DISPATCHED] += n

    def reserved_attempt(
        self, rollout_id: str
    ) -> tuple[int, int, int, RestoredGymState | None] | None:
        """``(row, slot, attempt, restored)`` of the current RESERVED attempt with this ID, or
        None (not current, or not RESERVED). O(1); no view object (the dispatch path)."""
        s = self._slot_of(rollout_id)
        if s < 0 or self._state[s] != _RESERVED:
            return None
        g = self.group_size
        restored = self._restored_at(s) if self._restored else None
        return self._blk_row[s // g], s % g, self._att[s], restored

    def sendable(self, rollout_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Split IDs into (current RESERVED attempts, the rest). O(len(rollout_ids))."""
        ok: list[str] = []
        stale: list[str] = []
        state = self._state
        for rid in rollout_ids:
            s = self._slot_of(rid)
            (ok if s >= 0 and state[s] == _RESERVED else stale).append(rid)
        return ok, stale

    def record_orphans(
        self, rollout_ids: Iterable[str], instance: str, *, restored: bool = False
    ) -> None:
        """Gym accepted rows the ledger dropped meanwhile: queue them for retirement (S4).

        With ``restored``, the IDs are restored episodes Gym may still hold unclaimed (retired
        with ``retire_restored``).
        """
        self._assert_mutating()
        code = self._intern(instance) << 1 | int(restored)
        for rid in rollout_ids:
            self._retire[rid] = code

    def refuse(self, rollout_id: str) -> bool:
        """``admission_closed``: DISPATCHED → RESERVED, identity kept, nothing spent (S2).

        Returns False (and changes nothing) for a refusal that is not about a current
        dispatched attempt.
        """
        self._assert_mutating()
        s = self._slot_of(rollout_id)
        if s < 0 or self._state[s] != _DISPATCHED:
            self._stale += 1
            return False
        self._unhold(s)
        self._set_state(s, _RESERVED)
        self._rep[s] = -1
        self._gate[s] = _NO_GATE
        restored = self._restored.get(s)
        if restored is not None:
            self._unclaimed_col[s] = 1
            self._unclaimed += 1
            self._hold(s, restored[_INSTANCE])
        return True

    def complete(self, rollout_id: str, gate_id: int, result: EpisodeResult) -> bool:
        """Accept a streamed completion if it is the current attempt under the same gate ID.

        Returns False for a stale reply (older attempt, other gate ID, not dispatched): it is
        counted and ignored.
        """
        return self.complete_with(rollout_id, gate_id, result.reward, result.turns,
                                  result.payload)

    def complete_with(
        self, rollout_id: str, gate_id: int, reward: float, turns: int, payload: Any = None
    ) -> bool:
        """``complete`` with the result's fields (no ``EpisodeResult`` built per reply)."""
        self._assert_mutating()
        s = self._slot_of(rollout_id)
        if s < 0 or self._state[s] != _DISPATCHED or self._gate[s] != gate_id:
            self._stale += 1
            return False
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
        return True

    def fail(self, rollout_id: str, gate_id: int, cls: FailureClass, reason: str) -> Attempt | None:
        """A failed episode: spend a row attempt (and data budget for ``"data"``).

        Returns the slot's next attempt (RESERVED, new rollout ID), or None when the reply was
        stale or the row ran out of attempts (the row then fails as a whole). Raises
        ``BudgetExhausted`` when the run's data-failure budget is spent.
        """
        self._assert_mutating()
        s = self._slot_of(rollout_id)
        if s < 0 or self._state[s] != _DISPATCHED or self._gate[s] != gate_id:
            self._stale += 1
            return None
        if cls == "data":
            self._data_failures += 1
        self.last_failure = f"{rollout_id}: {cls}: {reason}"
        nxt = self._replace(s, _FAILED, spend=True, failure=f"{cls}: {reason}")
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
        out: list[Attempt] = []
        for rid in rollout_ids:
            s = self._slot_of(rid)
            if s < 0 or self._state[s] != _DISPATCHED:
                continue
            self._retire_later(s)
            nxt = self._replace(s, _ABANDONED, spend=spend)
            if nxt is not None:
                out.append(nxt)
        return out

    def unpin(self, rollout_id: str) -> None:
        """Forget the restored Gym state of a RESERVED attempt whose replica died: it will run
        from scratch on any instance (its episode's state died with the replica)."""
        self._assert_mutating()
        s = self._need(rollout_id)
        if self._state[s] != _RESERVED or s not in self._restored:
            raise ValueError(f"{rollout_id} is not a reserved restored attempt")
        self._unhold(s)
        self._clear_unclaimed(s)
        del self._restored[s]

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
        i = self._inst_index.get(instance)
        if i is None:
            return [], []
        slots: list[int] = []
        s, nxt = self._hhead[i], self._hnext
        while s != _NO_LINK:
            slots.append(s)
            s = nxt[s]
        fresh: list[Attempt] = []
        unpinned: list[Attempt] = []
        for s in slots:
            restored = self._restored.get(s)
            if self._state[s] == _DISPATCHED:
                self._retire_later(s)  # a claim under its exported ID too
                nxt_att = self._replace(s, _ABANDONED, spend=False)
                if nxt_att is not None:
                    fresh.append(nxt_att)
            elif self._state[s] == _RESERVED and restored is not None:
                self._retire[restored[_FROM]] = i << 1
                self._unhold(s)
                self._clear_unclaimed(s)
                del self._restored[s]
                unpinned.append(self._view(s))
        retire, restored_code = self._retire, i << 1 | 1
        for rid, code in list(retire.items()):
            if code == restored_code:
                # the replacement holds no unclaimed episodes: a plain retire frees the session
                retire[rid] = i << 1
        return fresh, unpinned

    def drop_row(self, row: int) -> None:
        """Discard a whole group; queue what Gym may still hold for retirement (S4)."""
        self._assert_mutating()
        if row not in self._row_block:
            raise KeyError(f"row {row} is not in flight")
        self._fail_row(row)

    def take_ready(self, limit: int) -> list[CompletedGroup]:
        """Hand up to ``limit`` complete groups to the trainer, oldest first; they leave the
        ledger as trained rows. O(groups taken)."""
        self._assert_mutating()
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
            self._counts[AttemptState.COMPLETED] -= g
            self._free_block(row_index, b)
            self._trained[row_index] = None
            out.append(CompletedGroup(row_index, results, ids))
        return out

    def forget_retired(self, rollout_ids: Iterable[str]) -> None:
        """Forget exactly these retired attempts; a drop queued meanwhile stays (S4)."""
        self._assert_mutating()
        for rid in rollout_ids:
            self._retire.pop(rid, None)

    # -- questions ---------------------------------------------------------------------------

    def get(self, rollout_id: str) -> Attempt | None:
        """The current attempt with this rollout ID, or None."""
        s = self._slot_of(rollout_id)
        return None if s < 0 else self._view(s)

    def is_in_flight(self, rollout_id: str) -> bool:
        """The ownership rule shared by the inventory and the drain: Gym runs this current
        attempt for us and owes us its reply (DISPATCHED). O(1)."""
        s = self._slot_of(rollout_id)
        return s >= 0 and self._state[s] == _DISPATCHED

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
        g = self.group_size
        blk_row, att = self._blk_row, self._att
        where: dict[Hashable, tuple[int, int, int, int]] = {}
        for rid in rollout_ids:
            s = self._slot_of(rid)
            if s >= 0:
                where[rid] = (s, s // g, blk_row[s // g], att[s])
        state, row_block, is_in_flight = self._state, self._row_block, self.is_in_flight

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
        Maintained incrementally (a linked list per instance); the copy is O(held)."""
        i = self._inst_index.get(instance)
        if i is None:
            return frozenset()
        out: list[str] = []
        s, nxt = self._hhead[i], self._hnext
        while s != _NO_LINK:
            out.append(self._gym_id(s))
            s = nxt[s]
        return frozenset(out)

    def reserved(self) -> Iterator[Attempt]:
        """Current RESERVED attempts of untrained rows (restored ones included). O(ledger)."""
        state = self._state
        for s in self._live_slots():
            if state[s] == _RESERVED:
                yield self._view(s)

    def retire_queue(self) -> dict[str, list[RetireItem]]:
        """The dropped attempts Gym may still hold, grouped by instance (a copy)."""
        out: dict[str, list[RetireItem]] = {}
        for item in self._retire_items():
            out.setdefault(item.instance, []).append(item)
        return out

    def _retire_items(self) -> Iterator[RetireItem]:
        names = self._inst_names
        for rid, code in self._retire.items():
            yield RetireItem(rid, names[code >> 1], bool(code & 1))

    def unclaimed(self) -> list[Attempt]:
        """Restored attempts no replacement has claimed yet. O(restored)."""
        col = self._unclaimed_col
        return [self._view(s) for s in sorted(self._restored) if col[s]]

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
        return self._row_block.keys()

    def row_attempts_spent(self, row: int, slot: int) -> int:
        g = self.group_size
        return self._spent.get(row * g + slot, 0) if 0 <= slot < g else 0

    @property
    def data_failures(self) -> int:
        return self._data_failures

    @property
    def next_row(self) -> int:
        """One past the highest row ever reserved (the dataset cursor)."""
        return self._next_row

    # -- snapshot and restore ------------------------------------------------------------------

    def _attempt_rows(self) -> Iterator[AttemptRow]:
        g = self.group_size
        names = self._inst_names
        att, state, rep, gate, unclaimed = (
            self._att, self._state, self._rep, self._gate, self._unclaimed_col
        )
        for row, b in self._row_block.items():
            for s in range(b * g, b * g + g):
                code, r, gid = state[s], rep[s], gate[s]
                yield AttemptRow(
                    row, s - b * g, att[s], _STATES[code].value,
                    None if r < 0 else names[r], None if gid == _NO_GATE else gid,
                    self._restored_at(s), bool(unclaimed[s]),
                    self._result(s),
                )

    def to_snapshot(self) -> LedgerSnapshot:
        """A consistent copy of the ledger. O(ledger): call it while holding the barrier, from a
        thread (``trio.to_thread.run_sync``) so the event loop keeps running."""
        return attrs.evolve(self._snapshot_header(), attempts=tuple(self._attempt_rows()))

    def snapshot_bytes(self) -> bytes:
        """``dump_ledger_snapshot(self.to_snapshot())``, in one pass over the columns: no
        record per attempt is built. Same rules as ``to_snapshot`` (barrier held, a thread)."""
        out = _conv.unstructure(self._snapshot_header())
        g = self.group_size
        names = self._inst_names
        att, state, rep, gate, unclaimed = (
            self._att, self._state, self._rep, self._gate, self._unclaimed_col
        )
        reward, turns, payload = self._reward, self._turns, self._payload
        values = [s.value for s in _STATES]
        rows: list[tuple[object, ...]] = []
        append = rows.append
        for row, b in self._row_block.items():
            base = b * g
            for s in range(base, base + g):
                code, r, gid = state[s], rep[s], gate[s]
                restored = self._restored_at(s)
                append((
                    row, s - base, att[s], values[code],
                    None if r < 0 else names[r], None if gid == _NO_GATE else gid,
                    None if restored is None else _conv.unstructure(restored),
                    bool(unclaimed[s]),
                    None if code != _COMPLETED else (
                        (reward[s], turns[s]) if (p := payload.get(s)) is None
                        else (reward[s], turns[s], p)
                    ),
                ))
        out["attempts"] = rows
        return dumps_chunked(out)  # the loop waits one chunk for the GIL, not 200k rows

    def _snapshot_header(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            version=LEDGER_SNAPSHOT_VERSION,
            group_size=self.group_size,
            max_row_attempts=self.max_row_attempts,
            data_failure_budget=self.data_failure_budget,
            data_failures=self._data_failures,
            next_row=self._next_row,
            trained=_to_ranges(self._trained),
            failed=_to_ranges(self._failed_rows),
            spent=tuple(
                (r, sl, n) for key, n in self._spent.items()
                for r, sl in (divmod(key, self.group_size),) if r in self._row_block
            ),
            attempts=(),
            retire=tuple(self._retire_items()),
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
        ledger._trained = dict.fromkeys(sorted(_from_ranges(snap.trained)))
        ledger._failed_rows = dict.fromkeys(sorted(_from_ranges(snap.failed)))
        restored = completed = reserved = fresh = 0
        grouped: dict[int, list[AttemptRow]] = {}
        for ar in snap.attempts:
            grouped.setdefault(ar.row, []).append(ar)
        g = snap.group_size
        counts = ledger._counts
        for row_index, ars in grouped.items():
            if sorted(a.slot for a in ars) != list(range(g)):
                raise ManifestError(
                    f"ledger.json: row {row_index} has slots {sorted(a.slot for a in ars)}, "
                    f"expected 0..{g - 1}"
                )
            b = ledger._new_block(row_index)
            done = 0
            for ar in ars:
                try:
                    state = AttemptState(ar.state)
                except ValueError:
                    raise ManifestError(
                        f"ledger.json: unknown attempt state {ar.state!r}"
                    ) from None
                s = b * g + ar.slot
                if state is AttemptState.DISPATCHED:
                    old_id = rollout_id_for(ar.row, ar.slot, ar.attempt)
                    ledger._reset_slot(s, ar.attempt + 1)
                    counts[AttemptState.RESERVED] += 1
                    ep = by_id.get(old_id)
                    if ep is not None:
                        ledger._restored[s] = _pack_restore(RestoredGymState(
                            ep.replica, ep.owner, old_id, tuple(ep.capture_keys)
                        ))
                        ledger._unclaimed_col[s] = 1
                        ledger._unclaimed += 1
                        ledger._hold(s, ep.replica)
                        restored += 1
                    else:
                        fresh += 1
                elif state in (AttemptState.RESERVED, AttemptState.COMPLETED):
                    ledger._reset_slot(s, ar.attempt)
                    counts[AttemptState.RESERVED] += 1
                    if ar.restored is not None:
                        ledger._restored[s] = _pack_restore(ar.restored)
                    if state is AttemptState.COMPLETED:
                        if ar.result is None:
                            raise ManifestError(
                                "ledger.json: completed attempt "
                                f"{rollout_id_for(ar.row, ar.slot, ar.attempt)} has no result"
                            )
                        ledger._set_state(s, _COMPLETED)
                        ledger._reward[s] = ar.result.reward
                        ledger._turns[s] = ar.result.turns
                        if ar.result.payload is not None:
                            ledger._payload[s] = ar.result.payload
                        if ar.replica is not None:
                            ledger._rep[s] = ledger._intern(ar.replica)
                        if ar.gate_id is not None:
                            ledger._gate[s] = ar.gate_id
                        done += 1
                        completed += 1
                    else:
                        if ar.restored is not None and ar.unclaimed:
                            ledger._unclaimed_col[s] = 1
                            ledger._unclaimed += 1
                            ledger._hold(s, ar.restored.instance)
                        reserved += 1
                else:
                    raise ManifestError(
                        f"ledger.json: attempt {rollout_id_for(ar.row, ar.slot, ar.attempt)} is "
                        f"{state.value}; only current attempts are stored"
                    )
            ledger._blk_done[b] = done
            if done == g:
                ledger._ready[row_index] = None
        for r, sl, n in snap.spent:
            if not 0 <= sl < g:
                raise ManifestError(f"ledger.json: spent attempts of row {r} slot {sl}, "
                                    f"but a row has slots 0..{g - 1}")
            ledger._spent[r * g + sl] = n
        for item in snap.retire:
            if ledger.get(item.rollout_id) is not None:
                raise ManifestError(
                    f"ledger.json: {item.rollout_id} is queued for retirement and also current"
                )
            ledger._retire[item.rollout_id] = ledger._intern(item.instance) << 1 | item.restored
        return ledger, RestoreSummary(restored, completed, reserved, fresh)

    def statistics(self) -> LedgerStatistics:
        return LedgerStatistics(
            attempts=self._n_current(),
            by_state={s.value: n for s, n in self._counts.items()},
            failed_total=self._ended[AttemptState.FAILED],
            abandoned_total=self._ended[AttemptState.ABANDONED],
            rows_reserved=len(self._row_block),
            rows_trained=len(self._trained),
            rows_failed=len(self._failed_rows),
            groups_ready=len(self._ready),
            retire_queue=len(self._retire),
            unclaimed=self._unclaimed,
            row_attempts_spent=sum(self._spent.values()),
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


# -- on-disk form ----------------------------------------------------------------------------------

_ATTEMPT_FIELDS = ("row", "slot", "attempt", "state", "replica", "gate_id", "restored",
                   "unclaimed", "result")


def _unstructure_attempt_row(a: AttemptRow) -> list[object]:
    return [
        a.row, a.slot, a.attempt, a.state, a.replica, a.gate_id,
        None if a.restored is None else _conv.unstructure(a.restored),
        a.unclaimed,
        None if a.result is None else _unstructure_result(a.result, a),
    ]


def _unstructure_result(r: EpisodeResult, a: AttemptRow) -> list[object]:
    # a JSON writer turns nan into null, which the strict reader rejects: refuse, never write
    # a ledger.json that cannot be read back (what enters the ledger was checked already)
    if not math.isfinite(r.reward):
        raise NotPlainData(f"row {a.row} slot {a.slot} attempt {a.attempt}: reward "
                           f"{r.reward!r} is not a finite number")
    if r.payload is None:
        return [r.reward, r.turns]
    checked_json(r.payload, f"row {a.row} slot {a.slot} attempt {a.attempt}: payload")
    return [r.reward, r.turns, r.payload]


def _structure_attempt_row(value: object, _t: object) -> AttemptRow:
    if not isinstance(value, list) or len(value) != len(_ATTEMPT_FIELDS):
        raise ValueError(f"an attempt is an array of {len(_ATTEMPT_FIELDS)} {_ATTEMPT_FIELDS}")
    row, slot, attempt, state, replica, gate_id, restored, unclaimed, result = value
    res = None
    if result is not None:
        if not isinstance(result, list) or len(result) not in (2, 3):
            raise ValueError("an attempt's result is [reward, turns] or [reward, turns, payload]")
        res = EpisodeResult(
            _conv.structure(result[0], float),
            _conv.structure(result[1], int),
            result[2] if len(result) == 3 else None,
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
    return loads(data, LedgerSnapshot, LEDGER_FILE)
