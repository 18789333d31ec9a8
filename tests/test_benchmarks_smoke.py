"""Smoke tests for ``gymckpt bench`` (``benchmarks.cli.main``) in ``--quick`` mode.

Structural only: keys, types, counts equal to what was configured, and the invariants the
figures rely on (our predicate is evaluated about once per pending reply, the baseline scanned).
No timing assertions. The entry points call ``trio.run`` themselves, so these tests are plain
synchronous functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gymckpt.benchmarks.cli import main

DRAIN_KEYS = {
    "rollouts": int,
    "pending": int,
    "drain_wake_ms_median": float,
    "drain_wake_ms_p99": float,
    "baseline_wake_ms_median": float,
    "speedup": float,
    "per_wakeup_us_2k": float,
    "max_loop_stall_ms": float,
    "trio_wake_floor_us": float,
    "predicate_evaluations_per_reply": float,
    "baseline_scans": int,
}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert err == ""  # stderr is not a terminal here: no progress lines
    result: dict[str, Any] = json.loads(out)
    return result


def _check_drain(result: dict[str, Any]) -> None:
    for key, typ in DRAIN_KEYS.items():
        allowed = (int, float) if typ is float else (typ,)
        assert isinstance(result[key], allowed) and not isinstance(result[key], bool), key
    assert "per_wakeup_us_200k" in result  # null in quick mode (no 200k size)
    assert result["rollouts"] == 10_000
    assert result["pending"] == 100
    assert result["drain_wake_ms_median"] > 0
    assert result["drain_wake_ms_p99"] >= result["drain_wake_ms_median"]
    assert result["baseline_scans"] > 0
    # After the drain parks, its condition is evaluated once per pending reply and never for
    # unrelated traffic.
    assert result["predicate_evaluations_per_reply"] == 1.0
    assert result["mutations_per_trial"] > 4 * result["pending"]


def _check_sweep(result: dict[str, Any]) -> None:
    sizes = [r["in_flight"] for r in result["sweep"]]
    assert sizes == [2_000, 10_000]
    for r in result["sweep"]:
        ours, base = r["ours"], r["baseline"]
        assert ours["trials"] == result["config"]["trials"]
        assert ours["wake"]["samples"] == ours["trials"]
        assert ours["pending_drained_per_trial"] == result["pending"]
        assert ours["timed_evaluations"] >= ours["trials"] * result["pending"]
        # on entry: once (one predicate) or once per pending ID (per-key checks)
        assert ours["predicate_evaluations_on_entry"] in (1, result["pending"])
        assert ours["predicate_evaluations_per_trial"] <= 2 * result["pending"] + 1
        assert ours["per_wakeup_us"] >= 0
        assert base["scans"] >= base["trials"] > 0
        # the baseline walks the whole ledger (all of it in flight, give or take a trial's
        # deliveries) on every poll
        assert base["attempts_scanned_per_wakeup"] >= 0.9 * r["in_flight"]
    pendings = [p["pending"] for p in result["wake_by_pending"]]
    assert pendings == [1, 10, 100]


def test_drain_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = _run(capsys, "drain", "--quick", "--json")
    _check_drain(result)
    _check_sweep(result)
    assert result["meta"]["quick"] is True
    assert result["meta"]["machine"]["nproc"] >= 1


def test_dispatch_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = _run(capsys, "dispatch", "--quick", "--json", "--rows", "300")
    assert result["batch_sizes"] == [1, 64, 512]
    assert [r["batch"] for r in result["results"]] == [1, 64, 512]
    for r in result["results"]:
        assert r["rows"] == 300
        assert r["in_flight"] == 2_000
        assert r["batches"] == -(-300 // r["batch"])
        assert r["rows_per_s"] > 0
        # per batch: one dispatch mutation, one completion per row, reserve/take_ready extra
        assert r["mutations"] >= r["rows"] + r["batches"]
    assert isinstance(result["rows_per_s_batch64_2k"], int)


def test_host_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gymnasium")
    result = _run(capsys, "host", "--quick", "--json")
    step = result["per_step"]
    assert step["episodes"] == 32 and step["steps_per_trial"] > 32
    assert step["plain_us_per_step_median"] > 0 and step["host_us_per_step_median"] > 0
    assert result["loop"]["embedded_2_instances_episodes"] == 64
    assert "ray_2_actors_episodes_per_s" not in result["loop"]  # quick: no Ray


def test_memory_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = _run(capsys, "memory", "--json", "--sizes", "4000")
    modes = {r["mode"]: r for r in result["results"]}
    assert set(modes) == {"tracemalloc", "rss"}
    for r in modes.values():
        assert 0.9 * 4000 <= r["attempts"] <= 1.1 * 4000
        assert set(r["by_state"]) == {"reserved", "dispatched", "completed", "failed",
                                      "abandoned"}
        assert r["by_state"]["dispatched"] > r["by_state"]["completed"] > 0
    assert modes["tracemalloc"]["bytes_per_attempt"] > 0
    assert isinstance(result["tracemalloc_bytes_per_attempt_4k"], float)


def test_all_quick_writes_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = _run(capsys, "all", "--quick", "--json", "--out", str(tmp_path))
    _check_drain(result["drain"])
    names = {Path(p).name for p in result["files"]}
    assert {"drain.json", "memory.json", "dispatch.json", "checkpoint.json", "SUMMARY.md",
            "drain_wake_latency.png", "drain_per_wakeup_cost.png",
            "checkpoint_stages.png"} <= names
    for name in names:
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "drain_wake_latency.png").read_bytes()[:4] == b"\x89PNG"
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "| drain wake latency, median | ≤ 50 µs |" in summary
    assert "## Checkpoint end to end on the embedded Gym" in summary
    assert "## Pending" in summary  # what was not measured is said, not omitted
    assert "all --quick" in summary  # the command that produced it
    ck = json.loads((tmp_path / "checkpoint.json").read_text())
    assert ck["checkpoint_ok"] is True
    assert ck["in_flight"] == 2_000
    assert ck["episodes_exported"] == ck["in_flight"]
    assert [r["stage"] for r in ck["stages"]][:3] == ["close+retire", "prepare", "commit"]
    assert ck["snapshot_bytes"] > 0 and ck["snapshot_files"] > 0
    assert [r["batch"] for r in ck["embedded_dispatch"]] == [64, 512]
    assert all(r["attempts"] == 512 for r in ck["embedded_dispatch"])
    drain = json.loads((tmp_path / "drain.json").read_text())
    assert drain["rollouts"] == result["drain"]["rollouts"]
    _check_sweep(drain)


def test_help_and_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["drain", "--help"]) == 0
    out = capsys.readouterr().out
    assert "wake latency" in out and "baseline" in out
    assert main(["drain", "--no-such-flag"]) == 2
    assert main(["drain", "--quick", "--pending", "5000"]) == 2
    assert "too small" in capsys.readouterr().err
