"""The run's row order: which dataset row each position of the run trains, epoch after epoch.

A trainer goes through its rows in an order: the rows it names (``rows=``, in any order), or,
every epoch, a seeded shuffle of them (``epochs=E, shuffle_seed=S``: what torch's
``DistributedSampler(seed=S).set_epoch(e)`` or ``datasets.shuffle(seed)`` give a trainer).

Positions, not rows
-------------------
The run identifies a row it trains by its **position** in the order, ``0 .. E*K-1`` for ``K``
rows an epoch: position ``p`` is epoch ``p // K`` and trains dataset row ``row_at(p)``. The
ledger counts positions (its rows are positions, rollout IDs ``"{position}-{slot}"``), and a
position is reserved in ascending order, so the ledger's cursor ``next_row`` (one past the
highest position reserved) *is* where the order stands: a restore resumes at that position,
whatever the order, and the same dataset row trained once per epoch is a different position
each time. What Gym gets is the dataset row (``RunRow.row``) and its task; what the trainer gets
is both (``CompletedGroup.row`` and ``.position``). For the default order (every row once, in
ascending order from 0) a position is its row, as before.

Pure and small
--------------
``row_at`` is a function of (the rows given, ``epochs``, ``shuffle_seed``, the position) only,
so a restore recomputes the order rather than storing it. Nothing is kept per row but the rows
as given (a ``range``, or an ``array('q')`` of 8 bytes a row). The shuffle of epoch ``e`` is a
keyed bijection of ``0..K-1`` evaluated per position in O(1): a 6-round Feistel network over
the smallest power of 4 >= K whose round keys are blake2b of ``(shuffle_seed, e)``, walking the
cycle back into ``0..K-1`` (fewer than 4 steps on average). Each epoch is a different
permutation, each seed a different sequence of them, and the same (rows, seed, epoch) always the
same one.

What a snapshot keeps (``order.json``, ``OrderRecord``) and what a restore must match
--------------------------------------------------------------------------------------
``epochs``, ``shuffle_seed``, ``K``, the cursor (position, and its epoch for readers), and a
digest of the rows given that the positions reserved so far depend on: all ``K`` of them for a
shuffled or multi-epoch order (the permutation and every later epoch depend on each), the first
``position`` of them for a single unshuffled epoch (the rows after the cursor may still change
or be appended, as they could before orders were recorded). A restore with another order spec
is refused before Gym installs anything (``DatasetMismatch``, exit code 2) saying what differs.
A snapshot without ``order.json`` was made when the ledger counted dataset rows: it restores
only under the default order (positions and rows were the same), and is refused otherwise.
"""

from __future__ import annotations

import hashlib
import operator
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, final

import attrs
import orjson

from ._converter import converter, loads
from ._dataset import row_ranges
from ._errors import DatasetError, DatasetMismatch, ManifestError

__all__ = [
    "ORDER_FILE",
    "ORDER_VERSION",
    "OrderRecord",
    "RowOrder",
    "check_order",
    "load_order_record",
]

ORDER_FILE: Final = "order.json"
ORDER_VERSION: Final = 1
_MASK64: Final = (1 << 64) - 1
_ROUNDS: Final = 6


def _mix(z: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints that spreads every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    raw = hashlib.blake2b(
        f"gymckpt-row-order:{seed}:{epoch}".encode(), digest_size=8 * _ROUNDS
    ).digest()
    return tuple(int.from_bytes(raw[8 * i : 8 * i + 8], "little") for i in range(_ROUNDS))


def _shuffled_index(index: int, size: int, keys: tuple[int, ...]) -> int:
    """The image of ``index`` under the keyed permutation of ``0..size-1`` (cycle walking)."""
    half = max(1, ((size - 1).bit_length() + 1) // 2)
    low = (1 << half) - 1
    x = index
    while True:
        left, right = x >> half, x & low
        for key in keys:
            left, right = right, left ^ (_mix(key ^ right) & low)
        x = (left << half) | right
        if x < size:
            return x


def _index(value: object) -> int | None:
    """``value`` as an int if it is one or stands for one (``__index__``: numpy's integers,
    so ``rows=numpy.random.permutation(n)`` works); None for a bool or anything else."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _rows_digest(rows: Sequence[int], count: int) -> str:
    """blake2b-16 of ``rows[:count]`` as little-endian int64s (the same on every machine)."""
    packed = array("q", rows[:count])
    if sys.byteorder != "little":
        packed.byteswap()
    data = packed.tobytes()
    return "blake2b-16:" + hashlib.blake2b(data, digest_size=16).hexdigest()


@attrs.frozen
class OrderRecord:
    """``order.json``: the row order of the run and where it stood at the cut.

    ``rows`` rows an epoch, ``epochs``, ``shuffle_seed`` (None: no shuffle); ``position`` is
    the ledger's cursor (positions below it were reserved), ``epoch`` its epoch
    (``position // rows``, for readers); ``digest`` is over the first ``covered`` rows given,
    as little-endian int64 (see the module docstring for which)."""

    version: int
    rows: int
    epochs: int
    shuffle_seed: int | None
    position: int
    epoch: int
    covered: int
    digest: str


@final
@attrs.frozen(eq=False)
class RowOrder:
    """The positions of a run and the dataset row each trains. Build it with ``of``.

    Invariants: ``rows`` holds distinct ints >= 0 (``K`` of them); ``epochs`` >= 1;
    ``row_at(p)`` for ``p`` in ``0..len-1`` visits every row of ``rows`` exactly once per
    epoch, in the order given when ``shuffle_seed`` is None, else in epoch ``e``'s seeded
    permutation; it depends on nothing else.
    """

    rows: range | array[int]
    epochs: int = 1
    shuffle_seed: int | None = None
    _ranges: list[tuple[int, int]] = attrs.field(factory=list)
    """``rows`` as sorted ranges (dataset rows the order uses), computed by ``of``."""
    _keys: dict[int, tuple[int, ...]] = attrs.field(factory=dict, init=False)
    _digests: dict[int, str] = attrs.field(factory=dict, init=False)
    """The digest of the last ``covered`` computed (all K, for most orders, is computed once)."""

    @classmethod
    def of(
        cls,
        rows: int | Iterable[int] | None,
        dataset_rows: int | None,
        *,
        epochs: int = 1,
        shuffle_seed: int | None = None,
        source: str = "",
    ) -> RowOrder:
        """Check and adapt what ``open_rollouts`` was given. ``rows``: a count, row indices in
        any order (each once), or None for every row of the dataset (``dataset_rows`` rows;
        None when there is no dataset). Raises ``DatasetError`` (exit code 2) naming the first
        problem: a repeated row (both indices), a row outside the dataset, a count over it,
        epochs or a seed that are not ints of the right range. Blocking: O(rows)."""
        if type(epochs) is not int or epochs < 1:
            raise DatasetError(f"epochs={epochs!r}: pass an int >= 1 (1 trains each row once)")
        if shuffle_seed is not None and (
            type(shuffle_seed) is not int or not 0 <= shuffle_seed < 1 << 64
        ):
            raise DatasetError(
                f"shuffle_seed={shuffle_seed!r}: pass an int in 0..2**64-1, or None to train "
                "the rows in the order given every epoch"
            )
        of_dataset = f"the dataset ({source})"
        if rows is None:
            if dataset_rows is None:
                raise TypeError("open_rollouts needs rows= (a count or row indices) or dataset=")
            chosen: range | array[int] = range(dataset_rows)
        elif not isinstance(rows, Iterable) and (count := _index(rows)) is not None:
            rows = count
            if rows < 0:
                raise DatasetError(f"rows={rows}: pass a count >= 0 or row indices")
            if dataset_rows is not None and rows > dataset_rows:
                raise DatasetError(
                    f"rows={rows}, but {of_dataset} has {dataset_rows} rows: pass "
                    f"rows <= {dataset_rows}, or leave rows out to train every row"
                )
            chosen = range(rows)
        elif not isinstance(rows, Iterable):
            raise DatasetError(f"rows={rows!r}: pass a count, row indices, or leave it out")
        elif (
            isinstance(rows, range)
            and rows.step == 1
            and rows.start >= 0
            and (dataset_rows is None or rows.stop <= dataset_rows)
        ):
            chosen = rows
        else:  # indices, checked one by one (a range out of bounds too: the index is named)
            chosen = cls._checked(rows, dataset_rows, of_dataset)
        return cls(chosen, epochs, shuffle_seed, row_ranges(chosen))

    @staticmethod
    def _checked(rows: Iterable[int], dataset_rows: int | None, of_dataset: str) -> array[int]:
        out: array[int] = array("q")
        seen: dict[int, int] = {}
        for position, given in enumerate(rows):
            row = _index(given)  # an int, or what stands for one (numpy's), else None
            if dataset_rows is not None and (row is None or not 0 <= row < dataset_rows):
                raise DatasetError(
                    f"rows[{position}] is {given!r}, not a row of {of_dataset[:-1]}, rows "
                    f"0..{dataset_rows - 1})"
                )
            if row is None or row < 0:
                raise DatasetError(f"rows[{position}] is {given!r}, not a row index (an int >= 0)")
            first = seen.setdefault(row, position)
            if first != position:
                raise DatasetError(
                    f"rows[{position}] is row {row}, which rows[{first}] names already: each "
                    "row once (for several passes over the rows, pass epochs=)"
                )
            if row >= 1 << 63:
                raise DatasetError(f"rows[{position}] is {row}, beyond a 64-bit row index")
            out.append(row)
        return out

    @property
    def per_epoch(self) -> int:
        """``K``: rows an epoch."""
        return len(self.rows)

    @property
    def is_identity(self) -> bool:
        """Position ``p`` trains row ``p`` for every position (the default order)."""
        rows = self.rows
        return (
            self.epochs == 1
            and self.shuffle_seed is None
            and isinstance(rows, range)
            and rows.start == 0
        )

    def __len__(self) -> int:
        return self.epochs * len(self.rows)

    def row_at(self, position: int) -> int:
        """The dataset row that ``position`` trains. O(1)."""
        size = len(self.rows)
        epoch, index = divmod(position, size)
        if not 0 <= epoch < self.epochs:
            raise IndexError(f"position {position} is outside the order ({len(self)} positions)")
        if self.shuffle_seed is not None:
            keys = self._keys.get(epoch)
            if keys is None:
                self._keys.clear()  # one epoch at a time in flight, mostly: keep one or two
                keys = self._keys[epoch] = _round_keys(self.shuffle_seed, epoch)
            index = _shuffled_index(index, size, keys)
        return self.rows[index]

    def rows_used(self, position: int) -> list[tuple[int, int]]:
        """The dataset rows, as sorted ranges, that positions ``0..position-1`` may have
        trained: exactly those of a single unshuffled epoch of consecutive rows, every row of
        the order otherwise (which a snapshot then covers as a whole)."""
        if position <= 0:
            return []
        rows = self.rows
        if self.epochs == 1 and self.shuffle_seed is None and isinstance(rows, range):
            return [(rows.start, rows.start + min(position, len(rows)))]
        return self._ranges

    def _covered(self, position: int) -> int:
        if self.epochs == 1 and self.shuffle_seed is None:
            return min(position, len(self.rows))
        return len(self.rows)

    def record(self, position: int) -> OrderRecord:
        """The order's record at a cut whose cursor is ``position``. Blocking (a digest over
        up to K rows, 8 bytes each): run it off the loop."""
        covered = self._covered(position)
        digest = self._digests.get(covered)
        if digest is None:
            digest = _rows_digest(self.rows, covered)
            self._digests.clear()
            self._digests[covered] = digest
        return OrderRecord(
            ORDER_VERSION,
            len(self.rows),
            self.epochs,
            self.shuffle_seed,
            position,
            position // max(1, len(self.rows)),
            covered,
            digest,
        )

    def files(self, position: int) -> dict[str, bytes]:
        """``{ORDER_FILE: bytes}`` of ``record(position)``, for the snapshot."""
        return {ORDER_FILE: orjson.dumps(converter.unstructure(self.record(position)))}

    def describe(self) -> str:
        shuffle = "no shuffle" if self.shuffle_seed is None else f"shuffle_seed={self.shuffle_seed}"
        return f"{len(self.rows)} rows an epoch, epochs={self.epochs}, {shuffle}"


def load_order_record(files: Mapping[str, bytes]) -> OrderRecord | None:
    """The order record of a snapshot's files, read strictly, or None if it has none (a
    snapshot made before orders were recorded); ``ManifestError`` naming what is wrong."""
    raw = files.get(ORDER_FILE)
    if raw is None:
        return None
    record = loads(raw, OrderRecord, ORDER_FILE)
    bad = f"{ORDER_FILE}:"
    if record.version != ORDER_VERSION:
        raise ManifestError(
            f"{bad} version {record.version}, this gymckpt reads version {ORDER_VERSION}: "
            "restore with the gymckpt that made the snapshot, or start in a fresh work directory"
        )
    if (
        record.rows < 0
        or record.epochs < 1
        or not 0 <= record.position <= record.rows * (record.epochs)
    ):
        raise ManifestError(
            f"{bad} position {record.position} of {record.epochs} epochs of {record.rows} rows"
        )
    if record.epoch != record.position // max(1, record.rows) or not (
        0 <= record.covered <= record.rows
    ):
        raise ManifestError(
            f"{bad} epoch {record.epoch} and covered {record.covered} do not fit position "
            f"{record.position} of {record.rows} rows an epoch"
        )
    return record


_AGAIN: Final = (
    "restore with the rows=, epochs= and shuffle_seed= the snapshot was made with, or start in "
    "a fresh work directory"
)


def check_order(record: OrderRecord | None, order: RowOrder, next_row: int, where: str) -> None:
    """Raise unless ``order`` puts every position below the snapshot's cursor (``next_row``, its
    ledger's) on the same dataset row as the order the snapshot at ``where`` was made with:
    ``DatasetMismatch`` saying what differs, ``ManifestError`` for an ``order.json`` that does
    not fit its ledger. Blocking (a digest over up to K rows): run it off the loop."""
    if record is None:
        # made when the ledger counted dataset rows: only the identity order reads it the same
        if next_row == 0 or (
            order.epochs == 1
            and order.shuffle_seed is None
            and len(order.rows) >= next_row
            and all(order.rows[p] == p for p in range(next_row))
        ):
            return
        raise DatasetMismatch(
            f"{where}: the snapshot was made before gymckpt recorded its row order (no "
            f"{ORDER_FILE}): its ledger names dataset rows 0..{next_row - 1} themselves, so it "
            "restores only with the rows in ascending order from row 0 (rows= a count, or "
            "left out) and no epochs= or shuffle_seed=; this run asks for "
            f"{order.describe()}: {_AGAIN}"
        )
    if record.position != next_row:
        raise ManifestError(
            f"{where}: {ORDER_FILE} says position {record.position}, its ledger's cursor is "
            f"{next_row}"
        )
    differs = []
    if record.epochs != order.epochs:
        differs.append(f"epochs={record.epochs} in the snapshot, {order.epochs} now")
    if record.shuffle_seed != order.shuffle_seed:
        differs.append(
            f"shuffle_seed={record.shuffle_seed} in the snapshot, {order.shuffle_seed} now"
        )
    fixed = order.epochs > 1 or order.shuffle_seed is not None
    if fixed and record.rows != len(order.rows):
        differs.append(f"{record.rows} rows an epoch in the snapshot, {len(order.rows)} now")
    elif len(order.rows) < record.covered:
        differs.append(
            f"the snapshot trained up to rows[{record.covered - 1}], this run has "
            f"{len(order.rows)} rows"
        )
    elif _rows_digest(order.rows, record.covered) != record.digest:
        first = "every" if fixed else f"the first {record.covered}"
        differs.append(
            f"the rows given differ ({first} rows given must be the same: digest "
            f"{record.digest} in the snapshot, {_rows_digest(order.rows, record.covered)} now)"
        )
    if differs:
        raise DatasetMismatch(
            f"{where}: the row order differs from the snapshot's, which stood at epoch "
            f"{record.epoch} position {record.position % max(1, record.rows)} of "
            f"{record.rows}: " + "; ".join(differs) + f": {_AGAIN}"
        )
