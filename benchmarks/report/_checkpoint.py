"""The report's sections on one whole checkpoint: on the embedded Gym (stage table, the fill
and the embedded dispatch through the whole loop) and on Ray (stage table with the slowest
and median actor per Gym call)."""

from __future__ import annotations

from ._format import Add, fmt, stall, turns_text
from ._records import (
    CheckpointRayResult,
    CheckpointRemoteResult,
    CheckpointResult,
    StageRow,
    TrainerSideResult,
)

__all__ = [
    "checkpoint_keys",
    "checkpoint_ray_section",
    "checkpoint_section",
    "trainer_side_section",
]


def _late(row: StageRow) -> str:
    if row.stage in ("close+retire", "prepare"):
        return "—"  # virtual time: the heartbeat starts at after_prepare
    v = row.heartbeat_max_late_ms
    return "< 1 ms" if v is None else fmt(v, " ms", 1)


def checkpoint_section(add: Add, ck: CheckpointResult) -> None:
    add(f"## Checkpoint end to end on the embedded Gym ({ck.in_flight:,} in flight)")
    add("")
    add(
        f"One `Rollouts.checkpoint()` through `nurseries.open_rollouts` on `EmbeddedGym` "
        f"({ck.config.instances} instances): ok = {ck.checkpoint_ok}, "
        f"{ck.episodes_exported:,} episodes exported, {ck.pending_drained} pending "
        f"drained, {fmt(ck.checkpoint_wall_s, ' s', 2)} wall. Snapshot on disk: "
        f"{fmt(ck.snapshot_mib, ' MiB')} in {ck.snapshot_files} files "
        f"({fmt(ck.snapshot_bytes_per_episode, ' B', 0)} per episode; `ledger.json` "
        f"{fmt(ck.ledger_json_bytes / 2**20, ' MiB')})."
    )
    add("")
    add(
        "| stage | wall | longest loop stall (wall / CPU) | runtime's own, GC out | GC pauses "
        "| heartbeat late | inside Gym calls |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in ck.stages:
        extra = ""
        if r.simulated_wait_s is not None:
            extra = f" (+ {r.simulated_wait_s:.1f} s simulated wait)"
        add(
            f"| {r.stage} | {fmt(r.wall_ms, ' ms', 1)}{extra} | "
            f"{stall(r.max_loop_stall_ms)} / {stall(r.max_loop_stall_cpu_ms)} | "
            f"{stall(r.max_runtime_stall_excluding_gc_ms)} | "
            f"{fmt(r.gc_pause_ms, ' ms', 1)} | "
            f"{_late(r)} | "
            f"{fmt(r.in_gym_calls_ms, ' ms', 1)} |"
        )
    add("")
    add(
        "The run fills Gym on a virtual clock and switches to real time once Gym is parked "
        "(`after_prepare`): `prepare`'s wall time is the embedded Gym moving every episode to a "
        "step boundary on this loop, and its simulated wait is the turn length the simulation "
        "was given; every later stage runs in real time with the runtime's worker threads, as "
        "in production. `commit` is the embedded Gym's export (see *inside Gym calls*). "
        "*Runtime's own*: the longest stall in a task that is not the embedded Gym's, not "
        "inside a Gym call, with GC pauses taken out. *Heartbeat late*: worst lateness of a "
        "1 ms sleep (from `after_prepare` on; only lateness over 1 ms is recorded), which also "
        "catches the loop waiting for the GIL. GC pauses include collections in worker threads "
        "(the snapshot and publish stages allocate there)."
    )
    add("")
    emb = ck.embedded_dispatch or []
    if emb:
        add(
            f"Filling Gym to {ck.in_flight:,} in flight took {fmt(ck.fill_wall_s, ' s')} "
            f"({ck.embedded_fill_rows_per_s:,} rows/s, dispatcher batch "
            f"{ck.config.dispatch_batch}). Rows through the whole loop on the embedded "
            "Gym (gate, ledger, the host's admission, the episode, the streamed reply, the "
            "completion mutation, the trainer taking the group), virtual clock, Gym sharing "
            "the core. *one_step*: a user's environment whose agent ends the episode in its "
            "first step (what the runtime and the Gym host cost per row); *calendar*: the "
            "calendar workplace with one 10-20 ms turn and its retained calendar session (what "
            "a small real environment adds):"
        )
        add("")
        add("| episode | dispatcher batch | attempts | wall | rows/s |")
        add("| --- | ---: | ---: | ---: | ---: |")
        for d in emb:
            add(
                f"| {d.environment or 'calendar'} | {d.batch} | {d.attempts:,} | "
                f"{fmt(d.seconds, ' s', 2)} | {d.rows_per_s:,} |"
            )
        add("")


def checkpoint_ray_section(add: Add, cr: CheckpointRemoteResult) -> None:
    """The checkpoint on Ray actors, or (``cr.backend`` http) on spawned servers."""
    cfg = cr.config
    http = cr.backend == "http"
    where, unit = ("over HTTP", "servers") if http else ("on Ray", "actors")
    add(
        f"## Checkpoint end to end {where} "
        f"({cfg.in_flight if cr.in_flight is None else cr.in_flight:,} in flight, "
        f"{cfg.actors if cr.actors is None else cr.actors} {unit})"
    )
    add("")
    if cr.stages is None:
        add("Not measured: the run failed.")
        add("")
        add("```")
        add(str(cr.error))
        add("```")
        add("")
        return
    deployment = (
        f"`HttpGym` ({cr.actors} simulated calendar instances, one spawned `gymckpt serve` "
        f"process each, started in {fmt(cr.actors_start_s, ' s')})"
        if http
        else f"`RayGym` ({cr.actors} simulated calendar instances, one Ray actor each, "
        f"started in {fmt(cr.actors_start_s, ' s')} on a local cluster started in "
        f"{fmt(cr.cluster_start_s, ' s')})"
    )
    add(
        f"One `Rollouts.checkpoint()` through `nurseries.open_rollouts` on {deployment}, "
        "real time throughout: "
        f"ok = {cr.checkpoint_ok}, {cr.episodes_exported:,} episodes exported, "
        f"{cr.pending_drained} pending drained, {fmt(cr.checkpoint_wall_s, ' s', 2)} "
        f"wall, of which `prepare` (every episode reaching its next step boundary: turns of "
        f"{turns_text(cfg.turn_s, cr.turn_times)}) {fmt(cr.turn_time_wall_s, ' s', 2)}"
        f": **{fmt(cr.e2e_s, ' s', 2)} close to resume less the turn time**. Longest loop "
        f"stall {fmt(cr.max_loop_stall_ms, ' ms', 1)} (task `{cr.max_loop_stall_task}`), "
        f"longest GC pause {fmt(cr.gc_max_pause_ms, ' ms', 1)}. Filling Gym took "
        f"{fmt(cr.fill_wall_s, ' s')} ({cr.fill_rows_per_s:,} rows/s); "
        f"{cr.finished_before_checkpoint} episodes finished before the checkpoint. Snapshot "
        f"on disk: {fmt(cr.snapshot_mib, ' MiB')} in {cr.snapshot_files} files."
    )
    add("")
    add(
        "| stage | wall | longest loop stall (wall / CPU) | GC pauses | heartbeat late "
        f"| inside Gym calls | slowest / median {unit[:-1]} |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    by_op = cr.gym_calls_by_op or {}
    for r in cr.stages:
        actors = (
            "; ".join(
                f"`{op}` {fmt(a.slowest_actor_ms, ' ms', 1)} / {fmt(a.median_actor_ms, ' ms', 1)}"
                for op, a in by_op.items()
                if a.stage == r.stage
            )
            or "—"
        )
        late = r.heartbeat_max_late_ms
        add(
            f"| {r.stage} | {fmt(r.wall_ms, ' ms', 1)} | "
            f"{stall(r.max_loop_stall_ms)} / {stall(r.max_loop_stall_cpu_ms)} | "
            f"{fmt(r.gc_pause_ms, ' ms', 1)} | "
            f"{'< 1 ms' if late is None else fmt(late, ' ms', 1)} | "
            f"{fmt(r.in_gym_calls_ms, ' ms', 1)} | {actors} |"
        )
    add("")
    add(
        "Measured by the embedded run's code (`checkpoint.measure_checkpoint`). *Inside Gym "
        f"calls*: the stage's time with at least one call outstanding, "
        f"{'HTTP' if http else 'Ray'} round trip included; *slowest / median*: each "
        "instance's time in that stage's calls "
        "(`topology` is one call for every instance, asked once, at a run's first checkpoint, "
        "before admission closes). GC pauses include collections in the trainer's worker "
        "threads. The trainer and the "
        + ("servers" if http else "actors and Ray's own processes")
        + " share this machine's cores."
    )
    add("")


def trainer_side_section(add: Add, ts: TrainerSideResult) -> None:
    """The trainer side alone (``bench checkpoint --backend null``): close to resume and each
    stage, against a Gym that answers at once."""
    add(f"## The trainer side alone ({ts.in_flight:,} in flight, a Gym that answers at once)")
    add("")
    add(
        f"One whole checkpoint (`gymckpt bench checkpoint --backend null`, {ts.instances} "
        "instances that hold every row in flight and answer every control call at once): "
        f"**{fmt(ts.close_to_resume_s, ' s', 2)} close to resume**"
        + ("" if ts.checkpoint_ok else f" (failed: {ts.checkpoint_error})")
        + f", longest loop stall of all causes {fmt(ts.stall_all_causes_ms, ' ms', 1)} "
        f"(`{ts.max_loop_stall_task}`), longest GC pause {fmt(ts.gc_max_pause_ms, ' ms', 1)}."
    )
    add("")
    add("| stage | wall | longest task step | heartbeat late | in Gym's calls |")
    add("| --- | ---: | ---: | ---: | ---: |")
    for r in ts.stages:
        add(
            f"| {r.stage} | {fmt(r.wall_ms, ' ms', 1)} | {stall(r.max_loop_stall_ms)} | "
            f"{_late(r)} | {fmt(r.in_gym_calls_ms, ' ms', 1)} |"
        )
    add("")


def checkpoint_keys(
    add: Add, checkpoint: CheckpointResult | None, checkpoint_ray: CheckpointRayResult | None
) -> None:
    """The headline keys of ``gymckpt bench checkpoint --json`` from this run, so a reader can
    match the report to that command's output."""
    runs: list[tuple[str, dict[str, float | None], dict[str, float]]] = []
    if checkpoint is not None:
        keys = {
            "e2e_s": checkpoint.e2e_s,
            "max_loop_stall_ms": checkpoint.max_loop_stall_ms,
            "gc_max_pause_ms": checkpoint.gc_max_pause_ms,
            "bytes_per_attempt": checkpoint.bytes_per_attempt,
        }
        runs.append((f"--rollouts {checkpoint.in_flight}", keys, checkpoint.stage_s or {}))
    if checkpoint_ray is not None and checkpoint_ray.stage_s is not None:
        cr = checkpoint_ray
        keys = {
            "e2e_s": cr.e2e_s,
            "turn_time_wall_s": cr.turn_time_wall_s,
            "max_loop_stall_ms": cr.max_loop_stall_ms,
            "gc_max_pause_ms": cr.gc_max_pause_ms,
        }
        runs.append(
            (f"--backend ray --actors {cr.actors} --rollouts {cr.in_flight}", keys, cr.stage_s)
        )
    for flags, keys, stage_s in runs:
        add(
            f"`gymckpt bench checkpoint {flags} --json` keys, from this run: "
            + ", ".join(f"`{k}` = {v}" for k, v in keys.items())
            + ", `stage_s` = "
            + ", ".join(f"{k} {v:.3f}" for k, v in stage_s.items())
            + "."
        )
        add("")
