"""The dataset's identity in a snapshot, and a restore against another dataset refused before
Gym installs anything (in process; ``test_dataset_crash.py`` does it across real processes)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main
from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import DatasetMismatch, ManifestError, RuntimeConfig, load_snapshot
from gymckpt.runtime._dataset import TaskDataset
from gymckpt.runtime._shared import (
    COMMIT_MARKER,
    DATASET_FILE,
    DATASET_ROWS_FILE,
    LEDGER_FILE,
    check_dataset,
    load_dataset_record,
    load_ledger_snapshot,
)
from gymckpt.testing.examples import task_reader

CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0)
TASKS = [{"prompt": f"question {i}", "answer": i} for i in range(40)]
GROUP = 2


async def _checkpoint(workdir: Path, dataset: Any, **kw: Any) -> Path:
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        async with open_rollouts(
            gym,
            workdir,
            group_size=GROUP,
            config=CONFIG,
            max_rows_in_flight=6,
            **kw,
            **({} if dataset is None else {"dataset": dataset}),
        ) as ro:
            await ro.next_batch(2)
            await trio.sleep(1.5)
            outcome = await ro.checkpoint()
            assert outcome.ok and outcome.episodes > 0 and outcome.snapshot is not None
            return outcome.snapshot.path


async def _refused(workdir: Path, dataset: Any, said: str, **kw: Any) -> None:
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        with pytest.raises(DatasetMismatch, match=said):
            async with open_rollouts(
                gym,
                workdir,
                group_size=GROUP,
                config=CONFIG,
                **kw,
                **({} if dataset is None else {"dataset": dataset}),
            ):
                pytest.fail("restored")
        stats = await gym.statistics()
        for name, inst in zip(gym.instances, stats.instances, strict=True):
            inv = await gym.inventory(name)
            assert inv.unclaimed == inv.running == inv.parked == ()
            assert inst.restored == 0 and inst.episodes_started == 0


def _edited(row: int) -> list[dict[str, Any]]:
    tasks = [dict(t) for t in TASKS]
    tasks[row]["prompt"] += "!"
    return tasks


async def test_the_snapshot_records_the_rows_reserved_before_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    snap = await _checkpoint(tmp_path, TASKS)
    loaded = load_snapshot(snap)
    found = load_dataset_record(loaded.files)
    assert found is not None
    record, rows_bin = found
    next_row = load_ledger_snapshot(loaded.files[LEDGER_FILE]).next_row
    assert 0 < next_row < len(TASKS)
    assert record.rows == ((0, next_row),) and record.length == len(TASKS)
    assert rows_bin == TaskDataset.of(TASKS).digests([(0, next_row)])
    assert main(["verify", str(snap)]) == 0


async def test_an_edited_row_is_refused_naming_the_first_and_both_digests(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _checkpoint(tmp_path, TASKS)
    tasks = _edited(3)
    tasks[1]["answer"] = -1
    old, new = TaskDataset.of(TASKS).digest(1).hex(), TaskDataset.of(tasks).digest(1).hex()
    await _refused(
        tmp_path,
        tasks,
        rf"dataset row 1 differs from the snapshot's: row digest {old} in the "
        rf"snapshot, {new} in .*restore with the dataset the snapshot was made with",
    )


async def test_rows_after_the_cursor_may_differ_or_be_added(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    snap = await _checkpoint(tmp_path, TASKS)
    next_row = load_ledger_snapshot(load_snapshot(snap).files[LEDGER_FILE]).next_row
    tasks = [*_edited(next_row), {"prompt": "appended", "answer": 99}]
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        async with open_rollouts(
            gym, tmp_path, group_size=GROUP, config=CONFIG, dataset=tasks
        ) as ro:
            assert ro.restore_summary is not None and ro.restore_summary.restored > 0
            trained = [g async for batch in ro.batches(groups_per_step=4) for g in batch]
    assert {g.row for g in trained} >= {next_row, len(TASKS)}
    for group in trained:
        assert all(r.payload["seen"][-1] == tasks[group.row] for r in group.results)


async def test_a_shorter_dataset_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _checkpoint(tmp_path, TASKS)
    await _refused(
        tmp_path,
        TASKS[:2],
        r"the dataset \(.*\) has 2 rows, but the snapshot used rows up to "
        r"row \d+ \(row 2 is missing; the snapshot's dataset had 40 rows\)",
    )


async def test_a_dataset_on_one_side_only_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _checkpoint(tmp_path / "with", TASKS)
    await _refused(
        tmp_path / "with",
        None,
        r"made with a dataset .*40 rows, blake2b-16:[0-9a-f]{32}\), "
        "this run passes none: pass the same dataset=",
        rows=len(TASKS),
    )
    await _checkpoint(tmp_path / "without", None, rows=len(TASKS))
    await _refused(
        tmp_path / "without", TASKS, r"made without a dataset .*leave dataset= out to resume it"
    )


async def test_a_damaged_dataset_file_is_a_manifest_error(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    snap = await _checkpoint(tmp_path, TASKS)
    rows_bin = bytearray((snap / DATASET_ROWS_FILE).read_bytes())
    rows_bin[0] ^= 1
    (snap / DATASET_ROWS_FILE).write_bytes(bytes(rows_bin))
    marker = orjson.loads((snap / COMMIT_MARKER).read_bytes())
    marker["files"][DATASET_ROWS_FILE] = hashlib.sha256(rows_bin).hexdigest()
    (snap / COMMIT_MARKER).write_bytes(orjson.dumps(marker))  # a careful hand-editor
    with pytest.raises(ManifestError, match=rf"{DATASET_ROWS_FILE}: digest blake2b-16:"):
        load_dataset_record(load_snapshot(snap).files)
    assert main(["verify", str(snap)]) != 0
    async with EmbeddedGym.host(task_reader(), instances=2) as gym:
        with pytest.raises(ManifestError, match=DATASET_ROWS_FILE):
            async with open_rollouts(gym, tmp_path, group_size=GROUP, dataset=TASKS):
                pytest.fail("restored")


def test_check_dataset_names_the_first_difference_among_many_rows() -> None:
    tasks = [{"i": i} for i in range(10_000)]
    ds = TaskDataset.of(tasks)
    from gymckpt.runtime._shared import DatasetIdentity

    files = DatasetIdentity(ds, [], lambda cursor: [(0, cursor)]).files(9_000)
    found = load_dataset_record(files)
    check_dataset(found, TaskDataset.of(tasks), "snap")
    for row in (0, 4095, 4096, 8999):
        edited = list(tasks)
        edited[row] = {"i": -1}
        edited[8999] = {"i": -2}
        with pytest.raises(DatasetMismatch, match=rf"snap: dataset row {row} differs"):
            check_dataset(found, TaskDataset.of(edited), "snap")
    edited = list(tasks)
    edited[9_000] = {"i": -1}  # not covered: below the cursor only
    check_dataset(found, TaskDataset.of(edited), "snap")
    assert DATASET_FILE in files
