"""``gymckpt chaos`` (``app/chaos``) with real processes and real SIGKILLs: the stand-in
trainer (``tests/data/chaos_trainer.py``, a real program on the public trainer API) trains the
same weights and journal under kills; a trainer that drops or duplicates a row after a restore
is caught (exit 3); bad input is exit 2 with a message; nothing outlives a run."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gymckpt.app.chaos.main import report
from gymckpt.app.chaos.plan import Kill, anchors, plan_kills
from gymckpt.app.chaos.points import MARK, STAGES, parse_kill_at, read_marks
from gymckpt.app.chaos.process import Start
from gymckpt.app.chaos.run import read_digests

STAND_IN = Path(__file__).resolve().parent / "data" / "chaos_trainer.py"
TRAINER = [sys.executable, str(STAND_IN), "{workdir}"]

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(120)]


def chaos(tmp_path: Path, *args: str, timeout: float = 100) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "gymckpt", "chaos", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    return done.returncode, done.stdout, done.stderr


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_the_stand_in_trains_the_same_weights_under_sigkills(tmp_path: Path) -> None:
    rc, out, err = chaos(tmp_path, "--seeds", "3", "--kills", "2", "--json", "--", *TRAINER)
    assert rc == 0, err[-3000:]
    result = json.loads(out)
    assert (result["runs"], result["identical"], result["all_identical"]) == (3, 3, True)
    assert result["baseline_sha256"] == result["baseline"]["digests"]["weights"]
    assert set(result["baseline"]["digests"]) == {"weights", "journal"}
    assert result["baseline"]["stage_marks"] > 0  # the stand-in arms its kill points
    landed = [s["kills_landed"] for s in result["seeds"]]
    assert sum(landed) >= 3, result["seeds"]  # the kills were real
    for s in result["seeds"]:
        # a kill that found the program already exiting (landed false) needs no restart
        program_kills = sum(
            1 for k in s["kill_log"] if k.get("victim") == "program" and k["landed"]
        )
        assert s["restarts"] >= program_kills and s["matched"] == {"weights": True, "journal": True}
        assert s["digests"]["weights"] == result["baseline_sha256"]
    assert not list(tmp_path.glob("gymckpt-chaos-*"))  # removed: every run identical
    assert "verdict: identical" in err or "identical" in err


def _processes_naming(path: Path) -> list[str]:
    """Command lines of the live processes that name ``path`` (a run's leftovers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmd and _alive(int(entry.name)):
            found.append(cmd)
    return found


@pytest.mark.http
def test_gym_servers_may_be_victims_and_none_outlives_the_runs(tmp_path: Path) -> None:
    """The stand-in on spawned ``gymckpt serve`` processes: a kill picks the trainer (with its
    process group) or one server (replaced, the run goes on); same weights, no leftovers."""
    rc, out, err = chaos(
        tmp_path, "--seeds", "2", "--kills", "2", "--json", "--", *TRAINER, "--http"
    )
    assert rc == 0, err[-3000:]
    result = json.loads(out)
    assert result["identical"] == 2 and sum(s["kills_landed"] for s in result["seeds"]) >= 2
    assert _processes_naming(tmp_path) == []


@pytest.mark.parametrize("broken", ["drop", "duplicate"])
def test_a_trainer_not_exactly_once_after_a_restore_is_caught(tmp_path: Path, broken: str) -> None:
    """Seed 2's first kill is aimed at the third checkpoint's after_commit stage (pinned in
    ``test_the_kill_plan_is_seeded``), so its run restores for sure; the broken stand-in then
    drops (or trains twice) one row: the weights and the journal differ, exit 3."""
    rc, out, err = chaos(
        tmp_path,
        *("--seeds", "2", "--kills", "1", "--"),
        *TRAINER,
        *("--break-after-restore", broken),
    )
    assert rc == 3, err[-3000:]
    assert "verdict: DIFFERENT" in out and "2" in out.splitlines()[-1]
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:4]}
    assert rows["2"][3:5] == ["NO", "NO"], out  # weights and journal of seed 2 differ
    assert list(tmp_path.glob("gymckpt-chaos-*"))  # kept for a look


def test_no_command_or_no_workdir_is_bad_input(tmp_path: Path) -> None:
    rc, _, err = chaos(tmp_path)
    assert rc == 2 and "no COMMAND" in err
    rc, _, err = chaos(tmp_path, "--", sys.executable, str(STAND_IN), "/tmp/x")
    assert rc == 2 and "COMMAND has no {workdir}" in err
    rc, out, err = chaos(tmp_path, "--seeds", "0", "--json", "--", *TRAINER)
    assert rc == 2 and "--seeds 0" in err
    assert json.loads(out)["exit_code"] == 2 and json.loads(out)["baseline_sha256"] is None


def test_a_failing_baseline_is_bad_input_with_its_stderr(tmp_path: Path) -> None:
    script = "echo {workdir} >/dev/null; echo the-reason-it-failed >&2; exit 5"
    rc, _, err = chaos(tmp_path, "--", "sh", "-c", script)
    assert rc == 2
    assert "the uninterrupted run exited with code 5" in err and "the-reason-it-failed" in err


def test_a_baseline_without_a_weights_line_is_bad_input(tmp_path: Path) -> None:
    rc, _, err = chaos(tmp_path, "--", "sh", "-c", "echo {workdir}; echo loss sha256: 00")
    assert rc == 2 and "printed no 'weights sha256: HEX' line" in err


def test_a_baseline_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; echo {{workdir}}; wait"
    rc, _, err = chaos(tmp_path, "--timeout", "1", "--", "sh", "-c", script)
    assert rc == 2 and "did not end within --timeout 1s" in err
    assert not _alive(int(pidfile.read_text()))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_kills_the_running_program_and_its_children(
    tmp_path: Path, signum: signal.Signals
) -> None:
    fifo = tmp_path / "child.pid"
    os.mkfifo(fifo)  # the program's child is running once its pid comes through: an event
    script = f"sleep 60 & echo $! > {fifo}; echo {{workdir}}; wait"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymckpt", "chaos", "--", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        # a suite started in the background inherits SIGINT ignored (and Python then installs
        # no handler for it): chaos gets Ctrl-C as a terminal would deliver it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        child = _read_pid(fifo, timeout_s=30)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert not _alive(child)


def _read_pid(fifo: Path, timeout_s: float) -> int:
    """The pid a program writes into ``fifo``: waits for it (no polling), at most ``timeout_s``."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        assert readable, f"no pid came through {fifo} in {timeout_s} s"
        return int(os.read(fd, 64).decode().strip())
    finally:
        os.close(fd)


def test_close_returns_once_every_descendant_it_killed_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILL ends a process only when the kernel next runs it, later on a loaded machine
    (a CI run saw ``chaos`` exit with its program's child still running): ``close`` returns
    once every descendant it killed has ended. That delay is made here: the descendant, in a
    session of its own (so the group's SIGKILL misses it), gets its SIGKILL 0.3 s late."""
    fifo = tmp_path / "child.pid"
    os.mkfifo(fifo)
    script = f"setsid sleep 60 & echo $! > {fifo}; wait"
    start = Start.spawn(["sh", "-c", script], tmp_path / "log", os.environ)
    real_kill = os.kill
    timers: list[threading.Timer] = []

    def late_kill(pid: int, sig: int) -> None:
        if pid != child:
            real_kill(pid, sig)
            return
        timers.append(threading.Timer(0.3, real_kill, (pid, sig)))
        timers[-1].start()

    child = _read_pid(fifo, timeout_s=30)
    try:
        assert start.wait(0) is None and child in start.seen  # noted as a descendant
        monkeypatch.setattr(os, "kill", late_kill)
        start.close()
        assert timers, "close sent the descendant no SIGKILL"
        assert not _alive(child)
    finally:
        monkeypatch.undo()
        for t in timers:
            t.join()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_kill_picks_the_program_with_its_group_or_one_descendant(tmp_path: Path) -> None:
    script = "sleep 60 & sleep 60 & wait"
    with Start.spawn(["sh", "-c", script], tmp_path / "a", os.environ) as start:
        deadline = time.monotonic() + 10
        while len(start.victims()) < 3:
            assert time.monotonic() < deadline
            start.wait(0.02)
        children = start.victims()[1:]
        rng = random.Random(0)
        while (what := start.kill(rng)) == "program":  # rng.choice: a descendant eventually
            pytest.fail("seed 0 picks a descendant first")  # pragma: no cover
        assert what.startswith("descendant") and start.wait(0.2) is None  # the program lives
        assert sum(map(_alive, children)) == 1
        start.kill_group()
        assert start.wait(10) == -signal.SIGKILL
    assert not any(map(_alive, children))


def test_the_kill_plan_is_seeded() -> None:
    # the stand-in's uninterrupted run: 12 checkpoints, each through every stage
    marks = [(s, n) for n in range(1, 13) for s in STAGES]
    _, first = plan_kills(2, 1, 1.0, marks)
    _, again = plan_kills(2, 1, 1.0, marks)
    assert first == again and first[0].stage == "after_commit@3"
    _, timed = plan_kills(1, 3, 2.0, [])
    assert all(k.stage is None and 0 <= (k.delay_s or 0) <= 2.0 for k in timed)
    assert timed[0].kind == "anytime"  # a first kill never aims at a restore


def test_timed_kills_are_anchored_to_the_programs_checkpoints_when_it_marks_them() -> None:
    # armed at 1 s; checkpoint N starts at 2N + 1 s and ends 0.5 s later; the fifth (the
    # run's final one) follows the fourth at once
    marks = [(s, n) for n in range(1, 6) for s in STAGES]
    times = {(s, n): 2.0 * n + 1.0 + 0.5 * STAGES.index(s) / len(STAGES) for s, n in marks}
    times[("before_prepare", 5)] = times[("before_resume", 4)] + 0.01
    spans = anchors(1.0, times)
    assert [n for n, _ in spans] == [0, 1, 2, 3, 4]
    assert spans[0][1] == pytest.approx(2.0) and spans[4][1] == pytest.approx(0.01)
    plans = [plan_kills(seed, 3, 11.0, marks, 1.0, times)[1] for seed in range(60)]
    timed = [k for plan in plans for k in plan if k.kind == "anytime"]
    assert timed and all(k.after is not None for k in timed)  # after_restart: from the start
    for k in timed:
        n = 0 if k.after == "armed" else int(str(k.after).split("@")[1])
        assert 0.0 <= (k.delay_s or 0.0) <= dict(spans)[n]  # within its mark's span
    # more kills follow the first, or a restart came: the first half, and never the tiny span
    anchored = {k.after for plan in plans for k in plan if k.kind == "anytime"}
    assert anchored == {"armed", "before_resume@1", "before_resume@2"}
    alone = [plan_kills(seed, 1, 11.0, marks, 1.0, times)[1][0] for seed in range(60)]
    assert {k.after for k in alone if k.kind == "anytime"} == {
        "armed",
        *(f"before_resume@{n}" for n in (1, 2, 3)),  # a single kill: anywhere but the tiny span
    }
    assert "after before_resume@2 +" in Kill("anytime", 0.5, after="before_resume@2").describe()
    _, unanchored = plan_kills(1, 3, 11.0, marks, 1.0)  # no times: against the clock
    assert all(k.after is None for k in unanchored)


def test_digests_marks_and_kill_points_are_read_strictly() -> None:
    hex64 = "ab" * 32
    out = f"step 3\nweights sha256: {'00' * 32}\nweights sha256: {hex64}\njournal sha256: {hex64}\n"
    assert read_digests(out + "loss sha256: 12\n") == {"weights": hex64, "journal": hex64}
    assert read_marks(f"x\n{MARK} after_commit 2\n{MARK} bogus\n") == [("after_commit", 2)]
    assert parse_kill_at("mid_publish@3") == ("mid_publish", 3)
    with pytest.raises(ValueError, match="expected STAGE@N"):
        parse_kill_at("after_lunch@1")


def test_the_table_says_what_matched() -> None:
    run: dict[str, Any] = {
        "seed": 1,
        "kills_landed": 1,
        "kills_planned": 2,
        "restarts": 1,
        "matched": {"weights": True, "journal": False},
        "identical": False,
        "error": None,
        "wall_s": 1.5,
    }
    out = {
        "runs": 1,
        "identical": 0,
        "all_identical": False,
        "baseline_sha256": "ab" * 32,
        "baseline": {"digests": {"journal": "x", "weights": "y"}, "wall_s": 1.0},
        "seeds": [run],
    }
    lines = report(out).splitlines()
    assert lines[0].split() == ["seed", "kills", "restarts", "weights", "journal", "wall_s"]
    assert lines[2].split() == ["1", "1/2", "1", "yes", "NO", "1.50"]
    assert lines[-1].startswith("verdict: DIFFERENT: 0/1 runs identical") and "seeds 1" in lines[-1]
