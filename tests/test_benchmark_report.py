"""The benchmark report's own parts, without running a benchmark: reading and writing the
results, the verdict cells, the targets' JSON form, and the sections that read a partial
result (``tests/test_benchmarks_smoke.py`` renders a whole report from a quick run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymckpt.benchmarks.report import Results, Status, TargetRow
from gymckpt.benchmarks.report._format import at_size, first_line, fmt, stall
from gymckpt.benchmarks.report._results import dump, flat

DRAIN = {
    "rollouts": 1,
    "pending": 1,
    "drain_wake_us_median": 40.0,
    "drain_wake_ms_p99": 0.1,
    "max_loop_stall_ms": 1.0,
    "baseline_wake_ms_median": 25.0,
    "config": {"trials": 1, "baseline_trials": 1, "interleave": 0},
    "sweep": [],
}


def test_results_read_needs_drain_memory_and_dispatch(tmp_path: Path) -> None:
    dump(tmp_path / "drain.json", {**DRAIN, "meta": {"command": "x"}})
    dump(tmp_path / "memory.json", {"method": "x", "results": []})
    with pytest.raises(ValueError, match=r"lacks drain\.json, memory\.json or dispatch\.json"):
        Results.read(tmp_path)
    dump(tmp_path / "dispatch.json", {"rows_per_config": 1, "results": []})
    got = Results.read(tmp_path)
    assert got.meta == {"command": "x"} and got.checkpoint is None and got.fanout is None
    assert got.drain.rollouts == 1 and got.drain.wake_by_pending is None


def test_results_read_structures_each_result_once(tmp_path: Path) -> None:
    """Keys the report does not read are skipped; a missing field it needs, or a value of
    the wrong type, is an error naming the file and the field's path; an optional part a
    result lacks or holds as null is None."""
    dump(tmp_path / "memory.json", {"method": "x", "results": []})
    dump(tmp_path / "dispatch.json", {"rows_per_config": 1, "results": []})
    ray_failed = {
        "checkpoint_ok": False,
        "error": "RuntimeError: ray did not start",
        "config": {"in_flight": 8, "actors": 2, "turn_s": [1, 2], "seed": 0},
    }
    dump(tmp_path / "checkpoint_ray.json", ray_failed)
    dump(tmp_path / "drain.json", {**DRAIN, "speedup": None, "extra": {"a": 1}, "meta": {}})
    got = Results.read(tmp_path)
    assert got.drain.speedup is None and got.drain.config.interleave == 0
    ray = got.checkpoint_ray
    assert ray is not None and ray.stages is None and ray.in_flight is None
    assert ray.config.turn_s == [1.0, 2.0] and ray.error == "RuntimeError: ray did not start"
    dump(tmp_path / "drain.json", {**DRAIN, "rollouts": "1", "meta": {}})
    with pytest.raises(ValueError, match=r"expected int @ drain\.json\.rollouts"):
        Results.read(tmp_path)
    bad = {**DRAIN, "sweep": [{"in_flight": 1}], "meta": {}}
    dump(tmp_path / "drain.json", bad)
    with pytest.raises(ValueError, match=r"required field missing @ drain\.json\.sweep\[0\]\.ours"):
        Results.read(tmp_path)


def test_dump_writes_non_finite_floats_as_null(tmp_path: Path) -> None:
    dump(tmp_path / "r.json", {"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -0.0}})
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": -0.0},
    }
    assert flat({"a": 1, "b": [1], "c": {}}) == {"a": 1}
    assert flat(None) is None


def test_cells() -> None:
    assert fmt(None) == fmt(float("nan")) == "n/a"
    assert fmt(12345.678, " ms", 2) == "12,345.68 ms"
    assert stall(None) == "< 0.1 ms" and stall(1.234) == "1.23 ms"
    assert at_size(10_000, 200_000) == " (at 10K; the target is at 200K)"
    assert at_size(200_000, 200_000) == at_size(None, 200_000) == ""
    assert first_line("\n  first \nsecond") == "first"
    assert first_line("x" * 400) == "x" * 299 + "…"


def test_status_cells_and_json() -> None:
    assert [s.cell() for s in Status] == ["**met**", "**MISSED**", "**not measured**", "reported"]
    row = TargetRow("k", "figure", "≤ 1", "2", Status.MISSED)
    assert json.loads(json.dumps(row.to_json())) == {
        "key": "k",
        "figure": "figure",
        "target": "≤ 1",
        "measured": "2",
        "status": "MISSED",
        "why": "",
    }
