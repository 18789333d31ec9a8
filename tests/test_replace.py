"""Self-healing: a Gym instance that dies is replaced under its name, and the run goes on
exactly once (``nurseries._replace``, ``RecoveryLedger.release_instance``,
``EmbeddedGym.replace``, the calendar's durable environment log)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.simulation.main import Crash, Scenario, run_scenario
from gymckpt.app.verdict import judge
from gymckpt.gym_adapter import (
    Completed,
    EmbeddedGym,
    GymHost,
    GymInstanceDead,
    ReplyStream,
    RunReply,
    RunRow,
    can_replace,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    CalendarServer,
    calendar_environment,
    calendar_host,
    calendar_state,
)
from gymckpt.gym_adapter.host._journal import JOURNAL_FILE, replay_journal
from gymckpt.nurseries import HOOK_POINTS, ExitCode, open_rollouts, run_exit
from gymckpt.runtime import (
    CheckpointsFailed,
    EpisodeResult,
    InfraOutage,
    RecoveryLedger,
    ReplacementsExhausted,
    RetireItem,
    RuntimeConfig,
)

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)
BASE = Scenario(
    seed=5,
    rows=12,
    group_size=2,
    instances=2,
    turns=(2, 4),
    turn_s=(0.2, 1.0),
    max_rows_in_flight=6,
    groups_per_step=2,
    checkpoint_every=1,
    max_consecutive_failures=2,
)


async def _train_all(ro: Any, groups: int = 2, *, checkpoint: bool = True) -> list[list[str]]:
    """Train every batch (a checkpoint after each); the rollout IDs of every trained group."""
    trained: list[list[str]] = []
    async with aclosing(ro.batches(groups)) as batches:
        async for batch in batches:
            trained.extend(list(g.rollout_ids) for g in batch)
            if checkpoint:
                await ro.checkpoint()
    final = await ro.checkpoint()
    assert final.ok, final.error
    return trained


# -- the ledger -----------------------------------------------------------------------------------


def test_release_instance_resends_fresh_at_no_cost_and_fences_late_replies() -> None:
    ledger = RecoveryLedger(group_size=2)
    mutate = ledger.barrier.mutate_nowait
    mutate(lambda: (ledger.reserve_row(0), ledger.reserve_row(1)))
    mutate(lambda: ledger.mark_dispatched(["0-0", "0-1"], "gym-0", 1))
    mutate(lambda: ledger.mark_dispatched(["1-0", "1-1"], "gym-1", 1))

    fresh, unpinned = mutate(lambda: ledger.release_instance("gym-0"))

    assert sorted(a.rollout_id for a in fresh) == ["0-0-a1", "0-1-a1"] and unpinned == []
    assert all(a.state.value == "reserved" for a in fresh)
    stats = ledger.statistics()
    assert stats.row_attempts_spent == 0 and stats.data_failures == 0  # the row did no wrong
    assert stats.released_total == stats.abandoned_total == 2
    # the replacement frees their sessions before the next checkpoint commits
    assert sorted(ledger.retire_queue()["gym-0"], key=lambda i: i.rollout_id) == [
        RetireItem("0-0", "gym-0"),
        RetireItem("0-1", "gym-0"),
    ]
    assert ledger.held_by("gym-0") == frozenset()
    assert ledger.held_by("gym-1") == {"1-0", "1-1"}  # the other instance is untouched
    # fencing: a late reply of the dead attempt names an attempt that is no longer current
    assert not mutate(lambda: ledger.complete("0-0", 1, EpisodeResult(1.0, 2)))
    assert ledger.statistics().stale_replies == 1
    assert mutate(lambda: ledger.release_instance("gym-9")) == ([], [])


# -- the runtime, embedded ------------------------------------------------------------------------


async def test_instance_dying_mid_run_is_replaced_and_costs_no_row_attempt(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=SIM.host_config(),
        ) as gym,
        open_rollouts(
            gym,
            tmp_path,
            rows=12,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=6,
            handle_signals=False,
        ) as ro,
    ):
        await trio.sleep(0.5)
        held = ro.ledger.held_by("gym-1")
        assert held  # it dies with episodes in flight
        gym.sim("gym-1").kill()
        trained = await _train_all(ro)
        stats = ro.ledger.statistics()
        assert stats.row_attempts_spent == 0 and stats.rows_failed == 0
        assert stats.released_total >= len(held)
        assert gym.replacement_count("gym-1") == 1 and gym.replacement_count("gym-0") == 0
        replacer = ro.dispatcher.replacer.statistics()
        assert replacer.deaths == replacer.replacements == 1 and replacer.down == ()
        assert replacer.last_replacement_s is not None
        assert ro.metrics.get("rollout/instances_replaced_total") == 1
        final = ro.outcomes[-1].snapshot
    rows = [int(ids[0].split("-")[0]) for ids in trained]
    assert sorted(rows) == list(range(12))
    assert not held & {rid for ids in trained for rid in ids}  # re-sent under new IDs
    assert final is not None
    verdict = judge(
        [(i + 1, (r,)) for i, r in enumerate(rows)],
        12,
        final.path,
        seed=3,
        config=SIM,
        group_size=2,
    )
    assert verdict.ok, verdict.violations()  # every sentinel once, the dead one's included


async def test_a_late_reply_of_the_dead_instance_is_rejected(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The death is reported by a checkpoint; only after the replacement serves does a stream of
    the dead instance deliver replies for its rows. The ledger rejects them by identity and gate
    ID: the rows are trained from their fresh attempts, never from the stale replies."""
    replaced = trio.Event()
    late: list[str] = []

    class LateStream:
        def __init__(self, inner: ReplyStream, rows: Sequence[RunRow]) -> None:
            self.inner, self.rows = inner, list(rows)

        def __aiter__(self) -> LateStream:
            return self

        async def __anext__(self) -> Sequence[RunReply]:
            try:
                return await self.inner.__anext__()
            except GymInstanceDead:
                if not self.rows:
                    raise
                await replaced.wait()
                rows, self.rows = self.rows, []
                late.extend(r.rollout_id for r in rows)
                return [Completed(r.rollout_id, -999.0, 1) for r in rows]

        async def aclose(self) -> None:
            await self.inner.aclose()

    class LateGym:
        def __init__(self, gym: EmbeddedGym) -> None:
            self.gym = gym

        async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
            stream = await self.gym.run(instance, rows)
            return LateStream(stream, rows) if instance == "gym-0" else stream

        def __getattr__(self, name: str) -> Any:
            return getattr(self.gym, name)

    async with (
        EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=4,
            work_dir=tmp_path / "gym",
            config=SIM.host_config(),
        ) as gym,
        open_rollouts(
            LateGym(gym),
            tmp_path,
            rows=10,
            group_size=2,  # type: ignore[arg-type]
            config=CONFIG,
            max_rows_in_flight=6,
            handle_signals=False,
        ) as ro,
    ):
        replacer = ro.dispatcher.replacer
        on_up = replacer.on_up
        replacer.on_up = lambda name: (on_up(name), replaced.set())[0]

        def kill(_cid: str, point: str) -> None:
            if point == "before_prepare" and not gym.sim("gym-0").dead and not late:
                gym.sim("gym-0").kill()  # the checkpoint's prepare meets the death

        await trio.sleep(0.5)
        ro.coordinator.on_stage = kill
        first = await ro.checkpoint()
        assert not first.ok and first.reason == "gym_unavailable"
        ro.coordinator.on_stage = None
        trained = await _train_all(ro)
        assert late, "the dead instance's stream never delivered its late replies"
        assert ro.ledger.statistics().stale_replies >= len(late)
        assert ro.ledger.statistics().released_total >= len(late)  # released by the replacer
        final = ro.outcomes[-1].snapshot
    rows = [int(ids[0].split("-")[0]) for ids in trained]
    assert sorted(rows) == list(range(10))
    assert not set(late) & {rid for ids in trained for rid in ids}
    assert final is not None  # the dead attempts' sessions were freed on the replacement
    verdict = judge(
        [(i + 1, (r,)) for i, r in enumerate(rows)],
        10,
        final.path,
        seed=4,
        config=SIM,
        group_size=2,
    )
    assert verdict.ok, verdict.violations()


@pytest.mark.parametrize("point", HOOK_POINTS)
async def test_death_between_checkpoint_stages_is_survived_exactly_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, point: str
) -> None:
    """An instance dies at each point between two checkpoint stages: the checkpoint that met
    the death fails as gym_unavailable (or, past commit, publishes without what died), the
    next one succeeds with the replacement in the topology, and the run finishes in the same
    process with every row, step and sentinel once."""
    sc = attrs.evolve(BASE, stage_deaths=((2, point),))
    report = await run_scenario(sc, tmp_path)
    assert report.ok, report.violations
    first = report.lives[0]
    assert first.end == "finished" and first.replacements == 1, first
    assert all(r == "gym_unavailable" for _, ok, r in first.checkpoints if not ok)
    failed = [cid for cid, ok, _ in first.checkpoints if not ok]
    assert len(failed) <= 1 and first.checkpoints[-1][1]
    if point in ("before_prepare", "after_prepare"):
        assert failed == ["i0-0002"], first.checkpoints  # the checkpoint that met it
    assert report.rows_trained == BASE.rows and report.rows_failed == 0


async def test_restored_episodes_of_a_dead_instance_are_rerun_fresh_never_claimed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """After a restore the only instance dies before any claim reaches it: its unclaimed
    restored episodes run from scratch on the replacement (none claimed, none lost, every
    sentinel once: the dead attempts' sessions are freed before the next commit)."""
    sc = attrs.evolve(
        BASE,
        instances=1,
        restore_faults=("run:dead@1",),
        crashes=(Crash(checkpoint=2, point="after_publish"),),
    )
    report = await run_scenario(sc, tmp_path)
    assert report.ok, report.violations
    restored = report.lives[1]
    assert restored.restored_from == "i0-0002" and restored.end == "finished", restored
    assert restored.replacements == 1 and restored.claims == 0, restored
    assert restored.metrics["rollout/attempts_lost_to_dead_instances_total"] > 0


async def test_an_instance_that_crashes_after_serving_spends_its_budget_and_stops_the_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash loop: gym-1 dies, its replacement serves episodes, dies again... Each death of
    an instance that served since its last replacement is charged; one past
    ``max_replacements`` stops the run with exit 5."""
    config = attrs.evolve(CONFIG, max_replacements=2, replacement_window_s=600.0)
    caplog.set_level(logging.ERROR, logger="gymckpt")
    kills = 0
    with pytest.raises(BaseException) as caught:  # a nursery's exception group
        async with (
            EmbeddedGym.host(
                calendar_environment(config=SIM),
                instances=2,
                seed=3,
                work_dir=tmp_path / "gym",
                config=SIM.host_config(),
            ) as gym,
            open_rollouts(
                gym, tmp_path, rows=200, group_size=2, config=config, handle_signals=False
            ) as ro,
        ):
            replacer = ro.dispatcher.replacer

            async def crash_after_serving() -> None:
                nonlocal kills
                while True:
                    await trio.sleep(0.1)
                    s = replacer.statistics()
                    if "gym-1" in s.down or "gym-1" in s.outages or not ro.ledger.held_by("gym-1"):
                        continue  # being replaced, or not served since: not a crash loop yet
                    kills += 1
                    gym.sim("gym-1").kill()
                    await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(crash_after_serving)
                await _train_all(ro, checkpoint=False)
                nursery.cancel_scope.cancel()  # it never stopped: the test fails below
    decided = run_exit(caught.value)  # type: ignore[arg-type]
    assert decided is not None and decided[0] == ExitCode.REPLACEMENTS_EXHAUSTED == 5
    err = decided[1]
    assert isinstance(err, ReplacementsExhausted)
    assert kills == 3 and err.instance == "gym-1"
    assert err.replacements == 2 and err.window_s == 600.0
    assert "instance gym-1 died again after 2 replacements within 600s" in str(err)
    assert "max_replacements" in str(err)
    stops = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert stops == [f"the run stops: {err}"]


async def test_an_instance_that_dies_before_it_serves_is_an_outage_bounded_by_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every ``run`` kills its instance: no replacement ever serves an episode. That is one
    outage per instance, not a crash loop: the replacements are spaced by a growing backoff,
    charged once, and past ``outage_budget_s`` the run stops with exit 8 naming the
    instance. No row is given up meanwhile."""
    config = attrs.evolve(CONFIG, max_replacements=2, outage_budget_s=30.0)
    caplog.set_level(logging.ERROR, logger="gymckpt")
    with pytest.raises(BaseException) as caught:  # a nursery's exception group
        async with (
            EmbeddedGym.host(
                calendar_environment(config=SIM),
                instances=2,
                seed=3,
                work_dir=tmp_path / "gym",
                faults=["run:dead"],
                config=SIM.host_config(),
            ) as gym,
            open_rollouts(
                gym, tmp_path, rows=12, group_size=2, config=config, handle_signals=False
            ) as ro,
        ):
            try:
                await _train_all(ro)
            finally:
                stats = ro.ledger.statistics()
                replaced = gym.replacement_count("gym-0"), gym.replacement_count("gym-1")
    decided = run_exit(caught.value)  # type: ignore[arg-type]
    assert decided is not None and decided[0] == ExitCode.INFRA_OUTAGE == 8, caught.value
    err = decided[1]
    assert isinstance(err, InfraOutage)
    assert err.what in ("gym instance gym-0", "gym instance gym-1")
    assert err.down_s > 30.0 and err.budget_s == 30.0
    assert str(err).startswith(f"{err.what} down for ") and "outage_budget_s=30" in str(err)
    assert "died" in err.last
    # spaced by the backoff (capped at infra_backoff_max_s = 2 s): about 15 in 30 s, not
    # max_replacements (2) in a few milliseconds
    assert all(10 <= n <= 40 for n in replaced), replaced
    assert stats.rows_failed == 0 and stats.row_attempts_spent == 0 and stats.data_failures == 0


async def test_a_backend_that_cannot_replace_keeps_the_instance_dead(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class NoReplace:
        def __init__(self, gym: EmbeddedGym) -> None:
            self.gym = gym

        def __getattr__(self, name: str) -> Any:
            if name == "replace":
                raise AttributeError(name)
            return getattr(self.gym, name)

    caplog.set_level(logging.ERROR, logger="gymckpt")
    with pytest.raises(BaseException) as caught:  # a nursery's exception group
        async with EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            faults=["run:dead@1"],
            config=SIM.host_config(),
        ) as gym:
            backend = NoReplace(gym)
            assert not can_replace(backend)
            async with open_rollouts(
                backend,
                tmp_path,
                rows=8,  # type: ignore[arg-type]
                group_size=2,
                config=CONFIG,
                handle_signals=False,
            ) as ro:
                await _train_all(ro)
    decided = run_exit(caught.value)  # type: ignore[arg-type]
    assert decided is not None and decided[0] == ExitCode.CHECKPOINTS_FAILED
    assert isinstance(decided[1], CheckpointsFailed) and "is dead" in str(decided[1])
    assert "cannot replace instances (no replace method)" in caplog.text


async def test_a_report_about_an_older_generation_is_ignored(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=SIM.host_config(),
        ) as gym,
        open_rollouts(
            gym, tmp_path, rows=4, group_size=2, config=CONFIG, handle_signals=False
        ) as ro,
    ):
        replacer = ro.dispatcher.replacer
        gym.sim("gym-0").kill()
        assert replacer.report_dead("gym-0", 0, "test")
        assert not replacer.is_up("gym-0") and not replacer.report_dead("gym-0", 0)
        await replacer.wait_up(trio.current_time() + 10.0)
        assert replacer.is_up("gym-0") and replacer.generation("gym-0") == 1
        assert not replacer.report_dead("gym-0", 0, "a stream of the dead one, late")
        assert replacer.is_up("gym-0") and gym.replacement_count("gym-0") == 1
        await _train_all(ro, checkpoint=False)


async def test_a_hosted_user_environment_is_replaced_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        EmbeddedGym.host(
            "gymckpt.testing.examples:guess_the_number",
            instances=2,
            work_dir=tmp_path / "gym",
            faults=["run:dead@2"],
        ) as gym,
        open_rollouts(
            gym,
            tmp_path,
            rows=8,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=4,
            handle_signals=False,
        ) as ro,
    ):
        trained = await _train_all(ro)
        assert sum(gym.replacement_count(n) for n in gym.instances) == 1
        assert ro.ledger.statistics().row_attempts_spent == 0
    assert sorted(int(ids[0].split("-")[0]) for ids in trained) == list(range(8))


# -- the embedded replacement and the durable calendar log ---------------------------------------


async def test_replace_kills_a_live_instance_and_times_out_past_its_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM), instances=1, work_dir=tmp_path, config=SIM.host_config()
    ) as gym:
        old = gym.sim("gym-0")
        await gym.replace("gym-0", trio.current_time() + 1.0)
        assert old.dead and gym.sim("gym-0") is not old and not gym.sim("gym-0").dead
        stats = await gym.statistics()
        assert [s.dead for s in stats.replaced] == [True]
        with pytest.raises(GymInstanceDead):
            await old.prepare("c", trio.current_time() + 1.0)
        with pytest.raises(TimeoutError, match="gym-0 replace"):
            await gym.replace("gym-0", trio.current_time() - 1.0)


def test_journal_replays_slots_and_ignores_only_a_torn_last_line() -> None:
    ev = {"turn": 0, "title": "m", "sentinel": "s0"}
    log = (
        b'["n","0-0","0-0",0,{"calendar":{"events":[]}}]\n'
        + orjson.dumps(["s", "0-0", "calendar", {"events": [ev]}])
        + b"\n"
        + b'["n","1-0","1-0",0,{"calendar":{"events":[]}}]\n["o","0-0","0-0-a1",1]\n'
        b'["d","1-0"]\n'
    )
    slots = replay_journal(log)
    assert list(slots) == ["0-0"]
    s = slots["0-0"]
    assert (s.rollout_id, s.attempt, s.states) == ("0-0-a1", 1, {"calendar": {"events": [ev]}})
    torn = replay_journal(log + b'["s","0-0","calendar",{"ev')  # the last append torn
    assert {k: (v.rollout_id, v.states) for k, v in torn.items()} == {
        "0-0": ("0-0-a1", {"calendar": {"events": [ev]}})
    }
    with pytest.raises(ValueError, match="line 2"):
        replay_journal(b'["n","0-0","0-0",0,{}]\n["x"]\n["d","0-0"]\n')


async def test_journal_fresh_instance_starts_empty_and_recovers_only_when_asked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cfg = CalendarConfig(turns=(2, 2), turn_s=(0.01, 0.01), mutation_p=1.0)
    async with calendar_host("gym-0", work_dir=tmp_path, config=cfg, recover=False) as sim:
        stream = await sim.run([RunRow("0-0", 0, 0, 0)])
        assert [r.rollout_id async for batch in stream for r in batch] == ["0-0"]
        state = calendar_state(sim)
        assert state["0-0"].sentinels
    assert sim.journal_path is not None and sim.journal_path.exists()
    async with calendar_host("gym-0", work_dir=tmp_path, config=cfg, recover=True) as again:
        assert calendar_state(again) == state
        assert (await again.retire(["0-0"], trio.current_time() + 1)).retired == ("0-0",)
    async with calendar_host("gym-0", work_dir=tmp_path, config=cfg, recover=True) as third:
        assert calendar_state(third) == {}  # the freeing was journaled too
    async with calendar_host("gym-0", work_dir=tmp_path, config=cfg, recover=False) as fresh:
        assert calendar_state(fresh) == {}


# -- the demo: done when, and its JSON object on every exit path --------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize("fault", ["prepare:dead@4", "commit:dead@2", "run:dead@3"])
def test_demo_survives_a_dead_instance_exactly_once(tmp_path: Path, fault: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--instances",
            "3",
            "--rows",
            "128",
            "--fault",
            fault,
            "--json",
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["exactly_once"] is True and report["exit_code"] == 0, report
    assert report["lost"] == report["duplicates"] == report["sentinels_duplicated"] == 0
    assert report["sentinels_missing"] == 0 and report["rows_trained"] == 128
    assert report["replacements"] >= 1  # both phases see the fault (each counts its own calls)


def test_demo_json_on_a_phase_that_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gymckpt.app.cli import main

    rc = main(
        [
            "demo",
            "--rows",
            "8",
            "--instances",
            "2",
            "--crash-after-checkpoint",
            "0",
            "--fault",
            "prepare:dead",
            "--json",
            "--workdir",
            str(tmp_path / "w"),
        ]
    )
    out = capsys.readouterr()
    report = json.loads(out.out)
    # every prepare kills an instance: the checkpoint bound or the replacement budget stops it
    assert rc in (4, 5) and report["exit_code"] == rc, out.err
    assert report["exactly_once"] is False and report["error"]
    assert (
        "checkpoints failed in a row" in report["error"] or "max_replacements" in report["error"]
    ), report["error"]
    assert report["rows"] == 8 and "rows_trained" in report


@pytest.mark.parametrize(
    "argv",
    [
        ["--rows", "0"],  # bad option value
        ["--rows", "x"],  # bad flag (argparse)
        ["--fault", "prepare:explode"],  # bad fault spec
        ["--workdir", "NONEMPTY"],  # a work directory in use
    ],
)
def test_demo_json_on_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    from gymckpt.app.cli import main

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    argv = [str(tmp_path / "busy") if a == "NONEMPTY" else a for a in argv]
    try:
        rc = main(["demo", "--json", *argv])
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    assert rc == 2
    report = json.loads(out.out)
    assert report["exactly_once"] is False and report["exit_code"] == 2 and report["error"]


async def test_journal_torn_tail_is_cut_before_the_replacement_appends(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    log = tmp_path / "gym-0" / JOURNAL_FILE
    log.parent.mkdir()
    ev = {"turn": 0, "title": "m", "sentinel": "s0"}
    log.write_bytes(
        b'["n","0-0","0-0",0,{"calendar":{"events":[]}}]\n'
        + orjson.dumps(["s", "0-0", "calendar", {"events": [ev]}])
        + b'\n["s","0-0","calendar",{"events":['
    )
    async with calendar_host("gym-0", work_dir=tmp_path, recover=True) as sim:
        assert calendar_state(sim)["0-0"].sentinels == ("s0",)
        await sim.retire(["0-0"], trio.current_time() + 1)
    assert replay_journal(log.read_bytes()) == {}  # the freeing replays after the cut


async def test_a_journal_the_environment_cannot_restore_is_refused_by_name(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    log = tmp_path / "gym-0" / JOURNAL_FILE
    log.parent.mkdir()
    log.write_bytes(b'["n","0-0","0-0",0,{"calendar":{"nope":1}}]\n')
    with pytest.raises(ValueError, match="journaled session 0-0 cannot be restored"):
        async with calendar_host("gym-0", work_dir=tmp_path, recover=True):
            pass


async def test_the_next_checkpoint_waits_for_a_slow_replacement(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A replacement that takes a while (a Ray actor being scheduled): the checkpoint after
    the one that met the death waits for it (bounded by replace_timeout_s) and succeeds with
    the replacement in the topology, instead of failing against the dead instance again."""

    class SlowReplace:
        def __init__(self, gym: EmbeddedGym) -> None:
            self.gym = gym

        async def replace(self, instance: str, deadline_ts: float) -> None:
            await trio.sleep(5.0)
            await self.gym.replace(instance, deadline_ts)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.gym, name)

    async with (
        EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=SIM.host_config(),
        ) as gym,
        open_rollouts(
            SlowReplace(gym),
            tmp_path,
            rows=8,  # type: ignore[arg-type]
            group_size=2,
            config=CONFIG,
            handle_signals=False,
        ) as ro,
    ):
        await trio.sleep(0.5)

        def kill(_cid: str, point: str) -> None:
            if point == "before_prepare":
                gym.sim("gym-1").kill()

        ro.coordinator.on_stage = kill
        first = await ro.checkpoint()
        ro.coordinator.on_stage = None
        assert not first.ok and first.reason == "gym_unavailable" and "gym-1" in str(first.error)
        started = trio.current_time()
        second = await ro.checkpoint()
        assert second.ok, second.error
        assert trio.current_time() - started >= 4.0  # it waited for the replacement
        assert gym.replacement_count("gym-1") == 1
        assert second.snapshot is not None
        await _train_all(ro, checkpoint=False)


class _FailingCalendar(CalendarServer):
    failing = False  # class-wide: the participant is frozen

    def open(self, info: Any) -> Any:
        if _FailingCalendar.failing:
            raise ZeroDivisionError("opening failed")
        return super().open(info)


async def test_a_fresh_attempt_whose_sessions_fail_to_open_frees_the_slot_in_the_journal(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The old attempt was fenced and its session dropped; a replacement replaying the journal
    must not bring the old session back."""
    cfg = CalendarConfig(turns=(2, 2), turn_s=(0.01, 0.01), mutation_p=1.0)
    env = attrs.evolve(calendar_environment(config=cfg), participants=(_FailingCalendar(),))
    _FailingCalendar.failing = False
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        assert [r.rollout_id async for batch in stream for r in batch] == ["0-0"]
        assert calendar_state(host)["0-0"].sentinels
        _FailingCalendar.failing = True
        stream = await host.run([RunRow("0-0-a1", 0, 0, 1)])
        replies = [r async for batch in stream for r in batch]
        assert [r.rollout_id for r in replies] == ["0-0-a1"] and "ZeroDivision" in str(replies)
        assert calendar_state(host) == {}
    _FailingCalendar.failing = False
    async with GymHost("gym-0", env, work_dir=tmp_path, recover=True) as again:
        assert calendar_state(again) == {}
