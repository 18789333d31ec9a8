"""The demo's parent (``demo_parent``): the phase command line, the one line of a preempted
demo, and the refusals before any process starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gymckpt.app.demo import parent as demo_parent
from gymckpt.app.demo.options import DemoOptions
from gymckpt.app.demo.parent import environment_problem, phase_cmd, preempted, run_demo


def test_a_phase_gets_its_options_as_json(tmp_path: Path) -> None:
    opts = DemoOptions(rows=5)
    cmd = phase_cmd(opts, tmp_path, 2, 0)
    assert cmd[:4] == [sys.executable, "-m", "gymckpt", "_phase"]
    assert cmd[cmd.index("--phase") + 1] == "2" and cmd[cmd.index("--crash-after") + 1] == "0"
    assert DemoOptions.from_json(cmd[cmd.index("--options") + 1]) == opts


def test_a_preempted_demo_names_the_snapshot_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, line = preempted(tmp_path, 0)
    assert code == 0 and line == "demo stopped by signal; the trainer left no snapshot"
    assert capsys.readouterr().err == f"gymckpt: {line}\n"
    assert preempted(tmp_path, -15)[0] == -15


def test_a_non_empty_workdir_is_refused_before_any_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo_parent.subprocess, "Popen", None)  # nothing may start
    (tmp_path / "left-over").write_text("x")
    assert run_demo(DemoOptions(workdir=str(tmp_path)), as_json=True) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and "is not empty" in out["error"]
    assert environment_problem(DemoOptions()) is None
