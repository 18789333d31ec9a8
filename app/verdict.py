"""The exactly-once judge shared by the demo and the simulation: from files only.

A run is exactly once when every position of its row order was trained once or failed for good
(never both, never lost), every training step appears once in the lineage, and the committed
environment state holds every sentinel the trained positions' episodes call for exactly once (a
sentinel twice is an environment mutation repeated by a restore; one missing is a mutation
lost). A position is a row in the default order (every row once, ascending); a run of several
epochs trains each dataset row once per epoch, each time at a position of its own (``row_at``
says which row; its sentinels are the position's, ``calendar.sentinel``), and each epoch's
positions must cover its rows once each. The lineage is what the trainer kept: ``(step,
positions)`` pairs, after any rollback to a restored step. The final snapshot gives the
positions failed for good (its ledger) and the sentinels (its committed calendar records).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs

from gymckpt.gym_adapter.environments.calendar import CalendarConfig, plan_episode, sentinel
from gymckpt.runtime import load_snapshot
from gymckpt.runtime._shared import (
    LEDGER_FILE,
    SessionRecords,
    load_ledger_snapshot,
    read_snapshot_records,
)

__all__ = ["ExactlyOnce", "expected_sentinels", "judge", "snapshot_sentinels"]

SAMPLE = 5


@attrs.frozen
class ExactlyOnce:
    """What the judge found; ``ok`` is the verdict, ``violations()`` says why not."""

    rows: int
    rows_trained: int
    rows_failed: int
    duplicates: int
    """Extra trainings of rows trained more than once (0 when exactly once)."""
    rows_twice: tuple[int, ...]
    lost: tuple[int, ...]
    trained_and_failed: tuple[int, ...]
    steps: int
    steps_trained_twice: int
    steps_in_order: bool
    """The lineage's steps are exactly 1..n."""
    sentinels_expected: int
    sentinels_total: int
    sentinels_missing: tuple[str, ...]
    sentinels_twice: tuple[str, ...]
    rows_twice_in_epoch: tuple[int, ...] = ()
    """Dataset rows that two positions of one epoch trained (or failed): an order that is not
    a permutation of the rows each epoch."""

    @property
    def ok(self) -> bool:
        return not (
            self.duplicates
            or self.lost
            or self.trained_and_failed
            or self.steps_trained_twice
            or self.sentinels_missing
            or self.sentinels_twice
            or self.rows_twice_in_epoch
        )

    def violations(self) -> list[str]:
        """One line per kind of violation, with a short sample."""
        out: list[str] = []
        if not self.steps_in_order:
            out.append(
                f"lineage steps are not 1..n once each (trained twice: {self.steps_trained_twice})"
            )
        if self.rows_twice:
            out.append(
                f"{len(self.rows_twice)} rows trained more than once: "
                f"{list(self.rows_twice[:SAMPLE])}"
            )
        if self.trained_and_failed:
            out.append(f"rows both trained and failed: {list(self.trained_and_failed[:SAMPLE])}")
        if self.rows_twice_in_epoch:
            out.append(
                f"{len(self.rows_twice_in_epoch)} dataset rows at two positions of one epoch: "
                f"{list(self.rows_twice_in_epoch[:SAMPLE])}"
            )
        if self.lost:
            out.append(f"{len(self.lost)} rows lost: {list(self.lost[:SAMPLE])}")
        if self.sentinels_missing:
            out.append(
                f"{len(self.sentinels_missing)} sentinels missing: "
                f"{list(self.sentinels_missing[:3])}"
            )
        if self.sentinels_twice:
            out.append(
                f"{len(self.sentinels_twice)} sentinels more than once: "
                f"{list(self.sentinels_twice[:3])}"
            )
        return out


def judge(
    lineage: Sequence[tuple[int, Sequence[int]]],
    rows: int,
    final_snapshot: Path | None,
    *,
    seed: int,
    config: CalendarConfig,
    group_size: int,
    calendar: bool = True,
    row_at: Callable[[int], int] | None = None,
    per_epoch: int | None = None,
) -> ExactlyOnce:
    """Judge a run from its lineage and final snapshot (None: no failed rows, no sentinels).
    ``rows``: the positions of the run's order; ``row_at``: the dataset row a position trains
    (None: the position itself, the default order), ``per_epoch`` the rows an epoch (None: all
    ``rows``). Without ``calendar`` (an environment that keeps no calendar) sentinels are not
    judged."""
    steps = [s for s, _ in lineage]
    step_counts = Counter(steps)
    row_counts = Counter(r for _, rs in lineage for r in rs)
    sentinel_counts: Counter[str] = Counter()
    failed: set[int] = set()
    if final_snapshot is not None:
        sentinel_counts, failed = snapshot_sentinels(final_snapshot, calendar=calendar)
    trained = set(row_counts)
    expected = (
        expected_sentinels(seed, config, trained, group_size, row_at=row_at) if calendar else set()
    )
    twice_in_epoch: set[int] = set()
    if row_at is not None:
        k = per_epoch if per_epoch is not None else rows
        seen: set[tuple[int, int]] = set()
        for position in sorted(trained | failed):
            key = (position // max(1, k), row_at(position))
            if key in seen:
                twice_in_epoch.add(key[1])
            seen.add(key)
    return ExactlyOnce(
        rows=rows,
        rows_trained=len(trained),
        rows_failed=len(failed),
        duplicates=sum(c - 1 for c in row_counts.values() if c > 1),
        rows_twice=tuple(sorted(r for r, c in row_counts.items() if c > 1)),
        lost=tuple(sorted(set(range(rows)) - trained - failed)),
        trained_and_failed=tuple(sorted(trained & failed)),
        steps=len(step_counts),
        steps_trained_twice=sum(c - 1 for c in step_counts.values() if c > 1),
        steps_in_order=steps == list(range(1, len(steps) + 1)),
        sentinels_expected=len(expected),
        sentinels_total=sum(sentinel_counts[s] for s in expected),
        sentinels_missing=tuple(sorted(expected - set(sentinel_counts))),
        sentinels_twice=tuple(sorted(s for s in expected if sentinel_counts.get(s, 0) > 1)),
        rows_twice_in_epoch=tuple(sorted(twice_in_epoch)),
    )


def snapshot_sentinels(path: Path, *, calendar: bool = True) -> tuple[Counter[str], set[int]]:
    """(every sentinel in the snapshot's committed environment state with its count, the
    positions the snapshot's ledger failed for good). Without ``calendar`` only the failed rows."""
    snap = load_snapshot(path)
    led = load_ledger_snapshot(snap.files[LEDGER_FILE])
    failed_rows: set[int] = set()
    for first, last in led.failed:
        failed_rows.update(range(first, last + 1))
    sentinel_counts: Counter[str] = Counter()
    for inst in snap.manifest.instances if calendar else ():
        for part in inst.participants:
            if part.kind != "environment":
                continue
            records = read_snapshot_records(snap.path, part.state_dir, SessionRecords)
            for sess in records.sessions:  # the calendar's state: its events, each a sentinel
                sentinel_counts.update(e["sentinel"] for e in sess.state["events"])
    return sentinel_counts, failed_rows


def expected_sentinels(
    seed: int,
    config: CalendarConfig,
    positions: Iterable[int],
    group_size: int,
    *,
    row_at: Callable[[int], int] | None = None,
) -> set[str]:
    """Every sentinel the plans of these positions' episodes call for (one per mutating turn):
    the plan is the dataset row's (``row_at``; None: the position is the row), the sentinel
    the position's."""
    expected: set[str] = set()
    for position in positions:
        row = position if row_at is None else row_at(position)
        for slot in range(group_size):
            plan = plan_episode(seed, row, slot, config)
            expected.update(sentinel(position, slot, t) for t, m in enumerate(plan.mutates) if m)
    return expected
