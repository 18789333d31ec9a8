"""``gymckpt bench ...`` (or ``python -m gymckpt.benchmarks ...``): reproduce the benchmark figures.

The project CLI calls ``main(argv_after_bench)``. Results go to stdout (one JSON object with
``--json``, a short table otherwise); progress lines go to stderr when it is a terminal.
Exit codes: 0 success, 2 bad flag.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from gymckpt.gym_adapter._shared import check_instance_niceness
from gymckpt.nurseries import ExitCode

from . import checkpoint as _checkpoint_mod
from . import checkpoint_ray as _checkpoint_ray_mod
from . import dispatch as _dispatch_mod
from . import drain as _drain_mod
from . import fanout as _fanout_mod
from . import host as _host_mod
from . import memory as _memory_mod
from . import preserved as _preserved_mod
from . import sandbox as _sandbox_mod
from . import trainer_side as _trainer_side_mod
from ._common import Progress, finite, ints, machine_info, source_info

__all__ = ["build_parser", "main"]

DEFAULT_OUT = Path("benchmark-results")
"""Where ``all`` and ``report`` write when not told (``--out``): in the current directory, never
inside the installed package."""

COMMITTED_RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results"
"""The results the documentation quotes, in a source checkout (absent from an installed wheel):
written there only from a clean tree."""

_DESCRIPTION = """\
Benchmarks for gymckpt's checkpoint runtime: the drain and the figures it must reach. Every
figure is measured on this machine; the machine is shared, so medians (and p99) are quoted,
never means or best cases.

  drain     checkpoint drain with N rollouts in flight and P pending replies on the wire:
            wake latency (last pending reply's mutation -> wait_drained returning), CPU cost
            per wakeup of the drain's predicate, loop stall; and the same for a polling drain
            (full inventory every 50 ms) in the same run, swept over in-flight sizes
  memory    ledger bytes per attempt at 200k and 1M attempts (tracemalloc and RSS, fresh
            subprocesses, realistic mix of states)
  dispatch  rows/s through DispatchGate.admit + ledger.mark_dispatched + completion mutation,
            batches of 1, 64, 512, with 200k already in flight (no Gym: no-op submit); with
            --loop also through the whole loop (open_rollouts) on a null and the embedded Gym
  checkpoint  whole checkpoints per mode (unaligned, aligned_timeout, aligned; --modes,
            --checkpoints) at 200k in flight on the embedded Gym, heavy-tailed turns: the
            share that completes, episodes taken mid-turn, until every episode moves again,
            CPU beside wall, per-episode pause, per-stage wall time, loop stall and scheduler
            batches, snapshot size on disk; and rows/s on the embedded Gym;
            --backend ray: the same on Ray with --actors actors (default 4), real time;
            --backend http: on --actors gymckpt serve processes; both: Ray, then HTTP;
            --backend null: the trainer side alone at 1M against a Gym that answers at once
  host      the Gym host on Gymnasium CartPole: per-step overhead against plain Gymnasium
            stepping (same policy, same run), and episodes/s embedded vs Ray with 2 actors
  fanout    control fan-out on Ray and over HTTP (gymckpt serve processes) in the same run,
            1 to 16 instances: prepare/commit/resume per checkpoint, the slowest instance, a
            linear model for 64 and more; rows/s through the whole loop with 2 instances on
            each; HTTP as a ratio of Ray (--backend ray|http|both, default both)
  preserved work preserved across a crash: the fraction of in-flight rollout-seconds redone
            after a real restore, gymckpt (both modes) against a step-boundary baseline, over
            the same 10 kill times; the parked-time fraction each mode costs
  sandbox   bytes written per checkpoint with 1,000 sandboxes of a ~20 MB template, full
            (every tree written whole, computed) against incremental (measured on disk), 1 %
            of the files changed between two checkpoints; the mark's cost against the size of
            the change; restore time per sandbox (embedded GymHost)
  all       everything (full sweep), then *.json, PNG plots, SUMMARY.md into --out
  issue34   exactly what the targets at scale need (trainer side at 1M, dispatch --loop,
            host, checkpoint embedded and on Ray and HTTP at 200k), in one run, with the
            verdicts in ISSUE34.md (under 10 min on a quiet machine; --quick for a smoke run)
  report    re-render the plots and SUMMARY.md from the JSON results (no measuring)
"""

_DRAIN_HELP = """\
Measures the drain of a rollout checkpoint. A RecoveryLedger holds N attempts DISPATCHED;
P of them are "on the wire". runtime.wait_drained parks on the ledger's MutationBarrier under
those P rollout IDs while another task delivers the P replies (each an `await barrier.mutate(...
ledger.complete ...)`) interleaved with unrelated completions and new dispatches, so the barrier
is as busy as in a real run.

  wake latency     perf_counter_ns at the end of the last pending reply's mutation function ->
                   right after wait_drained returns (median, p99 over --trials)
  per wakeup       CPU time of one evaluation of the drain's predicate (timed directly around the
                   real predicate, wrapper cost subtracted); cross-checked by an A/B of a pending
                   reply's mutation with and without the drain parked
  loop stall       longest trio task step during the trials (a trio Instrument)
  baseline         the reference design's polling drain (rebuild the full inventory every 50 ms)
                   in the same run: wake latency, cost per poll, loop stall
  trio floor       Event.set() -> waiter running, in the same trio.run

The sweep shows per-wakeup cost flat in N for the event-driven drain and linear for polling.
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small smoke configuration (seconds, small N); CI runs this",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on stderr (default: only when stderr is a terminal)",
    )


def _drain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rollouts",
        type=int,
        default=None,
        help="in-flight attempts for the headline figures (default 200000; quick 10000)",
    )
    p.add_argument(
        "--pending",
        type=int,
        default=None,
        help="episodes whose reply is on the wire (default 300; quick 100)",
    )
    p.add_argument(
        "--sweep",
        type=ints,
        default=None,
        help="in-flight sizes, comma-separated, k/M suffixes "
        "(default 2k,20k,200k; quick 2k,10k); --rollouts is always included",
    )
    p.add_argument("--million", action="store_true", help="add 1M in flight to the sweep")
    p.add_argument(
        "--trials", type=int, default=None, help="event-driven trials per size (default 200)"
    )
    p.add_argument(
        "--baseline-trials",
        type=int,
        default=None,
        help="polling trials per size (default 20; fewer above 200k)",
    )
    p.add_argument(
        "--interleave",
        type=int,
        default=None,
        help="unrelated completions before each pending reply (default 3)",
    )
    p.add_argument(
        "--poll-period-ms",
        type=float,
        default=None,
        help="polling baseline period (default 50, as the reference design)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after building each ledger and gc.collect()+gc.freeze() "
        "between trials (the remedy for collector pauses; default: off)",
    )


def _memory_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=ints,
        default=None,
        help="ledger sizes in attempts (default 200k,1M; quick 20k)",
    )


def _dispatch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--in-flight",
        type=ints,
        default=None,
        help="attempts already in flight (default 200k; 200k,1M with --million)",
    )
    p.add_argument("--batch-sizes", type=ints, default=None, help="default 1,64,512")
    p.add_argument(
        "--rows",
        type=int,
        default=None,
        help="attempts pushed per configuration (default 65536; quick 2048)",
    )
    p.add_argument(
        "--loop",
        action="store_true",
        help="also rows/s through the whole loop (open_rollouts) on a null Gym and "
        "on the embedded Gym (one-step episodes)",
    )
    p.add_argument(
        "--loop-attempts",
        type=int,
        default=None,
        help="attempts per whole-loop run (default 65536; quick 2048)",
    )
    p.add_argument(
        "--loop-runs",
        type=int,
        default=None,
        help="whole-loop runs per Gym, medians reported (default 3; quick 1)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gymckpt bench",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    _add_runtime_benchmarks(sub)
    _add_checkpoint(sub)
    _add_gym_benchmarks(sub)
    _add_sandbox(sub)
    _add_all_and_report(sub)
    _add_issue34(sub)
    return parser


def _add_issue34(sub: Any) -> None:
    """``issue34``: the targets at scale, one command."""
    from .report import STEPS

    total = sum(m for _n, _w, m in STEPS)
    steps = "\n".join(
        f"  {k}. {what} (~{minutes} min) -> {name}.json"
        for k, (name, what, minutes) in enumerate(STEPS, 1)
    )
    i = sub.add_parser(
        "issue34",
        help="the targets at scale: every figure issue 34 asks for, one run (under 10 min)",
        description=textwrap.fill(
            "Runs, in this order, every measurement the targets at scale need, at the issue's "
            f"sizes (200k in flight; 1M for the trainer side), about {total} min in all on a "
            "quiet 2-core machine:"
        )
        + f"\n\n{steps}\n\n"
        + textwrap.fill(
            "then writes each result into --out, the verdicts (met, MISSED, not measured, with "
            "what a miss would take) into ISSUE34.md and issue34.json, and re-renders "
            "SUMMARY.md when --out also holds a `bench all` run (drain.json, memory.json). A "
            "step that fails is reported and the run goes on. Progress lines name each step "
            "with the time left. --quick: the same steps at small sizes (a few minutes)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default ./{DEFAULT_OUT}; quick: ./{DEFAULT_OUT}/quick)",
    )
    i.add_argument(
        "--no-ray",
        action="store_true",
        help="skip the checkpoint on Ray and over HTTP and the host's Ray run",
    )
    i.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into the committed results although the tree has uncommitted changes",
    )
    _common(i)


def _add_runtime_benchmarks(sub: Any) -> None:
    """``drain``, ``memory``, ``dispatch``: the runtime alone."""
    raw = argparse.RawDescriptionHelpFormatter
    d = sub.add_parser(
        "drain",
        help="drain wake latency and per-wakeup cost vs polling",
        description=_DRAIN_HELP,
        formatter_class=raw,
    )
    _drain_args(d)
    _common(d)
    m = sub.add_parser(
        "memory",
        help="ledger memory per attempt at 200k and 1M",
        description=_memory_mod.__doc__,
        formatter_class=raw,
    )
    _memory_args(m)
    _common(m)
    dp = sub.add_parser(
        "dispatch",
        help="rows/s through gate + ledger (no Gym)",
        description=_dispatch_mod.__doc__,
        formatter_class=raw,
    )
    _dispatch_args(dp)
    dp.add_argument("--million", action="store_true", help="also measure with 1M in flight")
    _common(dp)


def _add_checkpoint(sub: Any) -> None:
    """``checkpoint``: one whole checkpoint, embedded, on Ray or over HTTP."""
    raw = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser(
        "checkpoint",
        help="whole checkpoint at 200k on the embedded Gym or on Ray, by stage",
        description=f"{_checkpoint_mod.__doc__}\n--backend ray\n------------\n"
        f"{_checkpoint_ray_mod.__doc__}\n--backend null\n-------------\n"
        f"{_trainer_side_mod.__doc__}",
        formatter_class=raw,
    )
    c.add_argument(
        "--rollouts",
        "--in-flight",
        dest="in_flight",
        type=int,
        default=None,
        help="episodes in flight (default 200000, 1000000 with --backend null; quick 2000, "
        "20000 with --backend null)",
    )
    c.add_argument(
        "--backend",
        choices=("embedded", "ray", "http", "both", "null"),
        default="embedded",
        help="the Gym deployment: embedded (in this process, warp clock), ray "
        "(--actors Ray actors on a local cluster, real time), http (--actors spawned "
        "gymckpt serve processes, real time), or both: Ray then HTTP in the same run, "
        "HTTP's figures as ratios of Ray's; null: the trainer side alone, one checkpoint "
        "against a Gym that answers at once (--instances instances; default 1M in flight, "
        "quick 20k)",
    )
    c.add_argument("--instances", type=int, default=None, help="embedded Gym instances (default 4)")
    c.add_argument(
        "--actors",
        type=int,
        default=None,
        help="Ray actors or HTTP servers with --backend ray, http or both (default 4)",
    )
    c.add_argument(
        "--instance-niceness",
        dest="instance_niceness",
        type=int,
        default=None,
        help="with --backend ray, http or both: how many steps below the trainer the instance "
        "processes run (default: RayGym.host's and HttpGym.spawn's)",
    )
    c.add_argument(
        "--turn-mean",
        dest="turn_mean_s",
        type=float,
        default=None,
        help="mean turn length in seconds (lognormal, sigma 2, capped at 21x the median; "
        "default: what the Gym keeps up with, max(20, N / 200) embedded and "
        "max(20, N / 2,500) on Ray; quick on Ray 2)",
    )
    c.add_argument(
        "--checkpoints",
        dest="repeats",
        type=int,
        default=None,
        help="checkpoints per mode on the embedded Gym, for the share that completes "
        "(default 3; quick 2)",
    )
    _modes_arg(c, checkpoint=True)
    _common(c)


def _add_gym_benchmarks(sub: Any) -> None:
    """``host``, ``fanout``, ``preserved``: the Gym side, the fan-out, a crash."""
    raw = argparse.RawDescriptionHelpFormatter
    h = sub.add_parser(
        "host",
        help="Gym host per-step overhead vs plain Gymnasium; episodes/s",
        description=_host_mod.__doc__,
        formatter_class=raw,
    )
    h.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per trial of the per-step comparison (default 256)",
    )
    h.add_argument("--no-ray", action="store_true", help="skip the Ray throughput run")
    _common(h)
    f = sub.add_parser(
        "fanout",
        help="control fan-out on Ray from 1 to 16 actors, with a model",
        description=_fanout_mod.__doc__,
        formatter_class=raw,
    )
    f.add_argument(
        "--actors", type=ints, default=None, help="actor counts (default 1,2,4,8,16; quick 1,2)"
    )
    f.add_argument(
        "--checkpoints",
        type=int,
        default=None,
        help="measured checkpoints per size (default 5; quick 2), after one warm-up",
    )
    f.add_argument(
        "--backend",
        choices=("ray", "http", "both"),
        default="both",
        help="Ray actors, spawned gymckpt serve processes, or both in the same run, "
        "alternating per size (default both)",
    )
    f.add_argument(
        "--dispatch-runs",
        type=int,
        default=None,
        help="whole-loop dispatch runs per backend, medians reported (default 3; quick 1; "
        "0: no dispatch)",
    )
    _common(f)
    pv = sub.add_parser(
        "preserved",
        help="work preserved across a crash vs a step-boundary baseline",
        description=_preserved_mod.__doc__,
        formatter_class=raw,
    )
    pv.add_argument("--kills", type=int, default=None, help="kill times (default 10)")
    _modes_arg(pv)
    _common(pv)


def _add_sandbox(sub: Any) -> None:
    """``sandbox``: bytes per checkpoint of many sandboxes; the mark; the restore."""
    raw = argparse.RawDescriptionHelpFormatter
    sb = sub.add_parser(
        "sandbox",
        help="bytes per checkpoint with 1,000 sandboxes, full vs incremental; mark and restore",
        description=_sandbox_mod.__doc__,
        formatter_class=raw,
    )
    sb.add_argument(
        "--sessions", type=int, default=None, help="sandbox sessions (default 1000; quick 8)"
    )
    sb.add_argument(
        "--template-mb",
        type=float,
        default=None,
        help="the template's size in MiB (default 20; quick 1)",
    )
    sb.add_argument(
        "--template-files",
        type=int,
        default=None,
        help="the template's files (default 1000; quick 100)",
    )
    sb.add_argument(
        "--restores", type=int, default=None, help="sandboxes restored and timed (default 10)"
    )
    sb.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the trees and snapshots go while it runs (default: the temp directory; "
        "the full run needs sessions x template of free space)",
    )
    _common(sb)


def _add_all_and_report(sub: Any) -> None:
    """``all`` (every benchmark, then the report) and ``report`` (the report again)."""
    a = sub.add_parser(
        "all",
        help="everything; writes --out (JSON, PNG plots, SUMMARY.md)",
        description=(
            "Runs drain (full sweep), memory, dispatch (with the whole loop), checkpoint "
            "(embedded, then on Ray with 4 actors and over HTTP with 4 gymckpt serve processes "
            "at the same N), the trainer side alone (with the 1M sizes), fanout (Ray and HTTP "
            "in the same run), preserved and sandbox, "
            "then writes their JSON, the plots and SUMMARY.md (the project's targets, each met or "
            "MISSED, the commit measured and whether its tree was clean) into --out. Into the "
            "committed results (docs/benchmarks/results in a checkout) it refuses to run from a "
            "tree with uncommitted changes."
        ),
    )
    a.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default ./{DEFAULT_OUT}; quick: ./{DEFAULT_OUT}/quick)",
    )
    a.add_argument(
        "--no-ray",
        action="store_true",
        help="skip the remote parts (fan-out and rows/s on Ray and over HTTP, the checkpoint on "
        "Ray and over HTTP): reported as not run",
    )
    a.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into the committed results although the tree has uncommitted "
        "changes (SUMMARY.md says so at the top)",
    )
    rr = sub.add_parser(
        "report",
        help="re-render the plots and SUMMARY.md from the JSON results in --out",
        description="Rewrites the PNG plots and SUMMARY.md from drain.json, memory.json, "
        "dispatch.json and checkpoint.json in --out, without measuring anything.",
    )
    rr.add_argument("--out", type=Path, default=None, help=f"default ./{DEFAULT_OUT}")
    _common(rr)
    a.add_argument(
        "--million",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="include 1M in flight (default: yes when 6 GiB are free; no with --quick)",
    )
    _common(a)


def _modes(text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in known]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct modes among {', '.join(known)} separated by commas, got {text!r}"
        )
    return names


def _checkpoint_modes(text: str) -> tuple[str, ...]:
    """``--modes`` of ``checkpoint``: the checkpoint modes and ``aligned_timeout``."""
    return _modes(text, _checkpoint_mod.BENCH_MODES)


def _runtime_modes(text: str) -> tuple[str, ...]:
    """``--modes`` of ``preserved``: the runtime's checkpoint modes."""
    from gymckpt.runtime import CheckpointMode

    return _modes(text, tuple(m.value for m in CheckpointMode))


def _modes_arg(p: argparse.ArgumentParser, checkpoint: bool = False) -> None:
    p.add_argument(
        "--modes",
        type=_checkpoint_modes if checkpoint else _runtime_modes,
        default=None,
        help="checkpoint modes measured side by side in one run, in this order (default "
        + (
            "unaligned,aligned_timeout,aligned embedded, unaligned,aligned on Ray and over "
            "HTTP; aligned_timeout: the default configuration's control and alignment timeouts)"
            if checkpoint
            else "unaligned,aligned)"
        ),
    )


# -- configurations from flags ---------------------------------------------------------------------


def _drain_config(args: argparse.Namespace) -> _drain_mod.DrainConfig:
    """The drain configuration the flags ask for; ``ValueError`` if it cannot run."""
    base = _drain_mod.DrainConfig.quick_defaults() if args.quick else _drain_mod.DrainConfig()
    changes: dict[str, Any] = {}
    for name in ("rollouts", "pending", "trials", "baseline_trials", "interleave", "seed"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    sweep = tuple(args.sweep) if getattr(args, "sweep", None) is not None else base.sweep
    if args.bench == "drain" and args.million:
        sweep = (*sweep, 1_000_000)
    changes["sweep"] = sweep
    if getattr(args, "gc_freeze", False):
        changes["gc_freeze"] = True
    if getattr(args, "poll_period_ms", None) is not None:
        changes["poll_period_s"] = args.poll_period_ms / 1e3
    return attrs.evolve(base, **changes)


def _memory_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    if getattr(args, "sizes", None) is not None:
        return tuple(args.sizes)
    return (20_000,) if args.quick else (200_000, 1_000_000)


def _dispatch_config(args: argparse.Namespace) -> _dispatch_mod.DispatchConfig:
    cfg = (
        _dispatch_mod.DispatchConfig.quick_defaults()
        if args.quick
        else _dispatch_mod.DispatchConfig()
    )
    if args.bench == "dispatch" and args.in_flight is not None:
        cfg.in_flight = tuple(args.in_flight)
    elif args.bench == "dispatch" and args.million:
        cfg.in_flight = (*cfg.in_flight, 1_000_000)
    if getattr(args, "batch_sizes", None) is not None:
        cfg.batch_sizes = tuple(args.batch_sizes)
    if getattr(args, "rows", None) is not None:
        cfg.rows = args.rows
    cfg.loop = bool(getattr(args, "loop", False))
    if getattr(args, "loop_attempts", None) is not None:
        if args.loop_attempts < 8:
            raise ValueError(f"--loop-attempts must be >= 8, got {args.loop_attempts}")
        cfg.loop_attempts = args.loop_attempts
    if getattr(args, "loop_runs", None) is not None:
        if args.loop_runs < 1:
            raise ValueError(f"--loop-runs must be >= 1, got {args.loop_runs}")
        cfg.loop_runs = args.loop_runs
    return cfg


def _checkpoint_config(args: argparse.Namespace) -> _checkpoint_mod.CheckpointConfig:
    cfg = (
        _checkpoint_mod.CheckpointConfig.quick_defaults()
        if args.quick
        else _checkpoint_mod.CheckpointConfig()
    )
    if args.bench == "checkpoint":
        if args.in_flight is not None:
            cfg.in_flight = args.in_flight
        if args.instances is not None:
            cfg.instances = args.instances
        if args.modes is not None:
            cfg.modes = args.modes
        if args.turn_mean_s is not None:
            cfg.turn_mean_s = args.turn_mean_s
        if args.repeats is not None:
            cfg.repeats = args.repeats
    if cfg.repeats < 1:
        raise ValueError(f"--checkpoints must be >= 1, got {cfg.repeats}")
    if cfg.in_flight < cfg.group_size or cfg.instances < 1:
        raise ValueError("--in-flight must be >= the group size and --instances >= 1")
    return cfg


def _checkpoint_ray_config(args: argparse.Namespace) -> _checkpoint_ray_mod.CheckpointRayConfig:
    """The Ray checkpoint's configuration: the embedded one's size (``bench all`` runs both at
    the same N), ``--actors`` actors."""
    cfg = (
        _checkpoint_ray_mod.CheckpointRayConfig.quick_defaults()
        if args.quick
        else _checkpoint_ray_mod.CheckpointRayConfig()
    )
    if args.bench == "checkpoint":
        if args.in_flight is not None:
            cfg.in_flight = args.in_flight
        if args.actors is not None:
            cfg.actors = args.actors
        if args.modes is not None:
            cfg.modes = args.modes
        if args.turn_mean_s is not None:
            cfg.turn_mean_s = args.turn_mean_s
        if args.instance_niceness is not None:
            if args.backend in ("embedded", "null"):
                raise ValueError("--instance-niceness is for --backend ray, http or both")
            cfg.instance_niceness = check_instance_niceness(args.instance_niceness)
        if args.backend == "embedded" and args.actors is not None:
            raise ValueError(
                "--actors is for --backend ray, http or both (the embedded Gym takes --instances)"
            )
        if args.backend != "embedded" and args.repeats is not None:
            raise ValueError("--checkpoints is for the embedded Gym (one checkpoint per mode)")
        if args.backend == "null" and args.actors is not None:
            raise ValueError("--actors is for --backend ray, http or both (null takes --instances)")
        if args.backend not in ("embedded", "null") and args.instances is not None:
            raise ValueError("--instances is for the embedded Gym (Ray and HTTP take --actors)")
    if cfg.in_flight < cfg.group_size or cfg.actors < 1:
        raise ValueError("--in-flight must be >= the group size and --actors >= 1")
    return cfg


def _trainer_side_config(args: argparse.Namespace) -> _trainer_side_mod.TrainerSideConfig:
    """The trainer side's configuration (``checkpoint --backend null``): 1M in flight unless
    ``--rollouts`` says otherwise; it measures no mode side by side and has no turns."""
    mod = _trainer_side_mod.TrainerSideConfig
    cfg = mod.quick_defaults() if args.quick else mod()
    if args.bench == "checkpoint" and args.backend == "null":
        for flag, value in (
            ("--modes", args.modes),
            ("--turn-mean", args.turn_mean_s),
        ):
            if value is not None:
                raise ValueError(f"{flag} is not for --backend null (one checkpoint, no turns)")
        if args.in_flight is not None:
            cfg.in_flight = args.in_flight
        if args.instances is not None:
            cfg.instances = args.instances
    if cfg.in_flight < cfg.group_size or cfg.instances < 1:
        raise ValueError("--in-flight must be >= the group size and --instances >= 1")
    return cfg


def _backends(choice: str) -> tuple[str, ...]:
    """``--backend ray|http|both`` as the remote backends to measure, in order."""
    return _fanout_mod.BACKENDS if choice == "both" else (choice,)


def _fanout_config(args: argparse.Namespace) -> _fanout_mod.FanoutConfig:
    cfg = _fanout_mod.FanoutConfig.quick_defaults() if args.quick else _fanout_mod.FanoutConfig()
    if args.bench == "fanout":
        if args.actors is not None:
            cfg.actors = tuple(args.actors)
        if args.checkpoints is not None:
            cfg.checkpoints = args.checkpoints
        cfg.backends = _backends(args.backend)
        if args.dispatch_runs is not None:
            if args.dispatch_runs < 0:
                raise ValueError(f"--dispatch-runs must be >= 0, got {args.dispatch_runs}")
            cfg.dispatch_runs = args.dispatch_runs
    if not cfg.actors or min(cfg.actors) < 1 or cfg.checkpoints < 1:
        raise ValueError("--actors must be >= 1 each and --checkpoints >= 1")
    return cfg


def _preserved_config(args: argparse.Namespace) -> _preserved_mod.PreservedConfig:
    cfg = (
        _preserved_mod.PreservedConfig.quick_defaults()
        if args.quick
        else _preserved_mod.PreservedConfig()
    )
    if args.bench == "preserved" and args.kills is not None:
        cfg.kills = args.kills
    if args.bench == "preserved" and args.modes is not None:
        cfg.modes = args.modes
    if cfg.kills < 1:
        raise ValueError("--kills must be >= 1")
    return cfg


def _sandbox_config(args: argparse.Namespace) -> _sandbox_mod.SandboxBenchConfig:
    cfg = (
        _sandbox_mod.SandboxBenchConfig.quick_defaults()
        if args.quick
        else _sandbox_mod.SandboxBenchConfig()
    )
    if args.bench == "sandbox":
        if args.sessions is not None:
            cfg.sessions = args.sessions
        if args.template_mb is not None:
            cfg.template_bytes = int(args.template_mb * 2**20)
        if args.template_files is not None:
            cfg.template_files = args.template_files
        if args.restores is not None:
            cfg.restores = args.restores
        cfg.work_dir = args.dir
    cfg.check()
    return cfg


def _want_million(args: argparse.Namespace) -> bool:
    if args.million is not None:
        return bool(args.million)
    if args.quick:
        return False
    import psutil

    return psutil.virtual_memory().available > 6 * 2**30


def invocation(argv: Sequence[str]) -> str:
    """The command line that produced a result, as a user would type it."""
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    if spec is not None and spec.name == "gymckpt.benchmarks.__main__":
        exe = sys.executable
        try:
            rel = os.path.relpath(exe)
            exe = rel if not rel.startswith("..") else exe
        except ValueError:
            pass
        prefix = [exe, "-m", "gymckpt.benchmarks"]
    else:
        prefix = ["gymckpt", "bench"]
    return shlex.join([*prefix, *argv])


# -- output --------------------------------------------------------------------------------------


def _emit(result: dict[str, Any], as_json: bool) -> None:
    result = finite(result)  # JSON has no NaN: null
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            for v in value:
                print(f"{key:40s} {v}")
        elif not isinstance(value, dict | list):
            print(f"{key:40s} {value}")


NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "host": (("gymnasium", "gymnasium"),),
    "memory": (("psutil", "bench"),),
    "all": (("psutil", "bench"), ("matplotlib", "bench")),
}
"""The optional modules each benchmark imports, with the extra that installs them."""


def missing_extra(bench: str) -> str | None:
    """One line naming the extra to install when a module ``bench`` needs is missing."""
    for module, extra in NEEDS.get(bench, ()):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return (
                f"needs {module}, in the optional extra {extra!r} ({exc}): "
                f"pip install -e '.[{extra}]'"
            )
    return None


@attrs.define
class _Configs:
    """Every benchmark's configuration from the flags (``all`` runs them all)."""

    drain_cfg: _drain_mod.DrainConfig
    dispatch_cfg: _dispatch_mod.DispatchConfig
    memory_sizes: tuple[int, ...]
    checkpoint_cfg: _checkpoint_mod.CheckpointConfig
    checkpoint_ray_cfg: _checkpoint_ray_mod.CheckpointRayConfig
    trainer_side_cfg: _trainer_side_mod.TrainerSideConfig
    fanout_cfg: _fanout_mod.FanoutConfig
    preserved_cfg: _preserved_mod.PreservedConfig
    sandbox_cfg: _sandbox_mod.SandboxBenchConfig

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Configs:
        """``ValueError`` naming the flag when one cannot run."""
        return cls(
            _drain_config(args),
            _dispatch_config(args),
            _memory_sizes(args),
            _checkpoint_config(args),
            _checkpoint_ray_config(args),
            _trainer_side_config(args),
            _fanout_config(args),
            _preserved_config(args),
            _sandbox_config(args),
        )


def _run_one(
    args: argparse.Namespace, cfg: _Configs, meta: dict[str, Any], progress: Progress
) -> dict[str, Any] | int:
    """One benchmark (or ``report``): its result, or the exit code of a refusal."""
    result: dict[str, Any]
    if args.bench == "drain":
        result = {**_drain_mod.run_drain(cfg.drain_cfg, progress), "meta": meta}
    elif args.bench == "memory":
        result = {**_memory_mod.run_memory(cfg.memory_sizes, progress), "meta": meta}
    elif args.bench == "dispatch":
        result = {**_dispatch_mod.run_dispatch(cfg.dispatch_cfg, progress), "meta": meta}
    elif args.bench == "report":
        from .report import rerender

        try:
            result = rerender(args.out or DEFAULT_OUT)
        except ValueError as exc:
            print(f"gymckpt bench report: error: {exc}", file=sys.stderr)
            return ExitCode.BAD_INPUT
    elif args.bench == "checkpoint" and args.backend == "null":
        result = {
            **_trainer_side_mod.run_trainer_side(cfg.trainer_side_cfg, progress),
            "meta": meta,
        }
    elif args.bench == "checkpoint" and args.backend != "embedded":
        remote = _backends(args.backend)
        result = {
            **_checkpoint_ray_mod.run_remote_checkpoints(cfg.checkpoint_ray_cfg, remote, progress),
            "meta": meta,
        }
    elif args.bench == "checkpoint":
        result = {**_checkpoint_mod.run_checkpoint(cfg.checkpoint_cfg, progress), "meta": meta}
    elif args.bench == "fanout":
        result = {**_fanout_mod.run_fanout(cfg.fanout_cfg, progress), "meta": meta}
    elif args.bench == "preserved":
        result = {**_preserved_mod.run_preserved(cfg.preserved_cfg, progress), "meta": meta}
    elif args.bench == "sandbox":
        result = {**_sandbox_mod.run_sandbox(cfg.sandbox_cfg, progress), "meta": meta}
    else:  # host
        host_cfg = (
            _host_mod.HostBenchConfig.quick_defaults()
            if args.quick
            else _host_mod.HostBenchConfig()
        )
        if args.episodes is not None:
            host_cfg.episodes = args.episodes
        if args.no_ray:
            host_cfg.ray = False
        result = {**_host_mod.run_host(host_cfg, progress), "meta": meta}
    return result


def _out_dir(args: argparse.Namespace, meta: dict[str, Any]) -> Path | None:
    """``--out`` of ``all`` and ``issue34`` (its default when not given); None (said on
    stderr) when it is the committed results and the tree has uncommitted changes."""
    out: Path = args.out
    if out is None:
        out = DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT
    dirty = meta["source"].get("uncommitted_changes")
    if dirty and out.resolve() == COMMITTED_RESULTS.resolve() and not args.allow_dirty:
        print(
            f"gymckpt bench {args.bench}: error: the tree has uncommitted changes "
            f"({', '.join(dirty[:8])}{', ...' if len(dirty) > 8 else ''}); the results in "
            f"{COMMITTED_RESULTS} must come from a clean commit. Commit or stash them, or pass "
            "--out elsewhere (or --allow-dirty, marked in SUMMARY.md).",
            file=sys.stderr,
        )
        return None
    return out


def _run_issue34(
    args: argparse.Namespace, cfg: _Configs, meta: dict[str, Any], progress: Progress
) -> dict[str, Any] | int:
    """``issue34``: the targets at scale into ``--out`` (``report.run_scale``)."""
    from .report import ScaleConfigs, run_scale

    out = _out_dir(args, meta)
    if out is None:
        return ExitCode.BAD_INPUT
    return run_scale(ScaleConfigs.of(args.quick, not args.no_ray), out, meta, progress)


def _run_all(
    args: argparse.Namespace, cfg: _Configs, meta: dict[str, Any], progress: Progress
) -> dict[str, Any] | int:
    """``all``: every benchmark into ``--out``, then the report; or the exit code of a refusal
    (uncommitted changes, into the committed results)."""
    from .report import run_all

    out = _out_dir(args, meta)
    if out is None:
        return ExitCode.BAD_INPUT
    million = _want_million(args)
    if million:
        cfg.drain_cfg = attrs.evolve(cfg.drain_cfg, sweep=(*cfg.drain_cfg.sweep, 1_000_000))
        cfg.dispatch_cfg.in_flight = (*cfg.dispatch_cfg.in_flight, 1_000_000)
    cfg.dispatch_cfg.loop = True  # the whole loop's share of the runtime alone, same run
    result = run_all(
        drain_cfg=cfg.drain_cfg,
        memory_sizes=cfg.memory_sizes,
        dispatch_cfg=cfg.dispatch_cfg,
        checkpoint_cfg=cfg.checkpoint_cfg,
        fanout_cfg=None if args.no_ray else cfg.fanout_cfg,
        checkpoint_ray_cfg=None
        if args.no_ray
        else attrs.evolve(cfg.checkpoint_ray_cfg, in_flight=cfg.checkpoint_cfg.in_flight),
        preserved_cfg=cfg.preserved_cfg,
        sandbox_cfg=cfg.sandbox_cfg,
        trainer_side_cfg=cfg.trainer_side_cfg if million or args.quick else None,
        out=out,
        meta=meta,
        progress=progress,
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gymckpt bench ARGV``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) and bad flags (2)
        return exc.code if isinstance(exc.code, int) else 2
    if args.bench is None:
        parser.print_help()
        return 0
    missing = missing_extra(args.bench)
    if missing is not None:
        print(f"gymckpt bench {args.bench}: error: {missing}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    progress = Progress(args.progress)
    meta = {
        "command": invocation(argv),
        "machine": machine_info(),
        "source": source_info(),
        "quick": args.quick,
    }
    try:
        cfg = _Configs.of(args)
    except ValueError as exc:
        print(f"gymckpt bench {args.bench}: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    run = {"all": _run_all, "issue34": _run_issue34}.get(args.bench, _run_one)
    result = run(args, cfg, meta, progress)
    if isinstance(result, int):
        return result
    _emit(result, args.json)
    return 0
