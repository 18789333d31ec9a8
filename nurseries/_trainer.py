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

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from gymckpt.gym_adapter import GymBackend, RunRow
from gymckpt.runtime import (
    CompletedGroup,
    DeadlineRegistry,
    DispatchGate,
    Metrics,
    RecoveryLedger,
    RuntimeConfig,
    SnapshotStore,
)
from gymckpt.runtime._ledger import RestoreSummary

from ._coordinator import CheckpointCoordinator, CheckpointOutcome
from ._dispatcher import READY, Dispatcher
from ._offload import offload
from ._restore import RestoredRun, restore_latest

__all__ = ["TRAINER_STATE_FILE", "Rollouts", "open_rollouts"]

TRAINER_STATE_FILE = "trainer.json"


@attrs.define(eq=False, slots=True)
class Rollouts:
    """A running rollout service for one trainer. Create it with ``open_rollouts``."""

    ledger: RecoveryLedger
    dispatcher: Dispatcher
    coordinator: CheckpointCoordinator
    store: SnapshotStore
    metrics: Metrics
    restored: RestoredRun | None
    keep_snapshots: int
    checkpoint_every: int | None
    _steps: int = attrs.field(default=0, init=False)
    outcomes: list[CheckpointOutcome] = attrs.field(factory=list, init=False)

    @property
    def trainer_state(self) -> bytes | None:
        """The trainer state saved with the restored snapshot, or None on a fresh start."""
        if self.restored is None:
            return None
        return self.restored.files.get(TRAINER_STATE_FILE)

    @property
    def restore_summary(self) -> RestoreSummary | None:
        return None if self.restored is None else self.restored.summary

    def _finished(self) -> bool:
        ledger = self.ledger
        return self.dispatcher.rows_exhausted and ledger.ready_groups == len(ledger.rows())

    async def next_batch(self, groups: int) -> list[CompletedGroup]:
        """Wait for ``groups`` complete prompt groups and take them (fewer at the very end, or
        at most ``max_rows_in_flight``; an empty list once every row is trained or failed)."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        ledger = self.ledger
        # never more than the rows kept in flight can be ready at once
        want = min(groups, self.dispatcher.max_rows_in_flight)
        await ledger.barrier.wait_until(
            lambda: ledger.ready_groups >= want or self._finished(), [READY]
        )
        taken = await ledger.barrier.mutate(lambda: ledger.take_ready(groups))
        self.dispatcher.poke()
        return taken

    async def batches(self, groups_per_step: int) -> AsyncIterator[list[CompletedGroup]]:
        """Yield batches of complete groups until the dataset is done; with ``checkpoint_every``
        set, checkpoint (without trainer state) every that many batches."""
        while True:
            batch = await self.next_batch(groups_per_step)
            if not batch:
                return
            yield batch
            self._steps += 1
            if self.checkpoint_every and self._steps % self.checkpoint_every == 0:
                await self.checkpoint()

    async def checkpoint(self, trainer_state: bytes | None = None) -> CheckpointOutcome:
        """Take a rollout checkpoint now; ``trainer_state`` is stored with it."""
        files = {} if trainer_state is None else {TRAINER_STATE_FILE: trainer_state}
        outcome = await self.coordinator.checkpoint(files)
        self.outcomes.append(outcome)
        if outcome.ok and self.keep_snapshots > 0:
            await offload(lambda: self.store.prune(self.keep_snapshots))
        return outcome


@asynccontextmanager
async def open_rollouts(
    gym: GymBackend,
    workdir: Path | str,
    *,
    rows: int | Iterable[int],
    group_size: int,
    config: RuntimeConfig | None = None,
    max_rows_in_flight: int = 64,
    batch_size: int = 64,
    checkpoint_every: int | None = None,
    keep_snapshots: int = 3,
    restore: bool = True,
    run_id: str = "run",
    extra_metrics: Mapping[str, float] | None = None,
    on_dispatch: Callable[[str, Sequence[RunRow]], None] | None = None,
) -> AsyncIterator[Rollouts]:
    """Open the rollout runtime on ``gym`` with snapshots under ``workdir/snapshots``.

    ``rows`` is the dataset: a count (rows ``0..rows-1``) or an iterable of row indices in
    order. With ``restore`` (default) the latest complete snapshot is restored first.
    ``on_dispatch(instance, rows)`` is called after each admission (for audit trails).
    """
    config = config or RuntimeConfig()
    workdir = await offload(Path(workdir).resolve)
    store = SnapshotStore(workdir / "snapshots")
    await offload(lambda: store.root.mkdir(parents=True, exist_ok=True))
    restored = await restore_latest(gym, store, workdir / "restored", config) if restore else None
    if restored is not None:
        ledger = restored.ledger
        if ledger.group_size != group_size:
            raise ValueError(
                f"snapshot has group_size {ledger.group_size}, this run asks for {group_size}"
            )
    else:
        ledger = RecoveryLedger(
            group_size=group_size,
            max_row_attempts=config.max_row_attempts,
            data_failure_budget=config.data_failure_budget,
        )
    all_rows = range(rows) if isinstance(rows, int) else list(rows)
    start = ledger.next_row
    remaining = iter([r for r in all_rows if r >= start])
    metrics = Metrics()
    for name, value in (extra_metrics or {}).items():
        metrics.set(name, value)
    gate = DispatchGate()
    deadlines = DeadlineRegistry()
    dispatcher = Dispatcher(
        gym, ledger, gate, deadlines, config, metrics, remaining,
        max_rows_in_flight=max_rows_in_flight, batch_size=batch_size, on_dispatch=on_dispatch,
    )
    coordinator = CheckpointCoordinator(
        gym, ledger, gate, deadlines, store, config, metrics, run_id=run_id
    )
    rollouts = Rollouts(
        ledger, dispatcher, coordinator, store, metrics, restored, keep_snapshots, checkpoint_every
    )
    if restored is not None:
        metrics.inc("rollout/restores_total")
        dispatcher.enqueue_reserved()
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        try:
            yield rollouts
        finally:
            nursery.cancel_scope.cancel()
