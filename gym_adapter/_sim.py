"""The simulated Gym: one instance (replica) and its participants, written against anyio only.

Why it looks like this
----------------------
The runtime's checkpoint protocol is only as good as the Gym it is tested against, so this
simulation keeps every property the protocol relies on, and nothing else:

- **Real state, real files.** The environment participant ("calendar") holds a calendar per
  episode session; ``calendar_create_event`` appends an event carrying a sentinel. ``commit``
  writes each participant's records to real files (atomic, fsynced) and reports their digest, so
  a restore can be refused for a tampered file or a changed topology.
- **Step boundaries.** An episode runs turn after turn; between turns it passes a step boundary
  (boundary ``b`` = ``b`` turns done, including the last one, before the reply). ``prepare``
  closes admission and parks every episode at its next boundary, so an exported episode is
  always between two turns and a restored continuation resumes exactly there: a mutation is
  never half done and never done twice.
- **Plans from identity, not attempt.** An episode's plan (turns, durations, mutations, model
  payloads, reward) is drawn from ``random.Random`` of (seed, row, slot) only, so attempt + 1
  continuing a restored episode follows the same plan as the attempt that was exported.
- **Fencing (DESIGN §2b).** A calendar session has one owning attempt. A fresh attempt of a slot
  replaces the session; from then on the older attempt's mutations are rejected and its reply is
  dropped (counted, never applied, never emitted). A claim of a restored episode (attempt + 1,
  ``RunRow.restored_from``) takes the session over instead of replacing it.
- **Replies on the wire.** Replies are batched per stream (one batch per flush interval, or as
  soon as ``max_batch`` are pending). A final reply is *on the wire* from the moment it is
  produced until the consumer asks for the batch after the one that carried it; ``commit`` lists
  those, and the runtime drains them (S9). Replies that can no longer be delivered (the stream
  was dropped, closed or died) are discarded and are not on the wire.
- **One code path on two loops.** Only anyio is used (events, cancel scopes, memory object
  streams, ``anyio.current_time``), so the same instance runs under trio in-process, under
  trio's ``MockClock`` in tests, and under asyncio inside a Ray actor. Every wait has a cancel
  path; leaving the instance's context cancels every episode and ends every stream.

- **Durable environment state.** With a ``work_dir``, every change of the calendar's sessions
  (a session opened or taken over, an event, a session freed) is appended to
  ``work_dir/<instance>/calendar-sessions.log`` as it happens, and a restore rewrites the file.
  A ``SimInstance`` of the same name opened on the same ``work_dir`` replays it (``recover``,
  the default; a new deployment passes ``recover=False``): the replacement of a dead instance
  continues its environment state the way a real environment service outlives one of its
  servers (``EmbeddedGym.replace``, a fresh Ray actor). Each change
  is one ``write`` (no buffering in the process, no fsync): a process that dies loses nothing,
  a machine that crashes loses what the OS had not written back yet. Several machines need a
  shared filesystem for it (a fresh actor on another node reads the same file).

Time and determinism: all waits are ``anyio.sleep``/``move_on_*`` on the running loop's clock,
and every batch is sorted by rollout ID, so the same calls with the same seed produce the same
replies at the same (virtual) times.
"""

from __future__ import annotations

import functools
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar, final

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs
import orjson
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from gymckpt.runtime import (
    EpisodeRecord,
    GymCallTimeout,
    GymControlError,
    GymInstanceDead,
    InstanceRecord,
    TopologyMismatch,
    records_digest,
    write_atomic,
)

from ._contract import (
    AgentSession,
    CommitReply,
    Completed,
    ExportedEpisode,
    Failed,
    InstanceInventory,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    Refused,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
)
from ._faults import FaultSpec
from ._host_records import RECORDS_FILE, read_verified

T = TypeVar("T")

__all__ = [
    "AGENT_KINDS",
    "ENV_LOG",
    "RECORDS_FILE",
    "CalendarEvent",
    "CalendarSession",
    "CoordinationError",
    "EpisodePlan",
    "SimConfig",
    "SimInstance",
    "SimReplyStream",
    "SimStatistics",
    "capture_key",
    "plan_episode",
    "sentinel",
    "session_key",
]

AGENT_KINDS: Final = ("simple_agent", "legacy_agent")
ENV_LOG: Final = "calendar-sessions.log"
"""The calendar's durable session log, under ``work_dir/<instance>/``."""
AGENT, CALENDAR, MODEL_PROXY = "agent", "calendar", "model_proxy"

Batch = tuple[RunReply, ...]


def session_key(row: int, slot: int) -> str:
    """The environment session of a generation slot: ``"{row}-{slot}"``."""
    return f"{row}-{slot}"


def capture_key(row: int, slot: int, turn: int) -> str:
    """The key a turn's model call is staged under by the model proxy."""
    return f"{row}-{slot}/t{turn}"


def sentinel(row: int, slot: int, turn: int) -> str:
    """The sentinel carried by the calendar event a turn creates."""
    return f"sentinel:{row}-{slot}:t{turn}"


# -- configuration and plans ---------------------------------------------------------------


def _range_of(kind: type) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        ok = (
            isinstance(value, tuple)
            and len(value) == 2
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] <= value[1]
        )
        if not ok:
            raise ValueError(f"{attr.name} must be a (low, high) pair with 0 <= low <= high")

    return check


_probability = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0))


@attrs.frozen(kw_only=True)
class SimConfig:
    """Knobs of the simulated Gym (picklable; the same config goes to every instance).

    ``turns`` and ``turn_s`` are inclusive (low, high) ranges; ``mutation_p`` is the chance a
    turn calls ``calendar_create_event``. While prepared, the instance reopens by itself after
    ``lease_s`` without a resume (the lease is renewed by prepare and commit). Test hooks:
    ``hold_after_first_mutation`` holds the episode that performs the instance's first
    ``calendar_create_event`` at its next step boundary until a prepare parks it;
    ``strand_legacy_session`` makes the first parked legacy session (by rollout ID) commit without
    a step boundary record and unexported (S10).
    """

    turns: tuple[int, int] = attrs.field(default=(2, 5), validator=_range_of(int))
    turn_s: tuple[float, float] = attrs.field(default=(0.01, 0.05), validator=_range_of(float))
    mutation_p: float = attrs.field(default=0.5, validator=_probability)
    lease_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))
    flush_interval_s: float = attrs.field(default=0.005, validator=attrs.validators.gt(0.0))
    max_batch: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    hold_after_first_mutation: bool = False
    strand_legacy_session: bool = False

    def __attrs_post_init__(self) -> None:
        if self.turns[0] < 1:
            raise ValueError(f"turns must be at least 1, got {self.turns!r}")


@attrs.frozen
class EpisodePlan:
    """What an episode of (seed, row, slot) does, turn by turn."""

    turns: int
    durations: tuple[float, ...]
    mutates: tuple[bool, ...]
    payloads: tuple[str, ...]
    reward: float


def plan_episode(seed: int, row: int, slot: int, config: SimConfig) -> EpisodePlan:
    """The plan of slot ``slot`` of row ``row``: a function of (seed, row, slot) only."""
    rng = random.Random(f"gymckpt-sim:{seed}:{row}:{slot}")
    turns = rng.randint(*config.turns)
    lo, span, p = config.turn_s[0], config.turn_s[1] - config.turn_s[0], config.mutation_p
    draw, bits = rng.random, rng.getrandbits
    durations: list[float] = []
    mutates: list[bool] = []
    payloads: list[str] = []
    for t in range(turns):
        durations.append(round(lo + span * draw(), 6))
        mutates.append(draw() < p)
        payloads.append(f"{row}-{slot}/t{t}:{bits(32):08x}")
    reward = round(draw(), 6)
    return EpisodePlan(turns, tuple(durations), tuple(mutates), tuple(payloads), reward)


# -- errors and records --------------------------------------------------------------------


class CoordinationError(RuntimeError):
    """Gym's own coordination error. It carries its live context, so it cannot be pickled:
    a backend must replace it with ``runtime.GymCheckpointUnavailable`` before it crosses."""

    def __init__(self, instance: str, operation: str, message: str) -> None:
        super().__init__(f"{instance} {operation}: {message}")
        self.instance = instance
        self.operation = operation
        self.context = lambda: (instance, operation)  # a closure: pickle refuses it


@attrs.frozen
class CalendarEvent:
    turn: int
    title: str
    sentinel: str


@attrs.frozen
class CalendarSession:
    """An episode session of the environment: its calendar and the attempt that owns it."""

    key: str
    rollout_id: str
    attempt: int
    events: tuple[CalendarEvent, ...]

    @property
    def sentinels(self) -> tuple[str, ...]:
        return tuple(e.sentinel for e in self.events)


@attrs.frozen
class SimStatistics:
    """Counts of one instance (a snapshot; for checks and tests)."""

    instance: str
    dead: bool
    admission_open: bool
    prepared: bool
    running: int
    parked: int
    unclaimed: int
    on_wire: int
    streams: int
    episodes_started: int
    episodes_claimed: int
    completed: int
    failed: int
    refused_rows: int
    retired: int
    restored: int
    mutations: int
    model_calls: int
    fenced_mutations: int
    fenced_replies: int
    fenced_episodes: int
    stale_runs: int
    batches: int
    discarded_replies: int
    commits: int
    lease_reopened: int


@attrs.define(eq=False, slots=True)
class _Counters:
    episodes_started: int = 0
    episodes_claimed: int = 0
    completed: int = 0
    failed: int = 0
    refused_rows: int = 0
    retired: int = 0
    restored: int = 0
    mutations: int = 0
    model_calls: int = 0
    fenced_mutations: int = 0
    fenced_replies: int = 0
    fenced_episodes: int = 0
    stale_runs: int = 0
    batches: int = 0
    discarded_replies: int = 0
    commits: int = 0
    lease_reopened: int = 0


@attrs.define(eq=False, slots=True)
class _Session:
    key: str
    rollout_id: str
    attempt: int
    events: list[CalendarEvent] = attrs.field(factory=list)

    def frozen(self) -> CalendarSession:
        return CalendarSession(self.key, self.rollout_id, self.attempt, tuple(self.events))


_MOVING, _BOUNDARY, _UNCLAIMED, _DONE = "moving", "boundary", "unclaimed", "done"


@attrs.define(eq=False, slots=True)
class _Episode:
    rollout_id: str
    row: int
    slot: int
    attempt: int
    plan: EpisodePlan
    scope: anyio.CancelScope
    state: str
    boundary: int = 0
    stream: _RunStream | None = None
    hold: bool = False
    # Set on a restored continuation: the capture keys the manifest recorded (None = none given).
    replay: tuple[str, ...] | None = None
    restored: bool = False

    @property
    def key(self) -> str:
        return session_key(self.row, self.slot)


@attrs.define(eq=False, slots=True)
class _RunStream:
    send: MemoryObjectSendStream[Batch]
    receive: MemoryObjectReceiveStream[Batch]
    rows_left: int
    drop_after: int | None
    wake: anyio.Event
    scope: anyio.CancelScope
    pending: list[RunReply] = attrs.field(factory=list)
    sent: int = 0
    ended: bool = False


class _EpisodeStopped(Exception):
    """The episode was ended from inside (fenced); unwind its task."""


# -- the reply stream ------------------------------------------------------------------------


@final
class SimReplyStream:
    """The consumer's side of one ``run``: batches of replies (``ReplyStream``).

    ``__anext__`` first acknowledges the batch it returned last time (its replies leave the
    instance's on-the-wire list), then waits for the next batch; the stream ends when every row
    replied, or early (drop fault); one of an instance that died raises ``GymInstanceDead``.
    ``aclose`` acknowledges the last batch,
    discards the undelivered ones and leaves the rows running in Gym. Works under trio and
    asyncio alike.
    """

    __slots__ = ("_closed", "_delivered", "_inst", "_st")

    def __init__(self, inst: SimInstance, st: _RunStream) -> None:
        self._inst = inst
        self._st = st
        self._delivered: tuple[str, ...] = ()
        self._closed = False

    def __aiter__(self) -> SimReplyStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        self._inst._ack(self._st, self._delivered)
        self._delivered = ()
        try:
            batch = await self._st.receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._st.receive.close()
            self._inst._forget(self._st)
            if self._inst.dead:
                raise GymInstanceDead(self._inst.name, "run") from None
            raise StopAsyncIteration from None
        self._delivered = tuple(r.rollout_id for r in batch)
        return batch

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._inst._ack(self._st, self._delivered)
            self._delivered = ()
            self._inst._consumer_closed(self._st)
        await anyio.lowlevel.checkpoint()

    def __del__(self) -> None:
        # A consumer that drops the stream without closing it: close our end quietly (the
        # instance discards what it can no longer deliver, and ends the rest at shutdown).
        self._st.receive.close()

    def __repr__(self) -> str:
        st = self._st
        return (
            f"<SimReplyStream of {self._inst.name} rows_left={st.rows_left} "
            f"pending={len(st.pending)} ended={st.ended}>"
        )


# -- the instance ---------------------------------------------------------------------------


@final
@attrs.define(eq=False, slots=True, repr=False)
class SimInstance:
    """One simulated Gym instance: an agent server, the ``calendar`` environment server and a
    model proxy, in that order.

    Serve it with ``async with SimInstance(...) as inst:`` (or ``await tg.start(inst.serve)``):
    the instance's task group runs its episodes, stream flushers and lease timer, and leaving it
    cancels them all. Control calls take an absolute ``deadline_ts`` on the running loop's clock
    (``anyio.current_time()``) and enforce it once they run: past it, ``GymCallTimeout`` naming the
    instance. A call after ``kill()`` raises ``GymInstanceDead``.
    """

    name: str
    agent_kind: str = attrs.field(default="simple_agent")
    seed: int = 0
    work_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    config: SimConfig = attrs.field(factory=SimConfig)
    recover: bool = attrs.field(default=True, kw_only=True)
    """Continue the environment state logged under ``work_dir/<name>/`` — what the
    replacement of a dead instance does by opening on the same ``work_dir``; False (a new
    deployment: ``EmbeddedGym.open``) starts a fresh log there."""

    _tg: anyio.abc.TaskGroup | None = attrs.field(default=None, init=False)
    _log_fd: int | None = attrs.field(default=None, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _dead: bool = attrs.field(default=False, init=False)
    _admission_open: bool = attrs.field(default=True, init=False)
    _prepared: bool = attrs.field(default=False, init=False)
    _checkpoint_id: str | None = attrs.field(default=None, init=False)
    _gen: int = attrs.field(default=0, init=False)
    _prepared_evt: anyio.Event | None = attrs.field(default=None, init=False)
    _resumed: anyio.Event | None = attrs.field(default=None, init=False)
    _all_parked: anyio.Event | None = attrs.field(default=None, init=False)
    _lease_scope: anyio.CancelScope | None = attrs.field(default=None, init=False)
    _episodes: dict[str, _Episode] = attrs.field(factory=dict, init=False)
    _unclaimed: dict[str, _Episode] = attrs.field(factory=dict, init=False)
    _n_moving: int = attrs.field(default=0, init=False)
    _sessions: dict[str, _Session] = attrs.field(factory=dict, init=False)
    _staged: dict[str, list[tuple[str, str]]] = attrs.field(factory=dict, init=False)
    _finished: dict[str, str] = attrs.field(factory=dict, init=False)
    _on_wire: dict[str, _RunStream] = attrs.field(factory=dict, init=False)
    _streams: dict[_RunStream, None] = attrs.field(factory=dict, init=False)
    _first_mutation_seen: bool = attrs.field(default=False, init=False)
    _count: _Counters = attrs.field(factory=_Counters, init=False)

    def __attrs_post_init__(self) -> None:
        if self.agent_kind not in AGENT_KINDS:
            raise ValueError(
                f"agent_kind must be one of {', '.join(AGENT_KINDS)}, got {self.agent_kind!r}"
            )

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> SimInstance:
        if self._tg is not None:
            raise RuntimeError(f"instance {self.name} is already serving")
        self._open_log()
        self._closing = False
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._prepared_evt = anyio.Event()
        self._resumed = anyio.Event()
        self._all_parked = anyio.Event()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        self._shutdown()
        self._close_log()
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled (for ``await task_group.start(inst.serve)``)."""
        async with self:
            task_status.started()
            await anyio.sleep_forever()

    def kill(self) -> None:
        """The instance dies: every episode stops, every stream ends at once (undelivered
        batches are lost), and every later call raises ``GymInstanceDead``."""
        if self._dead:
            return
        self._dead = True
        self._shutdown()
        self._close_log()

    # -- the durable environment log ---------------------------------------------------------

    @property
    def env_log(self) -> Path | None:
        """The calendar's session log (None without a ``work_dir``)."""
        return None if self.work_dir is None else self.work_dir / self.name / ENV_LOG

    def _open_log(self) -> None:
        path = self.env_log
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (self.recover and path.exists()):
            self._log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            return
        data = path.read_bytes()
        self._sessions = replay_env_log(data)
        # each session is retirable by the attempt that owns it (freeing it, as on the dead
        # instance); the replacement runs no episode yet
        self._finished = {s.rollout_id: key for key, s in self._sessions.items()}
        self._first_mutation_seen = any(s.events for s in self._sessions.values())
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if data and not data.endswith(b"\n"):  # a torn last append: cut it, then go on
            os.ftruncate(fd, data.rfind(b"\n") + 1)
        self._log_fd = fd  # appends go on where the dead one stopped

    def _rewrite_log(self) -> None:
        """Write the current sessions as the whole log, atomically; reopen it for appends."""
        path = self.env_log
        if path is None:
            return
        self._close_log()
        lines = []
        for key in sorted(self._sessions):
            sess = self._sessions[key]
            lines.append(orjson.dumps(["n", key, sess.rollout_id, sess.attempt]))
            lines.extend(orjson.dumps(["e", key, e.turn, e.title, e.sentinel])
                         for e in sess.events)
        write_atomic(path, b"".join(line + b"\n" for line in lines))
        self._log_fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def _log(self, record: list[Any]) -> None:
        """Append one change (one ``write``: the OS has it even if this process dies next)."""
        if self._log_fd is not None:
            os.write(self._log_fd, orjson.dumps(record) + b"\n")

    def _close_log(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _shutdown(self) -> None:
        self._closing = True  # no new task in the task group from here (lease watchers)
        self._admission_open = False
        self._cancel_lease()
        for ep in [*self._episodes.values(), *self._unclaimed.values()]:
            ep.scope.cancel()
            self._end_episode(ep, None)
        self._unclaimed.clear()
        for st in list(self._streams):
            self._end_stream(st, hard=True)
        if self._all_parked is not None:
            self._all_parked.set()

    @property
    def dead(self) -> bool:
        return self._dead

    def drop_stream(self, pick: Callable[[int], int] = lambda n: 0) -> bool:
        """End one open reply stream now, as a ``drop`` fault would: undelivered replies are
        discarded, its rows run on. ``pick(n)`` chooses among the ``n`` open streams (oldest
        first). False if no stream is open. For fault injection between checkpoint stages."""
        open_streams = [st for st in self._streams if not st.ended]
        if not open_streams:
            return False
        self._end_stream(open_streams[pick(len(open_streams))])
        return True

    @property
    def participants(self) -> tuple[tuple[str, str], ...]:
        """``(server_name, kind)`` of each participant, in topology order."""
        return ((AGENT, self.agent_kind), (CALENDAR, "environment"), (MODEL_PROXY, "model_proxy"))

    def _check_call(self, op: str, deadline_ts: float | None = None) -> anyio.abc.TaskGroup:
        if self._dead:
            raise GymInstanceDead(self.name, op)
        if self._tg is None:
            raise RuntimeError(f"instance {self.name} is not serving: use 'async with' or serve()")
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

    # -- data plane --------------------------------------------------------------------------

    async def run(
        self, rows: Sequence[RunRow], *, refuse_all: bool = False, drop_after: int | None = None
    ) -> SimReplyStream:
        """Admit ``rows`` and return their reply stream at once.

        While admission is closed (or with ``refuse_all``) a row is answered ``Refused`` as a
        sidecar row and the stream goes on. A row with ``restored_from`` claims that unclaimed
        restored episode (attempt + 1, same row and slot) and continues it from its step
        boundary; a bad claim fails the row (data). A row of an attempt older than the slot's
        current one is fenced: no episode, no reply. With ``drop_after`` the stream ends after
        that many replies, the rest of its rows running on.
        """
        tg = self._check_call("run")
        await anyio.lowlevel.checkpoint()
        tg = self._check_call("run")
        send, receive = anyio.create_memory_object_stream[Batch](math.inf)
        st = _RunStream(
            send=send,
            receive=receive,
            rows_left=len(rows),
            drop_after=drop_after,
            wake=anyio.Event(),
            scope=anyio.CancelScope(),
        )
        self._streams[st] = None
        for row in rows:
            if refuse_all or not self._admission_open:
                self._count.refused_rows += 1
                self._push(st, Refused(row.rollout_id), final=True)
                self._row_done(st)
                continue
            reply = self._admit(st, row)
            if reply is not None:
                self._push(st, reply, final=True)
                self._row_done(st)
        if drop_after is not None and drop_after <= 0:
            self._end_stream(st)
        tg.start_soon(self._flush_loop, st)
        return SimReplyStream(self, st)

    def _admit(self, st: _RunStream, row: RunRow) -> RunReply | None:
        """Start ``row``'s episode; or the reply it gets at once; or None with the row done."""
        rid = row.rollout_id
        if rid in self._episodes or rid in self._unclaimed:
            self._count.failed += 1
            return Failed(rid, "data", f"{self.name}: rollout {rid} is already running here")
        if row.restored_from is not None:
            return self._claim(st, row)
        key = session_key(row.row, row.slot)
        current = self._sessions.get(key)
        if current is not None and current.attempt > row.attempt:
            self._count.stale_runs += 1
            self._row_done(st)
            return None
        if current is not None:
            self._fence(current.rollout_id)
            self._finished.pop(current.rollout_id, None)
        self._sessions[key] = _Session(key, rid, row.attempt)
        self._log(["n", key, rid, row.attempt])
        ep = _Episode(
            rollout_id=rid,
            row=row.row,
            slot=row.slot,
            attempt=row.attempt,
            plan=plan_episode(self.seed, row.row, row.slot, self.config),
            scope=anyio.CancelScope(),
            state=_MOVING,
            stream=st,
        )
        self._start(ep)
        self._count.episodes_started += 1
        return None

    def _claim(self, st: _RunStream, row: RunRow) -> RunReply | None:
        rid, old_id = row.rollout_id, row.restored_from
        assert old_id is not None
        old = self._unclaimed.get(old_id)
        problem = None
        if old is None:
            problem = (
                f"{self.name}: no unclaimed restored episode {old_id} here (a restored episode "
                "is claimed once, on its original replica)"
            )
        elif (row.row, row.slot) != (old.row, old.slot):
            problem = (
                f"{self.name}: claim {rid} is row {row.row} slot {row.slot}, but restored "
                f"episode {old_id} is row {old.row} slot {old.slot}"
            )
        elif row.attempt != old.attempt + 1:
            problem = (
                f"{self.name}: claim {rid} is attempt {row.attempt}, restored episode "
                f"{old_id} must be claimed by attempt {old.attempt + 1}"
            )
        if problem is not None or old is None:
            self._count.failed += 1
            return Failed(rid, "data", problem or "")
        del self._unclaimed[old_id]
        key = old.key
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(key, old_id, old.attempt)
            self._log(["n", key, old_id, old.attempt])
        session.rollout_id, session.attempt = rid, row.attempt
        self._log(["o", key, rid, row.attempt])
        self._staged[rid] = self._staged.pop(old_id, [])
        ep = _Episode(
            rollout_id=rid,
            row=row.row,
            slot=row.slot,
            attempt=row.attempt,
            plan=old.plan,
            scope=anyio.CancelScope(),
            state=_MOVING,
            boundary=old.boundary,
            stream=st,
            replay=old.replay,
            restored=True,
        )
        old.state = _DONE
        self._start(ep, staged=False)
        self._count.episodes_claimed += 1
        return None

    def _start(self, ep: _Episode, *, staged: bool = True) -> None:
        assert self._tg is not None
        self._episodes[ep.rollout_id] = ep
        self._n_moving += 1
        if staged:
            self._staged[ep.rollout_id] = []
        self._tg.start_soon(self._episode_main, ep)

    def _fence(self, owner: str) -> None:
        """A newer attempt replaces ``owner``'s session: stop ``owner`` where it stands if it is
        waiting; a running one is stopped by its next fence check (its mutation is rejected)."""
        old = self._unclaimed.pop(owner, None)
        if old is not None:
            self._count.fenced_episodes += 1
            self._staged.pop(owner, None)
            old.state = _DONE
            return
        ep = self._episodes.get(owner)
        if ep is not None and ep.state == _BOUNDARY:
            self._count.fenced_episodes += 1
            ep.scope.cancel()
            self._end_episode(ep, None)

    # -- episodes ------------------------------------------------------------------------------

    async def _episode_main(self, ep: _Episode) -> None:
        with ep.scope:
            if ep.state == _DONE:
                return
            try:
                reply = await self._play(ep)
            except _EpisodeStopped:
                return
            self._end_episode(ep, reply)

    async def _play(self, ep: _Episode) -> RunReply:
        if ep.restored:
            problem = self._replay_problem(ep)
            if problem is not None:
                return Failed(ep.rollout_id, "data", problem)
        plan = ep.plan
        while True:
            await self._step_boundary(ep)
            turn = ep.boundary
            if turn >= plan.turns:
                return Completed(ep.rollout_id, plan.reward, plan.turns)
            self._model_call(ep, turn)
            await anyio.sleep(plan.durations[turn])
            if plan.mutates[turn]:
                self._calendar_create_event(ep, turn)
            ep.boundary = turn + 1

    def _replay_problem(self, ep: _Episode) -> str | None:
        """Check the restored model calls against the capture keys they were staged under."""
        keys = tuple(k for k, _ in self._staged.get(ep.rollout_id, ()))
        for turn in range(ep.boundary):
            want = capture_key(ep.row, ep.slot, turn)
            got = keys[turn] if turn < len(keys) else None
            if got != want:
                return (
                    f"{self.name}: restored model call t{turn} of {ep.rollout_id} was staged "
                    f"under capture key {got!r}, the continuation asked for {want!r}"
                )
        if ep.replay is not None and ep.replay != keys:
            return (
                f"{self.name}: restored episode of {ep.rollout_id} has capture keys "
                f"{list(ep.replay)} in the manifest, {list(keys)} staged by the model proxy"
            )
        return None

    def _fenced(self, ep: _Episode) -> bool:
        session = self._sessions.get(ep.key)
        return session is None or session.rollout_id != ep.rollout_id

    def _stop_if_fenced(self, ep: _Episode) -> None:
        if self._fenced(ep):
            self._count.fenced_episodes += 1
            self._end_episode(ep, None)
            raise _EpisodeStopped

    async def _step_boundary(self, ep: _Episode) -> None:
        """Pass step boundary ``ep.boundary``: park here while a checkpoint is prepared."""
        self._stop_if_fenced(ep)
        if not (self._prepared or ep.hold):
            return
        self._set_moving(ep, False)
        try:
            if ep.hold:
                while not self._prepared:
                    assert self._prepared_evt is not None
                    await self._prepared_evt.wait()
                ep.hold = False
            while self._prepared:
                assert self._resumed is not None
                await self._resumed.wait()
        finally:
            if ep.state == _BOUNDARY:
                self._set_moving(ep, True)
        self._stop_if_fenced(ep)

    def _model_call(self, ep: _Episode, turn: int) -> None:
        self._stop_if_fenced(ep)
        key = capture_key(ep.row, ep.slot, turn)
        self._staged.setdefault(ep.rollout_id, []).append((key, ep.plan.payloads[turn]))
        self._count.model_calls += 1

    def _calendar_create_event(self, ep: _Episode, turn: int) -> None:
        if self._fenced(ep):
            self._count.fenced_mutations += 1
            self._count.fenced_episodes += 1
            self._end_episode(ep, None)
            raise _EpisodeStopped
        session = self._sessions[ep.key]
        event = CalendarEvent(turn, f"meeting {ep.key} t{turn}", sentinel(ep.row, ep.slot, turn))
        session.events.append(event)
        self._log(["e", ep.key, event.turn, event.title, event.sentinel])
        self._count.mutations += 1
        if self.config.hold_after_first_mutation and not self._first_mutation_seen:
            self._first_mutation_seen = True
            ep.hold = True

    def _set_moving(self, ep: _Episode, moving: bool) -> None:
        if moving:
            ep.state = _MOVING
            self._n_moving += 1
        else:
            ep.state = _BOUNDARY
            self._n_moving -= 1
            self._check_parked()

    def _check_parked(self) -> None:
        if self._prepared and self._n_moving == 0 and self._all_parked is not None:
            self._all_parked.set()

    def _end_episode(self, ep: _Episode, reply: RunReply | None) -> None:
        """The one exit of an active episode: bookkeeping, then its reply (if any)."""
        if ep.state == _DONE:
            return
        was, ep.state = ep.state, _DONE
        if self._episodes.get(ep.rollout_id) is ep:
            del self._episodes[ep.rollout_id]
        if was == _MOVING:
            self._n_moving -= 1
            self._check_parked()
        self._staged.pop(ep.rollout_id, None)
        if reply is not None and self._fenced(ep):
            self._count.fenced_replies += 1
            reply = None
        if reply is not None:
            self._finished[ep.rollout_id] = ep.key
            if isinstance(reply, Completed):
                self._count.completed += 1
            else:
                self._count.failed += 1
        st = ep.stream
        if st is not None:
            if reply is not None:
                self._push(st, reply, final=True)
            self._row_done(st)

    # -- streams -------------------------------------------------------------------------------

    def _push(self, st: _RunStream, reply: RunReply, *, final: bool) -> None:
        if st.ended:
            self._count.discarded_replies += 1
            return
        st.pending.append(reply)
        if final:
            self._on_wire[reply.rollout_id] = st
        if len(st.pending) == 1 or len(st.pending) >= self.config.max_batch:
            st.wake.set()

    def _row_done(self, st: _RunStream) -> None:
        st.rows_left -= 1
        if st.rows_left <= 0:
            st.wake.set()

    async def _flush_loop(self, st: _RunStream) -> None:
        max_batch = self.config.max_batch
        with st.scope:
            try:
                while not st.ended:
                    if not st.pending:
                        if st.rows_left <= 0:
                            break
                        st.wake = anyio.Event()
                        await st.wake.wait()
                        continue
                    if len(st.pending) < max_batch and st.rows_left > 0:
                        st.wake = anyio.Event()
                        with anyio.move_on_after(self.config.flush_interval_s):
                            await st.wake.wait()
                    self._deliver(st)
            finally:
                self._end_stream(st)

    def _deliver(self, st: _RunStream) -> None:
        if st.ended or not st.pending:
            return
        size = self.config.max_batch
        if st.drop_after is not None:
            size = min(size, st.drop_after - st.sent)
        if len(st.pending) > size:  # replies of one instant arrive in scheduler order
            st.pending.sort(key=lambda r: r.rollout_id)
        batch = sorted(st.pending[:size], key=lambda r: r.rollout_id)
        del st.pending[:size]
        if batch:
            try:
                st.send.send_nowait(tuple(batch))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._discard(st, batch)
            else:
                st.sent += len(batch)
                self._count.batches += 1
        if st.drop_after is not None and st.sent >= st.drop_after:
            self._end_stream(st)

    def _discard(self, st: _RunStream, replies: Sequence[RunReply]) -> None:
        for r in replies:
            if self._on_wire.get(r.rollout_id) is st:
                del self._on_wire[r.rollout_id]
            self._count.discarded_replies += 1

    def _end_stream(self, st: _RunStream, *, hard: bool = False) -> None:
        """No more replies go out on ``st``; with ``hard``, sent batches are lost too."""
        if not st.ended:
            st.ended = True
            self._discard(st, st.pending)
            st.pending.clear()
            st.send.close()
            st.wake.set()
            st.scope.cancel()
        if hard:
            self._drain_undelivered(st)
            st.receive.close()
            self._forget(st)

    def _forget(self, st: _RunStream) -> None:
        self._streams.pop(st, None)

    def _drain_undelivered(self, st: _RunStream) -> None:
        while True:
            try:
                batch = st.receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._discard(st, batch)

    def _ack(self, st: _RunStream, rollout_ids: Sequence[str]) -> None:
        for rid in rollout_ids:
            if self._on_wire.get(rid) is st:
                del self._on_wire[rid]

    def _consumer_closed(self, st: _RunStream) -> None:
        self._end_stream(st, hard=True)

    # -- control plane ---------------------------------------------------------------------------

    async def prepare(self, checkpoint_id: str, deadline_ts: float) -> PrepareReply:
        """Close admission and park every episode at its next step boundary.

        Returns once nothing runs (parked or finished). A prepare for another checkpoint while
        one is open takes it over. Past ``deadline_ts``: ``GymCallTimeout``, admission stays closed
        until a resume or the lease reopens it. Reopened meanwhile: ``GymControlError``.
        """
        self._check_call("prepare", deadline_ts)
        self._admission_open = False
        self._checkpoint_id = checkpoint_id
        if not self._prepared:
            assert self._prepared_evt is not None
            self._prepared = True
            self._gen += 1
            self._resumed = anyio.Event()
            self._all_parked = anyio.Event()
            self._prepared_evt.set()
        gen = self._gen
        assert self._all_parked is not None
        if self._n_moving and self._all_parked.is_set():
            self._all_parked = anyio.Event()
        self._arm_lease()
        with anyio.move_on_at(deadline_ts) as scope:
            while self._n_moving and self._prepared and self._gen == gen and not self._dead:
                assert self._all_parked is not None
                await self._all_parked.wait()
        await anyio.lowlevel.checkpoint()
        if self._dead:
            raise GymInstanceDead(self.name, "prepare")
        if not self._prepared or self._gen != gen:
            raise GymControlError(
                self.name, "prepare", f"checkpoint {checkpoint_id} reopened before it parked"
            )
        if scope.cancelled_caught or self._n_moving:
            raise GymCallTimeout(
                f"instance {self.name} prepare: {self._n_moving} episodes did not reach a step "
                f"boundary before the deadline",
                self.name,
                "prepare",
            )
        parked = sum(1 for ep in self._episodes.values() if ep.state == _BOUNDARY)
        return PrepareReply(self.name, checkpoint_id, parked=parked, on_wire=len(self._on_wire))

    async def commit(self, checkpoint_id: str, state_root: str, deadline_ts: float) -> CommitReply:
        """Write each participant's records under ``state_root/<instance>/<server_name>/`` and
        report them. Needs a finished prepare of the same checkpoint (else ``GymControlError``).

        Exported: every parked and unclaimed episode, owned by ``calendar`` (simple agent) or
        ``agent`` (legacy agent). ``on_wire``: final replies produced but not acknowledged.
        """
        self._check_call("commit", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("commit", deadline_ts)
        if not self._prepared or self._checkpoint_id != checkpoint_id:
            now = f"checkpoint {self._checkpoint_id} is open" if self._prepared else "none is open"
            raise GymControlError(
                self.name, "commit", f"checkpoint {checkpoint_id} is not prepared ({now})"
            )
        if self._n_moving:
            raise GymControlError(
                self.name,
                "commit",
                f"{self._n_moving} episodes have not parked; prepare must finish first",
            )
        root = self._root(state_root)
        # Export in bulk, off the loop: every episode is parked, so what the export reads stays
        # put while it runs; the loop only takes C-level copies of the tables (a few ms at 200k).
        episodes, unclaimed = list(self._episodes.values()), list(self._unclaimed.values())
        staged, sessions_now = dict(self._staged), list(self._sessions.values())
        on_wire = tuple(self._on_wire)
        exported, sessions, participants = await _offload(
            functools.partial(self._export, checkpoint_id, root, episodes, unclaimed, staged,
                              sessions_now)
        )
        if self._dead:  # died while exporting: what it committed died with it
            raise GymInstanceDead(self.name, "commit")
        self._count.commits += 1
        self._arm_lease()
        return CommitReply(
            instance=self.name,
            checkpoint_id=checkpoint_id,
            participants=tuple(participants),
            exported=exported,
            on_wire=tuple(sorted(on_wire)),
            sessions=sessions,
        )

    def _export(
        self,
        checkpoint_id: str,
        root: Path,
        episodes: list[_Episode],
        unclaimed: list[_Episode],
        staged: dict[str, list[tuple[str, str]]],
        calendar: list[_Session],
    ) -> tuple[tuple[ExportedEpisode, ...], tuple[AgentSession, ...], list[ParticipantInfo]]:
        """Build and write every participant's records (a worker thread; see ``commit``)."""
        held = sorted(
            [*(ep for ep in episodes if ep.state == _BOUNDARY), *unclaimed],
            key=lambda ep: ep.rollout_id,
        )
        legacy = self.agent_kind == "legacy_agent"
        stranded = (
            held[0].rollout_id if legacy and self.config.strand_legacy_session and held else None
        )
        # a legacy agent's environment only relays /run: nothing exports the episode, the
        # agent session (with its step boundary and staged model calls) holds it (S10)
        exported = () if legacy else tuple(
            ExportedEpisode(
                ep.rollout_id,
                CALENDAR,
                tuple(k for k, _ in staged.get(ep.rollout_id, ())),
            )
            for ep in held
        )
        sessions = tuple(
            AgentSession(
                ep.rollout_id,
                AGENT,
                self.agent_kind,
                None if ep.rollout_id == stranded else ep.boundary,
                tuple(k for k, _ in staged.get(ep.rollout_id, ())),
            )
            for ep in held
        )
        records = {
            AGENT: {
                "participant": AGENT,
                "kind": self.agent_kind,
                "checkpoint_id": checkpoint_id,
                "sessions": [
                    {
                        "rollout_id": ep.rollout_id,
                        "row": ep.row,
                        "slot": ep.slot,
                        "attempt": ep.attempt,
                        "step_boundary": s.step_boundary,
                    }
                    for ep, s in zip(held, sessions, strict=True)
                ],
            },
            CALENDAR: {
                "participant": CALENDAR,
                "kind": "environment",
                "checkpoint_id": checkpoint_id,
                "exported": [] if legacy else [e.rollout_id for e in exported],
                "sessions": [
                    {
                        "key": s.key,
                        "rollout_id": s.rollout_id,
                        "attempt": s.attempt,
                        "events": [attrs.asdict(e) for e in s.events],
                    }
                    for s in sorted(calendar, key=lambda s: s.key)
                ],
            },
            MODEL_PROXY: {
                "participant": MODEL_PROXY,
                "kind": "model_proxy",
                "checkpoint_id": checkpoint_id,
                "staged": [
                    {
                        "rollout_id": ep.rollout_id,
                        "calls": [
                            {"key": k, "payload": p} for k, p in staged.get(ep.rollout_id, ())
                        ],
                    }
                    for ep in held
                ],
            },
        }
        participants = []
        for server, kind in self.participants:
            directory = root / self.name / server
            _write_records(directory, records[server])
            participants.append(
                ParticipantInfo(
                    server_name=server,
                    kind=kind,
                    state_dir=f"{self.name}/{server}",
                    records_digest=records_digest(directory),
                )
            )
        return exported, sessions, participants

    async def resume(self, checkpoint_id: str, deadline_ts: float) -> None:
        """Reopen admission and unpark. A no-op when nothing is prepared (the lease may have
        reopened already); ``GymControlError`` if another checkpoint is open."""
        self._check_call("resume", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("resume", deadline_ts)
        if not self._prepared:
            return
        if self._checkpoint_id != checkpoint_id:
            raise GymControlError(
                self.name,
                "resume",
                f"checkpoint {self._checkpoint_id} is open, not {checkpoint_id}",
            )
        self._reopen()

    def _reopen(self) -> None:
        assert self._resumed is not None and self._all_parked is not None
        self._cancel_lease()
        self._prepared = False
        self._checkpoint_id = None
        self._admission_open = True
        self._prepared_evt = anyio.Event()
        self._resumed.set()
        self._all_parked.set()

    def _arm_lease(self) -> None:
        assert self._tg is not None
        self._cancel_lease()
        if self._closing:  # shutting down (or dead): its task group takes no new task
            return
        scope = self._lease_scope = anyio.CancelScope()
        self._tg.start_soon(self._lease_watch, scope, self._gen)

    def _cancel_lease(self) -> None:
        if self._lease_scope is not None:
            self._lease_scope.cancel()
            self._lease_scope = None

    async def _lease_watch(self, scope: anyio.CancelScope, gen: int) -> None:
        with scope:
            await anyio.sleep(self.config.lease_s)
            if self._prepared and self._gen == gen and not self._dead:
                self._count.lease_reopened += 1
                self._reopen()

    async def retire(self, rollout_ids: Sequence[str], deadline_ts: float) -> RetireReply:
        """Stop these attempts' work, then free their state (calendar session if they own it,
        agent session, staged calls). Refused (``GymControlError``) while a checkpoint is open.
        Finished attempts are retired too (their session is freed); unknown IDs are reported."""
        return await self._retire("retire", rollout_ids, deadline_ts, restored_only=False)

    async def retire_restored(self, rollout_ids: Sequence[str], deadline_ts: float) -> RetireReply:
        """Drop unclaimed restored episodes; any other ID is reported unknown."""
        return await self._retire("retire_restored", rollout_ids, deadline_ts, restored_only=True)

    async def _retire(
        self, op: str, rollout_ids: Sequence[str], deadline_ts: float, *, restored_only: bool
    ) -> RetireReply:
        self._check_call(op, deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call(op, deadline_ts)
        if self._prepared:
            raise GymControlError(
                self.name,
                op,
                f"checkpoint {self._checkpoint_id} is open; retire after it resumes",
            )
        retired: list[str] = []
        unknown: list[str] = []
        for rid in dict.fromkeys(rollout_ids):
            ep = self._unclaimed.pop(rid, None)
            if ep is not None:
                ep.state = _DONE
            elif not restored_only:
                ep = self._episodes.get(rid)
                if ep is not None:
                    ep.scope.cancel()
                    self._end_episode(ep, None)
            if ep is not None:
                self._free(rid, ep.key)
            elif not restored_only and rid in self._finished:
                self._free(rid, self._finished.pop(rid))
            else:
                unknown.append(rid)
                continue
            retired.append(rid)
            self._count.retired += 1
        return RetireReply(self.name, tuple(retired), tuple(unknown))

    def _free(self, rollout_id: str, key: str) -> None:
        self._staged.pop(rollout_id, None)
        self._finished.pop(rollout_id, None)
        session = self._sessions.get(key)
        if session is not None and session.rollout_id == rollout_id:
            del self._sessions[key]
            self._log(["d", key])

    async def restore(
        self,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        """Verify, then install committed state; restored episodes wait unclaimed.

        First the live participants must equal ``record.participants`` (names and kinds, in
        order) and each participant's directory ``state_root/<state_dir>`` must carry the
        recorded digest; every listed episode must be held by those records. Any difference
        raises ``TopologyMismatch`` listing all of them, with nothing changed. The instance must
        be idle and not prepared (``GymControlError``). Then the calendar sessions, agent
        sessions and staged model calls are installed, replacing the instance's state, and each
        episode in ``episodes`` waits parked at its step boundary until a run of attempt + 1
        with ``restored_from`` set claims it.
        """
        self._check_call("restore", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("restore", deadline_ts)
        root = self._root(state_root)
        diffs, loaded = self._verify(root, record)
        agent_sessions: dict[str, Mapping[str, Any]] = {}
        calendar_exported: set[str] = set()
        if not diffs:
            try:
                agent_sessions = {s["rollout_id"]: s for s in loaded[AGENT]["sessions"]}
                calendar_exported = set(loaded[CALENDAR]["exported"])
            except (KeyError, TypeError) as exc:
                diffs.append(f"instance {self.name}: committed records malformed ({exc!r})")
        if not diffs:
            diffs.extend(self._episode_differences(episodes, agent_sessions, calendar_exported))
        if diffs:
            raise TopologyMismatch(diffs)
        if self._prepared:
            raise GymControlError(self.name, "restore", f"checkpoint {self._checkpoint_id} is open")
        if self._episodes or self._unclaimed:
            raise GymControlError(
                self.name,
                "restore",
                f"restore needs an idle instance; {len(self._episodes)} running and "
                f"{len(self._unclaimed)} unclaimed episodes here",
            )
        try:
            sessions = {
                s["key"]: _Session(
                    s["key"],
                    s["rollout_id"],
                    int(s["attempt"]),
                    [CalendarEvent(**e) for e in s["events"]],
                )
                for s in loaded[CALENDAR]["sessions"]
            }
            staged = {
                s["rollout_id"]: [(c["key"], c["payload"]) for c in s["calls"]]
                for s in loaded[MODEL_PROXY]["staged"]
            }
        except (KeyError, TypeError) as exc:
            raise TopologyMismatch(
                [f"instance {self.name}: committed records malformed ({exc!r})"]
            ) from None
        restored = []
        unclaimed: dict[str, _Episode] = {}
        for rec in episodes:
            s = agent_sessions[rec.rollout_id]
            row, slot = int(s["row"]), int(s["slot"])
            unclaimed[rec.rollout_id] = _Episode(
                rollout_id=rec.rollout_id,
                row=row,
                slot=slot,
                attempt=int(s["attempt"]),
                plan=plan_episode(self.seed, row, slot, self.config),
                scope=anyio.CancelScope(),
                state=_UNCLAIMED,
                boundary=int(s["step_boundary"]),
                replay=tuple(rec.capture_keys),
            )
            restored.append(rec.rollout_id)
        self._sessions = sessions
        self._rewrite_log()
        self._staged = {rid: staged.get(rid, []) for rid in unclaimed}
        self._unclaimed = unclaimed
        self._finished = {
            s.rollout_id: key for key, s in sessions.items() if s.rollout_id not in unclaimed
        }
        self._first_mutation_seen = any(s.events for s in sessions.values())
        self._count.restored += len(restored)
        return RestoreReply(self.name, tuple(restored))

    def _verify(
        self, root: Path, record: InstanceRecord
    ) -> tuple[list[str], dict[str, dict[str, Any]]]:
        return read_verified(self.name, self.participants, root, record)

    def _episode_differences(
        self,
        episodes: Sequence[EpisodeRecord],
        agent_sessions: Mapping[str, Mapping[str, Any]],
        calendar_exported: set[str],
    ) -> list[str]:
        diffs: list[str] = []
        legacy = self.agent_kind == "legacy_agent"
        owner = AGENT if legacy else CALENDAR
        seen: set[str] = set()
        for rec in episodes:
            which = f"instance {self.name}: episode {rec.rollout_id}"
            if rec.rollout_id in seen:
                diffs.append(f"{which} listed twice")
                continue
            seen.add(rec.rollout_id)
            if rec.replica != self.name:
                diffs.append(f"{which} belongs to replica {rec.replica}")
            if rec.owner != owner:
                diffs.append(f"{which} owner {rec.owner} recorded, {owner} exports it here")
            session = agent_sessions.get(rec.rollout_id)
            if session is None:
                diffs.append(f"{which} has no agent session in the committed records")
            elif session.get("step_boundary") is None:
                diffs.append(f"{which} agent session has no step boundary (stranded)")
            if not legacy and rec.rollout_id not in calendar_exported:
                diffs.append(f"{which} not exported by {CALENDAR} in the committed records")
        return diffs

    def _root(self, state_root: str | Path) -> Path:
        root = Path(state_root)
        if not root.is_absolute() and self.work_dir is not None:
            root = self.work_dir / root
        return root

    # -- views ---------------------------------------------------------------------------------

    def topology(self) -> InstanceTopology:
        if self._dead:
            raise GymInstanceDead(self.name, "topology")
        return InstanceTopology(self.name, self.participants)

    def inventory(self) -> InstanceInventory:
        if self._dead:
            raise GymInstanceDead(self.name, "inventory")
        parked = self._prepared
        return InstanceInventory(
            instance=self.name,
            admission_open=self._admission_open,
            prepared=self._prepared,
            running=tuple(
                sorted(
                    rid
                    for rid, ep in self._episodes.items()
                    if not (parked and ep.state == _BOUNDARY)
                )
            ),
            parked=tuple(
                sorted(
                    rid for rid, ep in self._episodes.items() if parked and ep.state == _BOUNDARY
                )
            ),
            unclaimed=tuple(sorted(self._unclaimed)),
            on_wire=tuple(sorted(self._on_wire)),
            lease_reopened=self._count.lease_reopened,
        )

    def calendar_state(self) -> dict[str, CalendarSession]:
        """The environment's live sessions by session key (for sentinel checks)."""
        return {key: self._sessions[key].frozen() for key in sorted(self._sessions)}

    def statistics(self) -> SimStatistics:
        c = self._count
        parked = sum(
            1 for ep in self._episodes.values() if self._prepared and ep.state == _BOUNDARY
        )
        return SimStatistics(
            instance=self.name,
            dead=self._dead,
            admission_open=self._admission_open,
            prepared=self._prepared,
            running=len(self._episodes) - parked,
            parked=parked,
            unclaimed=len(self._unclaimed),
            on_wire=len(self._on_wire),
            streams=len(self._streams),
            **attrs.asdict(c),
        )

    def __repr__(self) -> str:
        state = "dead" if self._dead else "prepared" if self._prepared else "open"
        return (
            f"<SimInstance {self.name} {self.agent_kind} {state} episodes={len(self._episodes)} "
            f"moving={self._n_moving} unclaimed={len(self._unclaimed)} "
            f"on_wire={len(self._on_wire)} sessions={len(self._sessions)}>"
        )


_EXPORT_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "gymckpt_sim_export_threads"
)


async def _offload(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread; inline under trio's ``MockClock`` (virtual time would leap
    past every deadline while a real thread runs).

    One such thread per event loop at a time: instances hosted in one process share one GIL, so
    parallel exports are not faster, and every extra thread wanting the GIL makes the event
    loop wait longer for it."""
    if sniffio.current_async_library() == "trio":
        import trio
        import trio.testing

        if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            await anyio.lowlevel.checkpoint()
            return fn()
    try:
        limiter = _EXPORT_THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _EXPORT_THREADS.set(limiter)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)


def replay_env_log(data: bytes) -> dict[str, _Session]:
    """The calendar sessions a durable log holds (see ``SimInstance.env_log``).

    Records: ``["n", key, rollout_id, attempt]`` a session (re)opened empty, ``["o", key,
    rollout_id, attempt]`` taken over by a claim, ``["e", key, turn, title, sentinel]`` an event,
    ``["d", key]`` freed. A torn last line (a machine crash during the append) is ignored; a bad
    line anywhere else raises ``ValueError`` naming it."""
    sessions: dict[str, _Session] = {}
    lines = data.split(b"\n")
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            rec = orjson.loads(line)
            op, key = rec[0], rec[1]
            if op == "n":
                sessions[key] = _Session(key, rec[2], int(rec[3]))
            elif op == "o":
                sessions[key].rollout_id, sessions[key].attempt = rec[2], int(rec[3])
            elif op == "e":
                sessions[key].events.append(CalendarEvent(int(rec[2]), rec[3], rec[4]))
            elif op == "d":
                del sessions[key]
            else:
                raise ValueError(f"unknown record {op!r}")
        except (orjson.JSONDecodeError, ValueError, KeyError, IndexError, TypeError) as exc:
            if n == len(lines) and not data.endswith(b"\n"):
                break  # torn last append
            raise ValueError(f"environment log line {n}: {exc!r}") from None
    return sessions


def _write_records(directory: Path, records: Mapping[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(records, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    write_atomic(directory / RECORDS_FILE, data)


async def inject_fault(
    spec: FaultSpec, instance: str, op: str, die: Callable[[], None], stuck_loop_s: float = 0.0
) -> None:
    """Carry out the control-plane part of a C3 fault before the call reaches the instance.

    Shared by the embedded backend and the Ray actor, so a spec means the same on both:
    ``hang`` never answers (after blocking the event loop ``stuck_loop_s`` seconds, the Ray
    "stuck loop" case); ``delay`` sleeps ARG; ``error`` raises ``GymControlError``;
    ``unpicklable`` raises Gym's own unpicklable ``CoordinationError``; ``dead`` calls ``die``
    (which kills the instance) and raises ``GymInstanceDead``. ``refuse`` and ``drop`` act on the
    data plane and are handled by the caller.
    """
    if spec.kind == "hang":
        if stuck_loop_s > 0:
            time.sleep(stuck_loop_s)  # noqa: ASYNC251 - the fault: a stuck event loop
        await anyio.sleep_forever()
    elif spec.kind == "delay":
        assert spec.arg is not None
        await anyio.sleep(spec.arg)
    elif spec.kind == "error":
        raise GymControlError(instance, op, f"injected fault {spec}")
    elif spec.kind == "unpicklable":
        raise CoordinationError(instance, op, f"injected fault {spec}")
    elif spec.kind == "dead":
        die()
        raise GymInstanceDead(instance, op)
