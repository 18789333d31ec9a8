"""The demo's training journal (``demo_journal``): appended records read back as the final
model's lineage (a restore discards the steps after the restored one) and the checkpoints."""

from __future__ import annotations

from pathlib import Path

from gymckpt.nurseries.app.demo_journal import JOURNAL, Journal, read_journal


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
