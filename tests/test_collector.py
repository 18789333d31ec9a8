"""No full collection while a checkpoint runs; the collector comes back as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    EmbeddedGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig
from gymckpt.runtime.lowlevel import collector_paused

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), mutation_p=0.5, lease_s=30.0)


@pytest.fixture
def collector_on() -> Iterator[None]:
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()
        gc.set_threshold(*thresholds)


def _full_collections_allowed() -> bool:
    return gc.isenabled() and gc.get_threshold()[2] < 1 << 20


def test_nested_pauses_restore_the_prior_state(collector_on: None) -> None:
    with collector_paused():
        assert gc.isenabled() and gc.get_threshold()[:2] == (700, 10)  # young ones go on
        assert not _full_collections_allowed()
        with collector_paused():
            assert not _full_collections_allowed()
        assert not _full_collections_allowed()  # the outer pause still holds
    assert gc.get_threshold() == (700, 10, 10)
    with collector_paused():
        gc.set_threshold(500, 5, 5)  # re-tuned by the user meanwhile: theirs stays
    assert gc.get_threshold() == (500, 5, 5)
    with collector_paused(enabled=False):
        assert gc.get_threshold() == (500, 5, 5)


@pytest.mark.parametrize("pause", [True, False])
async def test_a_checkpoint_runs_without_the_collector(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, collector_on: None, pause: bool
) -> None:
    seen: dict[str, bool] = {}
    config = RuntimeConfig(
        control_timeout_s=2.0,
        reply_grace_s=0.5,
        drain_timeout_s=5.0,
        lease_s=30.0,
        pause_collector=pause,
    )
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, tmp_path, rows=8, group_size=2, config=config, max_rows_in_flight=6
        ) as ro:
            ro.coordinator.on_stage = lambda _cid, point: seen.update(
                {point: _full_collections_allowed()}
            )
            await trio.sleep(1)
            assert _full_collections_allowed()
            outcome = await ro.checkpoint()
            assert outcome.ok and gc.get_threshold() == (700, 10, 10)
    assert seen and set(seen.values()) == {not pause}


_PROBE = """
import gc, sys, tempfile
import trio
from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.gym_adapter.environments.calendar import calendar_environment
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig

async def main(freeze):
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedGym.host(calendar_environment(), work_dir=tmp + "/g") as gym:
            before = gc.get_freeze_count()
            cfg = RuntimeConfig(freeze_startup_objects=freeze)
            async with open_rollouts(gym, tmp + "/w", rows=1, group_size=1, config=cfg) as ro:
                async for _ in ro.batches(1):  # a finished run releases the Gym for the next
                    pass
            after = gc.get_freeze_count()
            async with open_rollouts(gym, tmp + "/w2", rows=1, group_size=1, config=cfg):
                pass
            print(before, after, gc.get_freeze_count())

trio.run(main, sys.argv[1] == "1")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("freeze", [True, False])
def test_open_rollouts_freezes_what_lives_at_its_start_once(freeze: bool) -> None:
    """The imports' objects (what every full collection would walk again) are frozen by the
    first open_rollouts of the process, once; the config opts out. A fresh process: the flag
    is per process."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "1" if freeze else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, after, later = (int(x) for x in out.stdout.split())
    assert before == 0
    if freeze:
        assert after > 10_000 and later == after  # the imports, once; not again
    else:
        assert after == later == 0


def test_promote_survivors_freezes_and_every_nth_unfreezes(collector_on: None) -> None:
    """What survives a checkpoint goes to the permanent generation without a walk; every
    FULL_COLLECTION_EVERY-th promotion unfreezes instead, so garbage cycles among frozen
    objects are freed by a later full collection; a disabled collector is left alone."""
    import gymckpt.runtime._collector as collector
    from gymckpt.runtime._shared import FULL_COLLECTION_EVERY
    from gymckpt.runtime.lowlevel import promote_survivors

    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    gc.unfreeze()
    collector._promotions = 0
    try:
        node = Node()
        assert promote_survivors() and gc.get_freeze_count() > 0
        assert id(node) not in {id(o) for o in gc.get_objects()}  # frozen: never walked
        import weakref

        ref = weakref.ref(node)
        del node  # garbage now, but frozen: a full collection does not find it
        gc.collect()
        assert ref() is not None
        frozen = gc.get_freeze_count()
        for _ in range(FULL_COLLECTION_EVERY - 2):
            assert promote_survivors()
        assert not promote_survivors()  # the N-th: unfreeze
        assert gc.get_freeze_count() == 0 and frozen > 0
        gc.collect()
        assert ref() is None  # the cycle is freed
        gc.disable()
        assert not promote_survivors() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
        gc.unfreeze()
        collector._promotions = 0


@pytest.mark.parametrize("pause", [True, False])
async def test_the_checkpoints_columns_are_promoted_after_ownership_and_after_the_cut(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    collector_on: None,
    pause: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ownership's episode columns and the cut's ledger columns (1M entries each at 1M in
    flight) live until publish ends: left in the young generations, every young collection
    walks them (one took 206 ms in publish). The coordinator promotes survivors right after
    each (between the ``after_commit`` and ``before_publish`` hooks), as at resume; not when
    the run opts out (``pause_collector=False``)."""
    import gymckpt.nurseries._coordinator as coordinator

    points: list[str] = []
    real = coordinator.promote_survivors

    def promote() -> bool:
        points.append("promote")
        return real()

    monkeypatch.setattr(coordinator, "promote_survivors", promote)
    config = RuntimeConfig(control_timeout_s=2.0, drain_timeout_s=5.0, pause_collector=pause)
    await _one_checkpoint(tmp_path, config, points)
    between = points[points.index("after_commit") + 1 : points.index("before_publish")]
    assert between == (["promote", "promote"] if pause else [])


async def test_at_resume_the_checkpoints_records_are_let_go_a_slice_at_a_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once Gym runs again, the coordinator lets go of the checkpoint's per-episode records
    (commit replies, ownership, the cut, the manifest) through ``release_in_slices`` in a
    worker thread, the list handed over its only holder: freed in one C call (``list.clear``)
    they held the GIL, and so the loop, for tens of ms at 200k (the heartbeat 57 ms late in
    resume)."""
    import gymckpt.nurseries._coordinator as coordinator

    points: list[str] = []
    given: list[int] = []
    real = coordinator.release_in_slices

    def release(items: list[object]) -> None:
        points.append("release")
        given.append(len(items))
        real(items)
        assert items == []

    monkeypatch.setattr(coordinator, "release_in_slices", release)
    await _one_checkpoint(
        tmp_path, RuntimeConfig(control_timeout_s=2.0, drain_timeout_s=5.0), points
    )
    assert points[points.index("before_resume") + 1 :] == ["release"]
    assert given == [5]


def test_records_promoted_runs_no_collection_and_leaves_the_young_generations_empty(
    collector_on: None,
) -> None:
    """A bulk build of records: no collection inside the block, however much it allocates;
    at its end everything young is frozen (its count back near zero), so no later young
    collection walks it; a collector that was off stays off and nothing is frozen."""
    from gymckpt.runtime.lowlevel import records_promoted

    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.unfreeze()
    gc.callbacks.append(seen)
    try:
        with records_promoted():
            made = [(i, [i]) for i in range(20_000)]  # ~28 young collections' worth
        assert collections == [], "a collection ran while records were made"
        assert gc.isenabled() and gc.get_count()[0] < 10 and gc.get_freeze_count() > 0
        assert id(made) not in {id(o) for o in gc.get_objects()}  # promoted: never walked
        gc.unfreeze()
        gc.disable()
        with records_promoted():
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.callbacks.remove(seen)
        gc.enable()
        gc.unfreeze()


async def _one_checkpoint(tmp_path: Path, config: RuntimeConfig, points: list[str]) -> None:
    """One checkpoint of a small calendar run on 2 embedded instances, a second in, with every
    stage point the coordinator passes appended to ``points``."""
    async with (
        EmbeddedGym.host(
            calendar_environment(config=SIM),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=SIM.host_config(),
        ) as gym,
        open_rollouts(
            gym, tmp_path, rows=8, group_size=2, config=config, max_rows_in_flight=6
        ) as ro,
    ):
        ro.coordinator.on_stage = lambda _cid, point: points.append(point)
        await trio.sleep(1)
        assert (await ro.checkpoint()).ok


def test_records_promoted_blocks_that_overlap_keep_the_collector_off_until_the_last_ends(
    collector_on: None,
) -> None:
    """A host's export thread and its loop's cut slices run blocks that overlap (entered and
    left in any order): the collector stays off until the last block ends, which promotes. On
    main a block that found the collector off (the other's) did nothing, and the first to end
    switched it on under the other, whose build the collector then walked."""
    from gymckpt.runtime.lowlevel import records_promoted

    gc.unfreeze()
    first, second = records_promoted(), records_promoted()
    try:
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)  # the export thread's block ends first
        assert not gc.isenabled(), "the collector came back on under a block still running"
        assert gc.get_freeze_count() == 0
        second.__exit__(None, None, None)
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
        gc.unfreeze()
