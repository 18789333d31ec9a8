"""What a scenario left: one ``LifeReport`` per trainer life, one
``ScenarioReport`` per seed, and the report's JSON form (``gymckpt simulate --json``).

Reports are plain frozen records, built once a life or a scenario has ended; the
fingerprint of a scenario hashes its lineage, its lives' reports, its virtual time and
its violations, so two runs of a seed are the same run exactly when their fingerprints match.
The JSON form names the lives ``incarnations`` (an output key kept as it was; see ``life``).
"""

from __future__ import annotations

from typing import Any

import attrs

from .scenario import Scenario, replay_command

__all__ = ["LifeReport", "ScenarioReport"]


@attrs.frozen
class LifeReport:
    """How one life (one trainer process's worth of the run) ended.

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
    """The runtime's metrics when the life ended (C5)."""
    replacements: int = 0
    """Gym instances replaced after they died."""
    hostile_fired: tuple[tuple[str, int], ...] = ()
    """The environment's hostile acts that struck (kind, times)."""
    checkpoint_mode: str = "aligned"
    """How its checkpoints took episodes (``CheckpointMode`` value; the scenario's)."""
    episodes_mid_turn: int = 0
    """Episodes its published checkpoints took in the middle of a turn (the sum of
    ``CheckpointOutcome.mid_turn``; always 0 when aligned)."""
    episodes_taken: int = 0
    """Episodes in its published checkpoints (the sum of ``CheckpointOutcome.episodes``)."""

    @property
    def checkpoints_ok(self) -> int:
        return sum(ok for _, ok, _ in self.checkpoints)


@attrs.frozen
class ScenarioReport:
    """The judged run of one seed: ``ok`` when it left no violation."""

    seed: int
    scenario: Scenario
    ok: bool
    violations: tuple[str, ...]
    lives: tuple[LifeReport, ...]
    rows_trained: int
    rows_failed: int
    steps: int
    sentinels: int
    virtual_s: float
    task_steps: int
    fingerprint: str
    rolled_back: bool = False
    """An older snapshot than the latest was restored (``Scenario.rollback``)."""
    usage: tuple[tuple[str, float], ...] = ()
    """What the real-usage dimension exercised (``UsageCounts.summary``; empty when off)."""
    longest_still_s: float = 0.0
    """The longest stretch of virtual time with nothing moving (``ScenarioRun``); not in the
    fingerprint."""
    """What the real-usage dimension exercised (``UsageCounts.summary``; empty when off)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "violations": list(self.violations),
            "replay": replay_command(
                self.seed, bool(self.scenario.hostile), self.scenario.usage.names
            ),
            "scenario": self.scenario.describe(),
            "incarnations": [
                {
                    "end": i.end,
                    "error": i.error,
                    "restored_from": i.restored_from,
                    "faults": list(i.faults),
                    "faults_fired": [list(f) for f in i.faults_fired],
                    "checkpoints": [list(c) for c in i.checkpoints],
                    "steps": i.steps_trained,
                    "claims": i.claims,
                    "lease_reopened": i.lease_reopened,
                    "hostile_fired": [list(f) for f in i.hostile_fired],
                    "checkpoint_mode": i.checkpoint_mode,
                    "episodes_mid_turn": i.episodes_mid_turn,
                    "episodes_taken": i.episodes_taken,
                }
                for i in self.lives
            ],
            "rows_trained": self.rows_trained,
            "rows_failed": self.rows_failed,
            "steps": self.steps,
            "sentinels": self.sentinels,
            "virtual_s": self.virtual_s,
            "checkpoint_mode": self.scenario.checkpoint_mode.value,
            "episodes_mid_turn": self.episodes_mid_turn,
            "fingerprint": self.fingerprint,
            "real_usage": dict(self.usage),
            "longest_still_s": round(self.longest_still_s, 3),
        }

    @property
    def episodes_mid_turn(self) -> int:
        """Episodes the scenario's published checkpoints took mid-turn."""
        return sum(i.episodes_mid_turn for i in self.lives)
