"""The demo's report for a person (``demo_report``)."""

from __future__ import annotations

import pytest

from gymckpt.app.demo.report import print_report

RECORD = {
    "backend": "embedded",
    "instances": 2,
    "group_size": 4,
    "seed": 0,
    "rows": 8,
    "rows_trained": 8,
    "rows_failed": 0,
    "lost": 0,
    "duplicates": 0,
    "steps": 2,
    "steps_trained_twice": 0,
    "sentinels_total": 5,
    "sentinels_expected": 5,
    "sentinels_duplicated": 0,
    "sentinels_missing": 0,
    "checkpoints_ok": 2,
    "checkpoints_failed": 0,
    "checkpoint_mode": "unaligned",
    "episodes_mid_turn": 7,
    "restores": 1,
    "killed_with_sigkill": True,
    "stage_ms_median": {"prepare": 1.5},
    "elapsed_s": 1.25,
    "workdir": "/w",
    "workdir_kept": False,
    "exactly_once": True,
    "env": "calendar",
}


def test_the_report_has_one_line_per_fact(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(RECORD)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "gymckpt demo"
    assert "  rows trained        8/8 (failed 0, lost 0, duplicates 0)" in lines
    assert "  restores            1 (SIGKILL: yes)" in lines
    assert "  checkpoints         2 ok, 0 failed (unaligned; episodes taken mid-turn: 7)" in lines
    assert "  stage medians (ms)  prepare 1.5" in lines
    assert lines[-2].endswith("workdir /w (removed; --keep keeps it)")
    assert lines[-1] == "  exactly once        YES"


def test_a_gymnasium_run_reports_its_trajectories(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(
        {**RECORD, "episodes": 16, "env": "gymnasium:CartPole-v1", "trajectories_match": False}
    )
    out = capsys.readouterr().out
    assert "16 episodes of gymnasium:CartPole-v1, identical to an uninterrupted run: NO" in out
