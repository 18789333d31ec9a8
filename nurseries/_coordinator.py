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
3. **Prepare** every instance: Gym closes its own admission and parks each episode at its next
   step boundary.
4. **Commit** every instance: participants write their records under the staging snapshot; the
   replies list participants and digests, exported episodes, and replies on the wire.
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
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from gymckpt.gym_adapter import CommitReply, GymBackend, Topology
from gymckpt.runtime import (
    GYM_STATE_DIR,
    LEDGER_FILE,
    MANIFEST_VERSION,
    TRAINER_FILES_DIR,
    CheckpointInvariantError,
    CheckpointsFailed,
    DeadlineRegistry,
    DispatchGate,
    DrainTimeout,
    EpisodeRecord,
    FailureKind,
    GymManifest,
    InstanceRecord,
    Metrics,
    ParticipantRecord,
    RecoveryLedger,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    StrandedSessionError,
    collector_paused,
    failure_kind,
    promote_survivors,
    sample_ids,
    state_dir_problem,
    tree_size,
    wait_drained,
)

from ._calls import bounded_call, classify, fan_out
from ._offload import offload
from ._replace import InstanceReplacer, dead_in

__all__ = [
    "HOOK_POINTS",
    "PAUSE_HOLDER",
    "STAGES",
    "CheckpointCoordinator",
    "CheckpointOutcome",
    "CoordinatorStatistics",
]

logger = logging.getLogger("gymckpt")

PAUSE_HOLDER = "gym-checkpoint"
STAGES = ("trainer_files", "close", "retire", "prepare", "commit", "ownership", "drain",
          "snapshot", "publish", "resume")
HOOK_POINTS = ("before_prepare", "after_prepare", "after_commit", "before_publish",
               "after_publish", "before_resume")


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
    drained: int = 0


def _storage_detail(root: Path) -> str:
    """Where snapshots are written and how much room is left there, for a failed write."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return f"snapshots under {root}"
    return f"snapshots under {root}, {free} bytes free"


class _TrainerFilesFailed(Exception):
    """Carries an error the trainer's ``trainer_files`` callback raised (not a storage error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _write_trainer_files(write: Callable[[Path], None], target: Path) -> None:
    """Run the trainer's writer into a fresh ``target``; its own errors are carried out as is,
    a full disk or I/O error stays an ``OSError`` (a retryable checkpoint failure)."""
    target.mkdir()
    try:
        write(target)
    except OSError as exc:
        if failure_kind(exc) is FailureKind.SNAPSHOT_IO:
            raise
        raise _TrainerFilesFailed(exc) from exc
    except Exception as exc:
        raise _TrainerFilesFailed(exc) from exc


@attrs.frozen
class _Ownership:
    episodes: tuple[EpisodeRecord, ...]
    by_instance: Mapping[str, frozenset[str]]
    on_wire: Mapping[str, frozenset[str]]
    """Per instance: replies on the wire for episodes it did not export."""


@attrs.frozen
class _Cut:
    ledger_bytes: bytes
    episodes: tuple[EpisodeRecord, ...]
    unaccounted: Mapping[str, frozenset[str]]
    """Per instance: in flight in the ledger, neither exported nor on the wire."""


def _ownership(replies: Mapping[str, CommitReply], order: Sequence[str]) -> _Ownership:
    """The ownership rule (S10), a pure function of the commit replies (runs off the loop)."""
    episodes: list[EpisodeRecord] = []
    by_instance: dict[str, frozenset[str]] = {}
    on_wire: dict[str, frozenset[str]] = {}
    for name in order:
        reply = replies[name]
        owned: dict[str, EpisodeRecord] = {}
        for ep in reply.exported:
            if ep.rollout_id in owned:
                raise CheckpointInvariantError(
                    f"instance {name}: episode {ep.rollout_id} exported twice"
                )
            owned[ep.rollout_id] = EpisodeRecord(ep.rollout_id, ep.owner, name, ep.capture_keys)
        stranded: list[str] = []
        for sess in reply.sessions:
            if sess.rollout_id in owned:
                continue
            if sess.kind == "legacy_agent" and sess.step_boundary is not None:
                owned[sess.rollout_id] = EpisodeRecord(
                    sess.rollout_id, sess.participant, name, sess.capture_keys
                )
            elif sess.rollout_id not in reply.on_wire:
                stranded.append(sess.rollout_id)
        if stranded:
            raise StrandedSessionError(name, stranded)
        episodes.extend(owned.values())
        by_instance[name] = frozenset(owned)
        on_wire[name] = frozenset(reply.on_wire) - by_instance[name]
    return _Ownership(tuple(episodes), by_instance, on_wire)


def _check_replies(
    replies: Mapping[str, CommitReply], topology: Topology, checkpoint_id: str
) -> tuple[InstanceRecord, ...]:
    """Validate commit replies against the live topology; build the manifest's instances."""
    records: list[InstanceRecord] = []
    problems: list[str] = []
    for inst in topology.instances:
        reply = replies[inst.name]
        if reply.instance != inst.name or reply.checkpoint_id != checkpoint_id:
            problems.append(
                f"instance {inst.name}: reply is for {reply.instance}/{reply.checkpoint_id}, "
                f"expected {inst.name}/{checkpoint_id}"
            )
            continue
        got = tuple((p.server_name, p.kind) for p in reply.participants)
        if got != inst.participants:
            problems.append(
                f"instance {inst.name}: committed participants {list(got)}, "
                f"topology {list(inst.participants)}"
            )
            continue
        parts = []
        for p in reply.participants:
            if not p.records_digest.startswith("sha256:"):
                problems.append(
                    f"instance {inst.name}: participant {p.server_name} digest "
                    f"{p.records_digest!r} is not a sha256 digest"
                )
            outside = state_dir_problem(p.state_dir)
            if outside is not None:
                problems.append(
                    f"instance {inst.name}: participant {p.server_name} state_dir {outside}"
                )
                continue
            rel = Path(p.state_dir)
            parts.append(
                ParticipantRecord(
                    p.server_name, p.kind, f"{GYM_STATE_DIR}/{rel.as_posix()}", p.records_digest
                )
            )
        records.append(InstanceRecord(inst.name, tuple(parts)))
    if problems:
        raise CheckpointInvariantError("commit reply mismatch: " + "; ".join(problems))
    return tuple(records)


@attrs.define(eq=False, slots=True)
class CheckpointCoordinator:
    """Runs rollout checkpoints; one nursery per checkpoint, one cancel scope per control call.

    ``checkpoint()`` returns a ``CheckpointOutcome`` for success and for a ``gym_unavailable``
    failure; it raises ``CheckpointInvariantError`` (abort, exit 3) and ``CheckpointsFailed``
    once failures in a row exceed ``max_consecutive_failures`` (exit 4).

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
    on_stage: Callable[[str, str], None] | None = None
    """Test hook, called as ``on_stage(checkpoint_id, point)`` at each point of ``HOOK_POINTS``
    (fault injection kills the process there)."""
    _seq: int = attrs.field(default=0, init=False)
    _consecutive_failures: int = attrs.field(default=0, init=False)
    _topology: Topology | None = attrs.field(default=None, init=False)
    _generations: dict[str, int] = attrs.field(factory=dict, init=False)
    """The generation of each instance the running checkpoint talks to (``replacer``)."""
    _running: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    """Held by the one checkpoint that runs; a concurrent ``checkpoint()`` waits for it."""
    ok_total: int = attrs.field(default=0, init=False)
    failed_total: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        for name in ("completed_total", "failed_total", "restored_total"):
            self.metrics.inc(f"checkpoint/{name}", 0)  # present from the start, like Flink's

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    def statistics(self) -> CoordinatorStatistics:
        return CoordinatorStatistics(
            checkpoints_ok=self.ok_total,
            checkpoints_failed=self.failed_total,
            consecutive_failures=self._consecutive_failures,
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
        stage_s: dict[str, float] = {}
        started = trio.current_time()
        self._generations = {}
        try:
            if self.replacer is not None:  # not against an instance that is coming back
                config = self.config
                await self.replacer.wait_up(
                    trio.current_time() + config.replace_timeout_s + config.reply_grace_s
                )
                self._generations = {n: self.replacer.generation(n) for n in self.gym.instances}
            # unique across incarnations: the store keeps a durable high-water mark
            self._seq = await offload(self.store.reserve_checkpoint_seq)
            checkpoint_id = f"{self.run_id}-{self._seq:04d}"
            files = dict(extra_files or {})
            with collector_paused(self.config.pause_collector):
                info, episodes, drained = await self._run(
                    checkpoint_id, files, stage_s, trainer_files
                )
        except _TrainerFilesFailed as exc:  # the trainer's own code failed: its error
            self.failed_total += 1
            self.metrics.inc("checkpoint/failed_total")
            raise exc.error from None
        except Exception as exc:
            self._report_deaths(exc)
            kind = classify(exc)
            self.failed_total += 1
            self.metrics.inc("checkpoint/failed_total")
            self._record_stages(stage_s)
            if kind is FailureKind.INVARIANT:
                self.metrics.inc("checkpoint/invariant_failures_total")
                logger.error("checkpoint %s aborted the run: %s", checkpoint_id, exc)
                self._record_last(started, None)
                if isinstance(exc, CheckpointInvariantError):
                    raise
                raise CheckpointInvariantError(f"checkpoint {checkpoint_id}: {exc}") from exc
            self._consecutive_failures += 1
            self.metrics.inc(f"checkpoint/{kind}_total")
            self.metrics.set("checkpoint/consecutive_failures", self._consecutive_failures)
            detail = str(exc)
            if kind is FailureKind.SNAPSHOT_IO:
                detail = f"{detail} ({_storage_detail(self.store.root)})"
            logger.warning(
                "checkpoint %s failed (%s, %d in a row, retried at the next checkpoint): %s",
                checkpoint_id, kind, self._consecutive_failures, detail,
            )
            self._record_last(started, None)
            if self._consecutive_failures > self.config.max_consecutive_failures:
                logger.error("checkpoints failed %d times in a row: the run stops",
                             self._consecutive_failures)
                raise CheckpointsFailed(
                    f"{self._consecutive_failures} checkpoints failed in a row "
                    f"(max_consecutive_failures={self.config.max_consecutive_failures}); "
                    f"last ({kind}): {detail}"
                ) from exc
            return CheckpointOutcome(checkpoint_id, False, None, kind, detail, stage_s)
        self._consecutive_failures = 0
        self.ok_total += 1
        self.metrics.inc("checkpoint/ok_total")
        self.metrics.inc("checkpoint/completed_total")
        self.metrics.mark("checkpoint/since_last_completed_s")
        self.metrics.set("checkpoint/consecutive_failures", 0)
        self._record_stages(stage_s)
        size = await offload(lambda: tree_size(info.path))
        self._record_last(started, size)
        return CheckpointOutcome(checkpoint_id, True, info, None, None, stage_s, episodes, drained)

    def _report_deaths(self, exc: BaseException) -> None:
        """Tell the replacer about every dead instance among ``exc``'s errors."""
        if self.replacer is None:
            return
        generations = self._generations
        for dead in dead_in(exc):
            if dead.instance in generations:
                self.replacer.report_dead(dead.instance, generations[dead.instance], str(dead))

    def _record_last(self, started: float, size: int | None) -> None:
        """Flink's last-checkpoint gauges: duration of the last checkpoint (completed or not),
        size in bytes of the last completed one."""
        self.metrics.set("checkpoint/last_duration_s", trio.current_time() - started)
        if size is not None:
            self.metrics.set("checkpoint/last_size_bytes", size)

    def _record_stages(self, stage_s: Mapping[str, float]) -> None:
        for name, seconds in stage_s.items():
            self.metrics.set(f"checkpoint/stage_{name}_s", seconds)

    async def _topology_now(self) -> Topology:
        """The live topology, asked once and bounded like any control call (S5)."""
        if self._topology is None:
            self._topology = await bounded_call(
                "deployment", "topology", lambda _deadline: self.gym.topology(), self.config
            )
        return self._topology

    async def _run(
        self,
        checkpoint_id: str,
        files: dict[str, bytes],
        stage_s: dict[str, float],
        trainer_files: Callable[[Path], None] | None = None,
    ) -> tuple[SnapshotInfo, int, int]:
        gym, ledger, config = self.gym, self.ledger, self.config
        topology = await self._topology_now()
        names = topology.names

        @contextmanager
        def stage(name: str) -> Iterator[None]:
            t = trio.current_time()
            try:
                yield
            finally:  # failed stages are timed too
                stage_s[name] = trio.current_time() - t

        paused = parked = False
        staging: Path | None = None

        def hook(point: str) -> None:
            if self.on_stage is not None:
                self.on_stage(checkpoint_id, point)

        try:
            if trainer_files is not None:
                with stage("trainer_files"):  # before Gym parks: weights may take a while
                    staging = staged = await offload(lambda: self.store.begin(checkpoint_id))
                    target = staged / TRAINER_FILES_DIR
                    await offload(lambda: _write_trainer_files(trainer_files, target))
                    await offload(lambda: self.store.seal_trainer_files(staged))
            with stage("close"):
                await self.gate.close(by=checkpoint_id)
        except BaseException:
            if staging is not None:
                s = staging
                with trio.CancelScope(shield=True):
                    await offload(lambda: self.store.abort(s))
            raise
        try:
            self.deadlines.pause(PAUSE_HOLDER)
            paused = True

            with stage("retire"):  # dropped attempts, while Gym is idle (S4)
                await self._retire_dropped()

            hook("before_prepare")
            with stage("prepare"):
                parked = True  # from the first prepare call on, Gym may be parked
                await fan_out(
                    "prepare",
                    {n: functools.partial(gym.prepare, n, checkpoint_id) for n in names},
                    config,
                )

            hook("after_prepare")
            with stage("commit"):  # into the staging snapshot
                # absolute: Gym's working directory may differ from ours
                if staging is None:
                    staging = await offload(lambda: self.store.begin(checkpoint_id))
                gym_dir = staging / GYM_STATE_DIR
                state_root = str(await offload(gym_dir.resolve))
                replies = await fan_out(
                    "commit",
                    {n: functools.partial(gym.commit, n, checkpoint_id, state_root)
                     for n in names},
                    config,
                )

            hook("after_commit")
            with stage("ownership"):  # S10, off the loop
                instances = _check_replies(replies, topology, checkpoint_id)
                owned = await offload(functools.partial(_ownership, replies, names))

            with stage("drain"):  # replies on the wire (S9)
                drain_deadline = trio.current_time() + config.drain_timeout_s
                drained = await self._drain(owned.on_wire, drain_deadline)

            with stage("snapshot"):  # a consistent cut under the hold, serialised off the loop
                while True:
                    async with ledger.barrier.hold(checkpoint_id):
                        cut = await offload(functools.partial(self._cut, owned, names))
                    if not cut.unaccounted:
                        break
                    if trio.current_time() >= drain_deadline:
                        raise DrainTimeout(
                            [r for ids in cut.unaccounted.values() for r in ids],
                            config.drain_timeout_s,
                        )
                    # a stream that ended while its replies were discarded, not yet seen by
                    # its consumer: transient, it abandons them soon (bounded by the drain)
                    drained += await self._drain(cut.unaccounted, drain_deadline)
                ledger_bytes, episodes = cut.ledger_bytes, cut.episodes

            hook("before_publish")
            with stage("publish"):
                manifest = GymManifest(MANIFEST_VERSION, checkpoint_id, instances, episodes)
                files[LEDGER_FILE] = ledger_bytes
                ready = staging
                info = await offload(functools.partial(self.store.publish, ready, manifest, files))
                staging = None

            hook("after_publish")
            hook("before_resume")
            with stage("resume"):
                try:
                    await fan_out(
                        "resume",
                        {n: functools.partial(gym.resume, n, checkpoint_id) for n in names},
                        config,
                    )
                except Exception as exc:  # the snapshot is published; Gym's lease reopens Gym
                    self.metrics.inc("checkpoint/resume_failures_total")
                    self._report_deaths(exc)
                # Only now: a resume cut short by the caller's cancellation leaves ``parked``
                # set, so the shielded clean-up below resumes Gym instead of leaving it parked
                # until its lease (found by the cancellation tests).
                parked = False
                # Gym runs again; the checkpoint's per-episode records (commit replies,
                # ownership, the cut, the manifest: several objects per episode, ~0.1 s to free
                # at 200k) are let go in a worker thread, not on the loop when this frame ends.
                n_episodes = len(episodes)
                garbage: list[object] = [replies, owned, cut, manifest, episodes]
                del replies, owned, cut, manifest, episodes
                await offload(garbage.clear)
                if config.pause_collector:  # what survived the checkpoint is long-lived
                    promote_survivors()
            return info, n_episodes, drained
        finally:
            with trio.CancelScope(shield=True):
                if parked:
                    await self._resume_best_effort(checkpoint_id, names)
                if staging is not None:
                    s = staging
                    await offload(lambda: self.store.abort(s))
                if paused:
                    self.deadlines.release(PAUSE_HOLDER)
                await self.gate.reopen()

    async def _resume_best_effort(self, checkpoint_id: str, names: Sequence[str]) -> None:
        """After a failure with Gym possibly parked: try to resume; the lease covers a loss."""
        try:
            await fan_out(
                "resume",
                {n: functools.partial(self.gym.resume, n, checkpoint_id) for n in names},
                self.config,
            )
        except Exception as exc:
            self.metrics.inc("checkpoint/resume_failures_total")
            self._report_deaths(exc)

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

            async def call(deadline: float, instance: str = instance, live: list[str] = live,
                           restored: list[str] = restored, got: list[str] = got) -> None:
                if live:
                    reply = await self.gym.retire(instance, live, deadline)
                    got.extend((*reply.retired, *reply.unknown))
                if restored:
                    reply = await self.gym.retire_restored(instance, restored, deadline)
                    got.extend((*reply.retired, *reply.unknown))
                    self.metrics.inc("checkpoint/restore_retire_total", len(reply.retired))

            calls[instance] = call
        try:
            await fan_out("retire", calls, self.config)
        finally:
            retired = [rid for ids in done.values() for rid in ids]
            if retired:
                with trio.CancelScope(shield=True):
                    await self.ledger.barrier.mutate(lambda: self.ledger.forget_retired(retired))
                self.metrics.inc("checkpoint/retired_dropped_total", len(retired))

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
            self.metrics.set("checkpoint/drain_pending", len(exc.pending))
            raise
        self.metrics.set("checkpoint/drain_pending", drained)
        return drained

    def _cut(self, owned: _Ownership, names: Sequence[str]) -> _Cut:
        """Inventory check and ledger copy; runs in a thread while the barrier is held.

        Per instance, what the ledger holds there must equal what Gym exported, except:

        * an exported episode the ledger dropped after the retire stage (an early stream end
          during the checkpoint: S4's "a drop recorded meanwhile waits for the next
          checkpoint") is in the retire queue. It is not recorded in the manifest (not ours to
          restore); the ledger copy carries the retire queue, so a restore retires it before
          dispatching its replacement;
        * an episode the ledger has in flight that Gym neither exported nor listed on the wire
          is *unaccounted*: its stream ended and the consumer has not read the end yet. Nothing
          is copied; the caller waits for them and cuts again.

        An exported episode the ledger neither holds nor dropped is an ownership violation.
        """
        ledger = self.ledger
        queued = ledger.retire_queue()
        dropped: set[str] = set()
        unaccounted: dict[str, frozenset[str]] = {}
        for name in names:
            held = ledger.held_by(name)
            exported = owned.by_instance.get(name, frozenset())
            gone = exported & {item.rollout_id for item in queued.get(name, ())}
            dropped |= gone
            missing = held - exported
            extra = exported - held - gone
            if extra:
                raise CheckpointInvariantError(
                    f"instance {name}: Gym exported {sample_ids(extra)} episodes the ledger "
                    "does not hold"
                )
            if missing:
                unaccounted[name] = frozenset(missing)
        if unaccounted:
            return _Cut(b"", (), unaccounted)
        episodes = tuple(e for e in owned.episodes if e.rollout_id not in dropped)
        return _Cut(ledger.snapshot_bytes(), episodes, {})
