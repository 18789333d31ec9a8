"""Where each SIGKILL of a seed's run lands: a seeded plan, drawn before the run starts.

Kill ``k`` of seed ``s`` is drawn from ``random.Random("gymckpt-chaos:s")`` as one of:

* ``anytime``: a moment uniform over the uninterrupted run's wall time after the start (mid-turn,
  mid-step, inside a checkpoint: wherever the program is then); when the program armed its kill
  points, uniform from that moment (its start-up and restore done) to its end instead. When the
  uninterrupted run marked its checkpoints, the moment is anchored to the program's progress
  rather than the clock: a delay after the program armed its kill points, or after it ended one
  of its checkpoints that another follows (``before_resume@N``; after a restart, or when more
  kills follow, ``N`` from the first half), uniform over the time the uninterrupted run took
  from that mark to its next checkpoint, so the kill lands mid-run however fast or slow the
  machine runs that day (a plan against the wall clock alone misses when the run goes faster
  than the uninterrupted one did);
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
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["ARMED_ANCHOR", "FIRST_STAGE", "LAST_STAGE", "Kill", "anchors", "plan_kills"]

ARMED_ANCHOR = "armed"
"""The anchor of a timed kill counted from the moment the program armed its kill points."""
TINY_SPAN = 0.2
"""An anchor whose span is under this fraction of the typical one is not used."""
FIRST_STAGE = "before_prepare"
"""The first stage a checkpoint passes."""
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


def anchors(
    armed_s: float | None, mark_times: Mapping[tuple[str, int], float]
) -> list[tuple[int, float]]:
    """Where an anchored kill may count from, with the time the uninterrupted run took from
    there to its next checkpoint: ``(0, gap)`` for the armed moment, ``(N, gap)`` for the end
    of checkpoint ``N`` when a checkpoint ``N + 1`` followed it. Empty without marks."""
    first = FIRST_STAGE
    found: list[tuple[int, float]] = []
    if armed_s is not None and (first, 1) in mark_times:
        found.append((0, mark_times[(first, 1)] - armed_s))
    for (stage, n), t in sorted(mark_times.items(), key=lambda item: item[1]):
        if stage == LAST_STAGE and (first, n + 1) in mark_times:
            found.append((n, mark_times[(first, n + 1)] - t))
    return [(n, gap) for n, gap in found if gap > 0]


def plan_kills(
    seed: int,
    kills: int,
    baseline_s: float,
    marks: Sequence[tuple[str, int]],
    armed_s: float | None = None,
    mark_times: Mapping[tuple[str, int], float] | None = None,
) -> tuple[random.Random, list[Kill]]:
    """The generator of ``seed`` (for the victims, drawn later) and its ``kills`` kills, from
    the uninterrupted run's wall time, stage marks (with the moment each appeared, when known)
    and armed moment."""
    ready = min(armed_s, baseline_s) if armed_s is not None else 0.0
    restoring = armed_s if armed_s is not None else AFTER_RESTART_FRACTION * baseline_s
    restart_window = restoring + AFTER_RESTART_FRACTION * (baseline_s - ready)
    rng = random.Random(f"gymckpt-chaos:{seed}")
    points = sorted(set(marks), key=lambda m: (m[1], m[0]))
    early = [m for m in points if m[1] <= max(1, max((n for _, n in points), default=1) // 2)]
    spans = anchors(armed_s, mark_times or {})
    plan: list[Kill] = []
    for k in range(kills):
        kinds = ["anytime"] + (["after_restart"] if k else []) + (["stage"] if points else [])
        kind = rng.choice(kinds)
        if kind == "stage":
            stage, n = rng.choice(points if k == 0 else early)
            plan.append(Kill(kind, stage=f"{stage}@{n}"))
        elif kind == "after_restart":
            plan.append(Kill(kind, delay_s=rng.uniform(0.0, restart_window)))
        elif spans:
            plan.append(_anchored(rng, kind, spans, first=k == 0, more=k + 1 < kills))
        else:
            plan.append(Kill(kind, delay_s=rng.uniform(ready, baseline_s)))
    return rng, plan


def _anchored(
    rng: random.Random, kind: str, spans: list[tuple[int, float]], first: bool, more: bool
) -> Kill:
    """A timed kill a delay after one of ``spans``' anchors, uniform over its span. Spans far
    shorter than the typical one (a final checkpoint right after the last periodic one) are
    left out; a kill after a restart, or a first kill that more kills follow, counts from the
    armed moment or a checkpoint of the first half, so a restarted program (resumed from its
    last snapshot, its checkpoints counted from 1 again) still runs when the next kill comes."""
    last = max(n for n, _ in spans)
    typical = sorted(g for _, g in spans)[len(spans) // 2]
    spans = [(n, g) for n, g in spans if g >= TINY_SPAN * typical] or spans
    half = [(n, g) for n, g in spans if n <= max(1, (last + 1) // 2)]
    usable = half if not first or more else spans
    n, gap = rng.choice(usable)
    after = ARMED_ANCHOR if n == 0 else f"{LAST_STAGE}@{n}"
    return Kill(kind, delay_s=rng.uniform(0.0, gap), after=after)
