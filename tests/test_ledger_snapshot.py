"""The ledger's snapshot: ``ledger.json`` round-trips a ledger exactly, the one-pass writer
writes the same bytes as the record, the restore rules (S11) apply to DISPATCHED attempts only,
and every snapshot that does not fit is refused with a ``ManifestError`` naming what differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import orjson
import pytest

from gymckpt.runtime import (
    AttemptState,
    EpisodeRecord,
    EpisodeResult,
    ManifestError,
    NotPlainData,
    RecoveryLedger,
    RestoreSummary,
)
from gymckpt.runtime._ledger_snapshot import (
    LEDGER_SNAPSHOT_VERSION,
    dump_ledger_snapshot,
    ledger_snapshot_bytes,
    load_ledger_snapshot,
    restore_columns,
)
from gymckpt.runtime._snapshot_format import LEDGER_COLUMNS, _attempt_arrays

R = EpisodeResult(1.0, 2)


def _m(ledger: RecoveryLedger, fn: Callable[[], Any]) -> Any:
    return ledger.barrier.mutate_nowait(fn)


def _ledger() -> RecoveryLedger:
    """Rows 0..5 of 2 in every state a snapshot holds: reserved, dispatched, completed (with and
    without a payload), a failed and re-sent attempt, trained and dropped rows, the retire
    queue, an orphan queued as restored."""
    ledger = RecoveryLedger(group_size=2, max_row_attempts=3, data_failure_budget=5)

    def fill() -> None:
        for r in range(6):
            ledger.reserve_row(r)
        ledger.mark_dispatched(["0-0", "0-1", "1-0", "2-0", "2-1", "3-0"], "gym-0", 1)
        ledger.complete("0-0", 1, R)
        ledger.complete("0-1", 1, EpisodeResult(0.5, 3, {"moves": [1, 2]}))
        ledger.fail("1-0", 1, "data", "bad row")
        ledger.complete("2-0", 1, R)
        ledger.complete("2-1", 1, R)
        ledger.take_ready(1)  # row 0 trained
        ledger.drop_row(4)
        ledger.record_orphans(["9-0"], "gym-1", restored=True)

    _m(ledger, fill)
    return ledger


def test_the_snapshot_round_trips_exactly() -> None:
    ledger = _ledger()
    snap = ledger.to_snapshot()
    assert snap.version == LEDGER_SNAPSHOT_VERSION
    assert (snap.trained, snap.failed, snap.spent) == (((0, 0),), ((4, 4),), ((1, 0, 1),))
    assert [i.rollout_id for i in snap.retire] == ["9-0"]  # row 4 never reached Gym
    assert load_ledger_snapshot(dump_ledger_snapshot(snap)) == snap
    assert ledger.snapshot_bytes() == dump_ledger_snapshot(snap)
    again, summary = RecoveryLedger.from_snapshot(load_ledger_snapshot(ledger.snapshot_bytes()))
    # 3-0 was in flight and not exported: re-sent fresh; every other attempt kept as it was
    assert summary == RestoreSummary(
        restored=0, completed_untrained=2, reserved=5, redispatched_fresh=1
    )
    assert again.get("3-0") is None and again.get("3-0-a1") is not None
    assert (again.data_failures, again.next_row) == (1, 6)
    assert again.rows_trained == {0} and again.rows_failed == {4}
    assert again.row_attempts_spent(1, 0) == 1 and again.ready_groups == 1
    assert again.retire_queue() == ledger.retire_queue()
    snap_again = again.to_snapshot()
    assert [a for a in snap_again.attempts if a.row != 3] == [
        a for a in snap.attempts if a.row != 3
    ]


def test_the_one_pass_writer_is_the_record_dumped() -> None:
    ledger = _ledger()
    cols = ledger._cols
    kwargs = {"max_row_attempts": 3, "data_failure_budget": 5, "data_failures": 1, "next_row": 6}
    assert ledger_snapshot_bytes(cols, **kwargs) == dump_ledger_snapshot(ledger.to_snapshot())
    attempts = orjson.loads(ledger.snapshot_bytes())["attempts"]
    # columns: a row per block in reservation order (row 0 was trained, 4 failed), slots
    # implied; row 1 slot 0 is its second attempt, reserved; results are sparse [i, reward,
    # turns] (no payload)
    assert list(attempts) == list(LEDGER_COLUMNS) and attempts["rows"] == [1, 2, 3, 5]
    first = [attempts[c][0] for c in ("attempt", "state", "replica", "gate_id", "unclaimed")]
    assert first == [1, "reserved", None, None, False]
    assert attempts["state"][2:5] == ["completed", "completed", "dispatched"]
    assert attempts["result"] == [[2, 1.0, 2], [3, 1.0, 2]] and attempts["restored"] == []


def test_a_version_1_ledger_of_an_array_per_attempt_restores_the_same_ledger() -> None:
    """The ``ledger.json`` a snapshot of the previous release holds (version 1: an array per
    attempt) restores as version 2's columns do, its row-slot check kept."""
    ledger = _ledger()
    raw = _raw(ledger)
    v1 = dict(raw, version=1, attempts=_attempt_arrays(raw))
    assert v1["attempts"][0] == [1, 0, 1, "reserved", None, None, None, False, None]
    assert v1["attempts"][2] == [2, 0, 0, "completed", "gym-0", 1, None, False, [1.0, 2]]
    old = load_ledger_snapshot(orjson.dumps(v1))
    assert attrs.evolve(old, version=LEDGER_SNAPSHOT_VERSION) == ledger.to_snapshot()
    assert RecoveryLedger.from_snapshot(old)[0].snapshot_bytes() == (
        RecoveryLedger.from_snapshot(ledger.to_snapshot())[0].snapshot_bytes()
    )
    v1["attempts"].pop(2)
    _refused(v1, r"^ledger\.json: row 2 has slots \[1\], expected 0\.\.1")


def test_an_exported_attempt_is_restored_unclaimed_and_others_are_re_sent() -> None:
    ledger = _ledger()
    exported = [EpisodeRecord("3-0", "calendar", "gym-0", ("3-0/t0",))]
    cols, summary = restore_columns(ledger.to_snapshot(), exported)
    assert summary.restored == 1 and summary.redispatched_fresh == 0
    att = cols.view(cols.slot_of("3-0-a1"))
    assert att.state is AttemptState.RESERVED and att.unclaimed
    assert att.restored is not None and att.restored.from_rollout_id == "3-0"
    assert att.restored.capture_keys == ("3-0/t0",)
    assert cols.held_ids("gym-0") == {"3-0"} and cols.row_at(cols.slot_of("3-0-a1")) == 3


def _raw(ledger: RecoveryLedger) -> dict[str, Any]:
    raw: dict[str, Any] = orjson.loads(ledger.snapshot_bytes())
    return raw


def _refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        RecoveryLedger.from_snapshot(load_ledger_snapshot(orjson.dumps(raw)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(version=3), r"^ledger\.json: version 3 found, 1 and 2 supported"),
        (
            lambda r: r["attempts"]["state"].__setitem__(0, "parked"),
            "unknown attempt state 'parked'",
        ),
        (
            lambda r: r["attempts"]["state"].__setitem__(2, "failed"),
            r"attempt 2-0 is failed; only current attempts are stored",
        ),
        (
            lambda r: r["attempts"]["result"].pop(0),
            r"completed attempt 2-0 has no result",
        ),
        (lambda r: r.update(trained=[[3, 1]]), r"bad row range \[3, 1\]"),
        (
            lambda r: r.update(spent=[[1, 2, 1]]),
            r"^ledger\.json: spent attempts of row 1 slot 2, but a row has slots 0\.\.1",
        ),
        (
            lambda r: r["retire"].append({"rollout_id": "5-0", "instance": "gym-0"}),
            r"^ledger\.json: 5-0 is queued for retirement and also current",
        ),
    ],
)
def test_a_restore_refuses_a_snapshot_that_does_not_fit(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    raw = _raw(_ledger())
    change(raw)
    _refused(raw, message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: r["attempts"]["attempt"].pop(),
            r"^ledger\.json: attempts\.attempt: 7 entries, expected 8 \(4 rows of 2 slots\)",
        ),
        (lambda r: r["attempts"]["result"][0].pop(), r"attempts\.result: \[2, 1\.0\] is not"),
        (lambda r: r["attempts"]["result"].append([2, 1.0, 2]), r"attempts\.result: .*, once"),
        (lambda r: r["attempts"]["restored"].append([8, {}]), r"attempts\.restored: .* i < 8"),
        (lambda r: r["attempts"].pop("rows"), r"attempts: columns \[.*\], expected"),
        (lambda r: r["attempts"]["replica"].__setitem__(0, 5), r"AttemptRow @ \$\.attempts\[0\]"),
        (lambda r: r.update(extra=1), "extra"),
        (lambda r: r.pop("next_row"), "next_row"),
    ],
)
def test_the_reader_refuses_a_malformed_file(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    raw = _raw(_ledger())
    change(raw)
    with pytest.raises(ManifestError, match=message):
        load_ledger_snapshot(orjson.dumps(raw))
    with pytest.raises(ManifestError, match="empty"):
        load_ledger_snapshot(b" ")


def test_the_writer_refuses_what_it_could_not_read_back() -> None:
    for result, where in [
        (EpisodeResult(float("inf"), 1), "reward inf is not a finite number"),
        (EpisodeResult(1.0, 1, {"s": {1, 2}}), "payload"),
    ]:
        ledger = RecoveryLedger(group_size=1)
        _m(ledger, lambda ledger=ledger: ledger.reserve_row(0))
        _m(ledger, lambda ledger=ledger: ledger.mark_dispatched(["0-0"], "gym-0", 1))
        _m(ledger, lambda ledger=ledger, result=result: ledger.complete("0-0", 1, result))
        with pytest.raises(NotPlainData, match=where):
            dump_ledger_snapshot(ledger.to_snapshot())
