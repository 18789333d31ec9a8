"""Where each SIGKILL of a seed's run lands: a seeded plan, drawn before the run starts.

Kill ``k`` of seed ``s`` is drawn from ``random.Random("gymckpt-chaos:s")`` as one of:

* ``anytime``: a moment uniform over the uninterrupted run's wall time after the start (mid-turn,
  mid-step, inside a checkpoint: wherever the program is then); when the program armed its kill
  points, uniform from that moment (its start-up and restore done) to its end instead;
* ``after_restart`` (not for the first kill): a moment uniform over the start-up and restore
  (until the armed moment, or the first quarter of the run's time) plus a quarter of the rest,
  which is when a restarted program restores and resumes;
* ``stage`` (when the uninterrupted run printed stage marks, see ``points``): the program kills
  itself at a checkpoint stage it reached in the uninterrupted run, ``STAGE@N`` (a restarted
  program counts its checkpoints from 1 again, so after a restart ``N`` is drawn from the first
  half of them). A stage the restarted program never reaches is a kill that did not land.

The victim of a timed kill is drawn from the same generator (``Start.kill``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

__all__ = ["Kill", "plan_kills"]

AFTER_RESTART_FRACTION = 0.25
"""An ``after_restart`` kill lands within this fraction of the uninterrupted run's time."""


@attrs.frozen
class Kill:
    """One planned SIGKILL: ``delay_s`` after its start (timed), or at ``stage`` (``STAGE@N``,
    the program's own kill point)."""

    kind: str
    delay_s: float | None = None
    stage: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.stage}" if self.stage else f"{self.kind} +{self.delay_s:.3f}s"


def plan_kills(
    seed: int,
    kills: int,
    baseline_s: float,
    marks: Sequence[tuple[str, int]],
    armed_s: float | None = None,
) -> tuple[random.Random, list[Kill]]:
    """The generator of ``seed`` (for the victims, drawn later) and its ``kills`` kills, from
    the uninterrupted run's wall time, stage marks and armed moment."""
    ready = min(armed_s, baseline_s) if armed_s is not None else 0.0
    restoring = armed_s if armed_s is not None else AFTER_RESTART_FRACTION * baseline_s
    restart_window = restoring + AFTER_RESTART_FRACTION * (baseline_s - ready)
    rng = random.Random(f"gymckpt-chaos:{seed}")
    points = sorted(set(marks), key=lambda m: (m[1], m[0]))
    early = [m for m in points if m[1] <= max(1, max((n for _, n in points), default=1) // 2)]
    plan: list[Kill] = []
    for k in range(kills):
        kinds = ["anytime"] + (["after_restart"] if k else []) + (["stage"] if points else [])
        kind = rng.choice(kinds)
        if kind == "stage":
            stage, n = rng.choice(points if k == 0 else early)
            plan.append(Kill(kind, stage=f"{stage}@{n}"))
        elif kind == "after_restart":
            plan.append(Kill(kind, delay_s=rng.uniform(0.0, restart_window)))
        else:
            plan.append(Kill(kind, delay_s=rng.uniform(ready, baseline_s)))
    return rng, plan
