"""The demo's progress lines (``demo_progress``): all on a terminal, the frequent ones sparse in
a log, none when disabled."""

from __future__ import annotations

import pytest

from gymckpt.app.demo.progress import Progress


def test_frequent_lines_are_sparse_in_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(enabled=True, tty=False, every_s=3600.0)
    for step in range(3):
        progress(f"step {step}", frequent=True)
    progress("restored")
    assert capsys.readouterr().err.splitlines() == ["step 0", "restored"]
    Progress(enabled=False)("nothing")
    assert capsys.readouterr().err == ""
