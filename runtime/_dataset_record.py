"""What a snapshot keeps of the trainer's dataset, and the check a restore makes against it.

Two top-level files of the snapshot, written with the others (temp, fsync, rename) and both
covered by the commit marker's sha256:

    dataset.json       DatasetRecord: the rows covered as ranges, the dataset's length and
                       source, and a blake2b-16 digest over dataset_rows.bin
    dataset_rows.bin   the row digest (8 bytes, ``_dataset.row_digest``) of every covered
                       row, in the ranges' order

Which rows are covered, so must be the same at a restore: every dataset row the positions of
the run's row order below the ledger's cursor at the cut (``next_row``) may have trained
(``RowOrder.rows_used``: the rows below the cursor for a single unshuffled epoch of
consecutive rows, every row of the order otherwise), and every row an earlier snapshot of the
run covered. Every row dispatched before the checkpoint is among them (trained, failed, in
flight, parked, reserved); in the default order, rows after the cursor may differ or be
appended, as nothing in Gym or the trainer depends on them yet. 8 bytes a row: 8 MB at 1M
rows, sliced from the digests the dataset computed once at start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, final

import attrs
import orjson

from ._converter import converter, loads
from ._dataset import ROW_DIGEST_SIZE, TaskDataset
from ._errors import DatasetMismatch, ManifestError

__all__ = [
    "DATASET_FILE",
    "DATASET_ROWS_FILE",
    "DatasetIdentity",
    "DatasetRecord",
    "check_dataset",
    "load_dataset_record",
    "merge_ranges",
]

DATASET_FILE: Final = "dataset.json"
DATASET_ROWS_FILE: Final = "dataset_rows.bin"
DATASET_VERSION: Final = 1
_CHUNK_ROWS: Final = 4096


def _digest(rows_bin: bytes) -> str:
    return "blake2b-16:" + hashlib.blake2b(rows_bin, digest_size=16).hexdigest()


@attrs.frozen
class DatasetRecord:
    """``dataset.json``. ``rows``: the covered rows as sorted, disjoint ``[start, stop)``
    ranges; ``digest`` is over ``dataset_rows.bin`` (the dataset's identity in messages)."""

    version: int
    source: str
    length: int
    rows: tuple[tuple[int, int], ...]
    digest: str

    @property
    def covered(self) -> int:
        return sum(stop - start for start, stop in self.rows)

    @property
    def end(self) -> int:
        """One past the highest covered row (0 when none is)."""
        return self.rows[-1][1] if self.rows else 0


def merge_ranges(*lists: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``[start, stop)`` ranges, sorted and merged."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(r for ranges in lists for r in ranges if r[0] < r[1]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


@final
@attrs.define(eq=False, slots=True)
class DatasetIdentity:
    """The dataset files of a run's snapshots. ``files(next_row)`` covers ``used(next_row)``
    (the dataset rows the positions below the cut's cursor may have trained) and ``covered``
    (the rows its restored snapshot covered); the bytes are reused while the cursor stays."""

    dataset: TaskDataset
    covered: Sequence[tuple[int, int]]
    used: Callable[[int], Sequence[tuple[int, int]]]
    _last: tuple[int, dict[str, bytes]] | None = attrs.field(default=None, init=False)

    def files(self, next_row: int) -> dict[str, bytes]:
        """Blocking (an 8-byte slice a row and one blake2b over them): run it off the loop."""
        if self._last is not None and self._last[0] == next_row:
            return self._last[1]
        covered = merge_ranges(self.covered, self.used(next_row))
        rows_bin = self.dataset.digests(covered)
        record = DatasetRecord(
            DATASET_VERSION,
            self.dataset.source,
            len(self.dataset),
            tuple(covered),
            _digest(rows_bin),
        )
        files = {
            DATASET_FILE: orjson.dumps(converter.unstructure(record)),
            DATASET_ROWS_FILE: rows_bin,
        }
        self._last = (next_row, files)
        return files


def load_dataset_record(files: Mapping[str, bytes]) -> tuple[DatasetRecord, bytes] | None:
    """The dataset record of a snapshot's files, read strictly, or None if it has none;
    ``ManifestError`` naming the file and what is wrong."""
    if DATASET_FILE not in files and DATASET_ROWS_FILE not in files:
        return None
    for name, other in ((DATASET_FILE, DATASET_ROWS_FILE), (DATASET_ROWS_FILE, DATASET_FILE)):
        if name not in files:
            raise ManifestError(f"{name}: missing from the snapshot, which has {other}")
    record = loads(files[DATASET_FILE], DatasetRecord, DATASET_FILE)
    rows_bin = files[DATASET_ROWS_FILE]
    bad = f"{DATASET_FILE}:"
    if record.version != DATASET_VERSION:
        raise ManifestError(
            f"{bad} version {record.version}, this gymckpt reads version {DATASET_VERSION}"
        )
    previous = -1
    for start, stop in record.rows:
        if not 0 <= start < stop or start <= previous:
            raise ManifestError(
                f"{bad} rows: [{start}, {stop}) is not a sorted, disjoint, non-empty range"
            )
        previous = stop
    if record.end > record.length:
        raise ManifestError(f"{bad} covers rows up to {record.end - 1} of {record.length}")
    if len(rows_bin) != ROW_DIGEST_SIZE * record.covered:
        raise ManifestError(
            f"{DATASET_ROWS_FILE}: {len(rows_bin)} bytes, {DATASET_FILE} covers "
            f"{record.covered} rows of {ROW_DIGEST_SIZE} bytes"
        )
    if _digest(rows_bin) != record.digest:
        raise ManifestError(
            f"{DATASET_ROWS_FILE}: digest {_digest(rows_bin)}, {DATASET_FILE} says {record.digest}"
        )
    return record, rows_bin


def _first_difference(old: bytes, new: bytes) -> int:
    """The index of the first ``ROW_DIGEST_SIZE``-byte digest that differs (``old != new``)."""
    size, step = ROW_DIGEST_SIZE, ROW_DIGEST_SIZE * _CHUNK_ROWS
    at = 0
    while old[at : at + step] == new[at : at + step]:
        at += step
    while old[at : at + size] == new[at : at + size]:
        at += size
    return at // size


_AGAIN: Final = (
    "restore with the dataset the snapshot was made with, or start in a fresh work directory"
)


def check_dataset(
    found: tuple[DatasetRecord, bytes] | None, dataset: TaskDataset | None, where: str
) -> None:
    """Raise ``DatasetMismatch`` unless ``dataset`` is the one the snapshot at ``where`` was
    made with on every row it covers (``found``: ``load_dataset_record`` of its files). Blocking
    (computes the digests of covered rows not yet known): run it off the loop."""
    if found is None:
        if dataset is not None:
            raise DatasetMismatch(
                f"{where}: the snapshot was made without a dataset (its environments read rows "
                f"by index), this run passes dataset= ({dataset.source}): leave dataset= out to "
                "resume it, or start in a fresh work directory to train on the dataset"
            )
        return
    record, rows_bin = found
    if dataset is None:
        raise DatasetMismatch(
            f"{where}: the snapshot was made with a dataset ({record.source}, {record.length} "
            f"rows, {record.digest}), this run passes none: pass the same dataset= to "
            "open_rollouts to resume it, or start in a fresh work directory"
        )
    n = len(dataset)
    at = 0
    for start, stop in record.rows:
        have = min(stop, n)
        if start < have:
            old = rows_bin[at : at + ROW_DIGEST_SIZE * (have - start)]
            new = dataset.digests([(start, have)])
            if old != new:
                row = start + _first_difference(old, new)
                k = (row - start) * ROW_DIGEST_SIZE
                raise DatasetMismatch(
                    f"{where}: dataset row {row} differs from the snapshot's: row digest "
                    f"{old[k : k + ROW_DIGEST_SIZE].hex()} in the snapshot, "
                    f"{new[k : k + ROW_DIGEST_SIZE].hex()} in {dataset.source} (blake2b of the "
                    f"row's canonical JSON); the {record.covered} rows below row "
                    f"{record.end} were reserved before the checkpoint and must be the same: "
                    f"{_AGAIN}"
                )
        if have < stop:
            raise DatasetMismatch(
                f"{where}: the dataset ({dataset.source}) has {n} rows, but the snapshot used "
                f"rows up to row {record.end - 1} (row {max(start, n)} is missing; the "
                f"snapshot's dataset had {record.length} rows): {_AGAIN}"
            )
        at += ROW_DIGEST_SIZE * (stop - start)
