"""Deterministic simulation of the checkpoint protocol: ``gymckpt simulate --seeds N``.

Why it exists
-------------
The fault matrix (tests/test_fault_matrix.py) tries every fault we can name, one at a time.
Bugs in a protocol like this one hide in *combinations*: a dropped stream while a retire fails,
while a checkpoint is cut short by a crash, restored from a snapshot taken two checkpoints
earlier into a Gym whose restore fails once. The simulation draws such a combination from a
seed — the workload (rows, group size, instances, agent kinds, turn durations, batching), a
fault schedule in the C3 grammar, crash points, sometimes a rollback to an older snapshot —
runs it on the embedded Gym entirely in virtual time, and checks the invariants a user relies
on after every scenario:

* nothing lost, nothing duplicated: every row of the dataset is trained exactly once in the
  final model's lineage, or failed for good;
* every training step once (the lineage of the final model is steps 1..n);
* every environment mutation once: each sentinel a trained episode's plan calls for is in the
  final snapshot's committed environment state exactly once;
* budgets consistent: every row attempt spent is a failed or abandoned attempt (refusals cost
  nothing), no data failure (no poisoned or invalid row), checkpoint counters add up and never
  exceed ``max_consecutive_failures`` in a row;
* every restored episode dispatched once, on its original replica; Gym installed exactly what
  the ledger restored;
* after every life, crashed or not: admission open, the deadline pause released, the
  barrier free, no stream left open; Gym not parked beyond its lease;
* every published snapshot verifies offline; no trio task is left behind.

Races are drawn too (from their own generator, so the draws above stay put): Gym ends a reply
stream between two checkpoint stages (sometimes followed by a crash right after that checkpoint
publishes, so the replacement of a dropped attempt may run on another instance), stream ends
reach the consumer late, a restore that fails on one instance of several is retried into
the same Gym, and Gym instances die between two checkpoint stages (their replacement must leave
nothing lost or duplicated: every sentinel of the dead instance's calendar survives through its
durable log, and the dead attempts' sessions are freed there). After each restore, before
anything is dispatched, no instance may hold the state of an attempt the snapshot's ledger
dropped.

Real usage (``--real-usage``, ``usage``; all of it by default on the command line, none for
in-process callers) draws the workload the way people run RL, each sub-dimension from its own
generator and switchable on its own: ``shuffle`` (rows in a shuffled order), ``calls`` (two or
three concurrent model calls in one turn, in a trio nursery), ``long-turns`` (turns longer than
the control timeout and the lease), ``outages`` (the model server down for a drawn window of
virtual time, calls raising ``ModelUnavailable``), ``live-restart`` (the first trainer dies and
its Gym keeps running: the next restores into it) and ``second-trainer`` (another trainer opens
the same Gym: it must be refused, the first run unaffected). The same invariants hold, and
two more: no row given up for a model-server outage, and *liveness* (``liveness``): a
life in which nothing moves (no row trained, no checkpoint, no attempt resolved) for
the scenario's bound of virtual time is a violation, replayable like every other.

A *crash* abandons the whole runtime and its embedded Gym at a random virtual time or at a
coordinator hook point (the life's cancel scope is cancelled), and the next life
restores the latest complete snapshot into a fresh embedded Gym in the same trio run — or, with
``rollback``, an older snapshot copied into a fresh work directory. Aborts the contract documents
(checkpoints failing too often, every instance dead, a restore Gym cannot serve) end an
life the same way. The last life runs without faults or crashes, so every scenario
must end with the whole dataset judged.

Determinism (each seed replays exactly)
---------------------------------------
* Time: ``trio.testing.MockClock(autojump_threshold=0)``; ``offload`` runs inline under a
  MockClock, so no thread and no wall-clock time enters the run.
* Scheduling: trio shuffles each batch of runnable tasks with an unseeded module-level
  ``random.Random``. Per scenario the simulation seeds it and flips the private switch trio's
  Hypothesis plugin flips, so each batch is first sorted by task creation order and then
  shuffled by that seeded Random: the order does not depend on the order in which wakeups
  were issued (e.g. iterating a set of objects hashed by ``id``). Both names are trio's
  privates: ``determinism`` checks that the installed trio is one the hook was written for
  (``TRIO_VERSIONS``) and refuses to simulate on any other (``gymckpt simulate`` exits 2 with
  one line saying which trio it found).
* String hashing: set iteration order of strings depends on ``PYTHONHASHSEED``; the CLI
  re-executes itself with ``PYTHONHASHSEED=0`` so a replay in another process sees the same
  order. (In-process callers get determinism within the process.)
* Everything random in a scenario comes from ``random.Random`` seeded with the seed.

The replay command of a failing seed is ``gymckpt simulate --seeds 1 --start SEED``.

Layout
------
``scenario`` (what a seed draws), ``determinism`` (the guarded scheduling hook),
``gym`` (the scenario's Gym), ``crashes`` (crash control and stage races),
``usage`` (the real-usage draws), ``usage_env`` (the workplace used that way and what
it counted), ``liveness`` (the liveness watch), ``life`` (one trainer
life), ``ends`` (how a life ended),
``checks`` (the invariants checked live), ``state`` (the scenario across lives
and its final verdict), ``reports`` (reports and their JSON), ``runner`` (a scenario,
a seed); this module is ``gymckpt simulate``: seeds in a row, progress, the summary.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from gymckpt.nurseries import ExitCode

from .determinism import SchedulingHookUnavailable, check_scheduling_hook
from .reports import LifeReport, ScenarioReport
from .runner import run_scenario, run_seed
from .scenario import Crash, Scenario, draw_scenario, replay_command
from .usage import USAGE_NAMES, parse_real_usage, usage_flag

__all__ = [
    "USAGE_NAMES",
    "Crash",
    "LifeReport",
    "Scenario",
    "ScenarioReport",
    "SchedulingHookUnavailable",
    "draw_scenario",
    "main_simulate",
    "parse_real_usage",
    "replay_command",
    "run_scenario",
    "run_seed",
]

PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines when stderr is not a terminal (a CI log, a file)."""


@attrs.define(eq=False, slots=True)
class Tally:
    """What the seeds run so far add up to (the summary line, and ``--json``)."""

    failed: list[ScenarioReport] = attrs.field(factory=list)
    ends: Counter[str] = attrs.field(factory=Counter)
    """Lives by how they ended."""
    faults_fired: int = 0
    restores: int = 0
    rollbacks: int = 0
    replacements: int = 0
    struck: Counter[str] = attrs.field(factory=Counter)
    """The environment's hostile acts that struck, by kind."""
    virtual_s: float = 0.0
    seeds_by_mode: Counter[str] = attrs.field(factory=Counter)
    """Seeds by their checkpoint mode (``Scenario.checkpoint_mode``)."""
    checkpoints_by_mode: Counter[str] = attrs.field(factory=Counter)
    """Published checkpoints, by mode."""
    taken_by_mode: Counter[str] = attrs.field(factory=Counter)
    """Episodes in published checkpoints, by mode."""
    episodes_mid_turn: int = 0
    """Episodes the published checkpoints took mid-turn (``CheckpointOutcome.mid_turn``)."""
    seeds_mid_turn: int = 0
    """Seeds whose checkpoints took at least one episode mid-turn."""
    usage: Counter[str] = attrs.field(factory=Counter)
    """What the real-usage dimension exercised, summed (``ScenarioReport.usage``)."""
    longest_still_s: float = 0.0
    """The longest stretch of virtual time any seed spent with nothing moving, and which."""
    longest_still_seed: int = -1
    violations_by_rule: Counter[str] = attrs.field(factory=Counter)
    """Failing seeds by the rule of their first violation (``violation_rule``)."""

    def add(self, report: ScenarioReport) -> None:
        self.usage.update(dict(report.usage))
        if report.longest_still_s > self.longest_still_s:
            self.longest_still_s = report.longest_still_s
            self.longest_still_seed = report.seed
        self.seeds_by_mode[report.scenario.checkpoint_mode.value] += 1
        self.episodes_mid_turn += report.episodes_mid_turn
        self.seeds_mid_turn += report.episodes_mid_turn > 0
        for life in report.lives:
            self.struck.update(dict(life.hostile_fired))
            self.checkpoints_by_mode[life.checkpoint_mode] += life.checkpoints_ok
            self.taken_by_mode[life.checkpoint_mode] += life.episodes_taken
        self.ends.update(life.end for life in report.lives)
        self.faults_fired += sum(len(life.faults_fired) for life in report.lives)
        self.restores += sum(life.restored_from is not None for life in report.lives)
        self.rollbacks += report.rolled_back
        self.replacements += sum(life.replacements for life in report.lives)
        self.virtual_s += report.virtual_s
        if not report.ok:
            self.failed.append(report)
            self.violations_by_rule[violation_rule(report.violations[0])] += 1


def violation_rule(violation: str) -> str:
    """A violation's rule, for the summary: its line without the life and the
    specifics (numbers, ids, what followed a colon)."""
    text = violation.split(": ", 1)[1] if violation.startswith("incarnation ") else violation
    head = text.split(":", 1)[0] if text.startswith(("liveness", "second trainer")) else text
    words = [w for w in head.split() if not any(c.isdigit() for c in w)]
    return " ".join(words[:8])


@attrs.define(eq=False, slots=True)
class SeedProgress:
    """Progress lines: to ``callback`` when given, else on stderr (rewritten in place on a
    terminal; elsewhere one line at most every ``every_s`` seconds, and the last)."""

    seeds: int
    callback: Callable[[str], None] | None
    tty: bool
    every_s: float
    shown: bool = True
    t0: float = attrs.field(factory=time.monotonic)
    _last_shown: float = attrs.field(default=0.0, init=False)

    def seed_done(self, i: int, failed: int) -> None:
        """Seed number ``i`` (0-based) is done, ``failed`` seeds so far failed."""
        now = time.monotonic()
        last = i == self.seeds - 1
        if not self.shown or not (now - self._last_shown > self.every_s or last):
            return
        self._last_shown = now
        rate = (i + 1) / max(now - self.t0, 1e-9)
        line = f"simulate: {i + 1}/{self.seeds} seeds, {failed} failed, {rate:.1f} seeds/s"
        if self.callback is not None:
            self.callback(line)
        elif self.tty:
            print(f"\r{line}", end="\n" if last else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def main_simulate(
    seeds: int,
    start: int,
    as_json: bool,
    tmp_root: Path | None = None,
    progress: Callable[[str], None] | None = None,
    hostile: bool = False,
    usage: frozenset[str] = frozenset(),
) -> int:
    """``gymckpt simulate``: run seeds ``start .. start+seeds-1`` (``hostile``: with the
    environment's hostile acts, ``--hostile``; ``usage``: the real-usage sub-dimensions,
    ``--real-usage``, none by default here, all on the command line); exit 0, or 3 on a
    violation.

    Raises ``SchedulingHookUnavailable`` before any seed runs when the installed trio is not
    one the deterministic scheduling was written for.
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if start < 0:
        raise ValueError(f"--start must be >= 0, got {start}")
    check_scheduling_hook()
    tty = sys.stderr.isatty()
    meter = SeedProgress(
        seeds,
        progress,
        tty,
        0.5 if progress is not None or tty else PROGRESS_EVERY_S,  # a log file: sparser
        shown=progress is not None or not as_json,
    )
    # The seeds' own runs log checkpoint failures, restores and replacements under the
    # ``gymckpt`` logger by design; thousands of them would bury the verdict. The simulation
    # reports them in its own summary instead.
    quiet = logging.NullHandler()
    logging.getLogger("gymckpt").addHandler(quiet)
    try:
        return _simulate_seeds(seeds, start, as_json, tmp_root, meter, hostile, usage)
    finally:
        logging.getLogger("gymckpt").removeHandler(quiet)


def _simulate_seeds(
    seeds: int,
    start: int,
    as_json: bool,
    tmp_root: Path | None,
    meter: SeedProgress,
    hostile: bool,
    usage: frozenset[str],
) -> int:
    tally = Tally()
    reports: list[ScenarioReport] = []
    for i, seed in enumerate(range(start, start + seeds)):
        report = run_seed(seed, tmp_root, hostile=hostile, usage=usage)
        tally.add(report)
        if seeds == 1:
            reports.append(report)
        if not report.ok and not as_json:
            print(
                f"seed {seed}: FAIL: {report.violations[0]}  replay: "
                f"{replay_command(seed, hostile, usage)}",
                flush=True,
            )
        meter.seed_done(i, len(tally.failed))
    elapsed = time.monotonic() - meter.t0
    if as_json:
        print(
            json.dumps(
                _json_summary(tally, seeds, start, elapsed, hostile, reports, usage),
                sort_keys=True,
            )
        )
    else:
        if seeds == 1:
            _print_seed(reports[0])
        _print_summary(tally, seeds, start, elapsed, hostile, usage)
    return ExitCode.INVARIANT if tally.failed else ExitCode.OK


def _json_summary(
    tally: Tally,
    seeds: int,
    start: int,
    elapsed: float,
    hostile: bool,
    reports: Sequence[ScenarioReport],
    usage: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The ``--json`` object (with ``scenario``, the one seed's report, for a single seed)."""
    out: dict[str, Any] = {
        "seeds": seeds,
        "start": start,
        "passed": seeds - len(tally.failed),
        "failed": [r.to_json() for r in tally.failed],
        "elapsed_s": round(elapsed, 3),
        "seeds_per_s": round(seeds / max(elapsed, 1e-9), 2),
        "virtual_s": round(tally.virtual_s, 3),
        "incarnation_ends": dict(sorted(tally.ends.items())),
        "faults_fired": tally.faults_fired,
        "restores": tally.restores,
        "rollbacks": tally.rollbacks,
        "replacements": tally.replacements,
        "hostile": hostile,
        "hostile_fired": dict(sorted(tally.struck.items())),
        "seeds_by_mode": dict(sorted(tally.seeds_by_mode.items())),
        "checkpoints_by_mode": dict(sorted(tally.checkpoints_by_mode.items())),
        "episodes_taken_by_mode": dict(sorted(tally.taken_by_mode.items())),
        "episodes_mid_turn": tally.episodes_mid_turn,
        "seeds_mid_turn": tally.seeds_mid_turn,
        "real_usage": usage_flag(usage),
        "longest_still_s": round(tally.longest_still_s, 3),
        "longest_still_seed": tally.longest_still_seed,
        "real_usage_exercised": {k: round(v, 3) for k, v in sorted(tally.usage.items())},
        "violations_by_rule": dict(sorted(tally.violations_by_rule.items())),
    }
    if seeds == 1:
        out["scenario"] = reports[0].to_json()
    return out


def _fired_summary(fired: Sequence[tuple[str, int]]) -> str:
    counts = Counter(spec for spec, _ in fired)
    return ", ".join(f"{spec} x{n}" if n > 1 else spec for spec, n in counts.items()) or "none"


def _life_line(life: LifeReport) -> str:
    return (
        f"  incarnation {life.index}: {life.end}"
        + (f" ({life.error})" if life.error else "")
        + (f", restored {life.restored_from}" if life.restored_from else "")
        + f", {life.steps_trained} steps, {len(life.checkpoints)} checkpoints "
        f"({life.checkpoints_ok} ok, {life.checkpoint_mode}: {life.episodes_taken} episodes "
        f"taken, {life.episodes_mid_turn} mid-turn), faults fired "
        f"{_fired_summary(life.faults_fired)}"
        + (
            ", hostile acts " + ", ".join(f"{k} x{n}" for k, n in life.hostile_fired)
            if life.hostile_fired
            else ""
        )
    )


def _print_seed(r: ScenarioReport) -> None:
    """A single seed's run in detail: its scenario, each life, its violations."""
    print(f"seed {r.seed}: {r.scenario.describe()}")
    for life in r.lives:
        print(_life_line(life))
    for v in r.violations:
        print(f"  VIOLATION: {v}")
    print(
        f"  rows trained {r.rows_trained}, failed {r.rows_failed}, steps {r.steps}, "
        f"sentinels {r.sentinels}, {r.virtual_s:.3f} virtual s, fingerprint "
        f"{r.fingerprint}"
    )
    if r.usage:
        print("  real usage exercised: " + ", ".join(f"{k} {v:g}" for k, v in r.usage))


def _print_summary(
    tally: Tally,
    seeds: int,
    start: int,
    elapsed: float,
    hostile: bool,
    usage: frozenset[str] = frozenset(),
) -> None:
    failed = tally.failed
    rate = seeds / max(elapsed, 1e-9)
    print(
        f"{seeds} seeds from {start}: {seeds - len(failed)} passed, {len(failed)} failed "
        f"in {elapsed:.1f}s ({rate:.1f} seeds/s, {tally.virtual_s:.0f} virtual s); incarnation "
        f"ends {dict(sorted(tally.ends.items()))}; {tally.faults_fired} faults fired; "
        f"{tally.restores} restores ({tally.rollbacks} to an older snapshot); "
        f"{tally.replacements} instances replaced; seeds by mode "
        f"{dict(sorted(tally.seeds_by_mode.items()))}, checkpoints by mode "
        f"{dict(sorted(tally.checkpoints_by_mode.items()))}, episodes taken by mode "
        f"{dict(sorted(tally.taken_by_mode.items()))}, {tally.episodes_mid_turn} episodes "
        f"mid-turn (in {tally.seeds_mid_turn} seeds); longest still "
        f"{tally.longest_still_s:.1f} virtual s (seed {tally.longest_still_seed})"
        + (f"; hostile acts struck {dict(sorted(tally.struck.items()))}" if hostile else "")
        + (
            f"; real usage {usage_flag(usage)}: "
            + ", ".join(f"{k} {v:g}" for k, v in sorted(tally.usage.items()))
            if usage
            else ""
        )
    )
    if tally.violations_by_rule:
        print(
            "violations by rule (first of each failing seed): "
            + "; ".join(f"{rule} x{n}" for rule, n in tally.violations_by_rule.most_common())
        )
    if failed:
        print("failing seeds: " + " ".join(str(r.seed) for r in failed))
