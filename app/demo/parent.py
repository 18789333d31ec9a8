"""The demo's parent process: it runs no trainer. It starts phase 1, SIGKILLs it once its N-th
checkpoint is published (phase 1 keeps training until the signal lands, so work after the
checkpoint is lost for real), starts phase 2 to restore and finish, then judges the run from
files alone and reports it (``run_demo``).

SIGTERM and SIGINT of the parent are passed on to the running phase (``Preemption``), whose
trainer finishes its step and leaves a final snapshot; the parent then stops with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from gymckpt.gym_adapter import EnvironmentSpecError
from gymckpt.nurseries import ExitCode
from gymckpt.runtime import SnapshotStore
from gymckpt.runtime._shared import SNAPSHOTS_DIR

from .options import DemoOptions
from .phase import PUBLISHED, phase_error
from .progress import PROGRESS_ENV, Progress
from .report import print_report
from .verdict import error_report, run_report

__all__ = ["PREEMPTION", "Preemption", "phase_cmd", "run_demo", "run_until_published"]


def phase_stdout() -> Any:
    """Where a phase process's standard output goes: the demo's stderr. Its stdout carries
    only the demo's report (the ``--json`` object), but a Ray driver prints there too (a
    worker that died, as ``(raylet) …`` lines), and a phase is a Ray driver."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stand-in without a descriptor
        return subprocess.DEVNULL
    return sys.stderr


def phase_cmd(opts: DemoOptions, workdir: Path, phase: int, crash_after: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gymckpt",
        "_phase",
        "--phase",
        str(phase),
        "--crash-after",
        str(crash_after),
        "--workdir",
        str(workdir),
        "--options",
        opts.to_json(),
    ]


@attrs.define(eq=False, slots=True)
class Preemption:
    """The demo parent's SIGTERM/SIGINT: passed on to the running phase process, whose trainer
    finishes its step and leaves a final snapshot; then the parent stops with one line.
    Phase processes run in their own session, so a terminal's Ctrl-C reaches them once."""

    child: subprocess.Popen[bytes] | None = None
    received: signal.Signals | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signal.Signals(signum)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, cmd: list[str], timeout_s: float, **kw: Any) -> int:
        proc = self.start(cmd, **kw)
        try:
            return proc.wait(timeout=timeout_s)
        finally:
            self.child = None

    def start(self, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, **kw)
        self.child = proc
        if self.received is not None:  # arrived while starting
            proc.send_signal(self.received)
        return proc


PREEMPTION = Preemption()


PHASE_TIMEOUT_S = 600.0
"""Seconds a phase process may take before the demo kills it."""


def run_until_published(cmd: list[str], timeout_s: float) -> tuple[int, bool]:
    """Run phase 1; SIGKILL it as soon as it reports its checkpoint. (returncode, killed)."""
    proc = PREEMPTION.start(cmd, stdout=subprocess.PIPE)
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    killed = False
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if raw.decode(errors="replace").startswith(PUBLISHED):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
        rc = proc.wait()
    finally:
        PREEMPTION.child = None
        watchdog.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
    return rc, killed


def run_demo(opts: DemoOptions, as_json: bool) -> int:
    """The whole demo; prints a report (or the C2 JSON object) and returns the exit code.

    With ``as_json`` the JSON object is printed on every exit path: a run that did not finish
    (a phase failed, the demo was preempted, a bad work directory) reports ``exactly_once``
    false, an ``error`` line and its ``exit_code``, with whatever the journal holds so far.
    """
    progress = Progress(enabled=not as_json)
    os.environ[PROGRESS_ENV] = "1" if progress.enabled else "0"  # for the phase processes
    t0 = time.monotonic()
    problem = environment_problem(opts)
    if problem is None and opts.workdir:
        problem = _workdir_problem(Path(opts.workdir))
    if problem is not None:  # before any process starts or any directory is made
        print(f"gymckpt: error: {problem}", file=sys.stderr)
        if as_json:
            print(json.dumps(error_report(problem, ExitCode.BAD_INPUT, opts), sort_keys=True))
        return ExitCode.BAD_INPUT
    if opts.workdir:
        workdir = Path(opts.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="gymckpt-demo-"))
    demo = _Demo(opts, as_json, workdir, t0)
    PREEMPTION.install()
    if opts.crash_after_checkpoint:
        return demo.crash_and_restore(progress)
    rc = PREEMPTION.run(phase_cmd(opts, workdir, 1, 0), PHASE_TIMEOUT_S, stdout=phase_stdout())
    if PREEMPTION.received is not None:
        return demo.finish(*preempted(workdir, rc))
    if rc != 0:
        return demo.finish(rc, phase=1)
    return demo.finish(0)


def _workdir_problem(workdir: Path) -> str | None:
    """Why ``--workdir`` cannot take the demo (it is not empty), or None."""
    if workdir.exists() and any(workdir.iterdir()):
        return f"--workdir {workdir} is not empty; give a new or empty directory"
    return None


@attrs.define(eq=False, slots=True)
class _Demo:
    """One run of the demo in ``workdir``, from ``t0``: its phases, and its report."""

    opts: DemoOptions
    as_json: bool
    workdir: Path
    t0: float
    killed: bool = False
    """Phase 1 was killed with SIGKILL (by the demo, or by itself at its crash stage)."""

    def crash_and_restore(self, progress: Progress) -> int:
        """Phase 1 until its checkpoint is published, SIGKILLed; then phase 2 restores."""
        opts, workdir = self.opts, self.workdir
        progress(
            f"phase 1: trainer process, SIGKILL after checkpoint "
            f"{opts.crash_after_checkpoint} (workdir {workdir})"
        )
        rc, self.killed = run_until_published(
            phase_cmd(opts, workdir, 1, opts.crash_after_checkpoint), PHASE_TIMEOUT_S
        )
        if opts.crash_stage is not None and rc == -signal.SIGKILL:
            self.killed = True  # phase 1 killed itself at its crash stage
        if PREEMPTION.received is not None:
            return self.finish(*preempted(workdir, rc))
        if not self.killed:
            if rc != 0:
                return self.finish(rc, phase=1)
            progress("phase 1 finished before its checkpoint was published; no crash")
            return self.finish(0)
        progress(f"phase 1: killed with SIGKILL (exit {rc}); phase 2 restores")
        rc = PREEMPTION.run(phase_cmd(opts, workdir, 2, 0), PHASE_TIMEOUT_S, stdout=phase_stdout())
        if PREEMPTION.received is not None:
            return self.finish(*preempted(workdir, rc))
        if rc != 0:
            return self.finish(rc, phase=2)
        return self.finish(0)

    def finish(self, rc: int, error: str | None = None, phase: int | None = None) -> int:
        """Report the run (finished or not) and return its exit code."""
        opts, workdir = self.opts, self.workdir
        if error is None and rc != 0 and phase is not None:
            error = phase_error(workdir, phase, rc)
        report = run_report(opts, workdir, self.killed, self.t0)
        if error is not None:
            report.update(exactly_once=False, error=error, exit_code=int(rc))
        else:
            rc = ExitCode.OK if report["exactly_once"] else ExitCode.INVARIANT
            report["exit_code"] = int(rc)
        # a temporary work directory goes once there is nothing in it to look at
        kept = bool(opts.workdir) or opts.keep or error is not None or rc != ExitCode.OK
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)
        report["workdir_kept"] = kept
        if self.as_json:
            print(json.dumps(report, sort_keys=True))
        elif error is None:
            print_report(report)
        return rc


def environment_problem(opts: DemoOptions) -> str | None:
    """Why ``--env`` cannot run here (the family's extra missing, an unknown id, an id
    without a state codec or that needs the network), in one line; None when it can."""
    choice = opts.env_choice
    if choice is None:
        return None
    family = choice.family
    try:
        with tempfile.TemporaryDirectory(prefix="gymckpt-demo-check-") as tmp:
            family.environment(choice.env_id, Path(tmp))
    except ImportError as exc:
        return (
            f"--env {opts.env} needs {family.title}, an optional extra ({exc}): "
            f"pip install -e '.[{family.extra}]'"
        )
    except EnvironmentSpecError as exc:
        return str(exc)
    return None


def preempted(workdir: Path, rc: int) -> tuple[int, str]:
    """One line for a demo stopped by SIGTERM/SIGINT: the snapshot the trainer left.
    (exit code, that line)."""
    received = PREEMPTION.received
    name = received.name if received is not None else "signal"
    latest = SnapshotStore(workdir / SNAPSHOTS_DIR).latest_complete()
    left = f"snapshot {latest.path}" if latest is not None else "no snapshot"
    line = f"demo stopped by {name}; the trainer left {left}"
    print(f"gymckpt: {line}", file=sys.stderr)
    return (0 if rc == 0 else rc), line
