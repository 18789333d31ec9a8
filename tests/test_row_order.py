"""The run's row order (``runtime/_row_order.py``): a pure function of (rows, epochs, seed,
position), recorded in the snapshot and resumed exactly where it stood; epochs and shuffles
through ``open_rollouts``, restored mid-epoch and across an epoch boundary; a restore with
another order refused saying what differs; the policy version restored with the snapshot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main
from gymckpt.gym_adapter import Completed, EmbeddedGym, RunRow
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import (
    CompletedGroup,
    DatasetError,
    DatasetMismatch,
    ManifestError,
    RuntimeConfig,
    load_snapshot,
)
from gymckpt.runtime._shared import (
    LEDGER_FILE,
    ORDER_FILE,
    RowOrder,
    check_order,
    load_ledger_snapshot,
    load_order_record,
)
from gymckpt.testing.examples import task_reader

CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0)
TASKS = [{"prompt": f"question {i}", "answer": i} for i in range(8)]
GROUP = 2


# -- the order itself ------------------------------------------------------------------------


def _epochs(order: RowOrder) -> list[list[int]]:
    k = order.per_epoch
    rows = [order.row_at(p) for p in range(len(order))]
    return [rows[e * k : (e + 1) * k] for e in range(order.epochs)]


@pytest.mark.parametrize("size", [1, 2, 3, 16, 100, 1000])
def test_each_epoch_is_a_permutation_of_the_rows(size: int) -> None:
    rows = list(range(7, 7 + size))
    order = RowOrder.of(rows[::-1], None, epochs=3, shuffle_seed=5)
    for epoch in _epochs(order):
        assert sorted(epoch) == rows


def test_the_order_is_a_pure_function_of_rows_seed_and_epoch() -> None:
    a = RowOrder.of(None, 100, epochs=3, shuffle_seed=42, source="x")
    b = RowOrder.of(range(100), None, epochs=3, shuffle_seed=42)
    assert _epochs(a) == _epochs(b)  # recomputed, not stored: a restore gets the same order
    ea = _epochs(a)
    assert ea[0] != ea[1] != ea[2] and ea[0] != list(range(100))  # each epoch its own shuffle
    other = _epochs(RowOrder.of(None, 100, epochs=3, shuffle_seed=43, source="x"))
    assert all(x != y for x, y in zip(ea, other, strict=True))  # each seed its own shuffles
    # epoch e's shuffle does not depend on how many epochs there are
    assert _epochs(RowOrder.of(None, 100, epochs=5, shuffle_seed=42, source="x"))[:3] == ea


def test_numpy_integers_stand_for_rows_and_counts() -> None:
    np = pytest.importorskip("numpy")
    order = RowOrder.of(np.array([3, 1, 2]), None, epochs=2)
    assert [order.row_at(p) for p in range(6)] == [3, 1, 2, 3, 1, 2]
    assert len(RowOrder.of(np.int64(4), None)) == 4


def test_without_a_seed_every_epoch_is_the_order_given() -> None:
    order = RowOrder.of([3, 1, 2], None, epochs=2)
    assert [order.row_at(p) for p in range(6)] == [3, 1, 2, 3, 1, 2]
    assert RowOrder.of(None, 5, source="x").is_identity
    assert not RowOrder.of([0, 1, 2], None).is_identity  # an explicit list: not a range


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"rows": [1, 2, 1]}, r"rows\[2\] is row 1, which rows\[0\] names already"),
        ({"rows": [0, -1]}, r"rows\[1\] is -1, not a row index"),
        ({"rows": [0, 1.0]}, r"rows\[1\] is 1.0, not a row index"),
        ({"rows": [True]}, r"rows\[0\] is True, not a row index"),
        ({"rows": -1}, r"rows=-1: pass a count"),
        ({"rows": True}, r"rows=True: pass a count, row indices, or leave it out"),
        ({"rows": 2.0}, r"rows=2.0: pass a count, row indices, or leave it out"),
        ({"rows": 3, "epochs": 0}, r"epochs=0: pass an int >= 1"),
        ({"rows": 3, "epochs": True}, r"epochs=True: pass an int >= 1"),
        ({"rows": 3, "shuffle_seed": -1}, r"shuffle_seed=-1: pass an int in 0\.\.2\*\*64-1"),
        ({"rows": 3, "shuffle_seed": 1.5}, r"shuffle_seed=1.5: pass an int"),
    ],
)
def test_bad_orders_are_refused_naming_the_value(kw: dict[str, Any], said: str) -> None:
    rows = kw.pop("rows")
    with pytest.raises(DatasetError, match=said):
        RowOrder.of(rows, None, **kw)


def _order(size: int = 10, **kw: Any) -> RowOrder:
    return RowOrder.of(None, size, source="x", **kw)


def test_a_restore_with_another_order_is_refused_saying_what_differs() -> None:
    order = RowOrder.of(None, 10, epochs=2, shuffle_seed=7, source="x")
    record = load_order_record({ORDER_FILE: order.files(13)[ORDER_FILE]})
    assert record is not None and (record.epoch, record.position) == (1, 13)
    check_order(record, RowOrder.of(range(10), None, epochs=2, shuffle_seed=7), 13, "s")
    cases = [
        (_order(epochs=3, shuffle_seed=7), "epochs=2 in the snapshot, 3 now"),
        (_order(epochs=2, shuffle_seed=8), "shuffle_seed=7 in the snapshot, 8 now"),
        (_order(epochs=2), "shuffle_seed=7 in the snapshot, None now"),
        (_order(11, epochs=2, shuffle_seed=7), "10 rows an epoch in the snapshot, 11 now"),
        (RowOrder.of([*range(9), 10], None, epochs=2, shuffle_seed=7), "the rows given differ"),
    ]
    for other, said in cases:
        with pytest.raises(DatasetMismatch, match="s: the row order differs from the snapshot's, "
                           rf"which stood at epoch 1 position 3 of 10: .*{said}"):  # fmt: skip
            check_order(record, other, 13, "s")
    with pytest.raises(ManifestError, match="position 13, its ledger's cursor is 12"):
        check_order(record, order, 12, "s")


def test_a_single_unshuffled_epoch_may_change_after_its_cursor() -> None:
    record = load_order_record(RowOrder.of([4, 2, 0, 1], None).files(2))
    assert record is not None and record.covered == 2
    check_order(record, RowOrder.of([4, 2, 9, 3, 5], None), 2, "s")  # positions 0, 1 the same
    with pytest.raises(DatasetMismatch, match="the rows given differ"):
        check_order(record, RowOrder.of([4, 3, 0, 1], None), 2, "s")


def test_a_snapshot_without_an_order_restores_only_in_the_default_order() -> None:
    check_order(None, RowOrder.of(None, 10, source="x"), 6, "s")
    check_order(None, RowOrder.of([0, 1, 2, 3, 4, 5, 9], None), 6, "s")
    check_order(None, RowOrder.of([5, 4], None), 0, "s")  # nothing reserved yet
    with pytest.raises(DatasetMismatch, match=r"made before gymckpt recorded its row order"):
        check_order(None, RowOrder.of([1, 0, 2, 3, 4, 5], None), 6, "s")
    with pytest.raises(DatasetMismatch, match="no epochs= or shuffle_seed="):
        check_order(None, RowOrder.of(None, 10, shuffle_seed=1, source="x"), 6, "s")


def test_a_damaged_order_file_is_a_manifest_error() -> None:
    raw = orjson.loads(RowOrder.of(None, 10, epochs=2, source="x").files(13)[ORDER_FILE])
    for key, value, said in [
        ("version", 2, "version 2, this gymckpt reads version 1"),
        ("epoch", 0, "epoch 0 and covered 10 do not fit position 13"),
        ("position", 21, "position 21 of 2 epochs of 10 rows"),
    ]:
        with pytest.raises(ManifestError, match=said):
            load_order_record({ORDER_FILE: orjson.dumps({**raw, key: value})})


# -- through open_rollouts ---------------------------------------------------------------------

K, EPOCHS, SEED = len(TASKS), 3, 11


async def _train(
    workdir: Path,
    *,
    stop_after: int | None = None,
    sent: list[RunRow] | None = None,
    policy: int | None = None,
    order: dict[str, Any] | None = None,
) -> tuple[list[CompletedGroup], Path | None, int]:
    """Train (restoring first); with ``stop_after``, checkpoint once that many groups are
    trained and leave (the snapshot stays, as after a crash). Returns the groups trained,
    the snapshot and the policy version the run started with."""
    trained: list[CompletedGroup] = []

    def dispatched(_instance: str, rows: Sequence[RunRow]) -> None:
        if sent is not None:
            sent.extend(rows)

    options = {"epochs": EPOCHS, "shuffle_seed": SEED} if order is None else order
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        async with open_rollouts(
            gym,
            workdir,
            group_size=GROUP,
            config=CONFIG,
            dataset=TASKS,
            max_rows_in_flight=3,
            on_dispatch=dispatched,
            **options,
        ) as ro:
            started_at = ro.policy_version
            if policy is not None:
                ro.set_policy_version(policy)
            while batch := await ro.next_batch(1):
                trained += batch
                if stop_after is not None and len(trained) >= stop_after:
                    await trio.sleep(0.5)  # mid-turn: episodes in flight at the cut
                    outcome = await ro.checkpoint(b"{}")
                    assert outcome.ok and outcome.snapshot is not None
                    return trained, outcome.snapshot.path, started_at
    return trained, None, started_at


@pytest.mark.parametrize(("stop_after", "epoch"), [(2, 0), (7, 1)])
async def test_a_seeded_multi_epoch_run_resumes_where_the_order_stood(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, stop_after: int, epoch: int
) -> None:
    order = RowOrder.of(None, K, epochs=EPOCHS, shuffle_seed=SEED, source="x")
    before, snap, _ = await _train(tmp_path, stop_after=stop_after)
    assert snap is not None
    files = load_snapshot(snap).files
    record = load_order_record(files)
    ledger = load_ledger_snapshot(files[LEDGER_FILE])
    assert record is not None and record.position == ledger.next_row
    assert record.epoch == epoch and (record.epochs, record.shuffle_seed) == (EPOCHS, SEED)
    assert main(["verify", str(snap)]) == 0
    in_flight = {a.row for a in ledger.attempts}
    if epoch == 1:  # the cut straddles the boundary: rows of both epochs in flight or ready
        assert min(in_flight) < K <= record.position
    sent: list[RunRow] = []
    after, _, _ = await _train(tmp_path, sent=sent)
    groups = before + after
    assert sorted(g.position for g in groups) == list(range(K * EPOCHS))  # each once
    for g in groups:
        assert g.row == order.row_at(g.position)  # the order a pure function recomputes
        assert g.rollout_ids[0].startswith(f"{g.position}-")
        assert all(r.payload["seen"] == [TASKS[g.row]] * 3 for r in g.results)
    assert Counter(g.row for g in groups) == Counter({r: EPOCHS for r in range(K)})
    fresh = [r for r in sent if r.attempt == 0 and r.restored_from is None]
    positions = list(dict.fromkeys(int(r.rollout_id.split("-")[0]) for r in fresh))
    assert positions == sorted(positions) and positions[0] <= record.position
    assert all(r.row == order.row_at(int(r.rollout_id.split("-")[0])) for r in sent)


async def test_a_restore_with_another_seed_is_refused_before_gym_runs_anything(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _train(tmp_path, stop_after=2)
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=2) as gym:
        with pytest.raises(DatasetMismatch, match="shuffle_seed=11 in the snapshot, 12 now"):
            async with open_rollouts(
                gym,
                tmp_path,
                group_size=GROUP,
                config=CONFIG,
                dataset=TASKS,
                epochs=EPOCHS,
                shuffle_seed=12,
            ):
                pytest.fail("restored")
        for name in gym.instances:
            inv = await gym.inventory(name)
            assert inv.unclaimed == inv.running == inv.parked == ()


async def test_the_policy_version_is_restored_and_carried_by_every_call_after(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    _, snap, _ = await _train(tmp_path, stop_after=2, policy=5, order={})
    assert snap is not None
    sent: list[RunRow] = []
    _, _, started_at = await _train(tmp_path, sent=sent, order={})
    assert started_at == 5
    assert sent and {r.policy_version for r in sent} == {5}
    assert any(r.restored_from is not None for r in sent)  # claims carry it too


async def test_a_row_in_two_epochs_is_two_slots_in_gym(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Dataset row 5 at positions 1 (a retry, attempt 1) and 9 (the next epoch, attempt 0),
    running at once on one instance: each is a slot of its own (the slot key is the rollout
    ID's head), so neither fences the other or is taken for the other's stale attempt."""
    async with EmbeddedGym.host(task_reader(turn_s=1.0), instances=1) as gym:
        name = gym.instances[0]
        replies: list[Any] = []

        async def drain(rows: list[RunRow]) -> None:
            async for batch in await gym.run(name, rows):
                replies.extend(batch)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, [RunRow("1-0-a1", 5, 0, 1, task=TASKS[5])])
            await trio.sleep(0.5)
            nursery.start_soon(drain, [RunRow("9-0", 5, 0, 0, task=TASKS[5])])
    assert sorted(r.rollout_id for r in replies) == ["1-0-a1", "9-0"]
    assert all(isinstance(r, Completed) for r in replies), replies
