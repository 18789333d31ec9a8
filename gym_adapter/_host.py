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

from gymckpt.runtime import GymCallTimeout, collector_paused, promote_survivors

from ._contract import (
    Completed,
    Failed,
    GymInstanceDead,
    Refused,
    RunReply,
    RunRow,
)
from ._environment import Environment
from ._episode import EpisodeFenced, EpisodeInfo, is_retained, participant_kinds, to_plain
from ._host_control import HostControl
from ._host_episodes import BOUNDARY, DONE, MOVING, Episode, StepContext, completed_reply
from ._host_journal import HostJournaling, JournalFailed, SessionJournal
from ._host_log import FailureLog, episode_label
from ._host_streams import HostReplyStream, ReplyStreams, RunStream
from ._host_views import HostStatistics, HostViews, SessionView
from ._user_calls import UserCalls

__all__ = [
    "PROMOTE_EVERY",
    "RESUME_CHUNK",
    "GymHost",
    "HostConfig",
    "HostStatistics",
    "SessionView",
]

RESUME_CHUNK: Final = 128
PROMOTE_EVERY: Final = 4096
"""Episodes started between two promotions of what the process holds (``freeze_survivors``)."""
"""Parked episodes woken per scheduler batch on a resume."""


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
    freeze_survivors: bool = True
    """Once every episode is parked, once a resume has started them all again, and every
    ``PROMOTE_EVERY`` episodes started, move what the process holds into the permanent
    generation (``runtime.promote_survivors``), and keep full collections out of that restart
    (``runtime.collector_paused``): the collector stops walking 200k episodes' objects inside
    and right after a checkpoint, and a full collection while Gym fills up walks the episodes
    started since the last promotion, not all of them (a second at 50k)."""


@attrs.define(eq=False, slots=True)
class _Counters:
    episodes_started: int = 0
    episodes_claimed: int = 0
    completed: int = 0
    failed: int = 0
    refused_rows: int = 0
    retired: int = 0
    restored: int = 0
    turns: int = 0
    model_calls: int = 0
    model_replays: int = 0
    fenced_episodes: int = 0
    fenced_replies: int = 0
    stale_runs: int = 0
    commits: int = 0
    lease_reopened: int = 0


@final
@attrs.define(eq=False, slots=True, repr=False)
class GymHost(HostControl, HostViews, HostJournaling):
    """One Gym instance hosting ``environment``. Serve it with ``async with GymHost(...)``: its
    task group runs the episodes, stream flushers and the lease timer; leaving it cancels them.
    A call after ``kill()`` raises ``GymInstanceDead``.

    ``recover``: continue the retained sessions journaled under ``work_dir/<name>/`` (what the
    replacement of a dead instance does); False starts the journal afresh (a new deployment).
    """

    name: str
    environment: Environment
    seed: int = 0
    work_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    config: HostConfig = attrs.field(factory=HostConfig)
    recover: bool = attrs.field(default=False, kw_only=True)

    _tg: anyio.abc.TaskGroup | None = attrs.field(default=None, init=False)
    _spawn: Callable[..., Any] = attrs.field(default=None, init=False)
    """Starts an episode's task (see ``_trio_episodes``)."""
    _new_scope: Callable[[], Any] = attrs.field(default=None, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _dead: bool = attrs.field(default=False, init=False)
    _admission_open: bool = attrs.field(default=True, init=False)
    _prepared: bool = attrs.field(default=False, init=False)
    _checkpoint_id: str | None = attrs.field(default=None, init=False)
    _gen: int = attrs.field(default=0, init=False)
    _prepared_evt: anyio.Event | None = attrs.field(default=None, init=False)
    _parked: list[Episode] = attrs.field(factory=list, init=False)
    """Episodes parked at a step boundary, as data: their task ended when they parked (a
    suspended task is a dozen collector-tracked objects, and CPython puts every resumed
    coroutine back in the youngest generation uncounted, so 200k tasks parking at once made the
    next young collection walk millions of objects inside the checkpoint). A resume starts a
    task for each again, ``RESUME_CHUNK`` per scheduler batch, so restarting 200k never stalls
    the loop at once."""
    _all_parked: anyio.Event | None = attrs.field(default=None, init=False)
    _lease_scope: anyio.CancelScope | None = attrs.field(default=None, init=False)
    _episodes: dict[str, Episode] = attrs.field(factory=dict, init=False)
    _unclaimed: dict[str, Episode] = attrs.field(factory=dict, init=False)
    _owners: dict[str, tuple[str, int]] = attrs.field(factory=dict, init=False)
    """Session key → (rollout ID, attempt) of the attempt that owns the slot's sessions."""
    _kept: dict[str, dict[str, Any]] = attrs.field(factory=dict, init=False)
    """Session key → retained session states of a slot whose episode has ended (its owner is
    in ``_finished``); freed by retire, replaced by a newer attempt."""
    _finished: dict[str, str] = attrs.field(factory=dict, init=False)
    _n_moving: int = attrs.field(default=0, init=False)
    _started_since_promotion: int = attrs.field(default=0, init=False)
    _streams: ReplyStreams = attrs.field(init=False)
    _journal: SessionJournal | None = attrs.field(default=None, init=False)
    _retained: tuple[Any, ...] = attrs.field(init=False)
    retained_names: frozenset[str] = attrs.field(init=False)
    """The names of the participants whose sessions outlive their episode."""
    _user_counts: dict[str, int] = attrs.field(factory=dict, init=False)
    user_calls: UserCalls = attrs.field(factory=UserCalls, init=False)
    """Awaits each ``agent.step`` (and all it awaits): trio, anyio or asyncio code."""
    count: _Counters = attrs.field(factory=_Counters, init=False)
    failure_log: FailureLog = attrs.field(init=False)
    """Every failure of the user's code here, a rate-limited WARNING (``_host_log``)."""

    def __attrs_post_init__(self) -> None:
        self.environment.check()
        self._streams = ReplyStreams(self.config.flush_interval_s, self.config.max_batch)
        self._retained = tuple(p for p in self.environment.participants if is_retained(p))
        self.retained_names = frozenset(p.name for p in self._retained)
        self.failure_log = FailureLog(anyio.current_time)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> GymHost:
        if self._tg is not None:
            raise RuntimeError(f"instance {self.name} is already serving")
        self._open_journal()
        self.user_calls.open()
        self._closing = False
        self._prepared_evt = anyio.Event()
        self._all_parked = anyio.Event()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._spawn, self._new_scope = tg.start_soon, anyio.CancelScope
        # no await here: nothing can cancel an entry half done
        if sniffio.current_async_library() == "trio":
            tg.start_soon(self._trio_episodes)
        else:
            tg.start_soon(self._asyncio_episodes)
        return self

    async def _trio_episodes(self) -> None:
        """Under trio, episodes run in a trio nursery of their own, a task of the host's task
        group (cancelled with it), with trio's cancel scopes: a task costs a quarter of what it
        costs through anyio (whose task handle adds a cancel scope and an event to each), and a
        host starts one per episode. Until this task runs, episodes start in the task group."""
        import trio

        async with trio.open_nursery() as nursery:
            self._spawn, self._new_scope = nursery.start_soon, trio.CancelScope
            await trio.sleep_forever()

    async def _asyncio_episodes(self) -> None:
        """Under asyncio (a Ray actor), the same with an ``asyncio.TaskGroup``, a task of the
        host's task group (cancelled with it): 14 against 85 us per task here."""
        import asyncio

        async with asyncio.TaskGroup() as group:

            def spawn(fn: Callable[..., Any], *args: Any) -> None:
                group.create_task(fn(*args))

            self._spawn = spawn
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
        if self._journal is not None:
            self._journal.close()
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
            if self._journal is not None:
                self._journal.close()

    def _shutdown(self) -> None:
        self._closing = True  # the task group takes no new task from here (lease watchers)
        self._admission_open = False
        self._cancel_lease()
        for ep in [*self._episodes.values(), *self._unclaimed.values()]:
            ep.stop()
            self.end_episode(ep, None)
        self._unclaimed.clear()
        self._unpark_all()
        self._streams.end_all()
        if self._all_parked is not None:
            self._all_parked.set()

    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def participants(self) -> tuple[tuple[str, str], ...]:
        return self.environment.topology

    @property
    def _legacy(self) -> bool:
        return participant_kinds()[self.environment.agent.kind] == "legacy_agent"

    @property
    def _owner_name(self) -> str:
        """The participant that exports parked episodes: the first environment, else the
        agent (a legacy agent's sessions own their episodes)."""
        if not self._legacy:
            kinds = participant_kinds()
            for p in self.environment.participants:
                if kinds[p.kind] == "environment":
                    return p.name
        return self.environment.agent.name

    def _check_call(self, op: str, deadline_ts: float | None = None) -> anyio.abc.TaskGroup:
        if self._dead:
            raise GymInstanceDead(self.name, op)
        if self._tg is None:
            raise RuntimeError(f"instance {self.name} is not serving: use 'async with'")
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
        self, rows: Sequence[RunRow], *, refuse_all: bool = False, drop_after: int | None = None
    ) -> HostReplyStream:
        """Admit ``rows`` and return their reply stream at once (see the module docstring)."""
        self._check_call("run")
        await anyio.lowlevel.checkpoint()
        tg = self._check_call("run")
        st = self._streams.open(len(rows), drop_after)
        for row in rows:
            if refuse_all or not self._admission_open:
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
        return EpisodeInfo(row.rollout_id, row.row, row.slot, row.attempt, self.seed, self.name)

    def _admit(self, st: RunStream, row: RunRow) -> RunReply | None:
        rid = row.rollout_id
        if rid in self._episodes or rid in self._unclaimed:
            self.count.failed += 1
            return Failed(rid, "data", f"{self.name}: rollout {rid} is already running here")
        if row.restored_from is not None:
            return self._claim(st, row)
        info = self._info(row)
        key = info.session_key
        current = self._owners.get(key)
        if current is not None and current[1] > row.attempt:
            self.count.stale_runs += 1
            self._streams.row_done(st)
            return None
        if current is not None:
            self._fence(current[0])
            self._finished.pop(current[0], None)
            self._kept.pop(key, None)
        try:
            sessions = {p.name: p.open(info) for p in self._session_participants()}
            if self._journal is not None:
                self._journal.opened(key, rid, row.attempt, {
                    p.name: to_plain(p.export(sessions[p.name])) for p in self._retained
                })
        except JournalFailed:
            raise  # the instance stopped: not the row's fault (run answers it)
        except Exception as exc:
            self.count.failed += 1
            if current is not None:  # the old attempt's sessions are gone either way
                del self._owners[key]
                if self._journal is not None:
                    self._journal.freed(key)
            message = f"{episode_label(info)}: opening its sessions raised {exc!r}"
            self.failure_log.warn(message, exc)
            return Failed(rid, "data", message)
        self._owners[key] = (rid, row.attempt)
        self._start(Episode(info, sessions, MOVING, stream=st))
        self.count.episodes_started += 1
        return None

    def _session_participants(self) -> tuple[Any, ...]:
        return (self.environment.agent, *self.environment.participants)

    def _claim(self, st: RunStream, row: RunRow) -> RunReply | None:
        rid, old_id = row.rollout_id, row.restored_from
        old = self._unclaimed.get(old_id) if old_id is not None else None
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
        del self._unclaimed[old.rollout_id]
        old.state = DONE
        self._owners[old.key] = (rid, row.attempt)
        if self._journal is not None:
            self._journal.claimed(old.key, rid, row.attempt)
        ep = Episode(
            self._info(row), old.sessions, MOVING, turn=old.turn,
            stream=st, staged=old.staged, replay=old.replay, restored=True,
        )
        self._start(ep)
        self.count.episodes_claimed += 1
        return None

    def _start(self, ep: Episode) -> None:
        assert self._tg is not None
        self._episodes[ep.rollout_id] = ep
        self._n_moving += 1
        self._spawn(self._episode_main, ep)
        self._started_since_promotion += 1
        if self._started_since_promotion >= PROMOTE_EVERY and self.config.freeze_survivors:
            self._started_since_promotion = 0
            promote_survivors()  # episodes live for many turns: what is here now stays a while

    def _fence(self, owner: str) -> None:
        """A newer attempt takes the slot: stop ``owner`` where it waits; a moving one stops at
        its next boundary or context call."""
        old = self._unclaimed.pop(owner, None)
        if old is not None:
            self.count.fenced_episodes += 1
            old.state = DONE
            return
        ep = self._episodes.get(owner)
        if ep is not None and ep.state == BOUNDARY:
            self.count.fenced_episodes += 1
            ep.stop()
            self.end_episode(ep, None)

    def fenced(self, ep: Episode) -> bool:
        owner = self._owners.get(ep.key)
        return owner is None or owner[0] != ep.rollout_id

    def add_count(self, name: str, n: int) -> int:
        value = self._user_counts[name] = self._user_counts.get(name, 0) + n
        return value

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
                reply = await self._play(ep)
            except EpisodeFenced:
                self.count.fenced_episodes += 1
                self.end_episode(ep, None)
                return
            if reply is not None:
                self.end_episode(ep, reply)

    async def _play(self, ep: Episode) -> RunReply | None:
        """Turns until the episode ends (its reply) or parks (None)."""
        rid = ep.rollout_id
        if ep.replay is not None:  # a restored continuation, checked once, before its first turn
            replay, ep.replay = ep.replay, None
            if replay != ep.capture_keys:
                return self._user_failed(ep, Failed(
                    rid, "data",
                    f"{self.name}: restored episode of {rid} has capture keys "
                    f"{list(replay)} in the manifest, {list(ep.capture_keys)} staged by "
                    "the model proxy",
                ))
        agent = self.environment.agent
        while True:
            if not await self._step_boundary(ep):
                return None
            ctx = StepContext(self, ep)
            try:
                done = await self.user_calls.wait(agent.step(ctx, ep.sessions[agent.name]))
            except EpisodeFenced:
                raise
            except Exception as exc:
                failed = f"{episode_label(ep.info)} turn {ep.turn}: step raised {exc!r}"
                self.failure_log.warn(failed, exc)
                problem = self._journal_turn(ep, ctx)
                if problem is not None:
                    self.failure_log.warn(problem)
                return Failed(rid, "data", problem or failed)
            if self.fenced(ep):
                raise EpisodeFenced(rid)
            problem = self._journal_turn(ep, ctx)
            if problem is not None:
                return self._user_failed(ep, Failed(rid, "data", problem))
            ep.turn += 1
            self.count.turns += 1
            if done is not None:
                reply = completed_reply(self.name, ep, done, self.environment.max_payload_bytes)
                if isinstance(reply, Failed):
                    self._user_failed(ep, reply)
                return reply

    def _user_failed(self, ep: Episode, reply: Failed) -> Failed:
        """Log ``reply`` (a failure of ``ep`` the user's code caused, no traceback to give)."""
        message = reply.message
        if ep.rollout_id not in message:
            message = f"{episode_label(ep.info)}: {message}"
        self.failure_log.warn(message)
        return reply

    async def _step_boundary(self, ep: Episode) -> bool:
        """Pass step boundary ``ep.turn`` (True), or park there while a checkpoint is prepared
        (or, held, until one is): False, and the task ends, leaving ``ep`` in ``_parked``."""
        if ep.state == BOUNDARY:  # restarted by a resume
            if self._prepared:  # prepared again before this task ran: it stays parked
                self._parked.append(ep)
                return False
            ep.state = MOVING
            self._n_moving += 1
            if self.fenced(ep):
                raise EpisodeFenced(ep.rollout_id)
            return True
        if self.fenced(ep):
            raise EpisodeFenced(ep.rollout_id)
        await anyio.lowlevel.checkpoint()
        if not (self._prepared or ep.hold):
            return True
        ep.state = BOUNDARY
        self._n_moving -= 1
        self._check_parked()
        if ep.hold and not self._prepared:
            try:
                while ep.hold and not self._prepared:
                    assert self._prepared_evt is not None
                    await self._prepared_evt.wait()
            except BaseException:
                if ep.state == BOUNDARY:  # not ended meanwhile: count it moving again
                    ep.state = MOVING
                    self._n_moving += 1
                raise
        ep.hold = False
        self._parked.append(ep)
        return False

    def _unpark_all(self) -> None:
        """Start every parked episode's task again: ``RESUME_CHUNK`` per scheduler batch, in a
        task of the instance (nothing to start when the instance is shutting down: it ended
        them)."""
        parked, self._parked = self._parked, []
        if parked and not self._closing and self._tg is not None:
            self._tg.start_soon(self._restart, parked)

    async def _restart(self, parked: list[Episode]) -> None:
        tg = self._tg
        with collector_paused(self.config.freeze_survivors):
            for start in range(0, len(parked), RESUME_CHUNK):
                if self._closing or tg is None:
                    return
                if self._prepared:  # prepared again: the rest stay parked for the next resume
                    self._parked.extend(ep for ep in parked[start:] if ep.state == BOUNDARY)
                    return
                for ep in parked[start:start + RESUME_CHUNK]:
                    if ep.state == BOUNDARY:
                        self._spawn(self._episode_main, ep)
                await anyio.lowlevel.checkpoint()  # this chunk runs before the next starts
            if self.config.freeze_survivors:
                await anyio.lowlevel.checkpoint()  # the last chunk's first steps ran
                promote_survivors()

    def _check_parked(self) -> None:
        if self._prepared and self._n_moving == 0 and self._all_parked is not None:
            self._all_parked.set()

    def end_episode(self, ep: Episode, reply: RunReply | None) -> None:
        """The one exit of an active episode: bookkeeping, then its reply (if any)."""
        if ep.state == DONE:
            return
        was, ep.state = ep.state, DONE
        if self._episodes.get(ep.rollout_id) is ep:
            del self._episodes[ep.rollout_id]
        if was == MOVING:
            self._n_moving -= 1
            self._check_parked()
        if reply is not None and self.fenced(ep):
            self.count.fenced_replies += 1
            reply = None
        if isinstance(reply, Completed):
            self._finished[ep.rollout_id] = ep.key
            if self._retained:
                self._kept[ep.key] = {p.name: ep.sessions[p.name] for p in self._retained}
            self.count.completed += 1
        elif reply is not None:
            self.count.failed += 1
            self._free_failed(ep)
        st = ep.stream
        if st is not None:
            if reply is not None:
                self._streams.push(st, reply)
            self._streams.row_done(st)

    def _free_failed(self, ep: Episode) -> None:
        """A failed attempt's sessions are freed as a retire frees them: its retry (a new
        attempt, on any instance) opens sessions of its own, so what this attempt mutated in a
        retained session is never kept beside what the retry does (kept, it was committed on
        this instance and on the retry's: the mutation twice). A later retire of it is
        answered unknown."""
        key = ep.key
        if self._owners.get(key, ("",))[0] != ep.rollout_id:
            return
        del self._owners[key]
        self._kept.pop(key, None)
        self._journal_freed(key)  # never raises: a journal that fails stops the instance

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

    _ack = ack_replies
    _discard = discard_replies
    _forget = forget_stream
    _consumer_closed = close_consumer

    def __repr__(self) -> str:
        state = "dead" if self._dead else "prepared" if self._prepared else "open"
        return (
            f"<GymHost {self.name} {state} episodes={len(self._episodes)} "
            f"moving={self._n_moving} unclaimed={len(self._unclaimed)} "
            f"kept={len(self._kept)} on_wire={len(self._streams.on_wire)}>"
        )
