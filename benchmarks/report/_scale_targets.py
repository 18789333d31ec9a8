"""The targets at scale (issue 34): checkpoints that always complete, every backend at 200k in
under 2 s without stall or pause, HTTP within a bounded number of sockets, dispatch through
the whole loop near the runtime's own rate, the host's cost on CartPole, and the trainer side
alone at 1M. One row per target, judged on the figures of one run (ratios within it); the
unaligned embedded targets at 200k are the rows ``unaligned_*`` of ``_targets``.

Each row is not measured when its figure is absent (the benchmark was not run, or its result
predates the figure) or measured at another size than the target's, so a quick run never
passes for one that met a target.
"""

from __future__ import annotations

from collections.abc import Callable

from ._format import TIMES, at_size, first_line, fmt, ratio
from ._records import (
    CheckpointRayResult,
    CheckpointRemoteResult,
    CheckpointResult,
    DispatchResult,
    HostResult,
    ModeCheckpoint,
    TrainerSideResult,
)

__all__ = ["SCALE_TARGETS", "scale_rows"]

SCALE_TARGETS = {
    "complete_pct": 100.0,
    "until_all_moving_s": 2.0,
    "pause_p99_ms": 10.0,
    "loop_stall_ms": 10.0,
    "http_sockets": 1_000,
    "dispatch_share": 0.40,
    "dispatch_rows_per_s": 30_000,
    "host_over_plain": 1.5,
    "marks_aligned_us": 1.0,
    "trainer_side_s": 2.0,
}
"""Each target's threshold. ``marks_aligned_us``: the target is 0 µs; a difference of two
medians of the same trials within 1 µs of a step is taken as 0 (measurement noise)."""

NOISE_US = SCALE_TARGETS["marks_aligned_us"]

LOOP_ATTEMPTS = 65_536
"""Attempts per whole-loop dispatch run at the target's size (``DispatchConfig``'s default)."""

Row = Callable[..., None]
"""``_targets._Rows``: adds one row (key, figure, target, measured, ok, exact_size, ...)."""


def scale_rows(
    row: Row,
    checkpoint: CheckpointResult | None,
    checkpoint_ray: CheckpointRayResult | None,
    dispatch: DispatchResult | None,
    host: HostResult | None,
    trainer_side: TrainerSideResult | None,
) -> None:
    """The rows, in the issue's order."""
    _complete_row(row, checkpoint)
    _remote_rows(row, "ray", checkpoint_ray)
    _remote_rows(row, "http", None if checkpoint_ray is None else checkpoint_ray.http)
    _dispatch_rows(row, dispatch)
    _host_rows(row, host)
    _trainer_side_row(row, trainer_side)


def _complete_row(row: Row, checkpoint: CheckpointResult | None) -> None:
    """The default configuration's aligned checkpoint with heavy-tailed turns: every one
    completes (the reference protocol's share beside, and the cost against pure unaligned)."""
    fig = (
        "aligned checkpoints with heavy-tailed turns (p99 far above every timeout) that "
        "complete, default alignment timeout, embedded at 200k (pure unaligned beside)"
    )
    modes = (checkpoint.modes or {}) if checkpoint is not None else {}
    t = modes.get("aligned_timeout")
    if checkpoint is None or t is None or t.complete_pct is None:
        row("aligned_timeout_complete", fig, "100 %", "not run", None)
        return
    u, a = modes.get("unaligned"), modes.get("aligned")
    p99 = (checkpoint.turn_times or {}).get("p99_s")
    far = p99 is not None and t.control_timeout_s is not None and p99 >= 10 * t.control_timeout_s
    vs = t.vs_unaligned or {}
    text = (
        f"{fmt(t.complete_pct, ' %', 0)} of {t.checkpoints} ({fmt(t.mid_turn_median, '', 0)} "
        f"episodes mid-turn, median); until every episode moves "
        f"{fmt(t.until_all_moving_with_wait_s, ' s', 2)} with its "
        f"{fmt(t.alignment_timeout_s, ' s', 1)} wait (pure unaligned "
        f"{fmt(None if u is None else u.until_all_moving_s, ' s', 2)}, "
        f"{fmt(vs.get('until_all_moving_with_wait_s'), TIMES, 1)}); pause p50 / p99 "
        f"{fmt(t.pause_p50_ms_median, ' ms', 1)} / {fmt(t.pause_p99_ms_median, ' ms', 0)} "
        f"(unaligned {fmt(None if u is None else u.pause_p99_ms_median, ' ms', 1)} p99)"
        f"; turns p99 {fmt(p99, ' s', 0)} against a {fmt(t.control_timeout_s, ' s', 0)} "
        "control timeout"
        + ("" if a is None else f"; the reference protocol {_share(a)}")
        + at_size(checkpoint.in_flight, 200_000)
    )
    row(
        "aligned_timeout_complete",
        fig,
        "100 %",
        text,
        t.complete_pct >= SCALE_TARGETS["complete_pct"],
        checkpoint.in_flight >= 200_000 and far,
        why="" if far else "the turns' p99 is not far above the control timeout",
    )


def _share(m: ModeCheckpoint) -> str:
    """A mode's share of checkpoints that completed, and why the others did not."""
    if m.complete_pct is None:
        return "completed" if m.checkpoint_ok else f"failed ({first_line(m.checkpoint_error)})"
    text = f"completed {fmt(m.complete_pct, ' %', 0)} of {m.checkpoints}"
    if not m.checkpoint_ok:
        text += f" ({m.checkpoint_failure}: {first_line(m.checkpoint_error, 120)})"
    return text


def _remote_rows(row: Row, backend: str, r: CheckpointRemoteResult | None) -> None:
    """The unaligned checkpoint at 200k on Ray (4 actors) or over HTTP (4 servers): until
    every episode moves, per-episode pause p99, trainer-loop stall; HTTP's sockets."""
    name = {"ray": "Ray, 4 actors", "http": "HTTP, 4 servers"}[backend]
    u = None if r is None else (r.modes or {}).get("unaligned")
    rows = (
        (f"{backend}_until_moving", "until every episode moves", "≤ 2 s"),
        (f"{backend}_pause_p99", "per-episode pause p99", "≤ 10 ms"),
        (f"{backend}_stall", "longest trainer-loop stall, all causes", "≤ 10 ms"),
    )
    if r is None or u is None or not u.checkpoint_ok:
        error = None if r is None else r.checkpoint_error or r.error
        if error is None and u is not None:
            error = u.checkpoint_error
        why = "not run" if r is None else f"failed: {first_line(error)}"
        for key, what, tgt in rows:
            row(key, f"unaligned checkpoint at 200k, {name}: {what}", tgt, why, None)
    else:
        full = (r.in_flight or 0) >= 200_000 and r.actors == 4
        size = at_size(r.in_flight, 200_000)
        figures = (
            (u.until_all_moving_s, " s", 2, SCALE_TARGETS["until_all_moving_s"]),
            (u.pauses.pause_p99_ms, " ms", 1, SCALE_TARGETS["pause_p99_ms"]),
            (u.stall_all_causes_ms(), " ms", 1, SCALE_TARGETS["loop_stall_ms"]),
        )
        for (key, what, tgt), (v, unit, digits, limit) in zip(rows, figures, strict=True):
            row(
                key,
                f"unaligned checkpoint at 200k, {name}: {what}",
                tgt,
                fmt(v, unit, digits) + f" ({r.actors} instances)" + size,
                v <= limit,
                full,
            )
    if backend == "http":
        sockets = None if r is None else r.client_sockets_max
        row(
            "http_sockets",
            "the trainer's open sockets at 200k in flight over HTTP, 4 servers",
            "≤ 1,000",
            "not measured"
            if sockets is None
            else f"{sockets:,}" + at_size(r and r.in_flight, 200_000),
            None if sockets is None else sockets <= SCALE_TARGETS["http_sockets"],
            r is not None and (r.in_flight or 0) >= 200_000,
        )


def _dispatch_rows(row: Row, dispatch: DispatchResult | None) -> None:
    """Dispatch through the whole loop on the embedded Gym (one-turn episodes), against the
    runtime alone (the null Gym) in the same run, and in rows/s."""
    emb = None if dispatch is None else dispatch.loop_rows_per_s_embedded
    null = None if dispatch is None else dispatch.loop_rows_per_s_null
    share = ratio(emb, null)
    attempts = ((dispatch.config or {}) if dispatch is not None else {}).get("loop_attempts")
    full = attempts is not None and attempts >= LOOP_ATTEMPTS
    size = (
        "" if full else f" ({attempts or 'n/a'} attempts a run; the target's is {LOOP_ATTEMPTS:,})"
    )
    fig = "dispatch through the whole loop, embedded, one-turn episodes"
    row(
        "dispatch_loop_share",
        f"{fig}, as a share of the runtime alone (null Gym, same run)",
        "≥ 40 %",
        "not run (`bench dispatch --loop`)"
        if share is None
        else f"{fmt(100 * share, ' %', 1)} ({emb:,} of {null:,} rows/s{_bare(dispatch)})" + size,
        None if share is None else share >= SCALE_TARGETS["dispatch_share"],
        full,
    )
    row(
        "dispatch_loop_rows_per_s",
        fig,
        "≥ 30,000 rows/s",
        "not run (`bench dispatch --loop`)" if emb is None else f"{emb:,} rows/s" + size,
        None if emb is None else emb >= SCALE_TARGETS["dispatch_rows_per_s"],
        full,
    )


def _bare(dispatch: DispatchResult | None) -> str:
    """The host alone beside (episodes that end at their first step), when measured."""
    bare = None if dispatch is None else dispatch.loop_rows_per_s_bare
    null = None if dispatch is None else dispatch.loop_rows_per_s_null
    if bare is None:
        return ""
    share = ratio(bare, null)
    return (
        f"; the host alone, episodes that end at their first step: {bare:,}, "
        f"{fmt(None if share is None else 100 * share, ' %', 1)}"
    )


def _host_rows(row: Row, host: HostResult | None) -> None:
    """CartPole: a hosted step against plain Gymnasium; marks in an aligned run."""
    ps = None if host is None else host.per_step
    row(
        "host_step_ratio",
        "CartPole hosted step against plain Gymnasium (default host)",
        f"≤ 1.5{TIMES}",
        "not run (`bench host`)"
        if ps is None
        else f"{fmt(ps.host_over_plain_ratio, TIMES, 2)} ({fmt(ps.host_us_per_step_median, ' µs')} "
        f"against {fmt(ps.plain_us_per_step_median, ' µs')}; marks on demand "
        f"{fmt(ps.host_on_demand_over_plain_ratio, TIMES, 2)})",
        None if ps is None else ps.host_over_plain_ratio <= SCALE_TARGETS["host_over_plain"],
        ps is not None and ps.episodes == 256,
    )
    marks = None if ps is None else ps.marks_on_demand_us_per_step
    row(
        "host_marks_aligned",
        'boundary marks in an aligned run, CartPole, `boundary_marks="on_demand"` (against '
        "the environment opted out, same trials)",
        "0 µs",
        "not run (`bench host`)"
        if ps is None
        else "not measured (host.json predates it)"
        if marks is None
        else f"{fmt(marks, ' µs', 2)} per step (up to {NOISE_US:g} µs counts as 0: the noise "
        "of two medians)",
        None if marks is None else marks <= SCALE_TARGETS["marks_aligned_us"],
        ps is not None and ps.episodes == 256,
    )


def _trainer_side_row(row: Row, ts: TrainerSideResult | None) -> None:
    """One whole checkpoint at 1M in flight against a Gym that answers at once."""
    fig = "trainer side alone at 1M in flight, close to resume (null Gym)"
    if ts is None:
        row("trainer_side_1M", fig, "≤ 2 s", "not run (`bench checkpoint --backend null`)", None)
    elif not ts.checkpoint_ok:
        row("trainer_side_1M", fig, "≤ 2 s", f"failed: {first_line(ts.checkpoint_error)}", False)
    else:
        row(
            "trainer_side_1M",
            fig,
            "≤ 2 s",
            f"{fmt(ts.close_to_resume_s, ' s', 2)} (longest loop stall "
            f"{fmt(ts.stall_all_causes_ms, ' ms', 1)})" + at_size(ts.in_flight, 1_000_000),
            ts.close_to_resume_s <= SCALE_TARGETS["trainer_side_s"],
            ts.in_flight >= 1_000_000,
        )
