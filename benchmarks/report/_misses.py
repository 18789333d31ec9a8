"""Where a target is missed, and what it would take: one paragraph per missed target, saying
what was measured, where the time went and what would bring the figure under its target."""

from __future__ import annotations

from ._format import TIMES, first_line, fmt, stall
from ._records import (
    CheckpointRayResult,
    CheckpointResult,
    DrainResult,
    DrainWakeControl,
    FanoutResult,
    OursDrain,
    StallPass,
    SweepRow,
    WakeByPending,
)
from ._targets import Status, TargetRow

__all__ = ["miss_lines"]


def _traffic_text(
    drain: DrainResult,
    head: SweepRow,
    ctrl: DrainWakeControl,
    p1: WakeByPending | None,
    pp: WakeByPending | None,
    sweep_txt: str,
) -> str:
    """The pending sweep beside the control (one reply after as much traffic): whether the
    wake's excess follows the traffic or the number pending, and what it would take."""
    kept = pp.wake_us_median_pending_set_freed_later if pp else None
    kept_step = pp.drain_step_us_median_pending_set_freed_later if pp else None
    traffic_driven = pp is not None and ctrl.wake_us_median >= 0.7 * pp.wake_us_median
    return (
        f"Across the pending sweep ({sweep_txt}; plot `drain_wake_vs_pending.png`) the "
        "drain's step grows although the barrier's final wake is O(1) by design "
        "(`wait_settled` drops each key as its reply lands, and each evaluation costs "
        f"{fmt(head.ours.per_wakeup_us, ' µs', 2)}). The control says what it "
        f"follows: **one** pending reply delivered after "
        f"{ctrl.unrelated_mutations_before:,} unrelated mutations (as many as the "
        f"{drain.pending}-pending trial runs) wakes in "
        f"{fmt(ctrl.wake_us_median, ' µs')} (drain's own step "
        f"{fmt(ctrl.drain_step_us_median, ' µs')}), against "
        f"{fmt(p1.wake_us_median if p1 else None, ' µs')} for one reply after 3. "
        + (
            "So the excess follows the traffic the loop ran while the drain waited, not "
            "the number pending: resuming a task whose frames, cancel scopes and sets "
            "went cold in cache (and paying the young-generation collections that "
            "traffic triggers) costs tens of microseconds in CPython. "
            if traffic_driven
            else "So part of the excess follows the number pending. "
        )
        + "Freeing the drain's pending set after the measurement instead of on the "
        f"wake path gives {fmt(kept, ' µs')} (drain's step "
        f"{fmt(kept_step, ' µs')}). *What it would take:* the drain's own algorithm "
        "is already O(1) per reply and at the wake; what is left is interpreter and "
        "machine overhead — keep the drain's structures alive past the wake, allocate "
        "less per reply mutation (fewer young-generation collections), and give the "
        "trainer's loop a core of its own. We found no change inside the runtime that "
        "brings the median under 50 µs on this shared 2-core machine."
    )


def _wake_miss(
    drain: DrainResult, head: SweepRow, by_p: dict[int, WakeByPending], floor: float | None
) -> str:
    """Why the drain wake median is above its target, from the probed trials."""
    wake_us = drain.drain_wake_us_median
    sched = drain.reply_to_drain_running_us_median
    step = drain.drain_step_us_median
    p1 = by_p.get(1)
    pp = by_p.get(drain.pending)
    sweep_txt = ", ".join(
        f"{p} pending → {fmt(r.wake_us_median, ' µs')}" for p, r in sorted(by_p.items())
    )
    grows = (
        p1 is not None
        and pp is not None
        and p1.drain_step_us_median > 0
        and pp.drain_step_us_median > 3 * p1.drain_step_us_median
    )
    text = (
        f"- **Wake latency {fmt(wake_us, ' µs')} > 50 µs.** In the probed trials with "
        f"{drain.pending} pending (median wake "
        f"{fmt(pp.wake_us_median if pp else None, ' µs')}), "
        f"{fmt(sched, ' µs')} pass between the end of the last reply's mutation and "
        f"the drain task running (bare trio wake here: {fmt(floor, ' µs')}; the rest "
        "is the delivering task's end-of-mutation checkpoint and the traffic task trio "
        f"may schedule first in the same batch), and {fmt(step, ' µs')} are the drain "
        "task's own step after it wakes. "
    )
    prim = head.ours.drain_primitive
    ctrl = drain.one_pending_after_same_traffic
    if grows and prim == "wait_settled" and ctrl is not None:
        text += _traffic_text(drain, head, ctrl, p1, pp, sweep_txt)
    elif grows:
        text += (
            "That step grows with the number pending, so the wake path is O(pending): the "
            f"woken waiter does per-key work for keys that drained long before ({sweep_txt}; "
            "plot `drain_wake_vs_pending.png`). *What it would take:* drop each key's "
            "registration as its reply lands so the final wake has nothing left to do; "
            "that brings the wake to about the 1-pending figure "
            f"({fmt(p1.wake_us_median if p1 else None, ' µs')} here)."
        )
    else:
        text += (
            f"The wake path is flat in the number pending ({sweep_txt}), so what remains is "
            "scheduling on a busy loop: trio runs every task woken in the same batch in "
            "random order, so the drain often waits for one traffic step. *What it would "
            "take:* fewer tasks runnable at once on the trainer's loop (replies applied in "
            "batches, as the dispatcher does), and a core of its own."
        )
    if p1 is not None and p1.wake_us_median > 50:
        text += (
            " Even the 1-pending wake is above 50 µs on this machine; the target's "
            "4 µs floor assumes a quiet one."
        )
    return text


def _p99_miss(drain: DrainResult, g: OursDrain) -> str:
    """The drain's p99 above 0.25 ms: the collections and preemption in the tail."""
    lat_gc = g.latency_trials_gc
    return (
        f"- **Drain wake p99 {fmt(drain.drain_wake_ms_p99, ' ms', 3)} > 0.25 ms.** "
        "The drain's own evaluation has a p99 of "
        f"{fmt(g.per_wakeup_p99_us, ' µs')}; the tail is trials in which a garbage "
        "collection ran (during the latency trials: "
        f"{lat_gc.gc_collections_by_generation} by generation, longest "
        f"{lat_gc.max_gc_pause_ms} ms) or the OS preempted the loop on this shared "
        "machine. *What it would take:* fewer young-generation collections on the reply "
        "path (allocate less per reply) and a core of its own for the trainer's loop."
    )


def _speedup_miss(drain: DrainResult) -> str:
    """The speedup follows the wake latency."""
    return (
        f"- **Speedup {fmt(drain.speedup, TIMES, 0)} < 2,500{TIMES}.** The polling "
        f"drain's median wake is {fmt(drain.baseline_wake_ms_median, ' ms')} (half a "
        f"50 ms period plus a scan), so 2,500{TIMES} needs our median at or below "
        f"{fmt(drain.baseline_wake_ms_median / 2.5, ' µs')}: it follows the wake "
        "latency."
    )


def _drain_stall_miss(drain: DrainResult, head: SweepRow, g: OursDrain, sp: StallPass) -> str:
    """The drain's loop stall: the collector, the task, the machine's load."""
    load = None if head.machine_load is None else head.machine_load.other_processes_cpu_pct
    return (
        f"- **Loop stall during the drain {fmt(drain.max_loop_stall_ms, ' ms', 2)} > "
        f"10 ms.** Longest garbage-collector pause {fmt(g.max_gc_pause_ms, ' ms', 2)}; "
        "with the collector's pauses taken out the longest stall is "
        f"{fmt(sp.max_loop_stall_excluding_gc_ms, ' ms', 2)} wall (task "
        f"`{sp.max_stall_excluding_gc_task}`), "
        f"{fmt(sp.max_loop_stall_cpu_excluding_gc_ms, ' ms', 2)} of loop-thread "
        f"CPU; other processes used {fmt(load, ' %')} of "
        "the machine meanwhile. A wall stall above its CPU time is the loop waiting for a "
        "core; a CPU stall is work to split or move off the loop."
    )


def _checkpoint_stall_miss(checkpoint: CheckpointResult, measured: dict[str, str]) -> str:
    """The checkpoint's loop stall: the longest task step and the heartbeat's lateness, by stage."""
    worst = max(checkpoint.stages, key=lambda r: r.max_loop_stall_ms or 0.0)
    late = max(checkpoint.stages, key=lambda r: r.heartbeat_max_late_ms or 0.0)
    return (
        "- **Loop stall during the checkpoint "
        f"{measured['checkpoint_stall']} > 10 ms.** The longest task step: "
        f"{fmt(checkpoint.max_loop_stall_ms, ' ms', 1)} in stage "
        f"`{worst.stage}` (task `{worst.max_stall_task}`, "
        f"{stall(worst.max_loop_stall_cpu_ms)} of loop-thread CPU). The heartbeat was "
        f"latest in stage `{late.stage}` "
        f"({fmt(late.heartbeat_max_late_ms, ' ms', 1)}): the loop waiting for the "
        "GIL while a worker thread held it (the embedded Gym's export in `commit`, the "
        "snapshot and publish threads; a garbage collection or one long C call in such a "
        "thread holds it throughout) or, in `resume`, for a scheduler batch of restarted "
        "episodes. Longest GC pause in the checkpoint "
        f"{fmt(checkpoint.gc_max_pause_ms, ' ms', 1)}; the runtime's own code, with "
        "the embedded Gym's tasks and calls and the GC pauses taken out: "
        f"{fmt(checkpoint.max_runtime_stall_excluding_gc_ms, ' ms', 2)} (stage "
        f"`{checkpoint.max_runtime_stall_stage}`). *What it would take:* the Gym "
        "host in its own process (on Ray each instance is), and the snapshot's remaining "
        "single long serialisations (the manifest) cut into chunks as the records and "
        "the ledger already are."
    )


def _checkpoint_e2e_miss(checkpoint: CheckpointResult) -> str:
    """The checkpoint's close-to-resume time: its largest stages, and what the export costs."""
    stage_s = checkpoint.stage_s or {}
    stages = sorted(
        ((k, v) for k, v in stage_s.items() if k != "prepare"),
        key=lambda kv: -kv[1],
    )[:3]
    n_c = checkpoint.in_flight
    commit = stage_s.get("commit")
    own = sum(v for k, v in stage_s.items() if k not in ("prepare", "commit"))
    return (
        f"- **Checkpoint {fmt(checkpoint.e2e_s, ' s', 2)} > 2 s** close to resume "
        "(less the turn time). Largest stages: "
        + ", ".join(f"`{k}` {fmt(v, ' s', 2)}" for k, v in stages)
        + ". "
        + (
            f"`commit` is the embedded Gym building and writing every episode's session "
            f"records in Python, one GIL for all instances "
            f"({fmt(commit * 1e6 / n_c, ' µs', 1)} per episode); the runtime's own stages "
            f"take {fmt(own, ' s', 2)} ({fmt(own * 1e6 / n_c, ' µs', 1)} per episode: "
            "ownership, the cut, serialising and fsyncing the snapshot). "
            if commit and n_c
            else ""
        )
        + "*What it would take:* an export that does not rebuild every session at commit "
        "(records kept serialised as episodes pass their step boundaries, or built "
        "natively), spread over processes (on Ray each actor exports its own share in "
        "parallel), and the runtime's stages at a few µs per episode."
    )


def _dispatch_embedded_miss(measured: dict[str, str]) -> str:
    """Embedded dispatch under 50,000 rows/s: where a row's time goes."""
    return (
        f"- **Embedded dispatch {measured['dispatch_embedded']} < 50,000 rows/s.** "
        "Every row costs the runtime (gate, ledger, dispatcher, reply consumer, trainer) "
        "and the Gym host (a task and a cancel scope per episode, its admission, its reply "
        "stream) on one loop and one core; the runtime alone, against a Gym that answers "
        "at once, is in the dispatch table (`gymckpt bench dispatch --loop`). *What it "
        "would take:* a host that runs an episode's steps without a task of its own while "
        "it does not wait (one scheduler over ready episodes), and the runtime's per-row "
        "path under 20 µs."
    )


def miss_lines(
    rows: list[TargetRow],
    drain: DrainResult,
    head: SweepRow,
    by_p: dict[int, WakeByPending],
    checkpoint: CheckpointResult | None,
    fanout: FanoutResult | None,
    checkpoint_ray: CheckpointRayResult | None = None,
) -> list[str]:
    """One paragraph per target that is not met: what was measured and what it would take."""
    out: list[str] = []
    missed = {r.key for r in rows if r.status is Status.MISSED}
    measured = {r.key: r.measured for r in rows}
    floor = drain.trio_wake_floor_us
    if "drain_wake_median" in missed:
        out.append(_wake_miss(drain, head, by_p, floor))
    g = head.ours
    sp = g.stall_pass
    if "drain_wake_p99" in missed:
        out.append(_p99_miss(drain, g))
    if "drain_speedup" in missed:
        out.append(_speedup_miss(drain))
    if "drain_stall" in missed:
        out.append(_drain_stall_miss(drain, head, g, sp))
    if checkpoint is not None and "checkpoint_stall" in missed:
        out.append(_checkpoint_stall_miss(checkpoint, measured))
    if checkpoint is not None and "checkpoint_e2e" in missed:
        out.append(_checkpoint_e2e_miss(checkpoint))
    if checkpoint_ray is not None and "checkpoint_e2e_ray" in missed:
        out.append(
            f"- **The checkpoint on Ray failed** ({checkpoint_ray.actors} actors, "
            f"{checkpoint_ray.in_flight} in flight): "
            + first_line(checkpoint_ray.checkpoint_error or checkpoint_ray.error)
            + " (the section on Ray below has the whole error)."
        )
    if "dispatch_embedded" in missed:
        out.append(_dispatch_embedded_miss(measured))
    if "dispatch_ray" in missed:
        out.append(
            f"- **Dispatch on Ray {measured['dispatch_ray']} < 10,000 rows/s** with 2 "
            "actors: the trainer, both actors and Ray's own processes share 2 cores."
        )
    failed = [r for r in (fanout.results if fanout else []) if not r.ok]
    if failed:
        out.append(
            "- **Fan-out:** "
            + "; ".join(f"{r.actors} actors failed: {r.error}" for r in failed)
            + ". *What it would "
            "take:* a machine with room for that many actor processes (each is a Python "
            "process; Ray places and starts them on the same 2 cores as everything else)."
        )
    return out
