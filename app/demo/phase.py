"""One phase of the demo: a trainer process's worth of the run (``run_phase``) and its
entry point (``phase_main``, ``gymckpt _phase``).

A phase opens the Gym deployment and the runtime on the work directory (restoring its latest
complete snapshot, if any), trains the toy trainer on the batches it is handed, journals every
step, checkpoints every ``--checkpoint-every`` steps, and ends with a final checkpoint. Phase 1
prints ``PUBLISHED`` and the checkpoint id on stdout once its N-th checkpoint is published,
for the parent to SIGKILL it. A phase that fails leaves its one-line error in
``phase-N-error.json`` for the parent's report, and exits with the code ``run_exit`` gives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import orjson
import trio

from gymckpt.gym_adapter import EmbeddedGym, EnvironmentRef, GymBackend, HttpGym, RunRow
from gymckpt.gym_adapter.environments.calendar import (
    calendar_environment,
    calendar_from_environ_path,
)
from gymckpt.nurseries import CheckpointOutcome, ExitCode, Rollouts, open_rollouts, run_exit
from gymckpt.runtime import CompletedGroup, GymUnavailable, Preempted
from gymckpt.runtime.lowlevel import write_atomic

from ..toy_trainer import ToyTrainer
from .crash import install_crash
from .envs import open_demo_gym
from .gymnasium import journal_episodes
from .journal import FRESH_START, JOURNAL, Journal, checkpoint_record
from .options import DemoOptions
from .progress import PROGRESS_ENV, Progress

__all__ = [
    "PUBLISHED",
    "open_gym",
    "phase_error",
    "phase_error_file",
    "phase_main",
    "record_phase_error",
    "run_phase",
]

PUBLISHED = "GYMCKPT-CHECKPOINT-PUBLISHED"
"""What phase 1 prints on stdout, with the checkpoint id, once its N-th checkpoint is
published: the parent's cue to SIGKILL it."""


@asynccontextmanager
async def open_gym(opts: DemoOptions, workdir: Path) -> AsyncIterator[GymBackend]:
    """The Gym deployment the demo runs on."""
    choice = opts.env_choice
    if choice is not None:
        async with open_demo_gym(
            choice,
            opts.instances,
            opts.seed,
            workdir / "gym-live",
            opts.faults,
            opts.runtime_config().lease_s,
            backend=opts.backend,
            state_root=workdir,  # the servers accept snapshot paths inside the work directory
        ) as gym:
            yield gym
        return
    config = opts.sim_config()
    work_dir = workdir / "gym-live"
    if opts.backend == "http":
        # the servers accept commit and restore paths inside the work directory, where the
        # trainer's snapshots are
        async with HttpGym.spawn(
            calendar_from_environ_path(opts.agent_kind),
            opts.instances,
            work_dir=work_dir,
            config=config.host_config(),
            faults=opts.faults,
            seed=opts.seed,
            state_root=workdir,
            environ=config.environ(),
        ) as gym:
            yield gym
        return
    environment = EnvironmentRef.to(calendar_environment, agent_kind=opts.agent_kind, config=config)
    if opts.backend == "ray":
        from gymckpt.gym_adapter import RayGym  # Ray, an optional extra, only when asked for

        async with RayGym.host(
            environment,
            opts.instances,
            opts.seed,
            work_dir,
            config.host_config(),
            opts.faults,
            opts.ray_address,
        ) as gym:
            yield gym
        return
    async with EmbeddedGym.host(
        environment, opts.instances, opts.seed, work_dir, config.host_config(), opts.faults
    ) as gym:
        yield gym


async def run_phase(
    opts: DemoOptions, workdir: Path, phase: int, crash_after: int
) -> dict[str, Any]:
    """Run one trainer process's worth of the demo; returns its result record."""
    default = "1" if sys.stderr.isatty() else "0"
    progress = Progress(enabled=os.environ.get(PROGRESS_ENV, default) == "1")
    run = _Phase(opts, phase, crash_after, Journal(workdir / JOURNAL), progress)
    async with (
        open_gym(opts, workdir) as gym,
        open_rollouts(
            gym,
            workdir,
            rows=opts.rows,
            group_size=opts.group_size,
            config=opts.runtime_config(),
            max_rows_in_flight=opts.max_rows_in_flight,
            run_id=f"p{phase}",
            on_dispatch=run.audit,
        ) as rollouts,
    ):
        if crash_after and opts.crash_stage is not None:
            install_crash(opts, phase, crash_after, rollouts)
        if rollouts.trainer_state is not None:
            run.trainer = ToyTrainer.from_bytes(rollouts.trainer_state)
        if rollouts.restored is not None:
            run.journal_restore(rollouts)
        else:
            run.journal_fresh_start()
        await run.train(rollouts)
        final = await run.final_checkpoint(rollouts)
        metrics = rollouts.metrics.snapshot()
        restore_summary = rollouts.restore_summary
    return {
        "phase": phase,
        "steps": run.trainer.step,
        "final_snapshot": str(final.snapshot.path) if final.snapshot else None,
        "restored": attrs.asdict(restore_summary) if restore_summary else None,
        "metrics": metrics,
    }


@attrs.define(eq=False, slots=True)
class _Phase:
    """One phase's trainer and what it journals: restored dispatches, the restore, every
    step and checkpoint; ``PUBLISHED`` once its ``crash_after``-th checkpoint is published."""

    opts: DemoOptions
    phase: int
    crash_after: int
    journal: Journal
    progress: Progress
    trainer: ToyTrainer = attrs.field(factory=ToyTrainer)
    outcomes: list[CheckpointOutcome] = attrs.field(factory=list)
    published: int = 0
    """Checkpoints this phase published in its loop."""

    def audit(self, instance: str, rows: Sequence[RunRow]) -> None:
        """``open_rollouts``' ``on_dispatch``: a restored episode's one dispatch (S11)."""
        for r in rows:
            if r.restored_from is not None:
                self.journal.append(
                    {
                        "phase": self.phase,
                        "dispatch": r.rollout_id,
                        "instance": instance,
                        "restored_from": r.restored_from,
                    }
                )

    def journal_fresh_start(self) -> None:
        """This phase found no complete snapshot: its trainer starts from its initial state,
        so every step an earlier phase trained is discarded from the lineage (journaled as a
        ``fresh_start`` line; phase 2 after a kill before any snapshot was committed)."""
        self.journal.append({"phase": self.phase, FRESH_START: True})

    def journal_restore(self, rollouts: Rollouts) -> None:
        """The restore this phase started from, journaled and shown."""
        restored, summary = rollouts.restored, rollouts.restore_summary
        assert restored is not None
        phase, trainer = self.phase, self.trainer
        self.journal.append(
            {
                "phase": phase,
                "restore_to_step": trainer.step,
                "snapshot": restored.snapshot.checkpoint_id,
            }
        )
        assert summary is not None
        self.progress(
            f"[phase {phase}] restored {restored.snapshot.checkpoint_id}"
            f" at step {trainer.step}: {summary.restored} episodes parked in Gym, "
            f"{summary.completed_untrained} completed but untrained, "
            f"{summary.reserved + summary.redispatched_fresh} to dispatch again"
        )

    async def train(self, rollouts: Rollouts) -> None:
        """Train on every batch, journal each step, checkpoint every ``checkpoint_every``
        steps; a preemption ends the loop after its final checkpoint."""
        # an async generator (annotated as an iterator): close it here, not at garbage collection
        batches = cast(
            AsyncGenerator[list[CompletedGroup], None],
            rollouts.batches(self.opts.groups_per_step, state=lambda: self.trainer.to_bytes()),
        )
        async with aclosing(batches):  # an abort mid-loop finalises the generator here
            try:
                async for batch in batches:
                    self.trained(batch)
                    if self.trainer.step % self.opts.checkpoint_every == 0:
                        await self.checkpoint(rollouts)
            except Preempted:
                pass  # its final checkpoint is taken (or tried): the record below says which

    def trained(self, batch: Sequence[CompletedGroup]) -> None:
        """One step on ``batch``, journaled and shown."""
        opts, phase = self.opts, self.phase
        rewards = [r.reward for g in batch for r in g.results]
        trainer = self.trainer = self.trainer.train(rewards, len(batch))
        record: dict[str, Any] = {
            "phase": phase,
            "step": trainer.step,
            "rows": [g.row for g in batch],
        }
        if opts.env_choice is not None:
            record["episodes"] = journal_episodes(batch)
        self.journal.append(record)
        total_steps = -(-opts.rows // opts.groups_per_step)
        self.progress(
            f"[phase {phase}] step {trainer.step}/{total_steps} "
            f"rows {trainer.rows_trained}/{opts.rows} "
            f"reward≈{trainer.reward_ema:.3f}",
            frequent=True,
        )

    async def checkpoint(self, rollouts: Rollouts) -> None:
        """A periodic checkpoint, journaled and shown (the first one, and any failed one,
        even when progress is sparse); ``PUBLISHED`` on stdout at the ``crash_after``-th."""
        phase = self.phase
        outcome = await rollouts.checkpoint(self.trainer.to_bytes())
        self.outcomes.append(outcome)
        self.journal.append(checkpoint_record(phase, outcome))
        self.progress(
            f"[phase {phase}] checkpoint {outcome.checkpoint_id}: "
            f"{'ok' if outcome.ok else outcome.reason} "
            f"({outcome.episodes} episodes parked, "
            f"{outcome.drained} drained)",
            frequent=self.published > 0 or not outcome.ok,
        )  # the first is shown
        if outcome.ok:
            self.published += 1
            if self.crash_after and self.published == self.crash_after:
                print(f"{PUBLISHED} {outcome.checkpoint_id}", flush=True)

    async def final_checkpoint(self, rollouts: Rollouts) -> CheckpointOutcome:
        """A last checkpoint, which saves the environment state the verdict reads (a
        preempted run's final one, when it published), retried up to
        ``max_consecutive_failures`` + 1 times."""
        final = rollouts.outcomes[-1] if rollouts.final_snapshot is not None else None  # preempted
        for _ in range(
            0 if final is not None else self.opts.runtime_config().max_consecutive_failures + 1
        ):
            final = await rollouts.checkpoint(self.trainer.to_bytes())
            self.outcomes.append(final)
            self.journal.append(checkpoint_record(self.phase, final))
            if final.ok:
                break
        assert final is not None
        return final


def phase_main(opts: DemoOptions, workdir: Path, phase: int, crash_after: int) -> int:
    """Entry point of a phase process; exit codes per C4 (see ``run_exit``).

    The run's error arrives wrapped in the nurseries' exception groups; ``run_exit`` decides
    on the errors inside them, so ``CheckpointsFailed`` ends the phase with exit 4, not a
    traceback with exit 1. Bad input (manifest, topology) is re-raised bare for the CLI to
    report with exit 2. Every Gym
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
            record_phase_error(workdir, phase, f"{type(exc).__name__}: {exc}", 1)
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
        record_phase_error(workdir, phase, line, code)
        if code == ExitCode.BAD_INPUT:
            raise err from None
        print(f"gymckpt: {line}", file=sys.stderr)
        return code
    write_atomic(workdir / f"phase-{phase}.json", orjson.dumps(result))
    return 0


def phase_error_file(workdir: Path, phase: int) -> Path:
    """Where a failed phase leaves its one-line error and exit code."""
    return workdir / f"phase-{phase}-error.json"


def record_phase_error(workdir: Path, phase: int, error: str, code: int) -> None:
    """Leave the phase's one-line error for the parent's report (``--json``)."""
    with contextlib.suppress(OSError):  # the error line on stderr still says it
        write_atomic(
            phase_error_file(workdir, phase), orjson.dumps({"error": error, "exit_code": int(code)})
        )


def phase_error(workdir: Path, phase: int, rc: int) -> str:
    """The error line a failed phase left, or what its exit code says."""
    path = phase_error_file(workdir, phase)
    try:
        return str(orjson.loads(path.read_bytes())["error"])
    except (OSError, ValueError, KeyError, TypeError):
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        return f"phase {phase} {how}"
