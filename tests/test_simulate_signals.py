"""``gymckpt simulate`` is stopped by SIGTERM: a seed's simulated trainer must not take the
process's signal as its own preemption (if it did, the seed would fail with ``Preempted`` and
the simulation would go on).

The one poll in tests/: the signal must land while a seed's trainer holds its work directory,
and the only sign of that outside the child process is the lock file it creates. A read of
the child's progress lines was tried instead and does not catch the bug (the line comes
between seeds); the poll is bounded by a deadline and by the test's timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_sigterm_stops_the_simulation(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymckpt", "simulate", "--seeds", "100000", "--tmp", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        # a seed's trainer holds its work directory (inside open_rollouts): bounded wait
        while not any(tmp_path.glob("gymckpt-sim-*/work-*/.gymckpt.lock")):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no seed's trainer started within 60 s"
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, out.decode()
    assert b"Preempted" not in out
