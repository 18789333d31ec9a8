"""The report's section on work preserved across a crash: per kill time, what gymckpt redoes
against the step-boundary baseline (which redoes every in-flight rollout)."""

from __future__ import annotations

from ._format import Add, fmt, turns_text
from ._records import PreservedResult

__all__ = ["preserved_section"]


def _longest(pv: PreservedResult) -> str:
    if pv.turn_times is not None:
        return fmt(pv.turn_times.get("cap_s"), " s", 1)
    return "n/a" if pv.config.turn_s is None else f"{pv.config.turn_s[1]:g} s"


def preserved_section(add: Add, pv: PreservedResult) -> None:
    """The aligned (reference) run's kills; both modes side by side are in ``_modes``."""
    cfg = pv.config
    add("## Work preserved across a crash")
    add("")
    if pv.modes:
        add(
            "The table is the aligned mode's (the reference); both modes on the same kill "
            "times are under *Checkpoint modes side by side*."
        )
        add("")
    add(
        f"Embedded simulated Gym, {cfg.instances} instances, "
        f"{cfg.rows_in_flight} rows of {cfg.group_size} episodes kept in flight, episodes "
        f"of {cfg.turns[0]}-{cfg.turns[1]} turns ({turns_text(cfg.turn_s, pv.turn_times)}, "
        f"simulated); the trainer takes {cfg.groups_per_step} groups "
        f"per step, trains {cfg.train_s:g} s and checkpoints at every step boundary. "
        f"{pv.kills} kill times, uniform in {cfg.kill_window_s[0]:g}-"
        f"{cfg.kill_window_s[1]:g} s; each run is torn down at its kill time with no further "
        "checkpoint, then a fresh Gym and trainer restore the latest complete snapshot for "
        "real (`open_rollouts(restore=True)`)."
    )
    add("")
    add(
        "| kill at | last checkpoint | episodes at risk (running) | in-flight rollout-s | "
        "gymckpt redoes | baseline redoes | restored episodes | restore wall |"
    )
    add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in pv.per_kill:
        frac = k.gymckpt_redone_fraction
        add(
            f"| {k.kill_s:.0f} s | "
            + (
                f"{k.checkpoint_s:.0f} s ({k.since_checkpoint_s:.0f} s before)"
                if k.restored_checkpoint
                else "none yet"
            )
            + f" | {k.at_risk_episodes} ({k.in_flight_at_kill}) | "
            f"{k.in_flight_rollout_s:,.0f} | {k.gymckpt_redone_rollout_s:,.0f} "
            f"({fmt(None if frac is None else 100 * frac, ' %')}) | "
            f"{k.baseline_redone_rollout_s:,.0f} (100 %) | {k.restored_episodes} | "
            f"{fmt(k.restore_wall_s, ' s', 2)} |"
        )
    add("")
    add(
        f"Over the {pv.kills} crashes gymckpt redoes a median "
        f"{fmt(100 * (pv.gymckpt_redone_fraction_median or 0), ' %')} (max "
        f"{fmt(100 * (pv.gymckpt_redone_fraction_max or 0), ' %')}) of the in-flight "
        f"rollout-seconds, {pv.gymckpt_redone_rollout_s_total:,.0f} rollout-s in all, "
        f"against {pv.baseline_redone_rollout_s_total:,.0f} for the step-boundary baseline. "
        f"The timeline model predicted every restored episode's step boundary "
        f"({pv.boundary_mismatches} mismatches)."
    )
    pf = pv.parked_fraction_of_rollout_time
    if pf is not None:
        add("")
        add(
            f"What keeping it costs: gymckpt's checkpoints parked episodes at a step boundary "
            f"for {fmt(100 * pf, ' %')} of the time they moved (each checkpoint waits for the "
            "slowest episode's turn to end, here up to "
            f"{_longest(pv)}, while the others wait parked). The baseline's "
            "step-boundary checkpoint does not stop rollouts."
        )
    add("")
    add(
        "*In-flight rollout-seconds*: the moving time (not time parked in a checkpoint) done "
        "before the kill on every episode no training step had consumed at the restored "
        "checkpoint. gymckpt keeps a result that was in the snapshot and the turns before a "
        "restored episode's step boundary; it redoes what ran after the checkpoint. The "
        "**baseline** is what verl, OpenRLHF and TRL do today: the same checkpoint at the same "
        "training-step boundary saves the trainer and nothing of the rollouts, so every "
        "at-risk prompt is generated again from the start — 100 % by construction; it is "
        "computed from the same run's timeline, not run. In their synchronous mode nothing is "
        "in flight at a step boundary, so neither system has anything from before it to keep; "
        "the difference is for rollouts that span training steps, as here. Plot: "
        "[`preserved_work.png`](preserved_work.png)."
    )
    add("")
