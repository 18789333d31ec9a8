"""The exactly-once judge shared by the demo and the simulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gymckpt.app.verdict import judge, snapshot_sentinels
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.runtime import (
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    RecoveryLedger,
    SnapshotStore,
    records_digest,
)
from gymckpt.runtime._shared import (
    GYM_STATE_DIR,
    LEDGER_FILE,
    MANIFEST_VERSION,
    RECORDS_FILE,
    AgentRecords,
    GymManifest,
    SessionRecord,
    SessionRecords,
    dump_ledger_snapshot,
    dump_records,
)

CONFIG = CalendarConfig(turns=(2, 3), mutation_p=0.0)


def test_a_clean_lineage_is_exactly_once() -> None:
    v = judge([(1, [0, 1]), (2, [2, 3])], 4, None, seed=0, config=CONFIG, group_size=2)
    assert v.ok and v.violations() == []
    assert (v.rows_trained, v.steps, v.duplicates, v.lost) == (4, 2, 0, ())


def test_duplicates_losses_and_repeated_steps_are_each_named() -> None:
    v = judge([(1, [0, 1]), (2, [1]), (2, [3])], 5, None, seed=0, config=CONFIG, group_size=2)
    assert not v.ok
    assert v.rows_twice == (1,) and v.duplicates == 1
    assert v.lost == (2, 4)
    assert v.steps_trained_twice == 1 and not v.steps_in_order
    said = "\n".join(v.violations())
    assert "1 rows trained more than once: [1]" in said
    assert "2 rows lost: [2, 4]" in said
    assert "lineage steps are not 1..n" in said


def test_sentinels_are_judged_against_the_plans() -> None:
    mutating = CalendarConfig(turns=(2, 3), mutation_p=1.0)
    v = judge([(1, [0])], 1, None, seed=0, config=mutating, group_size=2)
    assert v.sentinels_expected > 0 and len(v.sentinels_missing) == v.sentinels_expected
    assert not v.ok and "sentinels missing" in "\n".join(v.violations())


def _snapshot(tmp_path: Path, calendar: bytes) -> Path:
    """A published snapshot of one instance whose calendar committed ``calendar``."""
    store = SnapshotStore(tmp_path / "snapshots")
    staging = store.begin("c1")
    participants = []
    for server, kind, data in [
        ("agent", "simple_agent", dump_records(AgentRecords("agent", "simple_agent", "c1", ()))),
        ("calendar", "environment", calendar),
    ]:
        rel = f"{GYM_STATE_DIR}/gym-0/{server}"
        (staging / rel).mkdir(parents=True)
        (staging / rel / RECORDS_FILE).write_bytes(data)
        participants.append(ParticipantRecord(server, kind, rel, records_digest(staging / rel)))
    manifest = GymManifest(
        MANIFEST_VERSION, "c1", (InstanceRecord("gym-0", tuple(participants)),), ()
    )
    ledger = dump_ledger_snapshot(RecoveryLedger(group_size=2).to_snapshot())
    return store.publish(staging, manifest, {LEDGER_FILE: ledger}).path


def test_the_sentinels_are_counted_from_the_committed_calendar_records(tmp_path: Path) -> None:
    def session(key: str, *sentinels: str) -> SessionRecord:
        return SessionRecord(key, f"{key}-a0", 0, {"events": [{"sentinel": s} for s in sentinels]})

    calendar = SessionRecords(
        "calendar",
        "environment",
        "c1",
        (),
        True,
        (session("0-0", "a", "b"), session("0-1", "b")),
    )
    counts, failed = snapshot_sentinels(_snapshot(tmp_path, dump_records(calendar)))
    assert counts == {"a": 1, "b": 2} and failed == set()
    assert snapshot_sentinels(
        _snapshot(tmp_path / "2", dump_records(calendar)), calendar=False
    ) == ({}, set())


def test_calendar_records_that_do_not_parse_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = _snapshot(tmp_path, b'{"participant": "calendar", "sessions": 3}')
    with pytest.raises(ManifestError, match=r"gym/gym-0/calendar/records\.json: .*\$\.sessions"):
        snapshot_sentinels(path)
