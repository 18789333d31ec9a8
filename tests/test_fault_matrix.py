"""The fault matrix: every C3 fault kind at every operation where it can occur, on the embedded
Gym under the autojump clock, plus the trainer process SIGKILLed at each checkpoint stage, each
in both checkpoint modes (``CheckpointMode``: aligned parks every episode at a step boundary,
unaligned takes them as they are, mid-turn ones at their last boundary).

Each in-process case runs a scenario through the simulation harness (``gymckpt.app.simulation``):
the first life runs with the fault; if it aborts the way the contract says (exit 4), the
next life restores the latest complete snapshot into a fresh Gym and finishes. The
harness checks, for every case, that nothing was lost or duplicated, every step and every
sentinel is there once, budgets add up, admission reopened, the deadline pause was released,
no task was left behind, and Gym was not parked beyond its lease. Each case then asserts its
documented outcome and that the fault really fired.

The sandbox and the captured step have their own cases at the end, on one embedded host, each
in both modes where a checkpoint meets it: a command killed by its deadline with its process
group, a crash in the middle of a command (the restored turn runs it again on the boundary's
tree), a captured step whose function raises, a step asked with other arguments after a
restore (``CapturedStepChanged``, fail closed) and an export that raises (a FIFO in the tree, a
symlink out of it).

``test_fault_over_http`` runs the faults that make sense over HTTP through ``gymckpt demo
--backend http`` (real ``gymckpt serve`` processes executing them), same grammar, same outcomes.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main
from gymckpt.app.demo.main import (
    CRASH_STAGES,
    JOURNAL,
    DemoOptions,
    _phase_cmd,
    _read_journal,
    verdict,
)
from gymckpt.app.simulation.main import (
    Crash,
    LifeReport,
    Scenario,
    ScenarioReport,
    run_scenario,
)
from gymckpt.app.simulation.trees import spawned
from gymckpt.gym_adapter import (
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    calendar_environment,
)
from gymckpt.gym_adapter.environments.sandbox import CommandLimits, Sandbox
from gymckpt.gym_adapter.host._captured import arguments_digest
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    RetireItem,
    SnapshotStore,
    load_snapshot,
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

# a fault variant: (C3 suffix after OP:, label); "@1" variants hit the first call only
CONTROL_KINDS = ("hang", "delay:0.5", "delay:3", "error", "unpicklable", "dead")
RUN_KINDS = (*CONTROL_KINDS, "refuse", "drop")


def _spec(op: str, kind: str, first_only: bool) -> str:
    name, _, arg = kind.partition(":")
    at = "@1" if first_only else ""
    return f"{op}:{name}{at}{':' + arg if arg else ''}"


def _expected(op: str, kind: str, first_only: bool) -> str:
    """The documented outcome of one fault (C3 against S2, S3, S5, S6 and C4)."""
    slow = kind in ("hang", "delay:3")  # past the control deadline: the call is given up
    if kind == "delay:0.5":
        return "restore_ok" if op == "restore" else "ok"
    if op == "restore" and kind != "dead":
        return "restore_exit4"  # Gym cannot serve the restore: exit 4; a new process restores
    if kind == "dead":  # the instance is replaced and the run goes on
        if op == "restore":
            return "restore_replaced" if first_only else "restore_exit4"
        return "replaced" if first_only else "dies_again"
    if op in ("prepare", "commit"):
        return "retried" if first_only else "exit4"
    if op == "resume":
        return "lease"  # the snapshot is published; Gym's lease reopens what resume did not
    if op == "retire":
        return "retire_later" if first_only else "exit4"
    assert op == "run"
    if kind == "drop":
        return "ok" if first_only else "rows_fail_or_ok"
    if slow:
        return "resent_fresh" if first_only else "all_rows_fail"
    # refuse, error, unpicklable: nothing admitted, re-sent with identity at no cost
    return "resent_same" if first_only else "no_progress"


CASES = [
    (op, kind, first_only)
    for op in ("prepare", "commit", "resume", "retire", "restore", "run")
    for kind in (RUN_KINDS if op == "run" else CONTROL_KINDS)
    for first_only in (True, False)
]


MODES = (CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED)


def _scenario(op: str, kind: str, first_only: bool, mode: CheckpointMode) -> Scenario:
    spec = _spec(op, kind, first_only)
    base = attrs.evolve(BASE, checkpoint_mode=mode)
    if op == "restore":
        # checkpoint 1 is published, then the trainer dies; the Gym it restores into faults
        return attrs.evolve(
            base, restore_faults=(spec,), crashes=(Crash(checkpoint=2, point="before_prepare"),)
        )
    if op == "retire":  # retires happen after a dropped stream (S3) and before prepare (S4)
        return attrs.evolve(base, faults=("run:drop@1", spec))
    if _expected(op, kind, first_only) == "no_progress":
        # Gym refuses or fails every submission: stop that trainer after a while
        return attrs.evolve(base, faults=(spec,), crashes=(Crash(at_s=30.0),))
    return attrs.evolve(base, faults=(spec,))


def _fired(inc: LifeReport, op: str) -> list[str]:
    return [spec for spec, _ in inc.faults_fired if spec.startswith(op + ":")]


def _all_ok(inc: LifeReport) -> bool:
    return all(ok for _, ok, _ in inc.checkpoints)


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize(("op", "kind", "first_only"), CASES, ids=[_spec(*c) for c in CASES])
async def test_fault(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    op: str,
    kind: str,
    first_only: bool,
    mode: CheckpointMode,
) -> None:
    expect = _expected(op, kind, first_only)
    report: ScenarioReport = await run_scenario(_scenario(op, kind, first_only, mode), tmp_path)
    assert report.ok, report.violations
    assert {i.checkpoint_mode for i in report.lives} == {mode.value}
    mid_turn = sum(i.episodes_mid_turn for i in report.lives)
    taken = sum(i.episodes_taken for i in report.lives)
    if mode is CheckpointMode.ALIGNED:
        assert mid_turn == 0  # aligned: every episode parked at a boundary
    elif taken:  # unaligned: the calendar agent is inside a turn nearly all the time
        assert mid_turn > 0, (taken, mid_turn)
    incs = report.lives
    planted = incs[1] if op == "restore" else incs[0]
    assert _fired(planted, op), f"{_spec(op, kind, first_only)} never fired: {planted}"
    assert report.rows_trained + report.rows_failed == BASE.rows  # the final verdict holds
    first = incs[0]
    m = first.metrics

    if expect == "ok":
        assert first.end == "finished" and _all_ok(first), first
    elif expect == "retried":  # fails as gym_unavailable once, retried within the bound
        assert first.end == "finished", first
        failed = [c for c in first.checkpoints if not c[1]]
        assert [c[2] for c in failed] == ["gym_unavailable"]
        assert first.checkpoints[-1][1]
    elif expect == "exit4":  # CheckpointsFailed (exit 4); a new process restores and finishes
        assert first.end in ("checkpoints_failed", "gym_dead"), first
        oks = [ok for _, ok, _ in first.checkpoints]
        trailing = len(oks) - (max(i for i, ok in enumerate([True, *oks]) if ok))
        if first.end == "checkpoints_failed":  # raised by the failure past the bound
            assert trailing == BASE.max_consecutive_failures, first.checkpoints
            assert m["checkpoint/gym_unavailable_total"] >= BASE.max_consecutive_failures + 1
            assert all(r == "gym_unavailable" for _, ok, r in first.checkpoints if not ok)
        else:  # every instance died; the dispatcher has nowhere to send rows
            assert "dead" in (first.error or "")
        assert incs[-1].end == "finished"
    elif expect == "replaced":  # one death: replaced, the run goes on in the same process
        assert first.end == "finished", first
        assert first.replacements == 1 and m["rollout/instances_replaced_total"] == 1, first
        failed = [c[2] for c in first.checkpoints if not c[1]]
        # the checkpoint that met the death fails (retryable); the next one succeeds
        assert failed == (["gym_unavailable"] if op in ("prepare", "commit") else []), first
        assert first.checkpoints[-1][1]
        assert report.rows_failed == 0  # a death costs no row attempt
    elif expect == "dies_again":  # every call kills: an outage, a budget or the checkpoint bound
        # an instance killed by every call never serves an episode: an outage (exit 8, its
        # replacements backed off) unless the checkpoint bound or a crash budget ends it first
        ends = ("infra_outage", "replacements_exhausted", "checkpoints_failed")
        assert first.end in ends, first
        assert first.replacements >= 1, first
        if first.end == "replacements_exhausted":
            assert "max_replacements" in (first.error or "") and "gym-" in (first.error or "")
        if first.end == "infra_outage":
            assert "outage_budget_s" in (first.error or "")
            assert "gym instance gym-" in (first.error or "")
        assert incs[-1].end == "finished"
    elif expect == "restore_replaced":  # the restore replaced the dead instance and went on
        assert incs[1].end == "finished" and incs[1].restored_from == "i0-0001", incs[1]
        assert incs[1].replacements == 1, incs[1]
    elif expect == "lease":
        assert first.end == "finished" and _all_ok(first), first
        if kind != "delay:0.5":
            assert m["checkpoint/resume_failures_total"] == (
                1 if first_only else len(first.checkpoints)
            )
        if kind != "delay:0.5" and not first_only:
            # the last resume was lost too: Gym reopened by itself, within its lease (a lost
            # resume before that is taken over by the next checkpoint's prepare)
            assert first.lease_reopened >= 1
    elif expect == "retire_later":  # the immediate retire failed; a checkpoint retired them
        assert first.end == "finished" and _all_ok(first), first
        assert m["rollout/retire_failures_total"] == 1
        assert m["checkpoint/retired_dropped_total"] >= 1
    elif expect == "restore_ok":
        assert incs[1].end == "finished" and incs[1].restored_from == "i0-0001", incs[1]
    elif expect == "restore_exit4":
        assert incs[1].end == "restore_failed", incs[1]
        assert incs[2].end == "finished" and incs[2].restored_from == "i0-0001", incs[2]
    elif expect == "resent_fresh":  # unanswered submission: abandoned, re-sent fresh (S3)
        assert first.end == "finished" and _all_ok(first), first
        assert m["rollout/run_submit_timeouts_total"] == 1
        assert first.metrics.get("rollout/rows_dispatched_total", 0) > 0
    elif expect == "resent_same":  # nothing admitted: same identity, no cost (S2)
        assert first.end == "finished" and _all_ok(first), first
        if kind == "refuse":
            assert m[ADMISSION_CLOSED_ROWS] > 0
        else:
            assert m["rollout/run_errors_total"] == 1
        assert report.rows_failed == 0
    elif expect == "rows_fail_or_ok":  # every stream dropped: rows spend their attempts
        assert first.end == "finished", first
        assert m["rollout/early_stream_ends_total"] >= 1
    elif expect == "all_rows_fail":  # every submission unanswered: every row spends 3 attempts
        assert first.end == "finished", first
        assert report.rows_failed == BASE.rows and report.rows_trained == 0
    elif expect == "no_progress":  # Gym refuses everything: nothing trained, nothing spent
        assert first.end == "crashed" and first.steps_trained == 0, first
        if kind == "refuse":
            assert m[ADMISSION_CLOSED_ROWS] > 0
        else:
            assert m["rollout/run_errors_total"] > 0
        assert m.get("checkpoint/failed_total", 0) == 0
        assert incs[-1].end == "finished"
    else:  # pragma: no cover
        raise AssertionError(expect)


def test_matrix_covers_every_fault_kind_at_every_operation() -> None:
    from gymckpt.gym_adapter._faults import FAULT_KINDS, FAULT_OPS

    covered = {(op, kind.partition(":")[0]) for op, kind, _ in CASES}
    possible = {
        (op, k)
        for op in FAULT_OPS
        for k in FAULT_KINDS
        if op == "run" or k not in ("refuse", "drop")
    }
    assert covered == possible
    assert len(CASES) == 76


# -- through the CLI: exit codes (C4) ------------------------------------------------------------


@pytest.mark.subprocess
def test_cli_checkpoints_failing_exit_4_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--rows",
            "8",
            "--crash-after-checkpoint",
            "0",
            "--fault",
            "commit:error",
            "--json",
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 4, done.stderr
    assert "checkpoints failed in a row" in done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)  # --json prints its object on every exit path
    assert report["exactly_once"] is False and report["exit_code"] == 4
    assert "checkpoints failed in a row" in report["error"]


def test_cli_run_error_is_resent_and_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "demo",
            "--rows",
            "8",
            "--crash-after-checkpoint",
            "0",
            "--fault",
            "run:error@1",
            "--json",
            "--workdir",
            str(tmp_path / "w"),
        ]
    )
    report = orjson.loads(capsys.readouterr().out)
    assert rc == 0 and report["exactly_once"], report


def test_cli_restore_gym_cannot_serve_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = DemoOptions(
        rows=8, group_size=2, instances=2, crash_after_checkpoint=0, faults=("restore:error",)
    )
    args = ["_phase", "--workdir", str(tmp_path), "--options", opts.to_json()]
    assert main([*args, "--phase", "1"]) == 0  # no restore in phase 1: the fault never fires
    capsys.readouterr()
    assert main([*args, "--phase", "2"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("gymckpt: Gym unavailable:") and "restore" in err
    assert "Traceback" not in err and err.count("\n") == 1


# -- SIGKILL at each checkpoint stage: two real processes each -----------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("stage", CRASH_STAGES)
def test_sigkill_at_stage_then_restore_is_exactly_once(
    tmp_path: Path, stage: str, mode: CheckpointMode
) -> None:
    opts = DemoOptions(
        checkpoint_mode=mode.value,
        rows=16,
        group_size=2,
        instances=2,
        seed=11,
        checkpoint_every=1,
        crash_after_checkpoint=2,
        crash_stage=stage,
        groups_per_step=2,
        max_rows_in_flight=8,
    )
    phase1 = subprocess.run(
        _phase_cmd(opts, tmp_path, 1, 2),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert phase1.returncode == -signal.SIGKILL, phase1.stderr  # a real SIGKILL, at the stage
    store = SnapshotStore(tmp_path / "snapshots")
    published = [i.checkpoint_id for i in store.list_complete()]
    done_before = stage in ("after_publish", "before_resume")
    assert published == (["p1-0001", "p1-0002"] if done_before else ["p1-0001"])
    latest = store.latest_complete()
    assert latest is not None
    exported = {e.rollout_id for e in load_snapshot(latest.path).manifest.episodes}
    staging = tmp_path / "snapshots" / ".staging-p1-0002"
    if stage in ("after_commit", "before_publish", "mid_publish"):
        assert any((staging / "gym").iterdir())  # Gym's committed state, never published
        assert (staging / "gym_checkpoint.json").exists() == (stage == "mid_publish")
        assert not (staging / "COMMITTED").exists()
    else:
        assert not staging.exists()

    phase2 = subprocess.run(
        _phase_cmd(opts, tmp_path, 2, 0),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert phase2.returncode == 0, phase2.stderr
    journal = [orjson.loads(x) for x in (tmp_path / JOURNAL).read_bytes().splitlines()]
    restores = [r["snapshot"] for r in journal if "restore_to_step" in r]
    assert restores == [published[-1]]  # the latest complete snapshot, never the torn one
    claims = [r["restored_from"] for r in journal if "restored_from" in r]
    assert len(claims) == len(set(claims))  # every restored episode dispatched once
    assert set(claims) <= exported
    phases = [orjson.loads((tmp_path / "phase-2.json").read_bytes())]
    report = verdict(opts, tmp_path, phases)
    assert report["exactly_once"], report
    assert report["checkpoint_mode"] == mode.value
    if mode is CheckpointMode.ALIGNED:
        assert report["episodes_mid_turn"] == 0, report
    else:  # the demo's turns are long enough that its cuts take episodes mid-turn
        assert report["episodes_mid_turn"] > 0, report
    assert report["lost"] == 0 and report["duplicates"] == 0
    assert report["steps_trained_twice"] == 0 and report["sentinels_duplicated"] == 0
    assert report["rows_trained"] == opts.rows
    lineage, _ = _read_journal(tmp_path / JOURNAL)
    assert [s["step"] for s in lineage] == list(range(1, len(lineage) + 1))
    assert not staging.exists()  # the torn staging directory was pruned
    final = Path(phases[0]["final_snapshot"])
    assert main(["verify", str(final)]) == 0


def test_crash_stages_cover_the_issue() -> None:
    assert set(CRASH_STAGES) == {
        "before_prepare",
        "after_prepare",
        "after_commit",
        "before_publish",
        "after_publish",
        "before_resume",
        "mid_publish",
    }


# -- regressions: bugs the simulation found, pinned down deterministically -----------------------


async def test_stream_dropped_during_a_checkpoint_is_not_an_ownership_violation(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An early stream end applied between commit and the cut (simulation seed 1716): Gym
    exported the dropped episode, the ledger no longer holds it. The checkpoint succeeds, the
    manifest leaves it out, the next checkpoint retires it, and every row is trained once."""
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig
    from gymckpt.nurseries import open_rollouts

    sim = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
    async with EmbeddedGym.host(
        calendar_environment(config=sim),
        instances=1,
        seed=3,
        work_dir=tmp_path / "gym",
        config=sim.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, tmp_path, rows=8, group_size=2, config=BASE.runtime_config()
        ) as ro:
            await trio.sleep(0.5)
            ledger = ro.ledger
            victim = sorted(ledger.held_by("gym-0"))[0]
            replacement: list[str] = []

            def stream_ends_now(_cid: str, point: str) -> None:
                if point == "after_commit":  # the dispatcher's own S3 path, at the worst time
                    touched = [victim]
                    fresh = ledger.barrier.mutate_nowait(
                        lambda: ro.dispatcher._abandon([victim], touched), touched
                    )
                    replacement.extend(a.rollout_id for a in fresh)
                    ro.dispatcher.enqueue(replacement)

            ro.coordinator.on_stage = stream_ends_now
            outcome = await ro.checkpoint()
            assert outcome.ok, outcome.error
            ro.coordinator.on_stage = None
            assert outcome.snapshot is not None
            manifest = load_snapshot(outcome.snapshot.path).manifest
            assert victim not in {e.rollout_id for e in manifest.episodes}
            assert main(["verify", str(outcome.snapshot.path)]) == 0
            assert ledger.retire_queue() == {"gym-0": [RetireItem(victim, "gym-0")]}
            assert (await ro.checkpoint()).ok  # retires it before prepare (S4)
            assert ledger.statistics().retire_queue == 0
            rows = []
            async for batch in ro.batches(2):
                rows.extend(g.row for g in batch)
                for g in batch:
                    assert victim not in g.rollout_ids
            assert sorted(rows) == list(range(8))
            assert replacement == [f"{victim}-a1"]


async def test_lost_claim_of_a_restored_episode_is_retired(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """After a restore, the submission carrying the restored claims goes unanswered (simulation
    seed 281): the claims are abandoned and re-sent fresh, and the exported episodes Gym may
    still hold unclaimed are retired with ``retire_restored`` before the next prepare."""
    sc = attrs.evolve(
        BASE, restore_faults=("run:hang@1",), crashes=(Crash(checkpoint=2, point="before_prepare"),)
    )
    report = await run_scenario(sc, tmp_path)
    assert report.ok, report.violations
    restored = report.lives[1]
    assert restored.end == "finished" and restored.restored_from == "i0-0001"
    assert _all_ok(restored) and restored.faults_fired == (("run:hang@1", 1),)
    assert restored.metrics["rollout/run_submit_timeouts_total"] == 1
    assert restored.metrics["checkpoint/restore_retire_total"] >= 1


# -- over HTTP: the faults through real gymckpt serve processes ------------------------------------

HTTP_CASES = (
    ("prepare:error@1", "retried", "aligned"),
    ("prepare:error@1", "retried", "unaligned"),
    ("prepare:hang@1", "retried", "aligned"),
    ("commit:unpicklable@1", "retried", "aligned"),
    ("commit:dead@1", "replaced", "aligned"),
    ("commit:dead@1", "replaced", "unaligned"),
    ("resume:error@1", "lease", "aligned"),
    ("retire:error@1", "retire_later", "aligned"),
    ("run:error@1", "resent_same", "aligned"),
    ("run:refuse@1", "resent_same", "aligned"),
    ("run:hang@1", "resent_fresh", "aligned"),
    ("run:drop@1", "early_end", "aligned"),
    ("run:dead@1", "replaced", "aligned"),
)
"""The faults that make sense over HTTP, with their documented outcome (``_expected``'s names):
each is drawn by the trainer's plan, sent in the request, and executed by the server for real
(``dead`` ends the server process, ``hang`` never answers, ``drop`` ends the body early with
its end line, ``unpicklable`` is an error that cannot cross). A ``delay`` leaves no trace to
assert on, and ``restore`` faults need a second trainer (the embedded matrix has them)."""


@pytest.mark.http
@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("spec", "expect", "mode"), HTTP_CASES, ids=[f"{s}-{m}" for s, _, m in HTTP_CASES]
)
def test_fault_over_http(tmp_path: Path, spec: str, expect: str, mode: str) -> None:
    faults = ["--fault", spec]
    if spec.startswith("retire:"):  # retires follow a dropped stream (S3), as embedded
        faults = ["--fault", "run:drop@1", *faults]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--backend",
            "http",
            "--rows",
            "16",
            "--crash-after-checkpoint",
            "0",
            "--checkpoint-mode",
            mode,
            *faults,
            "--json",
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    m = orjson.loads((tmp_path / "w" / "phase-1.json").read_bytes())["metrics"]
    assert report["exactly_once"] is True, report
    assert report["rows_trained"] == 16 and report["duplicates"] == report["lost"] == 0
    assert report["checkpoint_mode"] == mode
    if expect == "retried":  # fails once as gym_unavailable, then succeeds
        assert report["checkpoints_failed"] == 1, report
        assert m["checkpoint/gym_unavailable_total"] >= 1
    elif expect == "replaced":  # the server process died; a new one serves its name
        assert report["replacements"] == 1 and m["rollout/instances_replaced_total"] == 1
        assert report["rows_failed"] == 0  # a death costs no row attempt
    elif expect == "lease":
        assert report["checkpoints_failed"] == 0
        assert m["checkpoint/resume_failures_total"] == 1
    elif expect == "retire_later":
        assert m["rollout/retire_failures_total"] == 1
        assert m["checkpoint/retired_dropped_total"] >= 1
    elif expect == "resent_same":  # nothing admitted: re-sent with the same identity
        if spec.startswith("run:refuse"):
            assert m[ADMISSION_CLOSED_ROWS] > 0
        else:
            assert m["rollout/run_errors_total"] == 1
        assert report["rows_failed"] == 0
    elif expect == "resent_fresh":  # an unanswered submission: abandoned, re-sent fresh
        assert m["rollout/run_submit_timeouts_total"] == 1
    elif expect == "early_end":  # the body ended early (with its end line): rows re-sent
        assert m["rollout/early_stream_ends_total"] >= 1
    else:  # pragma: no cover
        raise AssertionError(expect)


# -- the sandbox and the captured step -------------------------------------------------------------
# On one embedded host under the autojump clock, each fault in both checkpoint modes where a
# checkpoint meets it. Commands are real processes: while one must not meet its deadline, the
# clock stands still (``autojump_threshold = inf``) and the test waits on the command itself
# (a FIFO outside the tree it writes to, read in a thread), never on a sleep.

FAR = 1e9


class Boxed:
    """An agent in a sandbox whose turns are given as ``plan[turn]``, an async function of
    (ctx, box, state); it ends after the plan with the tree's files as its payload."""

    name, kind = "agent", "simple_agent"

    def __init__(self, *plan: Any) -> None:
        self.plan = plan

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        box = ctx.session("sandbox")
        if ctx.turn == len(self.plan):
            files = {n: box.read(n).decode() for n in box.list() if n.endswith(".txt")}
            return Done(1.0, payload={"files": files, "state": state})
        await self.plan[ctx.turn](ctx, box, state)
        return None


def _boxed(tmp_path: Path, agent: Boxed, timeout_s: float = 30.0) -> Environment:
    template = tmp_path / "template"
    template.mkdir(exist_ok=True)
    (template / "log.txt").write_text("")
    sandbox = Sandbox(template, tmp_path / "gym", commands=CommandLimits(timeout_s=timeout_s))
    return Environment(agent=agent, participants=(sandbox,), model=lambda k, r, i: "ok")


def _record(commit: Any) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    record = InstanceRecord(
        commit.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in commit.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, commit.instance, e.capture_keys)
        for e in commit.exported
    ]
    return record, episodes


async def _replies(stream: Any, into: list[RunReply]) -> None:
    async for batch in stream:
        into.extend(batch)


def _fifo_read(path: Path) -> str:
    """What a command writes to FIFO ``path`` (blocks until it has written and closed it)."""
    with open(path) as f:
        return f.read()


def _fifo_write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _group_alive(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still running (zombies are dead), each waited for
    first with a real-time bound (a SIGKILLed process takes a moment to die), then killed so
    a failing test leaves none behind."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid or fields[0] == "Z":
            continue
        try:
            fd = os.pidfd_open(int(entry))
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], 20.0)[0]:
                alive.append(int(entry))
                os.kill(int(entry), signal.SIGKILL)  # reported; not left behind
        finally:
            os.close(fd)
    return alive


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
async def test_sandbox_fault_command_killed_by_its_deadline_with_its_group(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    """A command that never ends (and starts another in the background) is killed with its
    whole process group when its deadline passes; a checkpoint that meets it mid-command
    parks the episode after the kill (aligned) or takes it at its boundary (unaligned); the
    episode goes on and completes, the timeout in its state."""
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    endless = f"sleep 1000 & echo $$ > {ready}; while :; do sleep 1; done"

    async def run_forever(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        box.append("log.txt", "before\n")
        result = await box.run(["sh", "-c", endless])
        state["command"] = [result.timed_out, result.returncode]

    env = _boxed(tmp_path, Boxed(run_forever), timeout_s=5.0)
    got: list[RunReply] = []
    commits: list[Any] = []

    async def checkpoint() -> None:  # aligned: waits for the episode's next boundary
        await host.prepare("c1", FAR, mode)
        commits.append(await host.commit("c1", "snap", FAR))

    # Virtual time stands still (a real process's wait must not let the lease pass): the
    # command's deadline passes when the test moves the clock, once the command is running.
    autojump_clock.autojump_threshold = math.inf
    async with GymHost("gym-0", env, work_dir=tmp_path) as host, trio.open_nursery() as nursery:
        nursery.start_soon(_replies, await host.run([RunRow("0-0", 0, 0, 0)]), got)
        pgid = int(await trio.to_thread.run_sync(_fifo_read, ready))
        async with trio.open_nursery() as during:
            during.start_soon(checkpoint)
            await spawned()  # the command is inside its deadline's scope
            autojump_clock.jump(5.0)  # the deadline passes
        await host.resume("c1", FAR)
    [commit] = commits
    assert _group_alive(pgid) == []  # the command, its loop and its background sleep
    assert commit.mid_turn == (1 if mode is CheckpointMode.UNALIGNED else 0)
    [done] = got
    assert isinstance(done, Completed), done
    assert done.payload["state"] == {"command": [True, None]}  # timed out, no return code
    assert done.payload["files"] == {"log.txt": "before\n"}


async def test_sandbox_fault_crash_mid_command_reruns_the_turn_on_the_boundary_tree(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An unaligned cut takes the episode in the middle of a command that has written half of
    its work; the host dies (its command with it). The restore materialises the tree of the
    step boundary, and the turn runs the command again: each of its lines is in the tree once,
    and the captured step of that turn is answered from the snapshot, not asked again."""
    ready, gate = tmp_path / "ready", tmp_path / "gate"
    os.mkfifo(ready)
    os.mkfifo(gate)
    command = f"echo start >> cmd.txt; echo $$ > {ready}; read x < {gate}; echo end >> cmd.txt"
    asked: list[Any] = []

    async def first(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        box.append("log.txt", "turn 0\n")

    async def second(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        state["hit"] = await ctx.captured_step("search", {"q": "x"}, lambda a: asked.append(a))
        result = await box.run(["sh", "-c", command])
        assert result.returncode == 0, result
        box.append("log.txt", "turn 1\n")

    env = _boxed(tmp_path, Boxed(first, second))
    autojump_clock.autojump_threshold = math.inf  # nothing here waits on virtual time
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        pgid = int(await trio.to_thread.run_sync(_fifo_read, ready))  # "start" is written
        await host.prepare("c1", FAR, CheckpointMode.UNALIGNED)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    assert commit.mid_turn == 1 and _group_alive(pgid) == []  # the dead host's command too
    record, episodes = _record(commit)
    got: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh, trio.open_nursery() as nursery:
        await fresh.restore("snap", record, episodes, FAR)
        nursery.start_soon(_replies, await fresh.run([RunRow("0-0-a1", 0, 0, 1, "0-0")]), got)
        await trio.to_thread.run_sync(_fifo_read, ready)  # the turn's command, run again
        await trio.to_thread.run_sync(_fifo_write, gate, "go\n")
    [done] = got
    assert isinstance(done, Completed), done
    assert done.payload["files"] == {
        "cmd.txt": "start\nend\n",  # once: the restored tree is the boundary's
        "log.txt": "turn 0\nturn 1\n",
    }
    assert asked == [{"q": "x"}]  # the step's function ran once, before the cut


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
async def test_sandbox_fault_captured_step_that_raises_fails_its_attempt_and_stages_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    """A step whose function raises fails the attempt as data, naming the error; nothing is
    staged for it, so a checkpoint holds no capture of it and the next attempt asks it again
    and completes."""
    asked: list[int] = []

    def search(args: Any) -> Any:
        asked.append(args["attempt"])
        if args["attempt"] == 0:
            raise ConnectionError("search service down")
        return "found"

    async def ask(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        await trio.sleep(1.0)
        state["hit"] = await ctx.captured_step("search", {"attempt": ctx.info.attempt}, search)

    env = _boxed(tmp_path, Boxed(ask))
    got: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        await _replies(await host.run([RunRow("0-0", 0, 0, 0)]), got)
        await host.prepare("c1", FAR, mode)
        commit = await host.commit("c1", "snap", FAR)
        await host.resume("c1", FAR)
        assert commit.exported == () and commit.sessions == ()  # nothing of the failed attempt
        await _replies(await host.run([RunRow("0-0-a1", 0, 0, 1)]), got)
    failed, done = got
    assert isinstance(failed, Failed) and failed.failure_class == "data", failed
    assert "search service down" in failed.message and "turn 0" in failed.message
    assert isinstance(done, Completed) and done.payload["state"] == {"hit": "found"}
    assert asked == [0, 1]


async def test_sandbox_fault_changed_arguments_after_a_restore_fail_closed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A cut takes a turn after its step was staged; the restored turn asks the step with
    other arguments: ``CapturedStepChanged`` fails the episode as data, naming the key and
    both digests, and the function is not run again."""
    asked: list[Any] = []

    async def ask(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        await ctx.captured_step("search", {"attempt": ctx.info.attempt}, asked.append)
        box.append("log.txt", "asked\n")
        await trio.sleep(1.0)

    env = _boxed(tmp_path, Boxed(ask))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await trio.sleep(0.5)
        await host.prepare("c1", FAR, CheckpointMode.UNALIGNED)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    assert commit.mid_turn == 1
    record, episodes = _record(commit)
    got: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        await fresh.restore("snap", record, episodes, FAR)
        await _replies(await fresh.run([RunRow("0-0-a1", 0, 0, 1, "0-0")]), got)
    [failed] = got
    assert isinstance(failed, Failed) and failed.failure_class == "data", failed
    [key] = episodes[0].capture_keys
    digests = [arguments_digest("search", orjson.dumps({"attempt": a})) for a in (0, 1)]
    assert key in failed.message and all(d in failed.message for d in digests), failed.message
    assert "the arguments differ" in failed.message
    assert asked == [{"attempt": 0}]  # never run for the restored attempt


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("hostile", ["fifo", "symlink_out"])
async def test_sandbox_fault_export_raising_fails_its_episode_and_the_others_restore(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode, hostile: str
) -> None:
    """Row 0's tree cannot be exported from turn 1 on (a FIFO in it, or a symlink out of it):
    the export raises at the commit (aligned) or at the mark of its boundary (unaligned), the
    episode fails as data naming the path, and the other episode commits and restores."""

    async def work(ctx: EpisodeContext, box: Any, state: dict[str, Any]) -> None:
        box.append("log.txt", f"turn {ctx.turn}\n")
        if ctx.turn == 1 and ctx.info.row == 0:
            if hostile == "fifo":
                os.mkfifo(box.root / "pipe")
            else:
                os.symlink(str(tmp_path), box.root / "out")
        await trio.sleep(1.0)

    env = _boxed(tmp_path, Boxed(work, work, work))
    got: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as host, trio.open_nursery() as nursery:
        for row in (0, 1):
            nursery.start_soon(_replies, await host.run([RunRow(f"{row}-0", row, 0, 0)]), got)
        await trio.sleep(2.5)  # inside turn 2: the mark of boundary 2 holds what turn 1 made
        await host.prepare("c1", FAR, mode)
        commit = await host.commit("c1", "snap", FAR)
        await host.resume("c1", FAR)  # row 1 completes, row 0 has failed
    assert [e.rollout_id for e in commit.exported] == ["1-0"]
    [failed] = [r for r in got if r.rollout_id == "0-0"]
    assert isinstance(failed, Failed) and failed.failure_class == "data", failed
    named = "pipe" if hostile == "fifo" else "out"
    assert f"{named} " in failed.message or f"{named}:" in failed.message, failed.message
    record, episodes = _record(commit)
    again: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        await fresh.restore("snap", record, episodes, FAR)
        await _replies(await fresh.run([RunRow("1-0-a1", 1, 0, 1, "1-0")]), again)
    [done] = again
    assert isinstance(done, Completed), done
    assert done.payload["files"] == {"log.txt": "turn 0\nturn 1\nturn 2\n"}
