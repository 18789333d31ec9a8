"""The trainer-loop facade: a trio trainer drives rollouts and checkpoints in a few lines.

    async with open_rollouts(gym, workdir, rows=1024, group_size=8) as rollouts:
        state = rollouts.trainer_state or b"{}"          # restored, or fresh
        async for batch in rollouts.batches(groups_per_step=4):
            state = train(state, batch)
            await rollouts.checkpoint(state)              # or every=N in open_rollouts

``open_rollouts`` restores the latest complete snapshot in ``workdir`` if there is one, starts
the dispatcher in its own nursery, and on exit cancels it — no task outlives the block.
``checkpoint`` returns the outcome; a ``gym_unavailable`` failure is retried at the next call,
invariant violations and too many failures in a row raise (exit codes 3 and 4).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from gymckpt.gym_adapter import GymBackend, RunRow
from gymckpt.runtime import (
    BudgetExhausted,
    CompletedGroup,
    DeadlineRegistry,
    DispatchGate,
    Metrics,
    Preempted,
    RecoveryLedger,
    RestoreSummary,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    TaskDataset,
    WorkDirLock,
)
from gymckpt.runtime._shared import (
    RESTORED_DIR,
    SNAPSHOTS_DIR,
    STEP_FILE,
    TRAINER_FILES_DIR,
    TRAINER_STATE_FILE,
    DatasetIdentity,
    RowOrder,
    StepRecord,
    dump_step,
    freeze_startup_objects,
    next_term,
)

from ._attach import attach_trainer, release_trainer
from ._coordinator import CheckpointCoordinator, CheckpointOutcome
from ._dispatcher import READY, Dispatcher
from ._offload import offload
from ._replace import InstanceReplacer
from ._restore import RestoredRun, restore_latest

__all__ = ["RESTORED_DIR", "SNAPSHOTS_DIR", "TRAINER_STATE_FILE", "Rollouts", "open_rollouts"]

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)

logger = logging.getLogger("gymckpt")


StateFn = Callable[[], bytes]
"""The trainer's current state, serialised: called at each checkpoint ``batches`` takes."""
FilesFn = Callable[[Path], None]
"""Writes the trainer's own files (weights, optimizer shards) into the directory it is given;
runs in a worker thread, before Gym is parked."""


@attrs.define(eq=False, slots=True)
class Rollouts:
    """A running rollout service for one trainer. Create it with ``open_rollouts``.

    Preemption: ``preempt`` (what SIGTERM and SIGINT call while ``open_rollouts`` is open, a
    signal that arrived during the restore included) lets the step being trained finish, stops
    ``next_batch`` from waiting or handing out more, and makes ``batches`` take one final
    checkpoint, bounded by ``preempt_timeout_s``, with the trainer's current state, then raise
    ``Preempted``: a preempted run never looks like a finished one. A second signal (at any
    time after the first) cuts that checkpoint short, or skips it if it has not started.
    """

    ledger: RecoveryLedger
    dispatcher: Dispatcher
    coordinator: CheckpointCoordinator
    store: SnapshotStore
    metrics: Metrics
    restored: RestoredRun | None
    keep_snapshots: int
    checkpoint_every: int | None
    preempt_timeout_s: float = 60.0
    order: RowOrder | None = None
    """The run's row order (None: the ledger's rows are the dataset rows)."""
    _steps: int = attrs.field(default=0, init=False)
    _handed: int = attrs.field(default=0, init=False)
    """Batches ``batches`` handed out in this process (a step's batch is trained data in the
    ledger from then on, so a checkpoint taken inside the step counts the step)."""
    _first_step: int = attrs.field(default=0, init=False)
    outcomes: list[CheckpointOutcome] = attrs.field(factory=list, init=False)
    preempted_by: signal.Signals | None = attrs.field(default=None, init=False)
    """The signal that preempted the run (``preempt``), or None. ``batches`` raises
    ``Preempted`` once it is set; a trainer driving ``next_batch`` itself checks it when that
    returns an empty list."""
    final_snapshot: SnapshotInfo | None = attrs.field(default=None, init=False)
    """The snapshot the final checkpoint of a preempted run left, or None."""
    _waits: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _final_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _cut_short: bool = attrs.field(default=False, init=False)
    """A second signal arrived: the final checkpoint is cancelled (or never started)."""

    @property
    def trainer_state(self) -> bytes | None:
        """The trainer state saved with the restored snapshot, or None on a fresh start."""
        if self.restored is None:
            return None
        return self.restored.files.get(TRAINER_STATE_FILE)

    @property
    def trainer_files(self) -> Path | None:
        """The directory of trainer files (weights, optimizer) restored with the snapshot, or
        None. It is the restore's own copy, digest-checked against the commit marker before
        anything was restored; read it before the next restore replaces it."""
        if self.restored is None:
            return None
        path = self.restored.pinned.path / TRAINER_FILES_DIR
        return path if path.is_dir() else None

    @property
    def restore_summary(self) -> RestoreSummary | None:
        return None if self.restored is None else self.restored.summary

    @property
    def steps(self) -> int:
        """Batches ``batches`` handed out and the trainer finished in this process."""
        return self._steps

    @property
    def step(self) -> int:
        """The run's step: steps trained before the restored snapshot (every incarnation) plus
        ``steps``. What ``log_metrics`` is given, so a resumed run's logger steps go on. A
        snapshot records the steps whose batches were handed out, the one in progress included
        (its groups are trained in the ledger's eyes and will not come back)."""
        return self._first_step + self._steps

    def _finished(self) -> bool:
        ledger = self.ledger
        return self.dispatcher.rows_exhausted and ledger.ready_groups == len(ledger.rows())

    @property
    def finished(self) -> bool:
        """The dataset is done: every row was trained (its groups taken) or failed for good,
        and nothing is left to hand out."""
        return self.dispatcher.rows_exhausted and not self.ledger.rows()

    @property
    def policy_version(self) -> int:
        """The trainer's policy version as last set (``set_policy_version``; 0 at start)."""
        return self.dispatcher.policy_version

    def set_policy_version(self, version: int) -> None:
        """Tell the runtime the trainer's policy is now at ``version`` (call it after each
        weight update). Every row dispatched from now on carries it to Gym, and an instance
        records the newest version it has been told with every model call it makes
        (``ModelCall.policy_version``; a replayed call keeps the version it was made with).
        An instance learns it with the next rows sent to it. Versions are ints that never go
        back: ``ValueError`` for a negative one, a bool, or one below the current version."""
        if type(version) is not int or version < 0:
            raise ValueError(f"a policy version is an int >= 0, got {version!r}")
        if version < self.dispatcher.policy_version:
            raise ValueError(
                f"policy version {version} is below the current one, "
                f"{self.dispatcher.policy_version}: versions never go back"
            )
        self.dispatcher.policy_version = version

    def preempt(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Stop after the current step with a final checkpoint (see the class docstring)."""
        if self.preempted_by is not None:
            if not self._cut_short:
                logger.warning("%s again: cutting the final checkpoint short", signum.name)
            self._cut_short = True
            if self._final_scope is not None:
                self._final_scope.cancel()
            return
        self.preempted_by = signum
        logger.info("%s received: finishing the current step, then a final checkpoint", signum.name)
        for scope in self._waits:
            scope.cancel()

    async def next_batch(self, groups: int) -> list[CompletedGroup]:
        """Wait for ``groups`` complete prompt groups and take them (fewer at the very end, or
        at most ``max_rows_in_flight``; an empty list once every row is trained or failed, and
        once the run is preempted)."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        ledger = self.ledger
        # never more than the rows kept in flight can be ready at once
        want = min(groups, self.dispatcher.max_rows_in_flight)
        with trio.CancelScope() as waiting:  # cancelled by ``preempt``
            self._waits.add(waiting)
            try:
                if self.preempted_by is None:
                    await ledger.barrier.wait_until(
                        lambda: ledger.ready_groups >= want or self._finished(), [READY]
                    )
            finally:
                self._waits.discard(waiting)
        if self.preempted_by is not None:
            return []
        row_of = None if self.order is None or self.order.is_identity else self.order.row_at
        taken = await ledger.barrier.mutate(lambda: ledger.take_ready(groups, row_of))
        self.dispatcher.poke()
        return taken

    async def batches(
        self,
        groups_per_step: int,
        *,
        state: StateFn | None = None,
        files: FilesFn | None = None,
        log_metrics: Callable[[dict[str, float], int], None] | None = None,
    ) -> AsyncIterator[list[CompletedGroup]]:
        """Yield batches of complete groups until the dataset is done, or raise ``Preempted``
        once SIGTERM or SIGINT preempted the run (after the final checkpoint below), so code
        after the loop — a final evaluation, an upload — runs only when the dataset is done.
        A dataset whose every row failed for good raises ``BudgetExhausted`` (exit code 7),
        and one some of whose rows failed logs a WARNING saying how many.

        With ``checkpoint_every`` set, checkpoint every that many batches; ``state()`` (the
        trainer's current state, serialised) and ``files(directory)`` (its weights) are saved
        with each of these checkpoints and with the final one a preemption takes before the
        iteration ends. ``log_metrics(metrics, step)`` gets ``metrics.snapshot()`` after each
        step — the shape W&B, MLflow and TensorBoard loggers take (``wandb.log(m, step=s)``).
        """
        while True:
            batch = await self.next_batch(groups_per_step)
            if not batch:
                break
            self._handed += 1
            yield batch
            self._steps += 1
            periodic = self.checkpoint_every and self._steps % self.checkpoint_every == 0
            if periodic and self.preempted_by is None:
                await self.checkpoint(None if state is None else state(), files=files)
            if log_metrics is not None:
                log_metrics(self.metrics.snapshot(), self.step)
            if self.preempted_by is not None:
                break
        if self.preempted_by is not None:
            raise await self._final_checkpoint(state, files)
        self._dataset_done()

    def _dataset_done(self) -> None:
        """The dataset is done: rows that failed for good are said, and a dataset none of whose
        rows trained is a failed run, not a finished one."""
        ledger = self.ledger
        failed = len(ledger.rows_failed)
        if not failed:
            return
        trained = len(ledger.rows_trained)
        last = ledger.last_failure or "in an earlier run, before the restore"
        if trained == 0:
            raise BudgetExhausted(
                f"every row of the dataset failed for good ({failed} rows, none trained, "
                f"{ledger.data_failures} data failures; last: {last}); each failure is logged "
                "under the gymckpt logger: fix the environment or the data"
            )
        logger.warning(
            "gymckpt: dataset done: %d rows trained, %d failed for good (last failure: %s)",
            trained,
            failed,
            last,
        )

    def _prune(self) -> None:
        """Retention: the newest ``keep_snapshots`` snapshots, and of the restore copies
        only the one this run restored from (older incarnations' copies go)."""
        self.store.prune(self.keep_snapshots)
        self.store.prune_copies(self.store.root.parent / RESTORED_DIR)

    async def _final_checkpoint(self, state: StateFn | None, files: FilesFn | None) -> Preempted:
        """The final checkpoint of a preempted run, bounded by ``preempt_timeout_s`` and cut
        short by a second signal; logs one line naming the snapshot the run leaves and returns
        the ``Preempted`` that ``batches`` raises."""
        signame = self.preempted_by.name if self.preempted_by is not None else "preempt"
        outcome: CheckpointOutcome | None = None
        with trio.move_on_after(self.preempt_timeout_s) as scope:
            self._final_scope = scope
            if self._cut_short:  # the second signal came before the checkpoint could start
                scope.cancel()
            try:
                outcome = await self.checkpoint(None if state is None else state(), files=files)
            finally:
                self._final_scope = None
        if outcome is not None and outcome.ok and outcome.snapshot is not None:
            self.final_snapshot = outcome.snapshot
            message = (
                f"gymckpt: {signame}: stopped after step {self.step}; final snapshot "
                f"{outcome.snapshot.path} (checkpoint {outcome.checkpoint_id})"
            )
            logger.warning("%s", message)
            return Preempted(signame, self.step, str(outcome.snapshot.path), message)
        latest = await offload(self.store.latest_complete)
        if outcome is None:
            why = (
                "cut short"
                if self._cut_short
                else (f"timed out after preempt_timeout_s={self.preempt_timeout_s:g}s")
            )
        else:
            why = f"failed ({outcome.reason}: {outcome.error})"
        left = str(latest.path) if latest is not None else None
        message = (
            f"gymckpt: {signame}: stopped after step {self.step}; the final checkpoint "
            f"{why}, latest snapshot {left or 'none'}"
        )
        logger.warning("%s", message)
        return Preempted(signame, self.step, left, message)

    async def checkpoint(
        self, trainer_state: bytes | None = None, *, files: FilesFn | None = None
    ) -> CheckpointOutcome:
        """Take a rollout checkpoint now; ``trainer_state`` is stored with it, and
        ``files(directory)`` writes the trainer's own files (model and optimizer shards, any
        size) into the same atomic snapshot: they are published together with the rollouts or
        not at all, digested in the commit marker, and come back as ``trainer_files``."""
        step = StepRecord(self._first_step + self._handed, self.dispatcher.policy_version)
        extra = {STEP_FILE: dump_step(step)}
        if trainer_state is not None:
            extra[TRAINER_STATE_FILE] = trainer_state
        outcome = await self.coordinator.checkpoint(extra, files)
        self.outcomes.append(outcome)
        if outcome.ok and self.keep_snapshots > 0:
            await offload(self._prune)
        return outcome


async def _take_workdir(workdir: Path | str, config: RuntimeConfig) -> tuple[Path, WorkDirLock]:
    """The work directory, resolved and locked for this trainer (``WorkDirLocked`` if another
    holds it), after the startup freeze of the collector where the config asks for it."""
    if config.freeze_startup_objects:
        freeze_startup_objects()  # once per process: a full collection, then a freeze
    resolved = await offload(Path(workdir).resolve)
    lock = WorkDirLock(resolved)
    await offload(lock.acquire)  # one trainer per work directory; raises WorkDirLocked
    return resolved, lock


@asynccontextmanager
async def open_rollouts(
    gym: GymBackend,
    workdir: Path | str,
    *,
    rows: int | Iterable[int] | None = None,
    group_size: int,
    dataset: object = None,
    epochs: int = 1,
    shuffle_seed: int | None = None,
    config: RuntimeConfig | None = None,
    max_rows_in_flight: int = 64,
    batch_size: int = 64,
    checkpoint_every: int | None = None,
    keep_snapshots: int = 3,
    restore: bool = True,
    run_id: str = "run",
    extra_metrics: Mapping[str, float] | None = None,
    on_dispatch: Callable[[str, Sequence[RunRow]], None] | None = None,
    handle_signals: bool = True,
    preempt_timeout_s: float = 60.0,
    on_restore: Callable[[int, Path | None], Awaitable[None]] | None = None,
) -> AsyncIterator[Rollouts]:
    """Open the rollout runtime on ``gym`` with snapshots under ``workdir/snapshots``.

    ``dataset``: the tasks (a sequence or iterable of JSON values, a JSONL file's path, or
    anything with ``__len__`` and ``__getitem__`` such as a ``datasets.Dataset``); every row the
    run uses is checked here (``DatasetError``, exit 2). ``rows``: a count or row indices in any
    order, each once (default: every dataset row). ``epochs`` and ``shuffle_seed``: that many
    passes, each in its own seeded shuffle; a restore resumes at the order's cursor and refuses
    another order (``DatasetMismatch``, exit 2). ``restore``: restore the latest complete
    snapshot first. ``on_dispatch(instance, rows)``: called after each admission.
    ``on_restore``: the trainer's hook run after a restore, before any row (``_after_restore``).

    On entry: one trainer per ``workdir`` (``WorkDirLocked``); this start's trainer term fences
    what an older term left on the instances (another run's refuse: ``GymInUse``); with
    ``handle_signals`` SIGTERM/SIGINT preempt the run after a final checkpoint (``Preempted``).
    In full: the trainer loop's reference page (``docs/reference/trainer.md``).
    """
    config = config or RuntimeConfig()
    workdir, lock = await _take_workdir(workdir, config)
    try:
        with contextlib.ExitStack() as stack:
            # installed first: a signal during the restore is kept for the Rollouts
            inbox = _signal_inbox(stack) if handle_signals else None
            tasks, order = await _row_plan(dataset, rows, epochs, shuffle_seed)
            store = SnapshotStore(workdir / SNAPSHOTS_DIR)
            await offload(lambda: store.root.mkdir(parents=True, exist_ok=True))
            # this start's term, attached before anything changes (by the restore once checked)
            trainer = await offload(lambda: next_term(workdir))
            restored = None
            if restore:
                restored = await restore_latest(
                    gym,
                    store,
                    workdir / RESTORED_DIR,
                    config,
                    group_size=group_size,
                    dataset=tasks,
                    order=order,
                    trainer=trainer,
                )
            if restored is None:  # a fresh start: nothing attached yet
                await attach_trainer(gym, trainer, config)
            await _after_restore(restored, on_restore)
            parts = _Parts(gym, store, config, restored, tasks, order, group_size, extra_metrics)
            rollouts, replacer = parts.assemble(
                max_rows_in_flight=max_rows_in_flight,
                batch_size=batch_size,
                on_dispatch=on_dispatch,
                run_id=run_id,
                keep_snapshots=keep_snapshots,
                checkpoint_every=checkpoint_every,
                preempt_timeout_s=preempt_timeout_s,
            )
            async with _running(rollouts, replacer, inbox):
                yield rollouts
            if rollouts.finished:  # the run is done: another run may take its Gym instances
                await release_trainer(gym, trainer, config)
    finally:
        lock.release()


async def _after_restore(
    restored: RestoredRun | None,
    on_restore: Callable[[int, Path | None], Awaitable[None]] | None,
) -> None:
    """After a restore (nothing on a fresh start), before any row is dispatched (so before any
    episode calls the model): ``await on_restore(policy_version, files)`` with the snapshot's
    policy version and its trainer files directory (None without files), where the trainer
    brings a model server that outlived it back to the snapshot's weights (a weight push to
    vLLM or SGLang). An error out of the hook ends the open."""
    if restored is None or on_restore is None:
        return
    files = restored.pinned.path / TRAINER_FILES_DIR
    is_dir = await offload(files.is_dir)
    await on_restore(restored.policy_version, files if is_dir else None)


def _signal_inbox(stack: contextlib.ExitStack) -> _SignalInbox | None:
    """SIGTERM and SIGINT kept from now on, in an inbox installed for as long as ``stack``
    holds (only in the main thread: None elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    inbox = _SignalInbox(trio.lowlevel.current_trio_token())
    stack.enter_context(inbox.installed())
    return inbox


async def _row_plan(
    dataset: object, rows: int | Iterable[int] | None, epochs: int, shuffle_seed: int | None
) -> tuple[TaskDataset | None, RowOrder]:
    """The trainer's tasks (None without a dataset) and the run's row order, every row the
    run will use checked (``DatasetError`` otherwise), before anything else happens."""
    tasks = None if dataset is None else await offload(lambda: TaskDataset.of(dataset))
    order = await offload(
        functools.partial(
            RowOrder.of,
            rows,
            None if tasks is None else len(tasks),
            epochs=epochs,
            shuffle_seed=shuffle_seed,
            source="" if tasks is None else tasks.source,
        )
    )
    if tasks is not None:
        await offload(functools.partial(tasks.check, order.rows))
    return tasks, order


@attrs.frozen
class _Parts:
    """What ``open_rollouts`` has once the restore (or the attach) is done, from which it
    builds the run's parts: the ledger (restored or fresh), the dispatcher, the checkpoint
    coordinator and the instance replacer around it, and the ``Rollouts`` over them."""

    gym: GymBackend
    store: SnapshotStore
    config: RuntimeConfig
    restored: RestoredRun | None
    tasks: TaskDataset | None
    order: RowOrder
    group_size: int
    extra_metrics: Mapping[str, float] | None

    def ledger(self) -> RecoveryLedger:
        if self.restored is not None:
            return self.restored.ledger
        return RecoveryLedger(
            group_size=self.group_size,
            max_row_attempts=self.config.max_row_attempts,
            data_failure_budget=self.config.data_failure_budget,
        )

    def cut_files(self) -> Callable[[int], dict[str, bytes]]:
        """The files a cut at a row position adds: the order's, and the dataset's with one."""
        if self.tasks is None:
            return self.order.files
        covered = () if self.restored is None else self.restored.dataset_rows
        identity = DatasetIdentity(self.tasks, covered, self.order.rows_used)
        return functools.partial(_cut_files, self.order, identity)

    def metrics(self) -> Metrics:
        metrics = Metrics()
        for name, value in (self.extra_metrics or {}).items():
            metrics.set(name, value)
        return metrics

    def assemble(
        self,
        *,
        max_rows_in_flight: int,
        batch_size: int,
        on_dispatch: Callable[[str, Sequence[RunRow]], None] | None,
        run_id: str,
        keep_snapshots: int,
        checkpoint_every: int | None,
        preempt_timeout_s: float,
    ) -> tuple[Rollouts, InstanceReplacer]:
        """The ``Rollouts`` and the replacer its run starts beside the dispatcher; after a
        restore, resumed where the snapshot stands."""
        gym, config, order, tasks = self.gym, self.config, self.order, self.tasks
        ledger = self.ledger()
        # positions are reserved in ascending order: the cursor is where the order stands
        remaining = iter(range(ledger.next_row, len(order)))
        cut_files = self.cut_files()
        metrics = self.metrics()
        gate = DispatchGate()
        deadlines = DeadlineRegistry()
        replacer = InstanceReplacer(gym, ledger, config, metrics)
        dispatcher = Dispatcher(
            gym,
            ledger,
            gate,
            deadlines,
            config,
            metrics,
            remaining,
            replacer,
            max_rows_in_flight=max_rows_in_flight,
            batch_size=batch_size,
            on_dispatch=on_dispatch,
            row_of=None if order.is_identity else order.row_at,
            tasks=None if tasks is None else tasks.task,
        )
        replacer.on_released = dispatcher.enqueue
        replacer.on_up = lambda _instance: dispatcher.poke()
        coordinator = CheckpointCoordinator(
            gym,
            ledger,
            gate,
            deadlines,
            self.store,
            config,
            metrics,
            run_id=run_id,
            replacer=replacer,
            cut_files=cut_files,
        )
        rollouts = Rollouts(
            ledger,
            dispatcher,
            coordinator,
            self.store,
            metrics,
            self.restored,
            keep_snapshots,
            checkpoint_every,
            preempt_timeout_s,
            order,
        )
        if self.restored is not None:
            _resume(rollouts, self.restored, order)
        return rollouts, replacer


def _resume(rollouts: Rollouts, restored: RestoredRun, order: RowOrder) -> None:
    """A restored run goes on where its snapshot stands: its step, its policy version (before
    anything is dispatched: every call after the restore carries it), the restored rows queued
    for dispatch; the restore is logged, and so is a dataset with nothing left to do."""
    ledger, metrics, dispatcher = rollouts.ledger, rollouts.metrics, rollouts.dispatcher
    if ledger.next_row >= len(order) and not ledger.rows():
        logger.warning(
            "gymckpt: nothing left to do: every row of the dataset was trained "
            "(restored %s, checkpoint %s)",
            restored.snapshot.path,
            restored.snapshot.checkpoint_id,
        )
    metrics.inc("rollout/restores_total")
    metrics.inc("checkpoint/restored_total")
    rollouts._first_step = restored.step
    dispatcher.policy_version = restored.policy_version
    _log_restore(restored, ledger, rollouts._first_step)
    dispatcher.enqueue_reserved()


@asynccontextmanager
async def _running(
    rollouts: Rollouts, replacer: InstanceReplacer, inbox: _SignalInbox | None
) -> AsyncIterator[None]:
    """The run's tasks, the replacer and the dispatcher, in a nursery the block's exit
    cancels: no task outlives it. Signals kept so far preempt the run before the block runs."""
    async with trio.open_nursery() as nursery:
        await nursery.start(replacer.run)  # replacements live as long as the run
        await nursery.start(rollouts.dispatcher.run)
        if inbox is not None:
            inbox.attach(rollouts)  # synchronous: signals so far preempt it now
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


def _cut_files(order: RowOrder, identity: DatasetIdentity, next_row: int) -> dict[str, bytes]:
    """The order's and the dataset's files of a cut at ``next_row`` (blocking)."""
    return {**order.files(next_row), **identity.files(next_row)}


def _log_restore(restored: RestoredRun, ledger: RecoveryLedger, step: int) -> None:
    """One WARNING (shown on stderr with no logging configured): a rerun that resumed says so,
    and from which snapshot."""
    stats = ledger.statistics()
    logger.warning(
        "gymckpt: resumed from snapshot %s (checkpoint %s) at step %d: %d episodes parked in "
        "Gym resume as attempt + 1, %d completed-but-untrained results back to the trainer, "
        "%d rows trained before, %d to re-dispatch",
        restored.snapshot.path,
        restored.snapshot.checkpoint_id,
        step,
        restored.summary.restored,
        restored.summary.completed_untrained,
        stats.rows_trained,
        restored.summary.reserved + restored.summary.redispatched_fresh,
    )


@attrs.define(eq=False, slots=True)
class _SignalInbox:
    """SIGTERM and SIGINT while ``open_rollouts`` is open.

    The handler (it runs between two bytecodes of whatever trio code was running) only
    appends the signal and asks trio's loop to deliver it; delivery, ``Rollouts.preempt``,
    runs as a loop callback, never inside the handler. Signals that arrive before the
    ``Rollouts`` exists (during the restore) wait here, and ``attach`` delivers them
    synchronously before the trainer's body runs. Every signal is delivered once, in order.
    """

    token: trio.lowlevel.TrioToken
    received: list[signal.Signals] = attrs.field(factory=list)
    delivered: int = 0
    target: Rollouts | None = None

    def handle(self, signum: int, _frame: object) -> None:
        self.received.append(signal.Signals(signum))
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self.deliver, idempotent=True)

    def deliver(self) -> None:
        if self.target is None:
            return
        while self.delivered < len(self.received):
            signum = self.received[self.delivered]
            self.delivered += 1
            self.target.preempt(signum)

    def attach(self, rollouts: Rollouts) -> None:
        self.target = rollouts
        self.deliver()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle) for sig in PREEMPT_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
