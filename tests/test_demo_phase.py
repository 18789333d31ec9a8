"""One phase of the demo (``demo_phase``): a trainer process's worth of the run, in process here;
its result record and journal; the error file a failed phase leaves for the parent."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import trio

from gymckpt.app.demo.journal import JOURNAL, read_journal
from gymckpt.app.demo.options import DemoOptions
from gymckpt.app.demo.phase import (
    PUBLISHED,
    phase_error,
    phase_error_file,
    phase_main,
    record_phase_error,
    run_phase,
)

OPTS = DemoOptions(rows=8, group_size=2, groups_per_step=2, checkpoint_every=2)


def test_a_phase_trains_the_dataset_and_leaves_a_final_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = trio.run(run_phase, OPTS, tmp_path, 1, 1)
    assert result["phase"] == 1 and result["steps"] == 4 and result["restored"] is None
    assert Path(result["final_snapshot"]).is_dir()
    steps, checkpoints = read_journal(tmp_path / JOURNAL)
    assert sorted(r for s in steps for r in s["rows"]) == list(range(8))
    assert [c["ok"] for c in checkpoints] == [True] * len(checkpoints) and len(checkpoints) >= 3
    # with crash_after 1 the phase announces its first published checkpoint to the parent
    assert capsys.readouterr().out.splitlines() == [f"{PUBLISHED} p1-0001"]


def test_a_second_phase_restores_and_has_nothing_left(tmp_path: Path) -> None:
    first = trio.run(run_phase, OPTS, tmp_path, 1, 0)
    second = trio.run(run_phase, OPTS, tmp_path, 2, 0)
    assert second["steps"] == first["steps"] and second["restored"] is not None


def test_a_phase_error_is_left_for_the_parent(tmp_path: Path) -> None:
    assert phase_error(tmp_path, 2, -9) == "phase 2 was killed by signal 9"
    assert phase_error(tmp_path, 2, 4) == "phase 2 exited with code 4"
    record_phase_error(tmp_path, 2, "run stopped: checkpoints failed", 4)
    assert orjson.loads(phase_error_file(tmp_path, 2).read_bytes())["exit_code"] == 4
    assert phase_error(tmp_path, 2, 4) == "run stopped: checkpoints failed"


def test_phase_main_maps_a_failed_run_to_its_exit_code(tmp_path: Path) -> None:
    opts = DemoOptions(
        rows=4, group_size=2, faults=("prepare:error",), runtime=(("max_consecutive_failures", 0),)
    )
    assert phase_main(opts, tmp_path, 1, 0) == 4
    assert phase_error(tmp_path, 1, 4).startswith(
        "1 checkpoints failed in a row (max_consecutive_failures=0)"
    )
