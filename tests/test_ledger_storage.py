"""RecoveryLedger's column storage: no garbage-collected object per attempt, derived rollout IDs,
and attempt views that keep their last values once the attempt ends."""

from __future__ import annotations

import gc
import types

import pytest

from gymckpt.runtime import AttemptState, EpisodeResult, RecoveryLedger

R = EpisodeResult(0.5, 3)


def _m(ledger: RecoveryLedger, fn):  # type: ignore[no-untyped-def]
    return ledger.barrier.mutate_nowait(fn)


def _busy_ledger(rows: int) -> RecoveryLedger:
    """``rows`` rows of 4: one slot reserved, one dispatched, one completed, one refused."""
    ledger = RecoveryLedger(group_size=4)

    def fill() -> None:
        for r in range(rows):
            ledger.reserve_row(r)
            ids = [f"{r}-1", f"{r}-2", f"{r}-3"]
            ledger.mark_dispatched(ids, f"gym-{r % 3}", 1)
            ledger.complete(f"{r}-2", 1, R)
            ledger.refuse(f"{r}-3")

    _m(ledger, fill)
    return ledger


# Reached through any object's class or a callback: the program, not what the ledger holds.
_SHARED = (type, types.FunctionType, types.ModuleType)


def _tracked_reachable(root: object) -> int:
    """Objects the cyclic collector tracks, reachable from ``root`` (what a collection walks),
    after a full collection (which untracks tuples and dicts of untracked atoms); the program's
    classes, functions and modules it reaches are not counted or followed."""
    gc.collect()
    seen = {id(root)}
    stack = [root]
    while stack:
        for ref in gc.get_referents(stack.pop()):
            if gc.is_tracked(ref) and id(ref) not in seen and not isinstance(ref, _SHARED):
                seen.add(id(ref))
                stack.append(ref)
    return len(seen)


def _every_kind_of_state(rows: int) -> tuple[RecoveryLedger, RecoveryLedger]:
    """A ledger (``rows`` rows of 4, plus orphans) holding something in every per-attempt and
    per-row structure — reserved, dispatched, completed, refused; failed and re-sent (spent
    attempts), abandoned and orphaned (retire queue), trained and dropped rows — and the ledger
    restored from its snapshot, which adds restored Gym state, claimed and unclaimed."""
    from gymckpt.runtime import EpisodeRecord

    ledger = _busy_ledger(rows)

    def more() -> None:
        for r in range(rows):
            kind = r % 5
            if kind == 0:
                ledger.fail(f"{r}-1", 1, "infra", "reset")
            elif kind == 1:
                ledger.abandon([f"{r}-1"])
            elif kind == 2:
                ledger.drop_row(r)
            elif kind == 3:
                ledger.mark_dispatched([f"{r}-0", f"{r}-3"], "gym-1", 1)
                for sl in (0, 1, 3):
                    ledger.complete(f"{r}-{sl}", 1, R)
        ledger.record_orphans([f"orphan-{r}" for r in range(rows)], "gym-2", restored=True)
        ledger.take_ready(rows)

    _m(ledger, more)
    exported = [
        EpisodeRecord(f"{r}-1", "calendar", f"gym-{r % 3}", (f"{r}-1/t0",))
        for r in range(4, rows, 5)
    ]
    restored, summary = RecoveryLedger.from_snapshot(ledger.to_snapshot(), exported)
    claimed = [f"{r}-1-a1" for r in range(4, rows, 10)]

    def claim() -> None:
        for rid in claimed:
            att = restored.get(rid)
            assert att is not None and att.restored is not None
            restored.mark_dispatched([rid], att.restored.instance, 2)

    _m(restored, claim)
    stats = restored.statistics()
    assert summary.restored == len(exported) and stats.unclaimed == len(exported) - len(claimed)
    assert stats.retire_queue >= rows and ledger.statistics().rows_trained == rows // 5
    return ledger, restored


def test_the_collector_walks_nothing_per_attempt() -> None:
    small, large = _every_kind_of_state(50), _every_kind_of_state(5000)
    assert large[0].statistics().attempts >= 99 * small[0].statistics().attempts
    for a, b in zip(small, large, strict=True):
        assert _tracked_reachable(b) == _tracked_reachable(a) < 100


def test_holding_attempts_adds_no_tracked_object_per_attempt() -> None:
    """What a full collection walks does not grow with the attempts held (< 0.01 per attempt)."""
    gc.collect()
    before = len(gc.get_objects())
    held = _every_kind_of_state(2500)
    gc.collect()
    added = len(gc.get_objects()) - before
    attempts = held[0].statistics().attempts + held[1].statistics().attempts
    assert attempts == 12_000 and added < 0.01 * attempts, (added, attempts)


def test_only_canonical_rollout_ids_name_attempts() -> None:
    ledger = RecoveryLedger(group_size=2)
    _m(ledger, lambda: ledger.reserve_row(12))
    _m(ledger, lambda: ledger.mark_dispatched(["12-0"], "gym-0", 1))
    _m(ledger, lambda: ledger.fail("12-0", 1, "infra", "x"))
    assert ledger.get("12-0-a1") is not None and ledger.get("12-1") is not None
    for bad in (
        "012-1",
        "12-01",
        "12-1-a0",
        "12-0-a01",
        " 12-1",
        "12-1 ",
        "+12-1",
        "12_0-1",
        "12-0-a",
        "12-0-b1",
        "12",
        "",
        "12-2",
        "12-0",
        "-12-1",
        "12--1",
        "١٢-1",
    ):
        assert ledger.get(bad) is None, bad
        assert not ledger.is_in_flight(bad)


def test_a_held_view_is_the_same_object_and_keeps_its_end() -> None:
    ledger = RecoveryLedger(group_size=2, max_row_attempts=2)
    first = _m(ledger, lambda: ledger.reserve_row(0))
    assert ledger.get("0-0") is first[0]
    _m(ledger, lambda: ledger.mark_dispatched(["0-0", "0-1"], "gym-1", 7))
    nxt = _m(ledger, lambda: ledger.fail("0-0", 7, "infra", "reset"))
    # the failed attempt's view stays what it was; its slot now holds attempt 1
    assert (first[0].state, first[0].failure, first[0].replica) == (
        AttemptState.FAILED,
        "infra: reset",
        "gym-1",
    )
    assert first[0].rollout_id == "0-0" and nxt is not None and nxt.rollout_id == "0-0-a1"
    assert nxt.state is AttemptState.RESERVED and nxt.replica is None and nxt.gate_id is None
    _m(ledger, lambda: ledger.complete("0-1", 7, R))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0-a1"], "gym-0", 8))
    _m(ledger, lambda: ledger.complete("0-0-a1", 8, R))
    (group,) = _m(ledger, lambda: ledger.take_ready(5))
    assert group.rollout_ids == ("0-0-a1", "0-1") and group.results == (R, R)
    # the block is recycled for the next row; old views still read their own values
    _m(ledger, lambda: ledger.reserve_row(1))
    assert (first[1].rollout_id, first[1].state, first[1].result) == (
        "0-1",
        AttemptState.COMPLETED,
        R,
    )
    assert ledger.get("1-1") is not first[1] and ledger.get("0-1") is None


def test_a_dropped_row_frees_its_slots_and_queues_what_gym_holds() -> None:
    ledger = RecoveryLedger(group_size=3)
    _m(ledger, lambda: ledger.reserve_row(4))
    _m(ledger, lambda: ledger.mark_dispatched(["4-0", "4-2"], "gym-0", 1))
    held = ledger.get("4-2")
    _m(ledger, lambda: ledger.drop_row(4))
    assert held is not None and held.state is AttemptState.DISPATCHED  # as it was dropped
    assert ledger.held_by("gym-0") == frozenset()
    assert sorted(i.rollout_id for i in ledger.retire_queue()["gym-0"]) == ["4-0", "4-2"]
    _m(ledger, lambda: ledger.reserve_row(5))
    assert ledger.statistics().attempts == 3
    with pytest.raises(ValueError, match="already in the ledger"):
        _m(ledger, lambda: ledger.reserve_row(4))


def test_snapshot_bytes_equal_the_snapshot_record_dumped() -> None:
    from gymckpt.runtime import EpisodeRecord
    from gymckpt.runtime._ledger import dump_ledger_snapshot, load_ledger_snapshot

    ledger = _busy_ledger(40)
    _m(ledger, lambda: ledger.fail("3-1", 1, "infra", "x"))
    _m(ledger, lambda: ledger.drop_row(5))
    _m(ledger, lambda: ledger.complete("9-1", 1, EpisodeResult(1.0, 2, {"moves": [1, 2]})))
    assert ledger.snapshot_bytes() == dump_ledger_snapshot(ledger.to_snapshot())
    restored, summary = RecoveryLedger.from_snapshot(
        load_ledger_snapshot(ledger.snapshot_bytes()),
        [EpisodeRecord("7-1", "calendar", "gym-1", ("7-1/t0", "7-1/t1"))],
    )
    assert summary.restored == 1 and restored.get("7-1-a1").unclaimed  # type: ignore[union-attr]
    assert restored.snapshot_bytes() == dump_ledger_snapshot(restored.to_snapshot())
