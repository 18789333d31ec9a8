"""The ledger's snapshot and restore: writing ``ledger.json`` from the columns, and the restore
rules that build a ledger's columns back from it.

The file itself — ``LedgerSnapshot``, its ``AttemptRow`` arrays, ``LEDGER_SNAPSHOT_VERSION``
and the strict JSON form — is defined with every other record on disk in ``_snapshot_format``
(re-exported here). A ledger at a cut holds its settings and counters, the rows trained and
failed as ranges, the attempts spent of the rows in flight, every current attempt and the
retire queue. Only current attempts are stored (RESERVED, DISPATCHED, COMPLETED); a restore
refuses anything else, and any problem is a ``ManifestError`` naming what differs (C6), never
a half-built ledger.

Writing reads the column store (``LedgerColumns.current``); restoring builds a store through
``LedgerColumns.load``: this module writes no column. ``restore_columns`` holds the restore
rules (S11): what a DISPATCHED attempt becomes depends on whether Gym exported it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from ._converter import converter as _conv
from ._errors import ManifestError
from ._ledger_columns import LedgerColumns, SlotLoad
from ._ledger_records import (
    AttemptState,
    EpisodeResult,
    RestoredGymState,
    RestoreSummary,
    rollout_id_for,
)
from ._snapshot_format import (
    LEDGER_SNAPSHOT_VERSION,
    READ_LEDGER_VERSIONS,
    AttemptRow,
    EpisodeRecord,
    LedgerSnapshot,
    dump_ledger_snapshot,
    ledger_bytes,
    load_ledger_snapshot,
)

__all__ = [
    "LEDGER_SNAPSHOT_VERSION",
    "AttemptRow",
    "LedgerSnapshot",
    "dump_ledger_snapshot",
    "ledger_snapshot",
    "ledger_snapshot_bytes",
    "load_ledger_snapshot",
    "restore_columns",
]


def _to_ranges(rows: Iterable[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for r in sorted(rows):
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return tuple(out)


def _from_ranges(ranges: Iterable[tuple[int, int]]) -> set[int]:
    out: set[int] = set()
    for first, last in ranges:
        if last < first:
            raise ManifestError(f"ledger.json: bad row range [{first}, {last}]")
        out.update(range(first, last + 1))
    return out


# -- writing -------------------------------------------------------------------------------------


def _header(
    cols: LedgerColumns,
    *,
    max_row_attempts: int,
    data_failure_budget: int,
    data_failures: int,
    next_row: int,
) -> LedgerSnapshot:
    return LedgerSnapshot(
        version=LEDGER_SNAPSHOT_VERSION,
        group_size=cols.group_size,
        max_row_attempts=max_row_attempts,
        data_failure_budget=data_failure_budget,
        data_failures=data_failures,
        next_row=next_row,
        trained=_to_ranges(cols.trained()),
        failed=_to_ranges(cols.failed()),
        spent=tuple(cols.spent_in_flight()),
        attempts=(),
        retire=tuple(cols.retire_items()),
    )


def ledger_snapshot(
    cols: LedgerColumns,
    *,
    max_row_attempts: int,
    data_failure_budget: int,
    data_failures: int,
    next_row: int,
) -> LedgerSnapshot:
    """The snapshot record of a store and the ledger's settings and counters. O(store)."""
    header = _header(
        cols,
        max_row_attempts=max_row_attempts,
        data_failure_budget=data_failure_budget,
        data_failures=data_failures,
        next_row=next_row,
    )
    rows = tuple(
        [
            AttemptRow(
                row,
                slot,
                attempt,
                state.value,
                replica,
                gate_id,
                restored,
                unclaimed,
                None if result is None else EpisodeResult(*result),
            )
            for row, slot, attempt, state, replica, gate_id, restored, unclaimed, result in (
                cols.current()
            )
        ]
    )
    return attrs.evolve(header, attempts=rows)


def ledger_snapshot_bytes(
    cols: LedgerColumns,
    *,
    max_row_attempts: int,
    data_failure_budget: int,
    data_failures: int,
    next_row: int,
) -> bytes:
    """``dump_ledger_snapshot(ledger_snapshot(...))``, from the store's columns
    (``LedgerColumns.current_columns``): no record, no tuple per attempt."""
    header = _conv.unstructure(
        _header(
            cols,
            max_row_attempts=max_row_attempts,
            data_failure_budget=data_failure_budget,
            data_failures=data_failures,
            next_row=next_row,
        )
    )
    return ledger_bytes(header, cols.current_columns())


# -- restoring -----------------------------------------------------------------------------------


def restore_columns(
    snap: LedgerSnapshot, exported: Iterable[EpisodeRecord] = ()
) -> tuple[LedgerColumns, RestoreSummary]:
    """The column store a ledger restarts from after a crash (S11), and what became of the
    snapshot's attempts.

    * COMPLETED attempts stay completed: untrained results go straight to the trainer.
    * A DISPATCHED attempt that Gym exported becomes its replacement: attempt + 1, RESERVED,
      pinned to the original replica, carrying the exported state, **unclaimed** until its
      dispatch claims it. It spends no row attempt: it continues the same episode.
    * A DISPATCHED attempt Gym did not export cannot continue; it is re-sent fresh as
      attempt + 1 (counted in ``RestoreSummary.redispatched_fresh``).
    * RESERVED attempts keep their identity (and restored state, if any).

    Raises ``ManifestError`` for a version not in ``READ_LEDGER_VERSIONS``, an unknown
    or non-current state, a completed attempt without its result, a row without exactly one
    attempt per slot, spent attempts of a slot out of range, or an attempt queued for
    retirement that is also current.
    """
    if snap.version not in READ_LEDGER_VERSIONS:
        raise ManifestError(
            f"ledger.json: version {snap.version} found, "
            f"{' and '.join(map(str, sorted(READ_LEDGER_VERSIONS)))} supported"
        )
    by_id = {e.rollout_id: e for e in exported}
    tally = dict.fromkeys(attrs.fields_dict(RestoreSummary), 0)
    grouped: dict[int, list[AttemptRow]] = {}
    for ar in snap.attempts:
        grouped.setdefault(ar.row, []).append(ar)

    def rows() -> Iterator[tuple[int, list[SlotLoad]]]:
        for row, ars in grouped.items():
            yield row, [_slot_load(ar, by_id, tally) for ar in ars]

    trained, failed = _from_ranges(snap.trained), _from_ranges(snap.failed)
    try:
        cols = LedgerColumns.load(
            snap.group_size,
            rows(),
            trained=trained,
            failed=failed,
            spent=snap.spent,
            retire=snap.retire,
        )
    except ManifestError:
        raise
    except ValueError as exc:  # the store's own refusals name what does not fit
        raise ManifestError(f"ledger.json: {exc}") from None
    return cols, RestoreSummary(**tally)


def _slot_load(ar: AttemptRow, by_id: dict[str, EpisodeRecord], tally: dict[str, int]) -> SlotLoad:
    try:
        state = AttemptState(ar.state)
    except ValueError:
        raise ManifestError(f"ledger.json: unknown attempt state {ar.state!r}") from None
    if state is AttemptState.DISPATCHED:
        old_id = rollout_id_for(ar.row, ar.slot, ar.attempt)
        ep = by_id.get(old_id)
        if ep is None:
            tally["redispatched_fresh"] += 1
            return SlotLoad(ar.slot, ar.attempt + 1)
        tally["restored"] += 1
        restored = RestoredGymState(ep.replica, ep.owner, old_id, tuple(ep.capture_keys))
        return SlotLoad(ar.slot, ar.attempt + 1, restored=restored, unclaimed=True)
    if state is AttemptState.RESERVED:
        tally["reserved"] += 1
        return SlotLoad(ar.slot, ar.attempt, restored=ar.restored, unclaimed=ar.unclaimed)
    if state is AttemptState.COMPLETED:
        if ar.result is None:
            raise ManifestError(
                "ledger.json: completed attempt "
                f"{rollout_id_for(ar.row, ar.slot, ar.attempt)} has no result"
            )
        tally["completed_untrained"] += 1
        return SlotLoad(
            ar.slot, ar.attempt, ar.result, ar.restored, replica=ar.replica, gate_id=ar.gate_id
        )
    raise ManifestError(
        f"ledger.json: attempt {rollout_id_for(ar.row, ar.slot, ar.attempt)} is "
        f"{state.value}; only current attempts are stored"
    )
