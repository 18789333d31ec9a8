"""The ``gymckpt`` command line (C2). ``python -m gymckpt`` is the same program.

Exit codes (C4): 0 success; 2 bad input (flag, manifest, topology or digest mismatch);
3 run aborted by an invariant violation; 4 checkpoints failed more than
``max_consecutive_failures`` times in a row; 5 a Gym instance died more often than its
replacement budget allows; 6 the Ray cluster is unreachable or was lost; 7 episodes failed as
data past the budget; 8 infrastructure (a model server, a Gym instance) down past
``outage_budget_s``. Errors are one line, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gymckpt import __version__
from gymckpt.nurseries import ExitCode, snapshot_problems
from gymckpt.runtime import (
    CheckpointMode,
    LoadedSnapshot,
    ManifestError,
    RuntimeConfig,
    SnapshotStore,
    TopologyMismatch,
    WorkDirLocked,
    load_snapshot,
)
from gymckpt.runtime._shared import (
    COMMIT_MARKER,
    LEDGER_FILE,
    MANIFEST_NAME,
    RECORDS_FILE,
    SNAPSHOTS_DIR,
    TRAINER_FILES_DIR,
    TRAINER_STATE_FILE,
    SessionRecords,
    load_ledger_snapshot,
    read_snapshot_records,
    state_dir_problem,
    tree_size,
)

from .chaos import add_chaos_parser
from .train.command import add_train_parser

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    last_error: str | None = None
    """The last flag error (for ``demo --json``, which reports it in its JSON object too)."""

    def error(self, message: str) -> NoReturn:
        _Parser.last_error = message
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _demo_json_error(error: str) -> None:
    """``demo --json`` prints its JSON object on every exit path, a bad flag included."""
    from .demo.main import error_report

    print(json.dumps(error_report(error, ExitCode.BAD_INPUT), sort_keys=True))


_BUDGET = RuntimeConfig()
"""The replacement budget the demo runs with (the runtime's defaults)."""

DEMO_FLAG_DEST = {"faults": "fault", "crash_stage": "crash_at_stage"}
"""``DemoOptions`` fields whose command-line flag stores under another name."""


EXIT_CODE_SUMMARY: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.BAD_INPUT: "bad input (or a work directory or Gym server in use)",
    ExitCode.INVARIANT: "run aborted (invariant)",
    ExitCode.CHECKPOINTS_FAILED: "checkpoints failed too often",
    ExitCode.REPLACEMENTS_EXHAUSTED: "a Gym instance kept dying (replacement budget spent)",
    ExitCode.CLUSTER_LOST: "the Ray cluster is unreachable or was lost",
    ExitCode.DATA_FAILURES: "episodes failed as data past the budget",
    ExitCode.INFRA_OUTAGE: "infrastructure down past outage_budget_s",
    ExitCode.INTERRUPTED: "interrupted (SIGINT)",
}
"""The few words ``gymckpt --help`` says of each exit code; ``ExitCode``'s own docstrings are
the full meaning (the reference's exit-code page is generated from them)."""


def exit_codes_epilog() -> str:
    """The ``exit codes:`` line of ``gymckpt --help``: every ``ExitCode``, in order, so the help
    cannot leave one out (a code without words here is listed by its name)."""
    return "exit codes: " + ", ".join(
        f"{int(code)} {EXIT_CODE_SUMMARY.get(code, code.name.lower().replace('_', ' '))}"
        for code in ExitCode
    )


def build_parser(demo_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The ``gymckpt`` parser, every subcommand in the order ``--help`` lists them;
    ``demo_defaults`` (the demo's ``--config`` table) become the demo flags' defaults."""
    parser = _Parser(
        prog="gymckpt",
        description=(
            "Consistent checkpoints of RL rollouts while they run in a Gym service, and "
            "exactly-once restore after a crash."
        ),
        epilog=exit_codes_epilog(),
    )
    parser.add_argument("--version", action="version", version=f"gymckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_demo_parser(sub, demo_defaults)
    _add_snapshots_parser(sub)
    _add_offline_parsers(sub)
    _add_simulate_parser(sub)
    from .serve import add_serve_parser

    add_serve_parser(sub)
    # A subcommand of its own module registers here, one line: ``add_X_parser(sub)`` adds its
    # parser and sets ``handler=main_X`` (``main_X(args) -> int``), which ``main`` calls.
    add_chaos_parser(sub)
    add_train_parser(sub)
    _add_bench_parser(sub)
    return parser


def _add_demo_parser(sub: Any, demo_defaults: dict[str, Any] | None) -> None:
    demo: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run a toy trio trainer against Gym with checkpoints, a SIGKILL and a restore",
        description=(
            "Runs a toy trainer (a running reward estimate) on prompt groups from Gym, takes a "
            "rollout checkpoint every --checkpoint-every steps, kills the trainer process with "
            "SIGKILL after checkpoint --crash-after-checkpoint (0: no crash), restores in a new "
            "process and finishes; then judges exactly-once from the training journal and the "
            "saved environment state. A Gym instance that dies (--fault OP:dead) is replaced "
            "under the same name: its rows in flight are re-sent fresh at no cost, its "
            "environment state (the calendar) continues from a durable log, and the run goes "
            f"on; an instance that dies more than {_BUDGET.max_replacements} times in "
            f"{_BUDGET.replacement_window_s / 60:g} minutes stops the run (exit 5). "
            "With --json one JSON object is printed on every exit, with exactly_once false and "
            "an error line when the run did not finish."
        ),
    )
    demo.add_argument(
        "--backend",
        choices=["embedded", "ray", "http"],
        default="embedded",
        help=(
            "Gym deployment: in-process simulated Gym, a Ray actor per instance, or a local "
            "gymckpt serve process per instance (HTTP)"
        ),
    )
    demo.add_argument("--rows", type=int, default=64, help="dataset rows (prompts); default 64")
    demo.add_argument("--group-size", type=int, default=4, help="generations per prompt group")
    demo.add_argument("--instances", type=int, default=2, help="Gym instances (replicas)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the simulated Gym")
    demo.add_argument(
        "--checkpoint-every",
        type=int,
        default=2,
        metavar="STEPS",
        help="rollout checkpoint every this many training steps",
    )
    demo.add_argument(
        "--crash-after-checkpoint",
        type=int,
        default=1,
        metavar="N",
        help="SIGKILL the trainer after its N-th checkpoint; 0 disables (default 1)",
    )
    demo.add_argument(
        "--crash-at-stage",
        metavar="POINT",
        help="instead, phase 1 SIGKILLs itself at this point of checkpoint "
        "--crash-after-checkpoint: before_prepare, after_prepare, after_commit, "
        "before_publish, mid_publish (files written, no commit marker yet), "
        "after_publish or before_resume",
    )
    demo.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a Gym fault OP:KIND[@N][:ARG] (repeatable), e.g. "
        "prepare:hang@1; KIND dead kills the instance, which is then replaced",
    )
    _add_demo_setup_flags(demo)
    if demo_defaults:
        demo.set_defaults(**demo_defaults)


def _add_demo_setup_flags(demo: argparse.ArgumentParser) -> None:
    """The demo's flags of where and on what it runs (work directory, environment, mode)."""
    from .demo.envs import FAMILIES

    demo.add_argument(
        "--workdir",
        help="new or empty directory for snapshots and the journal "
        "(default: a fresh temporary directory, removed after a run that "
        "finished exactly once unless --keep)",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary work directory of a run that finished",
    )
    demo.add_argument(
        "--env",
        default="calendar",
        metavar="ENV",
        help="environment: calendar (the simulated workplace, default) or PREFIX:ID of a "
        "family from another project (embedded backend; sandbox: also http): "
        + "; ".join(
            f"{f.prefix}ID (e.g. {f.prefix}{f.example}"
            + (f"; needs the {f.extra} extra)" if f.extra else ")")
            for f in FAMILIES.values()
        ),
    )
    demo.add_argument(
        "--checkpoint-mode",
        choices=[m.value for m in CheckpointMode],
        default=CheckpointMode.ALIGNED.value,
        help="how a checkpoint takes an episode in the middle of a turn (RuntimeConfig."
        "checkpoint_mode): aligned (default) parks every episode at its next step boundary "
        "and waits for the slowest turn; unaligned parks nothing and takes each episode as "
        "it was at its last step boundary, with the model calls it completed since (replayed "
        "after a restore); the report counts the episodes taken mid-turn",
    )
    demo.add_argument(
        "--agent-kind",
        choices=["simple_agent", "legacy_agent"],
        default="simple_agent",
        help="agent participant of every instance",
    )
    demo.add_argument(
        "--ray-address",
        help="join this Ray cluster ('auto' or an address); default: start a local one",
    )
    demo.add_argument(
        "--json", action="store_true", help="print one JSON object (on every exit, finished or not)"
    )
    demo.add_argument(
        "--config",
        metavar="FILE",
        help="read the options from table [demo] of a TOML file (keys are the "
        "option names with underscores, e.g. group_size = 4; flags given on "
        "the command line win) and runtime settings from its table [runtime] "
        "(RuntimeConfig's fields, e.g. lease_s = 60.0)",
    )


def _add_snapshots_parser(sub: Any) -> None:
    snaps = sub.add_parser(
        "snapshots",
        help="list or prune the rollout snapshots of a work directory",
        description="List or prune the rollout snapshots of a trainer's work directory (or of "
        "a snapshot root). Copies under restored/ are pinned: a restore works from them.",
    )
    snaps_sub = snaps.add_subparsers(
        dest="action", metavar="ACTION", required=True, parser_class=_Parser
    )
    snaps_list = snaps_sub.add_parser("list", help="every complete snapshot, oldest first")
    snaps_list.add_argument("dir", metavar="DIR")
    snaps_list.add_argument("--json", action="store_true", help="print one JSON object")
    snaps_prune = snaps_sub.add_parser(
        "prune",
        help="remove all but the newest N snapshots (pinned copies kept); refused "
        "while a trainer holds the work directory DIR is or is in",
    )
    snaps_prune.add_argument("dir", metavar="DIR")
    how_many = snaps_prune.add_mutually_exclusive_group(required=True)
    how_many.add_argument(
        "--keep",
        type=int,
        metavar="N",
        help="how many of the newest snapshots to keep (at least 1)",
    )
    how_many.add_argument(
        "--all", action="store_true", help="remove every snapshot (pinned copies kept)"
    )
    snaps_prune.add_argument("--json", action="store_true", help="print one JSON object")


def _add_offline_parsers(sub: Any) -> None:
    """``inspect`` and ``verify``: a snapshot read offline."""
    for name, text in (
        (
            "inspect",
            "summarise a rollout snapshot offline, the retained sessions of its "
            "environment per slot included",
        ),
        ("verify", "check a rollout snapshot offline: marker, manifest, topology, digests, ledger"),
    ):
        p = sub.add_parser(
            name,
            help=text,
            description=text + ". DIR is a snapshot directory "
            "or a demo workdir (its latest complete snapshot is used).",
        )
        p.add_argument("dir", metavar="DIR")
        p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_simulate_parser(sub: Any) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run N randomized scenarios (workload, faults, crashes) in virtual time",
        description=(
            "Deterministic simulation: each seed draws a workload, a fault schedule and crash "
            "points, runs them on the embedded Gym under trio's MockClock (milliseconds of real "
            "time each), restores after every crash, and checks the invariants: nothing lost or "
            "duplicated, every step and every sentinel once, budgets consistent, no task left "
            "behind, and liveness (a run makes progress or ends with its exit code). The "
            "real-usage dimension (--real-usage) draws the workload the way people run RL. A "
            "failing seed replays exactly with the command it prints (--seeds 1 --start SEED)."
        ),
        epilog="exit codes: 0 every seed passed, 2 bad flag, 3 some seed violated an invariant",
    )
    sim.add_argument(
        "--seeds", type=int, default=100, metavar="N", help="number of seeds to run (default 100)"
    )
    sim.add_argument("--start", type=int, default=0, metavar="S", help="first seed (default 0)")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument(
        "--hostile",
        action="store_true",
        help="a hostile environment too: episodes that raise after a mutation, "
        "end with non-finite or non-JSON values or hang; exports that return "
        "such values or raise; journal writes that are short, torn or hit a full "
        "disk (drawn by seed, in every incarnation but the last; off by default)",
    )
    sim.add_argument(
        "--trees",
        action="store_true",
        help="the hostile-tree lane instead: agents in sandbox trees that plant a symlink out, "
        "an enormous file, a command that never ends, a file changing while it is exported; "
        "each seed checkpoints, restores and checks every rule (drawn by seed)",
    )
    sim.add_argument(
        "--real-usage",
        default="all",
        metavar="WHICH",
        help="the real-usage dimension: all (default), none, or a comma-separated list of "
        "shuffle (rows in a shuffled order), calls (2-3 concurrent model calls in one turn), "
        "long-turns (turns longer than the control timeout and the lease), outages (the model "
        "server down for a drawn time), live-restart (a trainer dies, its Gym keeps running, "
        "the next restores into it), second-trainer (another trainer opens the same Gym: "
        "must be refused); drawn by seed, each from its own generator, with one more "
        "invariant, liveness: nothing moving for the scenario's bound of virtual time is a "
        "violation",
    )
    sim.add_argument(
        "--tmp",
        metavar="DIR",
        help="directory for the scenarios' snapshot files "
        "(default: /dev/shm when writable, else the system temp directory)",
    )


def _add_bench_parser(sub: Any) -> None:
    """``bench``: its own parser (``gymckpt.benchmarks.cli``) reads the rest."""
    bench = sub.add_parser(
        "bench", help="run benchmarks (see gymckpt bench --help)", add_help=False
    )
    bench.add_argument("args", nargs=argparse.REMAINDER)


def _ray_installed() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _phase_parser() -> argparse.ArgumentParser:
    """The demo's child processes (``gymckpt _phase``): internal, so not in ``--help``."""
    phase = _Parser(prog="gymckpt _phase")
    phase.add_argument("--phase", type=int, required=True)
    phase.add_argument("--crash-after", type=int, default=0)
    phase.add_argument("--workdir", required=True)
    phase.add_argument("--options", required=True)
    return phase


def _demo_file_defaults(path: str) -> dict[str, Any]:
    """Table ``[demo]`` of a TOML file, checked strictly as the demo's options, as defaults of
    the demo's flags."""
    import attrs

    from gymckpt.runtime._shared import load_toml_table, structure_table

    from .demo.main import DemoOptions

    fields = [a.name for a in attrs.fields(DemoOptions) if a.name != "runtime"]
    table = load_toml_table(path, "demo", fields)
    if "runtime" in table:
        raise ManifestError(f"{path} [demo]: runtime settings go in their own table, [runtime]")
    structure_table(table, DemoOptions, f"{path} [demo]")  # unknown or ill-typed: named
    return {DEMO_FLAG_DEST.get(k, k): (list(v) if k == "faults" else v) for k, v in table.items()}


def _demo_file_runtime(path: str | None) -> tuple[tuple[str, Any], ...]:
    """Table ``[runtime]`` of the demo's ``--config`` file (checked by the demo's options)."""
    if not path:
        return ()
    from gymckpt.runtime._shared import load_toml_table

    return tuple(load_toml_table(path, "runtime").items())


def _resolve_snapshot(raw: str) -> Path:
    path = Path(raw)
    if not path.exists():
        raise ManifestError(f"{path}: no such directory")
    if not path.is_dir():
        raise ManifestError(f"{path}: not a directory")
    if (path / COMMIT_MARKER).exists() or (path / MANIFEST_NAME).exists():
        return path
    for root in (path / SNAPSHOTS_DIR, path):
        if root.is_dir():
            info = SnapshotStore(root).latest_complete()
            if info is not None:
                return info.path
    raise ManifestError(f"{path}: no complete rollout snapshot here (no {COMMIT_MARKER} marker)")


SLOTS_SHOWN = 20
"""Retained slots ``inspect`` prints per participant (``--json`` has them all)."""
STATE_SHOWN = 100
"""Characters of a retained state ``inspect`` prints (``--json`` has it whole)."""


def retained_sessions(snap: LoadedSnapshot) -> dict[str, dict[str, dict[str, Any]]]:
    """The retained sessions a snapshot committed, from its participant records: instance ->
    retained participant -> slot key -> ``{"rollout_id", "attempt", "state"}`` (``state`` the
    participant's exported plain data, as a restore hands it back). The same shape as
    ``retained_sessions(instance)`` of a live deployment. A record that cannot be read is a
    ``ManifestError`` naming it."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for inst in snap.manifest.instances:
        for p in inst.participants:
            problem = state_dir_problem(p.state_dir, snap.path)
            if problem is not None:
                raise ManifestError(f"{snap.path}: {inst.name}/{p.server_name}: {problem}")
            path = snap.path / p.state_dir / RECORDS_FILE
            try:
                records = read_snapshot_records(snap.path, p.state_dir)
            except OSError as exc:
                raise ManifestError(f"{path}: records unreadable ({exc!r})") from None
            except ManifestError as exc:
                raise ManifestError(f"records unreadable: {exc}") from None
            if not isinstance(records, SessionRecords) or not records.retained:
                continue
            slots = {
                sess.key: {
                    "rollout_id": sess.rollout_id,
                    "attempt": sess.attempt,
                    "state": sess.state,
                }
                for sess in records.sessions
            }
            out.setdefault(inst.name, {})[p.server_name] = dict(sorted(slots.items()))
    return out


def _inspect(snap: LoadedSnapshot) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": str(snap.path),
        "checkpoint_id": snap.manifest.checkpoint_id,
        "instances": {
            i.name: [
                {
                    "server_name": p.server_name,
                    "kind": p.kind,
                    "state_dir": p.state_dir,
                    "records_digest": p.records_digest,
                }
                for p in i.participants
            ]
            for i in snap.manifest.instances
        },
        "episodes": len(snap.manifest.episodes),
        "files": sorted(snap.files),
        "retained": retained_sessions(snap),
    }
    if LEDGER_FILE in snap.files:
        led = load_ledger_snapshot(snap.files[LEDGER_FILE])
        states: dict[str, int] = {}
        for a in led.attempts:
            states[a.state] = states.get(a.state, 0) + 1
        out["ledger"] = {
            "group_size": led.group_size,
            "next_row": led.next_row,
            "rows_trained": sum(b - a + 1 for a, b in led.trained),
            "rows_failed": sum(b - a + 1 for a, b in led.failed),
            "attempts_by_state": states,
        }
    if TRAINER_STATE_FILE in snap.files:
        raw = snap.files[TRAINER_STATE_FILE]
        try:
            out["trainer_state"] = json.loads(raw)
        except (ValueError, UnicodeDecodeError):  # the API takes any bytes
            out["trainer_state"] = f"{len(raw)} bytes (not JSON)"
    if TRAINER_FILES_DIR in snap.marker.trees:
        out["trainer_files_bytes"] = tree_size(snap.path / TRAINER_FILES_DIR)
    return out


def _print_retained(retained: dict[str, dict[str, dict[str, Any]]]) -> None:
    if not retained:
        print("  retained sessions: none (no participant with retained = True)")
        return
    for instance, parts in retained.items():
        for participant, slots in parts.items():
            print(
                f"  retained {instance}/{participant}: {len(slots)} slot(s)"
                + (" (slot: owning attempt, exported state)" if slots else "")
            )
            for key, sess in list(slots.items())[:SLOTS_SHOWN]:
                state = json.dumps(sess["state"], sort_keys=True, separators=(",", ":"))
                if len(state) > STATE_SHOWN:
                    state = state[: STATE_SHOWN - 1] + "…"
                print(f"    {key}: {sess['rollout_id']} (attempt {sess['attempt']}) {state}")
            if len(slots) > SLOTS_SHOWN:
                print(f"    … {len(slots) - SLOTS_SHOWN} more (--json has every slot)")


def _offline(command: str, raw_dir: str, as_json: bool) -> int:
    snap = load_snapshot(_resolve_snapshot(raw_dir))
    if command == "inspect":
        info = _inspect(snap)
        if as_json:
            print(json.dumps(info, sort_keys=True))
        else:
            print(f"snapshot {info['checkpoint_id']} at {info['path']}")
            for name, parts in info["instances"].items():
                print(
                    f"  {name}: "
                    + ", ".join(
                        f"{p['server_name']}({p['kind']}) {p['records_digest'][:19]}…"
                        for p in parts
                    )
                )
            print(f"  episodes parked: {info['episodes']}")
            _print_retained(info["retained"])
            if "ledger" in info:
                print(f"  ledger: {info['ledger']}")
            if "trainer_state" in info:
                print(f"  trainer: {info['trainer_state']}")
        return 0
    problems = snapshot_problems(snap).all
    if as_json:
        print(json.dumps({"path": str(snap.path), "ok": not problems, "problems": problems}))
    elif problems:
        for p in problems:
            print(f"gymckpt: verify: {p}", file=sys.stderr)
    else:
        print(
            f"ok: {snap.path} (checkpoint {snap.manifest.checkpoint_id}: marker, manifest, "
            f"{sum(len(i.participants) for i in snap.manifest.instances)} participant digests, "
            "ledger consistent)"
        )
    return ExitCode.BAD_INPUT if problems else ExitCode.OK


def _simulate(args: argparse.Namespace, reexec: bool) -> int:
    """``gymckpt simulate``. Run as a program, it first re-executes itself with
    ``PYTHONHASHSEED=0``: set iteration order of strings then matches across processes, so a
    seed's replay command reproduces it exactly (see ``app.simulation.main``). A trio the
    simulation's deterministic scheduling was not written for: one line, exit 2."""
    if reexec and os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", "gymckpt", *sys.argv[1:]], env)
    from .simulation.main import SchedulingHookUnavailable, main_simulate, parse_real_usage

    try:
        usage = parse_real_usage(args.real_usage)
    except ValueError as exc:
        print(f"gymckpt: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.trees and (args.hostile or args.real_usage != "all"):
        print(
            "gymckpt: error: --trees runs the hostile-tree lane alone: drop --hostile and "
            "--real-usage (they draw the calendar scenarios' dimensions)",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    tmp = Path(args.tmp) if args.tmp else None
    if tmp is None and os.access("/dev/shm", os.W_OK):
        tmp = Path("/dev/shm")
    try:
        if args.trees:
            from .simulation.trees import main_trees

            return main_trees(args.seeds, args.start, args.json, tmp)
        return main_simulate(
            args.seeds, args.start, args.json, tmp, hostile=args.hostile, usage=usage
        )
    except SchedulingHookUnavailable as exc:  # refused before any seed ran
        print(f"gymckpt: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its own parser, --help included
        from gymckpt.benchmarks.cli import main as bench_main

        return bench_main(argv[1:])
    parsed = _parse(argv)
    if isinstance(parsed, int):
        return parsed
    parser, args = parsed
    try:
        return _dispatch(parser, args, as_program)
    except (ManifestError, TopologyMismatch, ValueError, WorkDirLocked) as exc:
        print(f"gymckpt: error: {exc}", file=sys.stderr)
        if args.command == "demo" and args.json:
            _demo_json_error(str(exc))
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace] | int:
    """The parser and the parsed ``argv`` (the demo's ``--config`` values as its defaults), or
    the exit code of a ``--config`` that cannot be read; a bad flag or ``--help`` exits."""
    if argv[:1] == ["_phase"]:
        parser = _phase_parser()
        args = parser.parse_args(argv[1:])
        args.command = "_phase"
        return parser, args
    demo_json = argv[:1] == ["demo"] and "--json" in argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "demo" and args.config:  # the file's values become defaults
            try:
                parser = build_parser(_demo_file_defaults(args.config))
            except ManifestError as exc:
                print(f"gymckpt: error: {exc}", file=sys.stderr)
                if demo_json:
                    _demo_json_error(str(exc))
                return ExitCode.BAD_INPUT
            args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (argparse printed why), or --help
        if demo_json and exc.code == ExitCode.BAD_INPUT:
            _demo_json_error(_Parser.last_error or "bad flags")
        raise
    return parser, args


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace, as_program: bool) -> int:
    """Run the parsed command; its exit code."""
    if args.command is None:
        parser.print_help()
        return 0
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is not None:  # a subcommand of its own module (``serve`` …)
        return handler(args)
    if args.command == "bench":
        from gymckpt.benchmarks.cli import main as bench_main

        return bench_main(args.args)
    if args.command in ("inspect", "verify"):
        return _offline(args.command, args.dir, args.json)
    if args.command == "snapshots":
        from .snapshots import list_snapshots, prune_snapshots

        if args.action == "list":
            return list_snapshots(args.dir, args.json)
        return prune_snapshots(args.dir, args.keep, args.json, every=args.all)
    if args.command == "simulate":
        return _simulate(args, reexec=as_program)
    if args.command == "_phase":
        from .demo.main import DemoOptions, phase_main

        opts = DemoOptions.from_json(args.options)
        return phase_main(opts, Path(args.workdir), args.phase, args.crash_after)
    return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    """``gymckpt demo`` with the parsed ``args``; its exit code."""
    from gymckpt.gym_adapter import FaultSpec

    from .demo.main import DemoOptions, run_demo

    for spec in args.fault:
        FaultSpec.parse(spec)
    hidden = {
        k: getattr(args, k)
        for k in ("groups_per_step", "max_rows_in_flight", "hold_first_mutation")
        if hasattr(args, k)
    }
    opts = DemoOptions(
        **hidden,
        backend=args.backend,
        rows=args.rows,
        group_size=args.group_size,
        instances=args.instances,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        crash_after_checkpoint=args.crash_after_checkpoint,
        faults=tuple(args.fault),
        workdir=args.workdir,
        ray_address=args.ray_address,
        agent_kind=args.agent_kind,
        checkpoint_mode=args.checkpoint_mode,
        crash_stage=args.crash_at_stage,
        env=args.env,
        keep=args.keep,
        runtime=_demo_file_runtime(args.config),
    )
    if args.config:
        opts.runtime_config(f"{args.config} [runtime]")  # bad settings: exit 2, named
    if opts.backend == "ray" and not _ray_installed():
        error = "--backend ray needs Ray, an optional extra: pip install 'gymckpt[ray]'"
        print(f"gymckpt: error: {error}", file=sys.stderr)
        if args.json:
            _demo_json_error(error)
        return ExitCode.BAD_INPUT
    return run_demo(opts, args.json)


if __name__ == "__main__":
    sys.exit(main())
