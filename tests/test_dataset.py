"""The dataset adapter (``runtime/_dataset.py``): each input kind, bad rows named, digests."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gymckpt.runtime import BadInput, DatasetError, TaskDataset
from gymckpt.runtime._dataset import ROW_DIGEST_SIZE, canonical_task, row_digest, row_ranges

TASKS = [{"prompt": f"q{i}", "answer": i, "meta": {"z": 1, "a": [1.5, None]}} for i in range(5)]


def _as_read(dataset: TaskDataset) -> list[Any]:
    return [dataset.task(i) for i in range(len(dataset))]


def test_a_list_is_indexed_and_each_task_is_a_fresh_equal_copy() -> None:
    ds = TaskDataset.of(TASKS)
    assert len(ds) == 5
    first, again = ds.task(0), ds.task(0)
    assert first == TASKS[0] and again == TASKS[0]
    assert first is not TASKS[0] and first is not again
    first["meta"]["a"].append("edited by an environment")
    assert TASKS[0]["meta"]["a"] == [1.5, None]  # the trainer's row is not touched
    assert list(ds.task(1)) == sorted(TASKS[1])  # keys sorted: the canonical form


def test_an_iterable_is_materialised_once() -> None:
    pulled: list[int] = []

    def tasks() -> Any:
        for i in range(4):
            pulled.append(i)
            yield {"i": i}

    ds = TaskDataset.of(tasks())
    assert pulled == [0, 1, 2, 3]
    assert _as_read(ds) == [{"i": i} for i in range(4)]
    assert pulled == [0, 1, 2, 3]


def test_a_jsonl_file_by_str_or_path(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in TASKS))
    for given in (str(path), path):
        ds = TaskDataset.of(given)
        assert _as_read(ds) == TASKS
        assert ds.digest(3) == TaskDataset.of(TASKS).digest(3)  # same identity as the list
    path.write_bytes(b'{"a": 1}\r\n{"a": 2}')  # CRLF, no newline at the end
    assert _as_read(TaskDataset.of(path)) == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"a": 1}\n\n{"a": 2}\n', "line 2 (row 1) is empty"),
        (b'{"a": 1}\n{"a": NaN}\n', "line 2 (row 1) is not valid JSON"),
        (b'{"a": 1}\n{"a": 2\n', "line 2 (row 1) is not valid JSON"),
    ],
)
def test_a_bad_jsonl_line_is_named(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=r"tasks\.jsonl: " + re.escape(said)):
        TaskDataset.of(path)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b'{"n": 18446744073709551616}', "line 2: dataset[1] is not plain JSON"),
        (b'{"n": [-9223372036854775809]}', "line 2: dataset[1] is not plain JSON"),
        (b'{"a": 1, "a": 2}', "line 2 (row 1) repeats the key 'a' in one object"),
        (b'{"x": {"b": [], "b": []}}', "line 2 (row 1) repeats the key 'b' in one object"),
        (b'{"n": 1e400}', "line 2 (row 1) is not valid JSON (1e400 is beyond a finite float"),
    ],
)
def test_a_jsonl_row_is_held_to_a_lists_rules(tmp_path: Path, line: bytes, said: str) -> None:
    """An integer beyond 64 bits is refused (never a float), as a list's row is; an object
    that repeats a key is refused (never its last value); the file and the line are named."""
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"a": 1}\n' + line + b"\n")
    with pytest.raises(DatasetError, match=r"tasks\.jsonl: " + re.escape(said)):
        TaskDataset.of(path)
    if said.endswith("is not plain JSON"):  # the list form refuses the same row alike
        with pytest.raises(DatasetError, match=re.escape("dataset[1] is not plain JSON")):
            TaskDataset.of([{"a": 1}, json.loads(line)]).check(range(2))


def test_64_bit_integers_in_a_jsonl_row_stay_exact(tmp_path: Path) -> None:
    tasks = [{"u": 2**64 - 1, "i": -(2**63), "big": [2**53 + 1]}]
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(
        b'{"u": 18446744073709551615, "i": -9223372036854775808, "big": [9007199254740993]}\n'
    )
    ds = TaskDataset.of(path)
    assert ds.task(0) == tasks[0] and type(ds.task(0)["big"][0]) is int
    assert ds.digest(0) == TaskDataset.of(tasks).digest(0)  # the same row as the list's


def test_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read it") as caught:
        TaskDataset.of(tmp_path / "nope.jsonl")
    assert isinstance(caught.value, BadInput)


class _Sized:
    """Anything with ``__len__`` and ``__getitem__`` (what a Hugging Face Dataset offers)."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, int]:
        self.reads += 1
        if i == 2:
            raise KeyError("broken shard")
        return {"i": i}


def test_a_sized_indexable_is_read_lazily_and_its_failure_named() -> None:
    src = _Sized(1000)
    ds = TaskDataset.of(src)
    assert src.reads == 0 and len(ds) == 1000
    assert ds.task(7) == {"i": 7}
    with pytest.raises(DatasetError, match=r"dataset\[2\]: reading it from .*_Sized.*KeyError"):
        ds.task(2)


@pytest.mark.parametrize(
    "given",
    [{"a": 1}, {1, 2}, b"{}", 42, None],
    ids=["mapping", "set", "bytes", "int", "none"],
)
def test_what_is_not_a_dataset_is_refused(given: Any) -> None:
    with pytest.raises(DatasetError, match="dataset: "):
        TaskDataset.of(given)


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize(
    ("task", "place"),
    [
        ({"x": math.nan}, r"dataset\[1\]\.x is nan"),
        ({"x": [1, math.inf]}, r"dataset\[1\]\.x\[1\] is inf"),
        ({"x": {1, 2}}, r"dataset\[1\]\.x is a set"),
        ({"x": (1, 2)}, r"dataset\[1\]\.x is a tuple"),
        ({"x": np.arange(3)}, r"dataset\[1\]\.x is a numpy ndarray"),
        ({"x": np.float32(1.0)}, r"dataset\[1\]\.x is a numpy float32"),
        ({"x": {3: "a"}}, r"dataset\[1\]\.x: key 3 is int"),
        ({"x": datetime.date(2026, 1, 1)}, r"dataset\[1\]\.x is a date"),
        ({"x": uuid.UUID(int=1)}, r"dataset\[1\]\.x is a UUID"),
        ({"x": _Point(1)}, r"dataset\[1\]\.x is a _Point"),
        ({"x": 1 << 70}, r"dataset\[1\] is not plain JSON"),
    ],
)
def test_a_bad_row_is_named_with_the_place(task: Any, place: str) -> None:
    ds = TaskDataset.of([{"ok": True}, task, {"ok": True}])
    with pytest.raises(DatasetError, match=place):
        ds.check(range(3))
    ds.check([0, 2])  # the good rows are fine


def test_rows_outside_are_refused() -> None:
    ds = TaskDataset.of(TASKS)
    with pytest.raises(DatasetError, match=r"row 5 is outside the dataset \(5 rows\)"):
        ds.check([0, 5])
    with pytest.raises(DatasetError, match="row -1 is outside"):
        ds.task(-1)


def test_the_digest_is_of_the_canonical_form_and_kept() -> None:
    ds = TaskDataset.of([{"b": 1, "a": [2, 3]}, {"a": [2, 3], "b": 1}, {"a": [3, 2], "b": 1}])
    canonical = canonical_task({"a": [2, 3], "b": 1}, "t")
    assert canonical == b'{"a":[2,3],"b":1}'
    assert ds.digest(0) == ds.digest(1) == row_digest(canonical)  # key order does not count
    assert len(ds.digest(0)) == ROW_DIGEST_SIZE
    assert ds.digest(2) != ds.digest(0)  # list order does
    assert ds.digests([(0, 2)]) == ds.digest(0) + ds.digest(1)
    assert ds.digests([(2, 3), (0, 1)]) == ds.digest(2) + ds.digest(0)


def test_a_row_edited_under_the_run_is_refused_when_dispatched() -> None:
    tasks = [{"i": 0}, {"i": 1}]
    ds = TaskDataset.of(tasks)
    ds.check(range(2))
    tasks[1]["i"] = 99
    assert ds.task(0) == {"i": 0}
    with pytest.raises(DatasetError, match=r"dataset\[1\] changed while the run was open"):
        ds.task(1)


def test_row_ranges() -> None:
    assert row_ranges(range(4)) == [(0, 4)]
    assert row_ranges(range(0)) == []
    assert row_ranges([5, 1, 2, 3, 9, 8]) == [(1, 4), (5, 6), (8, 10)]
    assert row_ranges(range(0, 6, 2)) == [(0, 1), (2, 3), (4, 5)]


def test_a_run_row_with_its_task_crosses_the_ray_wire() -> None:
    from gymckpt.gym_adapter import RunRow
    from gymckpt.gym_adapter.transports._wire import decode, encode

    task = TaskDataset.of(TASKS).task(2)
    rows = (
        RunRow("2-0", 2, 0, 0, task=task, policy_version=3),
        RunRow("2-1-a1", 2, 1, 1, restored_from="2-1", task=task),
        RunRow("4-0", 4, 0, 0),
    )
    back = decode(encode(rows, tuple[RunRow, ...]), tuple[RunRow, ...])
    assert back == rows
    assert back[0].task == TASKS[2] and back[2].task is None


def test_a_hugging_face_dataset_is_read_by_index() -> None:
    datasets = pytest.importorskip("datasets")  # an optional extra: gymckpt[datasets]
    tasks = [{"prompt": f"q{i}", "answer": i, "tags": ["a", str(i)]} for i in range(6)]
    import pyarrow

    # from a table, with a fingerprint given: nothing hashed with dill, nothing cached on disk
    hf = datasets.Dataset(pyarrow.Table.from_pylist(tasks), fingerprint="test-tasks")
    ds = TaskDataset.of(hf)
    assert len(ds) == 6 and "Dataset" in ds.source
    assert _as_read(ds) == tasks
    assert ds.digests([(0, 6)]) == TaskDataset.of(tasks).digests([(0, 6)])


class _Columnar:
    """Slices come back as columns, as a Hugging Face Dataset's do; rows as dicts."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows, self.slices, self.reads = rows, 0, 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            self.slices += 1
            part = self.rows[i]
            return {k: [r[k] for r in part] for k in part[0]}
        self.reads += 1
        return self.rows[i]


def test_a_range_is_read_in_column_slices_with_the_same_digests() -> None:
    tasks = [{"prompt": f"q{i}", "answer": [i, i + 1]} for i in range(10_000)]
    src = _Columnar(tasks)
    ds = TaskDataset.of(src)
    ds.check(range(len(tasks)))
    assert src.slices == 3 and src.reads == 0  # 4096 rows a slice
    assert ds.digests([(0, 10_000)]) == TaskDataset.of(tasks).digests([(0, 10_000)])
    tasks[5000]["answer"] = [math.nan]
    with pytest.raises(DatasetError, match=r"dataset\[5000\]\.answer\[0\] is nan"):
        TaskDataset.of(_Columnar(tasks)).check(range(len(tasks)))
