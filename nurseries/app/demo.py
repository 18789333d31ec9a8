"""``gymckpt demo``: a toy trio trainer against Gym, checkpoints, a real SIGKILL, a restore.

The parent process runs no trainer. It starts phase 1 as a child process; phase 1 trains steps
from prompt groups, checkpoints every ``--checkpoint-every`` steps and prints a line once its
N-th checkpoint is published; the parent then kills it with SIGKILL (phase 1 keeps training until
the signal lands, so work after the checkpoint is lost for real). Phase 2 is a new process: it
restores the latest complete snapshot and finishes the dataset. The parent then judges the run
from files alone:

* the **training journal** (``journal.jsonl``, one fsynced line per trained step, plus a
  ``restore_to_step`` line per restore) gives the lineage of the final model: steps after the
  restored one are discarded, as their weights died with the process;
* the **final snapshot**'s committed calendar state gives every sentinel the environment holds;
* the final ledger gives the rows that failed for good.

Exactly once means: every row trained once in the lineage (no duplicates, none lost), every step
once, and every sentinel a trained episode's plan calls for present exactly once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from statistics import median
from typing import Any, cast

import attrs
import orjson
import trio

from gymckpt.gym_adapter import (
    EmbeddedGym,
    EnvironmentSpecError,
    GymBackend,
    RunRow,
    SimConfig,
)
from gymckpt.nurseries import (
    HOOK_POINTS,
    CheckpointOutcome,
    ExitCode,
    leaf_errors,
    open_rollouts,
    run_exit,
)
from gymckpt.runtime import (
    MANIFEST_NAME,
    SNAPSHOTS_DIR,
    CompletedGroup,
    GymManifest,
    GymUnavailable,
    Preempted,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    structure_table,
    write_atomic,
)

from .demo_gymnasium import (
    environment_id,
    journal_episodes,
    open_gymnasium_gym,
    trajectory_verdict,
)
from .sim_ends import single_error
from .toy_trainer import ToyTrainer
from .verdict import expected_sentinels, judge, snapshot_sentinels

__all__ = [
    "CRASH_STAGES",
    "DemoOptions",
    "expected_sentinels",
    "leaf_errors",
    "run_demo",
    "run_exit",
    "run_phase",
    "single_error",
    "snapshot_sentinels",
]

PUBLISHED = "GYMCKPT-CHECKPOINT-PUBLISHED"
JOURNAL = "journal.jsonl"
MID_PUBLISH = "mid_publish"
CRASH_STAGES = (*HOOK_POINTS, MID_PUBLISH)
"""Where ``crash_stage`` may SIGKILL phase 1: the coordinator's hook points, and
``mid_publish`` (after the snapshot's files and manifest are written, before its commit marker).
"""


@attrs.frozen(kw_only=True)
class DemoOptions:
    """The demo's flags (C2). ``crash_after_checkpoint`` 0 means no crash."""

    backend: str = "embedded"
    rows: int = 64
    group_size: int = 4
    instances: int = 2
    seed: int = 0
    checkpoint_every: int = 2
    crash_after_checkpoint: int = 1
    faults: tuple[str, ...] = ()
    workdir: str | None = None
    groups_per_step: int = 4
    max_rows_in_flight: int = 16
    ray_address: str | None = None
    agent_kind: str = "simple_agent"
    hold_first_mutation: bool = False
    """Test agent (S12): the episode making an instance's first calendar mutation holds at its
    next step boundary until a checkpoint parks it."""
    env: str = "calendar"
    """The environment: the calendar workplace, or ``gymnasium:ID``."""
    crash_stage: str | None = None
    """Fault matrix: phase 1 SIGKILLs itself at this point (one of ``CRASH_STAGES``) of its
    checkpoint number ``crash_after_checkpoint`` (counting attempts, 1-based), instead of the
    parent killing it after that checkpoint is published."""
    runtime: tuple[tuple[str, Any], ...] = ()
    """``RuntimeConfig`` settings over the demo's own (table ``[runtime]`` of ``--config``), as
    ``(field, value)`` pairs; checked strictly by ``runtime_config``."""
    keep: bool = False
    """Keep the temporary work directory of a run that finished exactly once (without
    ``workdir`` it is removed then; a run that did not is always kept, to be looked at)."""

    def __attrs_post_init__(self) -> None:
        for name in ("rows", "group_size", "instances", "checkpoint_every", "groups_per_step",
                     "max_rows_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.crash_after_checkpoint < 0:
            raise ValueError("--crash-after-checkpoint must be >= 0")
        if self.crash_stage is not None:
            if self.crash_stage not in CRASH_STAGES:
                raise ValueError(
                    f"--crash-at-stage must be one of {', '.join(CRASH_STAGES)}, "
                    f"got {self.crash_stage!r}"
                )
            if self.crash_after_checkpoint < 1:
                raise ValueError("--crash-at-stage needs --crash-after-checkpoint >= 1")
        if self.backend not in ("embedded", "ray"):
            raise ValueError(f"--backend must be embedded or ray, got {self.backend!r}")
        if environment_id(self.env) is not None and self.backend != "embedded":
            raise ValueError("--env gymnasium:ID runs on --backend embedded")

    @property
    def gymnasium_id(self) -> str | None:
        return environment_id(self.env)

    def sim_config(self) -> SimConfig:
        return SimConfig(turns=(2, 4), turn_s=(0.005, 0.02), mutation_p=0.5, lease_s=30.0,
                         hold_after_first_mutation=self.hold_first_mutation)

    def runtime_config(self, where: str = "demo [runtime]") -> RuntimeConfig:
        """The demo's runtime settings with ``runtime`` over them; an unknown or ill-typed
        field, or settings that do not fit together, is a ``ManifestError`` naming ``where``."""
        base = RuntimeConfig(control_timeout_s=5.0, reply_grace_s=0.5, drain_timeout_s=5.0,
                             lease_s=30.0, max_consecutive_failures=3)
        if not self.runtime:
            return base
        return structure_table(attrs.asdict(base) | dict(self.runtime), RuntimeConfig, where)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DemoOptions:
        raw = json.loads(text)
        raw["faults"] = tuple(raw["faults"])
        raw["runtime"] = tuple((k, v) for k, v in raw.get("runtime", ()))
        return cls(**raw)


# -- the toy trainer ---------------------------------------------------------------------------


class Journal:
    """Append-only, one fsynced JSON line per record: the trained-steps audit trail."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "ab") as f:
            f.write(orjson.dumps(record) + b"\n")
            f.flush()
            os.fsync(f.fileno())


# -- one phase (a trainer process) ----------------------------------------------------------------


@asynccontextmanager
async def open_gym(opts: DemoOptions, workdir: Path) -> AsyncIterator[GymBackend]:
    """The Gym deployment the demo runs on."""
    if opts.gymnasium_id is not None:
        async with open_gymnasium_gym(
            opts.gymnasium_id, opts.instances, opts.seed, workdir / "gym-live", opts.faults,
            opts.runtime_config().lease_s,
        ) as gym:
            yield gym
        return
    if opts.backend == "ray":
        from gymckpt.gym_adapter import RayGym

        async with RayGym.open(
            instances=opts.instances, agent_kinds=opts.agent_kind, seed=opts.seed,
            work_dir=workdir / "gym-live", config=opts.sim_config(), faults=opts.faults,
            address=opts.ray_address,
        ) as gym:
            yield gym
        return
    async with EmbeddedGym.open(
        instances=opts.instances, agent_kinds=opts.agent_kind, seed=opts.seed,
        work_dir=workdir / "gym-live", config=opts.sim_config(), faults=opts.faults,
    ) as gym:
        yield gym


PROGRESS_ENV = "GYMCKPT_DEMO_PROGRESS"
"""Set by the demo for its phase processes: "1" to show progress lines, "0" not to."""


@attrs.define(eq=False, slots=True)
class _Progress:
    """Progress lines on stderr: every one on a terminal; elsewhere (a log file, a CI job) the
    frequent ones (steps, checkpoints) at most every ``every_s``, so a long run still shows it
    is alive without flooding the log."""

    enabled: bool
    tty: bool = attrs.field(factory=lambda: sys.stderr.isatty())
    every_s: float = 10.0
    _last: float = attrs.field(default=-math.inf, init=False)

    def __call__(self, text: str, *, frequent: bool = False) -> None:
        if not self.enabled:
            return
        if frequent and not self.tty:
            now = time.monotonic()
            if now - self._last < self.every_s:
                return
            self._last = now
        print(text, file=sys.stderr, flush=True)


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _CrashingStore:
    """A ``SnapshotStore`` whose ``publish`` of one checkpoint SIGKILLs the process after the
    manifest is written and before the commit marker (``mid_publish``); all else delegates."""

    def __init__(self, inner: SnapshotStore, checkpoint_id: str) -> None:
        self._inner = inner
        self._checkpoint_id = checkpoint_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def publish(
        self, staging: Path, manifest: GymManifest, files: Mapping[str, bytes]
    ) -> SnapshotInfo:
        def on_write(name: str) -> None:
            if name == MANIFEST_NAME and manifest.checkpoint_id == self._checkpoint_id:
                _sigkill_self()

        return self._inner.publish(staging, manifest, files, on_write=on_write)


def _install_crash(opts: DemoOptions, phase: int, crash_after: int, rollouts: Any) -> None:
    """SIGKILL this process at ``opts.crash_stage`` of checkpoint ``crash_after``."""
    stage = opts.crash_stage
    target = f"p{phase}-{crash_after:04d}"
    coordinator = rollouts.coordinator
    if stage == MID_PUBLISH:
        coordinator.store = cast(SnapshotStore, _CrashingStore(coordinator.store, target))
        return

    def on_stage(checkpoint_id: str, point: str) -> None:
        if checkpoint_id == target and point == stage:
            _sigkill_self()

    coordinator.on_stage = on_stage


async def run_phase(
    opts: DemoOptions, workdir: Path, phase: int, crash_after: int
) -> dict[str, Any]:
    """Run one trainer process's worth of the demo; returns its result record."""
    default = "1" if sys.stderr.isatty() else "0"
    progress = _Progress(enabled=os.environ.get(PROGRESS_ENV, default) == "1")
    journal = Journal(workdir / JOURNAL)
    total_steps = -(-opts.rows // opts.groups_per_step)
    outcomes = []

    def audit(instance: str, rows: Sequence[RunRow]) -> None:
        for r in rows:
            if r.restored_from is not None:  # a restored episode's one dispatch (S11)
                journal.append({"phase": phase, "dispatch": r.rollout_id, "instance": instance,
                                "restored_from": r.restored_from})

    async with open_gym(opts, workdir) as gym, open_rollouts(
        gym, workdir, rows=opts.rows, group_size=opts.group_size,
        config=opts.runtime_config(), max_rows_in_flight=opts.max_rows_in_flight,
        run_id=f"p{phase}", on_dispatch=audit,
    ) as rollouts:
        if crash_after and opts.crash_stage is not None:
            _install_crash(opts, phase, crash_after, rollouts)
        trainer = ToyTrainer()
        if rollouts.trainer_state is not None:
            trainer = ToyTrainer.from_bytes(rollouts.trainer_state)
        if rollouts.restored is not None:
            summary = rollouts.restore_summary
            journal.append({"phase": phase, "restore_to_step": trainer.step,
                            "snapshot": rollouts.restored.snapshot.checkpoint_id})
            assert summary is not None
            progress(f"[phase {phase}] restored {rollouts.restored.snapshot.checkpoint_id}"
                     f" at step {trainer.step}: {summary.restored} episodes parked in Gym, "
                     f"{summary.completed_untrained} completed but untrained, "
                     f"{summary.reserved + summary.redispatched_fresh} to dispatch again")
        published = 0
        # an async generator (annotated as an iterator): close it here, not at garbage collection
        batches = cast(AsyncGenerator[list[CompletedGroup], None],
                       rollouts.batches(opts.groups_per_step,
                                        state=lambda: trainer.to_bytes()))
        async with aclosing(batches):  # an abort mid-loop finalises the generator here
            try:
                async for batch in batches:
                    rewards = [r.reward for g in batch for r in g.results]
                    trainer = trainer.train(rewards, len(batch))
                    record: dict[str, Any] = {"phase": phase, "step": trainer.step,
                                              "rows": [g.row for g in batch]}
                    if opts.gymnasium_id is not None:
                        record["episodes"] = journal_episodes(batch)
                    journal.append(record)
                    progress(f"[phase {phase}] step {trainer.step}/{total_steps} "
                             f"rows {trainer.rows_trained}/{opts.rows} "
                             f"reward≈{trainer.reward_ema:.3f}", frequent=True)
                    if trainer.step % opts.checkpoint_every == 0:
                        outcome = await rollouts.checkpoint(trainer.to_bytes())
                        outcomes.append(outcome)
                        journal.append(_checkpoint_record(phase, outcome))
                        progress(f"[phase {phase}] checkpoint {outcome.checkpoint_id}: "
                                 f"{'ok' if outcome.ok else outcome.reason} "
                                 f"({outcome.episodes} episodes parked, "
                                 f"{outcome.drained} drained)",
                                 frequent=published > 0 or not outcome.ok)  # the first is shown
                        if outcome.ok:
                            published += 1
                            if crash_after and published == crash_after:
                                print(f"{PUBLISHED} {outcome.checkpoint_id}", flush=True)
            except Preempted:
                pass  # its final checkpoint is taken (or tried): the record below says which
        # a last checkpoint saves the environment state the verdict reads
        final = rollouts.outcomes[-1] if rollouts.final_snapshot is not None else None  # preempted
        for _ in range(0 if final is not None else
                       opts.runtime_config().max_consecutive_failures + 1):
            final = await rollouts.checkpoint(trainer.to_bytes())
            outcomes.append(final)
            journal.append(_checkpoint_record(phase, final))
            if final.ok:
                break
        assert final is not None
        metrics = rollouts.metrics.snapshot()
        restore_summary = rollouts.restore_summary
    return {
        "phase": phase,
        "steps": trainer.step,
        "final_snapshot": str(final.snapshot.path) if final.snapshot else None,
        "restored": attrs.asdict(restore_summary) if restore_summary else None,
        "metrics": metrics,
    }


def _checkpoint_record(phase: int, outcome: CheckpointOutcome) -> dict[str, Any]:
    return {"phase": phase, "checkpoint": outcome.checkpoint_id, "ok": outcome.ok,
            "reason": outcome.reason, "stage_s": dict(outcome.stage_s)}


def phase_main(opts: DemoOptions, workdir: Path, phase: int, crash_after: int) -> int:
    """Entry point of a phase process; exit codes per C4 (see ``run_exit``).

    Found by the fault matrix: the run's error arrives wrapped in the nurseries' exception
    groups, so ``CheckpointsFailed`` used to escape as a traceback with exit 1. Bad input
    (manifest, topology) is re-raised bare for the CLI to report with exit 2. Every Gym
    instance dead leaves nothing to dispatch to or checkpoint: exit 4, like checkpoints that
    keep failing.
    """
    # the parent reports for the whole demo (a preemption included): no lines from here
    logging.getLogger("gymckpt").addHandler(logging.NullHandler())
    try:
        result = trio.run(run_phase, opts, workdir, phase, crash_after)
    except Exception as exc:
        decided = run_exit(exc)
        if decided is None:
            _record_phase_error(workdir, phase, f"{type(exc).__name__}: {exc}", 1)
            raise
        code, err = decided
        if isinstance(err, GymUnavailable):
            line = f"Gym unavailable: {err}"
        elif code == ExitCode.INVARIANT:
            line = f"run aborted: {err}"
        elif code == ExitCode.BAD_INPUT:
            line = f"error: {err}"
        else:
            line = str(err)
        _record_phase_error(workdir, phase, line, code)
        if code == ExitCode.BAD_INPUT:
            raise err from None
        print(f"gymckpt: {line}", file=sys.stderr)
        return code
    write_atomic(workdir / f"phase-{phase}.json", orjson.dumps(result))
    return 0


def _phase_error_file(workdir: Path, phase: int) -> Path:
    return workdir / f"phase-{phase}-error.json"


def _record_phase_error(workdir: Path, phase: int, error: str, code: int) -> None:
    """Leave the phase's one-line error for the parent's report (``--json``)."""
    with contextlib.suppress(OSError):  # the error line on stderr still says it
        write_atomic(_phase_error_file(workdir, phase),
                     orjson.dumps({"error": error, "exit_code": int(code)}))


# -- the parent: processes, SIGKILL, verdict ------------------------------------------------------


def _phase_stdout() -> Any:
    """Where a phase process's standard output goes: the demo's stderr. Its stdout carries
    only the demo's report (the ``--json`` object), but a Ray driver prints there too (a
    worker that died, as ``(raylet) …`` lines), and a phase is a Ray driver."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stand-in without a descriptor
        return subprocess.DEVNULL
    return sys.stderr


def _phase_cmd(opts: DemoOptions, workdir: Path, phase: int, crash_after: int) -> list[str]:
    return [sys.executable, "-m", "gymckpt", "_phase", "--phase", str(phase),
            "--crash-after", str(crash_after), "--workdir", str(workdir),
            "--options", opts.to_json()]


@attrs.define(eq=False, slots=True)
class _Preemption:
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


_PREEMPTION = _Preemption()


def _run_until_published(cmd: list[str], timeout_s: float) -> tuple[int, bool]:
    """Run phase 1; SIGKILL it as soon as it reports its checkpoint. (returncode, killed)."""
    proc = _PREEMPTION.start(cmd, stdout=subprocess.PIPE)
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
        _PREEMPTION.child = None
        watchdog.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
    return rc, killed


def _read_journal(journal: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(lineage of trained steps, every checkpoint record) from the journal."""
    steps: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    if not journal.exists():
        return steps, checkpoints
    for line in journal.read_bytes().splitlines():
        rec = orjson.loads(line)
        if "restore_to_step" in rec:
            keep = int(rec["restore_to_step"])
            steps = [s for s in steps if s["step"] <= keep]
        elif "checkpoint" in rec:
            checkpoints.append(rec)
        elif "dispatch" in rec:
            continue
        else:
            steps.append(rec)
    return steps, checkpoints


def verdict(opts: DemoOptions, workdir: Path, phases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Judge the run from files only (journal, final snapshot)."""
    lineage, checkpoints = _read_journal(workdir / JOURNAL)
    final_path = next((p["final_snapshot"] for p in reversed(phases) if p.get("final_snapshot")),
                      None)
    judged = judge(
        [(s["step"], s["rows"]) for s in lineage], opts.rows,
        Path(final_path) if final_path is not None else None,
        seed=opts.seed, config=opts.sim_config(), group_size=opts.group_size,
        calendar=opts.gymnasium_id is None,
    )
    stages: dict[str, list[float]] = {}
    for c in checkpoints:
        if c["ok"]:
            for k, v in c["stage_s"].items():
                stages.setdefault(k, []).append(v)
    ok = sum(1 for c in checkpoints if c["ok"])
    failed = len(checkpoints) - ok
    restores = sum(1 for p in phases if p.get("restored"))
    extra: dict[str, Any] = {}
    if opts.gymnasium_id is not None:
        extra = trajectory_verdict(opts.gymnasium_id, opts.seed, lineage)
    return extra | {
        "rows": opts.rows,
        "rows_trained": judged.rows_trained,
        "rows_failed": judged.rows_failed,
        "duplicates": judged.duplicates,
        "lost": len(judged.lost),
        "steps": judged.steps,
        "steps_trained_twice": judged.steps_trained_twice,
        "sentinels_total": judged.sentinels_total,
        "sentinels_expected": judged.sentinels_expected,
        "sentinels_duplicated": len(judged.sentinels_twice),
        "sentinels_missing": len(judged.sentinels_missing),
        "checkpoints_ok": ok,
        "checkpoints_failed": failed,
        "restores": restores,
        "stage_ms_median": {k: round(median(v) * 1000, 3) for k, v in stages.items()},
        "exactly_once": judged.ok and extra.get("trajectories_match", True),
    }


def run_demo(opts: DemoOptions, as_json: bool) -> int:
    """The whole demo; prints a report (or the C2 JSON object) and returns the exit code.

    With ``as_json`` the JSON object is printed on every exit path: a run that did not finish
    (a phase failed, the demo was preempted, a bad work directory) reports ``exactly_once``
    false, an ``error`` line and its ``exit_code``, with whatever the journal holds so far.
    """
    progress = _Progress(enabled=not as_json)
    os.environ[PROGRESS_ENV] = "1" if progress.enabled else "0"  # for the phase processes
    t0 = time.monotonic()
    problem = _environment_problem(opts)
    if problem is not None:  # before any process starts or any directory is made
        print(f"gymckpt: error: {problem}", file=sys.stderr)
        if as_json:
            print(json.dumps(error_report(problem, ExitCode.BAD_INPUT, opts), sort_keys=True))
        return ExitCode.BAD_INPUT
    if opts.workdir:
        workdir = Path(opts.workdir)
        if workdir.exists() and any(workdir.iterdir()):
            error = (f"--workdir {workdir} is not empty; give a new or empty directory")
            print(f"gymckpt: error: {error}", file=sys.stderr)
            if as_json:
                print(json.dumps(error_report(error, ExitCode.BAD_INPUT, opts),
                                 sort_keys=True))
            return ExitCode.BAD_INPUT
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="gymckpt-demo-"))
    killed = False

    def finish(rc: int, error: str | None = None, phase: int | None = None) -> int:
        """Report the run (finished or not) and return its exit code."""
        if error is None and rc != 0 and phase is not None:
            error = _phase_error(workdir, phase, rc)
        report = _report(opts, workdir, killed, t0)
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
        if as_json:
            print(json.dumps(report, sort_keys=True))
        elif error is None:
            _print_report(report)
        return rc

    timeout = 600.0
    _PREEMPTION.install()
    if opts.crash_after_checkpoint:
        progress(f"phase 1: trainer process, SIGKILL after checkpoint "
                        f"{opts.crash_after_checkpoint} (workdir {workdir})")
        rc, killed = _run_until_published(
            _phase_cmd(opts, workdir, 1, opts.crash_after_checkpoint), timeout)
        if opts.crash_stage is not None and rc == -signal.SIGKILL:
            killed = True  # phase 1 killed itself at its crash stage
        if _PREEMPTION.received is not None:
            return finish(*_preempted(workdir, rc))
        if not killed:
            if rc != 0:
                return finish(rc, phase=1)
            progress("phase 1 finished before its checkpoint was published; no crash")
        else:
            progress(f"phase 1: killed with SIGKILL (exit {rc}); phase 2 restores")
            rc = _PREEMPTION.run(_phase_cmd(opts, workdir, 2, 0), timeout, stdout=_phase_stdout())
            if _PREEMPTION.received is not None:
                return finish(*_preempted(workdir, rc))
            if rc != 0:
                return finish(rc, phase=2)
    else:
        rc = _PREEMPTION.run(_phase_cmd(opts, workdir, 1, 0), timeout, stdout=_phase_stdout())
        if _PREEMPTION.received is not None:
            return finish(*_preempted(workdir, rc))
        if rc != 0:
            return finish(rc, phase=1)
    return finish(0)


def _environment_problem(opts: DemoOptions) -> str | None:
    """Why ``--env`` cannot run here (the gymnasium extra missing, an unknown id, an id
    without a state codec), in one line; None when it can."""
    env_id = opts.gymnasium_id
    if env_id is None:
        return None
    try:
        from gymckpt.gym_adapter.gymnasium_env import gymnasium_environment
    except ImportError as exc:
        return (f"--env {opts.env} needs Gymnasium, an optional extra ({exc}): "
                "pip install -e '.[gymnasium]'")
    try:
        gymnasium_environment(env_id)
    except EnvironmentSpecError as exc:
        return str(exc)
    return None


def _phase_error(workdir: Path, phase: int, rc: int) -> str:
    """The error line a failed phase left, or what its exit code says."""
    path = _phase_error_file(workdir, phase)
    try:
        return str(orjson.loads(path.read_bytes())["error"])
    except (OSError, ValueError, KeyError, TypeError):
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        return f"phase {phase} {how}"


def error_report(error: str, exit_code: int, opts: DemoOptions | None = None) -> dict[str, Any]:
    """The JSON object of a demo that stopped before it ran (bad flags or work directory)."""
    rows = opts.rows if opts is not None else 0
    return {"rows": rows, "rows_trained": 0, "rows_failed": 0, "duplicates": 0, "lost": 0,
            "steps": 0, "steps_trained_twice": 0, "sentinels_duplicated": 0,
            "sentinels_missing": 0, "checkpoints_ok": 0, "checkpoints_failed": 0, "restores": 0,
            "exactly_once": False, "error": error, "exit_code": int(exit_code)}


def _report(opts: DemoOptions, workdir: Path, killed: bool, t0: float) -> dict[str, Any]:
    phases = []
    for p in (1, 2):
        path = workdir / f"phase-{p}.json"
        if path.exists():
            phases.append(orjson.loads(path.read_bytes()))
    report = verdict(opts, workdir, phases)
    report.update({
        "killed_with_sigkill": killed,
        "backend": opts.backend,
        "instances": opts.instances,
        "group_size": opts.group_size,
        "seed": opts.seed,
        "env": opts.env,
        "workdir": str(workdir),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "snapshots": [str(i.path) for i in SnapshotStore(workdir / SNAPSHOTS_DIR).list_complete()],
        "replacements": int(sum(p.get("metrics", {}).get("rollout/instances_replaced_total", 0)
                                for p in phases)),
    })
    return report


def _preempted(workdir: Path, rc: int) -> tuple[int, str]:
    """One line for a demo stopped by SIGTERM/SIGINT: the snapshot the trainer left.
    (exit code, that line)."""
    received = _PREEMPTION.received
    name = received.name if received is not None else "signal"
    latest = SnapshotStore(workdir / SNAPSHOTS_DIR).latest_complete()
    left = f"snapshot {latest.path}" if latest is not None else "no snapshot"
    line = f"demo stopped by {name}; the trainer left {left}"
    print(f"gymckpt: {line}", file=sys.stderr)
    return (0 if rc == 0 else rc), line


def _print_report(r: dict[str, Any]) -> None:
    lines = [
        "gymckpt demo",
        f"  backend {r['backend']}, {r['instances']} instances, group size {r['group_size']},"
        f" seed {r['seed']}",
        f"  rows trained        {r['rows_trained']}/{r['rows']} (failed {r['rows_failed']},"
        f" lost {r['lost']}, duplicates {r['duplicates']})",
        f"  steps               {r['steps']} (trained twice: {r['steps_trained_twice']})",
        f"  sentinels           {r['sentinels_total']}/{r['sentinels_expected']}"
        f" (duplicated {r['sentinels_duplicated']}, missing {r['sentinels_missing']})",
        f"  checkpoints         {r['checkpoints_ok']} ok, {r['checkpoints_failed']} failed",
        f"  restores            {r['restores']}"
        f" (SIGKILL: {'yes' if r['killed_with_sigkill'] else 'no'})",
        "  stage medians (ms)  " + ", ".join(f"{k} {v:g}" for k, v in r["stage_ms_median"].items()),
        f"  elapsed             {r['elapsed_s']:.1f}s, workdir {r['workdir']}"
        f"{'' if r.get('workdir_kept', True) else ' (removed; --keep keeps it)'}",
        *([f"  trajectories        {r['episodes']} episodes of {r['env']}, identical to an "
           f"uninterrupted run: {'YES' if r['trajectories_match'] else 'NO'}"]
          if "trajectories_match" in r else []),
        f"  exactly once        {'YES' if r['exactly_once'] else 'NO'}",
    ]
    print("\n".join(lines))
