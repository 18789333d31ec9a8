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


def test_results_read_needs_drain_memory_and_dispatch(tmp_path: Path) -> None:
    dump(tmp_path / "drain.json", {"rollouts": 1, "meta": {"command": "x"}})
    dump(tmp_path / "memory.json", {"results": []})
    with pytest.raises(ValueError, match=r"lacks drain\.json, memory\.json or dispatch\.json"):
        Results.read(tmp_path)
    dump(tmp_path / "dispatch.json", {"results": []})
    got = Results.read(tmp_path)
    assert got.meta == {"command": "x"} and got.checkpoint is None and got.fanout is None


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
