"""``gymckpt demo --backend http --json``: the two-process crash and restore over HTTP, and a
server killed and replaced.

Each phase is a trainer process that spawns its own ``gymckpt serve`` processes (one per
instance, ``HttpGym.spawn``); phase 1 is SIGKILLed after its first checkpoint, its servers die
with it (the kernel's parent-death signal), and phase 2 spawns fresh servers of the same
topology and restores the snapshot into them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.http, pytest.mark.subprocess]

READY = "gymckpt serve: instance {} serving at"
DEAD = "gymckpt serve: the dead fault ends the process"


def demo(workdir: Path, *extra: str) -> dict[str, object]:
    cmd = [sys.executable, "-m", "gymckpt", "demo", "--backend", "http", "--json"]
    cmd += ["--rows", "32", "--workdir", str(workdir), *extra]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


def serve_log(workdir: Path, instance: str) -> str:
    return (workdir / "gym-live" / f"{instance}.serve.log").read_text()


@pytest.mark.timeout(200)
def test_demo_over_http_sigkilled_and_restored_is_exactly_once(tmp_path: Path) -> None:
    w = tmp_path / "w"
    report = demo(w, "--crash-after-checkpoint", "1")
    assert report["exactly_once"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["backend"] == "http"
    assert report["duplicates"] == report["lost"] == report["steps_trained_twice"] == 0
    assert report["sentinels_duplicated"] == report["sentinels_missing"] == 0
    for instance in ("gym-0", "gym-1"):  # one server per phase, none replaced
        assert serve_log(w, instance).count(READY.format(instance)) == 2


@pytest.mark.timeout(200)
def test_demo_over_http_with_a_server_killed_and_replaced_is_exactly_once(
    tmp_path: Path,
) -> None:
    w = tmp_path / "w"
    # the 3rd run of phase 1 kills its server (os._exit in the server process): the trainer
    # sees the body end without its end line, the process gone, and replaces it with --recover
    report = demo(w, "--crash-after-checkpoint", "1", "--fault", "run:dead@3")
    assert report["exactly_once"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["duplicates"] == report["lost"] == report["sentinels_duplicated"] == 0
    logs = {i: serve_log(w, i) for i in ("gym-0", "gym-1")}
    died = [i for i, log in logs.items() if DEAD in log]
    # each server process counts its own runs (a plan shipped to a process counts there), so
    # the 3rd run kills one server of phase 1, or both where both reached a 3rd run first ...
    assert died, logs
    for victim in died:  # ... and each one that died was replaced
        assert logs[victim].count(READY.format(victim)) >= 3, logs
    assert report["rows_trained"] == 32


@pytest.mark.timeout(200)
def test_a_server_killed_without_a_crash_is_replaced_once(tmp_path: Path) -> None:
    report = demo(tmp_path / "w", "--crash-after-checkpoint", "0", "--fault", "run:dead@3")
    assert report["exactly_once"] is True, report
    assert report["replacements"] == 1, report
    assert report["duplicates"] == report["lost"] == report["sentinels_duplicated"] == 0
