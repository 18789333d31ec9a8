"""The README and the documentation's examples stay true: each runs (and restores when run
again), and CI runs the README's test command. An example is the code block between
``<!-- marker -->`` and ``<!-- /marker -->`` of the page that shows it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = {
    "example": "README.md",
    "main-command": "README.md",
    "test-command": "README.md",
    "example-asyncio": "docs/howto/asyncio.md",
    "byo-example": "docs/tutorials/first-environment.md",
    "llm-example": "docs/tutorials/llm-agent.md",
}
"""The page that shows each example."""


def _block(marker: str) -> str:
    page = PAGES[marker]
    text = (ROOT / page).read_text()
    m = re.search(rf"<!-- {marker} -->\n```[a-z]*\n(.*?)```\n<!-- /{marker} -->", text, re.S)
    assert m, f"{page} has no {marker} block"
    return m.group(1)


@pytest.mark.parametrize("marker", ["example", "example-asyncio"])
def test_readme_example_runs_and_restores(tmp_path: Path, marker: str) -> None:
    """The README's trio example, and the asyncio one of the how-to (through trio-asyncio)."""
    script = tmp_path / "example.py"
    script.write_text(_block(marker))
    first = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    lines = first.stdout.split()
    assert lines[:3] == ["2", "run-0001", "True"]
    assert (tmp_path / "work" / "snapshots").is_dir()
    # the same program again restores the latest snapshot and has nothing left to do
    again = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci and "README.md" in ci
    assert "pytest" in _block("test-command")


def test_readme_byo_example_runs_and_restores(tmp_path: Path) -> None:
    block = _block("byo-example")
    assert len(block.splitlines()) <= 40
    script = tmp_path / "byo.py"
    script.write_text(block)
    first = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert len(lines) == 4  # 16 rows, 4 groups per step
    for line in lines:  # each payload is the bisection's guesses, ending on the secret
        _row, guesses = line.split(" ", 1)
        seq = [int(g) for g in guesses.strip("[]").split(", ")]
        assert seq[0] == 50 and len(set(seq)) == len(seq)
    # the same program again restores the latest snapshot and has nothing left to do
    again = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""


def test_readme_llm_example_checkpoints_mid_turn_survives_a_sigkill_and_resumes(
    tmp_path: Path,
) -> None:
    """The LLM example as a user runs it, without a server of their own (it starts the test
    server): SIGKILLed after its first checkpoint, it resumes from the snapshot and finishes,
    and its later episodes record the policy versions the trainer announced."""
    import os
    import signal

    block = _block("llm-example")
    assert len(block.splitlines()) < 60
    script = tmp_path / "llm.py"
    script.write_text(block)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    first = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # blocks until the first checkpoint (bounded below)
        assert line.startswith("run-0001 True"), line
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait(60)
        assert first.stdout is not None
        first.stdout.close()
    assert first.returncode == -signal.SIGKILL
    again = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "resumed from snapshot" in again.stderr
    lines = again.stdout.splitlines()
    assert lines and all(" True " in ln for ln in lines)
    last = lines[-1]
    versions = [int(v) for v in last.split("'versions': [")[1].split("]")[0].split(", ")]
    assert max(versions) >= 1  # dispatched after a weight update: the version travelled
