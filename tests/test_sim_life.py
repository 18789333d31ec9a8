"""One life of a simulated scenario (``life``), and the scenario's state across
lives (``state``): a finished life publishes its final snapshot; a crashed
one is restored by the next, whose lineage keeps only the restored steps; a rollback restores
an older snapshot from a fresh work directory."""

from __future__ import annotations

import random
from pathlib import Path

import trio

from gymckpt.app.simulation.ends import LifeEnd
from gymckpt.app.simulation.life import TrainerLife
from gymckpt.app.simulation.scenario import Crash, Scenario
from gymckpt.app.simulation.state import ScenarioRun, judge_scenario, verify_offline
from gymckpt.runtime import SnapshotStore
from gymckpt.runtime._shared import SNAPSHOTS_DIR

SC = Scenario(seed=2, rows=8, group_size=2, instances=2, groups_per_step=2)


def new_run(root: Path, sc: Scenario = SC) -> ScenarioRun:
    return ScenarioRun(sc, root, random.Random(0), root / "work-0")


async def test_a_calm_life_trains_the_dataset_and_publishes(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    run = new_run(tmp_path)
    report = await TrainerLife(run, 0, (), None, races=False).run_to_end()
    assert report.end == LifeEnd.FINISHED and report.error is None
    assert report.steps_trained == len(run.lineage) == 4  # 8 rows, 2 per step
    assert report.restored_from is None and all(ok for _, ok, _ in report.checkpoints)
    assert run.final_snapshot is not None and verify_offline(run.final_snapshot) == []
    assert run.violations == []
    assert judge_scenario(run) == (8, 0, judge_scenario(run)[2]) and run.violations == []


async def test_a_crash_is_restored_by_the_next_life(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    sc = Scenario(seed=3, rows=16, group_size=2, instances=2, groups_per_step=2)
    run = new_run(tmp_path, sc)
    crashed = await TrainerLife(
        run, 0, (), Crash(checkpoint=2, point="after_publish"), races=False
    ).run_to_end()
    assert crashed.end == LifeEnd.CRASHED and run.final_snapshot is not None
    steps_before = len(run.lineage)
    again = await TrainerLife(run, 1, (), None, races=False).run_to_end()
    assert again.end == LifeEnd.FINISHED
    # crashed once checkpoint 2 was published, before its outcome reached the trainer
    assert [cid for cid, _, _ in crashed.checkpoints] == ["i0-0001"]
    assert again.restored_from == "i0-0002"
    assert [step for step, _ in run.lineage] == list(range(1, len(run.lineage) + 1))
    assert steps_before >= 2 and run.violations == []
    assert judge_scenario(run)[0] == 16 and run.violations == []


async def test_documented_aborts_a_fault_accounts_for_are_ends_not_violations(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A restore Gym cannot serve, checkpoints that keep failing: the life ends, and
    the next one restores."""
    run = new_run(tmp_path)
    await TrainerLife(run, 0, (), None, races=False).run_to_end()
    report = await TrainerLife(run, 1, ("restore:error",), None).run_to_end()
    assert report.end == LifeEnd.RESTORE_FAILED
    assert run.violations == []  # a restore fault accounts for it
    report = await TrainerLife(run, 2, ("prepare:error",), None).run_to_end()
    assert report.end == LifeEnd.CHECKPOINTS_FAILED and run.violations == []


def test_judging_without_a_final_snapshot_is_a_violation(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    judge_scenario(run)
    assert run.violations[0] == "no final snapshot: the last incarnation did not finish"
    assert verify_offline(tmp_path / "nothing-here") != []


async def test_a_rollback_restores_an_older_snapshot_from_a_fresh_directory(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    run = new_run(tmp_path, Scenario(seed=4, rows=12, group_size=2, keep_snapshots=3))
    run.rollback(0)  # no snapshot yet: nothing to roll back to
    assert run.workdir == tmp_path / "work-0" and not run.rolled_back
    await TrainerLife(run, 0, (), None, races=False).run_to_end()
    complete = SnapshotStore(tmp_path / "work-0" / SNAPSHOTS_DIR).list_complete()
    assert len(complete) >= 2
    run.rollback(0)
    assert run.rolled_back and run.workdir == tmp_path / "work-1"
    (copied,) = SnapshotStore(run.workdir / SNAPSHOTS_DIR).list_complete()
    assert copied.path.name in {i.path.name for i in complete[:-1]}  # never the latest
