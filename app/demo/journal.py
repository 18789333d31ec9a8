"""The demo's training journal (``journal.jsonl``): one fsynced JSON line per trained step, per
checkpoint, per restored episode's dispatch, and for each phase where its trainer started: a
``restore_to_step`` line when it restored a snapshot, a ``fresh_start`` line when it found none.

The parent judges the run from it: the lineage of the final model is the trained steps, each
restore discarding the steps after the restored one (their weights died with the process), and
each fresh start discarding every step before it (the trainer is back at its initial state and
trains them again, legitimately).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from gymckpt.nurseries import CheckpointOutcome

__all__ = ["FRESH_START", "JOURNAL", "Journal", "checkpoint_record", "read_journal"]

JOURNAL = "journal.jsonl"
"""The journal's file name in the demo's work directory."""

FRESH_START = "fresh_start"
"""The key of the line a phase journals when it starts without a snapshot to restore."""


class Journal:
    """Append-only, one fsynced JSON line per record: the trained-steps audit trail."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "ab") as f:
            f.write(orjson.dumps(record) + b"\n")
            f.flush()
            os.fsync(f.fileno())


def checkpoint_record(phase: int, outcome: CheckpointOutcome) -> dict[str, Any]:
    """The journal line of one checkpoint's outcome."""
    return {
        "phase": phase,
        "checkpoint": outcome.checkpoint_id,
        "ok": outcome.ok,
        "reason": outcome.reason,
        "stage_s": dict(outcome.stage_s),
        "mid_turn": outcome.mid_turn,
    }


def read_journal(journal: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(lineage of trained steps, every checkpoint record) from the journal: the steps the
    final model was trained on, after the point each phase actually started from."""
    steps: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    if not journal.exists():
        return steps, checkpoints
    for line in journal.read_bytes().splitlines():
        rec = orjson.loads(line)
        if "restore_to_step" in rec:
            keep = int(rec["restore_to_step"])
            steps = [s for s in steps if s["step"] <= keep]
        elif FRESH_START in rec:
            steps = []
        elif "checkpoint" in rec:
            checkpoints.append(rec)
        elif "dispatch" in rec:
            continue
        else:
            steps.append(rec)
    return steps, checkpoints
