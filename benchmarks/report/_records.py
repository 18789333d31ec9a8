"""Each benchmark's result as the report reads it: one frozen record per JSON result file, with
the fields the report prints or judges, structured once by ``_results``.

A field without a default is one every result of that benchmark carries and the report
compares, computes with or prints as it is; a file that lacks it is refused with the field's
path. A field defaulting to None is one a result may lack or hold as ``null`` (the report
prints it through ``fmt``, as ``n/a``, or leaves its part out): written only by some runs
(``simulated_wait_s`` only for the stage that waits on the simulated clock), added to a
benchmark after results were committed (``wake_by_pending``), not measured (a non-finite
float is written as ``null``), or absent from a failed run (a checkpoint on Ray that did not
start has its configuration and its error only). Every other key of a result file (the
headline keys a ``--json`` run prints, the full configuration) is for other readers and is
not read here.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "BaselineDrain",
    "CheckpointRayResult",
    "CheckpointRayRunConfig",
    "CheckpointResult",
    "CheckpointRunConfig",
    "DrainResult",
    "DrainRunConfig",
    "DrainWakeControl",
    "EmbeddedDispatch",
    "GymCallsByOp",
    "HostLoop",
    "HostMarksCalendar",
    "HostMarksFigures",
    "HostMarksResult",
    "HostPerStep",
    "HostResult",
    "LatencyTrialsGc",
    "MachineLoad",
    "ModeCheckpoint",
    "OursDrain",
    "PauseStats",
    "PreservedMode",
    "SandboxCheckpoint",
    "SandboxMark",
    "SandboxResult",
    "StageRow",
    "StallPass",
    "SweepRow",
    "TrainerSideResult",
    "WakeByPending",
    "WakeMs",
    "WakeUs",
]

# -- checkpoint (embedded and on Ray) --------------------------------------------------------


@attrs.frozen
class StageRow:
    """One checkpoint stage's timings, in ms; stall figures are None under 0.1 ms (none
    recorded), the heartbeat's lateness None when it was never more than 1 ms late."""

    stage: str
    wall_ms: float
    max_loop_stall_ms: float | None
    max_loop_stall_cpu_ms: float | None
    gc_pause_ms: float | None
    in_gym_calls_ms: float
    max_stall_task: str | None = None
    max_runtime_stall_excluding_gc_ms: float | None = None
    heartbeat_max_late_ms: float | None = None
    simulated_wait_s: float | None = None


@attrs.frozen
class EmbeddedDispatch:
    """Rows through the whole loop on the embedded Gym at one dispatcher batch; results from
    before the one-step episode was measured have no ``environment`` (the calendar's)."""

    batch: int
    attempts: int
    rows_per_s: int
    seconds: float | None = None
    environment: str | None = None


@attrs.frozen
class PauseStats:
    """What a window did to the episodes in flight (``benchmarks._heavy.pauses_in``): each
    episode's boundary gaps and turn overruns over 0.5 ms, summed; p50 / p99 / max over every
    episode in flight, those with nothing over the threshold counted as 0."""

    pause_p50_ms: float
    pause_p99_ms: float
    pause_max_ms: float
    episodes: int
    boundary_gap_max_ms: float | None = None
    turn_overrun_max_ms: float | None = None


@attrs.frozen
class ModeCheckpoint:
    """One checkpoint in one mode, measured until every episode moves again: wall figures
    with the CPU time beside them, the scheduler's longest batch beside the longest task step,
    and what the episodes felt (``pauses``) against a window of no checkpoint (``control``)."""

    checkpoint_ok: bool
    checkpoint_wall_s: float
    max_loop_stall_ms: float
    stages: list[StageRow]
    until_all_moving_s: float
    pauses: PauseStats
    e2e_s: float | None = None
    turn_time_wall_s: float | None = None
    turn_time_simulated_s: float | None = None
    until_all_moving_excluding_turn_s: float | None = None
    until_all_moving_with_wait_s: float | None = None
    """Aligned on the embedded Gym: the wall time plus the simulated wait of its prepare
    (what the episodes waited in all); unaligned, the wall time."""
    moving_after_return_s: float | None = None
    checkpoint_loop_cpu_s: float | None = None
    checkpoint_process_cpu_s: float | None = None
    until_moving_loop_cpu_s: float | None = None
    until_moving_process_cpu_s: float | None = None
    max_loop_stall_task: str | None = None
    heartbeat_max_late_ms: float | None = None
    scheduler_batch_max_ms: float | None = None
    scheduler_batch_max_cpu_ms: float | None = None
    scheduler_batch_p99_ms: float | None = None
    gc_max_pause_ms: float | None = None
    episodes_exported: int | None = None
    control_pauses: PauseStats | None = None
    checkpoint_error: str | None = None
    mid_turn: int | None = None
    checkpoint_failure: str | None = None
    checkpoints: int | None = None
    """Checkpoints measured in this mode (``bench checkpoint --checkpoints``, embedded); the
    other figures are the median completed one's. None: one checkpoint (an older result)."""
    completed: int | None = None
    complete_pct: float | None = None
    mid_turn_median: float | None = None
    pause_p50_ms_median: float | None = None
    pause_p99_ms_median: float | None = None
    vs_unaligned: dict[str, float | None] | None = None
    """This mode's figures over pure unaligned's in the same run (``checkpoint.RATIO_KEYS``)."""
    control_timeout_s: float | None = None
    alignment_timeout_s: float | None = None
    repeats: list[dict[str, Any]] | None = None

    def stall_all_causes_ms(self) -> float:
        """The longest time the loop could not run a task: a task step (GC in it included)
        or the 1 ms heartbeat's lateness (the loop waiting for the GIL)."""
        late = max([r.heartbeat_max_late_ms or 0.0 for r in self.stages], default=0.0)
        return max(self.max_loop_stall_ms, late, self.heartbeat_max_late_ms or 0.0)


@attrs.frozen
class CheckpointRunConfig:
    instances: int
    dispatch_batch: int


@attrs.frozen
class CheckpointResult:
    """``checkpoint.json``: one whole checkpoint on the embedded Gym."""

    in_flight: int
    config: CheckpointRunConfig
    checkpoint_ok: bool
    episodes_exported: int
    pending_drained: int
    snapshot_files: int
    ledger_json_bytes: int
    stages: list[StageRow]
    max_loop_stall_ms: float
    checkpoint_wall_s: float | None = None
    snapshot_mib: float | None = None
    snapshot_bytes_per_episode: float | None = None
    max_runtime_stall_excluding_gc_ms: float | None = None
    e2e_s: float | None = None
    turn_time_wall_s: float | None = None
    gc_max_pause_ms: float | None = None
    bytes_per_attempt: float | None = None
    max_runtime_stall_stage: str | None = None
    stage_s: dict[str, float] | None = None
    embedded_dispatch: list[EmbeddedDispatch] | None = None
    fill_wall_s: float | None = None
    embedded_fill_rows_per_s: int | None = None
    modes: dict[str, ModeCheckpoint] | None = None
    turn_times: dict[str, Any] | None = None


@attrs.frozen
class GymCallsByOp:
    """One Gym call over every actor in a checkpoint on Ray: the stage it is made in and the
    slowest and median actor's time in it."""

    stage: str
    slowest_actor_ms: float | None
    median_actor_ms: float | None


@attrs.frozen
class CheckpointRayRunConfig:
    in_flight: int
    actors: int
    turn_s: list[float] | None = None
    turn_times: dict[str, Any] | None = None


@attrs.frozen
class CheckpointRemoteResult:
    """One whole checkpoint on Ray actors or spawned ``gymckpt serve`` processes
    (``backend``; ``actors`` is the number of instances). A run that failed (Ray did not
    start, an actor or a server died) has its configuration, ``checkpoint_ok`` false and the
    ``error``, and no ``stages``; every measured field is then None."""

    config: CheckpointRayRunConfig
    checkpoint_ok: bool = False
    in_flight: int | None = None
    actors: int | None = None
    error: str | None = None
    checkpoint_error: str | None = None
    stages: list[StageRow] | None = None
    stage_s: dict[str, float] | None = None
    gym_calls_by_op: dict[str, GymCallsByOp] | None = None
    actors_start_s: float | None = None
    cluster_start_s: float | None = None
    episodes_exported: int | None = None
    pending_drained: int | None = None
    checkpoint_wall_s: float | None = None
    turn_time_wall_s: float | None = None
    e2e_s: float | None = None
    max_loop_stall_ms: float | None = None
    max_loop_stall_task: str | None = None
    gc_max_pause_ms: float | None = None
    fill_wall_s: float | None = None
    fill_rows_per_s: int | None = None
    finished_before_checkpoint: int | None = None
    snapshot_mib: float | None = None
    snapshot_files: int | None = None
    modes: dict[str, ModeCheckpoint] | None = None
    turn_times: dict[str, Any] | None = None
    backend: str | None = None
    client_sockets_max: int | None = None
    """The trainer process's open sockets at their peak (``/proc/self/fd``), sampled from the
    fill to the last checkpoint; None where not measured (an older result, no ``/proc``)."""


@attrs.frozen
class CheckpointRayResult(CheckpointRemoteResult):
    """``checkpoint_ray.json``: the checkpoint on Ray, and (``--backend both``) the same over
    HTTP measured in the same run, with HTTP's figures as ratios of Ray's."""

    http: CheckpointRemoteResult | None = None


# -- drain ----------------------------------------------------------------------------------


@attrs.frozen
class WakeUs:
    median_us: float
    p99_us: float


@attrs.frozen
class WakeMs:
    median_ms: float


@attrs.frozen
class LatencyTrialsGc:
    """The collector's work during the latency trials (no instrument running)."""

    gc_collections_by_generation: list[int]
    max_gc_pause_ms: float | None


@attrs.frozen
class StallPass:
    """The instrumented pass's longest stall with the collector's pauses taken out."""

    max_loop_stall_excluding_gc_ms: float | None
    max_stall_excluding_gc_task: str | None
    max_loop_stall_cpu_excluding_gc_ms: float | None = None


@attrs.frozen
class OursDrain:
    """The event-driven drain at one size."""

    wake: WakeUs
    per_wakeup_us: float
    per_wakeup_p99_us: float | None
    per_reply_overhead_us: float
    max_loop_stall_ms: float | None
    max_gc_pause_ms: float | None
    latency_trials_gc: LatencyTrialsGc
    stall_pass: StallPass
    drain_primitive: str | None = None


@attrs.frozen
class BaselineDrain:
    """The polling drain at one size."""

    wake: WakeMs
    per_wakeup_us: float
    max_loop_stall_ms: float | None


@attrs.frozen
class MachineLoad:
    other_processes_cpu_pct: float | None = None


@attrs.frozen
class SweepRow:
    """The drain at one number of rollouts in flight."""

    in_flight: int
    ours: OursDrain
    baseline: BaselineDrain
    trio_wake_floor: WakeUs
    machine_load: MachineLoad | None = None


@attrs.frozen
class WakeByPending:
    """The probed trials at the headline size with ``pending`` replies pending."""

    pending: int
    wake_us_median: float
    wake_us_p99: float | None
    reply_to_drain_running_us_median: float
    drain_step_us_median: float
    per_wakeup_us: float | None
    wake_us_median_pending_set_freed_later: float | None = None
    drain_step_us_median_pending_set_freed_later: float | None = None


@attrs.frozen
class DrainWakeControl:
    """One pending reply delivered after as many unrelated mutations as the headline trial
    runs: what the wake costs after that traffic alone."""

    unrelated_mutations_before: int
    wake_us_median: float
    reply_to_drain_running_us_median: float
    drain_step_us_median: float


@attrs.frozen
class DrainRunConfig:
    trials: int
    baseline_trials: int
    interleave: int


@attrs.frozen
class DrainResult:
    """``drain.json``: the drain sweep; ``rollouts`` is the headline size, one of the sweep's."""

    rollouts: int
    pending: int
    drain_wake_us_median: float
    drain_wake_ms_p99: float
    max_loop_stall_ms: float
    baseline_wake_ms_median: float
    config: DrainRunConfig
    sweep: list[SweepRow]
    trio_wake_floor_us: float | None = None
    speedup: float | None = None
    reply_to_drain_running_us_median: float | None = None
    drain_step_us_median: float | None = None
    wake_by_pending: list[WakeByPending] | None = None
    one_pending_after_same_traffic: DrainWakeControl | None = None

    def headline(self) -> SweepRow:
        """The sweep's row at the headline size: the one the targets are read at."""
        return {r.in_flight: r for r in self.sweep}[self.rollouts]

    def by_pending(self) -> dict[int, WakeByPending]:
        """The probed trials at the headline size, by the number of replies pending."""
        return {r.pending: r for r in self.wake_by_pending or []}


# -- the runtime without a Gym: ledger memory and dispatch -----------------------------------


@attrs.frozen
class MemoryRow:
    """One measurement of the ledger's memory at ``target_attempts``, by ``mode``
    (``tracemalloc``: the Python heap; ``rss``: the resident set, with the full collection's
    time)."""

    target_attempts: int
    mode: str
    bytes: int
    bytes_per_attempt: float | None = None
    gc_full_ms_ledger_only: float | None = None
    gc_full_ms_with_ledger: float | None = None


@attrs.frozen
class MemoryResult:
    """``memory.json``: the ledger's memory per attempt at each size, and how it is measured."""

    method: str
    results: list[MemoryRow]


@attrs.frozen
class DispatchRow:
    in_flight: int
    batch: int
    rows_per_s: int
    admit_dispatch_rows_per_s: int
    completion_rows_per_s: int
    us_per_row: float


@attrs.frozen
class DispatchResult:
    """``dispatch.json``: dispatch throughput through the gate and the ledger, no Gym; with
    ``--loop`` (``bench issue34``), rows/s through the whole loop on a null Gym (the runtime
    alone) and on the embedded Gym (one-turn episodes), medians of the same run's runs."""

    rows_per_config: int
    results: list[DispatchRow]
    loop_rows_per_s_null: int | None = None
    loop_rows_per_s_embedded: int | None = None
    loop_rows_per_s_bare: int | None = None
    """The embedded host with episodes that end at their first step: the host's own cost."""
    config: dict[str, Any] | None = None
    """The run's ``DispatchConfig`` (``loop_attempts``: attempts per whole-loop run)."""


# -- the trainer side alone (`bench checkpoint --backend null`) ------------------------------


@attrs.frozen
class TrainerSideResult:
    """``trainer_side.json``: one whole checkpoint with ``in_flight`` rollouts in flight
    against a Gym that answers at once; ``close_to_resume_s`` is the checkpoint's wall time."""

    in_flight: int
    checkpoint_ok: bool
    close_to_resume_s: float
    stall_all_causes_ms: float
    stages: list[StageRow]
    stage_s: dict[str, float] | None = None
    checkpoint_error: str | None = None
    gc_max_pause_ms: float | None = None
    max_loop_stall_task: str | None = None
    instances: int | None = None


# -- fan-out on Ray ---------------------------------------------------------------------------


@attrs.frozen
class OpTimes:
    """One Gym call's stage at one fan-out size, medians over the checkpoints, in ms."""

    stage_ms: float
    slowest_ms: float
    median_instance_ms: float | None = None
    fanout_overhead_ms: float | None = None


@attrs.frozen
class FanoutSize:
    """The fan-out at ``actors`` Ray actors; a size that failed (``ok`` false) has its
    ``error`` and no timings."""

    actors: int
    ok: bool
    error: str | None = None
    actor_start_s: float | None = None
    checkpoint_wall_ms: float | None = None
    prepare: OpTimes | None = None
    commit: OpTimes | None = None
    resume: OpTimes | None = None

    def op(self, name: str) -> OpTimes:
        """The timings of the stage ``name`` (one of ``fanout.OPS``) of a size that ran."""
        times = {"prepare": self.prepare, "commit": self.commit, "resume": self.resume}[name]
        if times is None:
            raise ValueError(f"fan-out at {self.actors} actors has no {name} timings")
        return times


@attrs.frozen
class LinearModel:
    """``t(K) = a + b·K`` fitted to the measured sizes; ``at`` its value at 64, 128 and 256
    actors (keys are the actor counts as strings, as in the JSON)."""

    a_ms: float
    b_ms_per_actor: float
    r2: float
    at: dict[str, float]


@attrs.frozen
class RayDispatch:
    """Dispatch through the whole loop on Ray (or over HTTP: ``backend``) with 2 instances;
    ``rows_per_s`` is the median of ``runs_rows_per_s`` (one run in results from before the
    runs were repeated). A backend with no run that finished has ``ok`` false and its
    ``error``."""

    ok: bool = False
    error: str | None = None
    attempts: int | None = None
    seconds: float | None = None
    rows_per_s: int | None = None
    batch: int | None = None
    backend: str | None = None
    runs_rows_per_s: list[int] | None = None


@attrs.frozen
class FanoutRunConfig:
    warmup: int
    checkpoints: int


@attrs.frozen
class FanoutHttp:
    """``fanout.json``'s ``http``: the same sweep on spawned ``gymckpt serve`` processes
    (``actors`` is the number of servers), its models and its dispatch."""

    results: list[FanoutSize]
    sizes_failed: list[int]
    models: dict[str, LinearModel | None] | None = None
    dispatch: RayDispatch | None = None


@attrs.frozen
class FanoutResult:
    """``fanout.json``: the control fan-out per size on Ray, the linear models (None for a
    figure with too few sizes measured) and dispatch on Ray; ``http`` the same over HTTP,
    measured in the same run (None in results from before it was)."""

    config: FanoutRunConfig
    results: list[FanoutSize]
    sizes_failed: list[int]
    models: dict[str, LinearModel | None] | None = None
    ray_dispatch: RayDispatch | None = None
    cluster_start_s: float | None = None
    http: FanoutHttp | None = None


# -- work preserved across a crash ------------------------------------------------------------


@attrs.frozen
class KillRow:
    """One kill time: what was in flight, what gymckpt redoes and what the baseline redoes;
    ``restored_checkpoint`` None when the run was killed before its first checkpoint."""

    kill_s: float
    at_risk_episodes: int
    in_flight_at_kill: int
    in_flight_rollout_s: float
    gymckpt_redone_rollout_s: float
    baseline_redone_rollout_s: float
    restored_episodes: int
    restored_checkpoint: str | None = None
    checkpoint_s: float | None = None
    since_checkpoint_s: float | None = None
    gymckpt_redone_fraction: float | None = None
    restore_wall_s: float | None = None


@attrs.frozen
class PreservedMode:
    """``preserved.json``'s figures for one checkpoint mode, over the same kill times as the
    other mode's; ``measured_parked_fraction`` is what the episodes felt (every gap between a
    step boundary and their next turn, over the turn time done), ``held_*`` the pauses of the
    episodes a checkpoint held at a boundary."""

    kills: int
    restores: int
    boundary_mismatches: int
    per_kill: list[KillRow]
    gymckpt_redone_rollout_s_total: float
    baseline_redone_rollout_s_total: float
    gymckpt_redone_fraction_median: float | None = None
    gymckpt_redone_fraction_pooled: float | None = None
    parked_fraction_of_rollout_time: float | None = None
    measured_parked_fraction: float | None = None
    held_per_checkpoint: float | None = None
    held_pause_p50_s: float | None = None
    held_pause_p99_s: float | None = None
    held_pause_max_s: float | None = None


@attrs.frozen
class PreservedRunConfig:
    instances: int
    rows_in_flight: int
    group_size: int
    groups_per_step: int
    train_s: float
    turns: list[int]
    kill_window_s: list[float]
    turn_s: list[float] | None = None


@attrs.frozen
class PreservedResult:
    """``preserved.json``: work preserved across a crash, per kill time and over all."""

    config: PreservedRunConfig
    kills: int
    restores: int
    boundary_mismatches: int
    per_kill: list[KillRow]
    gymckpt_redone_rollout_s_total: float
    baseline_redone_rollout_s_total: float
    gymckpt_redone_fraction_median: float | None = None
    gymckpt_redone_fraction_max: float | None = None
    gymckpt_redone_fraction_pooled: float | None = None
    parked_fraction_of_rollout_time: float | None = None
    modes: dict[str, PreservedMode] | None = None
    turn_times: dict[str, Any] | None = None


# -- sandboxes: bytes per checkpoint, the mark, the restore (`gymckpt bench sandbox`) ---------


@attrs.frozen
class SandboxCheckpoint:
    """One checkpoint of ``sandbox.json``: bytes a whole-tree snapshot would write (``full``,
    computed) and bytes written since the previous checkpoint (``incremental``, measured on
    disk: ``snapshot_bytes`` under the snapshot root plus ``object_bytes`` in the sandbox's
    object store)."""

    full_bytes: int
    incremental_bytes: int
    snapshot_bytes: int
    object_bytes: int


@attrs.frozen
class SandboxMark:
    """The mark's cost with ``changed_files`` changed since the last one, and the files it
    hashed in each repeat."""

    changed_files: int
    mark_ms_median: float
    hashed: list[int]


@attrs.frozen
class SandboxResult:
    """``sandbox.json``: two checkpoints of ``sessions`` sandboxes, the second after
    ``changed_fraction`` of each tree's files changed; the mark; the restore per sandbox."""

    sessions: int
    template_files: int
    template_bytes: int
    changed_fraction: float
    first: SandboxCheckpoint
    second: SandboxCheckpoint
    second_incremental_over_first_full: float
    second_over_first_incremental: float
    mark: list[SandboxMark]
    restore_ms_median: float


# -- the Gym host on Gymnasium CartPole (`gymckpt bench host`, run on its own) ----------------


@attrs.frozen
class HostPerStep:
    """The host's per-step cost against plain Gymnasium on the same episodes, µs per step
    (medians over the trials)."""

    env: str
    episodes: int
    steps_per_trial: int
    plain_us_per_step_median: float
    host_us_per_step_median: float
    host_overhead_us_per_step: float
    host_over_plain_ratio: float
    host_on_demand_us_per_step_median: float | None = None
    host_on_demand_over_plain_ratio: float | None = None
    marks_on_demand_us_per_step: float | None = None
    """What boundary marks cost a step in an aligned run of a host with
    ``boundary_marks="on_demand"`` (that host against the same environment opted out, same
    trials); 0 when no mark is taken. None in results from before it was measured."""
    opted_out_us_per_step_median: float | None = None


@attrs.frozen
class HostLoop:
    """Episodes per second through the whole loop, embedded with 2 instances and (not under
    ``--no-ray``) on Ray with 2 actors, the same rows. ``meta`` is set only when these
    figures come from another run than the file's (kept when a ``--no-ray`` run's figures
    were merged into a file that had Ray's): that run's ``meta``."""

    rows: int
    group_size: int
    embedded_2_instances_episodes_per_s: float
    ray_2_actors_episodes_per_s: float | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen
class HostMarksFigures:
    """One environment hosted with boundary marks on and opted out
    (``Environment(unaligned=False)``), interleaved in each trial: µs per step of each, wall
    and CPU (medians over the trials), and the marks' overhead as a ratio of a step opted out
    (the median of the per-trial ratios)."""

    episodes: int
    marks_us_per_step_median: float
    opted_out_us_per_step_median: float
    marks_overhead_us_per_step: float
    marks_overhead_ratio: float
    marks_cpu_us_per_step_median: float
    opted_out_cpu_us_per_step_median: float
    marks_overhead_cpu_us_per_step: float
    marks_overhead_cpu_ratio: float


@attrs.frozen
class HostMarksCalendar(HostMarksFigures):
    """The calendar workplace's marks, with its episodes' length in turns."""

    turns: int = attrs.field(kw_only=True)


@attrs.frozen
class HostMarksResult:
    """``host.json``'s ``marks``: the unaligned mode's per-step cost on CartPole (the target's
    environment) and on the calendar (long episodes, a growing history in every mark)."""

    cartpole: HostMarksFigures
    calendar: HostMarksCalendar


@attrs.frozen
class HostResult:
    """``host.json`` (``gymckpt bench host --json``, written on its own, not by ``all``, so
    with its own ``meta``). A file written before the unaligned mode's marks were measured has
    no ``marks`` (None)."""

    per_step: HostPerStep
    loop: HostLoop
    marks: HostMarksResult | None = None
    meta: dict[str, Any] | None = None
