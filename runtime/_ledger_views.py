"""The ledger's views: ``Attempt`` and the read-only mappings over the column store.

The store keeps no object per attempt (``_ledger_columns``); a view is what a caller holds
instead. It reads one slot through ``SlotReader`` — the store's read side, nothing that
writes — for as long as its attempt is current; when the attempt ends, the store detaches the
view (``detach``) with the values of that moment, and the view keeps them as a record of what
happened. The store hands out one view per slot while someone holds it (a weak cache), so a
caller may compare views by identity.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any, Protocol, cast, final

import attrs

from ._ledger_records import AttemptState, EpisodeResult, RestoredGymState

__all__ = ["Attempt", "AttemptIndex", "RowIndex", "RowView", "SlotReader", "detach"]


class SlotReader(Protocol):
    """What a view reads of the column store, by slot index (``LedgerColumns``)."""

    group_size: int

    def slot_of(self, rollout_id: str) -> int: ...
    def view(self, s: int) -> Attempt: ...
    def block_views(self, b: int) -> list[Attempt]: ...
    def rid(self, s: int) -> str: ...
    def row_at(self, s: int) -> int: ...
    def attempt_at(self, s: int) -> int: ...
    def state_at(self, s: int) -> AttemptState: ...
    def replica_at(self, s: int) -> str | None: ...
    def gate_at(self, s: int) -> int | None: ...
    def restored_at(self, s: int) -> RestoredGymState | None: ...
    def unclaimed_at(self, s: int) -> bool: ...
    def result_at(self, s: int) -> EpisodeResult | None: ...
    def fields_at(self, s: int) -> tuple[Any, ...]: ...
    def live_slots(self) -> Iterator[int]: ...
    def n_current(self) -> int: ...
    def rows(self) -> Collection[int]: ...
    def block_of(self, row: int) -> int: ...
    def done_in(self, b: int) -> int: ...


@final
class Attempt:
    """One attempt, as a read-only view of the ledger's columns. Change it only through the
    ledger.

    While you hold a view, the ledger hands out the same object for the same attempt
    (``ledger.get(rid) is att``). Once the attempt ends (completed and trained, failed,
    abandoned, its row dropped) the view keeps the values it had at that moment, as a record
    of what happened, and no longer follows the slot (which the ledger reuses).
    """

    __slots__ = ("__weakref__", "_cols", "_final", "_slot")

    _cols: SlotReader | None
    _slot: int
    _final: tuple[Any, ...]

    def __init__(self, cols: SlotReader, slot: int) -> None:
        self._cols = cols
        self._slot = slot
        self._final = ()

    def _fields(self) -> tuple[Any, ...]:
        c = self._cols
        return self._final if c is None else c.fields_at(self._slot)

    @property
    def row(self) -> int:
        c = self._cols
        return self._final[0] if c is None else c.row_at(self._slot)

    @property
    def slot(self) -> int:
        c = self._cols
        return self._final[1] if c is None else self._slot % c.group_size

    @property
    def attempt(self) -> int:
        c = self._cols
        return self._final[2] if c is None else c.attempt_at(self._slot)

    @property
    def rollout_id(self) -> str:
        c = self._cols
        return self._final[3] if c is None else c.rid(self._slot)

    @property
    def state(self) -> AttemptState:
        c = self._cols
        return self._final[4] if c is None else c.state_at(self._slot)

    @property
    def replica(self) -> str | None:
        c = self._cols
        if c is None:
            return cast("str | None", self._final[5])
        return c.replica_at(self._slot)

    @property
    def gate_id(self) -> int | None:
        c = self._cols
        if c is None:
            return cast("int | None", self._final[6])
        return c.gate_at(self._slot)

    @property
    def restored(self) -> RestoredGymState | None:
        c = self._cols
        if c is None:
            return cast("RestoredGymState | None", self._final[7])
        return c.restored_at(self._slot)

    @property
    def unclaimed(self) -> bool:
        c = self._cols
        return bool(self._final[8]) if c is None else c.unclaimed_at(self._slot)

    @property
    def result(self) -> EpisodeResult | None:
        c = self._cols
        if c is None:
            return cast("EpisodeResult | None", self._final[9])
        return c.result_at(self._slot)

    @property
    def failure(self) -> str | None:
        """Why the attempt failed (``"infra: …"`` / ``"data: …"``), once it has."""
        return None if self._cols is not None else cast("str | None", self._final[10])

    def __repr__(self) -> str:
        f = self._fields()
        return f"<Attempt {f[3]} {f[4].value} replica={f[5]!r} gate_id={f[6]!r}>"


@final
class AttemptIndex(Mapping[str, Attempt]):
    """The current attempts by rollout ID: a read-only mapping of views over the columns
    (no entry per attempt is stored). ``get`` parses the ID; iteration walks rows in order."""

    __slots__ = ("_cols",)

    def __init__(self, cols: SlotReader) -> None:
        self._cols = cols

    def get(self, key: object, default: Any = None) -> Any:
        c = self._cols
        s = c.slot_of(key) if isinstance(key, str) else -1
        return default if s < 0 else c.view(s)

    def __getitem__(self, key: str) -> Attempt:
        att = self.get(key)
        if att is None:
            raise KeyError(key)
        return cast(Attempt, att)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._cols.slot_of(key) >= 0

    def __iter__(self) -> Iterator[str]:
        c = self._cols
        for s in c.live_slots():
            yield c.rid(s)

    def __len__(self) -> int:
        return self._cols.n_current()


@final
@attrs.frozen
class RowView:
    """One row in flight: its current attempts (views) in slot order, and how many completed."""

    slots: list[Attempt]
    completed: int


@final
class RowIndex(Mapping[int, RowView]):
    """Rows in flight, each with its current attempts (views), in reservation order."""

    __slots__ = ("_cols",)

    def __init__(self, cols: SlotReader) -> None:
        self._cols = cols

    def __getitem__(self, row: int) -> RowView:
        c = self._cols
        b = c.block_of(row)
        return RowView(c.block_views(b), c.done_in(b))

    def __iter__(self) -> Iterator[int]:
        return iter(self._cols.rows())

    def __len__(self) -> int:
        return len(self._cols.rows())


def detach(view: Attempt, fields: tuple[Any, ...]) -> None:
    """The view's attempt ended: from now on it reads ``fields`` (``SlotReader.fields_at``,
    with the final state and failure), not the slot the store reuses."""
    view._final = fields
    view._cols = None
