"""The report's plots (PNG, matplotlib's Agg backend, imported only when a plot is drawn):
one function per benchmark, each returning the files it wrote (none when the result has
nothing to draw)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fanout import OPS
from ._records import (
    CheckpointResult,
    DrainResult,
    DrainWakeControl,
    FanoutResult,
    PreservedResult,
    WakeByPending,
)
from ._targets import TARGETS

__all__ = ["plot_checkpoint", "plot_drain", "plot_fanout", "plot_preserved"]


def plot_drain(drain: DrainResult, out: Path) -> list[Path]:
    """Wake latency and per-wakeup cost against in-flight size (log axes), ours vs polling; and
    wake latency against the number pending at the headline size."""
    plt = _pyplot()
    files = [_plot_wake(plt, drain, out), _plot_wakeup_cost(plt, drain, out)]
    if drain.wake_by_pending:
        files.append(_plot_wake_by_pending(plt, drain, drain.wake_by_pending, out))
    return files


def _pos(v: float) -> float:
    """A value drawn on log axes: at least 0.001."""
    return max(v, 1e-3)


def _plot_wake(plt: Any, drain: DrainResult, out: Path) -> Path:
    """Wake latency against rollouts in flight: ours (median, p99), polling, bare trio."""
    sweep = drain.sweep
    xs = [r.in_flight for r in sweep]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    ax.plot(
        xs,
        [_pos(r.ours.wake.median_us) for r in sweep],
        "o-",
        color="tab:blue",
        label=f"event-driven drain, median ({drain.pending} pending)",
    )
    ax.plot(
        xs,
        [_pos(r.ours.wake.p99_us) for r in sweep],
        "o--",
        color="tab:blue",
        alpha=0.5,
        label="event-driven drain, p99",
    )
    ax.plot(
        xs,
        [_pos(r.baseline.wake.median_ms * 1e3) for r in sweep],
        "s-",
        color="tab:red",
        label="polling drain (50 ms), median",
    )
    ax.plot(
        xs,
        [_pos(r.trio_wake_floor.median_us) for r in sweep],
        "^:",
        color="gray",
        label="bare trio wake (Event.set → waiter), median",
    )
    ax.axhline(
        TARGETS["drain_wake_us_median"],
        color="tab:green",
        ls="--",
        lw=1,
        label="target: 50 µs median",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts in flight")
    ax.set_ylabel("wake latency after the last pending reply (µs)")
    ax.set_title("Drain wake latency vs rollouts in flight")
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return _save(plt, fig, out / "drain_wake_latency.png")


def _plot_wakeup_cost(plt: Any, drain: DrainResult, out: Path) -> Path:
    """CPU per wakeup against rollouts in flight: ours, polling, and a line linear in N."""
    sweep = drain.sweep
    xs = [r.in_flight for r in sweep]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    ax.plot(
        xs,
        [_pos(r.ours.per_wakeup_us) for r in sweep],
        "o-",
        color="tab:blue",
        label="event-driven: one predicate evaluation (median)",
    )
    ax.plot(
        xs,
        [_pos(r.ours.per_reply_overhead_us) for r in sweep],
        "o--",
        color="tab:cyan",
        label="event-driven: A/B cost added to a pending reply's mutation",
    )
    ax.plot(
        xs,
        [_pos(r.baseline.per_wakeup_us) for r in sweep],
        "s-",
        color="tab:red",
        label="polling: one poll = full inventory scan (median)",
    )
    if len(xs) >= 2:
        base0 = sweep[0].baseline.per_wakeup_us
        ax.plot(
            xs,
            [_pos(base0 * x / xs[0]) for x in xs],
            ":",
            color="tab:red",
            alpha=0.4,
            label="linear in N (from the smallest size)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts in flight")
    ax.set_ylabel("CPU per wakeup (µs)")
    ax.set_title("Drain cost per wakeup vs rollouts in flight")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return _save(plt, fig, out / "drain_per_wakeup_cost.png")


def _plot_wake_by_pending(
    plt: Any, drain: DrainResult, by_p: list[WakeByPending], out: Path
) -> Path:
    """Where the wake latency goes against the number pending, at the headline size."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=130)
    bars: list[tuple[str, WakeByPending | DrainWakeControl]] = [(str(r.pending), r) for r in by_p]
    ctrl = drain.one_pending_after_same_traffic
    if ctrl is not None:
        bars.append((f"1, after\n{ctrl.unrelated_mutations_before:,} other\nmutations", ctrl))
    labels = [b for b, _ in bars]
    sched = [r.reply_to_drain_running_us_median for _, r in bars]
    step = [r.drain_step_us_median for _, r in bars]
    ax.bar(labels, sched, color="tab:gray", label="last reply → drain task running")
    ax.bar(labels, step, bottom=sched, color="tab:blue", label="drain task's own step after waking")
    ax.plot(labels, [r.wake_us_median for _, r in bars], "ko", label="wake latency (median)")
    ax.axhline(
        TARGETS["drain_wake_us_median"], color="tab:green", ls="--", lw=1, label="target: 50 µs"
    )
    ax.set_xlabel(
        f"episodes pending (on the wire), {drain.rollouts:,} in flight; "
        f"{drain.config.interleave} other mutations before each reply"
    )
    ax.set_ylabel("µs (medians)")
    ax.set_title("Where the drain's wake latency goes")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return _save(plt, fig, out / "drain_wake_vs_pending.png")


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` and close it."""
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_checkpoint(ck: CheckpointResult, out: Path) -> list[Path]:
    """Stage breakdown of one whole checkpoint: wall time and longest loop stall per stage."""
    plt = _pyplot()

    rows = ck.stages
    names = [r.stage for r in rows][::-1]
    floor = 0.01  # ms; the log axes start here, values under it are drawn at it
    wall = [max(r.wall_ms, floor) for r in rows][::-1]
    stall = [max(r.max_loop_stall_ms or 0.1, floor) for r in rows][::-1]
    cpu = [max(r.max_loop_stall_cpu_ms or 0.1, floor) for r in rows][::-1]
    gym = [r.in_gym_calls_ms for r in rows][::-1]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.8), dpi=130, sharey=True)
    y = list(range(len(names)))
    a1.barh(y, [w - floor for w in wall], left=floor, color="tab:blue", label="stage wall time")
    gy = [(i, min(g, w)) for i, (g, w) in enumerate(zip(gym, wall, strict=True)) if g > floor]
    if gy:
        a1.barh(
            [i for i, _ in gy],
            [g - floor for _, g in gy],
            left=floor,
            height=0.4,
            color="tab:orange",
            label="of which inside Gym calls",
        )
    a1.set_xscale("log")
    a1.set_xlim(left=floor)
    a1.set_yticks(y, names)
    a1.set_xlabel("ms (log)")
    a1.set_title("Stage wall time")
    a1.grid(True, axis="x", which="both", alpha=0.3)
    a2.barh(
        [v - 0.2 for v in y],
        [v - floor for v in stall],
        left=floor,
        height=0.4,
        color="tab:red",
        label="longest stall, wall",
    )
    a2.barh(
        [v + 0.2 for v in y],
        [v - floor for v in cpu],
        left=floor,
        height=0.4,
        color="tab:purple",
        label="longest stall, loop-thread CPU",
    )
    a2.axvline(TARGETS["loop_stall_ms"], color="tab:green", ls="--", lw=1, label="target 10 ms")
    a2.set_xscale("log")
    a2.set_xlim(left=floor)
    a2.set_xlabel("ms (log; 0.1 = under 0.1 ms)")
    a2.set_title("Longest loop stall in the stage")
    a2.grid(True, axis="x", which="both", alpha=0.3)
    fig.legend(fontsize=8, loc="lower center", ncol=5, frameon=False)
    fig.suptitle(f"One checkpoint at {ck.in_flight:,} in flight on the embedded Gym")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return [_save(plt, fig, out / "checkpoint_stages.png")]


def plot_fanout(fo: FanoutResult, out: Path) -> list[Path]:
    """Stage time and slowest instance against actors (measured), and the linear model
    extended to 256 actors."""
    import matplotlib.ticker

    plt = _pyplot()

    ok = [r for r in fo.results if r.ok]
    if not ok:
        return []
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    xs = [r.actors for r in ok]
    colors = {"prepare": "tab:blue", "commit": "tab:red", "resume": "tab:green"}
    for op in OPS:
        c = colors[op]
        ax.plot(xs, [r.op(op).stage_ms for r in ok], "o-", color=c, label=f"{op}: stage")
        ax.plot(
            xs,
            [r.op(op).slowest_ms for r in ok],
            "x:",
            color=c,
            alpha=0.7,
            label=f"{op}: slowest instance",
        )
        m = (fo.models or {}).get(f"{op}_stage_ms")
        if m is not None:
            grid = [1, 2, 4, 8, 16, 32, 64, 128, 256]
            ax.plot(
                grid,
                [max(m.a_ms + m.b_ms_per_actor * k, 0.1) for k in grid],
                "--",
                color=c,
                alpha=0.35,
                lw=1,
                label=f"{op}: model {m.a_ms:.1f} + {m.b_ms_per_actor:.2f}·K ms (R² {m.r2})",
            )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("Ray actors (Gym instances)")
    ax.set_ylabel("ms per checkpoint (median)")
    ax.set_title("Control fan-out on Ray (measured to 16 actors; dashed: the model)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return [_save(plt, fig, out / "fanout.png")]


def plot_preserved(pv: PreservedResult, out: Path) -> list[Path]:
    """Per kill time: the in-flight rollout-seconds (what the baseline redoes), split into what
    gymckpt keeps and what it redoes; and the fraction redone."""
    plt = _pyplot()

    ks = pv.per_kill
    if not ks:
        return []
    fig, (a1, a2) = plt.subplots(
        2, 1, figsize=(8, 6.4), dpi=130, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    xs = list(range(len(ks)))
    redo = [k.gymckpt_redone_rollout_s for k in ks]
    kept = [k.baseline_redone_rollout_s - k.gymckpt_redone_rollout_s for k in ks]
    a1.bar(xs, redo, color="tab:red", label="redone after the restore by gymckpt")
    a1.bar(
        xs,
        kept,
        bottom=redo,
        color="tab:blue",
        alpha=0.6,
        label="kept by gymckpt's snapshot (redone by the step-boundary baseline)",
    )
    a1.set_ylim(0, 1.3 * max(k.baseline_redone_rollout_s for k in ks) + 1)
    a1.set_ylabel("rollout-seconds")
    a1.set_title("Work at risk at each crash: in-flight rollout-seconds")
    a1.legend(fontsize=8, loc="upper left")
    a1.grid(True, axis="y", alpha=0.3)
    a2.plot(
        xs,
        [100 * (k.gymckpt_redone_fraction or 0) for k in ks],
        "o-",
        color="tab:red",
        label="gymckpt",
    )
    a2.plot(xs, [100.0] * len(xs), "s--", color="gray", label="step-boundary baseline")
    a2.set_ylim(0, 110)
    a2.set_ylabel("% redone")
    a2.set_xticks(xs, [f"{k.kill_s:.0f} s" for k in ks], fontsize=8)
    a2.set_xlabel("kill time (simulated seconds into the run)")
    a2.legend(fontsize=8, loc="center right")
    a2.grid(True, alpha=0.3)
    fig.tight_layout()
    return [_save(plt, fig, out / "preserved_work.png")]
