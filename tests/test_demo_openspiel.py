"""``gymckpt demo --env openspiel:NAME``: the two-process run (a real SIGKILL after the first
checkpoint, a restore in a new process) on an OpenSpiel game with chance nodes, every trained
episode bit-identical to the same episode played uninterrupted with plain pyspiel; a game that
cannot be hosted stops the demo at start with one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gymckpt.app.demo.journal import JOURNAL
from gymckpt.app.demo.main import DemoOptions

pytest.importorskip("pyspiel")
pytestmark = pytest.mark.subprocess


def demo(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymckpt", "demo", "--json", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_the_demo_on_backgammon_is_exactly_once_and_bit_identical(
    tmp_path: Path, mode: str
) -> None:
    done = demo(
        tmp_path / "w",
        "--env",
        "openspiel:backgammon",
        "--rows",
        "16",
        "--crash-after-checkpoint",
        "1",
        "--checkpoint-mode",
        mode,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["env"] == "openspiel:backgammon" and report["checkpoint_mode"] == mode
    assert report["exactly_once"] is True and report["trajectories_match"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["episodes"] == 64 and report["trajectories_mismatched"] == 0
    lines = [orjson.loads(x) for x in (tmp_path / "w" / JOURNAL).read_bytes().splitlines()]
    trained = Counter((r, s) for x in lines for r, s, _ in x.get("episodes", ()))
    assert sorted(trained) == [(r, s) for r in range(16) for s in range(4)]
    assert set(trained.values()) == {1}
    # phase 2 continued games the checkpoint took in the middle (dice still to roll)
    claims = [x["restored_from"] for x in lines if "restored_from" in x]
    assert claims and len(claims) == len(set(claims))


def test_a_game_that_cannot_be_hosted_stops_the_demo_with_one_line(tmp_path: Path) -> None:
    done = demo(tmp_path / "w", "--env", "openspiel:no_such_game")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no such OpenSpiel game 'no_such_game'" in line
    assert json.loads(done.stdout)["exit_code"] == 2


def test_options_take_openspiel_names_on_the_embedded_backend_only() -> None:
    choice = DemoOptions(env="openspiel:nim(pile_sizes=1;2)").env_choice
    assert choice is not None and choice.family.title == "OpenSpiel"
    assert (
        choice.env_id == "nim(pile_sizes=1;2)" and choice.label == "openspiel:nim(pile_sizes=1;2)"
    )
    with pytest.raises(ValueError, match="openspiel:ID runs on --backend embedded"):
        DemoOptions(env="openspiel:kuhn_poker", backend="ray")
    with pytest.raises(ValueError, match="openspiel:ID"):
        DemoOptions(env="openspiel:")
