"""The demo's training journal (``demo_journal``): appended records read back as the final
model's lineage (a restore discards the steps after the restored one) and the checkpoints."""

from __future__ import annotations

from pathlib import Path

import attrs

from gymckpt.app.demo.journal import (
    FRESH_START,
    JOURNAL,
    Journal,
    checkpoint_record,
    read_journal,
)
from gymckpt.nurseries import CheckpointOutcome


def test_a_restore_discards_the_steps_after_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / JOURNAL)
    for step in (1, 2, 3):
        journal.append({"phase": 1, "step": step, "rows": [step]})
    journal.append({"phase": 1, "checkpoint": "p1-0001", "ok": True, "stage_s": {}})
    journal.append({"phase": 2, "restore_to_step": 1, "snapshot": "p1-0001"})
    journal.append({"phase": 2, "dispatch": "3-0-a1", "instance": "gym-0"})
    journal.append({"phase": 2, "step": 2, "rows": [9]})
    steps, checkpoints = read_journal(tmp_path / JOURNAL)
    assert [(s["step"], s["rows"]) for s in steps] == [(1, [1]), (2, [9])]
    assert [c["checkpoint"] for c in checkpoints] == ["p1-0001"]


def test_no_journal_is_an_empty_lineage(tmp_path: Path) -> None:
    assert read_journal(tmp_path / JOURNAL) == ([], [])


def test_a_checkpoints_line_counts_the_episodes_it_took_mid_turn() -> None:
    outcome = CheckpointOutcome("p1-0002", True, None, None, None, {"commit": 0.5}, mid_turn=4)
    line = checkpoint_record(1, outcome)
    assert line["mid_turn"] == 4 and line["checkpoint"] == "p1-0002" and line["ok"] is True
    assert checkpoint_record(1, attrs.evolve(outcome, mid_turn=0))["mid_turn"] == 0


def test_a_fresh_start_discards_every_step_before_it(tmp_path: Path) -> None:
    """Phase 2 found no complete snapshot (phase 1 died mid-publish of its first one): its
    trainer starts from its initial state, so phase 1's steps are not in the final lineage."""
    journal = Journal(tmp_path / JOURNAL)
    journal.append({"phase": 1, FRESH_START: True})
    for step in (1, 2):
        journal.append({"phase": 1, "step": step, "rows": [step]})
    journal.append({"phase": 2, FRESH_START: True})
    journal.append({"phase": 2, "step": 1, "rows": [1]})
    steps, _ = read_journal(tmp_path / JOURNAL)
    assert [(s["phase"], s["step"]) for s in steps] == [(2, 1)]
