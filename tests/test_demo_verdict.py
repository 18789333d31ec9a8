"""The demo's verdict from files alone (``demo_verdict``): the journal's lineage against the
dataset, checkpoints counted from the journal, and the JSON object of a demo that never ran."""

from __future__ import annotations

import time
from pathlib import Path

from gymckpt.app.demo.journal import JOURNAL, Journal
from gymckpt.app.demo.options import DemoOptions
from gymckpt.app.demo.verdict import error_report, run_report, verdict


def journal(tmp_path: Path) -> None:
    j = Journal(tmp_path / JOURNAL)
    j.append({"phase": 1, "step": 1, "rows": [0, 1]})
    j.append({"phase": 1, "step": 1, "rows": [1]})
    ok = {"phase": 1, "checkpoint": "p1-0001", "ok": True, "stage_s": {"prepare": 0.002}}
    j.append({**ok, "mid_turn": 3})
    j.append({**ok, "checkpoint": "p1-0002", "ok": False, "stage_s": {}})
    j.append({"phase": 2, "restore_to_step": 1, "snapshot": "p1-0001"})
    j.append({**ok, "phase": 2, "checkpoint": "p2-0002", "mid_turn": 2})
    j.append({**ok, "phase": 2, "checkpoint": "p2-0003"})  # a journal from before the count


def test_a_lineage_with_a_row_twice_and_rows_lost_is_not_exactly_once(tmp_path: Path) -> None:
    journal(tmp_path)
    out = verdict(DemoOptions(rows=4), tmp_path, [{"restored": {"restored": 1}}])
    assert out["exactly_once"] is False
    assert (out["duplicates"], out["lost"], out["steps_trained_twice"]) == (1, 2, 1)
    assert (out["checkpoints_ok"], out["checkpoints_failed"], out["restores"]) == (3, 1, 1)
    assert out["stage_ms_median"] == {"prepare": 2.0}
    # the episodes taken mid-turn: every checkpoint of the run, either side of the restore
    assert out["episodes_mid_turn"] == 5 and out["checkpoint_mode"] == "aligned"


def test_the_run_report_says_what_the_run_was(tmp_path: Path) -> None:
    journal(tmp_path)
    out = run_report(DemoOptions(rows=4, seed=3), tmp_path, True, time.monotonic())
    assert out["killed_with_sigkill"] and out["seed"] == 3 and out["snapshots"] == []
    assert out["workdir"] == str(tmp_path) and out["replacements"] == 0


def test_a_demo_that_never_ran_reports_its_error_and_exit_code() -> None:
    out = error_report("--workdir x is not empty", 2, DemoOptions(rows=7))
    assert out["rows"] == 7 and out["exactly_once"] is False
    assert out["error"] == "--workdir x is not empty" and out["exit_code"] == 2
    assert out["episodes_mid_turn"] == 0
    assert error_report("bad flag", 2)["rows"] == 0
