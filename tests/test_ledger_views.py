"""The ledger's views over a store: an ``Attempt`` follows its slot while current and keeps the
values of its end once detached; the index mappings read only what they are asked for. Tested
against a small fake store (``SlotReader``), so the views' own rules are what is checked."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import pytest

from gymckpt.runtime import AttemptState, EpisodeResult, RestoredGymState
from gymckpt.runtime._ledger_views import Attempt, AttemptIndex, RowIndex, detach


class FakeStore:
    """Two rows of two slots, values in plain dicts; counts what it was asked."""

    group_size = 2

    def __init__(self) -> None:
        self.rows_ = {10: 0, 11: 1}
        self.attempt = {0: 0, 1: 2, 2: 0, 3: 0}
        self.state = dict.fromkeys(range(4), AttemptState.RESERVED)
        self.replica: dict[int, str | None] = dict.fromkeys(range(4))
        self.views: dict[int, Attempt] = {}
        self.located: list[str] = []

    def slot_of(self, rollout_id: str) -> int:
        self.located.append(rollout_id)
        for s in range(4):
            if self.rid(s) == rollout_id:
                return s
        return -1

    def view(self, s: int) -> Attempt:
        return self.views.setdefault(s, Attempt(self, s))

    def block_views(self, b: int) -> list[Attempt]:
        return [self.view(s) for s in (2 * b, 2 * b + 1)]

    def rid(self, s: int) -> str:
        a = self.attempt[s]
        return f"{self.row_at(s)}-{s % 2}" + (f"-a{a}" if a else "")

    def row_at(self, s: int) -> int:
        return 10 + s // 2

    def attempt_at(self, s: int) -> int:
        return self.attempt[s]

    def state_at(self, s: int) -> AttemptState:
        return self.state[s]

    def replica_at(self, s: int) -> str | None:
        return self.replica[s]

    def gate_at(self, s: int) -> int | None:
        return 7 if self.replica[s] else None

    def restored_at(self, s: int) -> RestoredGymState | None:
        return RestoredGymState("gym-1", "calendar", "10-1-a1") if s == 1 else None

    def unclaimed_at(self, s: int) -> bool:
        return s == 1

    def result_at(self, s: int) -> EpisodeResult | None:
        return EpisodeResult(1.0, 3) if self.state[s] is AttemptState.COMPLETED else None

    def fields_at(self, s: int) -> tuple[Any, ...]:
        v = self.view(s)
        return (
            v.row,
            v.slot,
            v.attempt,
            v.rollout_id,
            v.state,
            v.replica,
            v.gate_id,
            v.restored,
            v.unclaimed,
            v.result,
            None,
        )

    def live_slots(self) -> Iterator[int]:
        yield from range(4)

    def n_current(self) -> int:
        return 4

    def rows(self) -> Collection[int]:
        return self.rows_.keys()

    def block_of(self, row: int) -> int:
        return self.rows_[row]

    def done_in(self, b: int) -> int:
        return sum(self.state[s] is AttemptState.COMPLETED for s in (2 * b, 2 * b + 1))


def test_a_live_view_follows_its_slot() -> None:
    store = FakeStore()
    att = store.view(1)
    assert (att.row, att.slot, att.attempt, att.rollout_id) == (10, 1, 2, "10-1-a2")
    assert att.restored is not None and att.unclaimed and att.failure is None
    store.state[1], store.replica[1] = AttemptState.DISPATCHED, "gym-1"
    assert (att.state, att.replica, att.gate_id) == (AttemptState.DISPATCHED, "gym-1", 7)
    assert repr(att) == "<Attempt 10-1-a2 dispatched replica='gym-1' gate_id=7>"


def test_a_detached_view_keeps_the_values_of_its_end() -> None:
    store = FakeStore()
    att = store.view(2)
    store.state[2], store.replica[2] = AttemptState.DISPATCHED, "gym-0"
    fields = list(store.fields_at(2))
    fields[4], fields[10] = AttemptState.FAILED, "infra: reset"
    detach(att, tuple(fields))
    store.attempt[2], store.state[2], store.replica[2] = 1, AttemptState.RESERVED, None
    assert (att.rollout_id, att.state, att.replica, att.gate_id) == (
        "11-0",
        AttemptState.FAILED,
        "gym-0",
        7,
    )
    assert (att.failure, att.unclaimed, att.result) == ("infra: reset", False, None)
    assert repr(att) == "<Attempt 11-0 failed replica='gym-0' gate_id=7>"


def test_the_attempt_index_locates_only_what_it_is_asked() -> None:
    store = FakeStore()
    index = AttemptIndex(store)
    assert index.get("10-1-a2") is store.view(1) and index["11-1"] is store.view(3)
    assert "10-1" not in index and index.get(5) is None and index.get("x", "d") == "d"
    with pytest.raises(KeyError):
        index["10-1"]
    assert store.located == ["10-1-a2", "11-1", "10-1", "x", "10-1"]
    assert list(index) == ["10-0", "10-1-a2", "11-0", "11-1"] and len(index) == 4


def test_the_row_index_gives_each_row_its_views_and_completions() -> None:
    store = FakeStore()
    store.state[3] = AttemptState.COMPLETED
    rows = RowIndex(store)
    assert list(rows) == [10, 11] and len(rows) == 2
    assert rows[11].slots == [store.view(2), store.view(3)] and rows[11].completed == 1
    assert rows[11].slots[1].result == EpisodeResult(1.0, 3)
    with pytest.raises(KeyError):
        rows[12]
