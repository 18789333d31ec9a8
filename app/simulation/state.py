"""The state of one scenario across its lives (``ScenarioRun``), and its final verdict.

Lives come and go; what outlives them is here: the lineage of the final model (the
trained steps the latest restore kept), the work directory the next life restores
from (a fresh one after a rollback), the latest published snapshot, and every violation found
so far. ``judge_scenario`` judges the whole scenario once the last life has ended.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import attrs

from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.nurseries import snapshot_problems
from gymckpt.runtime import ManifestError, SnapshotStore, TopologyMismatch, load_snapshot
from gymckpt.runtime._shared import SNAPSHOTS_DIR, TERM_FILE, RowOrder
from gymckpt.testing.hostile import HostileActs

from ..verdict import judge
from .reports import LifeReport
from .scenario import Scenario
from .usage_env import UsageCounts

__all__ = ["LiveGym", "ScenarioRun", "judge_scenario", "verify_offline"]


@attrs.frozen
class LiveGym:
    """A Gym that outlives the life that opened it (``RealUsage.live_restart``): the
    next life restores into it while it still runs the dead one's episodes. ``acts``:
    the hostile acts its environment does, ``faults`` its fault schedule (the opening
    life's)."""

    gym: EmbeddedGym
    acts: HostileActs | None
    faults: tuple[str, ...]


@attrs.define(eq=False)
class ScenarioRun:
    """State of one scenario across its lives."""

    sc: Scenario
    root: Path
    rng: random.Random
    """The scenario's own draws while it runs (which instance a race strikes, which older
    snapshot a rollback restores): seeded from the seed, consumed in scheduling order."""
    workdir: Path
    lineage: list[tuple[int, tuple[int, ...]]] = attrs.field(factory=list)
    """``(step, positions)`` of every step in the final model's lineage, in order (a position
    is a row in the default order; ``RowOrder``)."""
    rows_of: dict[int, int] = attrs.field(factory=dict)
    """position -> the dataset row its trained group said it trained (``CompletedGroup.row``),
    for every group any life trained."""
    violations: list[str] = attrs.field(factory=list)
    reports: list[LifeReport] = attrs.field(factory=list)
    final_snapshot: Path | None = None
    """The snapshot the current life published last (None until it published one)."""
    rolled_back: bool = False
    t0: float = 0.0
    """When the scenario started, in trio's clock (the real-usage outage window counts from
    it)."""
    counts: UsageCounts = attrs.field(factory=UsageCounts)
    """What the real-usage dimension exercised (every life)."""
    live: LiveGym | None = None
    longest_still_s: float = 0.0
    """The longest stretch of virtual time any life spent with nothing moving
    (``Liveness.longest_still_s``): what the liveness bound must stay far above."""
    """The Gym the current life runs on when it outlives it (a live restart)."""

    def violation(self, index: int, text: str) -> None:
        self.violations.append(f"incarnation {index}: {text}")

    def rollback(self, index: int) -> None:
        """Restore an older snapshot next: copy it, with the run's lineage (``TERM_FILE``), alone
        into a fresh work directory (with fewer than two complete snapshots, the latest is
        restored as usual)."""
        complete = SnapshotStore(self.workdir / SNAPSHOTS_DIR).list_complete()
        if len(complete) < 2:
            return
        chosen = complete[self.rng.randrange(len(complete) - 1)]
        fresh = self.root / f"work-{index + 1}"
        shutil.copytree(chosen.path, fresh / SNAPSHOTS_DIR / chosen.path.name, symlinks=True)
        # the same run, rolled back: its lineage goes along (a Gym still running it, a live
        # restart's, takes the rolled-back trainer as the next term, not as another run)
        shutil.copy2(self.workdir / TERM_FILE, fresh / TERM_FILE)
        self.workdir = fresh
        self.rolled_back = True


def judge_scenario(run: ScenarioRun) -> tuple[int, int, int]:
    """The final verdict over the whole scenario, its violations added to ``run``:
    (positions trained, positions failed, sentinels). With a drawn order (``RowOrder``) every
    position once, each epoch's positions covering its rows once each, and each trained group
    on the row the order puts at its position."""
    sc = run.sc
    if run.final_snapshot is None:
        run.violations.append("no final snapshot: the last incarnation did not finish")
    else:
        problems = verify_offline(run.final_snapshot)
        if problems:
            run.violations.append(f"final snapshot does not verify: {problems[:3]}")
    usage_order = sc.usage.order
    row_at = None
    if usage_order is not None:
        order = RowOrder.of(
            usage_order.rows,
            None,
            epochs=usage_order.epochs,
            shuffle_seed=usage_order.shuffle_seed,
        )
        row_at = order.row_at
        wrong = sorted(p for p, row in run.rows_of.items() if row != row_at(p))
        if wrong:
            run.violations.append(
                f"{len(wrong)} trained groups name another row than their position's: "
                f"{[(p, run.rows_of[p], row_at(p)) for p in wrong[:3]]}"
            )
    judged = judge(
        run.lineage,
        sc.positions,
        run.final_snapshot,
        seed=sc.seed,
        config=sc.sim_config(),
        group_size=sc.group_size,
        row_at=row_at,
        per_epoch=usage_order.rows if usage_order is not None else None,
    )
    run.violations.extend(judged.violations())
    return judged.rows_trained, judged.rows_failed, judged.sentinels_total


def verify_offline(path: Path) -> list[str]:
    """What ``gymckpt verify`` finds wrong with the snapshot at ``path`` (empty: nothing)."""
    try:
        return snapshot_problems(load_snapshot(path)).all
    except (ManifestError, TopologyMismatch) as exc:
        return [str(exc)]
