"""Running one scenario: its lives in one trio run, then its verdict (``run_scenario``);
one seed in a trio run of its own, deterministic (``run_seed``).

A scenario runs at most ``Scenario.max_lives`` lives: the first with the
scenario's faults, the second with its restore faults, the last without faults, crashes or
races, so every scenario must end with the whole dataset judged. After a crash or a documented
abort, the next life restores the latest complete snapshot (after the first one, with
``rollback``, an older one). With a live restart (``RealUsage.live_restart``) the first
life's Gym is opened here, outside its cancel scope, so its crash leaves the Gym running
for the second life to restore into; it is closed when the second ends. The whole
scenario is bounded by a budget of task steps
(``STEP_BUDGET``: a livelock spins in zero virtual time, which no stall budget sees), and must
leave no trio task behind.

Determinism (each seed replays exactly)
---------------------------------------
* Time: ``trio.testing.MockClock(autojump_threshold=0)``; ``offload`` runs inline under a
  MockClock, so no thread and no wall-clock time enters the run.
* Scheduling: ``determinism.deterministic_scheduling`` (a guarded use of trio's private
  scheduler switch; it refuses a trio it was not written for).
* String hashing: set iteration order of strings depends on ``PYTHONHASHSEED``; the CLI
  re-executes itself with ``PYTHONHASHSEED=0`` so a replay in another process sees the same
  order. (In-process callers get determinism within the process.)
* Everything random in a scenario comes from ``random.Random`` seeded with the seed.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import attrs
import orjson
import trio
import trio.testing

from gymckpt.testing.hostile import HostileActs

from .checks import StepBudget, all_tasks
from .determinism import deterministic_scheduling
from .ends import LifeEnd, single_error
from .gym import open_gym
from .life import TrainerLife
from .reports import ScenarioReport
from .scenario import Scenario, draw_scenario
from .state import LiveGym, ScenarioRun, judge_scenario

__all__ = ["STEP_BUDGET", "run_scenario", "run_seed"]

STEP_BUDGET = 3_000_000
"""Task steps a scenario may take before it counts as a livelock (zero virtual time spin)."""


def _life_faults(sc: Scenario, index: int) -> tuple[str, ...]:
    """Gym faults of life ``index``: the scenario's, then its restore faults, then none
    (and none in the last)."""
    if index == sc.max_lives - 1:
        return ()
    return sc.faults if index == 0 else sc.restore_faults if index == 1 else ()


def _live_restart(sc: Scenario) -> bool:
    """The first life's Gym outlives it (never into the last life)."""
    return sc.usage.live_restart and sc.max_lives > 2


async def run_scenario(sc: Scenario, root: Path) -> ScenarioReport:
    """Run ``sc`` with its files under ``root`` (which must exist); judge it.

    Needs a trio run whose clock is a ``MockClock`` with autojump (the pytest-trio
    ``autojump_clock`` fixture, or ``run_seed``).
    """
    t0 = trio.current_time()
    tasks_before = all_tasks()
    run = ScenarioRun(sc, root, random.Random(f"gymckpt-simulate:{sc.seed}"), root / "work-0")
    run.t0 = t0
    budget_scope = trio.CancelScope()
    budget = StepBudget(STEP_BUDGET, budget_scope)
    trio.lowlevel.add_instrument(budget)
    try:
        with budget_scope:
            async with AsyncExitStack() as live_gym:
                for index in range(sc.max_lives):
                    last = index == sc.max_lives - 1
                    crash = None if last or index >= len(sc.crashes) else sc.crashes[index]
                    faults = _life_faults(sc, index)
                    if run.live is not None:  # restored into the previous Gym: its faults
                        faults = run.live.faults
                    if index == 0 and _live_restart(sc):
                        acts = HostileActs(sc.hostile) if sc.hostile else None
                        usage = (run.counts, run.t0)
                        gym = await live_gym.enter_async_context(
                            open_gym(sc, root / "gym-0", faults, acts, usage)
                        )
                        run.live = LiveGym(gym, acts, faults)
                    life = TrainerLife(run, index, faults, crash, not last)
                    report = await life.run_to_end()
                    run.reports.append(report)
                    if run.live is not None and (index > 0 or report.end != LifeEnd.CRASHED):
                        run.live = None
                        await live_gym.aclose()
                    if report.end == LifeEnd.FINISHED:
                        break
                    if sc.rollback and not run.rolled_back:
                        run.rollback(index)
    finally:
        trio.lowlevel.remove_instrument(budget)
    if budget.exceeded:
        run.violations.append(f"livelock: more than {STEP_BUDGET} task steps")
    rows_trained = rows_failed = sentinels = 0
    if not budget.exceeded:
        rows_trained, rows_failed, sentinels = judge_scenario(run)
    leaked = all_tasks() - tasks_before
    if leaked:
        names = sorted(t.name for t in leaked)
        run.violations.append(f"{len(leaked)} trio tasks left behind: {names[:3]}")
    virtual_s = trio.current_time() - t0
    trace: dict[str, object] = {
        "lineage": run.lineage,
        "incarnations": [attrs.asdict(r) for r in run.reports],
        "virtual_s": round(virtual_s, 9),
        "violations": run.violations,
    }
    exercised = run.counts.summary(sc.usage) if sc.usage.names else ()
    if exercised:
        trace["usage"] = exercised
    fingerprint = hashlib.sha256(orjson.dumps(trace)).hexdigest()[:16]
    return ScenarioReport(
        seed=sc.seed,
        scenario=sc,
        ok=not run.violations,
        violations=tuple(run.violations),
        lives=tuple(run.reports),
        rows_trained=rows_trained,
        rows_failed=rows_failed,
        steps=len(run.lineage),
        sentinels=sentinels,
        virtual_s=virtual_s,
        task_steps=budget.steps,
        fingerprint=fingerprint,
        rolled_back=run.rolled_back,
        usage=exercised,
        longest_still_s=run.longest_still_s,
    )


def run_seed(
    seed: int,
    tmp_root: Path | None = None,
    scenario: Scenario | None = None,
    hostile: bool = False,
    usage: frozenset[str] = frozenset(),
) -> ScenarioReport:
    """Run the scenario of ``seed`` (``hostile``: with the environment's hostile acts;
    ``usage``: the real-usage sub-dimensions drawn, of module ``usage``) in its own trio run under a
    MockClock; deterministic.

    Schedules trio's tasks as a function of the seed (``deterministic_scheduling``, which
    raises ``SchedulingHookUnavailable`` on a trio it was not written for) and removes the
    scenario's files after.
    """
    sc = scenario if scenario is not None else draw_scenario(seed, hostile, usage)
    with deterministic_scheduling(seed):
        root = Path(tempfile.mkdtemp(prefix=f"gymckpt-sim-{seed}-", dir=tmp_root))
        try:
            clock = trio.testing.MockClock(autojump_threshold=0)
            try:
                return trio.run(run_scenario, sc, root, clock=clock)
            except Exception as exc:  # the simulator itself broke: report, never hide
                err = single_error(exc)
                return ScenarioReport(
                    seed=seed,
                    scenario=sc,
                    ok=False,
                    violations=(f"simulator crashed: {type(err).__name__}: {err}",),
                    lives=(),
                    rows_trained=0,
                    rows_failed=0,
                    steps=0,
                    sentinels=0,
                    virtual_s=0.0,
                    task_steps=0,
                    fingerprint="",
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)
