"""InstanceReplacer: a Gym instance that dies is replaced, and the run goes on.

Why it looks like this
----------------------
A dead instance is noticed by whoever talks to it first: a submission (``run`` raises
``GymInstanceDead``), a reply stream (iterating it raises ``GymInstanceDead``), or a control
call of a checkpoint. Each of them calls ``report_dead(instance, generation)`` — synchronous,
idempotent, never blocking — and goes on. From that moment the instance is *down*: the
dispatcher sends nothing there and retires nothing there until it is back.

What the dead instance held is settled in one ledger mutation (``release_instance``), before
anything else happens to it: its attempts in flight are abandoned and re-sent as fresh attempts
(new rollout IDs; no row attempt or data budget spent — the row did nothing wrong); its
unclaimed restored episodes lose their restored state and run from scratch elsewhere (never
both claimed and re-run); everything stays queued for retirement under the instance's name, so
the replacement — which continues the dead one's environment state — frees the dead attempts'
sessions before the next checkpoint commits. A late reply of a dead attempt, should one still
arrive, names an attempt that is no longer current and is rejected by the ledger's identity and
gate-ID check (fencing).

Then the backend's ``replace`` is called (``ReplaceableGym``), bounded by
``replace_timeout_s`` plus the reply grace, in a task of this replacer's nursery, which the
runtime owns (``open_rollouts``). A backend without ``replace`` keeps the instance dead: its
checkpoints fail until ``max_consecutive_failures`` stops the run.

Outages and crash loops. Each instance has an ``OutageClock``: it goes down at a death and
comes up when the instance (its replacement) runs an episode to its end (``served``, told by
the dispatcher). Two budgets follow from it:

* A death of an instance that is *up* — it served since its last replacement, or was never
  replaced — is a crash: it counts against ``max_replacements`` within
  ``replacement_window_s``, one more stops the run with ``ReplacementsExhausted`` (exit code
  5, naming the instance, the count and the window), and the replacement starts at once.
* A death of an instance that is still *down* — its replacement died again before it served
  an episode (a disk that is full for a moment, a server restarting) — and every failed
  ``replace`` call belong to the same outage: they are not charged again, and the next
  ``replace`` waits a backoff that grows with the outage (``backoff_s`` of its failures), so
  a disk full for 1.5 s costs a handful of spaced replacements, not the budget in a few
  milliseconds. The outage is bounded by time: past ``outage_budget_s`` the run stops
  (``InfraOutage``, exit code 8) naming the instance and its last failure.

Generations: every replacement starts a new generation of the instance name. A report carries
the generation its observer talked to, so a stream of the dead generation that reports late
cannot take down the replacement.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import NoReturn

import attrs
import trio

from gymckpt.gym_adapter import GymBackend, can_replace
from gymckpt.runtime import (
    GymInstanceDead,
    GymUnavailable,
    InfraOutage,
    Metrics,
    RecoveryLedger,
    ReplacementsExhausted,
    RuntimeConfig,
)

from ._calls import bounded_call
from ._outage import OutageClock

__all__ = ["InstanceReplacer", "ReplacerStatistics", "dead_in", "replace_now"]

logger = logging.getLogger("gymckpt")


@attrs.frozen
class ReplacerStatistics:
    """Counts of one replacer (a snapshot). ``down`` are being replaced, ``lost`` cannot be."""

    deaths: int
    replacements: int
    failed_calls: int
    down: tuple[str, ...]
    lost: tuple[str, ...]
    released_attempts: int
    last_replacement_s: float | None
    """Time from the death being reported to the replacement serving, for the last one."""
    outages: tuple[str, ...] = ()
    """Instances in an outage: died, and not served an episode since (see ``served``)."""


@attrs.define(eq=False, slots=True)
class InstanceReplacer:
    """Replaces dead Gym instances within a budget; see the module docstring.

    ``on_released(rollout_ids)`` gets the RESERVED attempts to dispatch after a death;
    ``on_up(instance)`` is called when a replacement serves. Run it with
    ``await nursery.start(replacer.run)``; until then ``report_dead`` only marks instances
    down.
    """

    gym: GymBackend
    ledger: RecoveryLedger
    config: RuntimeConfig
    metrics: Metrics
    on_released: Callable[[Sequence[str]], None] = lambda _ids: None
    on_up: Callable[[str], None] = lambda _instance: None

    _generation: dict[str, int] = attrs.field(factory=dict, init=False)
    _down: dict[str, trio.Event] = attrs.field(factory=dict, init=False)
    _lost: set[str] = attrs.field(factory=set, init=False)
    _history: dict[str, deque[float]] = attrs.field(factory=dict, init=False)
    _outages: dict[str, OutageClock] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _deaths: int = attrs.field(default=0, init=False)
    _replaced: int = attrs.field(default=0, init=False)
    _failed_calls: int = attrs.field(default=0, init=False)
    _released: int = attrs.field(default=0, init=False)
    _last_s: float | None = attrs.field(default=None, init=False)

    # -- questions (synchronous, O(1)) -------------------------------------------------------

    def generation(self, instance: str) -> int:
        """How often ``instance`` was replaced: the generation a call now talks to."""
        return self._generation.get(instance, 0)

    def is_up(self, instance: str) -> bool:
        """Not dead, not being replaced: the dispatcher may send there."""
        return instance not in self._down and instance not in self._lost

    def live(self) -> list[str]:
        """The instances that are up, in topology order."""
        return [n for n in self.gym.instances if self.is_up(n)]

    @property
    def all_lost(self) -> bool:
        """Every instance is dead for good: nothing to dispatch to, ever."""
        return all(n in self._lost for n in self.gym.instances)

    # -- reports -----------------------------------------------------------------------------

    def report_dead(self, instance: str, generation: int, cause: str = "") -> bool:
        """``instance`` (generation ``generation``) was seen dead. Idempotent; a report about
        an older generation, or about an instance already down, changes nothing. Returns
        whether this report started a replacement."""
        if generation != self.generation(instance) or not self.is_up(instance):
            return False
        self._deaths += 1
        self.metrics.inc("rollout/dead_instances_total")
        if self._nursery is None:  # not started, or the run is ending: nothing to replace for
            self._down[instance] = trio.Event()
            return False
        logger.warning(
            "gym instance %s died%s; replacing it", instance, f" ({cause})" if cause else ""
        )
        self._down[instance] = trio.Event()
        self._nursery.start_soon(self._replace, instance, trio.current_time(), cause)
        return True

    def served(self, instance: str) -> None:
        """``instance`` ran an episode to its end (completed, or failed as data): it works, and
        its outage, if any, is over. O(1)."""
        clock = self._outages.get(instance)
        if clock is not None:
            clock.up()

    def _outage(self, instance: str) -> OutageClock:
        clock = self._outages.get(instance)
        if clock is None:
            clock = self._outages[instance] = OutageClock(f"gym instance {instance}", self.config)
        return clock

    async def wait_up(self, deadline: float) -> None:
        """Wait until no instance is being replaced, or ``deadline`` (a checkpoint does not
        start against an instance that is coming back). Returns either way."""
        with trio.move_on_at(deadline):
            while self._down:
                await next(iter(self._down.values())).wait()

    # -- the nursery ---------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the replacement tasks until cancelled. A spent budget raises
        ``ReplacementsExhausted`` from here, which ends the runtime's nursery (the run)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                # the nursery takes no new task once this block is left: a report from a
                # clean-up that outlives us is only noted
                self._nursery = None

    async def _replace(self, instance: str, seen_at: float, cause: str) -> None:
        ledger = self.ledger
        touched: list[str] = []

        def release() -> list[str]:
            touched.extend(ledger.held_by(instance))  # drain waiters on them wake
            fresh, unpinned = ledger.release_instance(instance)
            return [a.rollout_id for a in (*fresh, *unpinned)]

        ids = await ledger.barrier.mutate(release, touched)
        self._released += len(ids)
        self.metrics.inc("rollout/attempts_lost_to_dead_instances_total", len(ids))
        self.on_released(ids)
        if not can_replace(self.gym):
            self._lost.add(instance)
            self._down.pop(instance).set()
            logger.error(
                "gym instance %s is dead and %s cannot replace instances (no replace method): "
                "nothing is sent there any more and checkpoints fail until the run stops",
                instance,
                type(self.gym).__name__,
            )
            return
        replace = self.gym.replace  # type: ignore[attr-defined]
        bound = _replace_bound(self.config)
        outage = self._outage(instance)
        crashed = not outage.is_down  # it served since its last replacement (or never had one)
        try:
            delay = outage.down(f"died: {cause}" if cause else "died")
        except InfraOutage as exc:
            self._stop(instance, exc)
        if crashed:  # a crash, not an outage going on: charged, and replaced at once
            self._charge(instance)
            delay = 0.0
        attempt = 0
        while True:
            if delay > 0:
                self.metrics.inc("rollout/replace_backoffs_total")
                await trio.sleep(delay)
            attempt += 1
            try:
                await bounded_call(
                    instance, "replace", lambda deadline: replace(instance, deadline), bound
                )
            except GymUnavailable as exc:
                self._failed_calls += 1
                self.metrics.inc("rollout/replace_failures_total")
                logger.warning(
                    "replacing gym instance %s failed (try %d): %s", instance, attempt, exc
                )
                try:
                    delay = outage.down(f"replace failed: {exc}")
                except InfraOutage as stop:
                    self._stop(instance, stop)
                continue
            break
        self._generation[instance] = self.generation(instance) + 1
        self._replaced += 1
        self._last_s = trio.current_time() - seen_at
        self.metrics.inc("rollout/instances_replaced_total")
        self.metrics.set("rollout/last_replacement_s", self._last_s)
        logger.warning(
            "gym instance %s replaced in %.3fs (generation %d)",
            instance,
            self._last_s,
            self._generation[instance],
        )
        self._down.pop(instance).set()
        self.on_up(instance)

    def _charge(self, instance: str) -> None:
        """Count a crash of ``instance`` against ``max_replacements`` per
        ``replacement_window_s``; past it, stop the run (``ReplacementsExhausted``)."""
        history = self._history.setdefault(instance, deque())
        window = self.config.replacement_window_s
        now = trio.current_time()
        while history and history[0] <= now - window:
            history.popleft()
        if len(history) >= self.config.max_replacements:
            self._stop(instance, ReplacementsExhausted(instance, len(history), window))
        history.append(now)

    def _stop(self, instance: str, error: ReplacementsExhausted | InfraOutage) -> NoReturn:
        """``instance`` stays dead, and the run stops with ``error`` (logged first)."""
        self._lost.add(instance)
        self._down.pop(instance).set()
        logger.error("the run stops: %s", error)
        raise error

    def statistics(self) -> ReplacerStatistics:
        return ReplacerStatistics(
            deaths=self._deaths,
            replacements=self._replaced,
            failed_calls=self._failed_calls,
            down=tuple(sorted(self._down)),
            lost=tuple(sorted(self._lost)),
            released_attempts=self._released,
            last_replacement_s=self._last_s,
            outages=tuple(sorted(n for n, c in self._outages.items() if c.is_down)),
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<InstanceReplacer deaths={s.deaths} replaced={s.replacements} "
            f"down={len(s.down)} lost={len(s.lost)}>"
        )


def _replace_bound(config: RuntimeConfig) -> RuntimeConfig:
    """The config ``bounded_call`` bounds a replace with: ``replace_timeout_s`` in place of the
    control timeout (a new instance may take longer to come up than a control call)."""
    lease = max(
        config.lease_s,
        config.replace_timeout_s + config.reply_grace_s + config.drain_timeout_s + 1.0,
    )
    # a replace has nothing to align: the alignment timeout only has to stay below the bound
    alignment = min(config.alignment_timeout_s, config.replace_timeout_s / 2)
    return attrs.evolve(
        config,
        control_timeout_s=config.replace_timeout_s,
        lease_s=lease,
        alignment_timeout_s=alignment,
    )


def dead_in(exc: BaseException) -> list[GymInstanceDead]:
    """Every ``GymInstanceDead`` among ``exc``, its exception groups, causes and contexts."""
    found: list[GymInstanceDead] = []
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, GymInstanceDead):
            found.append(e)
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        if e.__cause__ is not None:
            stack.append(e.__cause__)
        if e.__context__ is not None:
            stack.append(e.__context__)
    return found


async def replace_now(gym: GymBackend, instance: str, config: RuntimeConfig) -> None:
    """One bounded ``replace`` of ``instance`` (the restore's, before any dispatch); raises
    ``GymInstanceDead`` when the backend cannot replace instances."""
    if not can_replace(gym):
        raise GymInstanceDead(instance, "replace")
    replace = gym.replace  # type: ignore[attr-defined]
    await bounded_call(
        instance, "replace", lambda deadline: replace(instance, deadline), _replace_bound(config)
    )
