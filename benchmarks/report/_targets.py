"""The project's targets and the verdict on each: one ``TargetRow`` per figure, with what was
measured and a ``Status``. A figure measured at another size than its target's is *not
measured* (the figure is still shown), so a quick run is never passed off as meeting a target."""

from __future__ import annotations

import enum

import attrs

from ._format import TIMES, at_size, first_line, fmt, pct, ratio
from ._records import (
    CheckpointRayResult,
    CheckpointRemoteResult,
    CheckpointResult,
    DispatchResult,
    DrainResult,
    FanoutResult,
    HostMarksResult,
    HostResult,
    MemoryResult,
    PreservedResult,
    SandboxResult,
    TrainerSideResult,
)
from ._scale_targets import scale_rows

__all__ = ["TARGETS", "Status", "TargetRow", "targets"]

TARGETS = {
    "ledger_bytes_per_attempt": 100.0,
    "gc_full_ms": 10.0,
    "drain_wake_us_median": 50.0,
    "drain_wake_ms_p99": 0.25,
    "speedup": 2500.0,
    "loop_stall_ms": 10.0,
    "checkpoint_e2e_s": 2.0,
    "rows_per_s_embedded": 50_000,
    "rows_per_s_ray": 10_000,
    "unaligned_pause_ms_p99": 10.0,
    "unaligned_parked_fraction": 0.005,
    "host_marks_ratio": 0.10,
    "sandbox_second_over_first": 0.05,
}


class Status(enum.StrEnum):
    """A target's verdict; the value is what the JSON results and the tests read."""

    MET = "met"
    MISSED = "MISSED"
    NOT_MEASURED = "not measured"
    REPORTED = "reported"  # a figure with no threshold, measured at its size

    def cell(self) -> str:
        """The verdict as the targets table shows it."""
        return self.value if self is Status.REPORTED else f"**{self.value}**"


@attrs.frozen
class TargetRow:
    """One target: ``key`` names it in the JSON results; ``measured`` is the figure as the
    report prints it (with the size it was measured at when that is not the target's)."""

    key: str
    figure: str
    target: str
    measured: str
    status: Status
    why: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "key": self.key,
            "figure": self.figure,
            "target": self.target,
            "measured": self.measured,
            "status": self.status.value,
            "why": self.why,
        }


def targets(
    drain: DrainResult,
    memory: MemoryResult,
    checkpoint: CheckpointResult | None,
    fanout: FanoutResult | None,
    preserved: PreservedResult | None,
    checkpoint_ray: CheckpointRayResult | None = None,
    host_marks: HostMarksResult | None = None,
    *,
    dispatch: DispatchResult | None = None,
    host: HostResult | None = None,
    trainer_side: TrainerSideResult | None = None,
    sandbox: SandboxResult | None = None,
) -> list[TargetRow]:
    """The project's targets, each with the figure measured and its ``Status``: met,
    missed or not measured (a figure measured at another size than the target's counts as
    not measured; the figure is still shown); a figure to be reported only (no threshold)
    is ``REPORTED`` once measured at its size, ``MISSED`` if the run failed. The targets at
    scale (``_scale_targets``) come last."""
    row = _Rows()
    _memory_rows(row, memory)
    _drain_rows(row, drain)
    _checkpoint_rows(row, checkpoint)
    _ray_checkpoint_row(row, checkpoint_ray, fanout)
    _ray_rows(row, fanout)
    _http_rows(row, fanout, checkpoint_ray)
    _mode_rows(row, checkpoint, checkpoint_ray, preserved)
    _preserved_row(row, preserved)
    _host_marks_row(row, host_marks)
    scale_rows(row, checkpoint, checkpoint_ray, dispatch, host, trainer_side)
    _sandbox_rows(row, sandbox)
    return row.rows


@attrs.define
class _Rows:
    """The targets table as it is written, one ``row(...)`` call per target, in order."""

    rows: list[TargetRow] = attrs.Factory(list)

    def __call__(
        self,
        key: str,
        figure: str,
        target: str,
        measured: str,
        ok: bool | None,
        exact_size: bool = True,
        why: str = "",
        report_only: bool = False,
    ) -> None:
        """Add a row: ``ok`` None (or a figure at another size than the target's) is not
        measured; ``report_only`` rows are ``REPORTED`` when ``ok``."""
        status = (
            Status.NOT_MEASURED
            if ok is None or not exact_size
            else (Status.REPORTED if report_only else Status.MET)
            if ok
            else Status.MISSED
        )
        self.rows.append(TargetRow(key, figure, target, measured, status, why))


def _memory_rows(row: _Rows, memory: MemoryResult) -> None:
    """Ledger storage at 1M attempts: bytes per attempt, a full collection."""
    mem = {(r.target_attempts, r.mode): r for r in memory.results}
    sizes = sorted({n for n, _m in mem})
    n_mem = 1_000_000 if 1_000_000 in sizes else (sizes[-1] if sizes else None)
    t = mem.get((n_mem, "tracemalloc")) if n_mem else None
    rss = mem.get((n_mem, "rss")) if n_mem else None
    bpa = t.bytes_per_attempt if t else None
    row(
        "ledger_bytes_per_attempt",
        "ledger bytes per attempt at 1M attempts",
        "≤ 100 B",
        fmt(bpa, " B", 0) + at_size(n_mem, 1_000_000),
        None if bpa is None else bpa <= TARGETS["ledger_bytes_per_attempt"],
        n_mem == 1_000_000,
    )
    # what a trainer process pays: open_rollouts froze what lived at its start (the imports),
    # so a full collection walks what the runtime built since (runtime.freeze_startup_objects)
    gcms = rss.gc_full_ms_ledger_only if rss else None
    unfrozen = rss.gc_full_ms_with_ledger if rss else None
    row(
        "gc_full_ms_1M",
        "one full garbage collection with 1M attempts held (startup objects "
        "frozen by `open_rollouts`)",
        "≤ 10 ms",
        fmt(gcms, " ms", 2)
        + at_size(n_mem, 1_000_000)
        + ("" if unfrozen is None else f" ({fmt(unfrozen, ' ms', 1)} with nothing frozen)"),
        None if gcms is None else gcms <= TARGETS["gc_full_ms"],
        n_mem == 1_000_000,
    )


def _drain_rows(row: _Rows, drain: DrainResult) -> None:
    """The drain at 200k in flight: wake median and p99, speedup over polling, loop stall."""
    n_d = drain.rollouts
    wake = drain.drain_wake_us_median
    p99_ms = drain.drain_wake_ms_p99
    row(
        "drain_wake_median",
        "drain wake latency, median",
        "≤ 50 µs",
        fmt(wake, " µs") + at_size(n_d, 200_000),
        wake <= TARGETS["drain_wake_us_median"],
        n_d == 200_000,
    )
    row(
        "drain_wake_p99",
        "drain wake latency, p99",
        "≤ 0.25 ms",
        fmt(p99_ms, " ms", 3) + at_size(n_d, 200_000),
        p99_ms <= TARGETS["drain_wake_ms_p99"],
        n_d == 200_000,
    )
    sp = drain.speedup
    row(
        "drain_speedup",
        "speedup over the polling drain (medians, same run)",
        f"≥ 2,500{TIMES}",
        fmt(sp, TIMES, 0) + at_size(n_d, 200_000),
        None if sp is None else sp >= TARGETS["speedup"],
        n_d == 200_000,
    )
    st = drain.max_loop_stall_ms
    row(
        "drain_stall",
        "longest event-loop stall during the drain, all causes, GC included",
        "≤ 10 ms",
        fmt(st, " ms", 2) + at_size(n_d, 200_000),
        st <= TARGETS["loop_stall_ms"],
        n_d == 200_000,
    )


def _checkpoint_rows(row: _Rows, checkpoint: CheckpointResult | None) -> None:
    """The whole checkpoint on the embedded host: stall, close to resume, dispatch."""
    if checkpoint is not None:
        n_c = checkpoint.in_flight
        cst = checkpoint.max_loop_stall_ms
        # all causes: a task step (GC in it included), and the loop waiting for the GIL while
        # a worker thread holds it, which only the 1 ms heartbeat's lateness shows
        late = max(
            [r.heartbeat_max_late_ms or 0.0 for r in checkpoint.stages],
            default=0.0,
        )
        row(
            "checkpoint_stall",
            "longest event-loop stall during a whole checkpoint, embedded host, all causes",
            "≤ 10 ms",
            fmt(max(cst, late), " ms", 1)
            + at_size(n_c, 200_000)
            + (
                f" (task steps {fmt(cst, ' ms', 1)}; the loop's 1 ms heartbeat up to "
                f"{fmt(late, ' ms', 1)} late)"
                if late
                else ""
            ),
            max(cst, late) <= TARGETS["loop_stall_ms"],
            n_c >= 200_000,
        )
        e2e = checkpoint.e2e_s
        turn = checkpoint.turn_time_wall_s
        row(
            "checkpoint_e2e",
            "whole checkpoint, embedded host, close to resume, less the episodes' turn time",
            "≤ 2 s",
            f"{fmt(e2e, ' s', 2)} (+ {fmt(turn, ' s', 1)} turn time)" + at_size(n_c, 200_000),
            None if e2e is None else e2e <= TARGETS["checkpoint_e2e_s"],
            n_c >= 200_000,
        )
        emb = checkpoint.embedded_dispatch or []
        # the target's one-step episode; results from before it was measured: the calendar's
        one = [r for r in emb if r.environment == "one_step"] or emb
        best = max(one, key=lambda r: r.rows_per_s) if one else None
        row(
            "dispatch_embedded",
            "dispatch through the whole loop, embedded (one-step episodes)",
            "≥ 50,000 rows/s",
            "n/a"
            if best is None
            else f"{best.rows_per_s:,} rows/s (batch {best.batch}"
            f"{'' if best.environment is None else ', ' + best.environment})",
            None if best is None else best.rows_per_s >= TARGETS["rows_per_s_embedded"],
        )
    else:
        for key, fig, tgt in (
            ("checkpoint_stall", "longest stall during a whole checkpoint at 200k", "≤ 10 ms"),
            ("checkpoint_e2e", "whole checkpoint at 200k, embedded host", "≤ 2 s"),
            ("dispatch_embedded", "dispatch through the whole loop, embedded", "≥ 50,000 rows/s"),
        ):
            row(key, fig, tgt, "not run", None)


def _ray_checkpoint_row(
    row: _Rows, cr: CheckpointRayResult | None, fanout: FanoutResult | None
) -> None:
    """The whole checkpoint on Ray (reported, no threshold)."""
    if cr is None:  # results from before the Ray checkpoint was part of `bench all`: not run
        row(
            "checkpoint_e2e_ray",
            "whole checkpoint at 200k on Ray with 4 actors",
            "report",
            "not run (--no-ray)" if fanout is None else "not run",
            None,
        )
    elif not cr.checkpoint_ok:
        row(
            "checkpoint_e2e_ray",
            "whole checkpoint at 200k on Ray with 4 actors",
            "report",
            _failure(cr),
            False,
            report_only=True,
        )
    else:
        n_r = cr.in_flight
        row(
            "checkpoint_e2e_ray",
            "whole checkpoint at 200k on Ray with 4 actors",
            "report",
            f"{fmt(cr.e2e_s, ' s', 2)} close to resume (+ "
            f"{fmt(cr.turn_time_wall_s, ' s', 1)} turn time), longest loop stall "
            f"{fmt(cr.max_loop_stall_ms, ' ms', 1)}, {cr.actors} actors" + at_size(n_r, 200_000),
            True,
            n_r is not None and n_r >= 200_000 and cr.actors == 4,
            report_only=True,
        )


def _ray_rows(row: _Rows, fanout: FanoutResult | None) -> None:
    """Ray: dispatch through the whole loop, and the control fan-out."""
    disp = None if fanout is None else fanout.ray_dispatch
    rps = disp.rows_per_s if disp is not None and disp.ok else None
    row(
        "dispatch_ray",
        "dispatch through the whole loop on Ray, 2 actors",
        "≥ 10,000 rows/s",
        "not run"
        if fanout is None
        else (
            f"{rps:,} rows/s"
            if rps is not None
            else f"failed: {None if disp is None else disp.error}"
        ),
        None if rps is None else rps >= TARGETS["rows_per_s_ray"],
        why="" if fanout is not None else "skipped (--no-ray)",
    )
    if fanout is None:
        row(
            "fanout",
            "control fan-out, 1 to 16 Ray actors, with a model for 64+",
            "measured to 16",
            "not run (--no-ray)",
            None,
        )
    else:
        res = {r.actors: r for r in fanout.results}
        top = max((k for k, r in res.items() if r.ok), default=None)
        failed = fanout.sizes_failed
        m = (fanout.models or {}).get("commit_stage_ms")
        if top is None:
            text = "no size measured: " + str(next(iter(res.values())).error)
        else:
            r = res[top]
            text = (
                f"{top} actors: prepare {fmt(r.op('prepare').stage_ms, ' ms')}, commit "
                f"{fmt(r.op('commit').stage_ms, ' ms')}, resume "
                f"{fmt(r.op('resume').stage_ms, ' ms')} (slowest instance "
                f"{fmt(r.op('prepare').slowest_ms, '')} / "
                f"{fmt(r.op('commit').slowest_ms, '')} / "
                f"{fmt(r.op('resume').slowest_ms, ' ms')})"
            )
            if m is not None:
                text += (
                    f"; commit at 64 actors {fmt(m.at['64'], ' ms', 0)} by the model (R² {m.r2})"
                )
        if failed:
            text += f"; failed: {', '.join(map(str, failed))} actors"
        row(
            "fanout",
            "control fan-out, 1 to 16 Ray actors, with a model for 64+",
            "measured to 16",
            text,
            not failed and top is not None,
            top is not None and top >= 16,
        )


def _preserved_row(row: _Rows, preserved: PreservedResult | None) -> None:
    """Work preserved across a crash against the step-boundary baseline."""
    if preserved is None:
        row(
            "preserved",
            "work preserved across a crash (in-flight rollout-seconds redone)",
            "measured, ≥ 10 kill times",
            "not run",
            None,
        )
    else:
        pm = preserved.gymckpt_redone_fraction_median
        text = (
            f"gymckpt redoes {fmt(None if pm is None else 100 * pm, ' %')} (median of "
            f"{preserved.kills} kills; pooled "
            f"{fmt(100 * (preserved.gymckpt_redone_fraction_pooled or 0), ' %')}), the "
            "step-boundary baseline 100 %"
        )
        pf = preserved.parked_fraction_of_rollout_time
        if pf is not None:
            text += f"; gymckpt's checkpoints parked episodes {fmt(100 * pf, ' %')} of the time"
        if preserved.boundary_mismatches:
            text += f"; {preserved.boundary_mismatches} boundary mismatches"
        row(
            "preserved",
            "work preserved across a crash (in-flight rollout-seconds redone)",
            "measured, ≥ 10 kill times",
            text,
            preserved.boundary_mismatches == 0 and preserved.restores > 0,
            preserved.kills >= 10,
        )


def _host_marks_row(row: _Rows, hm: HostMarksResult | None) -> None:
    """The unaligned mode's per-step cost on the host (``gymckpt bench host``): ``host.json``'s
    marks, judged on the larger of wall and CPU, at 256 episodes."""
    fig = "unaligned mode's per-step cost on the host, CartPole (boundary marks vs opted out)"
    if hm is None:  # no host.json, or one written before the marks were measured
        row("host_marks_overhead", fig, "≤ 10 % of a step", "not run", None)
        return
    cp, cal = hm.cartpole, hm.calendar
    worst = max(cp.marks_overhead_ratio, cp.marks_overhead_cpu_ratio)
    row(
        "host_marks_overhead",
        fig,
        "≤ 10 % of a step",
        f"{fmt(100 * cp.marks_overhead_ratio, ' %', 1)} wall, "
        f"{fmt(100 * cp.marks_overhead_cpu_ratio, ' %', 1)} CPU of a "
        f"{fmt(cp.opted_out_us_per_step_median, ' µs', 0)} step; calendar ({cal.turns} turns) "
        f"{fmt(100 * cal.marks_overhead_ratio, ' %', 1)} wall, "
        f"{fmt(100 * cal.marks_overhead_cpu_ratio, ' %', 1)} CPU" + at_size(cp.episodes, 256),
        worst <= TARGETS["host_marks_ratio"],
        cp.episodes == 256,
    )


def _failure(r: CheckpointRemoteResult) -> str:
    """A remote checkpoint that failed, as its targets row says it."""
    return "failed: " + first_line(r.checkpoint_error or r.error) + at_size(r.in_flight, 200_000)


def _http_rows(
    row: _Rows, fanout: FanoutResult | None, checkpoint_ray: CheckpointRayResult | None
) -> None:
    """Issue 24's figures over HTTP, each beside Ray's from the same run, as ratios."""
    _dispatch_http_row(row, fanout)
    _fanout_http_row(row, fanout)
    _checkpoint_http_row(row, checkpoint_ray)


def _dispatch_http_row(row: _Rows, fanout: FanoutResult | None) -> None:
    """Dispatch through the whole loop over HTTP, Ray's beside."""
    http = None if fanout is None else fanout.http
    ray_d = None if fanout is None else fanout.ray_dispatch
    hd = None if http is None else http.dispatch
    fig = "dispatch through the whole loop over HTTP, 2 servers (Ray, 2 actors, same run)"
    if hd is None:
        row("dispatch_http", fig, "report", "not run", None)
    elif not hd.ok or hd.rows_per_s is None:
        row(
            "dispatch_http",
            fig,
            "report",
            f"failed: {first_line(hd.error)}",
            False,
            report_only=True,
        )
    else:
        rr = ray_d.rows_per_s if ray_d is not None and ray_d.ok else None
        row(
            "dispatch_http",
            fig,
            "report",
            f"{hd.rows_per_s:,} rows/s (Ray {'n/a' if rr is None else f'{rr:,}'} rows/s; "
            f"HTTP/Ray {fmt(ratio(hd.rows_per_s, rr), TIMES, 2)})",
            True,
            report_only=True,
        )


def _fanout_http_row(row: _Rows, fanout: FanoutResult | None) -> None:
    """The control fan-out over HTTP, each stage beside Ray's at the same size."""
    http = None if fanout is None else fanout.http
    fig = "control fan-out, 1 to 16 HTTP servers, with a model for 64+ (Ray beside, same run)"
    if fanout is None or http is None:
        row("fanout_http", fig, "measured to 16", "not run", None)
    else:
        hs = {r.actors: r for r in http.results if r.ok}
        rs = {r.actors: r for r in fanout.results if r.ok}
        top = max(hs, default=None)
        if top is None:
            text = "no size measured: " + first_line(http.results[0].error if http.results else "")
        else:
            h, r = hs[top], rs.get(top)
            text = f"{top} servers: " + ", ".join(
                f"{op} {fmt(h.op(op).stage_ms, ' ms')}"
                + (
                    ""
                    if r is None
                    else f" (Ray {fmt(r.op(op).stage_ms, ' ms')}, "
                    f"{fmt(ratio(h.op(op).stage_ms, r.op(op).stage_ms), TIMES, 2)})"
                )
                for op in ("prepare", "commit", "resume")
            )
            m = (http.models or {}).get("commit_stage_ms")
            if m is not None:
                text += (
                    f"; commit at 64 servers {fmt(m.at['64'], ' ms', 0)} by the model (R² {m.r2})"
                )
        if http.sizes_failed:
            text += f"; failed: {', '.join(map(str, http.sizes_failed))} servers"
        row(
            "fanout_http",
            fig,
            "measured to 16",
            text,
            not http.sizes_failed and top is not None,
            top is not None and top >= 16,
        )


def _checkpoint_http_row(row: _Rows, checkpoint_ray: CheckpointRayResult | None) -> None:
    """The whole checkpoint over HTTP, Ray's beside."""
    fig = "whole checkpoint at 200k over HTTP with 4 servers (Ray beside, same run)"
    ch = None if checkpoint_ray is None else checkpoint_ray.http
    if ch is None:
        row("checkpoint_e2e_http", fig, "report", "not run", None)
    elif not ch.checkpoint_ok:
        row("checkpoint_e2e_http", fig, "report", _failure(ch), False, report_only=True)
    else:
        assert checkpoint_ray is not None
        cr = checkpoint_ray
        ray_text = (
            f"Ray {fmt(cr.e2e_s, ' s', 2)}, HTTP/Ray {fmt(ratio(ch.e2e_s, cr.e2e_s), TIMES, 2)}"
            if cr.checkpoint_ok
            else "Ray failed"
        )
        row(
            "checkpoint_e2e_http",
            fig,
            "report",
            f"{fmt(ch.e2e_s, ' s', 2)} close to resume (+ {fmt(ch.turn_time_wall_s, ' s', 1)} "
            f"turn time; {ray_text}), longest loop stall {fmt(ch.max_loop_stall_ms, ' ms', 1)}, "
            f"{ch.actors} servers" + at_size(ch.in_flight, 200_000),
            True,
            ch.in_flight is not None and ch.in_flight >= 200_000 and ch.actors == 4,
            report_only=True,
        )


def _mode_rows(
    row: _Rows,
    checkpoint: CheckpointResult | None,
    checkpoint_ray: CheckpointRayResult | None,
    preserved: PreservedResult | None,
) -> None:
    """Issue 22's targets: the unaligned mode against the aligned one, in the same run."""
    _unaligned_embedded_rows(row, checkpoint)
    _modes_ray_row(row, checkpoint_ray)
    _unaligned_preserved_rows(row, preserved)


def _unaligned_embedded_rows(row: _Rows, checkpoint: CheckpointResult | None) -> None:
    """The unaligned checkpoint at 200k on the embedded Gym: pause p99, until every episode
    moves, loop stall (the aligned mode's beside)."""
    emb = (checkpoint.modes or {}) if checkpoint is not None else {}
    u = emb.get("unaligned")
    # beside: an aligned checkpoint that completed (the reference protocol's, else the
    # alignment timeout's: the reference fails when a turn outlasts its bound)
    a = next(
        (emb[m] for m in ("aligned", "aligned_timeout") if m in emb and emb[m].checkpoint_ok),
        None,
    )
    n_c = checkpoint.in_flight if checkpoint is not None else None
    full = n_c is not None and n_c >= 200_000
    if u is None:
        for key, fig, tgt in (
            ("unaligned_pause_p99", "per-episode pause by an unaligned checkpoint, p99", "≤ 10 ms"),
            (
                "unaligned_checkpoint_e2e",
                "whole unaligned checkpoint at 200k, embedded, until every episode moves",
                "≤ 2 s",
            ),
            (
                "unaligned_checkpoint_stall",
                "longest loop stall, unaligned checkpoint at 200k, all causes",
                "≤ 10 ms",
            ),
        ):
            row(key, fig, tgt, "not run", None)
    else:
        p99 = u.pauses.pause_p99_ms
        row(
            "unaligned_pause_p99",
            "per-episode pause by an unaligned checkpoint at 200k, embedded, p99 (aligned beside)",
            "≤ 10 ms",
            f"{fmt(p99, ' ms', 1)} (max {fmt(u.pauses.pause_max_ms, ' ms', 0)}; no checkpoint: "
            f"{fmt(None if u.control_pauses is None else u.control_pauses.pause_p99_ms, ' ms', 1)}"
            f"; aligned {fmt(None if a is None else a.pauses.pause_p99_ms / 1e3, ' s', 1)})"
            + at_size(n_c, 200_000),
            p99 <= TARGETS["unaligned_pause_ms_p99"],
            full,
        )
        whole = u.until_all_moving_s
        row(
            "unaligned_checkpoint_e2e",
            "whole unaligned checkpoint at 200k, embedded, until every episode moves (CPU beside)",
            "≤ 2 s",
            f"{fmt(whole, ' s', 2)} ({fmt(u.until_moving_loop_cpu_s, ' s', 2)} loop CPU; "
            f"aligned {fmt(None if a is None else a.until_all_moving_excluding_turn_s, ' s', 2)}"
            " less its turn wait)" + at_size(n_c, 200_000),
            whole <= TARGETS["checkpoint_e2e_s"],
            full,
        )
        st = u.stall_all_causes_ms()
        row(
            "unaligned_checkpoint_stall",
            "longest loop stall, unaligned checkpoint at 200k, embedded, all causes (longest "
            "scheduler batch beside)",
            "≤ 10 ms",
            f"{fmt(st, ' ms', 1)} (task step {fmt(u.max_loop_stall_ms, ' ms', 1)}, scheduler "
            f"batch {fmt(u.scheduler_batch_max_ms, ' ms', 1)} / "
            f"{fmt(u.scheduler_batch_max_cpu_ms, ' ms', 1)} CPU)" + at_size(n_c, 200_000),
            st <= TARGETS["loop_stall_ms"],
            full,
        )


def _modes_ray_row(row: _Rows, checkpoint_ray: CheckpointRayResult | None) -> None:
    """Both modes on Ray with 4 actors (reported, no threshold)."""
    rm = (checkpoint_ray.modes or {}) if checkpoint_ray is not None else {}
    ru, ra = rm.get("unaligned"), rm.get("aligned")
    if ru is None:
        row(
            "checkpoint_modes_ray",
            "whole checkpoint at 200k on Ray with 4 actors, both modes, until every episode moves",
            "report",
            "not run",
            None,
        )
    else:
        assert checkpoint_ray is not None
        n_r = checkpoint_ray.in_flight
        row(
            "checkpoint_modes_ray",
            "whole checkpoint at 200k on Ray with 4 actors, both modes, until every episode moves",
            "report",
            f"unaligned {fmt(ru.until_all_moving_s, ' s', 2)} (pause p99 "
            f"{fmt(ru.pauses.pause_p99_ms, ' ms', 1)}, stall "
            f"{fmt(ru.stall_all_causes_ms(), ' ms', 1)})"
            + (
                ""
                if ra is None
                else f"; aligned {fmt(ra.until_all_moving_s, ' s', 1)} of which "
                f"{fmt(ra.turn_time_wall_s, ' s', 1)} the turn wait (pause p99 "
                f"{fmt(ra.pauses.pause_p99_ms / 1e3, ' s', 1)})"
            )
            + at_size(n_r, 200_000),
            ru.checkpoint_ok and (ra is None or ra.checkpoint_ok),
            n_r is not None and n_r >= 200_000 and checkpoint_ray.actors == 4,
            report_only=True,
        )


def _unaligned_preserved_rows(row: _Rows, preserved: PreservedResult | None) -> None:
    """The unaligned mode's parked-time fraction and work redone after a crash, aligned beside."""
    pm = (preserved.modes or {}) if preserved is not None else {}
    pu, pa = pm.get("unaligned"), pm.get("aligned")
    if pu is None:
        row("unaligned_parked", "parked-time fraction, unaligned", "≤ 0.5 %", "not run", None)
        row(
            "unaligned_redone", "work redone after a crash, unaligned", "≤ aligned", "not run", None
        )
        return
    assert preserved is not None
    frac = pu.measured_parked_fraction
    row(
        "unaligned_parked",
        "parked-time fraction, unaligned checkpoint at every training step (aligned beside)",
        "≤ 0.5 %",
        f"{pct(frac, 2)} (aligned {pct(None if pa is None else pa.measured_parked_fraction)})",
        None if frac is None else frac <= TARGETS["unaligned_parked_fraction"],
        preserved.kills >= 10,
    )
    ours, theirs = (
        pu.gymckpt_redone_fraction_pooled,
        (pa.gymckpt_redone_fraction_pooled if pa else None),
    )
    row(
        "unaligned_redone",
        "work redone after a crash, unaligned, same kill times (pooled over the kills)",
        "≤ aligned",
        f"{pct(ours)} (aligned {pct(theirs)}; baseline 100 %)",
        None if ours is None or theirs is None else ours <= theirs,
        preserved.kills >= 10 and pu.boundary_mismatches == 0,
    )


_SANDBOX_FIG = (
    "second checkpoint's bytes written, 1,000 sandboxes of a ~20 MB template, 1 % of the "
    "files changed"
)


def _sandbox_rows(row: _Rows, sb: SandboxResult | None) -> None:
    """``sandbox.json``: the second checkpoint's bytes against the first's (the target's ratio
    is second incremental / first full; second / first incremental is printed beside it), then
    the mark's cost and the restore per sandbox (reported)."""
    if sb is None:
        row("sandbox_incremental", _SANDBOX_FIG, "< 5 % of the first", "not run", None)
        return
    at_target = (
        sb.sessions == 1000 and sb.template_bytes >= 19 << 20 and sb.changed_fraction == 0.01
    )
    ratio = sb.second_incremental_over_first_full
    row(
        "sandbox_incremental",
        _SANDBOX_FIG,
        "< 5 % of the first",
        f"{fmt(100 * ratio, ' %', 3)} of the first written whole "
        f"({fmt(sb.second.incremental_bytes / 2**20, ' MiB', 1)} of "
        f"{fmt(sb.first.full_bytes / 2**20, ' MiB', 0)}); "
        f"{fmt(100 * sb.second_over_first_incremental, ' %', 0)} of the first's incremental "
        f"bytes ({fmt(sb.first.incremental_bytes / 2**20, ' MiB', 1)}, the template's files "
        f"once)" + ("" if at_target else f" at {sb.sessions} sessions"),
        ratio < TARGETS["sandbox_second_over_first"],
        at_target,
    )
    marks = ", ".join(
        f"{m.changed_files} changed: {fmt(m.mark_ms_median, ' ms', 1)}" for m in sb.mark
    )
    row(
        "sandbox_mark",
        f"a sandbox's boundary mark against the change ({sb.template_files} files)",
        "measured",
        marks,
        bool(sb.mark),
        at_target,
        report_only=True,
    )
    row(
        "sandbox_restore",
        "restore time per sandbox (rebuild, check, materialise its tree)",
        "measured",
        f"{fmt(sb.restore_ms_median, ' ms', 0)} median, a tree of "
        f"{fmt(sb.template_bytes / 2**20, ' MiB', 1)}",
        sb.restore_ms_median > 0,
        at_target,
        report_only=True,
    )
