"""The hostile-environment dimension: the simulation (``gymckpt simulate --hostile``) and the
conformance kit against environments that are wrong in every way a user's can be.

The long run is a documented command: ``gymckpt simulate --seeds 1000 --hostile``. Every
act runs in both checkpoint modes (``CheckpointMode``); the simulation draws the mode per seed.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs
import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.app.simulation.main import (
    LifeReport,
    Scenario,
    draw_scenario,
    main_simulate,
    replay_command,
    run_seed,
)
from gymckpt.gym_adapter import GymHost, RunRow
from gymckpt.gym_adapter._shared import JOURNAL_FILE
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.runtime import CheckpointMode
from gymckpt.testing import ConformanceError, check_environment
from gymckpt.testing.hostile import (
    EPISODE_ACTS,
    HOSTILE_ACTS,
    KIT_ACTS,
    HostileAct,
    HostileActs,
    hostile_calendar_environment,
    hostile_guess_the_number,
    journal_faults,
)

HOSTILE_CI_SEEDS = 12
"""Seeds of the CI run (each a few hundred ms); the long run is the documented command."""

MODES = (CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED)
modes = pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])


def test_hostile_draws_leave_the_other_draws_as_they_were() -> None:
    kinds: Counter[str] = Counter()
    for seed in range(300):
        plain, hostile = draw_scenario(seed), draw_scenario(seed, hostile=True)
        assert attrs.evolve(hostile, hostile=()) == plain
        assert draw_scenario(seed, hostile=True) == hostile  # a pure function of the seed
        kinds.update(a.kind for a in hostile.hostile)
        for act in hostile.hostile:
            if act.kind in EPISODE_ACTS:
                assert 0 <= act.row < hostile.rows and 0 <= act.slot < hostile.group_size
    assert set(kinds) == set(HOSTILE_ACTS)  # every act is drawn
    assert replay_command(7, hostile=True) == "gymckpt simulate --seeds 1 --start 7 --hostile"
    assert "hostile" in draw_scenario(1, hostile=True).describe()


def test_a_hostile_seed_replays_exactly(tmp_path: Path) -> None:
    first, second = run_seed(3, tmp_path, hostile=True), run_seed(3, tmp_path, hostile=True)
    assert first.scenario.hostile and first.fingerprint == second.fingerprint
    assert first.task_steps == second.task_steps
    struck = [dict(i.hostile_fired) for i in first.lives]
    assert struck == [dict(i.hostile_fired) for i in second.lives] and any(struck)


def _one_act(act: HostileAct, mode: CheckpointMode, **overrides: object) -> Scenario:
    """A small healthy scenario on two instances whose environment does ``act``, checkpointing
    in ``mode``."""
    base = dict(
        checkpoint_mode=mode,
        seed=5,
        rows=8,
        group_size=2,
        instances=2,
        turns=(2, 3),
        mutation_p=1.0,
        hostile=(act,),
        max_consecutive_failures=3,
    )
    base.update(overrides)
    return Scenario(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "act",
    [
        HostileAct(kind="raise_after_mutation", row=1, slot=0, turn=1),
        HostileAct(kind="nan_reward", row=2, slot=1, turn=3),
        HostileAct(kind="inf_reward", row=0, slot=0, turn=3),
        HostileAct(kind="set_payload", row=3, slot=1, turn=3),
        HostileAct(kind="nan_payload", row=1, slot=1, turn=3),
        HostileAct(kind="export_raises", n=5),
        HostileAct(kind="export_set", n=5),
        HostileAct(kind="export_nan", n=5),
    ],
    ids=lambda a: a.kind,
)
@modes
def test_a_hostile_act_strikes_and_nothing_is_lost_or_repeated(
    tmp_path: Path, act: HostileAct, mode: CheckpointMode
) -> None:
    """Each act strikes the first life; the run finishes, exactly once, with no data
    failure beyond what the act accounts for and no invariant abort."""
    sc = _one_act(act, mode)
    if act.kind in EPISODE_ACTS:  # strike an episode that ends: give it enough turns
        sc = attrs.evolve(sc, turns=(3, 3), hostile=(attrs.evolve(act, turn=min(act.turn, 3)),))
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    struck = dict(report.lives[0].hostile_fired)
    assert struck.get(act.kind, 0) >= 1, report.lives[0]
    assert report.ok, report.violations
    _took_mid_turn_as(report.lives, mode)


def _took_mid_turn_as(lives: Sequence[LifeReport], mode: CheckpointMode) -> None:
    """Aligned checkpoints took episodes mid-turn only past the alignment timeout (the
    simulation's ``ModeWatch`` holds each commit to its prepare: the report is ok); unaligned
    ones that took episodes took some mid-turn (the calendar agent is inside a turn nearly all
    the time)."""
    assert {i.checkpoint_mode for i in lives} == {mode.value}
    mid_turn = sum(i.episodes_mid_turn for i in lives)
    taken = sum(i.episodes_taken for i in lives)
    if mode is CheckpointMode.ALIGNED:
        assert mid_turn <= taken
    elif taken:
        assert mid_turn > 0


@modes
def test_a_hanging_step_does_not_hang_the_run(tmp_path: Path, mode: CheckpointMode) -> None:
    """A step that never returns: aligned, the checkpoints that cannot park it fail
    (retryable); unaligned, they take it at its last boundary and succeed. The reply stream's
    deadline abandons the attempt, and a fresh attempt trains the row."""
    sc = _one_act(HostileAct(kind="hang", row=0, slot=0, turn=1), mode, max_consecutive_failures=3)
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    first = report.lives[0]
    assert dict(first.hostile_fired).get("hang") == 1
    assert report.ok, report.violations
    assert report.rows_trained + report.rows_failed == sc.rows
    _took_mid_turn_as(report.lives, mode)
    if mode is CheckpointMode.UNALIGNED:  # nothing waits for the hung turn
        assert all(ok for _, ok, _ in first.checkpoints), first.checkpoints


@pytest.mark.parametrize(
    "act",
    [
        HostileAct(kind="short_write", n=3),
        HostileAct(kind="torn_record", n=4),
        HostileAct(kind="full_disk", n=3, count=2),
    ],
    ids=lambda a: a.kind,
)
@modes
def test_a_journal_fault_keeps_every_mutation_once(
    tmp_path: Path, act: HostileAct, mode: CheckpointMode
) -> None:
    """Short writes, a torn record (the instance dies inside its append and is replaced) and a
    full disk under the journal: an infrastructure failure, never a data failure, never the
    end of the run, and every sentinel once."""
    sc = _one_act(act, mode, stage_deaths=((2, "before_prepare"),))  # a replacement replays it
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    assert dict(report.lives[0].hostile_fired).get(act.kind, 0) >= 1
    assert report.ok, report.violations
    _took_mid_turn_as(report.lives, mode)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_hostile_ci_seeds_hold_their_invariants(tmp_path: Path) -> None:
    drawn = {draw_scenario(s, hostile=True).checkpoint_mode for s in range(HOSTILE_CI_SEEDS)}
    assert drawn == set(MODES)  # both modes among the CI seeds
    assert (
        main_simulate(
            HOSTILE_CI_SEEDS,
            0,
            as_json=False,
            tmp_root=tmp_path,
            progress=lambda _line: None,
            hostile=True,
        )
        == 0
    )


def test_the_cli_documents_and_reports_the_hostile_dimension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli_main(["simulate", "--help"])
    assert "--hostile" in capsys.readouterr().out
    main_simulate(2, 3, as_json=True, tmp_root=tmp_path, hostile=True)
    out = orjson.loads(capsys.readouterr().out)
    assert out["hostile"] is True and isinstance(out["hostile_fired"], dict)
    main_simulate(1, 3, as_json=True, tmp_root=tmp_path)
    assert orjson.loads(capsys.readouterr().out)["hostile"] is False


# -- the injection points themselves ----------------------------------------------------------


def test_journal_faults_strike_only_journal_writes_and_are_undone(tmp_path: Path) -> None:
    killed: list[str] = []
    acts = HostileActs(
        (
            HostileAct(kind="short_write", n=1),
            HostileAct(kind="full_disk", n=2),
            HostileAct(kind="torn_record", n=3),
        )
    )
    journal = tmp_path / "gym-1" / JOURNAL_FILE
    journal.parent.mkdir()
    other = tmp_path / "other.bin"
    real_write = os.write
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    ofd = os.open(other, os.O_WRONLY | os.O_CREAT)
    try:
        with journal_faults(acts, killed.append):
            assert os.write(ofd, b"untouched\n") == 10  # not a journal: not counted
            assert os.write(fd, b"abcdef\n") == 3  # short: half of it
            with pytest.raises(OSError) as full:
                os.write(fd, b"ghi\n")
            assert full.value.errno == errno.ENOSPC
            assert os.write(fd, b"torn\n") == 5 and killed == ["gym-1"]
        assert os.write is real_write
    finally:
        os.close(fd)
        os.close(ofd)
    assert journal.read_bytes() == b"abctorn"
    assert other.read_bytes() == b"untouched\n"
    assert acts.writes == 3 and acts.fired == Counter(short_write=1, full_disk=1, torn_record=1)


async def test_the_hostile_calendar_is_the_calendar_when_inactive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Inactive (the last life), the hostile workplace plays the plain calendar's
    episodes: the same rewards and sentinels, nothing struck."""
    cfg = CalendarConfig(turns=(2, 3), mutation_p=1.0)
    acts = HostileActs(
        (HostileAct(kind="raise_after_mutation", row=0, slot=0, turn=0),), active=False
    )
    env = hostile_calendar_environment("simple_agent", cfg, acts)
    async with GymHost("gym-0", env, 3, None, cfg.host_config()) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        replies = [r async for batch in stream for r in batch]
    assert [type(r).__name__ for r in replies] == ["Completed"]
    assert not acts.fired


# -- the conformance kit --------------------------------------------------------------------


@pytest.mark.parametrize("act", KIT_ACTS)
async def test_the_kit_names_what_a_hostile_environment_does_wrong(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, act: str
) -> None:
    """Every act fails a named check (a hanging step: the kit's own bound), never passes."""
    env = hostile_guess_the_number(act)
    with trio.fail_after(300):
        if act == "hang":  # bounded by the kit's timeout (not yet a named check)
            with pytest.raises((ConformanceError, TimeoutError)):
                await check_environment(env, tmp_path, timeout_s=30.0)
            return
        with pytest.raises(ConformanceError) as failed:
            await check_environment(env, tmp_path)
    assert "check(s) failed" in str(failed.value)


def test_a_dataset_whose_every_row_failed_still_leaves_a_final_snapshot(tmp_path: Path) -> None:
    """Seed 606: every submission dropped, every row fails for good in the first life
    (``BudgetExhausted`` from ``batches``); the restored run finds them failed, and the
    simulated trainer still leaves a final snapshot that judges every row failed."""
    report = run_seed(606, tmp_path)
    assert report.ok, report.violations
    assert report.rows_failed == report.scenario.rows and report.rows_trained == 0
