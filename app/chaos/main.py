"""``gymckpt chaos [--seeds N] [--kills K] [--json] [--timeout S] -- COMMAND...``: does a
training program train the same weights when it is SIGKILLed and restarted?

It runs COMMAND once uninterrupted (the baseline), then once per seed 1..N under K SIGKILLs
(``plan``: at random moments, soon after restarts, and at checkpoint stages when the program
arms its kill points, ``points``), each run on a fresh work directory (``{workdir}`` in COMMAND)
and restarted on it until it exits 0 (``run``). Each run's final ``weights sha256: HEX`` line,
and every other ``NAME sha256: HEX`` line the program prints (a training journal's digest),
is compared with the baseline's. Exit codes: 0 every run identical; 3 a run differs (an
invariant violation: a rollout lost, duplicated, reordered or altered changes the weights);
2 bad input (no COMMAND, no ``{workdir}`` in it, a flag, a baseline that fails); 130
interrupted (SIGINT or SIGTERM: the running program's process group is killed first).
Progress lines on stderr; the table (or ``--json``'s one object) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gymckpt.nurseries import ExitCode

from .run import WEIGHTS, WORKDIR, BadBaseline, Run, run_baseline, run_seed

__all__ = ["add_chaos_parser", "chaos", "main_chaos", "report"]


def add_chaos_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``chaos`` to the ``gymckpt`` subcommands ``sub``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "chaos",
        help="run a training program uninterrupted and under random SIGKILLs; compare weights",
        description=(
            "Runs COMMAND once uninterrupted, then once per seed under --kills random SIGKILLs "
            "(at random moments, soon after a restart, and at checkpoint stages when the "
            "program calls gymckpt.app.chaos.arm_kill_points), restarting it on the same work "
            "directory until it exits 0. '{workdir}' in COMMAND stands for a fresh directory "
            "per run. A timed kill picks its victim at random among the program and its "
            "descendants: the program itself is killed with its whole process group, a "
            "descendant (a gymckpt serve instance, a model server) alone. Compares each run's "
            "final 'weights sha256: HEX' line (required) and every other 'NAME sha256: HEX' "
            "line with the uninterrupted run's."
        ),
        epilog="exit codes: 0 every run identical, 2 bad input (no COMMAND, no {workdir}, a "
        "baseline that fails), 3 a run differs from the uninterrupted one, 130 interrupted",
    )
    parser.add_argument("--seeds", type=int, default=3, metavar="N", help="runs under kills")
    parser.add_argument("--kills", type=int, default=2, metavar="K", help="SIGKILLs per run")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds each run (its restarts included) may take; default 600",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--keep", action="store_true", help="keep the runs' directories (kept anyway on failure)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    parser.set_defaults(handler=main_chaos)
    return parser


def _problem(args: argparse.Namespace) -> str | None:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    args.command = command
    if not command:
        return "no COMMAND: gymckpt chaos [options] -- COMMAND... (with {workdir} in it)"
    if not any(WORKDIR in arg for arg in command):
        return (
            f"COMMAND has no {WORKDIR}: each run needs a fresh work directory, e.g. "
            f"gymckpt chaos -- gymckpt train cartpole {WORKDIR}"
        )
    if args.seeds < 1:
        return f"--seeds {args.seeds}: at least 1"
    if args.kills < 0:
        return f"--kills {args.kills}: 0 or more"
    if not args.timeout > 0:
        return f"--timeout {args.timeout}: more than 0 seconds"
    return None


def main_chaos(args: argparse.Namespace) -> int:
    """``gymckpt chaos`` with the parsed ``args``; its exit code."""
    problem = _problem(args)
    if problem is not None:
        return _refuse(problem, args.json)
    root = Path(tempfile.mkdtemp(prefix="gymckpt-chaos-"))
    signal.signal(signal.SIGTERM, _interrupt)  # the same clean-up as Ctrl-C
    try:
        code, out = chaos(args.command, root, args.seeds, args.kills, args.timeout)
    except BadBaseline as exc:
        print(f"gymckpt chaos: the runs are kept in {root}", file=sys.stderr)
        return _refuse(str(exc), args.json)
    except KeyboardInterrupt:  # every start's process group is killed on the way out (Start)
        print(f"gymckpt chaos: interrupted; the runs are kept in {root}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if code == ExitCode.OK and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        out["root"] = str(root)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(report(out))
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _refuse(problem: str, as_json: bool) -> int:
    """Bad input: the error on stderr (and, with ``--json``, an object saying it); exit 2."""
    print(f"gymckpt chaos: error: {problem}", file=sys.stderr)
    if as_json:
        refused = {"runs": 0, "identical": 0, "all_identical": False, "baseline_sha256": None}
        print(json.dumps({**refused, "error": problem, "exit_code": int(ExitCode.BAD_INPUT)}))
    return ExitCode.BAD_INPUT


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def chaos(
    command: Sequence[str], root: Path, seeds: int, kills: int, timeout_s: float
) -> tuple[int, dict[str, Any]]:
    """The baseline and every seed's run under ``root``; (exit code, the JSON object)."""
    env = dict(os.environ)
    _say(f"gymckpt chaos: baseline (uninterrupted): {' '.join(command)}")
    baseline = run_baseline(command, root, env, timeout_s)
    _say(f"gymckpt chaos: baseline done in {baseline.wall_s:.2f}s, {_marks(baseline)}")
    runs: list[Run] = []
    for seed in range(1, seeds + 1):
        run = run_seed(command, root, env, seed, kills, baseline, timeout_s, _say)
        runs.append(run)
        _say(
            f"gymckpt chaos: seed {seed}: {run.landed}/{kills} kills landed, "
            f"{run.restarts} restarts, {'identical' if run.identical(baseline) else 'DIFFERS'}"
            f" ({run.wall_s:.2f}s)"
        )
    identical = sum(1 for r in runs if r.identical(baseline))
    out = {
        "runs": len(runs),
        "identical": identical,
        "all_identical": identical == len(runs),
        "baseline_sha256": baseline.digests[WEIGHTS],
        "baseline": {
            "digests": baseline.digests,
            "wall_s": round(baseline.wall_s, 3),
            "stage_marks": len(baseline.marks),
            "armed_s": None if baseline.armed_s is None else round(baseline.armed_s, 3),
        },
        "command": list(command),
        "kills": kills,
        "seeds": [_run_json(r, baseline) for r in runs],
    }
    return (ExitCode.OK if identical == len(runs) else ExitCode.INVARIANT), out


def _marks(baseline: Run) -> str:
    if not baseline.marks:
        return "no checkpoint stage marks (kills are timed only)"
    return (
        f"{len(baseline.marks)} checkpoint stage marks (kills aimed at stages too), kill points "
        f"armed {baseline.armed_s or 0:.2f}s after the start"
    )


def _run_json(run: Run, baseline: Run) -> dict[str, Any]:
    return {
        "seed": run.seed,
        "kills_planned": len(run.kills_planned),
        "kills_landed": run.landed,
        "restarts": run.restarts,
        "exit_codes": run.exit_codes,
        "digests": run.digests,
        "matched": run.matched(baseline),
        "identical": run.identical(baseline),
        "error": run.error,
        "wall_s": round(run.wall_s, 3),
        "kill_log": run.kills,
    }


def report(out: dict[str, Any]) -> str:
    """The table of ``chaos``'s JSON object ``out`` and its verdict line."""
    names = sorted(out["baseline"]["digests"], key=lambda n: (n != WEIGHTS, n))
    head = ["seed", "kills", "restarts", *names, "wall_s"]
    rows = [["baseline", "-", "-", *("-" for _ in names), f"{out['baseline']['wall_s']:.2f}"]]
    for r in out["seeds"]:
        rows.append(
            [
                str(r["seed"]),
                f"{r['kills_landed']}/{r['kills_planned']}",
                str(r["restarts"]),
                *("yes" if r["matched"][n] else "NO" for n in names),
                f"{r['wall_s']:.2f}",
            ]
        )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *rows]
    ]
    for r in out["seeds"]:
        if r["error"]:
            lines.append(f"seed {r['seed']}: {r['error']}")
    digest = out["baseline_sha256"][:16]
    if out["all_identical"]:
        lines.append(
            f"verdict: identical: all {out['runs']} runs ended with the uninterrupted run's "
            f"{', '.join(names)} (weights sha256 {digest}…)"
        )
    else:
        differ = [str(r["seed"]) for r in out["seeds"] if not r["identical"]]
        lines.append(
            f"verdict: DIFFERENT: {out['identical']}/{out['runs']} runs identical to the "
            f"uninterrupted run (weights sha256 {digest}…); seeds {', '.join(differ)} differ"
            + (f"; runs kept in {out['root']}" if "root" in out else "")
        )
    return "\n".join(lines)
