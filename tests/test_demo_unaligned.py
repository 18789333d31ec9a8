"""``gymckpt demo --checkpoint-mode unaligned``: the two-process run (a real SIGKILL after its
first checkpoint, a restore in a new process) with checkpoints that park nothing, on the
calendar and on Gymnasium CartPole; the Ray run is in ``test_ray_demo``.

A checkpoint takes the episodes that are inside a turn at their last step boundary (the
calendar's turns sleep; the Gymnasium policy answers after an awaited latency, then the agent
waits before it steps), so the run is exactly once with episodes taken mid-turn, and every
CartPole trajectory, restored ones included, is bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gymckpt.app.demo.journal import JOURNAL

pytestmark = pytest.mark.subprocess


def unaligned_demo(workdir: Path, *extra: str) -> dict[str, Any]:
    """The demo's JSON report; it must finish (exit 0)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--checkpoint-mode",
            "unaligned",
            "--crash-after-checkpoint",
            "1",
            "--json",
            "--workdir",
            str(workdir),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def assert_exactly_once_with_episodes_taken_mid_turn(report: dict[str, Any], workdir: Path) -> None:
    assert report["exactly_once"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["duplicates"] == report["lost"] == report["steps_trained_twice"] == 0
    assert report["checkpoint_mode"] == "unaligned"
    assert report["episodes_mid_turn"] > 0, report
    # the count is the checkpoints' own (CheckpointOutcome.mid_turn, journaled by each phase)
    lines = [orjson.loads(x) for x in (workdir / JOURNAL).read_bytes().splitlines()]
    taken = {r["checkpoint"]: r["mid_turn"] for r in lines if "checkpoint" in r and r["ok"]}
    assert len(taken) == report["checkpoints_ok"]
    assert sum(taken.values()) == report["episodes_mid_turn"]
    # phase 2 restored a cut that took episodes mid-turn: they replayed from their boundaries
    (restored,) = [r["snapshot"] for r in lines if "restore_to_step" in r]
    assert taken[restored] > 0, taken


def test_the_calendar_demo_is_exactly_once_with_episodes_taken_mid_turn(tmp_path: Path) -> None:
    report = unaligned_demo(tmp_path / "w", "--rows", "32")
    assert report["env"] == "calendar" and report["rows_trained"] == 32
    assert report["sentinels_duplicated"] == report["sentinels_missing"] == 0
    assert_exactly_once_with_episodes_taken_mid_turn(report, tmp_path / "w")


def test_the_cartpole_demo_replays_mid_turn_episodes_bit_identically(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    # 8 rows in flight, not 16: the first checkpoint finds rows dispatched since the first
    # groups ended (in flight), not only the dataset's last, nearly done episodes
    conf = tmp_path / "demo.toml"
    conf.write_text("[demo]\nmax_rows_in_flight = 8\n")
    report = unaligned_demo(
        tmp_path / "w", "--rows", "16", "--env", "gymnasium:CartPole-v1", "--config", str(conf)
    )
    assert report["trajectories_match"] is True and report["trajectories_mismatched"] == 0
    assert report["episodes"] == 64
    assert_exactly_once_with_episodes_taken_mid_turn(report, tmp_path / "w")
