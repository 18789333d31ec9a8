"""The report's sections on the drain: the sweep over rollouts in flight (ours against the
polling drain and trio's own wake floor), wake latency against the number pending, and how
each drain figure is measured."""

from __future__ import annotations

from pathlib import Path

from ._format import Add, fmt
from ._records import DrainResult

__all__ = ["drain_method_section", "drain_section"]


def drain_section(add: Add, drain: DrainResult, plots: list[Path]) -> None:
    n_head = drain.rollouts
    by_p = drain.by_pending()
    add("## Drain sweep")
    add("")
    add(
        "| in flight | ours wake median / p99 | ours per wakeup | A/B added per reply "
        "| polling wake median | polling per wakeup | loop stall ours / polling | trio floor "
        "| other processes' CPU |"
    )
    add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in drain.sweep:
        o, b = r.ours, r.baseline
        load = None if r.machine_load is None else r.machine_load.other_processes_cpu_pct
        add(
            f"| {r.in_flight:,} | {fmt(o.wake.median_us, ' µs')} / "
            f"{fmt(o.wake.p99_us, ' µs')} | {fmt(o.per_wakeup_us, ' µs', 2)} | "
            f"{fmt(o.per_reply_overhead_us, ' µs', 2)} | "
            f"{fmt(b.wake.median_ms, ' ms')} | {fmt(b.per_wakeup_us / 1e3, ' ms', 2)} | "
            f"{fmt(o.max_loop_stall_ms, ' ms', 2)} / {fmt(b.max_loop_stall_ms, ' ms', 1)} "
            f"| {fmt(r.trio_wake_floor.median_us, ' µs')} "
            f"| {fmt(load, ' %')} |"
        )
    add("")
    add(
        "Run-to-run variation: on this shared machine, microsecond-scale medians moved by up "
        "to about ±40 % between consecutive full runs (the machine-load column shows how busy "
        "the rest of the machine was); compare orders of magnitude and trends, not digits."
    )
    add("")
    add(
        f"Trials per size: {drain.config.trials} event-driven, "
        f"{drain.config.baseline_trials} polling (fewer above 200k). The polling drain's "
        "loop stall is its own scan: one synchronous O(ledger) step every 50 ms."
    )
    add("")
    if by_p:
        add(f"Wake latency against the number pending, {n_head:,} in flight:")
        add("")
        add(
            "| pending | wake median | wake p99 | reply → drain running | drain's own step "
            "| per wakeup |"
        )
        add("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for p, t in sorted(by_p.items()):
            add(
                f"| {p} | {fmt(t.wake_us_median, ' µs')} | {fmt(t.wake_us_p99, ' µs')} | "
                f"{fmt(t.reply_to_drain_running_us_median, ' µs')} | "
                f"{fmt(t.drain_step_us_median, ' µs')} | "
                f"{fmt(t.per_wakeup_us, ' µs', 2)} |"
            )
        add("")
    add("Plots: " + ", ".join(f"[`{p.name}`]({p.name})" for p in plots) + ".")
    add("")


def drain_method_section(add: Add, drain: DrainResult) -> None:
    head = drain.headline()
    add("## How each figure is measured")
    add("")
    add(
        "- **Wake latency**: `perf_counter_ns()` as the last statement of the last pending "
        "reply's mutation function → right after `runtime.wait_drained` returns. Includes the "
        "predicate evaluation for that mutation, the event, scheduling, and the drain's return."
    )
    add(
        "- **Per wakeup (ours)**: the drain's own condition, timed around each real evaluation "
        "(`wait_drained` gets a delegating proxy whose barrier wraps the condition it passes, "
        f"here `{head.ours.drain_primitive or '?'}`), median over all evaluations, "
        "minus the wrapper's cost. Cross-check (A/B): a pending reply's `mutate_nowait` with "
        "the drain parked minus without any waiter."
    )
    add(
        "- **Per wakeup (polling)**: one poll = rebuild the inventory by walking every attempt "
        "and grouping DISPATCHED ones by instance, then check the on-wire IDs "
        "(`benchmarks/baseline.py`). Delivery starts at a random phase of the 50 ms period."
    )
    add(
        "- **Loop stall**: a `trio.abc.Instrument` cuts the loop's time at every task start and "
        "every idle I/O wait; the longest interval is the longest time no other task could run "
        "(a task step plus scheduler work, GC included). Wall time and thread CPU time; a "
        "`gc.callbacks` monitor gives the collector's pauses, which are subtracted for the "
        '"excluding GC" figure. It runs in a separate pass of the same trials (half as many), '
        "because its CPU clock costs a system call per cut; the latency trials run without any "
        "instrument, and their GC pauses count toward the longest stall. Set-up and the "
        "top-up between trials are excluded."
    )
    add(
        "- **Wake breakdown** (reply → drain running, drain's own step): a `before_task_step` "
        "probe armed before the last reply, in the instrumented passes (adds about a "
        "microsecond)."
    )
    add("- **Floor**: `Event.set()` → the waiter running with the setter parked, same `trio.run`.")
    add("")
