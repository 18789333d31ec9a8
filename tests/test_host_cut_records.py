"""An unaligned commit's records straight from the cut's boundary marks
(``gym_adapter.host._records.cut_records``): the same bytes ``build_records`` writes from stand-ins
of the same cut, with no record object per session; every object of a commit made durable
before any index names one (``write_all``); and big lists freed a slice at a time
(``free_in_slices``), so a worker thread never frees 200k objects in one C call.

Episodes are bare records with marks; no host runs (the whole path runs in
``test_host_cut_slices`` and, byte for byte, in ``test_golden``'s unaligned snapshot)."""

from __future__ import annotations

import itertools
import math
import random
from operator import itemgetter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from gymckpt.gym_adapter.host import _records
from gymckpt.gym_adapter.host._cut import mark_boundary, stand_ins, take_cut
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import MOVING, Episode, StagedModelCall
from gymckpt.gym_adapter.host._records import (
    DUMP_SLICE,
    FREE_SLICE,
    SORT_SLICE,
    KeptExportError,
    RecordsToWrite,
    build_records,
    cut_records,
    free_in_slices,
    sorted_in_slices,
    write_all,
)
from gymckpt.runtime._shared import RECORDS_FILE, chunk_records
from gymckpt.runtime.lowlevel import SnapshotObjects


class Part:
    """A participant whose ``export`` returns its live state (plain data)."""

    def __init__(self, name: str, kind: str, retained: bool = False) -> None:
        self.name, self.kind, self.retained = name, kind, retained

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data


AGENT = Part("agent", "simple_agent")
CALENDAR = Part("calendar", "environment", retained=True)
TOOL = Part("tool", "tool.x")


def environment(model: bool = True) -> Any:
    return SimpleNamespace(
        agent=AGENT, participants=(CALENDAR, TOOL), model=object() if model else None
    )


def episode(rid: str, row: int, turn: int, attempt: int = 0) -> Episode:
    """An episode whose states have keys out of order, nesting, floats and text to escape."""
    info = EpisodeInfo(rid, row, 0, attempt, 0, "gym-0")
    sessions = {
        "agent": {"z": [row, 0.1, 1e-310], "a": {"y": 'é\n"', "b": None}},
        "calendar": {"events": [{"when": turn, "title": f"t{turn}"}] * (row % 3)},
        "tool": [row, {"k": True, "c": -(2**62)}],
    }
    ep = Episode(info, sessions, MOVING, turn=turn)
    ep.staged = [
        StagedModelCall(f"{rid}:t{t}-c0", {"text": f"a{t}", "n": t / 3}, "0" * 64, t)
        for t in range(turn)
    ]
    ep.mark = mark_boundary((AGENT, CALENDAR, TOOL), ep)
    return ep


def both(
    episodes: list[Episode], kept: list[Any], owner: str = "calendar", model: bool = True
) -> tuple[Any, Any]:
    """(``cut_records``' records, ``build_records``' records from stand-ins) of one cut."""
    taken, bad = take_cut(episodes)
    assert bad == []
    taken.sort(key=lambda c: c.ep.rollout_id)
    env = environment(model)
    fast = cut_records(env, owner, (CALENDAR,), "c7", taken, kept)
    held = stand_ins((AGENT, CALENDAR, TOOL), taken, [])
    slow, refused = build_records(
        env, owner, (CALENDAR,), "c7", held, kept, None, lambda ep: False, exported=True
    )
    assert refused == []
    return fast, slow


@pytest.mark.parametrize("owner", ["calendar", "agent"])
@pytest.mark.parametrize("model", [True, False])
@pytest.mark.parametrize("with_kept", [True, False])
def test_records_from_the_marks_are_the_bytes_build_records_writes(
    owner: str, model: bool, with_kept: bool
) -> None:
    # enough episodes for several chunks; IDs whose order differs from their keys' order, a
    # non-canonical ID (its key is row-slot), later attempts; kept slots of ended episodes
    rids = [f"{row}-0" if row % 5 else f"{row}-0-a2" for row in range(3000)]
    episodes = [
        episode(rid, row, row % 4, 2 if rid.endswith("a2") else 0) for row, rid in enumerate(rids)
    ]
    episodes.append(episode("odd \u00fc id", 4000, 1))
    kept = [
        ("17-3", "17-3-a1", 1, {"calendar": {"events": [{"z": 1, "a": 2}]}}),
        ("0-9", "0-9", 0, {"calendar": {}}),
    ]
    # the odd ID sorts last, its key (4000-0) between others: a retained list is by key
    fast, slow = both(episodes, kept if with_kept else [], owner, model)
    assert fast is not None
    assert sorted(fast) == sorted(slow)
    for server in slow:
        assert fast[server].head == slow[server].head, server
        assert fast[server].chunks == slow[server].chunks, server
    assert len(fast["agent"].chunks["sessions"]) > 1  # boundaries by content, as chunk_records'


def test_an_empty_cut_has_the_records_of_an_empty_commit() -> None:
    fast, slow = both([], [])
    assert fast is not None
    assert {s: (r.head, r.chunks) for s, r in fast.items()} == {
        s: (r.head, r.chunks) for s, r in slow.items()
    }


@pytest.mark.parametrize(
    "kept, staged",
    [
        ([("0-9", "0-9", 0, {"calendar": {"x": math.nan}})], None),
        ([], {"text": math.inf}),
    ],
)
def test_what_is_not_finite_plain_data_is_left_to_build_records(kept: Any, staged: Any) -> None:
    ep = episode("1-0", 1, 1)
    if staged is not None:
        ep.staged = [StagedModelCall("1-0:t0-c0", staged, "0" * 64, 0)]
    taken, _ = take_cut([ep])
    assert cut_records(environment(), "calendar", (CALENDAR,), "c7", taken, kept) is None


def test_the_records_from_the_marks_parse_and_serialise_no_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each entry is formatted around its mark's bytes: no state is read back or serialised
    again at the commit (only each episode's rollout ID and key are serialised)."""
    episodes = [episode(f"{row}-0", row, 1) for row in range(50)]
    expected, _ = both(episodes, [], model=False)
    taken, _ = take_cut(episodes)
    taken.sort(key=lambda c: c.ep.rollout_id)
    dumped: list[Any] = []
    dumps = orjson.dumps

    def spy(value: Any, *args: Any, **kwargs: Any) -> bytes:
        dumped.append(value)
        return dumps(value, *args, **kwargs)

    def no_loads(data: Any) -> Any:
        raise AssertionError("a state was read back at the commit")

    monkeypatch.setattr(orjson, "dumps", spy)
    monkeypatch.setattr(orjson, "loads", no_loads)
    fast = cut_records(environment(model=False), "calendar", (CALENDAR,), "c7", taken, [])
    monkeypatch.undo()
    assert fast is not None
    assert {s: r.chunks for s, r in fast.items()} == {s: r.chunks for s, r in expected.items()}
    assert all(isinstance(v, str) for v in dumped), [type(v) for v in dumped]


def nested(levels: int) -> Any:
    """A list nested ``levels`` deep."""
    deep: Any = []
    for _ in range(levels - 1):
        deep = [deep]
    return deep


def test_a_state_too_deep_for_a_chunk_is_refused_by_its_mark_and_by_build_records() -> None:
    # 253 levels: orjson writes it alone and in a mark's array, not where a chunk holds it
    ep = episode("1-0", 1, 1)
    ep.sessions["tool"] = nested(253)
    ep.mark = mark_boundary((AGENT, CALENDAR, TOOL), ep)
    problem = (
        "tool session state nests too deep: a snapshot's records hold it 2 levels down, "
        "where JSON may nest 254 levels; keep its own nesting to at most 252 levels"
    )
    assert ep.mark.problem is not None and ep.mark.problem.endswith(problem)
    # an aligned commit refuses the episode (the host fails it), not the whole commit
    ok = episode("2-0", 2, 1)
    records, refused = build_records(
        environment(), "calendar", (CALENDAR,), "c7", [ep, ok], [], None
    )
    assert [(r.rollout_id, r.message.endswith(problem)) for r in refused] == [("1-0", True)]
    assert [s["rollout_id"] for s in read_sessions(records["tool"])] == ["2-0"]


def test_a_kept_state_too_deep_for_a_chunk_is_left_to_build_records() -> None:
    kept = [("0-9", "0-9", 0, {"calendar": nested(253)})]
    taken, _ = take_cut([episode("1-0", 1, 1)])
    assert cut_records(environment(), "calendar", (CALENDAR,), "c7", taken, kept) is None
    with pytest.raises(KeptExportError, match="calendar session state nests too deep"):
        build_records(environment(), "calendar", (CALENDAR,), "c7", [], kept, None)


def test_a_state_as_deep_as_a_chunk_holds_is_written_alike_and_reads_back() -> None:
    ep = episode("1-0", 1, 1)
    ep.sessions["tool"] = nested(252)
    ep.mark = mark_boundary((AGENT, CALENDAR, TOOL), ep)
    kept = [("0-9", "0-9", 0, {"calendar": nested(252)})]
    fast, slow = both([ep], kept)
    assert fast is not None
    assert {s: r.chunks for s, r in fast.items()} == {s: r.chunks for s, r in slow.items()}
    assert read_sessions(fast["tool"])[0]["state"] == nested(252)
    assert read_sessions(fast["calendar"])[0]["state"] == nested(252)


def read_sessions(records: Any) -> list[Any]:
    """The sessions a participant's chunked records hold, read back."""
    return [e for chunk in records.chunks["sessions"] for e in orjson.loads(chunk)]


def test_every_object_is_durable_before_the_first_index_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    put_all, sync, atomic = (
        SnapshotObjects.put_all,
        SnapshotObjects.sync,
        _records.write_atomic,
    )

    def put(self: SnapshotObjects, datas: Any) -> Any:
        events.append(f"put {len(datas)}")
        return put_all(self, datas)

    def synced(self: SnapshotObjects) -> None:
        events.append(f"sync {len(self.dirty) > 0}")
        sync(self)

    def index(path: Path, data: bytes) -> None:
        events.append(f"index {path.parent.name}")
        atomic(path, data)

    monkeypatch.setattr(SnapshotObjects, "put_all", put)
    monkeypatch.setattr(SnapshotObjects, "sync", synced)
    monkeypatch.setattr(_records, "write_atomic", index)
    records = {
        name: chunk_records(
            {"participant": name, "sessions": [{"rollout_id": f"{i}-0"} for i in range(n)]}
        )
        for name, n in (("a", 3000), ("b", 5))
    }
    write_all(
        [RecordsToWrite(tmp_path / n, r, None, n) for n, r in records.items()],
        SnapshotObjects.of_snapshot(tmp_path, None),
    )
    chunks = sum(len(r.chunks["sessions"]) for r in records.values())
    # every chunk of both participants placed together, one sync, then the indexes
    assert events == [f"put {chunks}", "sync True", "index a", "index b"]
    for name in records:
        index = orjson.loads((tmp_path / name / RECORDS_FILE).read_bytes())
        for ref in index["chunks"]["sessions"]:
            assert SnapshotObjects.of_snapshot(tmp_path, None).own.has(ref)


class Noted:
    """An item that notes, as it is freed, how long its list still was."""

    def __init__(self, log: list[int], items: list[Any]) -> None:
        self.log, self.items = log, items

    def __del__(self) -> None:
        self.log.append(len(self.items))


def test_a_list_is_freed_a_slice_at_a_time() -> None:
    log: list[int] = []
    items: list[Any] = []
    items.extend(Noted(log, items) for _ in range(3 * FREE_SLICE + 5))
    free_in_slices(items)
    assert items == [] and len(log) == 3 * FREE_SLICE + 5
    # each C call freed at most FREE_SLICE items: as many frees saw each length
    sizes = {n: log.count(n) for n in set(log)}
    assert max(sizes.values()) <= FREE_SLICE and len(sizes) == 4


async def test_an_instance_s_writes_run_beside_the_next_instance_s_export() -> None:
    """Real threads (no MockClock): one export thread per loop, and beside it the writes of
    the records already built (``offload(..., io=True)``), so one instance's fsyncs overlap
    the next one's export; the exports themselves stay one at a time."""
    import threading

    import trio

    release, started, order = threading.Event(), trio.Event(), []

    def export(name: str) -> str:
        order.append(f"export {name}")
        trio.from_thread.run_sync(started.set)
        assert release.wait(10)
        return name

    def write() -> str:
        order.append("write")
        release.set()  # the export holding the export thread ends only once a write ran
        return "written"

    with trio.fail_after(10):  # a write queued behind the export would never run: a hang
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_records.offload, lambda: export("a"))
            await started.wait()
            nursery.start_soon(_records.offload, lambda: export("b"))
            assert await _records.offload(write, io=True) == "written"
    assert order == ["export a", "write", "export b"]  # exports one at a time


def sorts_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], Any]]:
    """Every ``sorted`` call of ``_records`` (``sorted_in_slices``' C calls): (items, key)."""
    seen: list[tuple[list[Any], Any]] = []

    def spy(items: Any, key: Any = None) -> list[Any]:
        seen.append((list(items), key))
        return sorted(items, key=key)

    monkeypatch.setattr(_records, "sorted", spy, raising=False)
    return seen


def runs(items: list[Any], key: Any) -> int:
    """How many ascending runs ``items`` are (by ``key``)."""
    keys = [x if key is None else key(x) for x in items]
    return 1 + sum(1 for a, b in itertools.pairwise(keys) if a > b)


def bounded(seen: list[tuple[list[Any], Any]]) -> None:
    """No call sorted more than ``SORT_SLICE`` items but a merge of two ascending runs."""
    for items, key in seen:
        assert len(items) <= SORT_SLICE or runs(items, key) <= 2, (len(items), runs(items, key))


def test_sorted_in_slices_is_a_stable_sort_in_calls_of_bounded_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(7)
    items = [(rng.randrange(500), i) for i in range(3 * 2048 + 17)]  # keys repeat
    seen = sorts_seen(monkeypatch)
    assert sorted_in_slices(items, key=itemgetter(0)) == sorted(items, key=itemgetter(0))
    bounded(seen)
    slices = sum(1 for items, _ in seen if len(items) <= 2048)
    assert slices >= 4, slices  # slices of a few thousand
    assert max(len(items) for items, _ in seen) == len(items)  # the last merge: all of them
    assert sorted_in_slices([]) == [] and sorted_in_slices(["b", "a"]) == ["a", "b"]


def test_a_retained_list_out_of_key_order_is_sorted_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rollout IDs whose order is not their keys' (row-slot): the retained list is by key
    rows = list(range(SORT_SLICE + 500))
    random.Random(3).shuffle(rows)
    episodes = [episode(f"id {i:05}", row, 1) for i, row in enumerate(rows)]
    kept = [("17-3", "17-3-a1", 1, {"calendar": {"events": []}})]
    seen = sorts_seen(monkeypatch)
    fast, slow = both(episodes, kept)
    assert fast is not None and fast["calendar"].chunks == slow["calendar"].chunks
    bounded(seen)
    assert any(len(items) > SORT_SLICE for items, _ in seen)


def test_staged_chunks_are_serialised_a_slice_of_entries_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    episodes = [episode(f"{row}-0", row, 3) for row in range(3000)]
    taken, _ = take_cut(episodes)
    taken.sort(key=lambda c: c.ep.rollout_id)
    expected = build_records(
        environment(),
        "calendar",
        (CALENDAR,),
        "c7",
        stand_ins((AGENT, CALENDAR, TOOL), taken, []),
        [],
        None,
        exported=True,
    )[0]["model_proxy"]
    assert max(len(orjson.loads(c)) for c in expected.chunks["staged"]) > DUMP_SLICE
    lengths: list[int] = []
    dumps = orjson.dumps

    def spy(value: Any, *args: Any, **kwargs: Any) -> bytes:
        if isinstance(value, list):
            lengths.append(len(value))
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(orjson, "dumps", spy)
    fast = cut_records(environment(), "calendar", (CALENDAR,), "c7", taken, [])
    monkeypatch.undo()
    assert fast is not None and fast["model_proxy"].chunks == expected.chunks
    assert lengths and max(lengths) <= DUMP_SLICE
