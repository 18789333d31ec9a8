"""``SUMMARY.md``: where the results come from (command, commit, machine), the targets table,
the misses, then one section per benchmark."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from gymckpt.runtime.lowlevel import write_atomic

from ._checkpoint import (
    checkpoint_keys,
    checkpoint_ray_section,
    checkpoint_section,
    trainer_side_section,
)
from ._drain import drain_method_section, drain_section
from ._fanout import fanout_section
from ._format import Add
from ._misses import miss_lines
from ._modes import mode_miss_lines, modes_section
from ._per_step import host_miss_lines, host_section
from ._preserved import preserved_section
from ._results import Results
from ._runtime_tables import dispatch_section, memory_section
from ._scale_misses import scale_miss_lines
from ._targets import Status, TargetRow, targets

__all__ = ["NOT_MEASURED", "results_targets", "write_summary"]

NOT_MEASURED = (
    "The Gym host on Gymnasium CartPole (`gymckpt bench host`) is run separately, not by "
    "`all`, and there is no `host.json` here: save `gymckpt bench host --json` as "
    "`host.json` beside these results, then `gymckpt bench report`."
)
"""The *Not measured here* section, printed only when the results have no ``host.json``."""


def write_summary(path: Path, results: Results, plots: list[Path]) -> None:
    """Write SUMMARY.md for ``results`` to ``path`` (atomically); ``plots`` are the files the
    drain section links to."""
    r = results
    lines: list[str] = []
    add = lines.append
    _provenance(add, r.meta)
    _other_runs(add, r.others)
    rows = results_targets(r)
    _targets_table(add, rows)
    checkpoint_keys(add, r.checkpoint, r.checkpoint_ray)
    add("## Where a target is missed, and what it would take")
    add("")
    misses = miss_lines(
        rows,
        r.drain,
        r.drain.headline(),
        r.drain.by_pending(),
        r.checkpoint,
        r.fanout,
        r.checkpoint_ray,
    )
    missed = {t.key for t in rows if t.status is Status.MISSED}
    misses += mode_miss_lines(missed, r.checkpoint, r.preserved)
    misses += host_miss_lines(missed, r.host)
    measured = {t.key: t.measured for t in rows}
    misses += scale_miss_lines(
        missed, measured, r.checkpoint, r.checkpoint_ray, r.dispatch, r.host, r.trainer_side
    )
    for text in misses:
        add(text)
    if not misses:
        add("- Nothing measured is missed.")
    add("")
    modes_section(add, r.checkpoint, r.checkpoint_ray, r.preserved)
    if r.fanout is not None:
        fanout_section(add, r.fanout)
    if r.preserved is not None:
        preserved_section(add, r.preserved)
    if r.checkpoint is not None:
        checkpoint_section(add, r.checkpoint)
    if r.trainer_side is not None:
        trainer_side_section(add, r.trainer_side)
    if r.checkpoint_ray is not None:
        checkpoint_ray_section(add, r.checkpoint_ray)
        if r.checkpoint_ray.http is not None:
            checkpoint_ray_section(add, r.checkpoint_ray.http)
    drain_section(add, r.drain, plots)
    memory_section(add, r.memory)
    dispatch_section(add, r.dispatch)
    if r.host is not None:
        host_section(add, r.host)
    else:
        add("## Not measured here")
        add("")
        add(NOT_MEASURED)
        add("")
    drain_method_section(add, r.drain)
    add(
        "Reproduce: `" + r.meta["command"] + "` (a few minutes); `--quick` for a smoke run; "
        "`gymckpt bench drain --rollouts 200000 --json` for the drain alone."
    )
    add("")
    write_atomic(path, "\n".join(lines).encode())


def results_targets(results: Results) -> list[TargetRow]:
    """The project's targets and their verdicts on ``results`` (``host.json``'s marks
    included when present): what SUMMARY.md's table and ``all``'s JSON both show."""
    r = results
    return targets(
        r.drain,
        r.memory,
        r.checkpoint,
        r.fanout,
        r.preserved,
        r.checkpoint_ray,
        host_marks=None if r.host is None else r.host.marks,
        sandbox=r.sandbox,
        dispatch=r.dispatch,
        host=r.host,
        trainer_side=r.trainer_side,
    )


def _provenance(add: Add, meta: dict[str, Any]) -> None:
    """The title, the command, the commit (and whether the tree was clean) and the machine."""
    m = meta["machine"]
    add("# gymckpt benchmarks — summary")
    add("")
    src = meta.get("source") or {}
    changes = src.get("uncommitted_changes")
    commit = src.get("commit_full") or src.get("commit")
    if changes:
        add(
            f"> **NOT FROM A CLEAN TREE.** Commit `{commit}` plus uncommitted changes in "
            + ", ".join(f"`{c}`" for c in changes[:20])
            + (", …" if len(changes) > 20 else "")
            + ": these figures describe no commit. Regenerate from a clean checkout."
        )
        add("")
    add(f"Produced by `{meta['command']}` on {m['date_utc']}.")
    add("")
    if changes is None:
        add("Code measured: unknown (not a git checkout).")
    elif not changes:
        add(f"Code measured: commit `{commit}`, clean tree (no uncommitted changes).")
    else:
        add(f"Code measured: commit `{commit}` **with uncommitted changes** (see above).")
    add("")
    add(
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB RAM, "
        f"{m['implementation']} {m['python']}, trio {m['trio']}, {m['platform']}. "
        "The machine is shared with other work and noisy, so every figure is a **median** "
        "(p99 where stated) over many trials; nothing here is a best case."
    )
    add("")


def _other_runs(add: Add, others: dict[str, dict[str, Any]]) -> None:
    """Say which result files another run wrote (a benchmark run on its own since)."""
    if not others:
        return
    add("Results from other runs, since (the rest is from the run above):")
    add("")
    for name, m in sorted(others.items()):
        src = m.get("source") or {}
        dirty = src.get("uncommitted_changes")
        add(
            f"- `{name}`: `{m.get('command')}` on {(m.get('machine') or {}).get('date_utc')}, "
            f"commit `{src.get('commit_full') or src.get('commit')}`"
            + (" with uncommitted changes" if dirty else ", clean tree" if dirty == [] else "")
            + "."
        )
    add("")


def _targets_table(add: Add, rows: list[TargetRow]) -> None:
    add("## Targets")
    add("")
    add("| figure | target | measured | |")
    add("| --- | --- | --- | --- |")
    for t in rows:
        add(f"| {t.figure} | {t.target} | {t.measured} | {t.status.cell()} |")
    add("")
    count = collections.Counter(t.status for t in rows)
    reported = count[Status.REPORTED]
    add(
        f"{count[Status.MET]} of {len(rows)} met; {count[Status.MISSED]} missed; "
        + (f"{reported} reported (no threshold); " if reported else "")
        + f"{count[Status.NOT_MEASURED]} not measured at the target's size or not run."
    )
    add("")
