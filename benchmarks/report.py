"""``gymckpt bench all``: run every benchmark, then write the JSON results, the plots and
``SUMMARY.md`` (headline figures against their targets, saying plainly what is missed,
why, and what it would take)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gymckpt.runtime import write_atomic

from ._common import Progress, label
from .checkpoint import CheckpointConfig, run_checkpoint
from .dispatch import DispatchConfig, run_dispatch
from .drain import DrainConfig, run_drain
from .memory import run_memory

__all__ = ["TARGETS", "plot_checkpoint", "plot_drain", "rerender", "run_all", "write_summary"]

TARGETS = {
    "drain_wake_us_median": 50.0,
    "drain_wake_ms_p99": 1.0,
    "per_wakeup_ratio": 1.2,
    "speedup": 1000.0,
    "loop_stall_ms": 10.0,
}

TIMES = "\u00d7"  # the multiplication sign, for "1000x"

PHASE2_PENDING = (
    "Dispatch throughput on the Ray deployment is not part of `benchmarks all` (it needs a "
    "local Ray cluster): `python tests/test_ray_throughput.py 20000` measures it, batched "
    "replies against one Ray object per reply, with the embedded Gym as the baseline. On "
    "2026-11-30 on this machine it gave, in rows/s, one stream: embedded 9,300, Ray batched "
    "8,100, Ray one object per row 2,000; the whole runtime (`open_rollouts`, 2 instances): "
    "embedded 11,600-13,000, Ray batched 4,700, Ray one object per row 1,700."
)


def _dump(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(_finite(data), indent=2) + "\n").encode())


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- plots ---------------------------------------------------------------------------------------


def plot_drain(drain: dict[str, Any], out: Path) -> list[Path]:
    """Wake latency and per-wakeup cost against in-flight size (log axes), ours vs polling; and
    wake latency against the number pending at the headline size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = drain["sweep"]
    xs = [r["in_flight"] for r in sweep]
    files: list[Path] = []

    def pos(v: float) -> float:
        return max(v, 1e-3)

    # 1. wake latency
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    ax.plot(xs, [pos(r["ours"]["wake"]["median_us"]) for r in sweep], "o-", color="tab:blue",
            label=f"event-driven drain, median ({drain['pending']} pending)")
    ax.plot(xs, [pos(r["ours"]["wake"]["p99_us"]) for r in sweep], "o--", color="tab:blue",
            alpha=0.5, label="event-driven drain, p99")
    ax.plot(xs, [pos(r["baseline"]["wake"]["median_ms"] * 1e3) for r in sweep], "s-",
            color="tab:red", label="polling drain (50 ms), median")
    ax.plot(xs, [pos(r["trio_wake_floor"]["median_us"]) for r in sweep], "^:", color="gray",
            label="bare trio wake (Event.set → waiter), median")
    ax.axhline(TARGETS["drain_wake_us_median"], color="tab:green", ls="--", lw=1,
               label="target: 50 µs median")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts in flight")
    ax.set_ylabel("wake latency after the last pending reply (µs)")
    ax.set_title("Drain wake latency vs rollouts in flight")
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    path = out / "drain_wake_latency.png"
    fig.savefig(path)
    plt.close(fig)
    files.append(path)

    # 2. per-wakeup cost
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    ax.plot(xs, [pos(r["ours"]["per_wakeup_us"]) for r in sweep], "o-", color="tab:blue",
            label="event-driven: one predicate evaluation (median)")
    ax.plot(xs, [pos(r["ours"]["per_reply_overhead_us"]) for r in sweep], "o--",
            color="tab:cyan", label="event-driven: A/B cost added to a pending reply's mutation")
    ax.plot(xs, [pos(r["baseline"]["per_wakeup_us"]) for r in sweep], "s-", color="tab:red",
            label="polling: one poll = full inventory scan (median)")
    if len(xs) >= 2:
        base0 = sweep[0]["baseline"]["per_wakeup_us"]
        ax.plot(xs, [pos(base0 * x / xs[0]) for x in xs], ":", color="tab:red", alpha=0.4,
                label="linear in N (from the smallest size)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts in flight")
    ax.set_ylabel("CPU per wakeup (µs)")
    ax.set_title("Drain cost per wakeup vs rollouts in flight")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = out / "drain_per_wakeup_cost.png"
    fig.savefig(path)
    plt.close(fig)
    files.append(path)

    # 3. wake latency against pending, at the headline size
    by_p = drain.get("wake_by_pending") or []
    if by_p:
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=130)
        bars = [(str(r["pending"]), r) for r in by_p]
        ctrl = drain.get("one_pending_after_same_traffic")
        if ctrl:
            bars.append((f"1, after\n{ctrl['unrelated_mutations_before']:,} other\nmutations",
                         ctrl))
        labels = [b for b, _ in bars]
        sched = [r["reply_to_drain_running_us_median"] for _, r in bars]
        step = [r["drain_step_us_median"] for _, r in bars]
        ax.bar(labels, sched, color="tab:gray", label="last reply → drain task running")
        ax.bar(labels, step, bottom=sched, color="tab:blue",
               label="drain task's own step after waking")
        ax.plot(labels, [r["wake_us_median"] for _, r in bars], "ko", label="wake latency (median)")
        ax.axhline(TARGETS["drain_wake_us_median"], color="tab:green", ls="--", lw=1,
                   label="target: 50 µs")
        ax.set_xlabel(f"episodes pending (on the wire), {drain['rollouts']:,} in flight; "
                      f"{drain['config']['interleave']} other mutations before each reply")
        ax.set_ylabel("µs (medians)")
        ax.set_title("Where the drain's wake latency goes")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        path = out / "drain_wake_vs_pending.png"
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


def plot_checkpoint(ck: dict[str, Any], out: Path) -> list[Path]:
    """Stage breakdown of one whole checkpoint: wall time and longest loop stall per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ck["stages"]
    names = [r["stage"] for r in rows][::-1]
    floor = 0.01  # ms; the log axes start here, values under it are drawn at it
    wall = [max(r["wall_ms"], floor) for r in rows][::-1]
    stall = [max(r["max_loop_stall_ms"] or 0.1, floor) for r in rows][::-1]
    cpu = [max(r["max_loop_stall_cpu_ms"] or 0.1, floor) for r in rows][::-1]
    gym = [r["in_gym_calls_ms"] for r in rows][::-1]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.8), dpi=130, sharey=True)
    y = list(range(len(names)))
    a1.barh(y, [w - floor for w in wall], left=floor, color="tab:blue",
            label="stage wall time")
    gy = [(i, min(g, w)) for i, (g, w) in enumerate(zip(gym, wall, strict=True)) if g > floor]
    if gy:
        a1.barh([i for i, _ in gy], [g - floor for _, g in gy], left=floor, height=0.4,
                color="tab:orange", label="of which inside Gym calls")
    a1.set_xscale("log")
    a1.set_xlim(left=floor)
    a1.set_yticks(y, names)
    a1.set_xlabel("ms (log)")
    a1.set_title("Stage wall time")
    a1.grid(True, axis="x", which="both", alpha=0.3)
    a2.barh([v - 0.2 for v in y], [v - floor for v in stall], left=floor, height=0.4,
            color="tab:red", label="longest stall, wall")
    a2.barh([v + 0.2 for v in y], [v - floor for v in cpu], left=floor, height=0.4,
            color="tab:purple", label="longest stall, loop-thread CPU")
    a2.axvline(TARGETS["loop_stall_ms"], color="tab:green", ls="--", lw=1, label="target 10 ms")
    a2.set_xscale("log")
    a2.set_xlim(left=floor)
    a2.set_xlabel("ms (log; 0.1 = under 0.1 ms)")
    a2.set_title("Longest loop stall in the stage")
    a2.grid(True, axis="x", which="both", alpha=0.3)
    fig.legend(fontsize=8, loc="lower center", ncol=5, frameon=False)
    fig.suptitle(f"One checkpoint at {ck['in_flight']:,} in flight on the embedded Gym")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = out / "checkpoint_stages.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- summary -------------------------------------------------------------------------------------


def _fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:,.{digits}f}{unit}"


def _yes(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**missed**")


def _stall(v: Any) -> str:
    return "< 0.1 ms" if v is None else _fmt(v, " ms", 2)


def _checkpoint_misses(add: Any, ck: dict[str, Any]) -> None:
    stages = {r["stage"]: r for r in ck["stages"]}
    if ck["max_loop_stall_ms"] <= TARGETS["loop_stall_ms"]:
        return
    worst = max(ck["stages"], key=lambda r: r["max_loop_stall_ms"] or 0.0)
    rt = ck["max_runtime_stall_excluding_gc_ms"]
    gym_ms = sum(r["in_gym_calls_ms"] for r in ck["stages"])
    text = (
        f"- **Whole checkpoint at {ck['in_flight']:,}: longest loop stall "
        f"{_fmt(ck['max_loop_stall_ms'], ' ms', 1)} > 10 ms**, in stage `{worst['stage']}` "
        f"(task `{worst['max_stall_task']}`). Two things share this loop that would not in "
        "production. (1) The embedded Gym: its 200k simulated episodes are tasks here, its "
        "`prepare` moves each to a step boundary and its `commit` exports every episode's "
        f"records synchronously ({_fmt(gym_ms / 1e3, ' s', 1)} inside Gym calls in all; "
        "`commit` alone stalls the loop "
        f"{_stall((stages.get('commit') or {}).get('max_loop_stall_ms'))}); with Ray each "
        "instance is its own process. (2) The cyclic garbage collector: the process holds "
        "the ledger *and* the simulated Gym's objects, so a generation-2 collection walks "
        f"both (longest pause {_fmt(ck['max_gc_pause_ms'], ' ms', 1)}; collections by "
        f"generation {ck.get('gc_collections_by_generation')}). Taking both out, the longest "
        f"stall in the runtime's own code is {_fmt(rt, ' ms', 2)} wall, "
        f"{_stall(ck.get('max_runtime_stall_cpu_ms'))} of loop-thread CPU (stage "
        f"`{ck.get('max_runtime_stall_stage')}`, task `{ck.get('max_runtime_stall_task')}`, "
        "the task that called `checkpoint()`, where the coordinator runs; a wall time well "
        "above the CPU time is the loop waiting for the GIL held by the coordinator's worker "
        "thread, or for a core)"
    )
    if rt <= TARGETS["loop_stall_ms"]:
        text += ", within the target. "
    else:
        text += (", above the target: that step's work belongs off the loop (or split with "
                 "checkpoints). ")
    text += (
        "*What it would take* for the whole-checkpoint figure: the Ray backend (Gym out of "
        "process), `gc.freeze()` after the ledger is built and after each step (see the drain "
        "figures above), and, for users of the embedded Gym at this scale, its record export "
        "moved to a worker thread inside `SimInstance.commit`. The heartbeat's worst lateness, "
        "which also counts the loop waiting for the GIL while a worker thread runs, was "
        f"{_fmt(ck.get('heartbeat_max_late_ms'), ' ms', 1)}."
    )
    gil = [r for r in ck["stages"]
           if r["stage"] in ("ownership", "snapshot", "publish")  # work in a worker thread
           and (r.get("heartbeat_max_late_ms") or 0.0) > TARGETS["loop_stall_ms"]
           and (r["max_loop_stall_ms"] or 0.0) < 0.1 * r["heartbeat_max_late_ms"]
           and r["gc_pause_ms"] > 0.5 * r["heartbeat_max_late_ms"]]
    for r in gil:
        text += (
            f" In `{r['stage']}` the loop's task steps stayed short "
            f"({_stall(r['max_loop_stall_ms'])}) but the heartbeat was "
            f"{_fmt(r['heartbeat_max_late_ms'], ' ms', 1)} late, with "
            f"{_fmt(r['gc_pause_ms'], ' ms', 1)} of GC pauses in the stage: a collection ran "
            "in the worker thread doing the stage's heavy work and held the GIL, so the loop "
            "could not run although none of its own steps was long. Offloading to a thread "
            "does not protect the loop from the collector; freezing the long-lived objects "
            "does."
        )
    add(text)


def _late(row: dict[str, Any]) -> str:
    if row["stage"] in ("close+retire", "prepare"):
        return "—"  # virtual time: the heartbeat starts at after_prepare
    v = row.get("heartbeat_max_late_ms")
    return "< 1 ms" if v is None else _fmt(v, " ms", 1)


def _checkpoint_section(add: Any, ck: dict[str, Any]) -> None:
    add(f"## Checkpoint end to end on the embedded Gym ({ck['in_flight']:,} in flight)")
    add("")
    add(f"One `Rollouts.checkpoint()` through `nurseries.open_rollouts` on `EmbeddedGym` "
        f"({ck['config']['instances']} instances): ok = {ck['checkpoint_ok']}, "
        f"{ck['episodes_exported']:,} episodes exported, {ck['pending_drained']} pending "
        f"drained, {_fmt(ck['checkpoint_wall_s'], ' s', 2)} wall. Snapshot on disk: "
        f"{_fmt(ck['snapshot_mib'], ' MiB')} in {ck['snapshot_files']} files "
        f"({_fmt(ck['snapshot_bytes_per_episode'], ' B', 0)} per episode; `ledger.json` "
        f"{_fmt(ck['ledger_json_bytes'] / 2**20, ' MiB')}).")
    add("")
    add("| stage | wall | longest loop stall (wall / CPU) | runtime's own, GC out | GC pauses "
        "| heartbeat late | inside Gym calls |")
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in ck["stages"]:
        extra = ""
        if "simulated_wait_s" in r:
            extra = f" (+ {r['simulated_wait_s']:.1f} s simulated wait)"
        add(f"| {r['stage']} | {_fmt(r['wall_ms'], ' ms', 1)}{extra} | "
            f"{_stall(r['max_loop_stall_ms'])} / {_stall(r['max_loop_stall_cpu_ms'])} | "
            f"{_stall(r.get('max_runtime_stall_excluding_gc_ms'))} | "
            f"{_fmt(r['gc_pause_ms'], ' ms', 1)} | "
            f"{_late(r)} | "
            f"{_fmt(r['in_gym_calls_ms'], ' ms', 1)} |")
    add("")
    add("The run fills Gym on a virtual clock and switches to real time once Gym is parked "
        "(`after_prepare`): `prepare`'s wall time is the embedded Gym moving every episode to a "
        "step boundary on this loop, and its simulated wait is the turn length the simulation "
        "was given; every later stage runs in real time with the runtime's worker threads, as "
        "in production. `commit` is the embedded Gym's export (see *inside Gym calls*). "
        "*Runtime's own*: the longest stall in a task that is not the embedded Gym's, not "
        "inside a Gym call, with GC pauses taken out. *Heartbeat late*: worst lateness of a "
        "1 ms sleep (from `after_prepare` on; only lateness over 1 ms is recorded), which also "
        "catches the loop waiting for the GIL. GC pauses include collections in worker threads "
        "(the snapshot and publish stages allocate there).")
    add("")
    emb = ck.get("embedded_dispatch") or []
    if emb:
        add(f"Filling Gym to {ck['in_flight']:,} in flight took {_fmt(ck['fill_wall_s'], ' s')} "
            f"({ck['embedded_fill_rows_per_s']:,} rows/s, dispatcher batch "
            f"{ck['config']['dispatch_batch']}). Rows through the whole loop on the embedded "
            "Gym (gate, ledger, `EmbeddedGym.run`, a one-turn episode, the streamed reply, the "
            "completion mutation, the trainer taking the group), virtual clock, Gym sharing "
            "the core:")
        add("")
        add("| dispatcher batch | attempts | wall | rows/s |")
        add("| ---: | ---: | ---: | ---: |")
        for r in emb:
            add(f"| {r['batch']} | {r['attempts']:,} | {_fmt(r['seconds'], ' s', 2)} | "
                f"{r['rows_per_s']:,} |")
        add("")


def write_summary(
    path: Path,
    drain: dict[str, Any],
    memory: dict[str, Any],
    dispatch: dict[str, Any],
    meta: dict[str, Any],
    plots: list[Path],
    checkpoint: dict[str, Any] | None = None,
) -> None:
    m = meta["machine"]
    sweep = drain["sweep"]
    by_n = {r["in_flight"]: r for r in sweep}
    head = by_n[drain["rollouts"]]
    small = by_n.get(2000)
    big = by_n.get(200_000, head)
    n_head = drain["rollouts"]
    wake_us = drain["drain_wake_us_median"]
    p99_ms = drain["drain_wake_ms_p99"]
    floor = drain["trio_wake_floor_us"]
    ratio = drain.get("per_wakeup_ratio_large_vs_2k")
    speedup = drain["speedup"]
    stall = drain["max_loop_stall_ms"]
    by_p = {r["pending"]: r for r in drain.get("wake_by_pending") or []}

    ok_wake = wake_us <= TARGETS["drain_wake_us_median"]
    ok_p99 = p99_ms <= TARGETS["drain_wake_ms_p99"]
    ok_ratio = None if ratio is None else ratio <= TARGETS["per_wakeup_ratio"]
    ok_speed = speedup is not None and speedup >= TARGETS["speedup"]
    ok_stall = stall <= TARGETS["loop_stall_ms"]
    big_l = label(big["in_flight"])

    L: list[str] = []
    add = L.append
    add("# gymckpt benchmarks — summary")
    add("")
    add(f"Produced by `{meta['command']}` on {m['date_utc']}.")
    add("")
    src = meta.get("source") or {}
    changes = src.get("uncommitted_changes")
    add(f"Code measured: commit `{src.get('commit')}`"
        + (f", plus uncommitted changes in {', '.join(f'`{c}`' for c in changes)}"
           if changes else " (runtime/, nurseries/, gym_adapter/ clean)") + ".")
    add("")
    add(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB RAM, "
        f"{m['implementation']} {m['python']}, trio {m['trio']}, {m['platform']}. "
        "The machine is shared with other work and noisy, so every figure is a **median** "
        "(p99 where stated) over many trials; nothing here is a best case.")
    add("")
    add("## Headline figures against their targets")
    add("")
    add(f"Drain at **{n_head:,} rollouts in flight**, **{drain['pending']} episodes pending** "
        "(reply on the wire after commit), replies delivered as barrier mutations interleaved "
        "with unrelated data-plane traffic.")
    add("")
    add("| figure | target | measured | |")
    add("| --- | --- | --- | --- |")
    add(f"| drain wake latency, median | ≤ 50 µs | {_fmt(wake_us, ' µs')} | {_yes(ok_wake)} |")
    add(f"| drain wake latency, p99 | ≤ 1 ms | {_fmt(p99_ms * 1e3, ' µs')} | {_yes(ok_p99)} |")
    if ratio is not None and small is not None:
        add(f"| per-wakeup cost, {big_l} vs 2k in flight | ≤ 1.2{TIMES} | {ratio:.2f}{TIMES} "
            f"({_fmt(big['ours']['per_wakeup_us'], ' µs', 2)} vs "
            f"{_fmt(small['ours']['per_wakeup_us'], ' µs', 2)}) | {_yes(ok_ratio)} |")
    add(f"| speedup over the polling drain (medians, same run) | ≥ 1000{TIMES} | "
        f"{_fmt(speedup, TIMES, 0)} ({_fmt(drain['baseline_wake_ms_median'], ' ms')} vs "
        f"{_fmt(wake_us, ' µs')}) "
        f"| {_yes(ok_speed)} |")
    sp0 = head["ours"]["stall_pass"]
    add(f"| longest loop stall during the drain trials (wall: GC, preemption, work) | ≤ 10 ms "
        f"| {_fmt(stall, ' ms', 2)} | {_yes(ok_stall)} |")
    add(f"| … with GC pauses subtracted: wall / loop thread's CPU time | ≤ 10 ms | "
        f"{_fmt(sp0['max_loop_stall_excluding_gc_ms'], ' ms', 2)} / "
        f"{_fmt(sp0.get('max_loop_stall_cpu_excluding_gc_ms'), ' ms', 2)} | info |")
    fz0 = drain.get("gc_freeze_variant")
    if fz0 is not None:
        add(f"| same drain, GC frozen (see below): wake median / p99 / longest stall "
            f"| ≤ 50 µs / 1 ms / 10 ms | {_fmt(fz0['drain_wake_us_median'], ' µs')} / "
            f"{_fmt(fz0['drain_wake_ms_p99'] * 1e3, ' µs')} / "
            f"{_fmt(fz0['max_loop_stall_ms'], ' ms', 2)} | info |")
    if checkpoint is not None:
        ck_all = checkpoint["max_loop_stall_ms"]
        ck_rt = checkpoint["max_runtime_stall_excluding_gc_ms"]
        add(f"| longest loop stall during a whole checkpoint at "
            f"{checkpoint['in_flight']:,} in flight on the embedded Gym (all causes) "
            f"| ≤ 10 ms | {_fmt(ck_all, ' ms', 1)} | "
            f"{_yes(ck_all <= TARGETS['loop_stall_ms'])} |")
        add(f"| … the runtime's own code only (not the embedded Gym's tasks or calls, GC "
            f"pauses taken out) | ≤ 10 ms | {_fmt(ck_rt, ' ms', 2)} | "
            f"{_yes(ck_rt <= TARGETS['loop_stall_ms'])} |")
        add(f"| … longest GC pause during that checkpoint | — | "
            f"{_fmt(checkpoint['max_gc_pause_ms'], ' ms', 1)} | info |")
    else:
        add("| longest loop stall during a whole checkpoint at 200k | ≤ 10 ms | not run | — |")
    add(f"| bare trio wake on this machine (floor) | ≈ 4 µs (reference) | "
        f"{_fmt(floor, ' µs')} | info |")
    add("")
    if small is not None:
        growth = drain.get("baseline_per_wakeup_ratio_large_vs_2k")
        add(f"Polling per-wakeup cost grows {growth}{TIMES} "
            f"from 2k to {big_l} ({_fmt(small['baseline']['per_wakeup_us'] / 1e3, ' ms', 2)} → "
            f"{_fmt(big['baseline']['per_wakeup_us'] / 1e3, ' ms', 2)} per poll); the event-driven "
            f"drain evaluates its predicate {drain['predicate_evaluations_per_reply']:.2f} times "
            f"per pending reply while ~{drain['mutations_per_trial']:.0f} mutations run per trial.")
        add("")
    add("## Where a target is missed, why, and what it would take")
    add("")
    misses = 0
    if not ok_wake:
        misses += 1
        sched = drain.get("reply_to_drain_running_us_median")
        step = drain.get("drain_step_us_median")
        p1 = by_p.get(1)
        pp = by_p.get(drain["pending"])
        sweep_txt = ", ".join(f"{p} pending → {_fmt(r['wake_us_median'], ' µs')}"
                              for p, r in sorted(by_p.items()))
        grows = (p1 is not None and pp is not None and p1["drain_step_us_median"] > 0
                 and pp["drain_step_us_median"] > 3 * p1["drain_step_us_median"])
        text = (f"- **Wake latency {_fmt(wake_us, ' µs')} > 50 µs.** In the probed trials with "
                f"{drain['pending']} pending (median wake "
                f"{_fmt(pp['wake_us_median'] if pp else None, ' µs')}), "
                f"{_fmt(sched, ' µs')} pass between the end of the last reply's mutation and "
                f"the drain task running (bare trio wake here: {_fmt(floor, ' µs')}; the rest "
                "is the delivering task's end-of-mutation checkpoint and the traffic task trio "
                f"may schedule first in the same batch), and {_fmt(step, ' µs')} are the drain "
                "task's own step after it wakes. ")
        prim = head["ours"].get("drain_primitive")
        kept = pp.get("wake_us_median_pending_set_freed_later") if pp else None
        kept_step = pp.get("drain_step_us_median_pending_set_freed_later") if pp else None
        ctrl = drain.get("one_pending_after_same_traffic")
        traffic_driven = (ctrl is not None and pp is not None
                          and ctrl["wake_us_median"] >= 0.7 * pp["wake_us_median"])
        if grows and prim == "wait_settled" and ctrl is not None:
            text += (
                f"Across the pending sweep ({sweep_txt}; plot `drain_wake_vs_pending.png`) the "
                "drain's step grows although the barrier's final wake is O(1) by design "
                "(`wait_settled` drops each key as its reply lands, and each evaluation costs "
                f"{_fmt(head['ours']['per_wakeup_us'], ' µs', 2)}). The control says what it "
                f"follows: **one** pending reply delivered after "
                f"{ctrl['unrelated_mutations_before']:,} unrelated mutations (as many as the "
                f"{drain['pending']}-pending trial runs) wakes in "
                f"{_fmt(ctrl['wake_us_median'], ' µs')} (drain's own step "
                f"{_fmt(ctrl['drain_step_us_median'], ' µs')}), against "
                f"{_fmt(p1['wake_us_median'] if p1 else None, ' µs')} for one reply after 3. "
                + ("So the excess follows the traffic the loop ran while the drain waited, not "
                   "the number pending: resuming a task whose frames, cancel scopes and sets "
                   "went cold in cache (and paying the young-generation collections that "
                   "traffic triggers) costs tens of microseconds in CPython. "
                   if traffic_driven else
                   "So part of the excess follows the number pending. ")
                + "Freeing the drain's pending set after the measurement instead of on the "
                f"wake path gives {_fmt(kept, ' µs')} (drain's step "
                f"{_fmt(kept_step, ' µs')}). *What it would take:* the drain's own algorithm "
                "is already O(1) per reply and at the wake; what is left is interpreter and "
                "machine overhead — keep the drain's structures alive past the wake, allocate "
                "less per reply mutation (fewer young-generation collections), and give the "
                "trainer's loop a core of its own. We found no change inside the runtime that "
                "brings the median under 50 µs on this shared 2-core machine.")
        elif grows:
            text += (
                "That step grows with the number pending, so the wake path is O(pending): the "
                f"woken waiter does per-key work for keys that drained long before ({sweep_txt}; "
                "plot `drain_wake_vs_pending.png`). *What it would take:* drop each key's "
                "registration as its reply lands so the final wake has nothing left to do; "
                "that brings the wake to about the 1-pending figure "
                f"({_fmt(p1['wake_us_median'] if p1 else None, ' µs')} here).")
        else:
            text += (
                f"The wake path is flat in the number pending ({sweep_txt}), so what remains is "
                "scheduling on a busy loop: trio runs every task woken in the same batch in "
                "random order, so the drain often waits for one traffic step. *What it would "
                "take:* fewer tasks runnable at once on the trainer's loop (replies applied in "
                "batches, as the dispatcher does), and a core of its own.")
        if p1 is not None and p1["wake_us_median"] > 50:
            text += (" Even the 1-pending wake is above 50 µs on this machine; the target's "
                     "4 µs floor assumes a quiet one.")
        add(text)
    g = head["ours"]
    sp = g["stall_pass"]
    fz = drain.get("gc_freeze_variant")
    fz_text = ""
    if fz is not None:
        cf = fz.get("collect_and_freeze_between_trials") or {}
        fz_text = (
            " Measured in the same run, at the same size, with `gc.freeze()` after the "
            "ledger is built and `gc.collect(); gc.freeze()` between trials (as a trainer "
            "could do after each step; that call is itself a pause of "
            f"{_fmt(cf.get('median_ms'), ' ms', 2)} median, {_fmt(cf.get('max_ms'), ' ms', 2)} "
            f"max, taken when the trainer chooses): wake median "
            f"{_fmt(fz['drain_wake_us_median'], ' µs')}, p99 "
            f"{_fmt(fz['drain_wake_ms_p99'] * 1e3, ' µs')}, longest stall "
            f"{_fmt(fz['max_loop_stall_ms'], ' ms', 2)} wall / "
            f"{_fmt(fz.get('max_loop_stall_cpu_excluding_gc_ms'), ' ms', 2)} CPU (longest GC "
            f"pause {_fmt(fz['max_gc_pause_ms'], ' ms', 2)})."
        )
    if not ok_p99:
        misses += 1
        add(f"- **p99 {_fmt(p99_ms * 1e3, ' µs')} > 1 ms.** The tail is not the drain's "
            "work (its per-wakeup cost has a p99 of "
            f"{_fmt(g['per_wakeup_p99_us'], ' µs')}): trials in which the cyclic garbage "
            "collector ran, or in which the OS preempted the loop on this shared 2-core "
            f"machine, land in it (collections during the latency trials: "
            f"{g['latency_trials_gc']['gc_collections_by_generation']} by generation, longest "
            f"{g['latency_trials_gc']['max_gc_pause_ms']} ms). *What it would take:* keep the "
            "ledger's long-lived objects out of the collector (`gc.freeze()` after start-up "
            "and after a restore, or larger GC thresholds) and a core of its own for the "
            "trainer's event loop." + fz_text)
    if ok_ratio is False:
        misses += 1
        add(f"- **Per-wakeup cost ratio {ratio:.2f}{TIMES} > 1.2{TIMES}.** The predicate does "
            f"the same number of lookups at every size ({drain['pending']} pending), so the "
            "growth is memory, not algorithm: at large N the ledger's ID table and the "
            "attempt objects no longer fit in cache, and the first lookups of each pending ID "
            "miss. *What it would take:* keep the pending attempts' state in a small side "
            "table owned by the drain (copied once at commit), so evaluations never touch the "
            "big table.")
    if not ok_speed:
        misses += 1
        add(f"- **Speedup {_fmt(speedup, TIMES, 0)} < 1000{TIMES}.** The polling drain's "
            f"median wake is {_fmt(drain['baseline_wake_ms_median'], ' ms')} (half a 50 ms "
            f"period plus a scan), so 1000{TIMES} needs the event-driven wake at or below "
            f"{_fmt(drain['baseline_wake_ms_median'], ' µs')}"
            + ("; it follows the wake-latency fix above." if not ok_wake else "."))
    if not ok_stall:
        misses += 1
        lat_gc = g["latency_trials_gc"]
        gen = (lat_gc["max_gc_pause_generation"]
               if lat_gc["max_gc_pause_ms"] >= sp["max_gc_pause_ms"]
               else sp["max_gc_pause_generation"])
        ml = head.get("machine_load") or {}
        rest = (
            "With the collector's pauses subtracted, the longest stall in the instrumented "
            f"pass is {_fmt(sp['max_loop_stall_excluding_gc_ms'], ' ms', 2)} wall (task "
            f"`{sp['max_stall_excluding_gc_task']}`) and "
            f"{_fmt(sp.get('max_loop_stall_cpu_excluding_gc_ms'), ' ms', 2)} of the loop "
            "thread's CPU time; while this size ran, other processes used "
            f"{_fmt(ml.get('other_processes_cpu_pct'), ' %')} of the machine's CPU (steal "
            f"{_fmt(ml.get('steal_pct'), ' %')}, load average {ml.get('loadavg_1m')}), so a "
            "wall stall above its CPU time is the loop waiting for a core. "
        )
        if g["max_gc_pause_ms"] >= 0.5 * stall:
            add(f"- **Loop stall {_fmt(stall, ' ms', 2)} > 10 ms.** It is the cyclic garbage "
                f"collector: a generation-{gen} collection of "
                f"{_fmt(g['max_gc_pause_ms'], ' ms', 1)} walks every tracked object, and with "
                f"{head['ledger_attempts']:,} attempts the ledger holds millions of them. "
                + rest +
                "The drain itself does no O(in-flight) work on the loop. *What it would take:* "
                "`gc.freeze()` once the ledger is built and after each restore (frozen objects "
                "are never scanned again), or raised thresholds with an explicit collection "
                "between training steps." + fz_text)
        else:
            add(f"- **Loop stall {_fmt(stall, ' ms', 2)} > 10 ms** (wall time, task "
                f"`{sp['max_stall_task']}`). " + rest +
                "A wall-clock stall well above its CPU time is the OS preempting the loop on "
                "this shared 2-core machine; *what it would take* is a core of its own for the "
                "trainer's event loop." + fz_text)
    if misses == 0:
        add("- None of the phase-1 targets is missed.")
    if checkpoint is not None:
        _checkpoint_misses(add, checkpoint)
    add("")

    add("## Drain sweep")
    add("")
    add("| in flight | ours wake median / p99 | ours per wakeup | A/B added per reply "
        "| polling wake median | polling per wakeup | loop stall ours / polling | trio floor "
        "| other processes' CPU |")
    add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in sweep:
        o, b = r["ours"], r["baseline"]
        add(f"| {r['in_flight']:,} | {_fmt(o['wake']['median_us'], ' µs')} / "
            f"{_fmt(o['wake']['p99_us'], ' µs')} | {_fmt(o['per_wakeup_us'], ' µs', 2)} | "
            f"{_fmt(o['per_reply_overhead_us'], ' µs', 2)} | "
            f"{_fmt(b['wake']['median_ms'], ' ms')} | {_fmt(b['per_wakeup_us'] / 1e3, ' ms', 2)} | "
            f"{_fmt(o['max_loop_stall_ms'], ' ms', 2)} / {_fmt(b['max_loop_stall_ms'], ' ms', 1)} "
            f"| {_fmt(r['trio_wake_floor']['median_us'], ' µs')} "
            f"| {_fmt((r.get('machine_load') or {}).get('other_processes_cpu_pct'), ' %')} |")
    add("")
    add("Run-to-run variation: on this shared machine, microsecond-scale medians moved by up "
        "to about ±40 % between consecutive full runs (the machine-load column shows how busy "
        "the rest of the machine was); compare orders of magnitude and trends, not digits.")
    add("")
    add(f"Trials per size: {drain['config']['trials']} event-driven, "
        f"{drain['config']['baseline_trials']} polling (fewer above 200k). The polling drain's "
        "loop stall is its own scan: one synchronous O(ledger) step every 50 ms.")
    add("")
    if by_p:
        add(f"Wake latency against the number pending, {n_head:,} in flight:")
        add("")
        add("| pending | wake median | wake p99 | reply → drain running | drain's own step "
            "| per wakeup |")
        add("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for p, r in sorted(by_p.items()):
            add(f"| {p} | {_fmt(r['wake_us_median'], ' µs')} | {_fmt(r['wake_us_p99'], ' µs')} | "
                f"{_fmt(r['reply_to_drain_running_us_median'], ' µs')} | "
                f"{_fmt(r['drain_step_us_median'], ' µs')} | "
                f"{_fmt(r['per_wakeup_us'], ' µs', 2)} |")
        add("")
    add("Plots: " + ", ".join(f"[`{p.name}`]({p.name})" for p in plots) + ".")
    add("")

    add("## Ledger memory")
    add("")
    add("| attempts | Python heap (tracemalloc) | resident set growth (RSS) |")
    add("| ---: | ---: | ---: |")
    per: dict[int, dict[str, Any]] = {}
    for r in memory["results"]:
        per.setdefault(r["target_attempts"], {})[r["mode"]] = r
    for n, modes in per.items():
        t, rss = modes.get("tracemalloc"), modes.get("rss")
        add(f"| {n:,} | {_fmt(t['bytes_per_attempt'] if t else None, ' B/attempt', 0)} "
            f"({_fmt(t['bytes'] / 2**20 if t else None, ' MiB', 0)}) | "
            f"{_fmt(rss['bytes_per_attempt'] if rss else None, ' B/attempt', 0)} "
            f"({_fmt(rss['bytes'] / 2**20 if rss else None, ' MiB', 0)}) |")
    add("")
    add("Method: " + memory["method"] + ".")
    add("")

    add("## Dispatch throughput (gate + ledger, no Gym)")
    add("")
    add("| in flight | batch | rows/s end to end | admit + dispatch only | completions only "
        "| µs per row |")
    add("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in dispatch["results"]:
        add(f"| {r['in_flight']:,} | {r['batch']} | {r['rows_per_s']:,} | "
            f"{r['admit_dispatch_rows_per_s']:,} | {r['completion_rows_per_s']:,} | "
            f"{r['us_per_row']} |")
    add("")
    add(f"{dispatch['rows_per_config']:,} attempts per configuration, one dispatcher task: "
        "reserve rows, `gate.admit()`, one mutation with `mark_dispatched` + a no-op submit, "
        "one completion mutation per attempt, `take_ready`. A row is one attempt (one `/run` "
        "row).")
    add("")

    if checkpoint is not None:
        _checkpoint_section(add, checkpoint)
    add("## Pending")
    add("")
    add(PHASE2_PENDING)
    add("")

    add("## How each figure is measured")
    add("")
    add("- **Wake latency**: `perf_counter_ns()` as the last statement of the last pending "
        "reply's mutation function → right after `runtime.wait_drained` returns. Includes the "
        "predicate evaluation for that mutation, the event, scheduling, and the drain's return.")
    add("- **Per wakeup (ours)**: the drain's own condition, timed around each real evaluation "
        "(`wait_drained` gets a delegating proxy whose barrier wraps the condition it passes, "
        f"here `{head['ours'].get('drain_primitive') or '?'}`), median over all evaluations, "
        "minus the wrapper's cost. Cross-check (A/B): a pending reply's `mutate_nowait` with "
        "the drain parked minus without any waiter.")
    add("- **Per wakeup (polling)**: one poll = rebuild the inventory by walking every attempt "
        "and grouping DISPATCHED ones by instance, then check the on-wire IDs "
        "(`benchmarks/baseline.py`). Delivery starts at a random phase of the 50 ms period.")
    add("- **Loop stall**: a `trio.abc.Instrument` cuts the loop's time at every task start and "
        "every idle I/O wait; the longest interval is the longest time no other task could run "
        "(a task step plus scheduler work, GC included). Wall time and thread CPU time; a "
        "`gc.callbacks` monitor gives the collector's pauses, which are subtracted for the "
        "\"excluding GC\" figure. It runs in a separate pass of the same trials (half as many), "
        "because its CPU clock costs a system call per cut; the latency trials run without any "
        "instrument, and their GC pauses count toward the longest stall. Set-up and the "
        "top-up between trials are excluded.")
    add("- **Wake breakdown** (reply → drain running, drain's own step): a `before_task_step` "
        "probe armed before the last reply, in the instrumented passes (adds about a "
        "microsecond).")
    add("- **Floor**: `Event.set()` → the waiter running with the setter parked, same `trio.run`.")
    add("")
    add("Reproduce: `" + meta["command"] + "` (a few minutes); `--quick` for a smoke run; "
        "`gymckpt bench drain --rollouts 200000 --json` for the drain alone.")
    add("")
    write_atomic(path, "\n".join(L).encode())


# -- everything ----------------------------------------------------------------------------------


def run_all(
    *,
    drain_cfg: DrainConfig,
    memory_sizes: tuple[int, ...],
    dispatch_cfg: DispatchConfig,
    checkpoint_cfg: CheckpointConfig,
    out: Path,
    meta: dict[str, Any],
    progress: Progress,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    drain = run_drain(drain_cfg, progress, gc_freeze_variant=True)
    _dump(out / "drain.json", {**drain, "meta": meta})
    memory = run_memory(memory_sizes, progress)
    _dump(out / "memory.json", {**memory, "meta": meta})
    dispatch = run_dispatch(dispatch_cfg, progress)
    _dump(out / "dispatch.json", {**dispatch, "meta": meta})
    checkpoint = run_checkpoint(checkpoint_cfg, progress)
    _dump(out / "checkpoint.json", {**checkpoint, "meta": meta})
    progress("writing plots and SUMMARY.md")
    plots = plot_drain(drain, out) + plot_checkpoint(checkpoint, out)
    summary = out / "SUMMARY.md"
    write_summary(summary, drain, memory, dispatch, meta, plots, checkpoint)
    files = [out / "drain.json", out / "memory.json", out / "dispatch.json",
             out / "checkpoint.json", *plots, summary]
    headline = {k: v for k, v in drain.items() if not isinstance(v, dict | list)}
    return {
        "drain": headline,
        "memory": {k: v for k, v in memory.items() if not isinstance(v, dict | list)},
        "dispatch": {k: v for k, v in dispatch.items() if not isinstance(v, dict | list)},
        "checkpoint": {k: v for k, v in checkpoint.items() if not isinstance(v, dict | list)},
        "files": [str(p) for p in files],
        "meta": meta,
    }


def rerender(out: Path) -> dict[str, Any]:
    """Rewrite the plots and SUMMARY.md from the JSON results already in ``out`` (after a
    change to the report itself; the figures and the command that produced them are kept)."""
    def load(name: str) -> dict[str, Any] | None:
        path = out / name
        if not path.exists():
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    drain, memory, dispatch = load("drain.json"), load("memory.json"), load("dispatch.json")
    if drain is None or memory is None or dispatch is None:
        raise ValueError(f"{out} lacks drain.json, memory.json or dispatch.json; run `all` first")
    checkpoint = load("checkpoint.json")
    meta = drain["meta"]
    plots = plot_drain(drain, out) + (plot_checkpoint(checkpoint, out) if checkpoint else [])
    write_summary(out / "SUMMARY.md", drain, memory, dispatch, meta, plots, checkpoint)
    return {"files": [str(p) for p in [*plots, out / "SUMMARY.md"]], "meta": meta}
