"""The invariants the simulation checks, during and after each life, and the guards of a
whole scenario (a livelock budget in task steps, trio tasks left behind).

Every check reports what it found through ``violation`` (one line naming what differs) and
never raises: a scenario collects every violation, so one seed's report says all that went
wrong. The final verdict over a scenario's lineage and final snapshot is ``verdict.judge``;
what is checked here is what only a running life can see:

* after every life, crashed or not: admission open, the deadline pause released, the
  barrier free, no reply stream left open (``check_released``);
* budgets: every row attempt spent is a failed or abandoned attempt (refusals and instance
  deaths cost nothing), no data failure beyond what the environment's hostile acts account
  for, the checkpoint counters add up and never tolerate more than
  ``max_consecutive_failures`` in a row (``check_budgets``);
* after a restore, before anything is dispatched, no live instance holds the state of an
  attempt the snapshot's ledger dropped (``check_dropped_state_retired``);
* every restored episode dispatched once, on the replica it was restored on
  (``check_restored_claims``); Gym continued each restored episode once and installed exactly
  what the ledger restored (``check_restored_installs``);
* Gym is not left parked beyond its lease (``check_not_parked``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import trio

from gymckpt.gym_adapter import EmbeddedGym, GymStatistics, RunRow
from gymckpt.gym_adapter.environments.calendar import calendar_state
from gymckpt.nurseries import Rollouts
from gymckpt.runtime import ADMISSION_CLOSED_ROWS
from gymckpt.runtime._shared import LEDGER_FILE, load_ledger_snapshot
from gymckpt.testing.hostile import HostileActs

from .gym import generations, installs

__all__ = [
    "RUN_SCOPED_TASKS",
    "StepBudget",
    "Violation",
    "all_tasks",
    "check_budgets",
    "check_dropped_state_retired",
    "check_not_parked",
    "check_released",
    "check_restored_claims",
    "check_restored_installs",
]

Violation = Callable[[str], None]
"""Where a check reports what it found: one line, naming what differs."""


class StepBudget(trio.abc.Instrument):
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


def all_tasks() -> set[trio.lowlevel.Task]:
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


def check_released(violation: Violation, ro: Rollouts) -> None:
    """Whatever ended the life: admission open, pause released, barrier free."""
    gate = ro.coordinator.gate.statistics()
    if not gate.open:
        violation(f"admission left closed by {gate.closed_by}")
    if gate.admitting:
        violation(f"{gate.admitting} admissions left in progress")
    holders = ro.coordinator.deadlines.holders
    if holders:
        violation(f"deadline pause left held by {sorted(holders)}")
    barrier = ro.ledger.barrier.statistics()
    if barrier.held or barrier.waiters or barrier.queued_mutations:
        violation(f"barrier left busy: {barrier}")
    if ro.dispatcher.statistics().streams_open:
        violation(f"{ro.dispatcher.statistics().streams_open} reply streams left open")


def check_budgets(
    violation: Violation,
    ro: Rollouts,
    *,
    max_consecutive_failures: int,
    initial_spent: int,
    checkpoint_calls: int,
    hostile: HostileActs | None = None,
    initial_data_failures: int = 0,
) -> None:
    """The row-attempt, data-failure and checkpoint budgets add up (``initial_*``: what a
    restored ledger had counted already)."""
    stats = ro.ledger.statistics()
    spent = initial_spent + stats.failed_total + stats.abandoned_total - stats.released_total
    if stats.row_attempts_spent != spent:
        violation(
            f"row attempts spent {stats.row_attempts_spent}, but {spent} attempts "
            "failed or were abandoned (refusals, instance deaths and infra failures must "
            "cost nothing)"
        )
    allowed = hostile.data_failures_allowed if hostile is not None else 0
    data_failures = stats.data_failures - initial_data_failures  # a restored ledger's count
    if data_failures > allowed:
        violation(
            f"{data_failures} data failures, but the environment's acts "
            f"account for at most {allowed} (invalid or poisoned rows, or an "
            "infrastructure failure charged to the data)"
        )
    refused = ro.metrics.get(ADMISSION_CLOSED_ROWS)
    if refused != ro.dispatcher.statistics().refused:
        violation(
            f"admission-closed metric {refused:g} != refusals {ro.dispatcher.statistics().refused}"
        )
    coord = ro.coordinator.statistics()
    if coord.checkpoints_ok + coord.checkpoints_failed != checkpoint_calls:
        violation(
            f"{checkpoint_calls} checkpoints taken but ok {coord.checkpoints_ok} "
            f"+ failed {coord.checkpoints_failed}"
        )
    if coord.consecutive_failures > max_consecutive_failures:
        violation(f"{coord.consecutive_failures} failures in a row were tolerated")
    for att in ro.ledger.reserved():
        if ro.ledger.row_attempts_spent(att.row, att.slot) >= ro.ledger.max_row_attempts:
            violation(f"{att.rollout_id} reserved with its row attempts spent")
            break


def check_dropped_state_retired(
    violation: Violation, gym: EmbeddedGym, files: Mapping[str, bytes]
) -> None:
    """Before anything is dispatched after a restore, Gym holds no state of an attempt the
    snapshot's ledger dropped: a replacement dispatched elsewhere would mutate twice."""
    dropped = {item.rollout_id for item in load_ledger_snapshot(files[LEDGER_FILE]).retire}
    for name in gym.instances:
        if gym.sim(name).dead:
            continue
        held = {s.rollout_id for s in calendar_state(gym.sim(name)).values()} & dropped
        if held:
            violation(
                f"after the restore {name} still holds the state of dropped "
                f"attempts {sorted(held)[:3]}"
            )


def check_restored_claims(
    violation: Violation,
    claims: Sequence[tuple[str, RunRow]],
    replicas: Mapping[str, str],
    refused: bool,
) -> Counter[str | None]:
    """Every restored episode dispatched once (``refused``: some claim was refused, and a
    refused claim is re-sent with the same identity, S2), on the replica it was restored on
    (``replicas``: restored episode -> instance). Returns the claims per restored episode."""
    restored_claims = [(i, r) for i, r in claims if r.restored_from is not None]
    seen = Counter(r.restored_from for _, r in restored_claims)
    for rid, n in seen.items():
        if n > 1 and not refused:  # a refused claim is re-sent, same identity (S2)
            violation(f"restored episode {rid} dispatched {n} times")
    for i, r in restored_claims:
        replica = replicas.get(cast(str, r.restored_from))
        if replica is None:
            violation(f"{r.rollout_id} claims {r.restored_from}, which was not restored")
        elif replica != i:
            violation(
                f"{r.rollout_id} dispatched to {i}, but {r.restored_from} was restored on {replica}"
            )
    return seen


def check_restored_installs(
    violation: Violation,
    gs: GymStatistics,
    *,
    claimed_restored: int,
    restored: int,
    journal_stopped: bool,
    replaced_at_open: int,
    installed_before: Mapping[tuple[str, int], int],
) -> None:
    """Gym continued each restored episode once (``claimed_restored`` claimed by the runtime;
    ``journal_stopped``: a journal fault stopped an instance inside a claim's admission) and
    installed exactly the ``restored`` episodes of the restored manifest."""
    # counts of instances replaced meanwhile too; installs of those replaced during
    # the restore died with them (their replacements installed again)
    claimed = sum(s.episodes_claimed for s in (*gs.instances, *gs.replaced))
    # an instance a journal fault stopped inside a claim's admission never took it
    # (the attempt is re-sent from scratch): fewer continued than claimed, never more
    if claimed > claimed_restored or (claimed < claimed_restored and not journal_stopped):
        violation(
            f"Gym continued {claimed} restored episodes, the "
            f"runtime claimed {claimed_restored} (each restored episode "
            "continues once)"
        )
    # installs by every instance generation alive at the end or replaced since the
    # open, less what each had installed by a failed restore that rolled back (a
    # generation replaced during the restore is left out on both sides)
    now = installs(gs)
    counted = generations(gs)[replaced_at_open:]
    installed = sum(now[g] - installed_before.get(g, 0) for g in counted)
    if installed != restored:
        violation(
            f"Gym installed {installed} restored episodes, the ledger holds {restored} unclaimed"
        )


def check_not_parked(violation: Violation, gym: EmbeddedGym, lease_s: float) -> int:
    """No live instance still parked (prepared, or admission closed) once its lease has run
    out; call it ``lease_s`` + 1 s after the last checkpoint. Returns how often the instances'
    leases reopened admission."""
    reopened = 0
    for name in gym.instances:
        sim = gym.sim(name)
        if sim.dead:
            continue
        inv = sim.inventory()
        reopened += inv.lease_reopened
        if inv.prepared or not inv.admission_open:
            violation(f"{name} still parked {lease_s + 1:g}s after the last checkpoint")
    return reopened
