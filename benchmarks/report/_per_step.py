"""The report's section on the Gym host's cost a step on Gymnasium CartPole (``host.json``,
written by ``gymckpt bench host --json`` on its own): the host's per-step cost against plain
Gymnasium, the unaligned mode's boundary marks on and opted out (CartPole and the calendar),
and episodes per second through the whole loop."""

from __future__ import annotations

from typing import Any

from ._format import TIMES, Add, fmt, pct
from ._records import HostMarksFigures, HostResult

__all__ = ["host_miss_lines", "host_section"]


def host_section(add: Add, host: HostResult) -> None:
    """The section; ``host.json`` without ``marks`` (written before they were measured)
    says the marks were not measured."""
    m = host.meta or {}
    src = m.get("source") or {}
    add("## The Gym host on Gymnasium CartPole")
    add("")
    add(
        f"From `{m.get('command')}` on {(m.get('machine') or {}).get('date_utc')}, commit "
        f"`{src.get('commit_full') or src.get('commit')}`"
        + (" with uncommitted changes" if src.get("uncommitted_changes") else "")
        + " (run on its own, not by `all`)."
    )
    add("")
    ps = host.per_step
    add(
        f"Per step, {ps.env}, {ps.episodes} episodes ({ps.steps_per_trial:,} steps a trial), "
        f"medians over the trials: plain Gymnasium {fmt(ps.plain_us_per_step_median, ' µs')}, "
        f"hosted {fmt(ps.host_us_per_step_median, ' µs')} (+"
        f"{fmt(ps.host_overhead_us_per_step, ' µs')}, "
        f"{fmt(ps.host_over_plain_ratio, TIMES, 2)} plain)."
    )
    add("")
    mk = host.marks
    if mk is None:
        add(
            "The unaligned mode's boundary marks: not measured (this `host.json` predates "
            "them; run `gymckpt bench host --json` again)."
        )
        add("")
    else:
        add(
            "The unaligned mode's boundary marks, on against opted out "
            "(`Environment(unaligned=False)`), interleaved in each trial; µs per step (CPU "
            "beside), medians over the trials; the overhead is the median of the per-trial "
            "ratios to a step opted out (target ≤ 10 % on CartPole, the larger of wall and CPU):"
        )
        add("")
        add("| environment | marks on | opted out | overhead |")
        add("| --- | ---: | ---: | ---: |")
        _marks_row(add, f"CartPole, {mk.cartpole.episodes} episodes", mk.cartpole)
        _marks_row(
            add,
            f"calendar, {mk.calendar.episodes} episodes of {mk.calendar.turns} turns",
            mk.calendar,
        )
        add("")
    lp = host.loop
    ray = (
        "Ray not run (`--no-ray`)"
        if lp.ray_2_actors_episodes_per_s is None
        else f"Ray with 2 actors {fmt(lp.ray_2_actors_episodes_per_s, '')}"
    )
    add(
        f"Whole loop, {lp.rows} rows of {lp.group_size} episodes, episodes per second: "
        f"embedded with 2 instances {fmt(lp.embedded_2_instances_episodes_per_s, '')}, {ray}"
        + _loop_from(lp.meta)
        + "."
    )
    add("")


def host_miss_lines(missed: set[str], host: HostResult | None) -> list[str]:
    """The paragraph on the marks' target when it is missed (``missed``: the missed rows'
    keys): what the marks add to a step, and what a tenth of a step leaves them."""
    if "host_marks_overhead" not in missed or host is None or host.marks is None:
        return []
    cp, cal = host.marks.cartpole, host.marks.calendar
    return [
        f"- **The unaligned mode's per-step cost on CartPole {pct(cp.marks_overhead_ratio)} "
        f"wall, {pct(cp.marks_overhead_cpu_ratio)} CPU > 10 %.** Its boundary marks (at "
        "every step boundary one `export` per participant and one `orjson.dumps`) add "
        f"{fmt(cp.marks_overhead_us_per_step, ' µs')} "
        f"({fmt(cp.marks_overhead_cpu_us_per_step, ' µs')} CPU) to a "
        f"{fmt(cp.opted_out_us_per_step_median, ' µs', 0)} "
        f"({fmt(cp.opted_out_cpu_us_per_step_median, ' µs', 0)} CPU) step opted out; on the "
        f"calendar {fmt(cal.marks_overhead_us_per_step, ' µs')} "
        f"({fmt(cal.marks_overhead_cpu_us_per_step, ' µs')} CPU, "
        f"{pct(cal.marks_overhead_ratio)}). Plain Gymnasium took "
        f"{fmt(host.per_step.plain_us_per_step_median, ' µs')} a step in this run: the "
        "machine's load is in every figure, the ratio compares runs interleaved in the same "
        "trials. *What it would take:* marks at most a tenth of a step, "
        f"{fmt(cp.opted_out_us_per_step_median / 10, ' µs', 0)} wall and "
        f"{fmt(cp.opted_out_cpu_us_per_step_median / 10, ' µs', 0)} CPU here: an export and a "
        "serialisation per boundary that much cheaper on CartPole's agent."
    ]


def _marks_row(add: Add, name: str, f: HostMarksFigures) -> None:
    add(
        f"| {name} | {fmt(f.marks_us_per_step_median, ' µs')} "
        f"({fmt(f.marks_cpu_us_per_step_median, ' µs')} CPU) | "
        f"{fmt(f.opted_out_us_per_step_median, ' µs')} "
        f"({fmt(f.opted_out_cpu_us_per_step_median, ' µs')} CPU) | "
        f"{pct(f.marks_overhead_ratio)} ({pct(f.marks_overhead_cpu_ratio)} CPU) |"
    )


def _loop_from(meta: dict[str, Any] | None) -> str:
    """Where the loop's figures come from when another run measured them."""
    if meta is None:
        return ""
    src = meta.get("source") or {}
    return (
        f" (from an earlier run, `{meta.get('command')}` on "
        f"{(meta.get('machine') or {}).get('date_utc')}, commit "
        f"`{src.get('commit_full') or src.get('commit')}`"
        + (" with uncommitted changes" if src.get("uncommitted_changes") else "")
        + ")"
    )
