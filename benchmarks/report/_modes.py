"""The report's section on the two checkpoint modes side by side (issue 22): the whole
checkpoint until every episode moves again, embedded and on Ray, and the pauses each episode
felt; then the work redone after a crash and the parked-time fraction, both modes on the same
kill times."""

from __future__ import annotations

from collections.abc import Mapping

from ._format import TIMES, Add, first_line, fmt, pct, ratio, turns_text
from ._records import (
    CheckpointRayResult,
    CheckpointResult,
    ModeCheckpoint,
    PreservedMode,
    PreservedResult,
)

__all__ = ["mode_miss_lines", "modes_section"]


def _cpu(wall: float | None, loop: float | None, proc: float | None) -> str:
    return f"{fmt(wall, ' s', 2)} ({fmt(loop, ' s', 2)} loop CPU, {fmt(proc, ' s', 2)} process)"


def _checkpoint_rows(add: Add, where: str, modes: Mapping[str, ModeCheckpoint]) -> None:
    for name, m in modes.items():
        p, c = m.pauses, m.control_pauses
        sim = (
            f" + {fmt(m.turn_time_simulated_s, ' s', 0)} simulated"
            if m.turn_time_simulated_s is not None and name != "unaligned"
            else ""
        )
        add(
            f"| {where} | {name} | "
            + _cpu(m.until_all_moving_s, m.until_moving_loop_cpu_s, m.until_moving_process_cpu_s)
            + f"{sim} | {fmt(m.until_all_moving_excluding_turn_s, ' s', 2)} | "
            + _cpu(m.checkpoint_wall_s, m.checkpoint_loop_cpu_s, m.checkpoint_process_cpu_s)
            + f" | {fmt(m.moving_after_return_s, ' s', 2)} | "
            f"{fmt(p.pause_p50_ms, ' ms', 1)} / {fmt(p.pause_p99_ms, ' ms', 1)} / "
            f"{fmt(p.pause_max_ms, ' ms', 0)} | "
            + (
                "n/a"
                if c is None
                else f"{fmt(c.pause_p50_ms, ' ms', 1)} / {fmt(c.pause_p99_ms, ' ms', 1)} / "
                f"{fmt(c.pause_max_ms, ' ms', 0)}"
            )
            + f" | {fmt(m.max_loop_stall_ms, ' ms', 1)} / "
            f"{fmt(m.stall_all_causes_ms(), ' ms', 1)} | "
            f"{fmt(m.scheduler_batch_max_ms, ' ms', 1)} "
            f"({fmt(m.scheduler_batch_max_cpu_ms, ' ms', 1)} CPU; p99 "
            f"{fmt(m.scheduler_batch_p99_ms, ' ms', 1)}) |"
        )


def modes_section(
    add: Add,
    checkpoint: CheckpointResult | None,
    checkpoint_ray: CheckpointRayResult | None,
    preserved: PreservedResult | None,
) -> None:
    """Both modes side by side, for the results that carry them (older ones carry none)."""
    emb = None if checkpoint is None else checkpoint.modes
    ray = None if checkpoint_ray is None else checkpoint_ray.modes
    over_http = None if checkpoint_ray is None else checkpoint_ray.http
    http = None if over_http is None else over_http.modes
    pmodes = None if preserved is None else preserved.modes
    if not (emb or ray or pmodes):
        return
    add("## Checkpoint modes side by side: aligned and unaligned")
    add("")
    add(
        "Each run measures both modes on the same episodes (one fill, the unaligned checkpoint "
        "first, since it parks nothing, then the aligned one), with turn lengths from a heavy-"
        "tailed distribution. The machine has 2 cores and is shared with other helpers' tests "
        "and benchmarks while these run: wall times are noisy, so CPU time is given beside "
        "them, and the modes are compared as ratios within one run."
    )
    add("")
    if emb or ray:
        _checkpoint_modes(add, checkpoint, checkpoint_ray, (emb, ray, http))
    if preserved is not None and pmodes:
        _preserved_modes(add, preserved, pmodes)


def _checkpoint_modes(
    add: Add,
    checkpoint: CheckpointResult | None,
    checkpoint_ray: CheckpointRayResult | None,
    modes: tuple[
        Mapping[str, ModeCheckpoint] | None,
        Mapping[str, ModeCheckpoint] | None,
        Mapping[str, ModeCheckpoint] | None,
    ],
) -> None:
    """The checkpoint in both modes on each Gym (embedded, Ray, HTTP): the table, what its
    columns mean, and unaligned / aligned per Gym."""
    emb, ray, http = modes
    over_http = None if checkpoint_ray is None else checkpoint_ray.http
    if checkpoint is not None and emb:
        add(
            f"Embedded: {checkpoint.in_flight:,} episodes in flight on "
            f"{checkpoint.config.instances} instances, turns "
            f"{turns_text(None, checkpoint.turn_times)}; the aligned wait for the turns in "
            "flight runs on the warp clock (simulated seconds, shown apart), the rest in "
            "real time."
        )
        add("")
    if checkpoint_ray is not None and ray:
        add(
            f"Ray: {checkpoint_ray.in_flight or 0:,} episodes in flight on "
            f"{checkpoint_ray.actors} actors, turns "
            f"{turns_text(None, checkpoint_ray.turn_times)}, real time throughout (the "
            "aligned wait is real seconds)."
        )
        add("")
    add(
        "| Gym | mode | until every episode moves (CPU) | same, less the turn wait | "
        "`checkpoint()` returns (CPU) | moving after it returned | per-episode pause "
        "p50 / p99 / max | same, a window of no checkpoint | longest task step / all "
        "causes | longest scheduler batch |"
    )
    add("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    if emb:
        _checkpoint_rows(add, "embedded", emb)
    if ray:
        _checkpoint_rows(add, f"Ray, {checkpoint_ray.actors if checkpoint_ray else '?'}", ray)
    if http:
        servers = over_http.actors if over_http is not None else "?"
        _checkpoint_rows(add, f"HTTP, {servers} (same run)", http)
    add("")
    add(
        "*Until every episode moves*: from `checkpoint()`'s start until the last episode "
        "that reached a step boundary during it started its next turn (the episodes record "
        "it themselves), not just until `checkpoint()` returns. *Per-episode pause*: each "
        "in-flight episode's gaps between a step boundary and its next turn, plus how late "
        "its turns' sleeps woke, over 0.5 ms each, summed over that window; an episode with "
        "none counts 0. The window of no checkpoint is the same episodes a few seconds "
        "later: what a step costs them anyway on this loop. *All causes*: the longest task "
        "step or the 1 ms heartbeat's lateness (the loop waiting for the GIL), whichever is "
        "longer. A *scheduler batch* runs every task that was runnable when it began; a "
        "timer or reply due in it waits for its end."
    )
    add("")
    if emb and any(m.checkpoints for m in emb.values()):
        _completion_rows(add, emb)
    for where, modes in (("embedded", emb), ("Ray", ray), ("HTTP", http)):
        if modes and "aligned" in modes and "unaligned" in modes:
            a, u = modes["aligned"], modes["unaligned"]
            r = ratio(u.until_all_moving_s, a.until_all_moving_s)
            rp = ratio(u.pauses.pause_p99_ms, a.pauses.pause_p99_ms)
            add(
                f"- {where}: unaligned / aligned, until every episode moves "
                f"{fmt(r, TIMES, 3)}; per-episode pause p99 {fmt(rp, TIMES, 5)}."
            )
    add("")


def _completion_rows(add: Add, modes: Mapping[str, ModeCheckpoint]) -> None:
    """Embedded, several checkpoints per mode: how many completed, the episodes taken
    mid-turn, the medians over those that completed, and the cost against pure unaligned."""
    add(
        "Several checkpoints per mode on the same episodes (`aligned_timeout`: the default "
        "configuration's control and alignment timeouts; `aligned`: the reference protocol, "
        "no alignment timeout, within a one-hour control bound). Medians over the checkpoints "
        "that completed; *with its wait*: the aligned prepare's simulated wait included; "
        "ratios over pure unaligned's in the same run."
    )
    add("")
    add(
        "| mode | completed | control / alignment timeout | episodes mid-turn (median) | "
        "until every episode moves, with its wait | pause p50 / p99 | against unaligned: "
        "until moving / pause p99 | failures |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, m in modes.items():
        vs = m.vs_unaligned or {}
        failures = sorted(
            {
                f"{r.get('checkpoint_failure')}: {first_line(r.get('checkpoint_error'), 100)}"
                for r in (m.repeats or [])
                if not r.get("checkpoint_ok")
            }
        )
        add(
            f"| {name} | {m.completed} of {m.checkpoints} ({fmt(m.complete_pct, ' %', 0)}) | "
            f"{fmt(m.control_timeout_s, ' s', 0)} / {fmt(m.alignment_timeout_s, ' s', 0)} | "
            f"{fmt(m.mid_turn_median, '', 0)} | {fmt(m.until_all_moving_with_wait_s, ' s', 2)} | "
            f"{fmt(m.pause_p50_ms_median, ' ms', 1)} / {fmt(m.pause_p99_ms_median, ' ms', 1)} | "
            f"{fmt(vs.get('until_all_moving_with_wait_s'), TIMES, 1)} / "
            f"{fmt(vs.get('pause_p99_ms_median'), TIMES, 0)} | {'; '.join(failures) or '—'} |"
        )
    add("")


def _preserved_modes(add: Add, pv: PreservedResult, modes: Mapping[str, PreservedMode]) -> None:
    add(
        f"Work redone after a crash and the checkpoints' cost in moving time (`bench "
        f"preserved`, embedded, virtual time): the same {pv.kills} kill times for both modes "
        f"and the step-boundary baseline, turns {turns_text(None, pv.turn_times)}."
    )
    add("")
    add(
        "| mode | gymckpt redoes (median of kills / pooled) | baseline redoes | restores | "
        "boundary mismatches | parked-time fraction (measured / modelled) | episodes held "
        "per checkpoint | their pause p50 / p99 / max |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, m in modes.items():
        med, pooled = m.gymckpt_redone_fraction_median, m.gymckpt_redone_fraction_pooled
        add(
            f"| {name} | {fmt(None if med is None else 100 * med, ' %')} / "
            f"{fmt(None if pooled is None else 100 * pooled, ' %')} "
            f"({m.gymckpt_redone_rollout_s_total:,.0f} rollout-s) | 100 % "
            f"({m.baseline_redone_rollout_s_total:,.0f}) | {m.restores} | "
            f"{m.boundary_mismatches} | "
            f"{pct(m.measured_parked_fraction, 2)} / {pct(m.parked_fraction_of_rollout_time, 2)}"
            f" | {fmt(m.held_per_checkpoint, '', 1)} | {fmt(m.held_pause_p50_s, ' s', 2)} / "
            f"{fmt(m.held_pause_p99_s, ' s', 2)} / {fmt(m.held_pause_max_s, ' s', 2)} |"
        )
    add("")
    add(
        "The in-flight rollout-seconds differ between the modes although the kill times are "
        "the same: an aligned run parks its episodes at every checkpoint, so by a kill time it "
        "has done less, and its checkpoints fall at other moments. Compare the fractions. "
        "*Measured* parked time is every gap between an episode's step boundary and its next "
        "turn, as the episode saw it on the virtual clock, over its turn time done; "
        "*modelled* is the timeline model's (each checkpoint window parks the episodes that "
        "reach a boundary in it)."
    )
    add("")


def _stage_text(m: ModeCheckpoint, n: int) -> str:
    top = sorted(m.stages, key=lambda r: -r.wall_ms)[:3]
    return ", ".join(
        f"`{r.stage}` {fmt(r.wall_ms / 1e3, ' s', 2)} ({fmt(r.wall_ms * 1e3 / max(1, n), ' µs', 1)}"
        " per episode)"
        for r in top
    )


def _pause_miss(u: ModeCheckpoint, a: ModeCheckpoint | None) -> str:
    """The unaligned pause p99 above 10 ms: the busy loop, beside a window of no checkpoint."""
    c = u.control_pauses
    base = None if c is None else c.pause_p99_ms
    own = base is not None and base > 10.0
    return (
        f"- **Per-episode pause, unaligned, p99 {fmt(u.pauses.pause_p99_ms, ' ms', 1)} > "
        f"10 ms** (aligned {fmt(None if a is None else a.pauses.pause_p99_ms / 1e3, ' s', 1)}"
        "). No episode is parked: the longest boundary gap is "
        f"{fmt(u.pauses.boundary_gap_max_ms, ' ms', 1)} and the longest late wake of a "
        f"turn {fmt(u.pauses.turn_overrun_max_ms, ' ms', 1)}; what the episodes feel is "
        "the loop being busy — its longest task step "
        f"{fmt(u.max_loop_stall_ms, ' ms', 1)}, its longest scheduler batch "
        f"{fmt(u.scheduler_batch_max_ms, ' ms', 1)} "
        f"({fmt(u.scheduler_batch_max_cpu_ms, ' ms', 1)} of CPU), the heartbeat up to "
        f"{fmt(u.heartbeat_max_late_ms, ' ms', 1)} late. In a window of no checkpoint the "
        f"same episodes' p99 is {fmt(base, ' ms', 1)}"
        + (
            ": the loop's own latency on this loaded 2-core machine is already over the "
            "target without a checkpoint. *What it would take:* the Gym host off the "
            "trainer's loop (its own process, as on Ray) and a core for each."
            if own
            else ": the excess is the checkpoint's own work on the loop (the cut and the "
            "records in `commit`, the release of held replies in `resume`). *What it "
            "would take:* that work in chunks between scheduling points or off the loop."
        )
    )


def _stall_miss(u: ModeCheckpoint) -> str:
    """The unaligned checkpoint's loop stall: the longest task step and the heartbeat, by stage."""
    worst = max(u.stages, key=lambda r: r.max_loop_stall_ms or 0.0)
    late = max(u.stages, key=lambda r: r.heartbeat_max_late_ms or 0.0)
    return (
        f"- **Loop stall, unaligned checkpoint, {fmt(u.stall_all_causes_ms(), ' ms', 1)} "
        f"> 10 ms** (all causes). Longest task step {fmt(worst.max_loop_stall_ms, ' ms', 1)} "
        f"in `{worst.stage}` (task `{worst.max_stall_task}`, "
        f"{fmt(worst.max_loop_stall_cpu_ms, ' ms', 1)} of CPU); the heartbeat latest in "
        f"`{late.stage}` ({fmt(late.heartbeat_max_late_ms, ' ms', 1)}), GC pauses up to "
        f"{fmt(u.gc_max_pause_ms, ' ms', 1)}. A stall far above its CPU time is the loop "
        "waiting for the GIL or a core, not working. *What it would take:* the embedded "
        "Gym's export (threads that share the loop's GIL) in another process, fewer young "
        "objects made while it runs, and a core of its own."
    )


def _redone_miss(pu: PreservedMode, pa: PreservedMode) -> str:
    """The unaligned mode redoing more than the aligned one after a crash, and why."""
    return (
        f"- **Work redone after a crash, unaligned {pct(pu.gymckpt_redone_fraction_pooled)}"
        f" > aligned {pct(pa.gymckpt_redone_fraction_pooled)}** (pooled over the same "
        "kill times). An unaligned checkpoint takes each episode at its *last* step "
        "boundary before the cut, so the part of the turn in flight at the cut is redone "
        "(only its completed model calls are kept); an aligned one waits until every "
        "episode reaches its *next* boundary, so it keeps those turns whole, and it moved "
        "less before the kill (it parked its episodes). With heavy-tailed turns the turn "
        "in flight is long. *What it would take:* keeping more of the turn in flight — "
        "every completed call is already replayed; the rest is the environment's time "
        "(the sleep between calls here), which only a checkpoint of the environment's own "
        "progress inside the turn could keep."
    )


def mode_miss_lines(
    missed: set[str],
    checkpoint: CheckpointResult | None,
    preserved: PreservedResult | None,
) -> list[str]:
    """Where issue 22's targets are missed, from the figures of both modes."""
    out: list[str] = []
    emb = (checkpoint.modes or {}) if checkpoint is not None else {}
    u, a = emb.get("unaligned"), emb.get("aligned")
    n = checkpoint.in_flight if checkpoint is not None else 0
    if u is not None and "unaligned_pause_p99" in missed:
        out.append(_pause_miss(u, a))
    if u is not None and "unaligned_checkpoint_e2e" in missed:
        out.append(
            f"- **Whole unaligned checkpoint {fmt(u.until_all_moving_s, ' s', 2)} > 2 s** "
            f"until every episode moves ({fmt(u.until_moving_loop_cpu_s, ' s', 2)} of loop "
            f"CPU, {fmt(u.until_moving_process_cpu_s, ' s', 2)} of process CPU: a wall time "
            "well above them is the loop waiting for a core). Largest stages: "
            + _stage_text(u, n)
            + ". The commit already formats its records around each mark's bytes, kept in "
            "their final encoding since the boundary (no state parsed or serialised at the "
            "commit; every object of an instance synced together), and the runtime's stages "
            "are a few µs per episode. *What it would take:* the four instances' exports, "
            "now in threads of one interpreter, in processes of their own (as over Ray and "
            "HTTP), and on this machine a quiet core."
        )
    if u is not None and "unaligned_checkpoint_stall" in missed:
        out.append(_stall_miss(u))
    pm = (preserved.modes or {}) if preserved is not None else {}
    pu, pa = pm.get("unaligned"), pm.get("aligned")
    if pu is not None and "unaligned_parked" in missed:
        out.append(
            f"- **Parked-time fraction, unaligned, {pct(pu.measured_parked_fraction, 2)} > "
            "0.5 %.** An unaligned checkpoint should park nothing; "
            f"{fmt(pu.held_per_checkpoint, '', 1)} episodes a checkpoint were held at a "
            "boundary (an environment that opts out, `Environment(unaligned=False)`, is "
            "parked as aligned). *What it would take:* no episode held at the cut."
        )
    if pu is not None and pa is not None and "unaligned_redone" in missed:
        out.append(_redone_miss(pu, pa))
    return out
