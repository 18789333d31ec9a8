"""``gymckpt.run(main)``: run a trio trainer as a program, ending with an exit code, not a trace.

A trainer's errors arrive wrapped in the nurseries' exception groups (``open_rollouts`` runs the
dispatcher beside the trainer's body), so a plain ``trio.run`` ends a run that lost its Gym or
broke an invariant with a long nested traceback and exit 1. ``run`` decides the exit code from
the errors inside the groups (the command line's codes: 2 gymckpt refused its input or the
work directory is in use, 3 invariant violation, 4 checkpoints failed too often, 5 a Gym
instance died past its replacement budget, 6 the cluster lost, 7 episodes failed past the
data-failure budget, 8 infrastructure down past the outage budget, 130 interrupted) and
prints one line. Anything else — an error in the trainer's own code, a ``ValueError`` from its
``json.loads`` included — is not gymckpt's to summarise, and propagates unchanged, traceback
and all.

Preemption (SIGTERM, SIGINT): ``open_rollouts`` handles both signals while it is open — the
trainer finishes its step, a final checkpoint is taken and logged in one line, and
``batches`` raises ``Preempted``, so no code after the loop runs; ``run`` ends the program with
exit 0 (a rerun resumes).
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from gymckpt.runtime import FailureKind, failure_kind

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "ExitCode",
    "leaf_errors",
    "run",
    "run_exit",
    "run_failure",
]

T = TypeVar("T")


class ExitCode(enum.IntEnum):
    """The exit codes of every gymckpt program (the CLI, ``gymckpt.run``, the demo's phases,
    the simulation, the benchmarks): one place, so they cannot drift apart."""

    OK = 0
    """Done, or preempted by SIGTERM/SIGINT after a final checkpoint (``Preempted``)."""
    BAD_INPUT = 2
    """gymckpt refused its input (``BadInput``): a bad flag, manifest, configuration file,
    topology or digest; a work directory in use; a Gym server that serves another training run
    (``GymInUse``); an episode's configuration wrong for every row (``EpisodeConfigFailed``:
    a model server refusing a request field, say)."""
    INVARIANT = 3
    """The run aborted on an invariant violation (or a simulated seed violated one)."""
    CHECKPOINTS_FAILED = 4
    """Checkpoints failed too often in a row, or Gym was unavailable for good."""
    REPLACEMENTS_EXHAUSTED = 5
    """A Gym instance died more often than its replacement budget allows
    (``max_replacements`` within ``replacement_window_s``)."""
    CLUSTER_LOST = 6
    """The trainer lost its connection to the cluster Gym runs on (``GymConnectionLost``):
    its last snapshot is intact; restart once the cluster is back to resume from it."""
    DATA_FAILURES = 7
    """Episodes failed as data past ``data_failure_budget``, or every row of the dataset
    failed for good (``BudgetExhausted``): the environment (or the data) is broken. The line
    names the last failure; each is logged under the ``gymckpt`` logger with its traceback."""
    INFRA_OUTAGE = 8
    """Infrastructure stayed down past ``outage_budget_s`` (``InfraOutage``): a model server
    every episode failed on, or a Gym instance that could not be brought back. The line names
    what is down; no row was given up, and a rerun resumes from the last snapshot."""
    INTERRUPTED = 130
    """SIGINT outside the trainer facade (which handles it itself)."""


EXIT_INTERRUPTED = ExitCode.INTERRUPTED

EXIT_CODES: Mapping[FailureKind, ExitCode] = {
    FailureKind.INVARIANT: ExitCode.INVARIANT,
    FailureKind.BAD_INPUT: ExitCode.BAD_INPUT,
    FailureKind.TRAINER_FILES: ExitCode.BAD_INPUT,
    FailureKind.GYM_UNAVAILABLE: ExitCode.CHECKPOINTS_FAILED,
    FailureKind.CHECKPOINTS_FAILED: ExitCode.CHECKPOINTS_FAILED,
    FailureKind.REPLACEMENTS_EXHAUSTED: ExitCode.REPLACEMENTS_EXHAUSTED,
    FailureKind.CLUSTER_LOST: ExitCode.CLUSTER_LOST,
    FailureKind.DATA_FAILURES: ExitCode.DATA_FAILURES,
    FailureKind.INFRA_OUTAGE: ExitCode.INFRA_OUTAGE,
    FailureKind.PREEMPTED: ExitCode.OK,
}
"""The exit code of each kind of failure that can end a run (``run_failure`` decides the
kind). ``SNAPSHOT_IO`` and ``UNKNOWN`` have none: such an error is not gymckpt's to summarise
as a run's end, it propagates with its traceback."""

_DECIDES_ALONE = (
    FailureKind.INVARIANT,
    FailureKind.CLUSTER_LOST,
    FailureKind.REPLACEMENTS_EXHAUSTED,
    FailureKind.INFRA_OUTAGE,
)
"""Kinds that decide a run's end whatever failed with them, in this order."""
_UNAVAILABLE = frozenset({FailureKind.CHECKPOINTS_FAILED, FailureKind.GYM_UNAVAILABLE})
_REFUSED = frozenset({FailureKind.BAD_INPUT, FailureKind.TRAINER_FILES})


def leaf_errors(exc: BaseException) -> list[BaseException]:
    """Every error inside ``exc``'s (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaf_errors(e)]
    return [exc]


def run_failure(exc: BaseException) -> tuple[FailureKind, BaseException] | None:
    """The kind of failure an error that ended a run is, with the error that decides it.

    Two tasks may fail together (the dispatcher finding every instance dead while a checkpoint
    gives up), so every error inside the groups is classified (``failure_kind``): an
    invariant violation anywhere decides; then the cluster lost (whatever failed with it);
    then an instance that died past its replacement budget; then infrastructure down past
    the outage budget. Checkpoints failing too often, every instance dead, or a restore Gym
    could not serve (a ``GymUnavailable`` only escapes a run from the restore; checkpoints
    retry it) — those and nothing else — are
    ``CHECKPOINTS_FAILED`` (the first ``CheckpointsFailed``) or ``GYM_UNAVAILABLE``; episodes
    failing past the data-failure budget (``BudgetExhausted``, alone or beside Gym being
    unavailable), ``DATA_FAILURES`` (the last one); a run preempted by a signal (``Preempted``
    and nothing else), ``PREEMPTED``; a lone refused input (``BadInput``: a manifest, a
    topology, a configuration file, a work directory in use), ``BAD_INPUT``. None for anything
    else — a ``ValueError`` of the trainer's own code included: let it surface with its
    traceback.
    """
    leaves = [(failure_kind(leaf), leaf) for leaf in leaf_errors(exc)]
    kinds = {kind for kind, _ in leaves}
    for decides in _DECIDES_ALONE:
        for kind, leaf in leaves:
            if kind is decides:
                return kind, leaf
    if kinds <= _UNAVAILABLE:
        failed = [p for p in leaves if p[0] is FailureKind.CHECKPOINTS_FAILED]
        return (failed or leaves)[0]
    if FailureKind.DATA_FAILURES in kinds and kinds <= {
        FailureKind.DATA_FAILURES,
        FailureKind.GYM_UNAVAILABLE,
    }:
        return [p for p in leaves if p[0] is FailureKind.DATA_FAILURES][-1]
    if kinds == {FailureKind.PREEMPTED}:
        return leaves[0]
    if len(leaves) == 1 and kinds <= _REFUSED:
        return leaves[0]
    return None


def run_exit(exc: BaseException) -> tuple[ExitCode, BaseException] | None:
    """The exit code an error that ended a run maps to (``EXIT_CODES`` of its
    ``run_failure``), with the error that decides it; None: not gymckpt's to summarise."""
    decided = run_failure(exc)
    if decided is None:
        return None
    kind, leaf = decided
    return EXIT_CODES[kind], leaf


def run(main: Callable[[], Awaitable[T]]) -> T:
    """``trio.run(main)``; a run-ending gymckpt error prints one line and exits with its code."""
    try:
        return trio.run(main)
    except BaseException as exc:
        leaves = leaf_errors(exc)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            # only outside open_rollouts, which handles SIGINT itself
            print("gymckpt: interrupted", file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        decided = run_exit(exc) if isinstance(exc, Exception) else None
        if decided is None:
            raise
        code, err = decided
        if code == ExitCode.OK:  # preempted: its one line (the final snapshot) is logged
            raise SystemExit(code) from None
        what = {
            ExitCode.BAD_INPUT: "error",
            ExitCode.INVARIANT: "run aborted",
            ExitCode.CHECKPOINTS_FAILED: "run stopped",
            ExitCode.REPLACEMENTS_EXHAUSTED: "run stopped",
            ExitCode.CLUSTER_LOST: "run stopped",
            ExitCode.DATA_FAILURES: "run stopped",
            ExitCode.INFRA_OUTAGE: "run stopped",
        }[code]
        print(f"gymckpt: {what}: {err}", file=sys.stderr)
        raise SystemExit(code) from None
