"""The trainer's dataset: the task each row stands for, checked where it enters.

A trainer's dataloader owns its prompts (verl, OpenRLHF, TRL); a row index alone makes every
Gym instance load and index the same data itself, and nothing could tell whether a restore runs
against the data its snapshot was made with. So the trainer hands its dataset to
``open_rollouts`` and each attempt carries its row's task to Gym.

What a task is
--------------
A finite plain JSON value. Its *canonical form* is ``orjson.dumps(task, option=OPT_SORT_KEYS)``
(compact, object keys sorted), and what travels to an environment is the value parsed back
from those bytes: a fresh copy for every attempt (an environment that edits its task edits
neither the trainer's dataset nor a sibling's task), equal to the row, and the same on every
backend, in process or across Ray. A row that would not come back from JSON as itself (``nan``,
a set, a tuple, a numpy array, a ``datetime``, a non-``str`` key, an integer beyond 64 bits) is
refused when the dataset is checked, with the row and the place in it.

What identifies a row
---------------------
Its *row digest*: the first 8 bytes of blake2b over its canonical form, computed once per row
and kept (8 bytes a row: 8 MB at 1M rows). A row is read again when an attempt of it is
dispatched, and its digest recomputed: a row that changed under the run is refused there, so
what Gym got is what the snapshot identifies. ``_dataset_record`` says what a snapshot keeps
of them.

All of this is blocking and runs in a worker thread at start; ``task`` is called on the loop
once per dispatched attempt (one ``orjson`` dump and load and one blake2b, microseconds).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, Final, final

import attrs
import orjson

from ._errors import DatasetError
from ._plain import plain_problem

__all__ = ["ROW_DIGEST_SIZE", "TaskDataset", "canonical_task", "row_digest", "row_ranges"]

ROW_DIGEST_SIZE: Final = 8
"""Bytes of blake2b kept per row: a chance of 2**-64 that an edited row goes unseen."""
_BATCH: Final = 4096
"""Rows read in one slice when a range of rows is checked."""
_CANONICAL: Final = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
"""Sorted keys; a dataclass, a datetime and a subclass of str, int, dict or list are refused
(orjson would write each as something that does not come back as itself)."""


def canonical_task(task: Any, where: str) -> bytes:
    """The canonical JSON form of ``task``; ``DatasetError`` naming the place (``where`` is the
    row, ``"dataset[3]"``) when ``task`` would not come back from JSON as itself."""
    try:
        data = orjson.dumps(task, option=_CANONICAL)
    except (TypeError, orjson.JSONEncodeError) as exc:
        problem = plain_problem(task, where, json_only=True)
        raise DatasetError(problem or f"{where} is not plain JSON ({exc})") from None
    # one parse and a comparison in C: ``nan`` came back as None, a tuple as a list, a UUID or
    # an enum as a string
    if orjson.loads(data) != task:
        problem = plain_problem(task, where, json_only=True)
        raise DatasetError(problem or f"{where} does not come back from JSON as itself")
    return data


def row_digest(canonical: bytes) -> bytes:
    """The row digest of a task's canonical form (``ROW_DIGEST_SIZE`` bytes)."""
    return hashlib.blake2b(canonical, digest_size=ROW_DIGEST_SIZE).digest()


def row_ranges(rows: Iterable[int]) -> list[tuple[int, int]]:
    """``rows`` as sorted, disjoint, non-adjacent ``(start, stop)`` ranges."""
    if isinstance(rows, range) and rows.step == 1:
        return [(rows.start, rows.stop)] if rows else []
    out: list[tuple[int, int]] = []
    for row in sorted(set(rows)):
        if out and out[-1][1] == row:
            out[-1] = (out[-1][0], row + 1)
        else:
            out.append((row, row + 1))
    return out


def _describe(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is beyond a finite float")
    return value


_STRICT_JSON: Final = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite
)
"""Python's own decoder (its C scanner): integers of any size come back exact, as ints, an
object that repeats a key and a number beyond a finite float are refused, so a line is held to
the rules of a row given in a list (``canonical_task``) instead of orjson's (a float for a big
integer, the last of repeated keys)."""


def _parsed(path: Path, lines: list[bytes]) -> list[bytes]:
    """The canonical bytes of each line (a JSON task); ``DatasetError`` naming the file and
    the line of a bad one: not JSON, an object that repeats a key, or a task a list of tasks
    would refuse (an integer beyond 64 bits, ``NaN``)."""
    rows: list[bytes] = []
    decode = _STRICT_JSON.decode
    for n, line in enumerate(lines):
        where = f"dataset {path}: line {n + 1} (row {n})"
        try:
            task = decode(line.decode("utf-8"))
        except _DuplicateKey as exc:
            raise DatasetError(
                f"{where} repeats the key {exc.args[0]!r} in one object: each key once"
            ) from None
        except (UnicodeDecodeError, ValueError) as exc:
            if not line.strip():
                raise DatasetError(
                    f"{where} is empty: one JSON task a line, no blank lines"
                ) from None
            raise DatasetError(f"{where} is not valid JSON ({exc})") from None
        try:  # what the decoder gives is plain JSON: only an integer beyond 64 bits fails
            rows.append(orjson.dumps(task, option=_CANONICAL))
        except orjson.JSONEncodeError:
            try:
                canonical_task(task, f"dataset[{n}]")  # names the place in the row
            except DatasetError as exc:
                raise DatasetError(f"dataset {path}: line {n + 1}: {exc}") from None
            raise  # not reached: canonical_task refuses what orjson could not write
    return rows


@final
@attrs.define(eq=False, slots=True, repr=False)
class TaskDataset:
    """The trainer's dataset, row ``i`` the task of row index ``i``. Build it with ``of``.

    Invariants: ``len`` never changes; ``digest(i)`` is computed once and kept; ``task(i)``
    returns a fresh copy of row ``i``'s canonical JSON value and raises ``DatasetError`` if the
    row no longer has the digest first computed for it.
    """

    source: str
    """What the dataset was built from, for messages (``"list of 3 tasks"``, a file path)."""
    _rows: Sequence[Any]
    _encoded: bool
    """``_rows`` holds canonical bytes already (a JSONL file), not tasks."""
    _digests: bytearray = attrs.field(init=False)
    _known: bytearray = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._digests = bytearray(ROW_DIGEST_SIZE * len(self._rows))
        self._known = bytearray(len(self._rows))

    @classmethod
    def of(cls, dataset: object) -> TaskDataset:
        """Adapt what a trainer passes as ``dataset=``: a ``TaskDataset``; a path (``str`` or
        ``os.PathLike``) to a JSONL file, one task a line; anything with ``__len__`` and
        ``__getitem__`` (a list, a Hugging Face ``datasets.Dataset``), indexed lazily; any other
        iterable, materialised once. ``DatasetError`` for anything else."""
        if isinstance(dataset, TaskDataset):
            return dataset
        if isinstance(dataset, str | os.PathLike):
            return cls._jsonl(Path(dataset))
        if isinstance(dataset, bytes | bytearray | memoryview):
            raise DatasetError(
                "dataset: bytes are not a dataset (pass a list of tasks or a JSONL file's path)"
            )
        if isinstance(dataset, Set):
            raise DatasetError(
                f"dataset: a set ({_describe(dataset)}) has no order, so its rows have no "
                "index: pass a list"
            )
        if isinstance(dataset, Mapping):
            raise DatasetError(
                f"dataset: a mapping ({_describe(dataset)}) is not a dataset: pass a sequence "
                "of tasks (of a Hugging Face DatasetDict, one split: ds['train'])"
            )
        if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
            return cls(f"{_describe(dataset)} of {len(dataset)} rows", dataset, False)  # type: ignore[arg-type]
        if isinstance(dataset, Iterable):
            rows = list(dataset)
            return cls(f"iterable of {len(rows)} tasks", rows, False)
        raise DatasetError(
            f"dataset: a {_describe(dataset)} is not a dataset: pass a sequence or iterable of "
            "JSON tasks, a JSONL file's path, or a Hugging Face datasets.Dataset"
        )

    @classmethod
    def _jsonl(cls, path: Path) -> TaskDataset:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DatasetError(f"dataset {path}: cannot read it ({exc})") from None
        lines = data.split(b"\n")
        if lines and not lines[-1].strip():
            lines.pop()  # the newline that ends the last line
        return cls(str(path), _parsed(path, lines), True)

    def __len__(self) -> int:
        return len(self._rows)

    def _canonical(self, row: int) -> bytes:
        if not 0 <= row < len(self._rows):
            raise DatasetError(f"row {row} is outside the dataset ({len(self._rows)} rows)")
        if self._encoded:
            return self._rows[row]
        try:
            task = self._rows[row]
        except Exception as exc:
            raise DatasetError(
                f"dataset[{row}]: reading it from {self.source} failed "
                f"({type(exc).__name__}: {exc})"
            ) from None
        return canonical_task(task, f"dataset[{row}]")

    def digest(self, row: int) -> bytes:
        """Row ``row``'s digest, computed (the row checked) on first use and kept."""
        at = row * ROW_DIGEST_SIZE
        if 0 <= row < len(self._known) and self._known[row]:
            return bytes(self._digests[at : at + ROW_DIGEST_SIZE])
        found = row_digest(self._canonical(row))
        self._digests[at : at + ROW_DIGEST_SIZE] = found
        self._known[row] = 1
        return found

    def check(self, rows: Iterable[int]) -> None:
        """Check every row of ``rows`` (each inside the dataset, each plain JSON) and keep its
        digest; the first bad one raises ``DatasetError`` naming it. Blocking: run it off the
        loop (about a microsecond or two a row for small tasks)."""
        known, digests, size = self._known, self._digests, ROW_DIGEST_SIZE
        if isinstance(rows, range) and rows.step == 1 and not self._encoded:
            start, stop = max(rows.start, 0), min(rows.stop, len(known))
            for at in range(start, stop, _BATCH):
                batch = self._batch(at, min(at + _BATCH, stop))
                if batch is None:
                    break
                for row, task in enumerate(batch, at):
                    if not known[row]:
                        digests[row * size : (row + 1) * size] = row_digest(
                            canonical_task(task, f"dataset[{row}]")
                        )
                        known[row] = 1
        for row in rows:  # what no batch read (or all of it, for indices): one row at a time
            if 0 <= row < len(known) and known[row]:
                continue
            found = row_digest(self._canonical(row))
            digests[row * size : (row + 1) * size] = found
            known[row] = 1

    def _batch(self, start: int, stop: int) -> list[Any] | None:
        """Rows ``start..stop-1`` in one read of a slice, or None if the dataset cannot: a
        sequence's slice is its rows, a Hugging Face Dataset's is its columns (a dict of
        equal-length lists), a hundred times faster than reading each row."""
        try:
            got = self._rows[start:stop]
        except Exception:
            return None
        n = stop - start
        if isinstance(got, Mapping):
            names, columns = list(got), list(got.values())
            if not all(isinstance(c, list) and len(c) == n for c in columns):
                return None
            return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
        if isinstance(got, list | tuple) and len(got) == n:
            return list(got)
        return None

    def task(self, row: int) -> Any:
        """A fresh copy of row ``row``'s task, its digest checked against the one first
        computed (``DatasetError`` if the row changed since)."""
        data = self._canonical(row)
        if self._known[row]:
            found = row_digest(data)
            at = row * ROW_DIGEST_SIZE
            if found != self._digests[at : at + ROW_DIGEST_SIZE]:
                raise DatasetError(
                    f"dataset[{row}] changed while the run was open (digest "
                    f"{self._digests[at : at + ROW_DIGEST_SIZE].hex()} when first read, "
                    f"{found.hex()} now): a dataset must not change under a run"
                )
        return orjson.loads(data)

    def digests(self, ranges: Iterable[tuple[int, int]]) -> bytes:
        """The digests of the rows of ``ranges``, in order, ``ROW_DIGEST_SIZE`` bytes each;
        each row is checked if it was not yet."""
        size = ROW_DIGEST_SIZE
        parts: list[bytes] = []
        for start, stop in ranges:
            if self._known.find(0, start, stop) != -1:  # a row not checked yet
                self.check(range(start, stop))
            parts.append(bytes(self._digests[start * size : stop * size]))
        return b"".join(parts)

    def __repr__(self) -> str:
        checked = len(self._known) - self._known.count(0)
        return f"<TaskDataset {self.source}: {len(self._rows)} rows, {checked} checked>"
