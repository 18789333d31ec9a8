"""``gymckpt train cartpole --deterministic`` as real processes: the same seed trains the same
weights bit for bit, and a run SIGKILLed after a checkpoint and rerun (same command, same
work directory: it resumes from the snapshot) ends with the same training journal and
weights sha256."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]

STEPS = 8
EVERY = 2


def _cmd(workdir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gymckpt",
        "train",
        "cartpole",
        str(workdir),
        "--deterministic",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        *extra,
    ]


def _train(workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cmd(workdir, *extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _sha(out: str) -> tuple[str, str]:
    """The run's (journal, weights) digests: its last two stdout lines."""
    journal, weights = out.strip().splitlines()[-2:]
    j = re.fullmatch(r"journal sha256: ([0-9a-f]{64})", journal)
    w = re.fullmatch(r"weights sha256: ([0-9a-f]{64})", weights)
    assert j and w, out
    return j.group(1), w.group(1)


def test_same_seed_same_weights_and_a_finished_run_reruns_to_them(tmp_path: Path) -> None:
    first = _train(tmp_path / "a", "--curve", str(tmp_path / "curve.csv"))
    assert first.returncode == 0, first.stderr
    assert f"step {STEPS}/{STEPS}: mean return" in first.stderr
    assert f"policy version {STEPS}" in first.stderr
    second = _train(tmp_path / "b")
    assert second.returncode == 0, second.stderr
    assert _sha(first.stdout) == _sha(second.stdout)
    rows = (tmp_path / "curve.csv").read_text().splitlines()
    assert rows[0] == "step,mean_return" and len(rows) == STEPS + 1
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    again = _train(tmp_path / "a")  # a finished run: restored, nothing to train
    assert again.returncode == 0, again.stderr
    assert _sha(again.stdout) == _sha(first.stdout)
    other = _train(tmp_path / "a", "--seed", "1")
    assert other.returncode == 2
    assert "holds a run with other options: seed 0 (now 1)" in other.stderr


def test_a_sigkill_after_a_checkpoint_changes_no_weight(tmp_path: Path) -> None:
    baseline = _train(tmp_path / "baseline")
    assert baseline.returncode == 0, baseline.stderr
    workdir = tmp_path / "crashed"
    with subprocess.Popen(
        _cmd(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            # step EVERY + 1 was handed out after the checkpoint of step EVERY ended: the run
            # is inside step EVERY + 2 (its rollouts in flight) or just before it
            if line.startswith(f"step {EVERY + 1}/"):
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert list((workdir / "snapshots").glob("ckpt-*/COMMITTED"))
    resumed = _train(workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from snapshot" in resumed.stderr
    assert _sha(resumed.stdout) == _sha(baseline.stdout)


@pytest.mark.slow
def test_cartpole_learns_from_about_20_to_150(tmp_path: Path) -> None:
    """The documented curve, short: seed 0 goes from ~23 to >= 150 within 10 steps."""
    done = subprocess.run(
        [*_cmd(tmp_path / "w", "--curve", str(tmp_path / "c.csv")), "--steps", "10"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    returns = [float(r.split(",")[1]) for r in (tmp_path / "c.csv").read_text().split()[1:]]
    assert returns[0] < 40 and max(returns[-3:]) >= 150, returns
