"""One life of a simulated scenario: one trainer process's worth of the run.

A *life* runs from the trainer's start (restoring the latest snapshot, if any) to its crash or
end; a scenario runs several (``Scenario.max_lives``). The word is the simulation's own: in
gymckpt an *incarnation* is one life of a Gym server (``HttpGym``), so the simulated trainer's
lives are not called that; only the simulation's output keeps the older word, unchanged
(``incarnations`` and ``incarnation_ends`` in ``--json``, ``incarnation N:`` in its lines
and violations), so outputs and fingerprints stay what they were.

A ``TrainerLife`` opens a fresh embedded Gym, opens the runtime on the scenario's work
directory (restoring its latest complete snapshot, if any), trains the toy trainer on the
batches it is handed, checkpoints every ``checkpoint_every`` steps, and at the end of the
dataset takes a final checkpoint (retried up to ``max_consecutive_failures`` + 1 times). Then
it checks what only a running life can see (``checks``), waits out the lease, and
reports how it ended (``LifeReport``).

Its cancel scope (``CrashControl.scope``) is the crash: cancelled at a virtual time or at a
hook point of one of its checkpoints, it abandons the runtime and its Gym mid-flight, and the
next life restores what the last one published. A stall budget (``STALL_S``) bounds it
in virtual time, and its liveness watch (``liveness``) cuts it when nothing moves within
the scenario's liveness bound (a violation). An error out of the run ends it too
(``ends.failed_end``); a restore Gym could not serve is retried once into the same Gym
when the scenario says so (``Scenario.restore_retry``), which must then restore cleanly
(all-or-nothing across instances).

Real usage (``usage``): the rows go in the drawn order; a live restart runs the first
life on a Gym that outlives it (``ScenarioRun.live``), which the second restores into
while it still runs the dead trainer's episodes; a second trainer opens the first
life's Gym at a drawn time and must be refused (``_second_trainer``); rows the model
server's outage struck must never be given up for it.

The lineage of the final model is kept in ``ScenarioRun.lineage``: on every restore, the
steps after the restored trainer's step are dropped (they died with the abandoned trainer).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager, nullcontext
from typing import Any, cast

import attrs
import trio

from gymckpt.gym_adapter import EmbeddedGym, FaultPlan, GymBackend, RunRow
from gymckpt.nurseries import Rollouts, open_rollouts, run_exit
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    BudgetExhausted,
    CompletedGroup,
    GymInstanceDead,
    GymInUse,
    RuntimeConfig,
    load_snapshot,
)
from gymckpt.testing.hostile import HostileActs, journal_faults

from ..toy_trainer import ToyTrainer
from .checks import (
    check_budgets,
    check_dropped_state_retired,
    check_not_parked,
    check_released,
    check_restored_claims,
    check_restored_installs,
)
from .crashes import CrashControl
from .ends import LifeEnd, failed_end, restore_may_retry, single_error
from .gym import LateEnds, installs, open_gym
from .liveness import Liveness, Moving, liveness_bound_s
from .modes import ModeWatch
from .reports import LifeReport
from .scenario import Crash, Scenario
from .state import ScenarioRun
from .usage import SecondTrainer

__all__ = ["STALL_S", "TrainerLife"]

STALL_S = 5_000.0
"""Virtual seconds a life may take before it counts as stalled (a violation)."""


@attrs.define(eq=False)
class TrainerLife:
    """Life ``index`` of ``run``'s scenario, with Gym ``faults``; ``crash``: where it is
    abandoned; ``races``: whether the scenario's races and hostile acts strike (every
    life but the last). ``await run_to_end()`` once; it returns the report."""

    run: ScenarioRun
    index: int
    faults: tuple[str, ...]
    crash: Crash | None
    races: bool = True
    config: RuntimeConfig = attrs.field(init=False)
    control: CrashControl = attrs.field(init=False)
    acts: HostileActs | None = attrs.field(init=False)
    end: LifeEnd = attrs.field(default=LifeEnd.FINISHED, init=False)
    error: str | None = attrs.field(default=None, init=False)
    restored_from: str | None = attrs.field(default=None, init=False)
    """The checkpoint id the runtime restored, if it restored one."""
    outcomes: list[tuple[str, bool, str | None]] = attrs.field(factory=list, init=False)
    """``(checkpoint id, ok, reason)`` of every checkpoint taken, in order."""
    claims: list[tuple[str, RunRow]] = attrs.field(factory=list, init=False)
    """``(instance, row)`` of every dispatch."""
    steps: int = attrs.field(default=0, init=False)
    lease_reopened: int = attrs.field(default=0, init=False)
    rollouts: Rollouts | None = attrs.field(default=None, init=False)
    """The runtime, once ``open_rollouts`` yielded (the restore, if any, succeeded)."""
    trainer: ToyTrainer = attrs.field(factory=ToyTrainer, init=False)
    checkpoint_calls: int = attrs.field(default=0, init=False)
    installed_before: dict[tuple[str, int], int] = attrs.field(factory=dict, init=False)
    """Restores each instance generation had made when a failed restore rolled back."""
    mid_turn: int = attrs.field(default=0, init=False)
    """Episodes this life's published checkpoints took mid-turn
    (``CheckpointOutcome.mid_turn``)."""
    taken: int = attrs.field(default=0, init=False)
    """Episodes in this life's published checkpoints (``CheckpointOutcome.episodes``)."""
    watch: ModeWatch | None = attrs.field(default=None, init=False)
    liveness: Liveness = attrs.field(init=False)
    live_restart: bool = attrs.field(default=False, init=False)
    """This life restores into the previous one's Gym, still running."""
    claimed_before: int = attrs.field(default=0, init=False)
    """Restored episodes the Gym had continued before this life (a live Gym's)."""
    fired_before: int = attrs.field(default=0, init=False)
    """Faults the Gym had fired before this life (a live Gym's)."""

    def __attrs_post_init__(self) -> None:
        sc = self.run.sc
        self.config = sc.runtime_config()
        self.run.final_snapshot = None
        self.control = CrashControl(sc, self.run.rng, self.crash, self.races)
        self.control.arm()
        self.liveness = Liveness(liveness_bound_s(sc.usage.longest_wait_s))
        self.liveness.arm()
        if self.run.live is not None:  # the Gym and its environment's acts outlive us
            self.acts = self.run.live.acts
        else:
            self.acts = HostileActs(sc.hostile, active=self.races) if sc.hostile else None

    @property
    def scenario(self) -> Scenario:
        return self.run.sc

    def violation(self, text: str) -> None:
        self.run.violation(self.index, text)

    async def run_to_end(self) -> LifeReport:
        """Run the life until it finishes, crashes, stalls or fails; report it."""
        acts = self.acts
        try:
            with (
                self.control.scope,
                trio.move_on_after(STALL_S) as stall_scope,
                self.liveness.scope,
                journal_faults(acts, self.control.kill) if acts is not None else nullcontext(),
            ):
                await self._serve()
            if self.control.scope.cancelled_caught:
                self.end = LifeEnd.CRASHED
            elif self.liveness.stalled:
                self.end = LifeEnd.NO_PROGRESS
                self.violation(self.liveness.violation())
            elif stall_scope.cancelled_caught:
                self.end = LifeEnd.STALLED
                self.violation(f"moved but did not end within {STALL_S:g} virtual seconds")
        except Exception as exc:
            failed = failed_end(exc, opened=self.rollouts is not None)
            self.end, self.error = failed.end, failed.error
            if failed.violation is not None:
                self.violation(failed.violation)
        return self._report()

    async def _serve(self) -> None:
        """Open the Gym and the runtime on it (once more after a restore Gym could not serve,
        when the scenario retries it)."""
        sc = self.scenario
        async with self._gym() as gym:
            self.control.gym = gym
            inner = LateEnds(gym, sc.late_end_s) if sc.late_end_s else gym
            self.watch = ModeWatch(inner, gym, sc.checkpoint_mode, self.violation)
            backend = cast(GymBackend, Moving(self.watch, self.liveness))
            for attempt in (1, 2):
                try:
                    await self._train(gym, backend)
                    return
                except Exception as exc:
                    if (
                        self.rollouts is not None
                        or attempt == 2
                        or not sc.restore_retry
                        or not restore_may_retry(exc)
                    ):
                        raise
                    # the restore failed into this Gym; it rolled back, so a restart into
                    # the same Gym must restore cleanly (all-or-nothing across instances)
                    self.installed_before.update(installs(await gym.statistics()))

    @asynccontextmanager
    async def _gym(self) -> AsyncIterator[EmbeddedGym]:
        """This life's Gym: a fresh one, closed when it ends, or the live Gym the
        scenario run holds (a live restart: the previous life's, still running)."""
        live = self.run.live
        if live is None:
            usage = (self.run.counts, self.run.t0)
            work = self.run.root / f"gym-{self.index}"
            async with open_gym(self.scenario, work, self.faults, self.acts, usage) as gym:
                yield gym
            return
        gs = await live.gym.statistics()
        if self.index > 0:  # restored into the dead life's running Gym
            self.live_restart = True
            self.run.counts.live_restarts += 1
            self.installed_before.update(installs(gs))
            self.claimed_before = sum(s.episodes_claimed for s in (*gs.instances, *gs.replaced))
            self.fired_before = sum(n for _, n in live.gym.faults.fired)
        yield live.gym

    def _rows(self) -> dict[str, Any]:
        """``open_rollouts``' rows: the scenario's count, or the drawn order (``RowOrder``)."""
        order = self.scenario.usage.order
        return {"rows": self.scenario.rows} if order is None else order.open_kwargs()

    async def _train(self, gym: EmbeddedGym, backend: GymBackend) -> None:
        sc, run = self.scenario, self.run
        self.checkpoint_calls = 0
        async with open_rollouts(
            backend,
            run.workdir,
            **self._rows(),
            group_size=sc.group_size,
            config=self.config,
            max_rows_in_flight=sc.max_rows_in_flight,
            batch_size=sc.batch_size,
            keep_snapshots=sc.keep_snapshots,
            run_id=f"i{self.index}",
            on_dispatch=lambda i, rows: self.claims.extend((i, r) for r in rows),
            handle_signals=False,  # SIGTERM and Ctrl-C stop the simulation, not a seed's trainer
        ) as ro:
            self.rollouts = ro
            self.liveness.moved("the open (and restore)")
            replaced_at_open = len((await gym.statistics()).replaced)
            ro.coordinator.on_stage = self._on_stage
            if ro.restored is not None:  # nothing dispatched yet
                check_dropped_state_retired(self.violation, gym, ro.restored.files)
            self.trainer = ToyTrainer()
            if ro.trainer_state is not None:
                self.trainer = ToyTrainer.from_bytes(ro.trainer_state)
            if ro.restored is not None:
                self.restored_from = ro.restored.snapshot.checkpoint_id
            # the final model descends from the restored step; later steps died
            run.lineage[:] = [s for s in run.lineage if s[0] <= self.trainer.step]
            # what Gym installed: the restored manifest's episodes (the dispatcher may
            # already be claiming some, so the ledger's unclaimed set is a moving target)
            replicas: dict[str, str] = {}
            if ro.restored is not None:
                manifest = load_snapshot(ro.restored.pinned.path).manifest
                replicas = {e.rollout_id: e.replica for e in manifest.episodes}
            initial_spent = ro.ledger.statistics().row_attempts_spent
            initial_data = ro.ledger.statistics().data_failures
            second = sc.usage.second_trainer if self.index == 0 else None
            if second is None:
                await self._train_dataset(ro)
            else:
                await self._train_beside_second(ro, gym, second)
            self._check_outage_rows(ro)
            run.final_snapshot = None
            for _ in range(self.config.max_consecutive_failures + 1):
                if await self._checkpoint(ro):
                    break
            check_budgets(
                self.violation,
                ro,
                max_consecutive_failures=sc.max_consecutive_failures,
                initial_spent=initial_spent,
                checkpoint_calls=self.checkpoint_calls,
                hostile=self.acts,
                initial_data_failures=initial_data,
            )
            refused = ro.metrics.get(ADMISSION_CLOSED_ROWS) > 0
            seen = check_restored_claims(self.violation, self.claims, replicas, refused)
            gs = await gym.statistics()
            acts = self.acts
            check_restored_installs(
                self.violation,
                gs,
                claimed_restored=len(seen) + self.claimed_before,
                restored=len(replicas),
                journal_stopped=acts is not None
                and bool(acts.fired["full_disk"] or acts.fired["torn_record"]),
                replaced_at_open=replaced_at_open,
                installed_before=self.installed_before,
            )
            # Gym is never left parked beyond its lease, whatever the last resume did
            self.liveness.moved("the dataset's end")
            await trio.sleep(sc.lease_s + 1.0)
            self.lease_reopened += check_not_parked(self.violation, gym, sc.lease_s)

    async def _train_dataset(self, ro: Rollouts) -> None:
        """Train every batch the runtime hands out, checkpointing every ``checkpoint_every``
        steps, until the dataset is done."""
        sc = self.scenario
        initial_failed = len(ro.ledger.rows_failed)  # a restored ledger's
        batches = cast(AsyncGenerator[list[CompletedGroup], None], ro.batches(sc.groups_per_step))
        async with aclosing(batches):  # an abort mid-loop must finalise it here
            try:
                async for batch in batches:
                    rewards = [r.reward for g in batch for r in g.results]
                    self.trainer = self.trainer.train(rewards, len(batch))
                    self.run.lineage.append((self.trainer.step, tuple(g.position for g in batch)))
                    self.run.rows_of.update((g.position, g.row) for g in batch)
                    self.steps += 1
                    self.liveness.moved(f"step {self.trainer.step} trained")
                    if self.trainer.step % sc.checkpoint_every == 0:
                        await self._checkpoint(ro)
            except BudgetExhausted:
                # the dataset is done, every row failed for good (faults can do that: a
                # run that hangs every submission): this trainer still leaves a snapshot
                if ro.ledger.rows_trained or len(ro.ledger.rows_failed) != sc.positions:
                    raise
                failed_here = len(ro.ledger.rows_failed) - initial_failed
                if failed_here and not self._faulty():
                    self.violation(f"{failed_here} rows failed for good without any fault")

    async def _train_beside_second(
        self, ro: Rollouts, gym: EmbeddedGym, second: SecondTrainer
    ) -> None:
        """``_train_dataset`` while a second trainer tries to open the same Gym (the errors
        of the training itself come out as they would alone, not in a group)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._second_trainer, gym, second)
                await self._train_dataset(ro)
        except BaseExceptionGroup as group:
            err = single_error(group)
            if err is group:
                raise
            raise err from None

    async def _second_trainer(self, gym: EmbeddedGym, second: SecondTrainer) -> None:
        """A second trainer, with a work directory and a facade of its own, opens the Gym this
        life drives ``second.at_s`` in and tries to train one step within
        ``second.window_s``.

        Expected (one trainer per Gym): ``GymInUse`` out of ``open_rollouts`` (its attach),
        a run ending with exit code 2, and nothing else: any other error, a step trained, or no
        refusal within the window is a violation, unless instances died (faults: then it
        waits for them within the outage budget, or stops on one it cannot replace,
        ``GymInstanceDead``: unreachable rather than refused).
        The first run goes on unaffected: its own checks and the final verdict say so (a
        checkpoint of it refused, a row lost, a sentinel twice all are violations of their
        own).
        """
        sc = self.scenario
        await trio.sleep(second.at_s)
        died_before = self._deaths()
        # another trainer process: a facade of its own over the same instances (a deployment's
        # facade carries its own trainer's term), which cannot replace them
        backend = EmbeddedGym([gym.sim(n) for n in gym.instances], FaultPlan(()))
        trained = False
        error: BaseException | None = None
        with trio.move_on_after(second.window_s):
            try:
                async with open_rollouts(
                    backend,
                    self.run.root / "second-trainer",
                    rows=sc.rows,
                    group_size=sc.group_size,
                    config=self.config,
                    max_rows_in_flight=sc.max_rows_in_flight,
                    batch_size=sc.batch_size,
                    restore=False,
                    run_id="second",
                    handle_signals=False,
                ) as second_ro:
                    batches = cast(AsyncGenerator[list[CompletedGroup], None], second_ro.batches(1))
                    async with aclosing(batches):
                        async for _ in batches:
                            trained = True
                            break
            except Exception as exc:
                error = exc
        if error is not None and not trained:
            decided = run_exit(error)
            if decided is not None and decided[0] == 2 and isinstance(decided[1], GymInUse):
                self.run.counts.second_refused += 1
                return
            if decided is not None and isinstance(decided[1], GymInstanceDead):
                # it met an instance dead (faults) that it cannot replace: it never reached
                # one to be refused by; not let in either
                self.run.counts.second_unreachable += 1
                return
            err = single_error(error)
            self.violation(
                f"second trainer: expected GymInUse (exit code 2), got {type(err).__name__}: {err}"
            )
        elif not trained and self._deaths() > died_before:
            # instances kept dying (faults): it waited for them, as the first run did; not let
            # in (a step trained, on a replacement too, is), not refused either
            self.run.counts.second_unreachable += 1
            return
        else:
            what = "trained a step" if trained else f"was not refused within {second.window_s:g}s"
            self.violation(
                f"second trainer (another work dir) attached to the Gym this one drives and "
                f"{what} (one trainer per Gym: expected a clear refusal)"
            )
        self.run.counts.second_let_in += 1

    def _deaths(self) -> int:
        """Faults that killed an instance of this life's Gym so far."""
        gym = self.control.gym
        if gym is None:
            return 0
        return sum(1 for spec, _ in gym.faults.fired if "dead" in spec)

    def _check_outage_rows(self, ro: Rollouts) -> None:
        """No row given up because the model server was down: a slot the outage refused in
        every attempt a row has (``max_row_attempts``) is an outage charged to the row. Judged
        when nothing else fails rows (``_faulty``): a Gym fault that spends an attempt the
        outage also refused a call of (a stream dropped after it) is charged to the fault."""
        if self._faulty():
            return
        failed = ro.ledger.rows_failed
        given_up = sorted(
            {
                row
                for (row, _slot), attempts in self.run.counts.outage_attempts.items()  # positions
                if row in failed and len(attempts) >= self.config.max_row_attempts
            }
        )
        if given_up:
            self.violation(
                f"{len(given_up)} rows given up for a model-server outage "
                f"({given_up[:5]}): an outage is infrastructure, waited out, never charged "
                "to a row's attempts"
            )

    def _on_stage(self, checkpoint_id: str, point: str) -> None:
        """The coordinator's hook: the mode's checks (before a race strikes), then the crash
        control's races and crash."""
        if self.watch is not None:
            self.watch.at_stage(checkpoint_id, point)
        self.control.on_stage(checkpoint_id, point)

    async def _checkpoint(self, ro: Rollouts) -> bool:
        self.checkpoint_calls += 1
        outcome = await ro.checkpoint(self.trainer.to_bytes())
        self.liveness.moved(f"checkpoint {outcome.checkpoint_id} ended")
        self.outcomes.append((outcome.checkpoint_id, outcome.ok, outcome.reason))
        self.mid_turn += outcome.mid_turn
        self.taken += outcome.episodes
        if outcome.ok and outcome.snapshot is not None:
            self.run.final_snapshot = outcome.snapshot.path
        return outcome.ok

    def _faulty(self) -> bool:
        """Whether anything in this life can fail rows or abort the run: Gym faults,
        instance deaths between checkpoint stages, the environment's hostile acts."""
        return bool(
            self.faults or (self.races and self.scenario.stage_deaths) or self.acts is not None
        )

    def _report(self) -> LifeReport:
        self.liveness.still()
        self.run.longest_still_s = max(self.run.longest_still_s, self.liveness.longest_still_s)
        acts, gym, ro = self.acts, self.control.gym, self.rollouts
        hostile_fired = tuple(sorted(acts.fired.items())) if acts is not None else ()
        outage = self.scenario.usage.outage
        if self.end is LifeEnd.INFRA_OUTAGE and outage is not None and outage.over_budget:
            if self.error is None or "\n" in self.error:  # the expected end: exit 8, one line
                self.violation(
                    f"an outage over the budget ended the run without one line: {self.error!r}"
                )
        elif (
            self.end.documented_abort
            and not (self.live_restart and self.end is LifeEnd.RESTORE_FAILED)
            and not self.faults
            and not (self.races and self.scenario.stage_deaths)
            and not hostile_fired
        ):
            self.violation(f"aborted ({self.end}) without any fault: {self.error}")
        if ro is not None:
            check_released(self.violation, ro)
        if (
            self.live_restart
            and self.end is LifeEnd.RESTORE_FAILED
            and gym is not None
            and sum(n for _, n in gym.faults.fired) == self.fired_before
            and not hostile_fired
        ):
            self.violation(
                "restore into the dead trainer's still running Gym refused, no fault "
                f"accounting for it: {self.error} (a restore fences the dead incarnation "
                "and proceeds)"
            )
        fired: tuple[tuple[str, int], ...] = ()
        replacements = 0
        if gym is not None:
            fired = gym.faults.fired
            replacements = sum(gym.replacement_count(n) for n in gym.instances)
        metrics = ro.metrics.snapshot(ages=False) if ro is not None else {}  # replayable
        return LifeReport(
            self.index,
            self.faults,
            self.end.value,
            self.error,
            self.restored_from,
            tuple(self.outcomes),
            fired,
            self.steps,
            sum(1 for _, r in self.claims if r.restored_from),
            self.lease_reopened,
            metrics,
            replacements,
            hostile_fired,
            self.scenario.checkpoint_mode.value,
            self.mid_turn,
            self.taken,
        )
