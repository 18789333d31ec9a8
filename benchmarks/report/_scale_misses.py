"""Where a target at scale (``_scale_targets``) is missed, and what it would take: one
paragraph per missed row, fed from the run's own figures (the largest stages, the cost per
episode or per row, how far from the threshold)."""

from __future__ import annotations

from collections.abc import Mapping

from ._format import TIMES, first_line, fmt
from ._records import (
    CheckpointRayResult,
    CheckpointRemoteResult,
    CheckpointResult,
    DispatchResult,
    HostResult,
    TrainerSideResult,
)
from ._scale_targets import SCALE_TARGETS

__all__ = ["scale_miss_lines"]


def _largest(stage_s: Mapping[str, float] | None, top: int = 3) -> str:
    """The ``top`` longest stages, as ``name`` seconds."""
    stages = sorted((stage_s or {}).items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"`{k}` {fmt(v, ' s', 2)}" for k, v in stages) or "n/a"


def _complete_miss(checkpoint: CheckpointResult) -> str:
    """Some aligned checkpoints with the alignment timeout failed: their errors."""
    t = (checkpoint.modes or {})["aligned_timeout"]
    failed = [r for r in (t.repeats or []) if not r.get("checkpoint_ok")]
    errors = "; ".join(
        f"{r.get('checkpoint_failure')}: {first_line(r.get('checkpoint_error'), 160)}"
        for r in failed[:3]
    )
    return (
        f"- **Aligned checkpoints with the alignment timeout: {t.completed} of {t.checkpoints} "
        f"completed.** The others failed: {errors or 'n/a'}. The alignment timeout "
        f"({fmt(t.alignment_timeout_s, ' s', 1)}) must leave the rest of the checkpoint inside "
        f"the control timeout ({fmt(t.control_timeout_s, ' s', 0)}): *what it would take:* a "
        "prepare that answers at its alignment timeout whatever is still inside a turn, and a "
        "commit (the cut of those episodes) that fits in what is left of the control timeout "
        f"at 200k (this run's commit stage: {fmt((t.e2e_s or 0.0), ' s', 2)} close to resume "
        "less the wait)."
    )


def _remote_miss(
    backend: str, r: CheckpointRemoteResult, missed: set[str], measured: Mapping[str, str]
) -> str:
    """The unaligned checkpoint on Ray or over HTTP above its targets: where the time went."""
    u = (r.modes or {})["unaligned"]
    n = r.in_flight or 0
    parts = [
        f"`{k.split('_', 1)[1]}` {measured[k]}"
        for k in (f"{backend}_until_moving", f"{backend}_pause_p99", f"{backend}_stall")
        if k in missed
    ]
    commit = (u.stages and next((s for s in u.stages if s.stage == "commit"), None)) or None
    return (
        f"- **{'Ray' if backend == 'ray' else 'HTTP'} at {n:,} in flight, unaligned:** "
        + ", ".join(parts)
        + f". Largest stages: {_largest(r.stage_s)}; the Gym's calls took "
        f"{fmt(None if commit is None else commit.in_gym_calls_ms, ' ms', 0)} of `commit`; "
        f"per-episode pause p50 {fmt(u.pauses.pause_p50_ms, ' ms', 1)}, max "
        f"{fmt(u.pauses.pause_max_ms, ' ms', 0)}; longest loop stall in task "
        f"`{u.max_loop_stall_task}`. The cut runs in slices, the reply goes in parts (HTTP) or "
        "is packed a chunk per step (Ray) and is decoded a part per step on the trainer with "
        "no collection; each session's entry is kept in its final encoding from its mark, "
        "the export thread's sorts and dumps run in bounded calls, and the instances run "
        "`instance_niceness` below the trainer. Most of what is left is each instance's "
        "export (its 50k episodes' records built in a thread that shares the instance's GIL "
        "with its episodes, which pause while it runs; on Ray each wake-up of the instance's "
        "trio run also passes through the actor's asyncio loop). *What it would take:* that "
        "export in a process of its own, and, on this 2-core machine, the four instances and "
        "the trainer not sharing two cores."
    )


def _sockets_miss(r: CheckpointRemoteResult) -> str:
    """The HTTP client's sockets above the bound."""
    sockets = r.client_sockets_max or 0
    streams = (r.in_flight or 0) // 8
    return (
        f"- **HTTP sockets {sockets:,} > 1,000** at {r.in_flight or 0:,} in flight over "
        f"{r.actors} servers: one `/run` stream holds one HTTP/1.1 connection until its "
        f"episodes end ({streams:,} groups of 8 in flight). *What it would take:* many groups "
        "per stream or a multiplexed protocol, so sockets scale with servers, not groups "
        f"(≤ {1_000 // max(1, r.actors or 1):,} per server)."
    )


def _dispatch_miss(dispatch: DispatchResult, missed: set[str]) -> str:
    """The whole loop on the embedded Gym against the runtime alone: the host's cost per row
    and what it must come down to."""
    emb, null = dispatch.loop_rows_per_s_embedded or 0, dispatch.loop_rows_per_s_null or 0
    us_emb = 1e6 / emb if emb else None
    us_null = 1e6 / null if null else None
    host_us = None if us_emb is None or us_null is None else us_emb - us_null
    # share >= s means us_emb <= us_null / s: the host's part at most us_null (1 / s - 1)
    allowed = None if us_null is None else us_null * (1 / SCALE_TARGETS["dispatch_share"] - 1)
    floor = 1e6 / SCALE_TARGETS["dispatch_rows_per_s"]
    return (
        f"- **Dispatch through the whole loop, embedded: {emb:,} rows/s, "
        f"{fmt(100 * emb / null if null else None, ' %', 1)} of the runtime alone "
        f"({null:,} rows/s).** A row costs {fmt(us_emb, ' µs', 1)} against "
        f"{fmt(us_null, ' µs', 1)} on the null Gym: the host's part is "
        f"{fmt(host_us, ' µs', 1)} per episode. *What it would take:* the host's part at or "
        f"under {fmt(allowed, ' µs', 1)} per episode for 40 % of this run's runtime"
        + (
            f", and a whole row under {fmt(floor, ' µs', 1)} for 30,000 rows/s"
            if "dispatch_loop_rows_per_s" in missed
            else ""
        )
        + ". The step path already takes one scheduler pass per turn; what is left is the "
        "environment's own turn (the calendar's sleep costs two scheduler passes under the "
        "benchmark's virtual clock, its retained session a journal write, its marks an "
        "export), young collections of the episodes that live across a sleep, and a task and "
        "a cancel scope per episode (an episode without a task of its own while it does not "
        "wait: one scheduler per instance over ready episodes)."
    )


def _host_miss(host: HostResult, missed: set[str]) -> str:
    """CartPole: the host's overhead per step and marks in an aligned run."""
    ps = host.per_step
    allowed = ps.plain_us_per_step_median * (SCALE_TARGETS["host_over_plain"] - 1)
    text = ""
    if "host_step_ratio" in missed:
        text += (
            f"- **CartPole hosted step {fmt(ps.host_over_plain_ratio, TIMES, 2)} plain "
            f"Gymnasium** ({fmt(ps.host_us_per_step_median, ' µs')} against "
            f"{fmt(ps.plain_us_per_step_median, ' µs')}; with marks on demand "
            f"{fmt(ps.host_on_demand_us_per_step_median, ' µs')}). *What it would take:* the "
            f"host's overhead from {fmt(ps.host_overhead_us_per_step, ' µs')} to "
            f"{fmt(allowed, ' µs')} a step. The default host takes a mark at every boundary "
            "of an environment that supports the unaligned cut, since the default alignment "
            "timeout may end in a cut; marks on demand are not the default, because a cut's "
            "first arming retries every turn in flight (a turn longer than the checkpoint "
            "interval would never finish). A Gymnasium mark already skips an unchanged RNG "
            "and writes no `null`; what is left is the mark itself (the agent's whole "
            "trajectory encoded again at every boundary: a mark that encodes only what was "
            "appended since the last one) and, beside it, one scheduler pass and the model "
            "proxy's capture per turn."
        )
    if "host_marks_aligned" in missed:
        text += ("\n" if text else "") + (
            f"- **Marks in an aligned run {fmt(ps.marks_on_demand_us_per_step, ' µs', 2)} a "
            'step** with `boundary_marks="on_demand"` against the environment opted out: an '
            "aligned run that never cuts still pays for marks. *What it would take:* marks "
            "armed only by a prepare that may cut (an unaligned one, or an aligned one past "
            "its alignment timeout), and nothing done per step before that."
        )
    return text


def _trainer_side_miss(ts: TrainerSideResult) -> str:
    """The trainer side at 1M above 2 s: the largest stages, per episode."""
    n = max(1, ts.in_flight)
    return (
        f"- **Trainer side at {ts.in_flight:,} in flight: {fmt(ts.close_to_resume_s, ' s', 2)} "
        f"> 2 s** close to resume against a Gym that answers at once. Largest stages: "
        f"{_largest(ts.stage_s)} ({fmt(ts.close_to_resume_s * 1e6 / n, ' µs', 2)} per "
        f"episode); longest loop stall {fmt(ts.stall_all_causes_ms, ' ms', 1)} "
        f"(`{ts.max_loop_stall_task}`). *What it would take:* "
        f"{fmt(2e6 / n, ' µs', 2)} per episode over every stage: ownership and the cut over "
        "columns rather than objects per episode, the snapshot's serialisation chunked and "
        "written in parallel with the ownership check, nothing rebuilt that did not change."
    )


def scale_miss_lines(
    missed: set[str],
    measured: Mapping[str, str],
    checkpoint: CheckpointResult | None,
    checkpoint_ray: CheckpointRayResult | None,
    dispatch: DispatchResult | None,
    host: HostResult | None,
    trainer_side: TrainerSideResult | None,
) -> list[str]:
    """One paragraph per missed target at scale (``missed``: the keys of the rows missed;
    ``measured``: each row's figure as the table prints it)."""
    out: list[str] = []
    if checkpoint is not None and "aligned_timeout_complete" in missed:
        out.append(_complete_miss(checkpoint))
    remotes = {
        "ray": checkpoint_ray,
        "http": None if checkpoint_ray is None else checkpoint_ray.http,
    }
    for backend, r in remotes.items():
        keys = {f"{backend}_until_moving", f"{backend}_pause_p99", f"{backend}_stall"}
        if r is not None and keys & missed:
            out.append(_remote_miss(backend, r, missed, measured))
    http = remotes["http"]
    if http is not None and "http_sockets" in missed:
        out.append(_sockets_miss(http))
    if dispatch is not None and {"dispatch_loop_share", "dispatch_loop_rows_per_s"} & missed:
        out.append(_dispatch_miss(dispatch, missed))
    if host is not None and {"host_step_ratio", "host_marks_aligned"} & missed:
        out.append(_host_miss(host, missed))
    if trainer_side is not None and "trainer_side_1M" in missed:
        out.append(_trainer_side_miss(trainer_side))
    return out
