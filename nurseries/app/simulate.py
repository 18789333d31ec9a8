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
* after every incarnation, crashed or not: admission open, the deadline pause released, the
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

A *crash* abandons the whole runtime and its embedded Gym at a random virtual time or at a
coordinator hook point (the incarnation's cancel scope is cancelled), and the next incarnation
restores the latest complete snapshot into a fresh embedded Gym in the same trio run — or, with
``rollback``, an older snapshot copied into a fresh work directory. Aborts the contract documents
(checkpoints failing too often, every instance dead, a restore Gym cannot serve) end an
incarnation the same way. The last incarnation runs without faults or crashes, so every scenario
must end with the whole dataset judged.

Determinism (each seed replays exactly)
---------------------------------------
* Time: ``trio.testing.MockClock(autojump_threshold=0)``; ``offload`` runs inline under a
  MockClock, so no thread and no wall-clock time enters the run.
* Scheduling: trio shuffles each batch of runnable tasks with ``trio._core._run._r``, an
  unseeded module-level ``random.Random``. **Hack (private trio API):** per scenario we seed
  it, and set ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING`` — the switch trio's
  Hypothesis plugin flips — so each batch is first sorted by task creation order and then
  shuffled by that seeded Random. The order then no longer depends on the order in which
  wakeups were issued (e.g. iterating a set of objects hashed by ``id``).
* String hashing: set iteration order of strings depends on ``PYTHONHASHSEED``; the CLI
  re-executes itself with ``PYTHONHASHSEED=0`` so a replay in another process sees the same
  order. (In-process callers get determinism within the process.)
* Everything random in a scenario comes from ``random.Random`` seeded with the seed.

The replay command of a failing seed is ``gymckpt simulate --seeds 1 --start SEED``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, cast

import attrs
import orjson
import trio
import trio.testing

from gymckpt.gym_adapter import (
    FAULT_KINDS,
    EmbeddedGym,
    FaultPlan,
    GymBackend,
    GymHost,
    GymInstanceDead,
    GymStatistics,
    ReplyStream,
    RunReply,
    RunRow,
    SimConfig,
    calendar_state,
)
from gymckpt.nurseries import HOOK_POINTS, ExitCode, Rollouts, open_rollouts, snapshot_problems
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    LEDGER_FILE,
    SNAPSHOTS_DIR,
    BudgetExhausted,
    CompletedGroup,
    ManifestError,
    RuntimeConfig,
    SnapshotStore,
    TopologyMismatch,
    load_ledger_snapshot,
    load_snapshot,
)
from gymckpt.testing.hostile import (
    HostileAct,
    HostileActs,
    acts_summary,
    draw_hostile,
    hostile_calendar_environment,
    journal_faults,
)

from .demo import ToyTrainer, run_exit, single_error
from .verdict import judge

__all__ = [
    "Crash",
    "IncarnationReport",
    "Scenario",
    "ScenarioReport",
    "draw_scenario",
    "main_simulate",
    "replay_command",
    "run_scenario",
    "run_seed",
]

MAX_INCARNATIONS = 4
"""Incarnations per scenario; the last one runs without faults or crashes."""
STALL_S = 5_000.0
"""Virtual seconds an incarnation may take before it counts as stalled (a violation)."""
STEP_BUDGET = 3_000_000
"""Task steps a scenario may take before it counts as a livelock (zero virtual time spin)."""
PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines when stderr is not a terminal (a CI log, a file)."""

# (op, kind) pairs a fault schedule may use every call (no @N) without stalling the run for
# good: the rest would refuse or fail every submission forever, which no runtime can finish.
_EVERY_CALL_OK = frozenset(
    {(op, k) for op in ("prepare", "commit", "resume", "retire", "restore")
     for k in ("hang", "delay", "error", "unpicklable", "dead")}
    | {("run", "drop"), ("run", "delay"), ("run", "hang"), ("run", "dead")}
)


def replay_command(seed: int, hostile: bool = False) -> str:
    return f"gymckpt simulate --seeds 1 --start {seed}" + (" --hostile" if hostile else "")


# -- scenarios ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Crash:
    """Abandon an incarnation ``at_s`` virtual seconds after it starts, or at hook ``point`` of
    its checkpoint number ``checkpoint`` (1-based, counting attempts)."""

    at_s: float | None = None
    checkpoint: int | None = None
    point: str | None = None

    def __str__(self) -> str:
        if self.at_s is not None:
            return f"crash at {self.at_s:g}s"
        return f"crash at {self.point} of checkpoint {self.checkpoint}"


@attrs.frozen(kw_only=True)
class Scenario:
    """One simulated run. Defaults are a small healthy run; tests override what they need."""

    seed: int = 0
    rows: int = 12
    group_size: int = 2
    instances: int = 2
    agent_kinds: tuple[str, ...] = ()
    """One per instance; empty means ``simple_agent`` everywhere."""
    turns: tuple[int, int] = (2, 4)
    turn_s: tuple[float, float] = (0.5, 2.0)
    mutation_p: float = 0.5
    flush_interval_s: float = 0.005
    max_batch: int = 64
    max_rows_in_flight: int = 6
    batch_size: int = 64
    groups_per_step: int = 2
    checkpoint_every: int = 1
    keep_snapshots: int = 3
    max_consecutive_failures: int = 2
    lease_s: float = 30.0
    faults: tuple[str, ...] = ()
    """C3 specs of the first incarnation's Gym."""
    restore_faults: tuple[str, ...] = ()
    """C3 specs of the second incarnation's Gym (the one restored into after a crash)."""
    crashes: tuple[Crash | None, ...] = ()
    """Per incarnation (index), where it is abandoned; None or absent: no crash."""
    rollback: bool = False
    """After the first crash or abort, restore an older snapshot than the latest, if any."""
    stage_drops: tuple[tuple[int, str], ...] = ()
    """(checkpoint number within an incarnation, hook point): Gym ends one open reply stream
    there (its rows run on), between two checkpoint stages. Every incarnation but the last."""
    stage_deaths: tuple[tuple[int, str], ...] = ()
    """(checkpoint number within an incarnation, hook point): one live Gym instance dies there
    (and is replaced). Every incarnation but the last."""
    late_end_s: float = 0.0
    """Every stream's end reaches the consumer this many seconds after Gym ended it."""
    restore_retry: bool = False
    """A restore Gym could not serve is retried once, into the same Gym (all-or-nothing)."""
    max_incarnations: int = MAX_INCARNATIONS
    hostile: tuple[HostileAct, ...] = ()
    """What the environment does wrong (``gymckpt.testing.hostile``): episodes that raise
    after a mutation, end with non-finite or non-JSON values, hang; exports that return such
    values or raise; journal writes that are short, torn or hit a full disk. Every incarnation
    but the last."""

    def sim_config(self) -> SimConfig:
        return SimConfig(turns=self.turns, turn_s=self.turn_s, mutation_p=self.mutation_p,
                         lease_s=self.lease_s, flush_interval_s=self.flush_interval_s,
                         max_batch=self.max_batch)

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0,
                             lease_s=self.lease_s,
                             max_consecutive_failures=self.max_consecutive_failures)

    def kinds(self) -> tuple[str, ...]:
        return self.agent_kinds or ("simple_agent",) * self.instances

    def describe(self) -> str:
        kinds = ",".join(k.replace("_agent", "") for k in self.kinds())
        crashes = "; ".join(f"#{i}: {c}" for i, c in enumerate(self.crashes) if c) or "none"
        return (
            f"rows {self.rows} x group {self.group_size} on {self.instances} instance(s) "
            f"[{kinds}], turns {self.turns} of {self.turn_s}s, in flight "
            f"{self.max_rows_in_flight}, batch {self.batch_size}, {self.groups_per_step} "
            f"groups/step, checkpoint every {self.checkpoint_every}, max failures "
            f"{self.max_consecutive_failures}; faults {list(self.faults)}, restore faults "
            f"{list(self.restore_faults)}; crashes {crashes}; rollback {self.rollback}; "
            f"stream drops at {list(self.stage_drops)}; instance deaths at "
            f"{list(self.stage_deaths)}; late stream ends {self.late_end_s:g}s; "
            f"restore retried into the same Gym {self.restore_retry}; hostile "
            f"{acts_summary(self.hostile)}"
        )


def _draw_faults(rng: random.Random, n: int, ops: Sequence[str]) -> tuple[str, ...]:
    specs: list[str] = []
    for _ in range(n):
        op = rng.choice(ops)
        kinds = [k for k in FAULT_KINDS if op == "run" or k not in ("refuse", "drop")]
        kind = rng.choice(kinds)
        every = (op, kind) in _EVERY_CALL_OK and rng.random() < 0.2
        at = "" if every else f"@{rng.randint(1, 6)}"
        arg = f":{rng.choice((0.05, 0.5, 3.0)):g}" if kind == "delay" else ""
        specs.append(f"{op}:{kind}{at}{arg}")
    return tuple(specs)


def draw_scenario(seed: int, hostile: bool = False) -> Scenario:
    """The scenario of ``seed``: a pure function of the seed (and ``hostile``: draw what the
    environment does wrong too, from its own generator, so the other draws stay as they
    were)."""
    sc = _draw_scenario(seed)
    if not hostile:
        return sc
    return attrs.evolve(sc, hostile=draw_hostile(seed, sc.rows, sc.group_size,
                                                  sc.sim_config()))


def _draw_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    instances = rng.randint(1, 3)
    groups_per_step = rng.randint(1, 4)
    low = rng.randint(1, 3)
    turn_low = rng.choice((0.01, 0.1, 0.3))
    crashes: list[Crash | None] = []
    for p in (0.5, 0.25):
        if rng.random() >= p:
            crashes.append(None)
        elif rng.random() < 0.5:
            crashes.append(Crash(at_s=round(rng.uniform(0.0, 30.0), 3)))
        else:
            crashes.append(Crash(checkpoint=rng.randint(1, 4), point=rng.choice(HOOK_POINTS)))
    races = _draw_races(seed, instances)
    races.update(_draw_deaths(seed))
    after = races.pop("crash_after_drop", None)
    if after is not None:  # the drop's checkpoint publishes, then the trainer dies
        crashes[:1] = [Crash(checkpoint=after, point="after_publish")]
    return Scenario(
        seed=seed,
        rows=rng.randint(2, 32),
        group_size=rng.randint(1, 4),
        instances=instances,
        agent_kinds=tuple(rng.choice(("simple_agent", "legacy_agent"))
                          for _ in range(instances)),
        turns=(low, low + rng.randint(0, 3)),
        turn_s=(turn_low, round(turn_low * rng.choice((1, 2, 5)), 6)),
        mutation_p=rng.choice((0.0, 0.3, 0.5, 1.0)),
        flush_interval_s=rng.choice((0.005, 0.05, 0.5)),
        max_batch=rng.choice((1, 4, 64)),
        # fewer rows in flight than groups per step can never fill a step: trained groups are
        # the only ones that leave the ledger (a facade trap, reported, not simulated)
        max_rows_in_flight=rng.randint(groups_per_step, 12),
        batch_size=rng.choice((1, 3, 64)),
        groups_per_step=groups_per_step,
        checkpoint_every=rng.randint(1, 3),
        keep_snapshots=rng.randint(1, 3),
        max_consecutive_failures=rng.randint(1, 3),
        faults=_draw_faults(rng, rng.choice((0, 1, 1, 2, 3)),
                            ("prepare", "commit", "resume", "retire", "run")),
        restore_faults=_draw_faults(rng, rng.choice((0, 0, 1, 2)),
                                    ("restore", "restore", "prepare", "commit", "retire", "run"))
        + races.pop("restore_faults", ()),
        crashes=tuple(crashes),
        rollback=rng.random() < 0.2,
        **races,
    )


def _draw_races(seed: int, instances: int) -> dict[str, Any]:
    """Race-prone additions, from their own generator so the draws above stay as they were:
    stream drops between checkpoint stages, late stream ends, and a restore that fails on one
    instance of several and is retried into the same Gym."""
    rng = random.Random(f"races:{seed}")
    drops = tuple((rng.randint(1, 3), rng.choice(HOOK_POINTS))
                  for _ in range(rng.choice((0, 0, 1, 2))))
    late = rng.choice((0.0, 0.0, 0.2, 1.0, 3.0))
    extra: dict[str, Any] = {"stage_drops": drops, "late_end_s": late}
    if drops and rng.random() < 0.5:
        extra["crash_after_drop"] = drops[0][0]
    if instances > 1 and rng.random() < 0.3:
        extra["restore_retry"] = True
        kind = rng.choice(("error", "unpicklable", "hang"))
        extra["restore_faults"] = (f"restore:{kind}@2",)
    return extra


def _draw_deaths(seed: int) -> dict[str, Any]:
    """Instance deaths between checkpoint stages, from their own generator (the draws above
    stay as they were): about a third of the seeds lose one or two instances."""
    rng = random.Random(f"deaths:{seed}")
    if rng.random() >= 0.35:
        return {}
    deaths = tuple((rng.randint(1, 3), rng.choice(HOOK_POINTS))
                   for _ in range(rng.choice((1, 1, 2))))
    return {"stage_deaths": deaths}


# -- reports --------------------------------------------------------------------------------------


@attrs.frozen
class IncarnationReport:
    """How one incarnation (one trainer process's worth of the run) ended.

    ``end``: ``finished`` (dataset done, final snapshot published), ``crashed`` (abandoned by
    the scenario), ``checkpoints_failed`` (exit 4), ``gym_dead`` (every instance dead),
    ``restore_failed`` (Gym could not restore; exit 4), ``replacements_exhausted`` (an
    instance died past its replacement budget; exit 5), or a violation: ``invariant`` (exit 3),
    ``bad_snapshot`` (one of our own snapshots did not load), ``stalled``, ``error``.
    """

    index: int
    faults: tuple[str, ...]
    end: str
    error: str | None
    restored_from: str | None
    checkpoints: tuple[tuple[str, bool, str | None], ...]
    faults_fired: tuple[tuple[str, int], ...]
    steps_trained: int
    claims: int
    lease_reopened: int
    metrics: dict[str, float] = attrs.field(factory=dict)
    """The runtime's metrics when the incarnation ended (C5)."""
    replacements: int = 0
    """Gym instances replaced after they died."""
    hostile_fired: tuple[tuple[str, int], ...] = ()
    """The environment's hostile acts that struck (kind, times)."""


@attrs.frozen
class ScenarioReport:
    seed: int
    scenario: Scenario
    ok: bool
    violations: tuple[str, ...]
    incarnations: tuple[IncarnationReport, ...]
    rows_trained: int
    rows_failed: int
    steps: int
    sentinels: int
    virtual_s: float
    task_steps: int
    fingerprint: str
    rolled_back: bool = False
    """An older snapshot than the latest was restored (``Scenario.rollback``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "violations": list(self.violations),
            "replay": replay_command(self.seed, bool(self.scenario.hostile)),
            "scenario": self.scenario.describe(),
            "incarnations": [
                {"end": i.end, "error": i.error, "restored_from": i.restored_from,
                 "faults": list(i.faults), "faults_fired": [list(f) for f in i.faults_fired],
                 "checkpoints": [list(c) for c in i.checkpoints], "steps": i.steps_trained,
                 "claims": i.claims, "lease_reopened": i.lease_reopened,
                 "hostile_fired": [list(f) for f in i.hostile_fired]}
                for i in self.incarnations
            ],
            "rows_trained": self.rows_trained,
            "rows_failed": self.rows_failed,
            "steps": self.steps,
            "sentinels": self.sentinels,
            "virtual_s": self.virtual_s,
            "fingerprint": self.fingerprint,
        }


# -- running a scenario ---------------------------------------------------------------------------


class _StepBudget(trio.abc.Instrument):
    """Counts task steps; past the budget, cancels the scenario (a livelock in zero time)."""

    def __init__(self, budget: int, scope: trio.CancelScope) -> None:
        self.steps = 0
        self.budget = budget
        self.scope = scope
        self.exceeded = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        if self.steps > self.budget and not self.exceeded:
            self.exceeded = True
            self.scope.cancel()


RUN_SCOPED_TASKS = ("gymckpt: asyncio loop for user code",)
"""System tasks (and what runs under them) that serve the whole trio run by design and end
with it: the Gym host's asyncio loop for user code, opened the first time a host serves."""


def _all_tasks() -> set[trio.lowlevel.Task]:
    """Every task of the trio run but the run-scoped services (``RUN_SCOPED_TASKS``)."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    seen: set[trio.lowlevel.Task] = set()
    stack = [root]
    while stack:
        task = stack.pop()
        if task.name in RUN_SCOPED_TASKS:
            continue
        seen.add(task)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return seen


@attrs.define(eq=False)
class _Run:
    """State of one scenario across its incarnations."""

    sc: Scenario
    root: Path
    rng: random.Random
    workdir: Path
    lineage: list[tuple[int, tuple[int, ...]]] = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)
    reports: list[IncarnationReport] = attrs.field(factory=list)
    final_snapshot: Path | None = None
    rolled_back: bool = False

    def violation(self, inc: int, text: str) -> None:
        self.violations.append(f"incarnation {inc}: {text}")


def _check_released(run: _Run, inc: int, ro: Rollouts) -> None:
    """Whatever ended the incarnation: admission open, pause released, barrier free."""
    gate = ro.coordinator.gate.statistics()
    if not gate.open:
        run.violation(inc, f"admission left closed by {gate.closed_by}")
    if gate.admitting:
        run.violation(inc, f"{gate.admitting} admissions left in progress")
    holders = ro.coordinator.deadlines.holders
    if holders:
        run.violation(inc, f"deadline pause left held by {sorted(holders)}")
    barrier = ro.ledger.barrier.statistics()
    if barrier.held or barrier.waiters or barrier.queued_mutations:
        run.violation(inc, f"barrier left busy: {barrier}")
    if ro.dispatcher.statistics().streams_open:
        run.violation(inc, f"{ro.dispatcher.statistics().streams_open} reply streams left open")


def _check_budgets(
    run: _Run, inc: int, ro: Rollouts, initial_spent: int, checkpoint_calls: int,
    hostile: HostileActs | None = None, initial_data_failures: int = 0,
) -> None:
    stats = ro.ledger.statistics()
    spent = initial_spent + stats.failed_total + stats.abandoned_total - stats.released_total
    if stats.row_attempts_spent != spent:
        run.violation(inc, f"row attempts spent {stats.row_attempts_spent}, but {spent} attempts "
                           "failed or were abandoned (refusals and instance deaths must cost "
                           "nothing)")
    allowed = hostile.data_failures_allowed if hostile is not None else 0
    data_failures = stats.data_failures - initial_data_failures  # a restored ledger's count
    if data_failures > allowed:
        run.violation(inc, f"{data_failures} data failures, but the environment's acts "
                           f"account for at most {allowed} (invalid or poisoned rows, or an "
                           "infrastructure failure charged to the data)")
    refused = ro.metrics.get(ADMISSION_CLOSED_ROWS)
    if refused != ro.dispatcher.statistics().refused:
        run.violation(inc, f"admission-closed metric {refused:g} != refusals "
                           f"{ro.dispatcher.statistics().refused}")
    coord = ro.coordinator.statistics()
    if coord.checkpoints_ok + coord.checkpoints_failed != checkpoint_calls:
        run.violation(inc, f"{checkpoint_calls} checkpoints taken but ok {coord.checkpoints_ok} "
                           f"+ failed {coord.checkpoints_failed}")
    if coord.consecutive_failures > run.sc.max_consecutive_failures:
        run.violation(inc, f"{coord.consecutive_failures} failures in a row were tolerated")
    for att in ro.ledger.reserved():
        if ro.ledger.row_attempts_spent(att.row, att.slot) >= ro.ledger.max_row_attempts:
            run.violation(inc, f"{att.rollout_id} reserved with its row attempts spent")
            break


async def _incarnation(
    run: _Run, inc: int, faults: tuple[str, ...], crash: Crash | None, races: bool = True
) -> IncarnationReport:
    sc = run.sc
    cfg = sc.runtime_config()
    run.final_snapshot = None
    end, error = "finished", None
    restored_from: str | None = None
    outcomes: list[tuple[str, bool, str | None]] = []
    claims: list[tuple[str, RunRow]] = []
    steps = 0
    lease_reopened = 0
    gym_ref: list[EmbeddedGym] = []
    ro_ref: list[Rollouts] = []
    crash_scope = trio.CancelScope()
    if crash is not None and crash.at_s is not None:
        crash_scope.deadline = trio.current_time() + crash.at_s

    checkpoint_ids: list[str] = []  # this incarnation's, in order (ids go on across them)
    acts = HostileActs(sc.hostile, active=races) if sc.hostile else None

    def on_stage(checkpoint_id: str, point: str) -> None:
        if checkpoint_id not in checkpoint_ids:
            checkpoint_ids.append(checkpoint_id)
        n = len(checkpoint_ids)
        if races and (n, point) in sc.stage_drops and gym_ref:
            gym = gym_ref[0]
            live = [name for name in gym.instances if not gym.sim(name).dead]
            if live:  # a stream ends between two checkpoint stages
                gym.sim(live[run.rng.randrange(len(live))]).drop_stream(run.rng.randrange)
        if races and (n, point) in sc.stage_deaths and gym_ref:
            gym = gym_ref[0]
            live = [name for name in gym.instances if not gym.sim(name).dead]
            if live:  # an instance dies between two checkpoint stages
                gym.sim(live[run.rng.randrange(len(live))]).kill()
        if crash is not None and crash.checkpoint == n and point == crash.point:
            crash_scope.cancel()

    async def body() -> None:
        async with _open_gym(sc, run.root / f"gym-{inc}", faults, acts) as gym:
            gym_ref.append(gym)
            backend = cast(GymBackend, _LateEnds(gym, sc.late_end_s)) if sc.late_end_s else gym
            for attempt in (1, 2):
                try:
                    await with_rollouts(gym, backend)
                    return
                except Exception as exc:
                    decided = run_exit(exc)
                    if (ro_ref or attempt == 2 or not sc.restore_retry or decided is None
                            or decided[0] != 4):
                        raise
                    # the restore failed into this Gym; it rolled back, so a restart into
                    # the same Gym must restore cleanly (all-or-nothing across instances)
                    installed_before.update(_installs(await gym.statistics()))

    # restores each instance generation had made when a failed restore rolled back
    installed_before: dict[tuple[str, int], int] = {}

    async def with_rollouts(gym: EmbeddedGym, backend: GymBackend) -> None:
        nonlocal restored_from, steps, lease_reopened
        async with open_rollouts(
            backend, run.workdir, rows=sc.rows, group_size=sc.group_size, config=cfg,
            max_rows_in_flight=sc.max_rows_in_flight, batch_size=sc.batch_size,
            keep_snapshots=sc.keep_snapshots, run_id=f"i{inc}",
            on_dispatch=lambda i, rows: claims.extend((i, r) for r in rows),
            handle_signals=False,  # SIGTERM and Ctrl-C stop the simulation, not a seed's trainer
        ) as ro:
            ro_ref.append(ro)
            replaced_at_open = len((await gym.statistics()).replaced)
            ro.coordinator.on_stage = on_stage
            if ro.restored is not None:  # nothing dispatched yet
                _check_dropped_state_retired(run, inc, gym, ro.restored.files)
            trainer = ToyTrainer()
            if ro.trainer_state is not None:
                trainer = ToyTrainer.from_bytes(ro.trainer_state)
            if ro.restored is not None:
                restored_from = ro.restored.snapshot.checkpoint_id
            # the final model descends from the restored step; later steps died
            run.lineage[:] = [s for s in run.lineage if s[0] <= trainer.step]
            # what Gym installed: the restored manifest's episodes (the dispatcher may
            # already be claiming some, so the ledger's unclaimed set is a moving target)
            replicas: dict[str, str] = {}
            if ro.restored is not None:
                manifest = load_snapshot(ro.restored.pinned.path).manifest
                replicas = {e.rollout_id: e.replica for e in manifest.episodes}
            initial_spent = ro.ledger.statistics().row_attempts_spent
            initial_data = ro.ledger.statistics().data_failures
            initial_failed = len(ro.ledger.rows_failed)  # a restored ledger's
            calls = 0

            async def checkpoint() -> bool:
                nonlocal calls
                calls += 1
                outcome = await ro.checkpoint(trainer.to_bytes())
                outcomes.append((outcome.checkpoint_id, outcome.ok, outcome.reason))
                if outcome.ok and outcome.snapshot is not None:
                    run.final_snapshot = outcome.snapshot.path
                return outcome.ok

            batches = cast(AsyncGenerator[list[CompletedGroup], None],
                           ro.batches(sc.groups_per_step))
            async with aclosing(batches):  # an abort mid-loop must finalise it here
                try:
                    async for batch in batches:
                        rewards = [r.reward for g in batch for r in g.results]
                        trainer = trainer.train(rewards, len(batch))
                        run.lineage.append((trainer.step, tuple(g.row for g in batch)))
                        steps += 1
                        if trainer.step % sc.checkpoint_every == 0:
                            await checkpoint()
                except BudgetExhausted:
                    # the dataset is done, every row failed for good (faults can do that: a
                    # run that hangs every submission): this trainer still leaves a snapshot
                    if ro.ledger.rows_trained or len(ro.ledger.rows_failed) != sc.rows:
                        raise
                    failed_here = len(ro.ledger.rows_failed) - initial_failed
                    if failed_here and not (faults or (races and sc.stage_deaths)
                                            or acts is not None):
                        run.violation(inc, f"{failed_here} rows failed for good without any "
                                           "fault")
            run.final_snapshot = None
            for _ in range(cfg.max_consecutive_failures + 1):
                if await checkpoint():
                    break
            _check_budgets(run, inc, ro, initial_spent, calls, acts, initial_data)
            restored_claims = [(i, r) for i, r in claims if r.restored_from is not None]
            seen = Counter(r.restored_from for _, r in restored_claims)
            refused = ro.metrics.get(ADMISSION_CLOSED_ROWS) > 0
            for rid, n in seen.items():
                if n > 1 and not refused:  # a refused claim is re-sent, same identity (S2)
                    run.violation(inc, f"restored episode {rid} dispatched {n} times")
            for i, r in restored_claims:
                if r.restored_from not in replicas:
                    run.violation(inc, f"{r.rollout_id} claims {r.restored_from}, which was "
                                       "not restored")
                elif replicas[r.restored_from] != i:
                    run.violation(inc, f"{r.rollout_id} dispatched to {i}, but "
                                       f"{r.restored_from} was restored on "
                                       f"{replicas[r.restored_from]}")
            gs = await gym.statistics()
            # counts of instances replaced meanwhile too; installs of those replaced during
            # the restore died with them (their replacements installed again)
            claimed = sum(s.episodes_claimed for s in (*gs.instances, *gs.replaced))
            # an instance a journal fault stopped inside a claim's admission never took it
            # (the attempt is re-sent from scratch): fewer continued than claimed, never more
            stopped = acts is not None and (acts.fired["full_disk"] or acts.fired["torn_record"])
            if claimed > len(seen) or (claimed < len(seen) and not stopped):
                run.violation(inc, f"Gym continued {claimed} restored episodes, the "
                                   f"runtime claimed {len(seen)} (each restored episode "
                                   "continues once)")
            # installs by every instance generation alive at the end or replaced since the
            # open, less what each had installed by a failed restore that rolled back (a
            # generation replaced during the restore is left out on both sides)
            now = _installs(gs)
            counted = _generations(gs)[replaced_at_open:]
            installed = sum(now[g] - installed_before.get(g, 0) for g in counted)
            if installed != len(replicas):
                run.violation(inc, f"Gym installed {installed} restored episodes, the "
                                   f"ledger holds {len(replicas)} unclaimed")
            # Gym is never left parked beyond its lease, whatever the last resume did
            await trio.sleep(sc.lease_s + 1.0)
            for name in gym.instances:
                sim = gym.sim(name)
                if sim.dead:
                    continue
                inv = sim.inventory()
                lease_reopened += inv.lease_reopened
                if inv.prepared or not inv.admission_open:
                    run.violation(inc, f"{name} still parked {sc.lease_s + 1:g}s after the "
                                       "last checkpoint")

    def kill(instance: str) -> None:
        if gym_ref:
            gym_ref[0].sim(instance).kill()

    try:
        with (crash_scope, trio.move_on_after(STALL_S) as stall_scope,
              journal_faults(acts, kill) if acts is not None else nullcontext()):
            await body()
        if crash_scope.cancelled_caught:
            end = "crashed"
        elif stall_scope.cancelled_caught:
            end = "stalled"
            run.violation(inc, f"no progress for {STALL_S:g} virtual seconds")
    except Exception as exc:
        decided = run_exit(exc)
        err = decided[1] if decided is not None else single_error(exc)
        error = f"{type(err).__name__}: {err}"
        if decided is not None and decided[0] == ExitCode.REPLACEMENTS_EXHAUSTED:
            end = "replacements_exhausted"
        elif decided is not None and decided[0] == 4:
            end = "gym_dead" if isinstance(err, GymInstanceDead) else "checkpoints_failed"
            if not ro_ref:  # open_rollouts never yielded: the restore gave up
                end = "restore_failed"
        elif decided is not None and decided[0] == 3:
            end = "invariant"
            run.violation(inc, f"run aborted by an invariant violation: {error}")
        elif decided is not None and decided[0] == 2:
            end = "bad_snapshot"
            run.violation(inc, f"our own snapshot was refused: {error}")
        else:
            end = "error"
            run.violation(inc, f"unexpected error {error}")
    hostile_fired = tuple(sorted(acts.fired.items())) if acts is not None else ()
    if end in ("checkpoints_failed", "gym_dead", "restore_failed",
               "replacements_exhausted") and not faults and not (races and sc.stage_deaths) \
            and not hostile_fired:
        run.violation(inc, f"aborted ({end}) without any fault: {error}")
    if ro_ref:
        _check_released(run, inc, ro_ref[0])
    fired: tuple[tuple[str, int], ...] = ()
    replacements = 0
    if gym_ref:
        fired = gym_ref[0].faults.fired
        replacements = sum(gym_ref[0].replacements(n) for n in gym_ref[0].instances)
    metrics = ro_ref[0].metrics.snapshot(ages=False) if ro_ref else {}  # replayable
    return IncarnationReport(inc, faults, end, error, restored_from, tuple(outcomes), fired,
                             steps, sum(1 for _, r in claims if r.restored_from), lease_reopened,
                             metrics, replacements, hostile_fired)


@asynccontextmanager
async def _open_gym(
    sc: Scenario, work_dir: Path, faults: tuple[str, ...], acts: HostileActs | None
) -> AsyncIterator[EmbeddedGym]:
    """The scenario's embedded Gym: the calendar workplace, or, with hostile acts, the same
    workplace doing them (same instances, agent kinds, seed, config and journal)."""
    if acts is None:
        async with EmbeddedGym.open(
            instances=sc.instances, agent_kinds=sc.kinds(), seed=sc.seed, work_dir=work_dir,
            config=sc.sim_config(), faults=faults,
        ) as gym:
            yield gym
        return
    cfg = sc.sim_config()
    envs = {kind: hostile_calendar_environment(kind, cfg, acts) for kind in set(sc.kinds())}
    kind_of = {f"gym-{i}": kind for i, kind in enumerate(sc.kinds())}

    def make(name: str, *, recover: bool = True) -> GymHost:
        return GymHost(name, envs[kind_of[name]], sc.seed, work_dir, cfg.host_config(),
                       recover=recover)

    hosts = [make(name, recover=False) for name in kind_of]
    async with EmbeddedGym._serving(hosts, FaultPlan(faults), make) as gym:
        yield gym


def _check_dropped_state_retired(
    run: _Run, inc: int, gym: EmbeddedGym, files: dict[str, bytes]
) -> None:
    """Before anything is dispatched after a restore, Gym holds no state of an attempt the
    snapshot's ledger dropped: a replacement dispatched elsewhere would mutate twice."""
    dropped = {item.rollout_id for item in load_ledger_snapshot(files[LEDGER_FILE]).retire}
    for name in gym.instances:
        if gym.sim(name).dead:
            continue
        held = {s.rollout_id for s in calendar_state(gym.sim(name)).values()} & dropped
        if held:
            run.violation(inc, f"after the restore {name} still holds the state of dropped "
                               f"attempts {sorted(held)[:3]}")


class _LateEnd:
    """A reply stream whose end reaches the consumer ``late_s`` after Gym ended it (transport
    latency: on Ray the shielded close of a stream can take seconds)."""

    def __init__(self, inner: ReplyStream, late_s: float) -> None:
        self._inner, self._late_s = inner, late_s

    def __aiter__(self) -> _LateEnd:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            await trio.sleep(self._late_s)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class _LateEnds:
    """The embedded Gym with every stream's end delivered late (``Scenario.late_end_s``)."""

    def __init__(self, gym: EmbeddedGym, late_s: float) -> None:
        self._gym, self._late_s = gym, late_s

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
        return _LateEnd(await self._gym.run(instance, rows), self._late_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gym, name)


def _rollback(run: _Run, inc: int) -> None:
    """Restore an older snapshot next: copy it alone into a fresh work directory."""
    complete = SnapshotStore(run.workdir / SNAPSHOTS_DIR).list_complete()
    if len(complete) < 2:
        return
    chosen = complete[run.rng.randrange(len(complete) - 1)]
    fresh = run.root / f"work-{inc + 1}"
    shutil.copytree(chosen.path, fresh / SNAPSHOTS_DIR / chosen.path.name, symlinks=True)
    run.workdir = fresh
    run.rolled_back = True


def _judge(run: _Run) -> tuple[int, int, int]:
    """The final verdict over the whole scenario: (rows trained, rows failed, sentinels)."""
    sc = run.sc
    if run.final_snapshot is None:
        run.violations.append("no final snapshot: the last incarnation did not finish")
    else:
        problems = _verify_offline(run.final_snapshot)
        if problems:
            run.violations.append(f"final snapshot does not verify: {problems[:3]}")
    judged = judge(run.lineage, sc.rows, run.final_snapshot, seed=sc.seed,
                   config=sc.sim_config(), group_size=sc.group_size)
    run.violations.extend(judged.violations())
    return judged.rows_trained, judged.rows_failed, judged.sentinels_total


def _verify_offline(path: Path) -> list[str]:
    try:
        return snapshot_problems(load_snapshot(path)).all
    except (ManifestError, TopologyMismatch) as exc:
        return [str(exc)]


def _generations(gs: GymStatistics) -> list[tuple[str, int]]:
    """``(instance, generation)`` of every host in ``gs``: the replaced ones in the order they
    were replaced, then the live ones (generation = how many of that name were replaced)."""
    seen: Counter[str] = Counter()
    keys = []
    for s in (*gs.replaced, *gs.instances):
        keys.append((s.instance, seen[s.instance]))
        seen[s.instance] += 1
    return keys


def _installs(gs: GymStatistics) -> dict[tuple[str, int], int]:
    """Restored episodes each host generation in ``gs`` installed (``_generations``' keys)."""
    return {g: s.restored
            for g, s in zip(_generations(gs), (*gs.replaced, *gs.instances), strict=True)}


async def run_scenario(sc: Scenario, root: Path) -> ScenarioReport:
    """Run ``sc`` with its files under ``root`` (which must exist); judge it.

    Needs a trio run whose clock is a ``MockClock`` with autojump (the pytest-trio
    ``autojump_clock`` fixture, or ``run_seed``).
    """
    t0 = trio.current_time()
    tasks_before = _all_tasks()
    run = _Run(sc, root, random.Random(f"gymckpt-simulate:{sc.seed}"), root / "work-0")
    budget_scope = trio.CancelScope()
    budget = _StepBudget(STEP_BUDGET, budget_scope)
    trio.lowlevel.add_instrument(budget)
    try:
        with budget_scope:
            for inc in range(sc.max_incarnations):
                last = inc == sc.max_incarnations - 1
                faults = () if last else sc.faults if inc == 0 else (
                    sc.restore_faults if inc == 1 else ())
                crash = None if last or inc >= len(sc.crashes) else sc.crashes[inc]
                races = not last
                report = await _incarnation(run, inc, faults, crash, races)
                run.reports.append(report)
                if report.end == "finished":
                    break
                if sc.rollback and not run.rolled_back:
                    _rollback(run, inc)
    finally:
        trio.lowlevel.remove_instrument(budget)
    if budget.exceeded:
        run.violations.append(f"livelock: more than {STEP_BUDGET} task steps")
    rows_trained = rows_failed = sentinels = 0
    if not budget.exceeded:
        rows_trained, rows_failed, sentinels = _judge(run)
    leaked = _all_tasks() - tasks_before
    if leaked:
        names = sorted(t.name for t in leaked)
        run.violations.append(f"{len(leaked)} trio tasks left behind: {names[:3]}")
    virtual_s = trio.current_time() - t0
    trace = {
        "lineage": run.lineage,
        "incarnations": [attrs.asdict(r) for r in run.reports],
        "virtual_s": round(virtual_s, 9),
        "violations": run.violations,
    }
    fingerprint = hashlib.sha256(orjson.dumps(trace)).hexdigest()[:16]
    return ScenarioReport(
        seed=sc.seed, scenario=sc, ok=not run.violations, violations=tuple(run.violations),
        incarnations=tuple(run.reports), rows_trained=rows_trained, rows_failed=rows_failed,
        steps=len(run.lineage), sentinels=sentinels, virtual_s=virtual_s,
        task_steps=budget.steps, fingerprint=fingerprint, rolled_back=run.rolled_back,
    )


def run_seed(seed: int, tmp_root: Path | None = None, scenario: Scenario | None = None,
             hostile: bool = False) -> ScenarioReport:
    """Run the scenario of ``seed`` (``hostile``: with the environment's hostile acts) in its
    own trio run under a MockClock; deterministic.

    Seeds trio's scheduler (see the module docstring) and removes the scenario's files after.
    """
    sc = scenario if scenario is not None else draw_scenario(seed, hostile)
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio._core._run._r.seed(seed)
    root = Path(tempfile.mkdtemp(prefix=f"gymckpt-sim-{seed}-", dir=tmp_root))
    try:
        clock = trio.testing.MockClock(autojump_threshold=0)
        try:
            return trio.run(run_scenario, sc, root, clock=clock)
        except Exception as exc:  # the simulator itself broke: report, never hide
            err = single_error(exc)
            return ScenarioReport(
                seed=seed, scenario=sc, ok=False,
                violations=(f"simulator crashed: {type(err).__name__}: {err}",),
                incarnations=(), rows_trained=0, rows_failed=0, steps=0, sentinels=0,
                virtual_s=0.0, task_steps=0, fingerprint="",
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the command ----------------------------------------------------------------------------------


def _fired_summary(fired: Sequence[tuple[str, int]]) -> str:
    counts = Counter(spec for spec, _ in fired)
    return ", ".join(f"{spec} x{n}" if n > 1 else spec for spec, n in counts.items()) or "none"


def main_simulate(seeds: int, start: int, as_json: bool, tmp_root: Path | None = None,
                  progress: Callable[[str], None] | None = None, hostile: bool = False) -> int:
    """``gymckpt simulate``: run seeds ``start .. start+seeds-1`` (``hostile``: with the
    environment's hostile acts, ``--hostile``); exit 0, or 3 on a violation."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if start < 0:
        raise ValueError(f"--start must be >= 0, got {start}")
    tty = sys.stderr.isatty()
    show = progress is not None or not as_json
    every_s = 0.5 if progress is not None or tty else PROGRESS_EVERY_S  # a log file: sparser
    # The seeds' own runs log checkpoint failures, restores and replacements under the
    # ``gymckpt`` logger by design; thousands of them would bury the verdict. The simulation
    # reports them in its own summary instead.
    quiet = logging.NullHandler()
    logging.getLogger("gymckpt").addHandler(quiet)
    try:
        return _simulate_seeds(seeds, start, as_json, tmp_root, progress, show, tty, every_s,
                               hostile)
    finally:
        logging.getLogger("gymckpt").removeHandler(quiet)


def _simulate_seeds(seeds: int, start: int, as_json: bool, tmp_root: Path | None,
                    progress: Callable[[str], None] | None, show: bool, tty: bool,
                    every_s: float, hostile: bool = False) -> int:
    failed: list[ScenarioReport] = []
    ends: Counter[str] = Counter()
    fired = restores = rollbacks = replacements = 0
    struck: Counter[str] = Counter()
    virtual = 0.0
    t0 = time.monotonic()
    last_shown = 0.0
    reports: list[ScenarioReport] = []
    for i, seed in enumerate(range(start, start + seeds)):
        report = run_seed(seed, tmp_root, hostile=hostile)
        for inc in report.incarnations:
            struck.update(dict(inc.hostile_fired))
        ends.update(inc.end for inc in report.incarnations)
        fired += sum(len(inc.faults_fired) for inc in report.incarnations)
        restores += sum(inc.restored_from is not None for inc in report.incarnations)
        rollbacks += report.rolled_back
        replacements += sum(inc.replacements for inc in report.incarnations)
        virtual += report.virtual_s
        if seeds == 1:
            reports.append(report)
        if not report.ok:
            failed.append(report)
            if not as_json:
                print(f"seed {seed}: FAIL: {report.violations[0]}  replay: "
                      f"{replay_command(seed, hostile)}", flush=True)
        now = time.monotonic()
        if show and (now - last_shown > every_s or i == seeds - 1):
            last_shown = now
            rate = (i + 1) / max(now - t0, 1e-9)
            line = (f"simulate: {i + 1}/{seeds} seeds, {len(failed)} failed, "
                    f"{rate:.1f} seeds/s")
            if progress is not None:
                progress(line)
            elif tty:
                print(f"\r{line}", end="\n" if i == seeds - 1 else "", file=sys.stderr,
                      flush=True)
            else:
                print(line, file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0
    rate = seeds / max(elapsed, 1e-9)
    if as_json:
        out: dict[str, Any] = {
            "seeds": seeds, "start": start, "passed": seeds - len(failed),
            "failed": [r.to_json() for r in failed], "elapsed_s": round(elapsed, 3),
            "seeds_per_s": round(rate, 2), "virtual_s": round(virtual, 3),
            "incarnation_ends": dict(sorted(ends.items())), "faults_fired": fired,
            "restores": restores, "rollbacks": rollbacks, "replacements": replacements,
            "hostile": hostile, "hostile_fired": dict(sorted(struck.items())),
        }
        if seeds == 1:
            out["scenario"] = reports[0].to_json()
        print(json.dumps(out, sort_keys=True))
    else:
        if seeds == 1:
            r = reports[0]
            print(f"seed {r.seed}: {r.scenario.describe()}")
            for inc in r.incarnations:
                print(f"  incarnation {inc.index}: {inc.end}"
                      + (f" ({inc.error})" if inc.error else "")
                      + (f", restored {inc.restored_from}" if inc.restored_from else "")
                      + f", {inc.steps_trained} steps, {len(inc.checkpoints)} checkpoints "
                      f"({sum(ok for _, ok, _ in inc.checkpoints)} ok), faults fired "
                      f"{_fired_summary(inc.faults_fired)}"
                      + (", hostile acts " + ", ".join(f"{k} x{n}" for k, n in inc.hostile_fired)
                         if inc.hostile_fired else ""))
            for v in r.violations:
                print(f"  VIOLATION: {v}")
            print(f"  rows trained {r.rows_trained}, failed {r.rows_failed}, steps {r.steps}, "
                  f"sentinels {r.sentinels}, {r.virtual_s:.3f} virtual s, fingerprint "
                  f"{r.fingerprint}")
        print(f"{seeds} seeds from {start}: {seeds - len(failed)} passed, {len(failed)} failed "
              f"in {elapsed:.1f}s ({rate:.1f} seeds/s, {virtual:.0f} virtual s); incarnation "
              f"ends {dict(sorted(ends.items()))}; {fired} faults fired; {restores} restores "
              f"({rollbacks} to an older snapshot); {replacements} instances replaced"
              + (f"; hostile acts struck {dict(sorted(struck.items()))}" if hostile else ""))
        if failed:
            print("failing seeds: " + " ".join(str(r.seed) for r in failed))
    return ExitCode.INVARIANT if failed else ExitCode.OK
