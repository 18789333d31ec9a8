"""LedgerColumns, the ledger's storage: each slot-level step keeps the store's own invariants
(state counts, held lists, the unclaimed count, ready rows), blocks are recycled, views detach
with the values of their end, and ``load`` builds a store or refuses what does not fit."""

from __future__ import annotations

from collections import Counter

import pytest

from gymckpt.runtime import AttemptState, EpisodeResult, RestoredGymState, RetireItem
from gymckpt.runtime._ledger_columns import LedgerColumns, SlotLoad

R = EpisodeResult(1.5, 4)


def check(cols: LedgerColumns) -> None:
    """The store's invariants, from its public reads: counts match the states, each instance
    holds exactly its DISPATCHED attempts and its unclaimed restored ones (by the ID Gym knows),
    ``unclaimed_count`` counts them, a row is ready exactly when all of its slots completed."""
    states: Counter[AttemptState] = Counter()
    held: dict[str, set[str]] = {}
    unclaimed = 0
    ready = 0
    for row, view in cols.row_views.items():
        for att in view.slots:
            states[att.state] += 1
            if att.state is AttemptState.DISPATCHED:
                assert att.replica is not None
                held.setdefault(att.replica, set()).add(att.rollout_id)
            if att.unclaimed:
                assert att.state is AttemptState.RESERVED and att.restored is not None
                held.setdefault(att.restored.instance, set()).add(att.restored.from_rollout_id)
                unclaimed += 1
        completed = sum(a.state is AttemptState.COMPLETED for a in view.slots)
        assert view.completed == completed
        ready += completed == cols.group_size
        assert cols.is_known_row(row)
    for state in AttemptState:
        assert cols.count(state) == states[state]
    assert cols.n_current() == sum(states.values())
    for instance, ids in held.items():
        assert cols.held_ids(instance) == ids
    assert {rid: inst for rid, inst in cols.dispatched()} == {
        rid: inst for inst, ids in held.items() for rid in ids if cols.slot_of(rid) >= 0
    }
    assert cols.unclaimed_count == unclaimed == len(cols.unclaimed_views())
    assert cols.ready_count == ready


def test_a_reserved_block_is_attempt_zero_everywhere() -> None:
    cols = LedgerColumns(3)
    b = cols.reserve(7)
    views = cols.block_views(b)
    assert [(v.row, v.slot, v.attempt, v.state) for v in views] == [
        (7, k, 0, AttemptState.RESERVED) for k in range(3)
    ]
    assert [v.rollout_id for v in views] == ["7-0", "7-1", "7-2"]
    assert cols.view(cols.slot_of("7-1")) is views[1]
    assert cols.is_known_row(7) and not cols.is_known_row(8)
    check(cols)


def test_dispatch_holds_once_and_complete_makes_the_row_ready() -> None:
    cols = LedgerColumns(2)
    cols.reserve(0)
    s0, s1 = cols.slot_of("0-0"), cols.slot_of("0-1")
    cols.dispatch([s0, s1, s0], "gym-0", 5)  # named twice: dispatched once
    assert cols.count(AttemptState.DISPATCHED) == 2
    assert cols.held_slots("gym-0") == [s1, s0]  # newest first
    assert cols.fenced_slot("0-0", 5) == s0
    assert cols.fenced_slot("0-0", 4) == -1  # another dispatch's reply is stale
    check(cols)
    cols.complete(s0, 1.0, 2, {"moves": [1]})
    assert cols.fenced_slot("0-0", 5) == -1 and cols.in_flight_slot("0-0") == -1
    assert cols.ready_count == 0
    cols.complete(s1, 3.0, 4, None)
    assert cols.ready_count == 1 and cols.held_slots("gym-0") == []
    check(cols)
    (group,) = cols.take_ready(5)
    assert group.rollout_ids == ("0-0", "0-1")
    assert group.results == (EpisodeResult(1.0, 2, {"moves": [1]}), EpisodeResult(3.0, 4))
    assert list(cols.trained()) == [0] and cols.n_current() == 0
    check(cols)


def test_an_ended_attempt_detaches_its_view_and_the_slot_renews() -> None:
    cols = LedgerColumns(1)
    cols.reserve(3)
    s = cols.slot_of("3-0")
    first = cols.view(s)
    cols.dispatch([s], "gym-1", 1)
    cols.end(s, AttemptState.FAILED, "infra: reset")
    assert cols.count(AttemptState.DISPATCHED) == 0 and cols.ended(AttemptState.FAILED) == 1
    assert cols.spend(s) == 1 and cols.spend(s) == 2  # spending is the caller's rule
    nxt = cols.renew(s)
    assert nxt is not first and nxt.rollout_id == "3-0-a1"
    assert (nxt.state, nxt.replica, nxt.gate_id) == (AttemptState.RESERVED, None, None)
    assert (first.rollout_id, first.state, first.replica, first.failure) == (
        "3-0",
        AttemptState.FAILED,
        "gym-1",
        "infra: reset",
    )
    assert cols.slot_of("3-0") == -1 and cols.slot_of("3-0-a1") == s
    assert cols.spent(3, 0) == 2 and cols.spent(3, 1) == 0
    check(cols)


def test_a_failed_row_queues_what_gym_holds_and_its_block_is_reused() -> None:
    cols = LedgerColumns(2)
    b = cols.reserve(0)
    old = cols.block_views(b)
    cols.dispatch([cols.slot_of("0-1")], "gym-0", 1)
    cols.fail_row(0)
    assert list(cols.failed()) == [0] and list(cols.rows()) == []
    assert list(cols.retire_items()) == [RetireItem("0-1", "gym-0")]  # 0-0 never reached Gym
    assert old[1].state is AttemptState.DISPATCHED and old[1].replica == "gym-0"
    assert cols.reserve(1) == b  # recycled
    assert cols.view(cols.slot_of("1-1")) is not old[1] and old[1].rollout_id == "0-1"
    cols.forget_retired(["0-1", "never-queued"])
    assert cols.retire_count == 0
    check(cols)


def _restored_store() -> tuple[LedgerColumns, int]:
    restored = RestoredGymState("gym-1", "calendar", "5-0", ("5-0/t0",))
    cols = LedgerColumns.load(
        2, [(5, [SlotLoad(0, 1, restored=restored, unclaimed=True), SlotLoad(1, 0)])]
    )
    return cols, cols.slot_of("5-0-a1")


def test_a_restored_attempt_is_held_unclaimed_under_the_exported_id() -> None:
    cols, s = _restored_store()
    assert cols.pinned_to(s) == "gym-1" and cols.pinned_to(cols.slot_of("5-1")) is None
    assert cols.held_ids("gym-1") == {"5-0"} and cols.unclaimed_count == 1
    check(cols)
    cols.dispatch([s], "gym-1", 2)  # the claim
    assert cols.held_ids("gym-1") == {"5-0-a1"} and cols.unclaimed_count == 0
    check(cols)
    cols.refuse(s)  # refused: unclaimed again, held under the exported ID
    assert cols.held_ids("gym-1") == {"5-0"} and cols.unclaimed_count == 1
    check(cols)


def test_retire_later_names_every_id_gym_may_hold() -> None:
    cols, s = _restored_store()
    cols.retire_later(s)  # unclaimed: Gym holds the exported episode, retired as restored
    assert list(cols.retire_items()) == [RetireItem("5-0", "gym-1", restored=True)]
    cols.forget_retired(["5-0"])
    cols.dispatch([s], "gym-1", 2)
    cols.retire_later(s)  # a claim: its own ID, and the exported one (plain retire)
    assert sorted(cols.retire_items(), key=lambda i: i.rollout_id) == [
        RetireItem("5-0", "gym-1"),
        RetireItem("5-0-a1", "gym-1"),
    ]


def test_unpin_and_retire_plainly_when_the_replica_died() -> None:
    cols, s = _restored_store()
    cols.record_orphans(["9-0"], "gym-1", restored=True)
    cols.unpin(s)
    assert cols.pinned_to(s) is None and cols.held_slots("gym-1") == []
    assert cols.unclaimed_count == 0
    cols.retire_plainly("gym-1")
    assert sorted(cols.retire_items(), key=lambda i: i.rollout_id) == [
        RetireItem("5-0", "gym-1"),
        RetireItem("9-0", "gym-1"),
    ]
    cols.retire_plainly("gym-never-seen")
    check(cols)


def test_load_builds_completed_rows_ready_and_keeps_their_fields() -> None:
    done = [SlotLoad(k, 2, EpisodeResult(0.5, k, [k]), replica="gym-3", gate_id=9) for k in (1, 0)]
    cols = LedgerColumns.load(
        2,
        [(4, done)],
        trained=[0, 2, 1],
        failed=[3],
        spent=[(4, 1, 2)],
        retire=[RetireItem("3-0", "gym-3", restored=True)],
    )
    assert cols.ready_count == 1 and cols.count(AttemptState.COMPLETED) == 2
    att = cols.view(cols.slot_of("4-1-a2"))
    assert (att.replica, att.gate_id, att.result) == ("gym-3", 9, EpisodeResult(0.5, 1, [1]))
    assert list(cols.trained()) == [0, 1, 2] and list(cols.failed()) == [3]
    assert list(cols.spent_in_flight()) == [(4, 1, 2)]
    assert list(cols.retire_items()) == [RetireItem("3-0", "gym-3", restored=True)]
    assert [v[:4] for v in cols.current()] == [
        (4, 0, 2, AttemptState.COMPLETED),
        (4, 1, 2, AttemptState.COMPLETED),
    ]
    check(cols)


@pytest.mark.parametrize(
    ("rows", "spent", "retire", "message"),
    [
        ([(1, [SlotLoad(0, 0)])], (), (), r"row 1 has slots \[0\], expected 0\.\.1"),
        ([(1, [SlotLoad(0, 0), SlotLoad(0, 1)])], (), (), r"row 1 has slots \[0, 0\]"),
        ([(1, [SlotLoad(0, 0), SlotLoad(1, 0)])] * 2, (), (), "row 1 is stored twice"),
        ([], [(1, 2, 1)], (), r"spent attempts of row 1 slot 2, but a row has slots 0\.\.1"),
        (
            [(1, [SlotLoad(0, 0), SlotLoad(1, 0)])],
            (),
            [RetireItem("1-1", "gym-0")],
            "1-1 is queued for retirement and also current",
        ),
    ],
)
def test_load_refuses_what_does_not_fit(
    rows: list[tuple[int, list[SlotLoad]]],
    spent: list[tuple[int, int, int]],
    retire: list[RetireItem],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        LedgerColumns.load(2, rows, spent=spent, retire=retire)


def test_a_store_has_at_least_one_slot_per_row() -> None:
    with pytest.raises(ValueError, match="group_size"):
        LedgerColumns(0)
