"""How ``gymckpt.run`` ends a run: only gymckpt's own refusals are "bad input" (exit 2); a
trainer's own error keeps its traceback; episodes failing past the data budget, or a dataset
whose every row failed, end with one line and exit 7 — never a traceback of exception groups,
never ``finished`` and exit 0. The process-level tests run real trainer programs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gymckpt.gym_adapter import EnvironmentSpecError
from gymckpt.nurseries import ExitCode, run_exit
from gymckpt.runtime import (
    BadInput,
    BudgetExhausted,
    CheckpointsFailed,
    GymInstanceDead,
    ManifestError,
    Preempted,
    TopologyMismatch,
    WorkDirLocked,
)

TRAINER = textwrap.dedent("""
    import json, sys
    import gymckpt
    from gymckpt.gym_adapter import Done, Environment

    MODE, ROWS, GROUP = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    class Game:
        name, kind = "game", "environment"
        def open(self, info): return {"n": 0}
        def export(self, state): return state
        def restore(self, data): return data

    class Player:
        name, kind = "agent", "simple_agent"
        def open(self, info): return {}
        def export(self, state): return state
        def restore(self, data): return data
        async def step(self, ctx, state):
            if MODE == "broken-env":
                raise KeyError("no such key in the environment")
            return Done(reward=1.0)

    async def main() -> None:
        env = Environment(agent=Player(), participants=[Game()], model=lambda k, b, i: 0)
        async with gymckpt.EmbeddedGym.host(env, instances=2, work_dir="gym-live") as gym:
            async with gymckpt.open_rollouts(gym, "work", rows=ROWS, group_size=GROUP) as ro:
                async for batch in ro.batches(groups_per_step=2):
                    if MODE == "json-bug":
                        json.loads("{not json")  # the trainer's own bug
                    print("step", flush=True)
        print("finished", flush=True)

    gymckpt.run(main)
""")


def _run(tmp_path: Path, mode: str, rows: int, group: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    return subprocess.run(
        [sys.executable, str(script), mode, str(rows), str(group)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.subprocess
def test_a_value_error_in_the_trainers_own_loop_keeps_its_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "json-bug", rows=8, group=2)
    assert done.returncode == 1, done.stderr  # not 2: gymckpt refused nothing
    assert "gymckpt: error" not in done.stderr
    assert "Traceback" in done.stderr and "JSONDecodeError" in done.stderr
    # the user's own file and line, where the bug is
    line = 1 + TRAINER.splitlines().index(
        '                    json.loads("{not json")  # the trainer\'s own bug'
    )
    assert f'{tmp_path / "trainer.py"}", line {line}, in main' in done.stderr, done.stderr


@pytest.mark.subprocess
def test_data_failures_past_the_budget_end_with_one_line_and_exit_7(tmp_path: Path) -> None:
    done = _run(tmp_path, "broken-env", rows=16, group=2)  # 32 episodes fail; budget 16
    assert done.returncode == ExitCode.DATA_FAILURES == 7, done.stderr
    assert "Exception Group" not in done.stderr and "finished" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    # one line naming the last failure: its rollout, its instance and the environment's error
    assert last.startswith("gymckpt: run stopped: data-failure budget of 16 spent (last: "), last
    assert "gym-" in last and "KeyError" in last and "no such key" in last


@pytest.mark.subprocess
def test_a_run_whose_every_row_failed_is_not_a_success(tmp_path: Path) -> None:
    # 2 rows of 1 episode, 3 attempts each: 6 data failures, within the budget of 16
    done = _run(tmp_path, "broken-env", rows=2, group=1)
    assert done.returncode == ExitCode.DATA_FAILURES, (done.stdout, done.stderr)
    assert "finished" not in done.stdout and "step" not in done.stdout
    assert "Exception Group" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "gymckpt: run stopped: every row of the dataset failed for good "
        "(2 rows, none trained, 6 data failures; last: "
    ), last
    assert "KeyError" in last and "gym-" in last


def test_only_gymckpt_refusals_are_bad_input() -> None:
    def code(exc: BaseException) -> int | None:
        got = run_exit(exc)
        return None if got is None else got[0]

    for refusal in (
        ManifestError("ledger.json: bad"),
        TopologyMismatch(["gym-0: missing"]),
        WorkDirLocked("/w", 42),
        EnvironmentSpecError("cannot be hosted"),
    ):
        assert isinstance(refusal, BadInput)
        assert code(ExceptionGroup("run", [refusal])) == ExitCode.BAD_INPUT
    # the built-in classes they always were are kept, for callers catching those
    assert isinstance(ManifestError("x"), ValueError)
    assert isinstance(WorkDirLocked("/w", 1), RuntimeError)
    # a trainer's own ValueError (json.loads, int("x")) is not gymckpt's to summarise
    assert code(ExceptionGroup("run", [ValueError("Expecting value: line 1 column 1")])) is None
    assert code(ValueError("x")) is None


def test_budget_exhausted_and_preempted_have_their_codes() -> None:
    def code(exc: BaseException) -> int | None:
        got = run_exit(exc)
        return None if got is None else got[0]

    exhausted = BudgetExhausted("data-failure budget of 16 spent (last: 0-1: gym-1: boom)")
    nested = ExceptionGroup("gym", [ExceptionGroup("rollouts", [exhausted])])
    assert run_exit(nested) == (ExitCode.DATA_FAILURES, exhausted)
    # Gym unavailable beside it (a checkpoint failing while the run stops) changes nothing
    assert code(ExceptionGroup("run", [exhausted, GymInstanceDead("gym-0")])) == 7
    # a bug beside it is not hidden behind the budget line
    assert code(ExceptionGroup("run", [exhausted, KeyError("x")])) is None
    assert code(ExceptionGroup("run", [CheckpointsFailed("3 in a row")])) == 4
    preempted = Preempted("SIGTERM", 5, "/w/snapshots/ckpt-000004", "gymckpt: SIGTERM: ...")
    assert code(ExceptionGroup("run", [preempted])) == ExitCode.OK


def test_run_exits_0_on_preempted_without_a_second_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gymckpt.nurseries import run

    async def main() -> None:
        raise ExceptionGroup("rollouts", [Preempted("SIGTERM", 3, None, "logged already")])

    with pytest.raises(SystemExit) as exited:
        run(main)
    assert exited.value.code == 0
    assert capsys.readouterr().err == ""  # its one line was logged by batches


def test_run_lets_a_trainers_value_error_propagate() -> None:
    from gymckpt.nurseries import run

    async def main() -> None:
        int("not a number")

    with pytest.raises(ValueError, match="invalid literal"):
        run(main)
