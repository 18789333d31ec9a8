"""The simulation's real-usage dimension (``usage``, ``usage_env``) and its liveness
check (``liveness``): draws that are a function of the seed, each sub-dimension from its own
generator; each sub-dimension exercising what it says; a stalled run reported as a liveness
violation with its replay command.

On today's code several sub-dimensions find violations (issue 31's findings); these tests pin
what the dimension *does*, not that it passes: ``gymckpt simulate --seeds 10000`` with it
reporting 0 violations is the issue's closing check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.app.simulation.liveness import LIVENESS_S, Liveness, Moving, liveness_bound_s
from gymckpt.app.simulation.main import (
    Crash,
    Scenario,
    ScenarioReport,
    draw_scenario,
    main_simulate,
    replay_command,
    run_seed,
)
from gymckpt.app.simulation.usage import (
    OUTAGE_BUDGET_S,
    OUTAGE_LENGTHS_S,
    OVER_BUDGET_S,
    USAGE_NAMES,
    ConcurrentCalls,
    LongTurn,
    Outage,
    RealUsage,
    RowOrder,
    SecondTrainer,
    draw_usage,
    parse_real_usage,
    usage_flag,
)
from gymckpt.app.verdict import expected_sentinels, judge
from gymckpt.gym_adapter.environments.calendar import CalendarAgent, CalendarConfig
from gymckpt.runtime import RuntimeConfig

ALL = frozenset(USAGE_NAMES)


def counts(report: ScenarioReport) -> dict[str, float]:
    return dict(report.usage)


# -- the draws ---------------------------------------------------------------------------------


def test_the_draws_are_a_function_of_the_seed() -> None:
    for seed in range(40):
        assert draw_scenario(seed, usage=ALL) == draw_scenario(seed, usage=ALL)
    drawn = [draw_scenario(seed, usage=ALL).usage for seed in range(200)]
    assert len({u.describe() for u in drawn}) > 150  # seeds draw different usage
    # every sub-dimension is drawn by some seeds and not by others
    for field in ("order", "calls", "long_turns", "outage", "live_restart", "second_trainer"):
        hits = sum(bool(getattr(u, field)) for u in drawn)
        assert 0 < hits < len(drawn), field


def test_each_sub_dimension_has_a_generator_of_its_own() -> None:
    """Switching one sub-dimension on or off leaves every other draw of the seed as it was,
    and none of them changes the scenario's other dimensions (but the crash a live restart
    adds when the first life had none)."""
    fields = {
        "shuffle": "order",
        "calls": "calls",
        "long-turns": "long_turns",
        "outages": "outage",
        "live-restart": "live_restart",
        "second-trainer": "second_trainer",
    }
    for seed in range(100):
        base = draw_scenario(seed)
        every = draw_scenario(seed, usage=ALL)
        assert base.usage == RealUsage() and draw_scenario(seed, usage=frozenset()) == base
        assert attrs.evolve(every, usage=RealUsage(), crashes=base.crashes) == base
        if every.crashes != base.crashes:
            assert every.usage.live_restart and not (base.crashes and base.crashes[0])
        for name, field in fields.items():
            alone = draw_scenario(seed, usage=frozenset({name})).usage
            assert getattr(alone, field) == getattr(every.usage, field), (seed, name)
            others = [f for f in fields.values() if f != field]
            assert all(not getattr(alone, f) for f in others), (seed, name)


def test_the_long_turns_outlast_every_timeout() -> None:
    sc = Scenario()
    config = sc.runtime_config()
    for seed in range(300):
        usage = draw_usage(
            seed,
            {"long-turns"},
            rows=8,
            group_size=2,
            config=CalendarConfig(),
            lease_s=sc.lease_s,
            first_crash=False,
        )
        for turn in usage.long_turns:
            assert turn.seconds > max(config.control_timeout_s, config.lease_s, sc.lease_s)


def test_the_real_usage_flag() -> None:
    assert parse_real_usage("all") == ALL and parse_real_usage("none") == frozenset()
    assert parse_real_usage("calls, shuffle") == {"calls", "shuffle"}
    with pytest.raises(ValueError, match=r"unknown sub-dimension 'bogus'.*shuffle, calls"):
        parse_real_usage("shuffle,bogus")
    for chosen in (ALL, frozenset(), frozenset({"outages", "calls"})):
        assert parse_real_usage(usage_flag(chosen)) == chosen
    assert usage_flag({"outages", "calls"}) == "calls,outages"  # USAGE_NAMES order
    # the command's default is all: a replay names any other selection
    assert replay_command(3, usage=ALL) == "gymckpt simulate --seeds 1 --start 3"
    assert replay_command(3, usage=frozenset()).endswith(" --real-usage none")
    assert replay_command(3, True, frozenset({"calls"})).endswith(" --hostile --real-usage calls")


def test_a_bad_real_usage_flag_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["simulate", "--seeds", "1", "--real-usage", "shuffle,nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gymckpt: error: --real-usage: unknown sub-dimension 'nope'")
    assert err.count("\n") == 1


def test_a_drawn_order_opens_the_runs_epochs_with_their_shuffle_seed() -> None:
    order = RowOrder(rows=12, epochs=3, shuffle_seed=7)
    assert order.open_kwargs() == {"rows": 12, "epochs": 3, "shuffle_seed": 7}
    assert order.positions == 36


def test_the_verdict_counts_positions_and_each_row_once_per_epoch() -> None:
    """Two epochs of two rows: four positions, each with sentinels of its own (the same row's
    plan in both epochs), and an order that puts one row twice in an epoch is a violation."""
    config = CalendarConfig(mutation_p=1.0)
    swap = {0: 1, 1: 0, 2: 0, 3: 1}.__getitem__
    first, again = (expected_sentinels(5, config, [p], 1, row_at=swap) for p in (1, 2))
    assert first and len(first) == len(again) and not first & again  # row 0, two epochs
    ok = judge(
        [(1, [0, 1]), (2, [2, 3])],
        4,
        None,
        seed=5,
        config=config,
        group_size=1,
        row_at=swap,
        per_epoch=2,
        calendar=False,
    )
    assert ok.ok and ok.rows_trained == 4
    twice = judge(
        [(1, [0, 1]), (2, [2, 3])],
        4,
        None,
        seed=5,
        config=config,
        group_size=1,
        row_at=lambda p: p // 2,
        per_epoch=2,
        calendar=False,
    )
    assert twice.rows_twice_in_epoch == (0, 1)
    assert "dataset rows at two positions of one epoch" in twice.violations()[0]


def test_shuffled_epochs_train_every_row_once_per_epoch_across_a_crash(tmp_path: Path) -> None:
    order = RowOrder(rows=5, epochs=3, shuffle_seed=11)
    sc = Scenario(seed=5, rows=5, group_size=2, instances=2, crashes=(Crash(at_s=2.0),))
    sc = attrs.evolve(sc, usage=RealUsage(names=ALL, order=order))
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    assert report.ok, report.violations
    assert report.rows_trained == 15 and report.lives[0].end == "crashed"
    assert report.sentinels > 0


# -- each sub-dimension exercises what it says ----------------------------------------------------


def run(tmp_path: Path, **usage: Any) -> ScenarioReport:
    sc = Scenario(
        seed=5,
        rows=6,
        group_size=2,
        instances=2,
        usage=RealUsage(names=ALL, **usage),
    )
    return run_seed(sc.seed, tmp_path, scenario=sc)


def test_shuffled_rows_are_trained_in_their_order(tmp_path: Path) -> None:
    order = RowOrder(rows=6, epochs=1, shuffle_seed=3)
    sc = Scenario(seed=5, rows=6, group_size=1, instances=1, max_rows_in_flight=1)
    sc = attrs.evolve(sc, groups_per_step=1, usage=RealUsage(names=ALL, order=order))
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    assert counts(report)["shuffled_runs"] == 1 and report.ok, report.violations
    # one row in flight, one group a step: the steps train the rows in the drawn order
    assert report.rows_trained == 6 and report.steps == 6


def test_concurrent_calls_run_in_one_turn(tmp_path: Path) -> None:
    calls = ConcurrentCalls(p=1.0, fanout=3, identical=False)
    report = run(tmp_path, calls=calls)
    c = counts(report)
    assert c["episodes_with_concurrent_calls"] >= 12  # every episode, every turn
    assert c["concurrent_turns"] >= 2 * c["episodes_with_concurrent_calls"]
    # no restore, nothing to replay: the calls themselves are fine
    assert report.ok, report.violations


def test_a_long_turn_outlasts_the_lease(tmp_path: Path) -> None:
    long = LongTurn(row=1, slot=0, turn=0, seconds=75.0)
    report = run(tmp_path, long_turns=(long,))
    assert counts(report)["long_turns"] >= 1
    assert report.virtual_s > 75.0


def test_an_outage_refuses_the_model_calls_in_its_window(tmp_path: Path) -> None:
    report = run(tmp_path, outage=Outage(start_s=0.0, length_s=15.0))
    c = counts(report)
    assert c["outage_s"] == 15.0 and c["outage_refused_calls"] > 0


def test_every_outage_but_the_over_budget_one_fits_the_default_budget() -> None:
    """The simulation's runtime keeps the default outage budget, which every drawn length is
    under (a model server's restart is waited out); the over-budget length is past it."""
    sc = Scenario(seed=1, rows=2, group_size=1, instances=1)
    assert sc.runtime_config().outage_budget_s == RuntimeConfig().outage_budget_s
    assert max(OUTAGE_LENGTHS_S) < OUTAGE_BUDGET_S < OVER_BUDGET_S
    drawn = [draw_scenario(s, usage=ALL).usage.outage for s in range(400)]
    lengths = {o.length_s for o in drawn if o is not None}
    assert lengths == {*OUTAGE_LENGTHS_S, OVER_BUDGET_S}


def test_an_outage_over_the_budget_ends_with_exit_8_then_the_run_comes_back(
    tmp_path: Path,
) -> None:
    report = run(tmp_path, outage=Outage(start_s=0.0, length_s=OVER_BUDGET_S))
    assert report.ok, report.violations
    first = report.lives[0]
    assert first.end == "infra_outage" and "outage_budget_s=300" in (first.error or "")
    assert report.lives[-1].end == "finished" and report.rows_trained == 6


def test_a_live_restart_restores_into_the_running_gym(tmp_path: Path) -> None:
    sc = Scenario(
        seed=5,
        rows=8,
        group_size=2,
        instances=2,
        turn_s=(1.0, 2.0),
        crashes=(Crash(at_s=3.0),),
        usage=RealUsage(names=ALL, live_restart=True),
    )
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    assert counts(report)["live_restarts"] == 1
    first, second = report.lives[:2]
    assert first.end == "crashed" and second.end != "crashed"


def test_a_second_trainer_attaches_and_is_judged(tmp_path: Path) -> None:
    report = run(tmp_path, second_trainer=SecondTrainer(at_s=0.5))
    c = counts(report)
    assert c["second_trainers_refused"] + c["second_trainers_let_in"] == 1
    if c["second_trainers_let_in"]:  # today: nothing refuses it (issue 31, finding 3)
        assert any("second trainer" in v for v in report.violations)


def test_the_summary_counts_what_each_sub_dimension_exercised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main_simulate(4, 0, as_json=False, tmp_root=tmp_path, usage=frozenset({"calls"}))
    out = capsys.readouterr().out
    assert "real usage calls: " in out and "episodes_with_concurrent_calls" in out
    assert "longest still " in out


# -- liveness ----------------------------------------------------------------------------------


def test_the_liveness_bound_adds_the_workloads_own_waits() -> None:
    usage = RealUsage(
        long_turns=(LongTurn(row=0, slot=0, turn=0, seconds=90.0),),
        outage=Outage(start_s=1.0, length_s=60.0),
    )
    assert usage.longest_wait_s == 150.0
    assert liveness_bound_s(usage.longest_wait_s) == LIVENESS_S + 150.0
    assert liveness_bound_s(RealUsage().longest_wait_s) == LIVENESS_S


def test_a_stalled_run_is_a_liveness_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every episode's turn waits forever: nothing is trained, no checkpoint is taken, no
    attempt resolves. Each life is cut at the liveness bound (virtual time: this runs
    in milliseconds), reported with the seed's replay command."""

    async def stuck(self: Any, ctx: Any, state: Any) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(CalendarAgent, "step", stuck)
    sc = Scenario(seed=9, rows=3, group_size=1, instances=1, max_rows_in_flight=3)
    sc = attrs.evolve(sc, groups_per_step=1, max_lives=2)
    report = run_seed(sc.seed, tmp_path, scenario=sc)
    assert not report.ok
    assert [i.end for i in report.lives] == ["no_progress", "no_progress"]
    assert report.violations[0] == (
        f"incarnation 0: liveness: nothing moved for {LIVENESS_S:g} virtual s (no row "
        "trained, no checkpoint, no attempt resolved) since the open (and restore) at "
        "0.000s, and the run did not end"
    )
    assert report.virtual_s == pytest.approx(2 * LIVENESS_S)  # cut at the bound, not later
    assert report.to_json()["replay"] == "gymckpt simulate --seeds 1 --start 9 --real-usage none"


def test_a_run_that_moves_is_not_cut(tmp_path: Path) -> None:
    """A healthy run keeps moving: its longest stretch with nothing moving is far below the
    bound (the lease the simulation waits out after the dataset is the longest)."""
    report = run_seed(3, tmp_path)
    assert report.ok and 0 < report.longest_still_s < LIVENESS_S / 10


async def test_every_reply_batch_moves(autojump_clock: trio.testing.MockClock) -> None:
    """The Gym as the runtime sees it counts each batch of replies (attempts resolved) as a
    move, and pushes the liveness deadline to a bound after it."""

    class Stream:
        def __init__(self) -> None:
            self.batches: list[list[str]] = [["a", "b"], ["c"]]

        def __aiter__(self) -> Stream:
            return self

        async def __anext__(self) -> list[str]:
            await trio.sleep(100.0)
            if not self.batches:
                raise StopAsyncIteration
            return self.batches.pop(0)

        async def aclose(self) -> None:
            pass

    class Backend:
        async def run(self, instance: str, rows: Any) -> Stream:
            return Stream()

        def statistics(self) -> str:
            return "forwarded"

    watch = Liveness(bound_s=150.0)
    watch.arm()
    backend = Moving(Backend(), watch)
    assert backend.statistics() == "forwarded"
    with watch.scope:
        stream = await backend.run("gym-0", [])
        got = [batch async for batch in stream]
    assert got == [["a", "b"], ["c"]] and not watch.stalled  # 300 s, never 150 s still
    assert watch.moves == 2 and watch.last_move == "1 attempt(s) resolved"
    assert watch.longest_still_s == pytest.approx(100.0)
    assert watch.scope.deadline == pytest.approx(trio.current_time() + 50.0)
