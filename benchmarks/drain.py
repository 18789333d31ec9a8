"""Drain benchmark (docs/design.md S9, §5): how fast the checkpoint's drain wakes, what each
wakeup costs, and the same for the polling drain of the reference design, in the same run.

Setup (per in-flight size N, built before ``trio.run``)
-------------------------------------------------------
A ``RecoveryLedger`` (group size 8) with N attempts DISPATCHED over 16 instances, built through
``barrier.mutate_nowait`` and the ledger's public changes. During every trial a *traffic* task
keeps the barrier busy the way the data plane does: it completes other in-flight attempts one
mutation at a time (``await barrier.mutate``), and every 8 completions dispatches a new row and
trains finished groups, so N stays constant.

One trial (ours)
----------------
1. Pick P (default 300) random in-flight attempts: the episodes whose reply is on the wire.
2. Start ``runtime.wait_drained(ledger, pending, timeout)`` in a task; wait until it is parked;
   start the traffic task.
3. From the main task deliver the P replies one by one, each as
   ``await barrier.mutate(lambda: ledger.complete(rid, gate, result), touched=[rid])``, with
   ``--interleave`` (default 3) unrelated completions before each one.
4. **Wake latency** = ``perf_counter_ns()`` right after ``wait_drained`` returns minus
   ``perf_counter_ns()`` taken as the last statement inside the last pending reply's mutation
   function. It therefore includes the barrier evaluating the drain's predicate for that
   mutation, setting the waiter's event, the delivering task's end-of-mutation checkpoint,
   whatever other task trio schedules first (traffic), whatever the woken waiter does before it
   returns (unregistering keys, if the barrier makes it), and ``wait_drained``'s return.

Per-wakeup cost (ours), two honest methods, both reported
--------------------------------------------------------
* **Direct** (the headline ``per_wakeup_us_*``): ``wait_drained`` is handed a thin proxy of the
  ledger whose barrier wraps the drain's own condition in a ``perf_counter_ns`` pair before
  passing it to the real barrier — the predicate of ``wait_until`` or the per-key check of
  ``wait_settled``, whichever ``wait_drained`` uses (the JSON says which). Every evaluation of
  the real condition is timed; we report the median over all evaluations of all trials, minus
  the wrapper's own cost measured around an empty function in the same run. The evaluation
  counts (on entry, and per pending reply afterwards) come from
  ``barrier.statistics().predicate_evaluations``.
* **A/B** (``per_reply_overhead_us_*``): deliver P pending replies with
  ``barrier.mutate_nowait`` timed around the call (then one checkpoint, which is what
  ``mutate`` adds), once with the drain parked and once without any waiter, alternating; the
  difference of medians is everything the drain adds to a pending reply's mutation (key lookup,
  predicate, event). No traffic runs in these passes.

Baseline
--------
``benchmarks.baseline.polling_drain``: every 50 ms rebuild the full inventory (walk every
attempt, group in-flight ones by instance) and check the on-wire episodes against it. Trials are
the same, except that delivery starts after a random delay in [0, period) so that the last reply
lands at a random phase of the poll. Per-wakeup cost = duration of one poll (scan + check).

Loop stall
----------
A ``trio.abc.Instrument`` records the longest task step during the trials, separately for ours
and for the baseline (whose scan is one synchronous O(ledger) step). A ``gc.callbacks`` monitor
says how much of it was the cyclic garbage collector.

Floor
-----
In the same ``trio.run``: a task parks on ``trio.Event().wait()``; the main task takes
``perf_counter_ns()``, calls ``set()`` and checkpoints; the waiter takes ``perf_counter_ns()``
when it runs. Median over many repetitions.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import attrs
import trio
import trio.testing

from gymckpt.runtime import DrainTimeout, MutationBarrier, RecoveryLedger, wait_drained

from ._common import (
    GcMonitor,
    LoadProbe,
    LoopStallMonitor,
    Progress,
    label,
    median,
    p99,
    stall_breakdown,
    summarize_ns,
)
from ._fixture import InFlightFixture
from .baseline import group_by_instance, polling_drain

__all__ = ["DrainConfig", "run_drain"]

perf_ns = time.perf_counter_ns


@attrs.frozen
class DrainConfig:
    """The drain benchmark's knobs, validated on construction (and by ``attrs.evolve``)."""

    rollouts: int = 200_000
    sweep: tuple[int, ...] = (2_000, 20_000, 200_000)
    pending: int = attrs.field(default=300, validator=attrs.validators.ge(1))
    trials: int = attrs.field(default=200, validator=attrs.validators.ge(1))
    baseline_trials: int = attrs.field(default=20, validator=attrs.validators.ge(1))
    cost_trials: int = 10
    floor_iterations: int = 2000
    interleave: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    poll_period_s: float = attrs.field(default=0.05, validator=attrs.validators.gt(0.0))
    group_size: int = 8
    instances: int = 16
    timeout_s: float = 60.0
    seed: int = 1
    gc_freeze: bool = False
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> DrainConfig:
        return cls(
            rollouts=10_000,
            sweep=(2_000, 10_000),
            pending=100,
            trials=12,
            baseline_trials=3,
            cost_trials=2,
            floor_iterations=200,
            quick=True,
        )

    def __attrs_post_init__(self) -> None:
        for n in self.sizes():
            if n < 4 * self.pending:
                raise ValueError(
                    f"in-flight size {n} is too small for {self.pending} pending "
                    f"(need at least {4 * self.pending})"
                )

    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.sweep) | {self.rollouts}))

    def stall_trials(self) -> int:
        return max(5, self.trials // 2)

    def baseline_trials_for(self, n: int) -> int:
        return self.baseline_trials if n <= 200_000 else max(3, self.baseline_trials * 2 // 5)


# -- instrumentation -------------------------------------------------------------------------------


def _timed(predicate: Callable[[], bool], samples: list[int]) -> Callable[[], bool]:
    def timed() -> bool:
        t0 = perf_ns()
        ok = predicate()
        samples.append(perf_ns() - t0)
        return ok

    return timed


def _timed_key(
    settled: Callable[[Hashable], bool], samples: list[int]
) -> Callable[[Hashable], bool]:
    def timed(key: Hashable) -> bool:
        t0 = perf_ns()
        ok = settled(key)
        samples.append(perf_ns() - t0)
        return ok

    return timed


class _TimedBarrier:
    """Delegates to the real barrier; times every evaluation of the drain's condition, whichever
    waiting primitive ``wait_drained`` uses (``wait_until`` with a predicate over every pending
    ID, or ``wait_settled`` with a per-key check)."""

    def __init__(self, barrier: MutationBarrier, samples: list[int]) -> None:
        self._barrier = barrier
        self._samples = samples
        self.primitive = ""

    async def wait_until(self, predicate: Callable[[], bool], keys: Collection[Hashable]) -> None:
        self.primitive = "wait_until"
        await self._barrier.wait_until(_timed(predicate, self._samples), keys)

    async def wait_settled(self, keys: set[Hashable], settled: Callable[[Hashable], bool]) -> None:
        self.primitive = "wait_settled"
        await self._barrier.wait_settled(keys, _timed_key(settled, self._samples))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._barrier, name)


class _TimedLedger:
    """Delegates to the real ledger, except that ``barrier`` is a ``_TimedBarrier``.

    With ``keep_alive`` (a diagnostic, never for headline figures), the pending set that
    ``wait_drained`` builds with ``pending_among`` is also referenced from that list, so it is
    not freed on the wake path but at the start of the next trial.
    """

    def __init__(
        self, ledger: RecoveryLedger, samples: list[int], keep_alive: list[object] | None = None
    ) -> None:
        self._ledger = ledger
        self.barrier = _TimedBarrier(ledger.barrier, samples)
        self._keep = keep_alive

    def pending_among(self, rollout_ids: Iterable[str]) -> set[str]:
        out = self._ledger.pending_among(rollout_ids)
        if self._keep is not None:
            self._keep.append(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def _wrapper_overhead_ns(n: int = 20_000) -> int:
    samples: list[int] = []
    timed = _timed(lambda: False, samples)
    for _ in range(n):
        timed()
    return int(median(samples))


# -- one trial --------------------------------------------------------------------------------


@attrs.define
class _Stamps:
    last_reply_ns: int = 0
    woke_ns: int = 0
    done: bool = False


def _deliver(fx: InFlightFixture, rid: str, stamps: _Stamps) -> bool:
    ok = fx.complete_pending_fn(rid)()
    stamps.last_reply_ns = perf_ns()  # the last statement of the reply's mutation function
    return ok


async def _traffic(fx: InFlightFixture, stamps: _Stamps) -> None:
    while not stamps.done:
        await fx.unrelated_mutation()


async def _deliver_all(
    fx: InFlightFixture,
    pending: list[str],
    stamps: _Stamps,
    k: int,
    probe: _WakeProbe | None = None,
) -> None:
    barrier = fx.ledger.barrier
    last = len(pending) - 1
    for i, rid in enumerate(pending):
        for _ in range(k):
            await fx.unrelated_mutation()
        if i == last and probe is not None:
            probe.first_step_ns = 0
            probe.armed = True
        await barrier.mutate(functools.partial(_deliver, fx, rid, stamps), touched=(rid,))


@attrs.define
class _OursRecord:
    latency_ns: list[int] = attrs.field(factory=list)
    to_drain_step_ns: list[int] = attrs.field(factory=list)
    drain_step_ns: list[int] = attrs.field(factory=list)
    predicate_ns: list[int] = attrs.field(factory=list)
    evaluations: list[int] = attrs.field(factory=list)
    entry_evaluations: list[int] = attrs.field(factory=list)
    reply_evaluations: list[int] = attrs.field(factory=list)
    primitive: str = ""
    mutations: list[int] = attrs.field(factory=list)
    drained: list[int] = attrs.field(factory=list)


async def _trial_ours(
    fx: InFlightFixture,
    cfg: DrainConfig,
    rec: _OursRecord,
    probe: _WakeProbe | None,
    pending_count: int | None = None,
    keep_alive: list[object] | None = None,
) -> None:
    ledger = fx.ledger
    barrier = ledger.barrier
    if keep_alive:
        keep_alive.clear()  # free the previous trial's sets here, outside any measurement
    pending = fx.pick_pending(cfg.pending if pending_count is None else pending_count)
    stamps = _Stamps()
    proxy = _TimedLedger(ledger, rec.predicate_ns, keep_alive)
    timed = cast(RecoveryLedger, proxy)
    before = barrier.statistics()

    async def drain() -> None:
        n = await wait_drained(timed, pending, cfg.timeout_s)
        stamps.woke_ns = perf_ns()
        stamps.done = True
        rec.drained.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, name="drain")
        await trio.testing.wait_all_tasks_blocked()
        parked = barrier.statistics()
        nursery.start_soon(_traffic, fx, stamps, name="traffic")
        await _deliver_all(fx, pending, stamps, cfg.interleave, probe)
    after = barrier.statistics()
    rec.primitive = proxy.barrier.primitive
    rec.entry_evaluations.append(parked.predicate_evaluations - before.predicate_evaluations)
    rec.reply_evaluations.append(after.predicate_evaluations - parked.predicate_evaluations)
    rec.latency_ns.append(stamps.woke_ns - stamps.last_reply_ns)
    if probe is not None and probe.first_step_ns:
        rec.to_drain_step_ns.append(probe.first_step_ns - stamps.last_reply_ns)
        rec.drain_step_ns.append(stamps.woke_ns - probe.first_step_ns)
    rec.evaluations.append(after.predicate_evaluations - before.predicate_evaluations)
    rec.mutations.append(after.mutations - before.mutations)


async def _cost_pass(
    fx: InFlightFixture, cfg: DrainConfig, with_drain: bool, out: list[int]
) -> None:
    ledger = fx.ledger
    pending = fx.pick_pending(cfg.pending)
    async with trio.open_nursery() as nursery:
        if with_drain:
            nursery.start_soon(wait_drained, ledger, pending, cfg.timeout_s, name="drain")
            await trio.testing.wait_all_tasks_blocked()
        mutate_nowait = ledger.barrier.mutate_nowait
        for rid in pending:
            fn, touched = fx.complete_pending_fn(rid), (rid,)
            t0 = perf_ns()
            mutate_nowait(fn, touched)
            out.append(perf_ns() - t0)
            await trio.lowlevel.checkpoint()


@attrs.define
class _BaselineRecord:
    latency_ns: list[int] = attrs.field(factory=list)
    scan_ns: list[int] = attrs.field(factory=list)
    scanned: list[int] = attrs.field(factory=list)
    polls: list[int] = attrs.field(factory=list)

    def on_scan(self, duration_ns: int, attempts: int) -> None:
        self.scan_ns.append(duration_ns)
        self.scanned.append(attempts)


async def _trial_baseline(fx: InFlightFixture, cfg: DrainConfig, rec: _BaselineRecord) -> None:
    ledger = fx.ledger
    pending = fx.pick_pending(cfg.pending)
    on_wire = group_by_instance(ledger, pending)
    stamps = _Stamps()

    async def drain() -> None:
        polls = await polling_drain(
            ledger, on_wire, cfg.timeout_s, period_s=cfg.poll_period_s, on_scan=rec.on_scan
        )
        stamps.woke_ns = perf_ns()
        stamps.done = True
        rec.polls.append(polls)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, name="polling-drain")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_traffic, fx, stamps, name="traffic")
        await trio.sleep(fx.rng.uniform(0.0, cfg.poll_period_s))
        await _deliver_all(fx, pending, stamps, cfg.interleave)
    rec.latency_ns.append(stamps.woke_ns - stamps.last_reply_ns)


async def _trio_wake_floor(iterations: int) -> list[int]:
    """Event.set() -> the waiter running, with nothing else runnable (the setter parks)."""
    samples: list[int] = []
    t_set = [0]

    async def waiter(event: trio.Event, ack: trio.Event) -> None:
        await event.wait()
        samples.append(perf_ns() - t_set[0])
        ack.set()

    async with trio.open_nursery() as nursery:
        for _ in range(iterations):
            event, ack = trio.Event(), trio.Event()
            nursery.start_soon(waiter, event, ack)
            await trio.testing.wait_all_tasks_blocked()
            t_set[0] = perf_ns()
            event.set()
            await ack.wait()
    return samples


class _WakeProbe(trio.abc.Instrument):
    """Records when the task named ``drain`` first runs after ``armed`` is set: splits the wake
    latency into scheduling (reply -> drain task running) and the drain task's own step."""

    def __init__(self) -> None:
        self.armed = False
        self.first_step_ns = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.armed and task.name == "drain":
            self.first_step_ns = perf_ns()
            self.armed = False


# -- one size ------------------------------------------------------------------------------------


async def _between(
    fx: InFlightFixture, n: int, monitors: tuple[Any, ...], freeze_log: list[int] | None
) -> None:
    """Top the ledger up to ``n`` in flight outside any measurement window.

    In the ``gc_freeze`` variant (``freeze_log`` given) also do what a trainer would do after
    each step: ``gc.collect()`` (it only scans what is not frozen yet) then ``gc.freeze()``, so
    the collector never walks the ledger's long-lived objects again; its cost is logged.
    """
    saved = [m.active for m in monitors]
    for m in monitors:
        m.active = False
    fx.maintain(n)
    if freeze_log is not None:
        t0 = perf_ns()
        gc.collect()
        gc.freeze()
        freeze_log.append(perf_ns() - t0)
    await trio.lowlevel.checkpoint()  # end this step while the monitors are off
    for m, was in zip(monitors, saved, strict=True):
        m.active = was


def _pending_sweep_sizes(cfg: DrainConfig) -> tuple[int, ...]:
    return tuple(sorted({p for p in (1, 10, 100, cfg.pending) if p <= cfg.pending}))


@contextmanager
def _instrumented(*instruments: trio.abc.Instrument) -> Iterator[None]:
    for ins in instruments:
        trio.lowlevel.add_instrument(ins)
    try:
        yield
    finally:
        for ins in instruments:
            trio.lowlevel.remove_instrument(ins)


def _stall_report(stall: LoopStallMonitor, gcm: GcMonitor) -> dict[str, Any]:
    return stall.report() | stall_breakdown(stall, gcm) | gcm.report()


async def _ours(
    fx: InFlightFixture,
    n: int,
    cfg: DrainConfig,
    gcm: GcMonitor,
    progress: Progress,
    tag: str,
    freeze_log: list[int] | None,
) -> dict[str, Any]:
    """Event-driven drain: latency trials (no instrument), then an instrumented stall pass."""
    ours = _OursRecord()
    gcm.reset()
    gcm.active = True
    t0 = time.monotonic()
    for i in range(cfg.trials):
        await _between(fx, n, (gcm,), freeze_log)
        await _trial_ours(fx, cfg, ours, None)
        if progress.enabled and (time.monotonic() - t0 > 2.0 or i + 1 == cfg.trials):
            t0 = time.monotonic()
            progress(
                f"{tag}: event-driven trial {i + 1}/{cfg.trials}, "
                f"median wake {median(ours.latency_ns) / 1e3:.1f} us"
            )
    gcm.active = False
    latency_gc = gcm.report()

    # stall pass: same trials with the loop-stall monitor (wall + CPU clocks)
    stall = LoopStallMonitor(cpu=True)
    instrumented = _OursRecord()
    gcm.reset()
    with _instrumented(stall):
        stall.active = gcm.active = True
        for _ in range(cfg.stall_trials()):
            await _between(fx, n, (stall, gcm), freeze_log)
            await _trial_ours(fx, cfg, instrumented, None)
        stall.active = gcm.active = False
    stall_pass = _stall_report(stall, gcm)
    progress(
        f"{tag}: stall pass: longest {stall_pass['max_loop_stall_ms']:.2f} ms "
        f"({stall_pass['max_stall_task']}), longest GC pause "
        f"{max(latency_gc['max_gc_pause_ms'], stall_pass['max_gc_pause_ms']):.2f} ms"
    )
    return {
        "record": ours,
        "instrumented": instrumented,
        "latency_gc": latency_gc,
        "stall_pass": stall_pass,
    }


async def _measure_size(
    fx: InFlightFixture,
    n: int,
    cfg: DrainConfig,
    gcm: GcMonitor,
    progress: Progress,
    headline: bool,
    ours_only: bool,
) -> dict[str, Any]:
    tag = f"drain N={n:,}" + (" (gc.freeze)" if cfg.gc_freeze else "")
    wrapper_ns = _wrapper_overhead_ns()
    floor = await _trio_wake_floor(cfg.floor_iterations)

    freeze_log: list[int] | None = [] if cfg.gc_freeze else None
    o = await _ours(fx, n, cfg, gcm, progress, tag, freeze_log)
    ours_out = _ours_figures(o, cfg, wrapper_ns)
    if freeze_log:
        ours_out["between_trials_collect_and_freeze_ms"] = summarize_ns(freeze_log, "ms")
    result: dict[str, Any] = {
        "ledger_attempts": fx.ledger.statistics().attempts,
        "trio_wake_floor": summarize_ns(floor, "us"),
        "ours": ours_out,
    }
    if ours_only:
        return result
    await _reply_cost(fx, n, cfg, freeze_log, ours_out)
    by_pending: list[dict[str, Any]] = []
    if headline:
        by_pending, control = await _wake_by_pending(
            fx, n, cfg, wrapper_ns, freeze_log, progress, tag
        )
        ours_out["one_pending_after_same_traffic"] = control
    ours_out["wake_by_pending"] = by_pending
    at_p = [r for r in by_pending if r["pending"] == cfg.pending]
    ours_out["reply_to_drain_running_us_median"] = (
        at_p[0]["reply_to_drain_running_us_median"] if at_p else None
    )
    ours_out["drain_step_us_median"] = at_p[0]["drain_step_us_median"] if at_p else None
    result["baseline"] = await _baseline(fx, n, cfg, gcm, freeze_log, progress, tag)
    return result


def _ours_figures(o: dict[str, Any], cfg: DrainConfig, wrapper_ns: float) -> dict[str, Any]:
    """The event-driven drain's figures from ``_ours``' records, the timing wrapper's cost
    subtracted from each predicate evaluation."""
    ours: _OursRecord = o["record"]
    inst: _OursRecord = o["instrumented"]
    latency_gc: dict[str, Any] = o["latency_gc"]
    stall_pass: dict[str, Any] = o["stall_pass"]
    max_gc = max(latency_gc["max_gc_pause_ms"], stall_pass["max_gc_pause_ms"])
    per_wakeup_raw = median(ours.predicate_ns)
    evals_per_trial = median(ours.evaluations)
    return {
        "trials": cfg.trials,
        "wake": summarize_ns(ours.latency_ns, "us"),
        "per_wakeup_us": round(max(0.0, per_wakeup_raw - wrapper_ns) / 1e3, 3),
        "per_wakeup_p99_us": round(max(0.0, p99(ours.predicate_ns) - wrapper_ns) / 1e3, 3),
        "per_wakeup_raw_median_us": round(per_wakeup_raw / 1e3, 3),
        "timing_wrapper_overhead_us": round(wrapper_ns / 1e3, 3),
        "timed_evaluations": len(ours.predicate_ns),
        "drain_primitive": ours.primitive,
        "predicate_evaluations_per_trial": evals_per_trial,
        "predicate_evaluations_on_entry": median(ours.entry_evaluations),
        # evaluations triggered by mutations (replies and traffic), per pending reply
        "predicate_evaluations_per_reply": round(median(ours.reply_evaluations) / cfg.pending, 4),
        "mutations_per_trial": median(ours.mutations),
        "pending_drained_per_trial": median(ours.drained),
        # longest stall seen: the instrumented pass, or a GC pause in any pass
        "max_loop_stall_ms": max(stall_pass["max_loop_stall_ms"], max_gc),
        "max_gc_pause_ms": max_gc,
        "latency_trials_gc": latency_gc,
        "stall_pass": {
            "trials": cfg.stall_trials(),
            **stall_pass,
            "wake": summarize_ns(inst.latency_ns, "us"),
        },
    }


async def _reply_cost(
    fx: InFlightFixture,
    n: int,
    cfg: DrainConfig,
    freeze_log: list[int] | None,
    ours_out: dict[str, Any],
) -> None:
    """A/B cost of a pending reply's mutation with and without the drain parked."""
    with_drain: list[int] = []
    without: list[int] = []
    for _ in range(cfg.cost_trials):
        await _between(fx, n, (), freeze_log)
        await _cost_pass(fx, cfg, True, with_drain)
        await _between(fx, n, (), freeze_log)
        await _cost_pass(fx, cfg, False, without)
    ours_out["per_reply_mutation_with_drain_us"] = round(median(with_drain) / 1e3, 3)
    ours_out["per_reply_mutation_without_waiter_us"] = round(median(without) / 1e3, 3)
    ours_out["per_reply_overhead_us"] = round((median(with_drain) - median(without)) / 1e3, 3)


async def _wake_by_pending(
    fx: InFlightFixture,
    n: int,
    cfg: DrainConfig,
    wrapper_ns: float,
    freeze_log: list[int] | None,
    progress: Progress,
    tag: str,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """At the headline size, with the probe installed: the wake latency against the number
    pending (the largest also with the pending set freed after the measurement), and the
    control: one pending reply after as much traffic as the largest trial's."""
    by_pending: list[dict[str, Any]] = []
    probe = _WakeProbe()
    with _instrumented(probe):
        for p in _pending_sweep_sizes(cfg):
            rec = _OursRecord()
            for _ in range(max(10, cfg.trials // 4)):
                await _between(fx, n, (), freeze_log)
                await _trial_ours(fx, cfg, rec, probe, pending_count=p)
            by_pending.append(
                {
                    "pending": p,
                    "trials": len(rec.latency_ns),
                    "wake_us_median": round(median(rec.latency_ns) / 1e3, 3),
                    "wake_us_p99": round(p99(rec.latency_ns) / 1e3, 3),
                    "reply_to_drain_running_us_median": round(
                        median(rec.to_drain_step_ns) / 1e3, 3
                    ),
                    "drain_step_us_median": round(median(rec.drain_step_ns) / 1e3, 3),
                    "per_wakeup_us": round(
                        max(0.0, median(rec.predicate_ns) - wrapper_ns) / 1e3, 3
                    ),
                }
            )
            progress(f"{tag}: {p} pending: median wake {by_pending[-1]['wake_us_median']:.1f} us")
        # diagnostic: the same at the largest P with the drain's pending set freed after
        # the measurement instead of on the wake path
        kept = _OursRecord()
        keep: list[object] = []
        for _ in range(max(10, cfg.trials // 4)):
            await _between(fx, n, (), freeze_log)
            await _trial_ours(fx, cfg, kept, probe, keep_alive=keep)
        keep.clear()
        # control: ONE pending reply, delivered after as many unrelated mutations as the
        # largest-P trial runs before its last reply (does the cost follow P or traffic?)
        ctrl = _OursRecord()
        ctrl_cfg = attrs.evolve(cfg, interleave=(cfg.interleave + 1) * cfg.pending)
        for _ in range(max(10, cfg.trials // 4)):
            await _between(fx, n, (), freeze_log)
            await _trial_ours(fx, ctrl_cfg, ctrl, probe, pending_count=1)
        control = {
            "unrelated_mutations_before": ctrl_cfg.interleave,
            "wake_us_median": round(median(ctrl.latency_ns) / 1e3, 3),
            "reply_to_drain_running_us_median": round(median(ctrl.to_drain_step_ns) / 1e3, 3),
            "drain_step_us_median": round(median(ctrl.drain_step_ns) / 1e3, 3),
        }
        by_pending[-1]["wake_us_median_pending_set_freed_later"] = round(
            median(kept.latency_ns) / 1e3, 3
        )
        by_pending[-1]["drain_step_us_median_pending_set_freed_later"] = round(
            median(kept.drain_step_ns) / 1e3, 3
        )
    return by_pending, control


async def _baseline(
    fx: InFlightFixture,
    n: int,
    cfg: DrainConfig,
    gcm: GcMonitor,
    freeze_log: list[int] | None,
    progress: Progress,
    tag: str,
) -> dict[str, Any]:
    """The polling drain, with the stall monitor throughout (its latencies are milliseconds)."""
    base = _BaselineRecord()
    stall = LoopStallMonitor(cpu=True)
    gcm.reset()
    trials = cfg.baseline_trials_for(n)
    with _instrumented(stall):
        stall.active = gcm.active = True
        for i in range(trials):
            await _between(fx, n, (stall, gcm), freeze_log)
            await _trial_baseline(fx, cfg, base)
            progress(
                f"{tag}: polling trial {i + 1}/{trials}, "
                f"median wake {median(base.latency_ns) / 1e6:.1f} ms, "
                f"scan {median(base.scan_ns) / 1e6:.2f} ms"
            )
        stall.active = gcm.active = False
    return {
        "trials": trials,
        "wake": summarize_ns(base.latency_ns, "ms"),
        "per_wakeup_us": round(median(base.scan_ns) / 1e3, 3),
        "per_wakeup_p99_us": round(p99(base.scan_ns) / 1e3, 3),
        "scans": len(base.scan_ns),
        "polls_per_trial": median(base.polls),
        "attempts_scanned_per_wakeup": median(base.scanned),
        **_stall_report(stall, gcm),
    }


def _measure(
    n: int, cfg: DrainConfig, progress: Progress, *, headline: bool, ours_only: bool = False
) -> dict[str, Any]:
    progress(f"drain N={n:,}: building ledger")
    t0 = time.monotonic()
    fx = InFlightFixture.build(
        n,
        group_size=cfg.group_size,
        instances=cfg.instances,
        seed=cfg.seed + n,
        progress=progress,
    )
    build_s = time.monotonic() - t0
    gc.collect()
    if cfg.gc_freeze:
        gc.freeze()
    load = LoadProbe()
    try:
        with GcMonitor() as gcm:
            result = trio.run(_measure_size, fx, n, cfg, gcm, progress, headline, ours_only)
    except DrainTimeout as exc:  # pragma: no cover - would be a runtime bug
        raise RuntimeError(f"drain benchmark at N={n}: {exc}") from exc
    finally:
        if cfg.gc_freeze:
            gc.unfreeze()
    machine_load = load.report()
    del fx
    gc.collect()
    return {
        "in_flight": n,
        "build_s": round(build_s, 2),
        "gc_freeze": cfg.gc_freeze,
        "machine_load": machine_load,
        **result,
    }


# -- the whole benchmark ----------------------------------------------------------------------


def run_drain(
    cfg: DrainConfig, progress: Progress, *, gc_freeze_variant: bool = False
) -> dict[str, Any]:
    """Run the sweep and return the JSON-ready result (headline keys first).

    With ``gc_freeze_variant``, the event-driven trials are run once more at the headline size
    with ``gc.freeze()`` after the ledger is built and ``gc.collect(); gc.freeze()`` between
    trials (what it would take to remove the collector's pauses), reported under
    ``gc_freeze_variant``.
    """
    sweep: list[dict[str, Any]] = []
    head_n = min(cfg.sizes(), key=lambda k: abs(k - cfg.rollouts))
    for n in cfg.sizes():
        sweep.append(_measure(n, cfg, progress, headline=n == head_n))
        r = sweep[-1]
        progress(
            f"drain N={n:,}: ours wake {r['ours']['wake']['median_us']:.1f} us, "
            f"per wakeup {r['ours']['per_wakeup_us']:.2f} us; polling wake "
            f"{r['baseline']['wake']['median_ms']:.1f} ms, per wakeup "
            f"{r['baseline']['per_wakeup_us'] / 1e3:.2f} ms"
        )
    by_n = {r["in_flight"]: r for r in sweep}
    head = _nearest(by_n, cfg.rollouts)
    ours_ms = head["ours"]["wake"]["median_us"] / 1e3
    base_ms = head["baseline"]["wake"]["median_ms"]

    out: dict[str, Any] = {
        "rollouts": head["in_flight"],
        "pending": cfg.pending,
        "drain_wake_ms_median": round(ours_ms, 6),
        "drain_wake_ms_p99": round(head["ours"]["wake"]["p99_us"] / 1e3, 6),
        "drain_wake_us_median": head["ours"]["wake"]["median_us"],
        "baseline_wake_ms_median": base_ms,
        "baseline_wake_ms_p99": head["baseline"]["wake"]["p99_ms"],
        "speedup": round(base_ms / ours_ms, 1) if ours_ms > 0 else None,
        "trio_wake_floor_us": head["trio_wake_floor"]["median_us"],
        "trio_wake_floor_us_p99": head["trio_wake_floor"]["p99_us"],
    }
    out.update(_scaling(sweep, by_n, head))
    stall_pass = head["ours"]["stall_pass"]
    out.update(
        {
            "max_loop_stall_ms": head["ours"]["max_loop_stall_ms"],
            "max_loop_stall_excluding_gc_ms": stall_pass["max_loop_stall_excluding_gc_ms"],
            "max_loop_stall_cpu_ms": stall_pass["max_loop_stall_cpu_ms"],
            "max_loop_stall_cpu_excluding_gc_ms": stall_pass["max_loop_stall_cpu_excluding_gc_ms"],
            "max_gc_pause_ms": head["ours"]["max_gc_pause_ms"],
            "max_loop_stall_ms_all_sizes": max(r["ours"]["max_loop_stall_ms"] for r in sweep),
            "baseline_max_loop_stall_ms": head["baseline"]["max_loop_stall_ms"],
            "predicate_evaluations_per_reply": head["ours"]["predicate_evaluations_per_reply"],
            "mutations_per_trial": head["ours"]["mutations_per_trial"],
            "baseline_scans": head["baseline"]["scans"],
            "per_reply_overhead_us": head["ours"]["per_reply_overhead_us"],
            "reply_to_drain_running_us_median": head["ours"]["reply_to_drain_running_us_median"],
            "drain_step_us_median": head["ours"]["drain_step_us_median"],
            "wake_by_pending": head["ours"]["wake_by_pending"],
            "one_pending_after_same_traffic": head["ours"].get("one_pending_after_same_traffic"),
            "config": attrs.asdict(cfg),
            "sweep": sweep,
        }
    )
    if gc_freeze_variant:
        out["gc_freeze_variant"] = _gc_freeze_variant(cfg, head["in_flight"], progress)
    return out


def _scaling(
    sweep: list[dict[str, Any]], by_n: dict[int, dict[str, Any]], head: dict[str, Any]
) -> dict[str, Any]:
    """Per-wakeup cost at every size, ours and polling, and how each grows from 2k to the
    largest (200k, or the headline size)."""
    out: dict[str, Any] = {}
    small = by_n.get(_nearest_key(by_n, 2_000))
    for r in sweep:
        out[f"per_wakeup_us_{label(r['in_flight'])}"] = r["ours"]["per_wakeup_us"]
    out.setdefault("per_wakeup_us_2k", None)
    out.setdefault("per_wakeup_us_200k", None)
    for r in sweep:
        out[f"baseline_per_wakeup_us_{label(r['in_flight'])}"] = r["baseline"]["per_wakeup_us"]
    big = by_n.get(200_000, head)
    if small is not None and small["ours"]["per_wakeup_us"] > 0:
        out["per_wakeup_ratio_large_vs_2k"] = round(
            big["ours"]["per_wakeup_us"] / small["ours"]["per_wakeup_us"], 3
        )
        out["baseline_per_wakeup_ratio_large_vs_2k"] = round(
            big["baseline"]["per_wakeup_us"] / small["baseline"]["per_wakeup_us"], 1
        )
        out["ratio_sizes"] = [small["in_flight"], big["in_flight"]]
    return out


def _gc_freeze_variant(cfg: DrainConfig, n: int, progress: Progress) -> dict[str, Any]:
    """The event-driven trials once more at ``n`` with the collector frozen."""
    frozen = attrs.evolve(cfg, gc_freeze=True)
    r = _measure(n, frozen, progress, headline=False, ours_only=True)
    o = r["ours"]
    return {
        "in_flight": r["in_flight"],
        "drain_wake_us_median": o["wake"]["median_us"],
        "drain_wake_ms_p99": round(o["wake"]["p99_us"] / 1e3, 6),
        "max_loop_stall_ms": o["max_loop_stall_ms"],
        "max_loop_stall_excluding_gc_ms": o["stall_pass"]["max_loop_stall_excluding_gc_ms"],
        "max_loop_stall_cpu_ms": o["stall_pass"]["max_loop_stall_cpu_ms"],
        "max_loop_stall_cpu_excluding_gc_ms": o["stall_pass"]["max_loop_stall_cpu_excluding_gc_ms"],
        "max_gc_pause_ms": o["max_gc_pause_ms"],
        "collect_and_freeze_between_trials": o.get("between_trials_collect_and_freeze_ms"),
        "machine_load": r["machine_load"],
        "detail": r,
    }


def _nearest_key(by_n: dict[int, Any], n: int) -> int:
    return min(by_n, key=lambda k: abs(k - n))


def _nearest(by_n: dict[int, dict[str, Any]], n: int) -> dict[str, Any]:
    return by_n[_nearest_key(by_n, n)]
