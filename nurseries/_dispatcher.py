"""Dispatcher: streams rows to Gym through the DispatchGate and applies the replies.

Invariants
----------
* An attempt becomes DISPATCHED inside gate admission, in the same ledger mutation that follows
  its submission to Gym with no checkpoint in between (S1). A submission that fails leaves the
  attempts RESERVED and queued.
* Each submission (one planned batch for one instance) runs in its own task, so a slow or hung
  ``gym.run`` on one instance holds up neither the planning loop nor submissions to other
  instances; admissions do not exclude each other (``DispatchGate``). An attempt planned into a
  submission in progress is not planned again until that submission has finished.
* Every reply is applied in one barrier mutation per batch, touching exactly the batch's rollout
  IDs (plus ``READY`` when a group became complete), so drain waiters wake on their own
  episodes only (S9).
* ``admission_closed`` refusals go back to RESERVED at no cost and are re-sent when admission
  reopens (S2); counted in ``rollout/gym_admission_closed_rows_total``.
* A stream that ends early: rows that never came back (and were not refused) are abandoned,
  queued for retirement and retired at once under dispatch admission; a failed retire is not
  fatal — they stay queued for the next checkpoint. Their siblings are re-sent as fresh attempts
  under new rollout IDs (S3). A stream that failed because its instance could not be reached
  (``GymUnavailable`` that is not a death) is an outage: its rows are abandoned the same way
  but spend nothing, and are re-sent after the outage's backoff.
* Completions are accepted only when identity and gate ID match the ledger (stale ones counted).
* Failures are classified infra vs data by Gym. A data failure spends a row attempt and data
  budget and is re-sent at once. An infra failure (``ModelUnavailable`` out of ``ctx.model``:
  the model server is down; an instance that could not run the episode) spends nothing: the
  slot's next attempt is re-sent after a backoff that grows with the outage, and the outage
  is bounded by time — the ``OutageClock`` of the episodes' infrastructure runs from the first
  infra failure after the last episode that ended otherwise, and past ``outage_budget_s``
  the run stops (``InfraOutage``, exit code 8) naming the last failure; it never gives a row
  up. Each failure counts in ``rollout/episode_failures_total`` and its class's
  ``rollout/episode_failures_{data,infra}_total``. A ``Completed`` whose reward is not a finite
  number (an int is taken as a float; a bool, ``nan`` or ``inf`` is not) is a data failure of
  that attempt (Gym's replies are not trusted: a ``nan`` in the ledger would make a snapshot
  that cannot be read back). A config failure (an ``EpisodeConfigError`` in the episode: the
  configuration is wrong for every row) stops the run at once (``EpisodeConfigFailed``, exit
  code 2): its row is neither failed nor re-sent (it stays in flight in the ledger, so a rerun
  resumes it from the last snapshot), and no further row is dispatched into the same failure.
* Restored attempts go to their original replica with ``restored_from`` set, once (S11).
* A dead instance (``GymInstanceDead`` from a submission or a stream) is reported to the
  ``InstanceReplacer``; nothing is sent or retired there until its replacement serves. A
  stream of a dead instance abandons its rows without spending a row attempt: they are re-sent
  fresh elsewhere (the replacer releases the rest of what the instance held).

The queue of rollout IDs to send is the only work list: every producer of a RESERVED attempt
(new rows, refusals, replacements, restore) enqueues it. Each wait has an owner: the dispatcher
runs in the caller's nursery and stops when that nursery is cancelled.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import attrs
import trio

from gymckpt.gym_adapter import (
    Completed,
    Failed,
    GymBackend,
    Refused,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    Attempt,
    BudgetExhausted,
    DeadlineExpired,
    DeadlineRegistry,
    DispatchGate,
    EpisodeConfigFailed,
    GymAdmissionClosed,
    GymCallTimeout,
    GymInstanceDead,
    GymUnavailable,
    InfraOutage,
    Metrics,
    RecoveryLedger,
    RuntimeConfig,
)

from ._calls import bounded_call, fan_out
from ._outage import OutageClock
from ._replace import InstanceReplacer

__all__ = [
    "EPISODE_FAILURES",
    "EPISODE_FAILURES_DATA",
    "EPISODE_FAILURES_INFRA",
    "READY",
    "Dispatcher",
    "DispatcherStatistics",
]

T = TypeVar("T")

READY = "rollout/groups-ready"
"""Barrier key touched whenever a prompt group becomes complete (the trainer waits on it)."""
EPISODE_FAILURES = "rollout/episode_failures_total"
"""Failed episodes (attempts), whatever their class: every ``Failed`` reply, and every
``Completed`` refused here (a reward that is not a finite float, a data failure)."""
EPISODE_FAILURES_DATA = "rollout/episode_failures_data_total"
EPISODE_FAILURES_INFRA = "rollout/episode_failures_infra_total"


@attrs.frozen
class DispatcherStatistics:
    queued: int
    streams_open: int
    rows_sent: int
    refused: int
    early_ends: int
    retired_now: int
    retire_failures: int
    dead_instances: tuple[str, ...]
    submissions: int = 0
    """Submissions in progress: waiting at the gate, or admitted and inside ``gym.run``."""


def _stop_on_config(
    replies: Sequence[RunReply], instance: str, outstanding: dict[str, None]
) -> None:
    """``EpisodeConfigFailed`` for the first reply of ours (in ``outstanding``) that failed
    as config: the configuration is wrong for every row, so the run stops rather than fail
    this row and send the next one into the same failure."""
    for reply in replies:
        if not isinstance(reply, Failed) or reply.failure_class != "config":
            continue
        if reply.rollout_id in outstanding:
            raise EpisodeConfigFailed(reply.rollout_id, instance, reply.message)


def _finite_reward(reward: object) -> float | None:
    """A ``Completed`` reply's reward as the ledger takes it: a finite float (an int or a
    float subclass as a float), or None for anything else (NaN, an infinity, a bool, a
    string: the wire is not trusted)."""
    if type(reward) is float and math.isfinite(reward):
        return reward
    if isinstance(reward, (float, int)) and not isinstance(reward, bool) and math.isfinite(reward):
        return float(reward)  # an int, a float subclass: as a float
    return None


@attrs.define(eq=False, slots=True)
class Dispatcher:
    """Feeds the positions ``rows`` (ascending positions of the run's row order) to Gym,
    keeping ``max_rows_in_flight`` rows open; each attempt carries its position's dataset row
    (``row_of``) and that row's task."""

    gym: GymBackend
    ledger: RecoveryLedger
    gate: DispatchGate
    deadlines: DeadlineRegistry
    config: RuntimeConfig
    metrics: Metrics
    rows: Iterator[int]
    replacer: InstanceReplacer
    max_rows_in_flight: int = 64
    batch_size: int = 64
    request_timeout_s: float = 300.0
    on_dispatch: Callable[[str, Sequence[RunRow]], None] | None = None
    """Called with (instance, rows) right after rows are marked DISPATCHED (audit hooks)."""
    row_of: Callable[[int], int] | None = None
    """Position (a ledger row) -> the dataset row it trains (``RowOrder.row_at``); None: the
    same number (the default order)."""
    tasks: Callable[[int], Any] | None = None
    """Dataset row -> its task (a fresh copy each call), sent with every attempt of the row:
    fresh, retried and restored alike. None: the environment owns its data (task None)."""
    policy_version: int = 0
    """The trainer's policy version (``Rollouts.set_policy_version``), sent with every row."""

    _queue: deque[str] = attrs.field(factory=deque, init=False)
    _kick: trio.Event = attrs.field(factory=trio.Event, init=False)
    _rr: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _rows_exhausted: bool = attrs.field(default=False, init=False)
    _streams: int = attrs.field(default=0, init=False)
    _sent: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _early: int = attrs.field(default=0, init=False)
    _retired_now: int = attrs.field(default=0, init=False)
    _retire_failures: int = attrs.field(default=0, init=False)
    _stream_ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _submitting: set[str] = attrs.field(factory=set, init=False)
    """Rollout IDs planned into a submission still in progress: never planned twice."""
    _submissions: int = attrs.field(default=0, init=False)
    outage: OutageClock = attrs.field(init=False)
    """The episodes' infrastructure: down from the first infra failure after the last episode
    that ended otherwise (see the module docstring)."""

    def __attrs_post_init__(self) -> None:
        self.outage = OutageClock("infrastructure (every episode failed as infra)", self.config)

    # -- work list ---------------------------------------------------------------------------

    def enqueue(self, rollout_ids: Iterable[str]) -> None:
        """Queue RESERVED attempts for sending and wake the loop."""
        self._queue.extend(rollout_ids)
        self._kick.set()

    def enqueue_reserved(self) -> None:
        """Queue every RESERVED attempt already in the ledger (after a restore). O(ledger)."""
        self.enqueue(a.rollout_id for a in self.ledger.reserved())

    @property
    def rows_exhausted(self) -> bool:
        """Every position of the run's row order has been reserved."""
        return self._rows_exhausted

    def poke(self) -> None:
        """Wake the loop (e.g. the trainer took groups, so there is room for new rows)."""
        self._kick.set()

    def _plan(self, touched: list[str]) -> list[tuple[str, int, list[RunRow]]]:
        """One mutation: reserve new rows up to the in-flight limit, then pop up to
        ``batch_size`` still-RESERVED attempts grouped by target instance."""
        ledger = self.ledger
        room = self.max_rows_in_flight - len(ledger.rows())
        while room > 0 and not self._rows_exhausted:
            row = next(self.rows, None)
            if row is None:
                self._rows_exhausted = True
                touched.append(READY)  # the trainer may now be at the end
                break
            self._queue.extend(ledger.reserve_row_ids(row))
            room -= 1
        if not self._queue:
            return []
        replacer = self.replacer
        live = replacer.live()
        if not live:
            if replacer.all_lost:
                raise GymInstanceDead(",".join(self.gym.instances), "run")
            return []  # every instance is being replaced: ``on_up`` wakes us
        groups: dict[str, list[RunRow]] = {}
        taken = 0
        submitting = self._submitting
        while self._queue and taken < self.batch_size:
            rid = self._queue.popleft()
            if rid in submitting:
                continue  # queued twice: its submission is in progress
            att = ledger.reserved_attempt(rid)
            if att is None:
                continue  # superseded, or already sent
            position, slot, attempt, restored = att
            restored_from = None
            if restored is not None:
                if not replacer.is_up(restored.instance):
                    # its replica died: the replacer releases it (unpinned, re-queued) soon
                    self.metrics.inc("rollout/restored_on_dead_instance_total")
                    continue
                instance = restored.instance
                restored_from = restored.from_rollout_id
            else:
                instance = live[next(self._rr) % len(live)]
            row = position if self.row_of is None else self.row_of(position)
            task = None if self.tasks is None else self.tasks(row)
            submitting.add(rid)
            rows = groups.get(instance)
            if rows is None:
                rows = groups[instance] = []
            rows.append(
                RunRow(
                    rid,
                    row,
                    slot,
                    attempt,
                    restored_from,
                    task=task,
                    policy_version=self.policy_version,
                )
            )
            touched.append(rid)
            taken += 1
        return [(name, replacer.generation(name), rows) for name, rows in groups.items()]

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch until cancelled. Streams run as children of this call's nursery."""
        async with trio.open_nursery() as streams:
            self._nursery = streams  # streams and delayed re-sends live here
            task_status.started()
            while True:
                touched: list[str] = []
                self._kick = trio.Event()  # before planning, so no enqueue can be missed
                plan = functools.partial(self._plan, touched)
                batch = await self.ledger.barrier.mutate(plan, touched)
                if not batch:
                    await self._kick.wait()
                    continue
                for instance, generation, rows in batch:
                    # one task per submission: a slow or hung ``gym.run`` on one instance
                    # holds neither the loop nor submissions to other instances
                    streams.start_soon(self._submit, streams, instance, generation, rows)

    async def _submit(
        self, streams: trio.Nursery, instance: str, generation: int, rows: Sequence[RunRow]
    ) -> None:
        self._submissions += 1
        try:
            await self._submit_planned(streams, instance, generation, rows)
        finally:
            self._submissions -= 1
            # whatever this submission re-queued is plannable again from here on
            self._submitting.difference_update([r.rollout_id for r in rows])

    async def _submit_planned(
        self, streams: trio.Nursery, instance: str, generation: int, rows: Sequence[RunRow]
    ) -> None:
        ledger = self.ledger
        async with self.gate.admit() as gate_id:
            # the wait at the gate may have outlived some attempts (dropped, superseded)
            ok = set(ledger.sendable(r.rollout_id for r in rows)[0])
            rows = [r for r in rows if r.rollout_id in ok]
            if not rows:
                return
            replacer = self.replacer
            if not replacer.is_up(instance) or replacer.generation(instance) != generation:
                # it died while we waited at the gate (and may be back): the plan was for the
                # dead one (a restored claim pinned there is now unpinned); plan them again
                self.enqueue(r.rollout_id for r in rows)
                return
            config = self.config
            try:
                # bounded like a control call: a hung submission must not hold the gate (a
                # checkpoint's close waits for admissions in progress)
                with trio.fail_after(config.control_timeout_s + config.reply_grace_s):
                    stream = await self.gym.run(instance, rows)
            except GymInstanceDead as exc:
                # nothing was admitted: the rows keep their identity and go elsewhere
                self.replacer.report_dead(instance, generation, str(exc))
                self.enqueue(r.rollout_id for r in rows)
                return
            except GymAdmissionClosed:
                # a backend that refuses a whole submission at once (rather than row by row
                # on the stream): nothing was admitted; like refused rows (S2), the rows stay
                # RESERVED with their identity and are re-sent when admission reopens, free
                refused = [r.rollout_id for r in rows]
                self._refused += len(refused)
                self.metrics.inc(ADMISSION_CLOSED_ROWS, len(refused))
                streams.start_soon(self._requeue_refused, refused, gate_id)
                return
            except (trio.TooSlowError, GymCallTimeout):
                self._submission_timed_out(instance, gate_id, rows)
                return
            except GymUnavailable as exc:
                # Gym's control plane failed the submission (C3 ``run:error`` /
                # ``run:unpicklable``): nothing was admitted. The rows stay RESERVED with their
                # identity and are re-sent after a backoff, at no cost (like S2): a control-plane
                # failure says nothing about the rows. It is an outage of the infrastructure,
                # bounded by ``outage_budget_s`` like an episode's infra failure.
                self.metrics.inc("rollout/run_errors_total")
                delay = self.outage.down(f"gym instance {instance}: run failed: {exc}")
                streams.start_soon(self._resend_after, delay, [r.rollout_id for r in rows])
                return
            # the same mutation as the submission, nothing in between but the submission (S1)
            ids, orphans = self._dispatched(instance, gate_id, rows)
        if self.on_dispatch is not None:
            gone = set(orphans)
            self.on_dispatch(instance, [r for r in rows if r.rollout_id not in gone])
        self._sent += len(ids)
        self.metrics.inc("rollout/rows_dispatched_total", len(ids))
        streams.start_soon(self._consume, instance, gate_id, stream, ids, generation)

    def _submission_timed_out(self, instance: str, gate_id: int, rows: Sequence[RunRow]) -> None:
        """A submission that did not return in time: Gym may or may not run these rows, so
        they are treated as dispatched and lost, like an early stream end (S3): abandoned,
        queued for retirement, re-sent fresh."""
        ledger = self.ledger
        self.metrics.inc("rollout/run_submit_timeouts_total")
        lost = ledger.sendable(r.rollout_id for r in rows)[0]
        lost_touched = list(lost)
        # A lost claim of a restored episode (S11) may not have reached Gym, which then
        # still holds the exported episode unclaimed under its old ID: queue that for
        # ``retire_restored`` too (unknown if the claim did arrive). Otherwise the next
        # checkpoint would abort: Gym would export an episode the ledger does not hold.
        origins = [
            r.restored_from for r in rows if r.rollout_id in lost and r.restored_from is not None
        ]

        def submitted_and_lost() -> list[Attempt]:
            ledger.mark_dispatched(lost, instance, gate_id)
            if origins:
                ledger.record_orphans(origins, instance, restored=True)
            return self._abandon(lost, lost_touched)

        fresh = ledger.barrier.mutate_nowait(submitted_and_lost, lost_touched)
        self.enqueue(a.rollout_id for a in fresh)

    def _dispatched(
        self, instance: str, gate_id: int, rows: Sequence[RunRow]
    ) -> tuple[list[str], list[str]]:
        """Mark the rows Gym accepted dispatched, in one mutation (called right after the
        submission, in the same gate admission: S1): the ids sent, and the rows the ledger
        dropped while Gym accepted them, queued for retirement (S4)."""
        ledger = self.ledger
        ids: list[str] = []

        def dispatched() -> list[str]:
            sent, orphans = ledger.dispatch_sendable(
                [r.rollout_id for r in rows], instance, gate_id
            )
            if orphans:
                ledger.record_orphans(orphans, instance)
            ids.extend(sent)
            return orphans

        orphans = ledger.barrier.mutate_nowait(dispatched, ids)
        return ids, orphans

    async def _consume(
        self,
        instance: str,
        gate_id: int,
        stream: ReplyStream,
        ids: Sequence[str],
        generation: int,
    ) -> None:
        # in submission order (a dict): what is lost or abandoned is re-sent in that order,
        # whatever the string hashing (the simulation replays in process)
        outstanding = dict.fromkeys(ids)
        dead: GymInstanceDead | None = None
        unreachable: GymUnavailable | None = None
        self._streams += 1
        key = f"stream-{next(self._stream_ids)}"
        try:
            with self.deadlines.scope(
                key, f"/run of {len(ids)} rows on {instance}", self.request_timeout_s
            ):
                async for replies in stream:
                    await self._apply(replies, instance, gate_id, outstanding)
        except (GymUnavailable, DeadlineExpired) as exc:
            if isinstance(exc, GymInstanceDead):
                dead = exc
            elif isinstance(exc, GymUnavailable):
                unreachable = exc
            self.metrics.inc("rollout/stream_errors_total")
        except (BudgetExhausted, InfraOutage, EpisodeConfigFailed):
            # prompt-group recovery (S3), an outage past its budget, or a configuration wrong
            # for every row: the run cannot go on.
            # Retire what Gym still runs or holds for us, so nothing goes on mutating
            # environment state for a run that ends, then re-raise: the caller's retry (a
            # restart from the last snapshot) takes over.
            with trio.CancelScope(shield=True):
                await self._retire_everything()
            raise
        finally:
            self._streams -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()
        if dead is not None:
            self.replacer.report_dead(instance, generation, str(dead))
            if outstanding:
                await self._lost_to_death(outstanding)
        elif outstanding:
            await self._early_end(instance, outstanding, unreachable)

    async def _lost_to_death(self, outstanding: dict[str, None]) -> None:
        """A dead instance's stream: its rows in flight are abandoned and re-sent fresh, at no
        cost (the replacer does the same for everything else the instance held)."""
        ledger = self.ledger
        lost = [rid for rid in outstanding if ledger.is_in_flight(rid)]
        touched = list(lost)
        fresh = await ledger.barrier.mutate(
            self._rows_may_end(lambda: ledger.abandon(lost, spend=False), touched), touched
        )
        self.enqueue(a.rollout_id for a in fresh)

    async def _apply(
        self,
        replies: Sequence[RunReply],
        instance: str,
        gate_id: int,
        outstanding: dict[str, None],
    ) -> None:
        """Apply one batch (of ``instance``) in one mutation. Re-sends are scheduled, never
        awaited here: the consumer asks for the next batch at once, so replies leave the wire
        promptly (S9). Raises ``InfraOutage`` when an infra failure comes past the outage
        budget, ``EpisodeConfigFailed`` (before applying anything) when a reply of ours
        failed as config: nothing is failed, the rows stay in flight for a rerun."""
        _stop_on_config(replies, instance, outstanding)
        ledger = self.ledger
        refused: list[str] = []
        touched: list[str] = []
        resend: list[str] = []
        backoff: list[str] = []
        infra: list[str] = []
        answered = False

        complete = ledger.complete_with
        metrics = self.metrics

        def apply() -> None:
            nonlocal answered
            ready_before = ledger.ready_groups
            for reply in replies:
                rid = reply.rollout_id
                if rid not in outstanding:
                    continue  # not ours (or duplicated): ignore
                del outstanding[rid]
                touched.append(rid)
                failure: tuple[Literal["infra", "data"], str] | None = None
                if isinstance(reply, Completed):
                    reward = _finite_reward(reply.reward)
                    if reward is not None:
                        complete(rid, gate_id, reward, reply.turns, reply.payload)
                    else:  # the wire is not trusted: never a non-finite reward in the ledger
                        failure = (
                            "data",
                            f"episode {rid}: Gym replied Completed with reward "
                            f"{reply.reward!r}, not a finite number",
                        )
                elif isinstance(reply, Failed):  # config stopped the run (_stop_on_config)
                    failure = ("infra" if reply.failure_class == "infra" else "data", reply.message)
                if failure is None or failure[0] == "data":
                    answered = answered or not isinstance(reply, Refused)
                if failure is not None:
                    failure_class, message = failure
                    metrics.inc(EPISODE_FAILURES)
                    metrics.inc(
                        EPISODE_FAILURES_DATA if failure_class == "data" else EPISODE_FAILURES_INFRA
                    )
                    nxt = ledger.fail(rid, gate_id, failure_class, message)
                    if failure_class == "infra":
                        infra.append(f"{rid}: {message}")
                    if nxt is not None:
                        (backoff if failure_class == "infra" else resend).append(nxt.rollout_id)
                elif isinstance(reply, Refused) and ledger.refuse(rid):
                    refused.append(rid)
                    self._refused += 1
                    self.metrics.inc(ADMISSION_CLOSED_ROWS)
            if ledger.ready_groups > ready_before:
                touched.append(READY)  # a group is ready: the trainer looks

        await ledger.barrier.mutate(self._rows_may_end(apply, touched), touched)
        if answered:  # an episode ended on its own: its infrastructure works
            self.outage.up()
            self.replacer.served(instance)
        delay = 0.0
        for cause in infra:  # raises InfraOutage past the budget
            delay = self.outage.down(cause)
        if resend:
            self.enqueue(resend)
        assert self._nursery is not None
        if backoff:
            self._nursery.start_soon(self._resend_after, delay, backoff)
        if refused:  # back to RESERVED now; re-sent as soon as admission allows (S2)
            self._nursery.start_soon(self._requeue_refused, refused, gate_id)

    async def _resend_after(self, delay: float, ids: list[str]) -> None:
        """Re-send ``ids`` after ``delay`` (an outage's backoff, ``OutageClock.down``)."""
        if delay > 0:
            await trio.sleep(delay)
        self.enqueue(ids)

    def _rows_may_end(self, fn: Callable[[], T], touched: list[str]) -> Callable[[], T]:
        """``fn`` as a mutation that may end rows for good (a failure or an abandonment that
        spent a row's last attempt): when a row left the ledger, touch ``READY`` and wake the
        planning loop. Liveness rests on both, whatever ``max_rows_in_flight``:

        * the trainer waits on ``READY`` for "enough groups, or the dataset is done", and a row
          that fails for good may be what makes the dataset done;
        * a row that leaves the ledger frees room under ``max_rows_in_flight``, and only the
          planning loop reserves the next row, or learns that there is none left
          (``rows_exhausted``): asleep, it would leave the trainer waiting for nothing.

        Every mutation of the dispatcher that fails or abandons attempts runs through here.
        """
        ledger = self.ledger

        def mutation() -> T:
            rows_before = len(ledger.rows())
            try:
                return fn()
            finally:
                if len(ledger.rows()) < rows_before:
                    touched.append(READY)
                    self._kick.set()

        return mutation

    def _abandon(self, rollout_ids: Sequence[str], touched: list[str]) -> list[Attempt]:
        """``ledger.abandon`` (S3: each spends a row attempt) inside a mutation, with the
        wakeups of ``_rows_may_end`` when a row ran out of attempts. Returns the fresh
        attempts to send."""
        return self._rows_may_end(lambda: self.ledger.abandon(rollout_ids), touched)()

    async def _requeue_refused(self, ids: list[str], gate_id: int) -> None:
        # Refused under the gate ID we still hold open: Gym closed admission on its own (a
        # checkpoint we do not run, or a fault). Back off briefly instead of spinning.
        if self.gate.is_open and self.gate.gate_id == gate_id:
            await trio.sleep(self.config.backoff_s(1))
        self.enqueue(ids)

    async def _early_end(
        self,
        instance: str,
        outstanding: dict[str, None],
        unreachable: GymUnavailable | None = None,
    ) -> None:
        """S3: abandon, queue for retire, retire now under admission, re-send fresh.

        A stream that Gym ended without these rows spends a row attempt each (a row that
        keeps breaking its stream fails for good). One that failed because the instance could
        not be reached (``unreachable``: a connection that broke, a transport error; not a
        death) is an outage of the infrastructure: the rows spend nothing and are re-sent
        after the outage's backoff, and past ``outage_budget_s`` the run stops
        (``InfraOutage``)."""
        self._early += 1
        self.metrics.inc("rollout/early_stream_ends_total")
        ledger = self.ledger
        delay = 0.0
        if unreachable is not None:
            try:
                delay = self.outage.down(f"gym instance {instance}: reply stream: {unreachable}")
            except InfraOutage:
                with trio.CancelScope(shield=True):
                    await self._retire_everything()
                raise
        abandoned = [rid for rid in outstanding if ledger.is_in_flight(rid)]
        touched = list(abandoned)
        if unreachable is None:
            replacements = await ledger.barrier.mutate(
                lambda: self._abandon(abandoned, touched), touched
            )
            self.enqueue(a.rollout_id for a in replacements)
        else:
            replacements = await ledger.barrier.mutate(
                self._rows_may_end(lambda: ledger.abandon(abandoned, spend=False), touched),
                touched,
            )
            assert self._nursery is not None
            self._nursery.start_soon(
                self._resend_after, delay, [a.rollout_id for a in replacements]
            )
        if not abandoned or not self.replacer.is_up(instance):
            return
        generation = self.replacer.generation(instance)
        try:
            async with self.gate.admit():
                reply = await bounded_call(
                    instance,
                    "retire",
                    functools.partial(self.gym.retire, instance, abandoned),
                    self.config,
                )
        except GymUnavailable as exc:
            if isinstance(exc, GymInstanceDead):
                self.replacer.report_dead(instance, generation, str(exc))
            self._retire_failures += 1
            self.metrics.inc("rollout/retire_failures_total")
            return  # still queued: the next checkpoint retires them before it commits
        done = list(reply.retired) + list(reply.unknown)
        await ledger.barrier.mutate(lambda: ledger.forget_retired(done))
        self._retired_now += len(done)

    async def _retire_everything(self) -> None:
        """Best effort and bounded: retire every attempt Gym runs or holds for this ledger."""
        ledger = self.ledger
        queued = ledger.retire_queue()
        calls = {}
        for instance in self.gym.instances:
            if not self.replacer.is_up(instance):
                continue
            held = ledger.held_by(instance)
            ids = sorted(held | {i.rollout_id for i in queued.get(instance, ())})
            if ids:
                calls[instance] = functools.partial(self.gym.retire, instance, ids)
        if not calls:
            return
        with trio.move_on_after(self.config.control_timeout_s + self.config.reply_grace_s):
            async with self.gate.admit():  # never while a checkpoint holds Gym parked
                try:
                    await fan_out("retire", calls, self.config)
                except Exception:
                    self.metrics.inc("rollout/retire_failures_total")

    def statistics(self) -> DispatcherStatistics:
        return DispatcherStatistics(
            queued=len(self._queue),
            streams_open=self._streams,
            rows_sent=self._sent,
            refused=self._refused,
            early_ends=self._early,
            retired_now=self._retired_now,
            retire_failures=self._retire_failures,
            dead_instances=tuple(n for n in self.gym.instances if not self.replacer.is_up(n)),
            submissions=self._submissions,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<Dispatcher queued={s.queued} streams={s.streams_open} sent={s.rows_sent} "
            f"refused={s.refused} early_ends={s.early_ends}>"
        )
