"""The report's section on the control fan-out on Ray and over HTTP (measured in the same
run): per size, the stage, the slowest instance and the trainer's own fan-out cost on each
backend, HTTP's as a ratio of Ray's, the linear model for 64 and more actors, and dispatch
through the whole loop with 2 instances on each."""

from __future__ import annotations

from ..fanout import OPS
from ._format import TIMES, Add, fmt, ratio
from ._records import FanoutResult, FanoutSize, RayDispatch

__all__ = ["dispatch_text", "fanout_section"]


def _cells(r: FanoutSize) -> str:
    return " | ".join(
        f"{fmt(r.op(op).stage_ms)} / {fmt(r.op(op).slowest_ms)} / "
        f"{fmt(r.op(op).fanout_overhead_ms)}"
        for op in OPS
    )


def _ratio_cells(h: FanoutSize, r: FanoutSize) -> str:
    return " | ".join(
        f"{fmt(ratio(h.op(op).stage_ms, r.op(op).stage_ms), TIMES, 2)} / "
        f"{fmt(ratio(h.op(op).slowest_ms, r.op(op).slowest_ms), TIMES, 2)} / —"
        for op in OPS
    )


def dispatch_text(d: RayDispatch | None, where: str) -> str:
    """One backend's whole-loop dispatch as a sentence's clause."""
    if d is None or not d.ok or d.rows_per_s is None:
        return f"{where}: not measured ({None if d is None else d.error})"
    runs = d.runs_rows_per_s or [d.rows_per_s]
    return (
        f"{where}: **{d.rows_per_s:,} rows/s** (median of {len(runs)} run"
        f"{'s' if len(runs) != 1 else ''}: {', '.join(f'{x:,}' for x in runs)}; "
        f"{d.attempts or 0:,} one-turn episodes, dispatcher batch {d.batch})"
    )


def fanout_section(add: Add, fo: FanoutResult) -> None:
    """The fan-out section: how it was measured, the sizes, the model, dispatch."""
    http = fo.http
    add("## Control fan-out on Ray" + ("" if http is None else " and over HTTP"))
    add("")
    cfg = fo.config
    add(
        f"One local Ray cluster (started in {fmt(fo.cluster_start_s, ' s')}); for each "
        "size, K simulated Gym instances as Ray actors"
        + (
            ""
            if http is None
            else ", then K spawned `gymckpt serve` processes on loopback (`HttpGym.spawn`, "
            "the same calendar workplace), in the same run"
        )
        + f"; {cfg.warmup} warm-up and "
        f"{cfg.checkpoints} measured whole checkpoints through `open_rollouts`, no episode "
        "in flight (control-plane cost; the step-boundary wait is the environment's). Medians "
        "over the checkpoints, in ms: the coordinator's stage / the slowest instance's call / "
        "the stage less the slowest call (the trainer's own fan-out cost)"
        + ("" if http is None else "; the *HTTP/Ray* rows divide HTTP's by Ray's")
        + "."
    )
    add("")
    _sizes_table(add, fo)
    _model(add, fo)
    _dispatch(add, fo)


def _sizes_table(add: Add, fo: FanoutResult) -> None:
    """Per size: each backend's stages, and HTTP's as a ratio of Ray's."""
    http = fo.http
    add("| instances | backend | started in | prepare | commit | resume | whole checkpoint |")
    add("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    https = {r.actors: r for r in (http.results if http is not None else [])}
    for r in fo.results:
        rows = [("Ray", r)] + ([("HTTP", https[r.actors])] if r.actors in https else [])
        for name, x in rows:
            if not x.ok:
                add(f"| {x.actors} | {name} | — | failed: {x.error} | | | |")
                continue
            add(
                f"| {x.actors} | {name} | {fmt(x.actor_start_s, ' s')} | {_cells(x)} | "
                f"{fmt(x.checkpoint_wall_ms)} |"
            )
        h = https.get(r.actors)
        if h is not None and h.ok and r.ok:
            add(
                f"| {r.actors} | HTTP/Ray | — | {_ratio_cells(h, r)} | "
                f"{fmt(ratio(h.checkpoint_wall_ms, r.checkpoint_wall_ms), TIMES, 2)} |"
            )
    add("")


def _model(add: Add, fo: FanoutResult) -> None:
    """The linear model for 64 and more actors, and how to read it on this machine."""
    http = fo.http
    models = fo.models or {}
    ok = [r.actors for r in fo.results if r.ok]
    if any(models.values()):
        add(
            "**Model for 64 and more actors.** Each figure fitted by least squares to "
            "`t(K) = a + b·K` over the measured sizes; R² says how well a line fits them "
            "(rows without a prefix: Ray; *HTTP*: the servers)."
        )
        add("")
        add("| figure | a (ms) | b (ms per actor) | R² | 64 actors | 128 | 256 |")
        add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        both = [("", models)] + ([("HTTP ", http.models or {})] if http is not None else [])
        for where, ms in both:
            for name, m in ms.items():
                if m is None:
                    continue
                add(
                    f"| {where}{name.replace('_ms', '').replace('_', ' ')} | {m.a_ms} | "
                    f"{m.b_ms_per_actor} | {m.r2} | {fmt(m.at['64'], ' ms', 0)} | "
                    f"{fmt(m.at['128'], ' ms', 0)} | {fmt(m.at['256'], ' ms', 0)} |"
                )
        add("")
        res = {r.actors: r for r in fo.results if r.ok}
        lo, hi = res[min(ok)], res[max(ok)]
        add(
            "Reading the model: on this machine all K actors are processes on the same 2 "
            "cores, so the slowest instance's call grows with K because the actors' own work "
            "is served a couple at a time — every instance slows down, not one straggler (the "
            f"median instance's commit: {fmt(lo.op('commit').median_instance_ms, ' ms')} with "
            f"{lo.actors}, {fmt(hi.op('commit').median_instance_ms, ' ms')} with "
            f"{hi.actors} actors); that is the machine, not the protocol, and on a "
            "cluster with a core per actor it would stay near the 1-actor figure. What stays "
            "on the trainer with a core per actor is the fan-out overhead (stage less slowest "
            "call), whose slope is the per-actor cost of issuing and collecting the calls. A "
            f"line through {len(ok)} points up to {max(ok)} actors is an extrapolation at 64 "
            "and beyond: read it as an order of magnitude."
        )
        add("")


def _dispatch(add: Add, fo: FanoutResult) -> None:
    """Dispatch through the whole loop with 2 instances on each backend."""
    http = fo.http
    disp = fo.ray_dispatch
    hd = None if http is None else http.dispatch
    add(
        "Dispatch through the whole loop with 2 instances, one-turn episodes (10-20 ms turns, "
        "real time, the instances' start-up not counted): "
        + dispatch_text(disp, "on Ray, 2 actors")
        + ("" if http is None else "; " + dispatch_text(hd, "over HTTP, 2 servers"))
        + "."
    )
    if disp is not None and hd is not None:
        q = ratio(hd.rows_per_s if hd.ok else None, disp.rows_per_s if disp.ok else None)
        if q is not None:
            add("")
            add(
                f"HTTP/Ray rows/s: {fmt(q, TIMES, 2)} (the runs alternate, Ray first; the "
                "trainer, the servers or actors, and Ray's own processes share 2 cores)."
            )
    add("")
