"""The hostile-tree lane (``gymckpt simulate --trees``): sandbox trees with a symlink out, an
enormous file, a command that never ends and a file changing while it is exported, each in
both checkpoint modes, checkpointed, restored and judged; seeds replay exactly.

The long run is a documented command: ``gymckpt simulate --trees --seeds 1000``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.app.simulation.determinism import deterministic_scheduling
from gymckpt.app.simulation.trees import (
    TREE_ACTS,
    TreeAct,
    TreeReport,
    TreeScenario,
    draw_tree_scenario,
    run_tree_scenario,
    run_tree_seed,
)
from gymckpt.runtime import CheckpointMode

MODES = (CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED)
modes = pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])


def _run(sc: TreeScenario, tmp_path: Path) -> TreeReport:
    with deterministic_scheduling(sc.seed):
        clock = trio.testing.MockClock(autojump_threshold=0)
        return trio.run(run_tree_scenario, sc, tmp_path, clock=clock)


def test_tree_draws_are_a_pure_function_of_the_seed_and_draw_every_act() -> None:
    kinds: Counter[str] = Counter()
    drawn_modes = set()
    for seed in range(200):
        sc = draw_tree_scenario(seed)
        assert draw_tree_scenario(seed) == sc
        kinds.update(a.kind for a in sc.acts)
        drawn_modes.add(sc.mode)
        assert sum(a.kind == "endless_command" for a in sc.acts) <= 1  # it alone stops autojump
        assert all(0 <= a.row < sc.rows and 0 <= a.turn < sc.turns for a in sc.acts)
    assert set(kinds) == set(TREE_ACTS) and drawn_modes == set(MODES)


# (act, how the struck row ends when a checkpoint meets the tree after the act)
ENDS = {
    "symlink_out": "failed:data:symlink_out",
    "enormous_file": "failed:data:enormous_file",
    "changes_always": "failed:data:changes_always",
    "changes_once": "completed",
    "endless_command": "completed",
}


@modes
@pytest.mark.parametrize("kind", TREE_ACTS)
def test_a_tree_act_met_by_a_checkpoint_ends_as_its_rule_says(
    tmp_path: Path, kind: str, mode: CheckpointMode
) -> None:
    """Row 0 does the act in turn 0; the checkpoint comes in turn 1 (unaligned: the mark of
    boundary 1 holds the act's tree; aligned: the commit at boundary 2 does). Refused trees
    fail their episode as data for their own reason, the rest complete; every restored
    episode ends as it did on the first host, and the judge finds nothing else."""
    sc = TreeScenario(7, mode, rows=2, turns=3, cut_at=1.5, acts=(TreeAct(kind, 0, 0),))
    report = _run(sc, tmp_path)
    assert report.ok, report.violations
    ends = dict(report.outcomes)
    assert ends["0-0"].startswith(ENDS[kind]), ends
    assert ends["1-0"].startswith("completed"), ends
    fired = dict(report.fired)
    assert fired[kind] >= 1
    if kind.startswith("changes"):
        assert fired[f"{kind}:export"] >= 1  # an export met the change
    if mode is CheckpointMode.UNALIGNED:
        assert report.mid_turn == len(report.restored)  # every episode taken was mid-turn
    restored = {rid.split("-a")[0] for rid, _ in report.restored}
    assert ("0-0" in restored) == (not ENDS[kind].startswith("failed"))


def test_a_command_that_never_ends_taken_mid_command_runs_again_after_the_restore(
    tmp_path: Path,
) -> None:
    """An unaligned cut inside the endless command's turn: the restored turn runs it again (a
    second real command, killed at its deadline with its group), and the row completes."""
    act = TreeAct("endless_command", 0, 0)
    sc = TreeScenario(3, CheckpointMode.UNALIGNED, rows=1, turns=2, cut_at=0.5, acts=(act,))
    report = _run(sc, tmp_path)
    assert report.ok, report.violations
    assert dict(report.fired)["endless_command"] == 2 and report.mid_turn == 1
    assert [o for _, o in report.restored] == [dict(report.outcomes)["0-0"]]


def test_a_tree_seed_replays_exactly(tmp_path: Path) -> None:
    seed = next(
        s
        for s in range(100)
        if {"endless_command", "changes_always"} <= {a.kind for a in draw_tree_scenario(s).acts}
    )
    first, second = run_tree_seed(seed, tmp_path), run_tree_seed(seed, tmp_path)
    assert first.ok, first.violations
    assert first.fingerprint == second.fingerprint and first.outcomes == second.outcomes


@pytest.mark.timeout(300)
def test_the_cli_runs_the_tree_lane(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["simulate", "--trees", "--seeds", "6", "--json", "--tmp", str(tmp_path)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["trees"] is True and out["passed"] == 6 and out["failed"] == []
    assert out["acts_fired"] and out["row_ends"]["completed"] > 0
    with pytest.raises(SystemExit):
        cli_main(["simulate", "--help"])
    assert "--trees" in capsys.readouterr().out
    assert cli_main(["simulate", "--trees", "--hostile", "--seeds", "1"]) == 2
    assert "--trees runs the hostile-tree lane alone" in capsys.readouterr().err
