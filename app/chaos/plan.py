"""Where each SIGKILL of a seed's run lands: a seeded plan, drawn before the run starts.

Kill ``k`` of seed ``s`` is drawn from ``random.Random("gymckpt-chaos:s")`` as one of:

* ``anytime``: a moment uniform over the uninterrupted run's wall time after the start (mid-turn,
  mid-step, inside a checkpoint: wherever the program is then); when the program armed its kill
  points, uniform from that moment (its start-up and restore done) to its end instead. When the
  uninterrupted run marked its checkpoints, the moment is anchored to the program's progress
  rather than the clock: a delay uniform over one checkpoint interval (the run's time after
  arming, divided by its checkpoints) after the program armed its kill points or after it ended
  one of its checkpoints but the last (``before_resume@N``; after a restart ``N`` from the first
  half), so the kill lands mid-run however fast or slow the machine runs that day (a plan
  against the wall clock alone misses when the run goes faster than the uninterrupted one did);
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

__all__ = ["ARMED_ANCHOR", "LAST_STAGE", "Kill", "plan_kills"]

ARMED_ANCHOR = "armed"
"""The anchor of a timed kill counted from the moment the program armed its kill points."""
LAST_STAGE = "before_resume"
"""The last stage a checkpoint passes: an anchored kill counts from one's end."""
AFTER_RESTART_FRACTION = 0.25
"""An ``after_restart`` kill lands within this fraction of the uninterrupted run's time."""


@attrs.frozen
class Kill:
    """One planned SIGKILL: ``delay_s`` after its start (timed), or at ``stage`` (``STAGE@N``,
    the program's own kill point)."""

    kind: str
    delay_s: float | None = None
    stage: str | None = None
    after: str | None = None
    """A timed kill's anchor: ``ARMED`` or ``STAGE@N``; its delay counts from the moment the
    program printed that mark (None: from its start)."""

    def describe(self) -> str:
        if self.stage:
            return f"{self.kind} {self.stage}"
        anchor = f" after {self.after}" if self.after else ""
        return f"{self.kind}{anchor} +{self.delay_s:.3f}s"


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
    ends = sorted({n for stage, n in points if stage == LAST_STAGE})
    plan: list[Kill] = []
    for k in range(kills):
        kinds = ["anytime"] + (["after_restart"] if k else []) + (["stage"] if points else [])
        kind = rng.choice(kinds)
        if kind == "stage":
            stage, n = rng.choice(points if k == 0 else early)
            plan.append(Kill(kind, stage=f"{stage}@{n}"))
        elif kind == "after_restart":
            plan.append(Kill(kind, delay_s=rng.uniform(0.0, restart_window)))
        elif ends:
            plan.append(_anchored(rng, kind, ends, baseline_s - ready, first=k == 0))
        else:
            plan.append(Kill(kind, delay_s=rng.uniform(ready, baseline_s)))
    return rng, plan


def _anchored(rng: random.Random, kind: str, ends: list[int], run_s: float, first: bool) -> Kill:
    """A timed kill a delay (uniform over one checkpoint interval) after the program armed or
    after the end of one of its checkpoints but the last (after a restart: the first half)."""
    usable = ends[:-1] if first else [n for n in ends[:-1] if n <= max(1, len(ends) // 2)]
    n = rng.choice([0, *usable])
    after = ARMED_ANCHOR if n == 0 else f"{LAST_STAGE}@{n}"
    return Kill(kind, delay_s=rng.uniform(0.0, run_s / len(ends)), after=after)
