"""The Gym host: one instance serving a user's ``Environment`` under the checkpoint protocol.

What the host owns, and the user's code never sees
--------------------------------------------------
- **Admission and refusals.** ``run`` admits rows while admission is open; while a checkpoint
  holds it closed (or under a ``refuse`` fault) each row is answered ``Refused`` as a sidecar
  row and the stream goes on.
- **Streams and acknowledgements** (``_host_streams``): batched replies, the on-the-wire list.
- **Parking at step boundaries.** Between two calls of the agent's ``step`` an episode passes a
  boundary; while prepared it parks there. ``prepare`` returns once nothing moves.
- **The lease.** A prepared instance reopens by itself after ``lease_s`` without a resume.
- **Fencing by attempt.** A slot's sessions belong to one attempt. A fresh attempt replaces them
  (the old one is stopped at its next boundary or context call, and its reply is dropped); an
  older attempt's run is ignored; a claim of a restored episode (attempt + 1,
  ``RunRow.restored_from``) takes the sessions over.
- **Retained sessions** (``retained = True`` participants) outlive their episode until the
  attempt is retired (a failed attempt's are freed when it fails: its retry starts afresh);
  with a ``work_dir`` they are journaled (``_host_journal``), and a host opened with
  ``recover=True`` (the replacement of a dead instance) continues them.
- **Failures of the user's code** (``step`` raising, a bad ``Done``, a value refused, ``open``
  or ``export`` raising) fail that episode (data) and are logged, rate-limited
  (``_host_log``); they never end the instance or the run.
- **Commit and export** (``_host_control``): every participant's session states of every
  parked and unclaimed episode and every retained session (plain data), the agent sessions with
  their step boundary, and the staged model calls, with their digests and capture keys.
- **Restore and claims.** ``restore`` verifies topology and digests, then installs the sessions;
  restored episodes wait unclaimed until attempt + 1 claims them on this instance.
- **Retire.** Stops attempts and frees their sessions (refused while a checkpoint is open).
- **Trainer terms** (``_host_tenancy``). The instance serves one training run (a lineage) at a
  time, and of it one trainer process (a term). ``attach`` by a newer term fences everything
  the older one started (``ControlPlane.fence``); every call that carries a ``trainer`` is
  checked against the holder on entry, and again after its one scheduling point, before it
  acts: a fenced term's, or another lineage's, is refused (``GymInUse``), changing nothing.

The host is the composition of small parts, each the only writer of its state: the
``EpisodeTable`` (active and unclaimed episodes, ``_host_episodes``), the ``SlotTable``
(ownership, fencing, retained sessions and their journal, ``_host_slots``), ``Parking``
(admission, parking, the generation, the lease, ``_host_parking``), the ``ReplyStreams``, the
``ControlPlane`` (the control calls over those parts), the ``Turns`` (an episode's turn loop,
``_host_turns``) and the ``HostViews``. This module composes them and is the data plane over
them: admission, claims, the episodes' tasks and their one exit.

Everything runs on anyio; deployments serve it under trio (embedded in the trainer's run, and in
a Ray actor a trio run hosted on the actor's asyncio loop), and user code is awaited through
``_user_calls``, so environment code may call trio, anyio or asyncio. Time:
``anyio.current_time()``; deadlines are enforced once a call runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import sniffio

from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    InstanceDirLocked,
    InstanceRecord,
    TrainerTerm,
    WorkDirLock,
)
from gymckpt.runtime.lowlevel import promote_survivors

from .._contract import (
    AttachReply,
    CommitReply,
    Completed,
    Failed,
    GymInstanceDead,
    InstanceInventory,
    InstanceTopology,
    PrepareReply,
    Refused,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
)
from ._control import ControlPlane
from ._environment import Environment, Roles
from ._episode import EpisodeFenced, EpisodeInfo
from ._episodes import (
    BOUNDARY,
    DONE,
    MOVING,
    Episode,
    EpisodeTable,
)
from ._journal import JOURNAL_FILE, JournalFailed
from ._log import FailureLog, episode_label
from ._parking import RESUME_CHUNK, Parking
from ._slots import SlotTable
from ._streams import HostReplyStream, ReplyStreams, RunStream
from ._tenancy import Tenancy
from ._turns import Turns, failure_class_of
from ._user_calls import UserCalls
from ._views import HostCounts, HostStatistics, HostViews, RetainedSession, SessionView

__all__ = [
    "PROMOTE_EVERY",
    "RESUME_CHUNK",
    "GymHost",
    "HostConfig",
    "HostStatistics",
    "SessionView",
]

PROMOTE_EVERY: Final = 4096
"""Episodes started between two promotions of what the process holds (``freeze_survivors``)."""


@attrs.frozen(kw_only=True)
class HostConfig:
    """Knobs of a host (picklable: the same config goes to every instance).

    ``strand_legacy_session`` is fault injection for tests: on a legacy-agent host, the first
    held session (by rollout ID) commits with no step boundary, as a legacy agent that cannot
    be captured leaves it (S10)."""

    lease_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))
    flush_interval_s: float = attrs.field(default=0.005, validator=attrs.validators.gt(0.0))
    max_batch: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    strand_legacy_session: bool = False
    boundary_marks: str = attrs.field(
        default="always", validator=attrs.validators.in_(("always", "on_demand"))
    )
    """When an environment that takes unaligned cuts marks its episodes' step boundaries (an
    export and serialisation of every session state at each one, what a cut takes an episode
    mid-turn at): ``"always"``, from the start, so every cut, the first included, takes every
    episode; ``"on_demand"``, only once a prepare that may cut came (an unaligned one, or an
    aligned one whose alignment timeout ran out): a run that never cuts pays nothing for marks,
    and that first cut retries (fails as infrastructure, spending nothing of the row) each
    episode inside a turn that started before, which has no mark to be taken at."""
    freeze_survivors: bool = True
    """Once every episode is parked, once a resume has started them all again, and every
    ``PROMOTE_EVERY`` episodes started, move what the process holds into the permanent
    generation (``runtime.promote_survivors``), and keep full collections out of that restart
    (``runtime.collector_paused``): the collector stops walking 200k episodes' objects inside
    and right after a checkpoint, and a full collection while Gym fills up walks the episodes
    started since the last promotion, not all of them (a second at 50k)."""


@final
@attrs.define(eq=False, slots=True, repr=False)
class GymHost:
    """One Gym instance hosting ``environment``. Serve it with ``async with GymHost(...)``: its
    task group runs the episodes, stream flushers and the lease timer; leaving it cancels them.
    A call after ``kill()`` raises ``GymInstanceDead``.

    ``recover``: continue the retained sessions journaled under ``work_dir/<name>/`` (what the
    replacement of a dead instance does); False starts the journal afresh (a new deployment).

    One host per instance directory: a host that journals locks ``work_dir/<name>/``
    (``runtime.WorkDirLock``) before it opens the journal, from entry until it exits or is
    killed, so a second host of the same name on the same ``work_dir`` — in this process or
    another — raises ``InstanceDirLocked`` on entry and never cuts the first one's journal.
    ``instance_lock``: that lock, already held by the caller (``gymckpt serve`` takes it before
    it opens anything and keeps it); the host then takes none and releases none.
    """

    name: str
    environment: Environment
    seed: int = 0
    work_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    config: HostConfig = attrs.field(factory=HostConfig)
    recover: bool = attrs.field(default=False, kw_only=True)
    instance_lock: WorkDirLock | None = attrs.field(default=None, kw_only=True)

    _tg: anyio.abc.TaskGroup | None = attrs.field(default=None, init=False)
    _spawn: Callable[..., Any] = attrs.field(default=None, init=False)
    """Starts an episode's task (see ``_trio_episodes``); until the episodes' nursery runs, it
    queues the task in ``_unspawned``."""
    _unspawned: list[tuple[Callable[..., Any], tuple[Any, ...]]] = attrs.field(
        factory=list, init=False
    )
    """Episode tasks asked for before the episodes' nursery ran: it starts them first."""
    _new_scope: Callable[[], Any] = attrs.field(default=None, init=False)
    _dead: bool = attrs.field(default=False, init=False)
    _own_lock: WorkDirLock | None = attrs.field(default=None, init=False)
    """The instance directory's lock this host took (released when it exits or dies)."""
    _started_since_promotion: int = attrs.field(default=0, init=False)
    _roles: Roles = attrs.field(init=False)
    _table: EpisodeTable = attrs.field(factory=EpisodeTable, init=False)
    _slots: SlotTable = attrs.field(init=False)
    _parking: Parking = attrs.field(init=False)
    _streams: ReplyStreams = attrs.field(init=False)
    _turns: Turns = attrs.field(init=False)
    _control: ControlPlane = attrs.field(init=False)
    _tenancy: Tenancy = attrs.field(init=False)
    _views: HostViews = attrs.field(init=False)
    count: HostCounts = attrs.field(factory=HostCounts, init=False)
    user_calls: UserCalls = attrs.field(factory=UserCalls, init=False)
    """Awaits each ``agent.step`` (and all it awaits): trio, anyio or asyncio code."""
    failure_log: FailureLog = attrs.field(init=False)
    """Every failure of the user's code here, a rate-limited WARNING (``_host_log``)."""

    def __attrs_post_init__(self) -> None:
        self.environment.check()
        config = self.config
        roles = self._roles = Roles.of(self.environment)
        self.failure_log = FailureLog(anyio.current_time)
        self._streams = ReplyStreams(config.flush_interval_s, config.max_batch)
        self._slots = SlotTable(self.name, roles.retained)
        self._parking = Parking(config.lease_s, config.freeze_survivors)
        if config.boundary_marks == "always" and self.environment.unaligned:
            self._parking.arm_marks()
        self._tenancy = Tenancy(self.name)
        self._turns = Turns(
            name=self.name,
            environment=self.environment,
            retained_names=roles.retained_names,
            slots=self._slots,
            parking=self._parking,
            count=self.count,
            user_calls=self.user_calls,
            failure_log=self.failure_log,
            sessions=roles.sessions,
            versions=roles.versions,
        )
        self._control = ControlPlane(
            host=self,
            name=self.name,
            seed=self.seed,
            work_dir=self.work_dir,
            environment=self.environment,
            roles=roles,
            participants=self.participants,
            strand_legacy_session=config.strand_legacy_session,
            freeze_survivors=config.freeze_survivors,
            table=self._table,
            slots=self._slots,
            parking=self._parking,
            streams=self._streams,
            count=self.count,
            failure_log=self.failure_log,
        )
        self._views = HostViews(
            name=self.name,
            participants=self.participants,
            roles=roles,
            table=self._table,
            slots=self._slots,
            parking=self._parking,
            streams=self._streams,
            count=self.count,
            user_counts=self._turns.user_counts,
            is_dead=lambda: self._dead,
        )

    @property
    def retained_names(self) -> frozenset[str]:
        """The names of the participants whose sessions outlive their episode."""
        return self._roles.retained_names

    @property
    def journal_path(self) -> Path | None:
        """The retained sessions' journal (None without a ``work_dir`` or retained
        participants)."""
        if self.work_dir is None or not self._roles.retained:
            return None
        return self.work_dir / self.name / JOURNAL_FILE

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> GymHost:
        if self._tg is not None:
            raise RuntimeError(f"instance {self.name} is already serving")
        path = self.journal_path
        if path is not None:
            if self.instance_lock is None:
                lock = WorkDirLock(path.parent, refusal=InstanceDirLocked)
                lock.acquire()  # before the journal is opened (and, without recover, cut)
                self._own_lock = lock
            try:
                self._slots.open_journal(
                    path, recover=self.recover, on_failure=lambda _: self.kill()
                )
            except BaseException:
                self._release_lock()
                raise
        self.user_calls.open()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._spawn, self._new_scope = self._queue_episode, anyio.CancelScope
        self._parking.open(tg.start_soon, lambda ep: self._spawn(self._episode_main, ep))
        # no await here: nothing can cancel an entry half done
        if sniffio.current_async_library() == "trio":
            tg.start_soon(self._trio_episodes)
        else:
            tg.start_soon(self._asyncio_episodes)
        return self

    def _queue_episode(self, fn: Callable[..., Any], *args: Any) -> None:
        """``_spawn`` until the episodes' nursery runs: the task waits in ``_unspawned``."""
        self._unspawned.append((fn, args))

    def _spawn_queued(self) -> None:
        queued, self._unspawned = self._unspawned, []
        for fn, args in queued:
            self._spawn(fn, *args)

    async def _trio_episodes(self) -> None:
        """Under trio, episodes run in a trio nursery of their own, a task of the host's task
        group (cancelled with it), with trio's cancel scopes: a task costs a quarter of what it
        costs through anyio (whose task handle adds a cancel scope and an event to each, and a
        frame to every step of it), and a host starts one per episode. Every episode runs
        there: one asked for before this task ran (a ``run`` right after entry, which trio's
        scheduler lets go first half the time) waits in ``_unspawned`` and starts here."""
        import trio

        async with trio.open_nursery() as nursery:
            self._spawn, self._new_scope = nursery.start_soon, trio.CancelScope
            self._spawn_queued()
            await trio.sleep_forever()

    async def _asyncio_episodes(self) -> None:
        """Under asyncio (a Ray actor), the same with an ``asyncio.TaskGroup``, a task of the
        host's task group (cancelled with it): 14 against 85 us per task here."""
        import asyncio

        async with asyncio.TaskGroup() as group:

            def spawn(fn: Callable[..., Any], *args: Any) -> None:
                group.create_task(fn(*args))

            self._spawn = spawn
            self._spawn_queued()
            await anyio.sleep_forever()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        self._shutdown()
        self._slots.close_journal()
        self._release_lock()
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled (for ``await task_group.start(host.serve)``)."""
        async with self:
            task_status.started()
            await anyio.sleep_forever()

    def kill(self) -> None:
        """The instance dies: episodes stop, streams end at once (reading one raises
        ``GymInstanceDead``), later calls fail. The journal stays as it was written."""
        if not self._dead:
            self._dead = True
            self._streams.dead_instance = self.name
            self._shutdown()
            self._slots.close_journal()
            self._release_lock()

    def _release_lock(self) -> None:
        """Release the instance directory's lock if this host took it (a replacement of the
        same name may then open the journal)."""
        lock, self._own_lock = self._own_lock, None
        if lock is not None:
            lock.release()

    def _shutdown(self) -> None:
        self._parking.close()  # the task group takes no new task from here (lease watchers)
        for ep in [*self._table.active.values(), *self._table.unclaimed.values()]:
            ep.stop()
            self.end_episode(ep, None)
        self._table.clear_unclaimed()
        self._streams.end_all()
        self._parking.release_all()

    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def participants(self) -> tuple[tuple[str, str], ...]:
        return self.environment.topology

    def _check_call(
        self, op: str, deadline_ts: float | None = None, trainer: TrainerTerm | None = None
    ) -> anyio.abc.TaskGroup:
        if self._dead:
            raise GymInstanceDead(self.name, op)
        if self._tg is None:
            raise RuntimeError(f"instance {self.name} is not serving: use 'async with'")
        self._tenancy.check(trainer, op)
        if deadline_ts is not None:
            now = anyio.current_time()
            if now >= deadline_ts:
                raise GymCallTimeout(
                    f"instance {self.name} {op}: deadline passed {now - deadline_ts:.3f}s "
                    "before the call ran",
                    self.name,
                    op,
                )
        return self._tg

    async def _enter(self, op: str, deadline_ts: float, trainer: TrainerTerm | None) -> None:
        """Check a control call on entry and again after one scheduling point (a call that
        waited behind others sees a death, a deadline or a fence that came meanwhile)."""
        self._check_call(op, deadline_ts, trainer)
        await anyio.lowlevel.checkpoint()
        self._check_call(op, deadline_ts, trainer)

    def drop_stream(self, pick: Callable[[int], int] = lambda n: 0) -> bool:
        """End one open reply stream now, as a ``drop`` fault would: undelivered replies are
        discarded, its rows run on. ``pick(n)`` chooses among the ``n`` open streams (oldest
        first). False if none is open. For fault injection between checkpoint stages."""
        open_streams = [st for st in self._streams.streams if not st.ended]
        if not open_streams:
            return False
        self._streams.end(open_streams[pick(len(open_streams))])
        return True

    # -- data plane --------------------------------------------------------------------------

    async def run(
        self,
        rows: Sequence[RunRow],
        *,
        refuse_all: bool = False,
        drop_after: int | None = None,
        trainer: TrainerTerm | None = None,
    ) -> HostReplyStream:
        """Admit ``rows`` and return their reply stream at once (see the module docstring)."""
        self._check_call("run", trainer=trainer)
        await anyio.lowlevel.checkpoint()
        tg = self._check_call("run", trainer=trainer)
        st = self._streams.open(len(rows), drop_after)
        turns = self._turns
        for row in rows:
            turns.learn_policy_version(row.policy_version)  # rows carry the trainer's version
        for row in rows:
            if refuse_all or not self._parking.admission_open:
                self.count.refused_rows += 1
                self._streams.push(st, Refused(row.rollout_id))
                self._streams.row_done(st)
                continue
            try:
                reply = self._admit(st, row)
            except JournalFailed as exc:  # the instance stopped (see _host_journal)
                reply = Failed(row.rollout_id, "infra", str(exc))
            if reply is not None:
                self._streams.push(st, reply)
                self._streams.row_done(st)
        self._streams.start(tg, st)
        return HostReplyStream(self._streams, st)

    def _info(self, row: RunRow) -> EpisodeInfo:
        return EpisodeInfo(
            row.rollout_id, row.row, row.slot, row.attempt, self.seed, self.name, row.task
        )

    def _admit(self, st: RunStream, row: RunRow) -> RunReply | None:
        rid = row.rollout_id
        if rid in self._table:
            self.count.failed += 1
            return Failed(rid, "data", f"{self.name}: rollout {rid} is already running here")
        if row.restored_from is not None:
            return self._claim(st, row)
        info = self._info(row)
        key = info.session_key
        slots = self._slots
        current = slots.owner(key)
        if current is not None and current[1] > row.attempt:
            self.count.stale_runs += 1
            self._streams.row_done(st)
            return None
        if current is not None:
            self._fence(current[0])
            slots.supersede(key)
        try:
            sessions = {p.name: p.open(info) for p in self._roles.sessions}
            slots.open(key, rid, row.attempt, sessions)
        except JournalFailed:
            raise  # the instance stopped: not the row's fault (run answers it)
        except Exception as exc:
            self.count.failed += 1
            if current is not None:  # the old attempt's sessions are gone either way
                slots.release(key, current[0])
            message = f"{episode_label(info)}: opening its sessions raised {exc!r}"
            self.failure_log.warn(message, exc)
            config = failure_class_of(exc)[0] == "config"  # wrong for every row: stops the run
            return Failed(rid, "config" if config else "data", message)
        self._start(Episode(info, sessions, MOVING, stream=st))
        self.count.episodes_started += 1
        return None

    def _claim(self, st: RunStream, row: RunRow) -> RunReply | None:
        rid, old_id = row.rollout_id, row.restored_from
        old = self._table.unclaimed.get(old_id) if old_id is not None else None
        problem = None
        if old is None:
            problem = (
                f"{self.name}: no unclaimed restored episode {old_id} here (a restored episode "
                "is claimed once, on its original replica)"
            )
        elif (row.row, row.slot) != (old.info.row, old.info.slot):
            problem = (
                f"{self.name}: claim {rid} is row {row.row} slot {row.slot}, but restored "
                f"episode {old_id} is row {old.info.row} slot {old.info.slot}"
            )
        elif row.attempt != old.info.attempt + 1:
            problem = (
                f"{self.name}: claim {rid} is attempt {row.attempt}, restored episode "
                f"{old_id} must be claimed by attempt {old.info.attempt + 1}"
            )
        if problem is not None or old is None:
            self.count.failed += 1
            return Failed(rid, "data", problem or "")
        self._table.take_unclaimed(old.rollout_id)
        self._slots.claim(old.key, rid, row.attempt)
        ep = Episode(
            self._info(row),
            old.sessions,
            MOVING,
            turn=old.turn,
            stream=st,
            staged=old.staged,
            inherited=len(old.staged),
            replay=old.replay,
        )
        self._start(ep)
        self.count.episodes_claimed += 1
        return None

    def _start(self, ep: Episode) -> None:
        assert self._tg is not None
        self._table.add(ep)
        self._parking.started()
        self._spawn(self._episode_main, ep)
        self._started_since_promotion += 1
        if self._started_since_promotion >= PROMOTE_EVERY and self.config.freeze_survivors:
            self._started_since_promotion = 0
            promote_survivors()  # episodes live for many turns: what is here now stays a while

    def _fence(self, owner: str) -> None:
        """A newer attempt takes the slot: stop ``owner`` where it waits; a moving one stops at
        its next boundary or context call."""
        if self._table.take_unclaimed(owner) is not None:
            self.count.fenced_episodes += 1
            return
        ep = self._table.active.get(owner)
        if ep is not None and ep.state == BOUNDARY:
            self.count.fenced_episodes += 1
            ep.stop()
            self.end_episode(ep, None)

    # -- episodes ------------------------------------------------------------------------------

    async def _episode_main(self, ep: Episode) -> None:
        """One incarnation of ``ep``'s task: from its current step boundary until it ends or
        parks (a resume starts the next one). Every cancel of ``ep.scope`` comes with
        ``end_episode``, so a scope cancelled before this task started is seen as ``DONE``."""
        scope = ep.scope = self._new_scope()
        with scope:
            if ep.state == DONE:
                return
            try:
                reply = await self._turns.play(ep)
            except EpisodeFenced:
                self.count.fenced_episodes += 1
                self.end_episode(ep, None)
                return
            if reply is not None:
                self.end_episode(ep, reply)

    def end_episode(self, ep: Episode, reply: RunReply | None) -> None:
        """The one exit of an active episode: bookkeeping, then its reply (if any)."""
        if ep.state == DONE:
            return
        was, ep.state = ep.state, DONE
        self._table.remove(ep)
        self._parking.ended(was)
        if reply is not None and self._slots.fenced(ep):
            self.count.fenced_replies += 1
            reply = None
        if isinstance(reply, Completed):
            self._slots.finish(ep)
            self.count.completed += 1
        elif reply is not None:
            self.count.failed += 1
            # A failed attempt's sessions are freed as a retire frees them: its retry (a new
            # attempt, on any instance) opens sessions of its own, so what this attempt mutated
            # in a retained session is never kept beside what the retry does (kept, it was
            # committed on this instance and on the retry's: the mutation twice). A later
            # retire of it is answered unknown.
            self._slots.release_quietly(ep.key, ep.rollout_id)
        st = ep.stream
        if st is not None:
            if reply is not None:
                self._streams.push(st, reply)
            self._streams.row_done(st)

    # -- control plane (``_host_control``) and views (``_host_views``) ---------------------------

    async def prepare(
        self,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
        *,
        trainer: TrainerTerm | None = None,
    ) -> PrepareReply:
        """Close admission and park every episode at its next step boundary; returns once
        nothing moves. Past ``deadline_ts``: ``GymCallTimeout`` (admission stays closed until a
        resume or the lease). Reopened meanwhile: ``GymControlError``. ``UNALIGNED``: nothing
        parks. ``alignment_timeout_s``: the episodes not parked by then are left to the
        commit's cut (``ControlPlane.prepare``)."""
        self._check_call("prepare", deadline_ts, trainer)
        return await self._control.prepare(checkpoint_id, deadline_ts, mode, alignment_timeout_s)

    async def commit(
        self,
        checkpoint_id: str,
        state_root: str,
        deadline_ts: float,
        *,
        trainer: TrainerTerm | None = None,
    ) -> CommitReply:
        """Write every participant's records under ``state_root/<instance>/<server_name>/`` and
        report them; needs a finished prepare of the same checkpoint (``ControlPlane.commit``:
        a commit that returns is restorable)."""
        await self._enter("commit", deadline_ts, trainer)
        return await self._control.commit(checkpoint_id, state_root)

    async def resume(
        self, checkpoint_id: str, deadline_ts: float, *, trainer: TrainerTerm | None = None
    ) -> None:
        """Reopen admission and unpark; a no-op when nothing is prepared."""
        await self._enter("resume", deadline_ts, trainer)
        self._control.resume(checkpoint_id)

    async def retire(
        self, rollout_ids: Sequence[str], deadline_ts: float, *, trainer: TrainerTerm | None = None
    ) -> RetireReply:
        """Stop these attempts and free their sessions; refused while a checkpoint is open."""
        await self._enter("retire", deadline_ts, trainer)
        return self._control.retire("retire", rollout_ids, restored_only=False)

    async def retire_restored(
        self, rollout_ids: Sequence[str], deadline_ts: float, *, trainer: TrainerTerm | None = None
    ) -> RetireReply:
        """Drop unclaimed restored episodes; any other ID is reported unknown."""
        await self._enter("retire_restored", deadline_ts, trainer)
        return self._control.retire("retire_restored", rollout_ids, restored_only=True)

    async def attach(self, trainer: TrainerTerm, deadline_ts: float) -> AttachReply:
        """``trainer`` takes the instance over (``_host_tenancy``): a term other than the
        holder's fences everything here first (``ControlPlane.fence``); the holder attaching
        again changes nothing. ``GymInUse`` (nothing changed) if another lineage, or a newer
        term of this one, holds the instance."""
        await self._enter("attach", deadline_ts, None)
        previous = self._tenancy.holder
        if not self._tenancy.attach(trainer):
            return AttachReply(self.name, took_over=False)
        episodes, sessions, aborted = self._control.fence()
        if previous is not None:
            self.count.fenced_terms += 1
        return AttachReply(self.name, True, previous, episodes, sessions, aborted)

    async def release(self, trainer: TrainerTerm, deadline_ts: float) -> None:
        """``trainer``'s run is done: another run may attach from now on (``Tenancy.release``);
        a term other than the holder's changes nothing."""
        await self._enter("release", deadline_ts, None)
        self._tenancy.release(trainer)

    def check_trainer(self, trainer: TrainerTerm | None, op: str) -> None:
        """``GymInUse`` unless ``trainer`` may act here now (``Tenancy.check``): for a
        transport's own steps of a call (acknowledgements) before they act."""
        self._tenancy.check(trainer, op)

    @property
    def trainer(self) -> TrainerTerm | None:
        """The trainer term this instance serves (None before any reached it)."""
        return self._tenancy.holder

    @property
    def released(self) -> bool:
        """The holder's run finished here (``release``): another run may attach."""
        return self._tenancy.released

    async def restore(
        self,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
        *,
        trainer: TrainerTerm | None = None,
    ) -> RestoreReply:
        """Verify, then install committed sessions; restored episodes wait unclaimed.

        Any difference (topology, digests, an episode the records do not hold, a session state
        the participant cannot restore) raises ``TopologyMismatch`` listing all of them, with
        nothing changed. The instance must be idle and not prepared (``GymControlError``).
        """
        await self._enter("restore", deadline_ts, trainer)
        return self._control.restore(state_root, record, episodes)

    def topology(self) -> InstanceTopology:
        return self._views.topology()

    def session_states(self, participant: str) -> dict[str, SessionView]:
        """Every slot's live session of ``participant`` by session key, sorted: those of
        running, parked and unclaimed episodes, and retained ones of ended episodes."""
        return self._views.session_states(participant)

    def retained_sessions(self) -> dict[str, dict[str, RetainedSession]]:
        """Every retained participant's sessions as plain data, by participant, then by slot
        (``HostViews.retained_sessions``)."""
        return self._views.retained_sessions()

    def inventory(self) -> InstanceInventory:
        return self._views.inventory()

    def statistics(self) -> HostStatistics:
        return self._views.statistics()

    # -- a consumer in another process (the Ray actor's outbox) ----------------------------------
    # It reads a stream's batches itself (``HostReplyStream.run_stream``) and acknowledges
    # them when its own consumer asks for the next batch; these are its four calls.

    def ack_replies(self, st: RunStream, rollout_ids: Sequence[str]) -> None:
        """The consumer received the replies of ``rollout_ids`` sent on ``st``: they leave the
        wire (an ID on the wire by another stream stays)."""
        self._streams.ack(st, rollout_ids)

    def discard_replies(self, st: RunStream, replies: Sequence[RunReply]) -> None:
        """``replies`` taken from ``st`` will never be delivered: they leave the wire and count
        as discarded."""
        self._streams.discard(st, replies)

    def forget_stream(self, st: RunStream) -> None:
        """``st`` has ended and its consumer read it to the end: the host stops listing it."""
        self._streams.forget(st)

    def close_consumer(self, st: RunStream) -> None:
        """The consumer of ``st`` went away: no more replies go out, the batches sent and not
        read are discarded, the rows run on."""
        self._streams.end(st, hard=True)

    def __repr__(self) -> str:
        state = "dead" if self._dead else "prepared" if self._parking.prepared else "open"
        return (
            f"<GymHost {self.name} {state} episodes={len(self._table.active)} "
            f"moving={self._parking.moving} unclaimed={len(self._table.unclaimed)} "
            f"kept={self._slots.n_kept} on_wire={len(self._streams.on_wire)}>"
        )
