"""The demo's verdict, from files alone: the training journal (the final model's lineage), the
final snapshot (every sentinel the environment holds), the final ledger (the rows that failed
for good), and each phase's result record; ``run_report`` adds what the run was.

Exactly once means: every row trained once in the lineage (no duplicates, none lost), every
step once, and every sentinel a trained episode's plan calls for present exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

import orjson

from gymckpt.runtime import SnapshotStore
from gymckpt.runtime._shared import SNAPSHOTS_DIR

from ..verdict import judge
from .envs import trajectory_verdict
from .journal import JOURNAL, read_journal
from .options import DemoOptions

__all__ = ["error_report", "run_report", "verdict"]


def verdict(opts: DemoOptions, workdir: Path, phases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Judge the run from files only (journal, final snapshot)."""
    lineage, checkpoints = read_journal(workdir / JOURNAL)
    final_path = next(
        (p["final_snapshot"] for p in reversed(phases) if p.get("final_snapshot")), None
    )
    judged = judge(
        [(s["step"], s["rows"]) for s in lineage],
        opts.rows,
        Path(final_path) if final_path is not None else None,
        seed=opts.seed,
        config=opts.sim_config(),
        group_size=opts.group_size,
        calendar=opts.env_choice is None,
    )
    stages: dict[str, list[float]] = {}
    for c in checkpoints:
        if c["ok"]:
            for k, v in c["stage_s"].items():
                stages.setdefault(k, []).append(v)
    ok = sum(1 for c in checkpoints if c["ok"])
    mid_turn = sum(int(c.get("mid_turn", 0)) for c in checkpoints if c["ok"])
    failed = len(checkpoints) - ok
    restores = sum(1 for p in phases if p.get("restored"))
    extra: dict[str, Any] = {}
    choice = opts.env_choice
    if choice is not None:
        extra = trajectory_verdict(choice, opts.seed, lineage)
    return extra | {
        "rows": opts.rows,
        "rows_trained": judged.rows_trained,
        "rows_failed": judged.rows_failed,
        "duplicates": judged.duplicates,
        "lost": len(judged.lost),
        "steps": judged.steps,
        "steps_trained_twice": judged.steps_trained_twice,
        "sentinels_total": judged.sentinels_total,
        "sentinels_expected": judged.sentinels_expected,
        "sentinels_duplicated": len(judged.sentinels_twice),
        "sentinels_missing": len(judged.sentinels_missing),
        "checkpoints_ok": ok,
        "checkpoints_failed": failed,
        "checkpoint_mode": opts.checkpoint_mode,
        "episodes_mid_turn": mid_turn,
        "restores": restores,
        "stage_ms_median": {k: round(median(v) * 1000, 3) for k, v in stages.items()},
        "exactly_once": judged.ok and extra.get("trajectories_match", True),
    }


def error_report(error: str, exit_code: int, opts: DemoOptions | None = None) -> dict[str, Any]:
    """The JSON object of a demo that stopped before it ran (bad flags or work directory)."""
    rows = opts.rows if opts is not None else 0
    return {
        "rows": rows,
        "rows_trained": 0,
        "rows_failed": 0,
        "duplicates": 0,
        "lost": 0,
        "steps": 0,
        "steps_trained_twice": 0,
        "sentinels_duplicated": 0,
        "sentinels_missing": 0,
        "checkpoints_ok": 0,
        "checkpoints_failed": 0,
        "episodes_mid_turn": 0,
        "restores": 0,
        "exactly_once": False,
        "error": error,
        "exit_code": int(exit_code),
    }


def run_report(opts: DemoOptions, workdir: Path, killed: bool, t0: float) -> dict[str, Any]:
    """The verdict over the phases' result records in ``workdir``, with what the run was
    (backend, topology, seed, snapshots left, elapsed time since ``t0``)."""
    phases = []
    for p in (1, 2):
        path = workdir / f"phase-{p}.json"
        if path.exists():
            phases.append(orjson.loads(path.read_bytes()))
    report = verdict(opts, workdir, phases)
    report.update(
        {
            "killed_with_sigkill": killed,
            "backend": opts.backend,
            "instances": opts.instances,
            "group_size": opts.group_size,
            "seed": opts.seed,
            "env": opts.env,
            "workdir": str(workdir),
            "elapsed_s": round(time.monotonic() - t0, 3),
            "snapshots": [
                str(i.path) for i in SnapshotStore(workdir / SNAPSHOTS_DIR).list_complete()
            ],
            "replacements": int(
                sum(p.get("metrics", {}).get("rollout/instances_replaced_total", 0) for p in phases)
            ),
        }
    )
    return report
