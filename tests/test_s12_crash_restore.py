"""S12 as a real two-process test: SIGKILL after a checkpoint that holds a mutated turn."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from gymckpt.app.demo.main import (
    JOURNAL,
    DemoOptions,
    _phase_cmd,
    _read_journal,
    _run_until_published,
    verdict,
)
from gymckpt.runtime import SnapshotStore, load_snapshot
from gymckpt.runtime._shared import (
    SessionRecord,
    SessionRecords,
    read_snapshot_records,
)

pytestmark = pytest.mark.subprocess


def _calendar_sessions(snapshot_path: Path) -> dict[str, tuple[str, SessionRecord]]:
    snap = load_snapshot(snapshot_path)
    out = {}
    for inst in snap.manifest.instances:
        for part in inst.participants:
            if part.kind == "environment":
                records = read_snapshot_records(snap.path, part.state_dir, SessionRecords)
                for sess in records.sessions:
                    out[sess.rollout_id] = (inst.name, sess)
    return out


def test_sigkill_after_checkpoint_then_restore_is_exactly_once(tmp_path: Path) -> None:
    opts = DemoOptions(
        rows=24,
        group_size=2,
        instances=2,
        seed=7,
        checkpoint_every=1,
        crash_after_checkpoint=1,
        hold_first_mutation=True,
        groups_per_step=2,
        max_rows_in_flight=8,
    )
    rc, killed = _run_until_published(_phase_cmd(opts, tmp_path, 1, 1), timeout_s=120)
    assert killed and rc == -9  # a real SIGKILL

    # Phase one published a snapshot holding a turn right after a calendar mutation.
    published = SnapshotStore(tmp_path / "snapshots").list_complete()
    assert [i.checkpoint_id for i in published] == ["p1-0001"]
    snap = load_snapshot(published[0].path)
    sessions = _calendar_sessions(published[0].path)
    mutated = [
        e
        for e in snap.manifest.episodes
        if e.rollout_id in sessions and sessions[e.rollout_id][1].state["events"]
    ]
    assert mutated, "the held episode must be parked in the snapshot with its mutation"
    held = mutated[0]
    sentinels = [ev["sentinel"] for ev in sessions[held.rollout_id][1].state["events"]]

    # Phase two: a new process restores and finishes.
    done = subprocess.run(
        _phase_cmd(opts, tmp_path, 2, 0), stdin=subprocess.DEVNULL, timeout=120, check=False
    )
    assert done.returncode == 0

    journal = [orjson.loads(line) for line in (tmp_path / JOURNAL).read_bytes().splitlines()]
    claims = [r for r in journal if r.get("restored_from") == held.rollout_id]
    assert len(claims) == 1, "dispatched once"
    assert claims[0]["dispatch"] == f"{held.rollout_id}-a1"  # attempt + 1
    assert claims[0]["instance"] == held.replica  # on its original replica
    restores = [r for r in journal if "restore_to_step" in r]
    assert [r["snapshot"] for r in restores] == ["p1-0001"]

    phases = [orjson.loads((tmp_path / "phase-2.json").read_bytes())]
    report = verdict(opts, tmp_path, phases)
    assert report["exactly_once"], report
    assert report["steps_trained_twice"] == 0 and report["duplicates"] == 0
    assert report["lost"] == 0 and report["rows_trained"] == opts.rows

    final = Path(phases[0]["final_snapshot"])
    counts: dict[str, int] = {}
    for _, sess in _calendar_sessions(final).values():
        for ev in sess.state["events"]:
            counts[ev["sentinel"]] = counts.get(ev["sentinel"], 0) + 1
    for s in sentinels:
        assert counts.get(s) == 1, f"sentinel {s} appears {counts.get(s, 0)} times"
    lineage, _ = _read_journal(tmp_path / JOURNAL)
    assert sorted(s["step"] for s in lineage) == list(range(1, len(lineage) + 1))
