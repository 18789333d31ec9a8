"""CheckpointCoordinator: a consistent rollout checkpoint while rollouts keep running.

The protocol, and why it is in this order
-----------------------------------------
1. **Close admission, pause deadlines** (S1, S7). ``DispatchGate.close`` returns only once no
   admission is in progress, so from here on the ledger's DISPATCHED set is exactly what reached
   Gym. The checkpoint's deadline pause (holder ``"gym-checkpoint"``) stops request deadlines
   while Gym is parked; it never touches another holder's pause.
2. **Retire dropped attempts** (S4) while Gym is still idle — Gym refuses a retire once a
   checkpoint is open. Only what was retired is forgotten; a failure here fails the checkpoint
   (retryable) rather than letting Gym export an episode the ledger no longer owns.
3. **Prepare** every instance in ``RuntimeConfig.checkpoint_mode``: Gym closes its own
   admission; aligned, it parks each episode at its next step boundary, waiting at most
   ``alignment_timeout_s`` (Flink's aligned-checkpoint timeout: the episodes still inside a
   turn then are taken as step 4 takes them unaligned, so no turn fails a checkpoint);
   unaligned, nothing parks.
4. **Commit** every instance: participants write their records under the staging snapshot; the
   replies list participants and digests, exported episodes, and replies on the wire.
   Unaligned (or aligned past the alignment timeout), each instance's commit is its cut:
   episodes are taken at their last step boundary with the model calls completed so far, and
   every reply the instance produces after its cut is held there until resume, so steps 6 and
   7 see exactly the replies sent before the cut.
5. **Ownership** (S10), off the loop: an episode is owned by the participant that exported it,
   else by a legacy agent session with a step boundary; a parked session nobody owns fails the
   checkpoint at once instead of waiting out the drain.
6. **Drain** (S9): wait only for the episodes whose reply was on the wire and that the ledger
   still has in flight, sleeping on the barrier keyed by exactly those rollout IDs. No polling;
   per-wakeup cost O(pending).
7. **Snapshot**: hold the barrier (replies and trainer hand-offs queue, undisturbed), and in a
   worker thread check that the ledger's inventory equals what Gym exported, copy the ledger and
   the completed-but-untrained results, build ``gym_checkpoint.json``; release; publish the
   snapshot atomically with its commit marker (also in a thread).
8. **Resume** Gym, release the pause, reopen admission (new gate ID).

No full garbage collection runs during a checkpoint (``runtime.collector_paused``; young ones
do): it would pause the loop and the stages' worker threads for as long as it walks all of the
process's objects, exactly while replies must land and the drain must wake.

A dead instance (``GymInstanceDead`` anywhere in a failed checkpoint's errors) is reported to the
``InstanceReplacer``; that checkpoint fails as ``gym_unavailable`` (retryable, counted). A
checkpoint first waits (bounded by ``replace_timeout_s``) for instances being replaced, so the
next one runs with the replacement in the topology.

Whatever happens, step 8's pause release and reopen run (shielded, in ``finally``); if we parked
Gym and fail, we try to resume it, and Gym's lease reopens it if that resume is lost too. Every
control call is bounded by its deadline plus reply grace (S5). Failures are classified (S6):
``gym_unavailable`` is retried by the caller up to ``max_consecutive_failures``; ownership,
topology and reply mismatches raise ``CheckpointInvariantError`` and the run aborts.

The parts (Flink's split of its checkpoint package)
---------------------------------------------------
``CheckpointCoordinator`` (here) drives the protocol above and reserves checkpoint IDs; each
concern beside it has a module of its own:

* ``_pending.PendingCheckpoint``: one checkpoint in flight — its stage timings, its staging
  directory, and what it took (admission, the pause, Gym parked), given back in one shielded
  ``release``;
* ``_failure_manager.CheckpointFailureManager``: the consecutive-failure budget;
* ``_checkpoint_stats.CheckpointStatsTracker``: counts, metrics and log lines;
* ``_ownership``: the pure rules over the commit replies (reply checks, S10, the cut);
* ``_calls.classify`` over ``runtime.failure_kind``: what a failure is.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from gymckpt.gym_adapter import GymBackend, Topology
from gymckpt.runtime import (
    CheckpointInvariantError,
    DeadlineRegistry,
    DispatchGate,
    DrainTimeout,
    FailureKind,
    GymInUse,
    Metrics,
    RecoveryLedger,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    wait_drained,
)
from gymckpt.runtime._shared import (
    LEDGER_FILE,
    MANIFEST_VERSION,
    GymManifest,
    release_in_slices,
    tree_size,
)
from gymckpt.runtime.lowlevel import collector_paused, promote_survivors

from ._calls import bounded_call, classify, fan_out
from ._checkpoint_stats import CheckpointStatsTracker
from ._failure_manager import CheckpointFailureManager
from ._offload import offload
from ._ownership import Cut, Ownership, check_replies, cut, ownership
from ._pending import PAUSE_HOLDER, PendingCheckpoint, TrainerFilesFailed
from ._replace import InstanceReplacer, dead_in

__all__ = [
    "HOOK_POINTS",
    "PAUSE_HOLDER",
    "STAGES",
    "CheckpointCoordinator",
    "CheckpointOutcome",
    "CoordinatorStatistics",
]

STAGES = (
    "trainer_files",
    "close",
    "retire",
    "prepare",
    "commit",
    "ownership",
    "drain",
    "snapshot",
    "publish",
    "resume",
)
HOOK_POINTS = (
    "before_prepare",
    "after_prepare",
    "after_commit",
    "before_publish",
    "after_publish",
    "before_resume",
)


@attrs.frozen
class CoordinatorStatistics:
    """Counts of one coordinator (a snapshot; for checks and tests).

    ``checkpoints_ok + checkpoints_failed`` is every checkpoint that returned an outcome or
    raised; ``consecutive_failures`` never exceeds ``max_consecutive_failures`` while the run
    goes on (one more raises ``CheckpointsFailed``)."""

    checkpoints_ok: int
    checkpoints_failed: int
    consecutive_failures: int
    last_checkpoint_seq: int


@attrs.frozen
class CheckpointOutcome:
    """What one checkpoint did. ``ok`` False means it failed retryably and changed nothing the
    trainer holds; ``reason`` is ``gym_unavailable`` (Gym could not park, answer or commit),
    ``snapshot_io`` (a full disk or an I/O error writing the snapshot) or ``trainer_files`` (the
    trainer's ``files=`` writer left a link to a directory or to nothing, or a special file, in
    ``trainer/``; ``error`` names it). An invariant failure raises instead."""

    checkpoint_id: str
    ok: bool
    snapshot: SnapshotInfo | None
    reason: FailureKind | None
    error: str | None
    stage_s: Mapping[str, float]
    episodes: int = 0
    """Episodes the snapshot holds: ``at_boundary`` of them at a step boundary, ``mid_turn``
    in the middle of a turn."""
    drained: int = 0
    mid_turn: int = 0
    """Episodes taken in the middle of a turn (at their last step boundary, with the model
    calls they had completed; a restore replays that turn): unaligned, those inside a turn at
    the cut; aligned, those that had not reached a boundary within ``alignment_timeout_s``
    (0 when every episode parked in time)."""

    @property
    def at_boundary(self) -> int:
        """Episodes taken at a step boundary (parked there, between turns, or restored and
        not claimed yet)."""
        return self.episodes - self.mid_turn


def _storage_detail(root: Path) -> str:
    """Where snapshots are written and how much room is left there, for a failed write."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return f"snapshots under {root}"
    return f"snapshots under {root}, {free} bytes free"


@attrs.define(eq=False, slots=True)
class CheckpointCoordinator:
    """Runs rollout checkpoints; one nursery per checkpoint, one cancel scope per control call.

    ``checkpoint()`` returns a ``CheckpointOutcome`` for success and for a retryable failure;
    it raises ``CheckpointInvariantError`` (abort, exit 3) and ``CheckpointsFailed`` once
    failures in a row exceed ``max_consecutive_failures`` (exit 4).

    The coordinator drives the protocol (the module's docstring); the parts it composes each
    own one concern: a ``PendingCheckpoint`` per checkpoint in flight (its staging directory
    and what it must give back), the ``CheckpointFailureManager`` (the consecutive-failure
    budget), the ``CheckpointStatsTracker`` (counts, metrics, log lines), and ``classify``
    (what a failure is).

    Invariant: at most one checkpoint runs at a time. Calls made while one runs (from several
    tasks of the trainer) wait their turn, first come first served, and each then takes its
    own checkpoint; a call cancelled while it waits took no checkpoint number.
    """

    gym: GymBackend
    ledger: RecoveryLedger
    gate: DispatchGate
    deadlines: DeadlineRegistry
    store: SnapshotStore
    config: RuntimeConfig
    metrics: Metrics
    run_id: str = "run"
    replacer: InstanceReplacer | None = None
    """Told about instances a checkpoint found dead; the checkpoint waits for replacements."""
    cut_files: Callable[[int], Mapping[str, bytes]] | None = None
    """The files identifying the run's row order and the trainer's dataset as far as the
    cut's ``next_row`` (``RowOrder.files``, ``DatasetIdentity.files``); called off the loop,
    their bytes published with the snapshot."""
    on_stage: Callable[[str, str], None] | None = None
    """Test hook, called as ``on_stage(checkpoint_id, point)`` at each point of ``HOOK_POINTS``
    (fault injection kills the process there)."""
    _seq: int = attrs.field(default=0, init=False)
    _topology: Topology | None = attrs.field(default=None, init=False)
    _generations: dict[str, int] = attrs.field(factory=dict, init=False)
    """The generation of each instance the running checkpoint talks to (``replacer``)."""
    _running: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    """Held by the one checkpoint that runs; a concurrent ``checkpoint()`` waits for it."""
    _failures: CheckpointFailureManager = attrs.field(init=False)
    _stats: CheckpointStatsTracker = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._failures = CheckpointFailureManager(self.config.max_consecutive_failures)
        self._stats = CheckpointStatsTracker(self.metrics)

    @property
    def consecutive_failures(self) -> int:
        return self._failures.consecutive

    def statistics(self) -> CoordinatorStatistics:
        return CoordinatorStatistics(
            checkpoints_ok=self._stats.ok_total,
            checkpoints_failed=self._stats.failed_total,
            consecutive_failures=self._failures.consecutive,
            last_checkpoint_seq=self._seq,
        )

    async def checkpoint(
        self,
        extra_files: Mapping[str, bytes] | None = None,
        trainer_files: Callable[[Path], None] | None = None,
    ) -> CheckpointOutcome:
        """Take one rollout checkpoint; ``extra_files`` (e.g. trainer state) join the snapshot.

        ``trainer_files(directory)`` (weights, optimizer shards) runs in a worker thread before
        admission closes, writing into the snapshot's ``trainer/`` directory; the files are
        published with the rollouts in one rename and digested in the commit marker. An error
        it raises propagates unchanged (a full disk is a failed, retryable checkpoint).

        A call made while another checkpoint runs waits for it to end, then runs its own.
        """
        async with self._running:  # one at a time: the gate, the seq and the stages are ours
            return await self._checkpoint(extra_files, trainer_files)

    async def _checkpoint(
        self,
        extra_files: Mapping[str, bytes] | None,
        trainer_files: Callable[[Path], None] | None,
    ) -> CheckpointOutcome:
        checkpoint_id = f"{self.run_id}-{self._seq + 1:04d}"
        started = trio.current_time()
        pending: PendingCheckpoint | None = None
        try:
            await self._wait_for_replacements()
            # unique across incarnations: the store keeps a durable high-water mark
            self._seq = await offload(self.store.reserve_checkpoint_seq)
            checkpoint_id = f"{self.run_id}-{self._seq:04d}"
            pending = self._pending(checkpoint_id)
            with collector_paused(self.config.pause_collector):
                async with pending:  # gives back what the checkpoint took, whatever happens
                    info, episodes, drained, mid_turn = await self._run(
                        pending, dict(extra_files or {}), trainer_files
                    )
        except TrainerFilesFailed as exc:  # the trainer's own code failed: its error
            self._stats.trainer_code_failed()
            raise exc.error from None
        except GymInUse:  # a newer trainer of this run fenced this one: it stops (exit 2)
            raise
        except Exception as exc:
            return self._failed(checkpoint_id, exc, pending.stage_s if pending else {}, started)
        self._failures.succeeded()
        self._stats.completed(pending.stage_s)
        self._stats.taken(episodes, mid_turn)
        size = await offload(lambda: tree_size(info.path))
        self._stats.record_last(started, size)
        return CheckpointOutcome(
            checkpoint_id, True, info, None, None, pending.stage_s, episodes, drained, mid_turn
        )

    def _failed(
        self, checkpoint_id: str, exc: Exception, stage_s: dict[str, float], started: float
    ) -> CheckpointOutcome:
        """A failed checkpoint: an outcome if it is retryable within the budget, else raise
        (called while ``exc`` is being handled)."""
        self._report_deaths(exc)
        kind = classify(exc)
        if kind is FailureKind.INVARIANT:
            self._stats.aborted(checkpoint_id, exc, stage_s, started)
            if isinstance(exc, CheckpointInvariantError):
                raise exc
            raise CheckpointInvariantError(f"checkpoint {checkpoint_id}: {exc}") from exc
        consecutive = self._failures.count()
        detail = str(exc)
        if kind is FailureKind.SNAPSHOT_IO:
            detail = f"{detail} ({_storage_detail(self.store.root)})"
        self._stats.failed(checkpoint_id, kind, detail, consecutive, stage_s, started)
        self._failures.check(kind, detail, exc)
        return CheckpointOutcome(checkpoint_id, False, None, kind, detail, stage_s)

    async def _wait_for_replacements(self) -> None:
        """Not against an instance that is coming back: wait (bounded) for replacements, and
        note the generation of each instance this checkpoint talks to."""
        self._generations = {}
        if self.replacer is not None:
            config = self.config
            await self.replacer.wait_up(
                trio.current_time() + config.replace_timeout_s + config.reply_grace_s
            )
            self._generations = {n: self.replacer.generation(n) for n in self.gym.instances}

    def _pending(self, checkpoint_id: str) -> PendingCheckpoint:
        return PendingCheckpoint(
            checkpoint_id,
            self.gym,
            self.store,
            self.gate,
            self.deadlines,
            self.config,
            on_point=self._hook,
            on_resume_failed=self._resume_failed,
        )

    def _hook(self, checkpoint_id: str, point: str) -> None:
        if self.on_stage is not None:
            self.on_stage(checkpoint_id, point)

    def _resume_failed(self, exc: Exception) -> None:
        """A resume failed: the snapshot stands, Gym's lease reopens Gym."""
        self._stats.resume_failed()
        self._report_deaths(exc)

    def _report_deaths(self, exc: BaseException) -> None:
        """Tell the replacer about every dead instance among ``exc``'s errors."""
        if self.replacer is None:
            return
        generations = self._generations
        for dead in dead_in(exc):
            if dead.instance in generations:
                self.replacer.report_dead(dead.instance, generations[dead.instance], str(dead))

    async def _topology_now(self) -> Topology:
        """The live topology, asked once and bounded like any control call (S5)."""
        if self._topology is None:
            self._topology = await bounded_call(
                "deployment", "topology", lambda _deadline: self.gym.topology(), self.config
            )
        return self._topology

    async def _run(
        self,
        pending: PendingCheckpoint,
        files: dict[str, bytes],
        trainer_files: Callable[[Path], None] | None,
    ) -> tuple[SnapshotInfo, int, int, int]:
        """The protocol's stages, in order (the module's docstring says why); ``pending``
        records what each takes, and gives it back when the caller's block ends."""
        checkpoint_id, config = pending.checkpoint_id, self.config
        stage, hook = pending.stage, pending.hook
        topology = await self._topology_now()
        names = topology.names

        if trainer_files is not None:
            with stage("trainer_files"):  # before Gym parks: weights may take a while
                await pending.write_trainer_files(trainer_files)
        with stage("close"):
            await pending.close_admission()
        await pending.pause_deadlines()

        with stage("retire"):  # dropped attempts, while Gym is idle (S4)
            await self._retire_dropped()

        hook("before_prepare")
        with stage("prepare"):
            await pending.prepare(names)

        hook("after_prepare")
        with stage("commit"):  # into the staging snapshot
            replies = await pending.commit(names)

        hook("after_commit")
        with stage("ownership"):  # S10, off the loop
            instances = check_replies(replies, topology, checkpoint_id)
            mid_turn = sum(r.mid_turn for r in replies.values())
            owned = await offload(functools.partial(ownership, replies, names))
            if config.pause_collector:  # its columns (1M entries each) live until resume
                promote_survivors()  # out of the young generations, which would walk them

        with stage("drain"):  # replies on the wire (S9)
            drain_deadline = trio.current_time() + config.drain_timeout_s
            drained = await self._drain(owned.on_wire, drain_deadline)

        with stage("snapshot"):  # a consistent cut under the hold, serialised off the loop
            taken, next_row, more = await self._cut(checkpoint_id, owned, names, drain_deadline)
            drained += more
            ledger_bytes, episodes = taken.ledger_bytes, taken.episodes
            if config.pause_collector:  # the cut's columns (1M entries each) live until resume
                promote_survivors()

        hook("before_publish")
        with stage("publish"):
            manifest = GymManifest(MANIFEST_VERSION, checkpoint_id, instances, episodes)
            files[LEDGER_FILE] = ledger_bytes
            if self.cut_files is not None:
                files.update(await offload(functools.partial(self.cut_files, next_row)))
            info = await pending.publish(manifest, files)

        hook("after_publish")
        hook("before_resume")
        with stage("resume"):  # a failed resume is reported: the snapshot is published
            await pending.resume()
            # Gym runs again; the checkpoint's per-episode records (commit replies,
            # ownership, the cut, the manifest: several objects per episode, ~0.1 s to free
            # at 200k) are let go in a worker thread, not on the loop when this frame ends.
            n_episodes = len(episodes)
            garbage: list[object] = [replies, owned, taken, manifest, episodes]
            del replies, owned, taken, manifest, episodes
            await offload(functools.partial(release_in_slices, garbage))
            if config.pause_collector:  # what survived the checkpoint is long-lived
                promote_survivors()
        return info, n_episodes, drained, mid_turn

    async def _cut(
        self, checkpoint_id: str, owned: Ownership, names: Sequence[str], drain_deadline: float
    ) -> tuple[Cut, int, int]:
        """The consistent cut under the barrier's hold, serialised off the loop; its cursor in
        the row order; how many more replies it drained first (episodes whose stream ended
        unread: ``cut``'s ``unaccounted``, bounded by the drain's deadline)."""
        ledger, drained = self.ledger, 0
        while True:
            async with ledger.barrier.hold(checkpoint_id):
                taken = await offload(functools.partial(cut, ledger, owned, names))
                next_row = ledger.next_row  # the cut's cursor in the row order
            if not taken.unaccounted:
                return taken, next_row, drained
            if trio.current_time() >= drain_deadline:
                raise DrainTimeout(
                    [r for ids in taken.unaccounted.values() for r in ids],
                    self.config.drain_timeout_s,
                )
            # a stream that ended while its replies were discarded, not yet seen by its
            # consumer: transient, it abandons them soon (bounded by the drain)
            drained += await self._drain(taken.unaccounted, drain_deadline)

    async def _retire_dropped(self) -> None:
        """Retire the queued dropped attempts (S4), forgetting exactly what Gym retired — on
        the instances that answered, even when another one failed (the failure still fails the
        checkpoint, retryable)."""
        queue = self.ledger.retire_queue()
        if not queue:
            return
        done: dict[str, list[str]] = {}
        calls = {}
        for instance, items in queue.items():
            live = [i.rollout_id for i in items if not i.restored]
            restored = [i.rollout_id for i in items if i.restored]
            got = done[instance] = []

            async def call(
                deadline: float,
                instance: str = instance,
                live: list[str] = live,
                restored: list[str] = restored,
                got: list[str] = got,
            ) -> None:
                if live:
                    reply = await self.gym.retire(instance, live, deadline)
                    got.extend((*reply.retired, *reply.unknown))
                if restored:
                    reply = await self.gym.retire_restored(instance, restored, deadline)
                    got.extend((*reply.retired, *reply.unknown))
                    self._stats.restore_retired(len(reply.retired))

            calls[instance] = call
        try:
            await fan_out("retire", calls, self.config)
        finally:
            retired = [rid for ids in done.values() for rid in ids]
            if retired:
                with trio.CancelScope(shield=True):
                    await self.ledger.barrier.mutate(lambda: self.ledger.forget_retired(retired))
                self._stats.retired_dropped(len(retired))

    async def _drain(self, pending: Mapping[str, frozenset[str]], deadline: float) -> int:
        """Wait until none of ``pending`` (per instance) is in flight there, by ``deadline``
        (S9). O(pending).

        First for the replies on the wire. Refusals count: an ``admission_closed`` sidecar
        reply stays on the wire until the consumer acknowledges it, like any reply. Then, if
        the cut finds episodes the ledger has in flight that Gym neither exported nor lists
        (a stream Gym ended whose end the consumer has not read yet), for those too: the
        consumer abandons them when it reads the end. A drain that times out fails the
        checkpoint as ``gym_unavailable`` (retried), never as an invariant violation.
        """
        timeout = max(0.0, deadline - trio.current_time())
        try:
            drained = await wait_drained(self.ledger, pending, timeout)
        except DrainTimeout as exc:
            self._stats.drain_pending(len(exc.pending))
            raise
        self._stats.drain_pending(drained)
        return drained
