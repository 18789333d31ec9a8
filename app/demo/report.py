"""The demo's report as a person reads it (``print_report``); ``--json`` prints the same
record as one JSON object instead."""

from __future__ import annotations

from typing import Any

__all__ = ["print_report"]


def print_report(r: dict[str, Any]) -> None:
    lines = [
        "gymckpt demo",
        f"  backend {r['backend']}, {r['instances']} instances, group size {r['group_size']},"
        f" seed {r['seed']}",
        f"  rows trained        {r['rows_trained']}/{r['rows']} (failed {r['rows_failed']},"
        f" lost {r['lost']}, duplicates {r['duplicates']})",
        f"  steps               {r['steps']} (trained twice: {r['steps_trained_twice']})",
        f"  sentinels           {r['sentinels_total']}/{r['sentinels_expected']}"
        f" (duplicated {r['sentinels_duplicated']}, missing {r['sentinels_missing']})",
        f"  checkpoints         {r['checkpoints_ok']} ok, {r['checkpoints_failed']} failed"
        f" ({r['checkpoint_mode']}; episodes taken mid-turn: {r['episodes_mid_turn']})",
        f"  restores            {r['restores']}"
        f" (SIGKILL: {'yes' if r['killed_with_sigkill'] else 'no'})",
        "  stage medians (ms)  " + ", ".join(f"{k} {v:g}" for k, v in r["stage_ms_median"].items()),
        f"  elapsed             {r['elapsed_s']:.1f}s, workdir {r['workdir']}"
        f"{'' if r.get('workdir_kept', True) else ' (removed; --keep keeps it)'}",
        *(
            [
                f"  trajectories        {r['episodes']} episodes of {r['env']}, identical to an "
                f"uninterrupted run: {'YES' if r['trajectories_match'] else 'NO'}"
            ]
            if "trajectories_match" in r
            else []
        ),
        f"  exactly once        {'YES' if r['exactly_once'] else 'NO'}",
    ]
    print("\n".join(lines))
