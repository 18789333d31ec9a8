"""``gymckpt train text --deterministic`` as real processes: the same seed trains the same
character transformer bit for bit, and a run SIGKILLed after a checkpoint and rerun on its
work directory ends with the uninterrupted run's weights sha256. Short: 3 steps, a checkpoint
after each."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]

STEPS = 3


def _cmd(workdir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gymckpt",
        "train",
        "text",
        str(workdir),
        "--deterministic",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        "1",
    ]


def _sha(workdir: Path) -> str:
    done = subprocess.run(
        _cmd(workdir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    match = re.fullmatch(r"weights sha256: ([0-9a-f]{64})", done.stdout.strip().splitlines()[-1])
    assert match, done.stdout
    return match.group(1)


def test_same_seed_same_weights_and_a_sigkill_after_a_checkpoint_changes_none(
    tmp_path: Path,
) -> None:
    baseline = _sha(tmp_path / "a")
    assert _sha(tmp_path / "b") == baseline
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
            # step 2 was handed out after step 1's checkpoint ended: killed inside step 3's
            # rollouts, step 2's checkpoint, or just before them
            if line.startswith("step 2/"):
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert list((workdir / "snapshots").glob("ckpt-*/COMMITTED"))
    assert _sha(workdir) == baseline


@pytest.mark.slow
def test_the_text_learner_learns_to_write_valid_guesses(tmp_path: Path) -> None:
    """The documented curve, short: seed 0's mean reward goes from ~0.15 (an untrained
    policy's digits are rarely a valid guess) to >= 0.6 within 6 steps."""
    curve = tmp_path / "c.csv"
    cmd = [*_cmd(tmp_path / "w"), "--steps", "6", "--curve", str(curve)]
    done = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=280, check=False
    )
    assert done.returncode == 0, done.stderr
    returns = [float(r.split(",")[1]) for r in curve.read_text().split()[1:]]
    assert returns[0] < 0.3 and max(returns[-3:]) >= 0.6, returns
