"""The report's section on the control fan-out on Ray: per size, the stage, the slowest
instance and the trainer's own fan-out cost, and the linear model for 64 and more actors."""

from __future__ import annotations

from ..fanout import OPS
from ._format import Add, fmt
from ._records import FanoutResult

__all__ = ["fanout_section"]


def fanout_section(add: Add, fo: FanoutResult) -> None:
    add("## Control fan-out on Ray")
    add("")
    cfg = fo.config
    add(
        f"One local Ray cluster (started in {fmt(fo.cluster_start_s, ' s')}); for each "
        f"size, K simulated Gym instances as Ray actors, {cfg.warmup} warm-up and "
        f"{cfg.checkpoints} measured whole checkpoints through `open_rollouts`, no episode "
        "in flight (control-plane cost; the step-boundary wait is the environment's). Medians "
        "over the checkpoints, in ms: the coordinator's stage / the slowest instance's call / "
        "the stage less the slowest call (the trainer's own fan-out cost)."
    )
    add("")
    add("| actors | started in | prepare | commit | resume | whole checkpoint |")
    add("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in fo.results:
        if not r.ok:
            add(f"| {r.actors} | — | failed: {r.error} | | | |")
            continue
        cells = " | ".join(
            f"{fmt(r.op(op).stage_ms)} / {fmt(r.op(op).slowest_ms)} / "
            f"{fmt(r.op(op).fanout_overhead_ms)}"
            for op in OPS
        )
        add(
            f"| {r.actors} | {fmt(r.actor_start_s, ' s')} | {cells} | {fmt(r.checkpoint_wall_ms)} |"
        )
    add("")
    models = fo.models or {}
    ok = [r.actors for r in fo.results if r.ok]
    if any(models.values()):
        add(
            "**Model for 64 and more actors.** Each figure fitted by least squares to "
            "`t(K) = a + b·K` over the measured sizes; R² says how well a line fits them."
        )
        add("")
        add("| figure | a (ms) | b (ms per actor) | R² | 64 actors | 128 | 256 |")
        add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, m in models.items():
            if m is None:
                continue
            add(
                f"| {name.replace('_ms', '').replace('_', ' ')} | {m.a_ms} | "
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
    disp = fo.ray_dispatch
    if disp is not None and disp.ok:
        add(
            f"Dispatch through the whole loop on Ray, 2 actors: {disp.attempts:,} one-turn "
            f"episodes (10-20 ms turns, real time) in {fmt(disp.seconds, ' s', 2)} = "
            f"{disp.rows_per_s:,} rows/s (dispatcher batch {disp.batch})."
        )
    else:
        add(f"Dispatch on Ray: not measured ({None if disp is None else disp.error}).")
    add("")
