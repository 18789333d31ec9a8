"""Smoke tests for ``gymckpt bench`` (``benchmarks.cli.main``) in ``--quick`` mode.

Structural only: keys, types, counts equal to what was configured, and the invariants the
figures rely on (our predicate is evaluated about once per pending reply, the baseline scanned).
No timing assertions. The entry points call ``trio.run`` themselves, so these tests are plain
synchronous functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from gymckpt.benchmarks.cli import main
from gymckpt.benchmarks.report import (
    CheckpointRayResult,
    CheckpointResult,
    DrainResult,
    FanoutResult,
    MemoryResult,
    PreservedResult,
    TargetRow,
    read_result,
    targets,
)
from gymckpt.benchmarks.report._records import HostMarksResult

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


SCALE_KEYS = (
    "aligned_timeout_complete",
    "ray_until_moving",
    "ray_pause_p99",
    "ray_stall",
    "http_until_moving",
    "http_pause_p99",
    "http_stall",
    "http_sockets",
    "dispatch_loop_share",
    "dispatch_loop_rows_per_s",
    "host_step_ratio",
    "host_marks_aligned",
    "trainer_side_1M",
)
"""The rows of the targets at scale, last in the targets table (``report._scale_targets``)."""


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


def test_dispatch_loop_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    """``--loop``: every attempt goes through the whole loop on each Gym and is trained."""
    result = _run(
        capsys,
        "dispatch",
        "--quick",
        "--json",
        "--rows",
        "64",
        "--batch-sizes",
        "64",
        "--loop",
        "--loop-attempts",
        "512",
        "--loop-runs",
        "2",
    )
    assert set(result["loop"]) == {"null", "bare", "embedded"}
    for name in ("null", "bare", "embedded"):
        runs = result["loop"][name]
        assert len(runs) == 2
        assert all(r["attempts"] == 512 and r["rows_per_s"] > 0 for r in runs)
        assert all(r["rows_per_cpu_s"] > 0 and r["cpu_s"] > 0 for r in runs)
        rates = sorted(r["rows_per_s"] for r in runs)
        assert rates[0] <= result[f"loop_rows_per_s_{name}"] <= rates[-1]
    bare_over_null = result["loop_rows_per_s_bare"] / result["loop_rows_per_s_null"]
    assert result["bare_over_null"] == round(bare_over_null, 3)
    assert (
        _run(capsys, "dispatch", "--quick", "--json", "--rows", "64", "--batch-sizes", "64").get(
            "loop"
        )
        is None
    )


def test_host_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gymnasium")
    result = _run(capsys, "host", "--quick", "--json")
    step = result["per_step"]
    assert step["episodes"] == 32 and step["steps_per_trial"] > 32
    assert step["plain_us_per_step_median"] > 0 and step["host_us_per_step_median"] > 0
    assert result["loop"]["embedded_2_instances_episodes"] == 64
    assert "ray_2_actors_episodes_per_s" not in result["loop"]  # quick: no Ray
    marks = result["marks"]
    assert marks["cartpole"]["episodes"] == 32
    assert (marks["calendar"]["episodes"], marks["calendar"]["turns"]) == (8, 10)
    for figures in marks.values():
        for clock in ("", "cpu_"):
            assert figures[f"marks_{clock}us_per_step_median"] > 0
            assert figures[f"opted_out_{clock}us_per_step_median"] > 0
    # the targets row: judged on the larger of wall and CPU, only at the target's size
    hm = read_result(marks, HostMarksResult, "host.json")
    row = next(t for t in _targets_with(hm) if t.key == "host_marks_overhead")
    assert row.status == "not measured" and "(at 32;" in row.measured
    cp = attrs.evolve(hm.cartpole, episodes=256, marks_overhead_ratio=0.05)
    for cpu, status in ((0.09, "met"), (0.11, "MISSED")):
        at_size = attrs.evolve(hm, cartpole=attrs.evolve(cp, marks_overhead_cpu_ratio=cpu))
        row = next(t for t in _targets_with(at_size) if t.key == "host_marks_overhead")
        assert row.status == status, (cpu, row)


def _targets_with(host_marks: HostMarksResult) -> list[TargetRow]:
    drain = _drain_result(
        rollouts=1, drain_wake_us_median=1.0, drain_wake_ms_p99=1.0, max_loop_stall_ms=1.0
    )
    memory = read_result({"method": "", "results": []}, MemoryResult, "memory.json")
    return targets(drain, memory, None, None, None, None, host_marks)


def test_sandbox_quick_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``bench sandbox --quick``: two checkpoints through the embedded host; the second writes
    what changed (a file per tree and the records), not the trees; a mark hashes exactly the
    files changed since the last; every episode completes; nothing is left in ``--dir`` (made
    when it does not exist)."""
    where = tmp_path / "not" / "yet"
    result = _run(capsys, "sandbox", "--quick", "--json", "--dir", str(where))
    assert result["sessions"] == result["completed"] == 8
    first, second = result["first"], result["second"]
    assert first["episodes"] == second["episodes"] == 8
    assert first["full_bytes"] >= 8 * result["template_bytes"]
    assert first["object_bytes"] >= result["template_bytes"]  # the template's files, once
    assert 0 < second["object_bytes"] < result["template_bytes"] // 10
    assert second["snapshot_bytes"] > 0  # the records
    assert result["second_incremental_over_first_full"] < 0.05
    assert [(m["changed_files"], m["hashed"]) for m in result["mark"]] == [
        (0, [0]),
        (1, [1]),
        (10, [10]),
    ]
    assert result["restore_ms_median"] > 0
    assert list(where.iterdir()) == []  # the run's directory was removed


def test_memory_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = _run(capsys, "memory", "--json", "--sizes", "4000")
    modes = {r["mode"]: r for r in result["results"]}
    assert set(modes) == {"tracemalloc", "rss"}
    for r in modes.values():
        assert 0.9 * 4000 <= r["attempts"] <= 1.1 * 4000
        assert set(r["by_state"]) == {"reserved", "dispatched", "completed", "failed", "abandoned"}
        assert r["by_state"]["dispatched"] > r["by_state"]["completed"] > 0
    assert modes["tracemalloc"]["bytes_per_attempt"] > 0
    assert isinstance(result["tracemalloc_bytes_per_attempt_4k"], float)


@pytest.mark.timeout(600)  # every benchmark, the checkpoint and the crashes in both modes
def test_all_quick_writes_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = _run(capsys, "all", "--quick", "--no-ray", "--json", "--out", str(tmp_path))
    _check_drain(result["drain"])
    names = {Path(p).name for p in result["files"]}
    assert {
        "drain.json",
        "memory.json",
        "dispatch.json",
        "checkpoint.json",
        "preserved.json",
        "sandbox.json",
        "SUMMARY.md",
        "drain_wake_latency.png",
        "drain_per_wakeup_cost.png",
        "checkpoint_stages.png",
        "preserved_work.png",
    } <= names
    assert "fanout.json" not in names and result["fanout"] is None  # --no-ray
    assert "checkpoint_ray.json" not in names and result["checkpoint_ray"] is None
    for name in names:
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "drain_wake_latency.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "preserved_work.png").read_bytes()[:4] == b"\x89PNG"
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "## Targets\n" in summary
    assert "| drain wake latency, median | ≤ 50 µs |" in summary
    assert "| ledger bytes per attempt at 1M attempts | ≤ 100 B |" in summary
    assert "## Checkpoint end to end on the embedded Gym" in summary
    assert "## Work preserved across a crash" in summary
    assert "not run (--no-ray)" in summary  # what was not measured is said, not omitted
    assert "## Not measured here" in summary
    assert "all --quick" in summary  # the command that produced it
    src = result["meta"]["source"]
    assert src["commit_full"] in summary
    assert ("clean tree" in summary) == bool(src["clean"])
    assert ("NOT FROM A CLEAN TREE" in summary) == (not src["clean"])
    # every target has a verdict, and one row per figure of issue 13
    keys = [t["key"] for t in result["targets"]]
    assert keys == [
        "ledger_bytes_per_attempt",
        "gc_full_ms_1M",
        "drain_wake_median",
        "drain_wake_p99",
        "drain_speedup",
        "drain_stall",
        "checkpoint_stall",
        "checkpoint_e2e",
        "dispatch_embedded",
        "checkpoint_e2e_ray",
        "dispatch_ray",
        "fanout",
        "dispatch_http",
        "fanout_http",
        "checkpoint_e2e_http",
        "unaligned_pause_p99",
        "unaligned_checkpoint_e2e",
        "unaligned_checkpoint_stall",
        "checkpoint_modes_ray",
        "unaligned_parked",
        "unaligned_redone",
        "preserved",
        "host_marks_overhead",
        *SCALE_KEYS,
        "sandbox_incremental",
        "sandbox_mark",
        "sandbox_restore",
    ]
    assert {t["status"] for t in result["targets"]} <= {"met", "MISSED", "not measured"}
    # quick sizes are not the targets' sizes: those figures are not passed off as met
    by_key = {t["key"]: t for t in result["targets"]}
    assert by_key["drain_wake_median"]["status"] == "not measured"
    assert by_key["fanout"]["status"] == "not measured"
    assert by_key["checkpoint_e2e_ray"]["measured"] == "not run (--no-ray)"
    ck = json.loads((tmp_path / "checkpoint.json").read_text())
    assert ck["checkpoint_ok"] is True
    assert ck["in_flight"] == 2_000
    assert ck["episodes_exported"] == ck["in_flight"]
    assert [r["stage"] for r in ck["stages"]][:3] == ["close+retire", "prepare", "commit"]
    assert ck["snapshot_bytes"] > 0 and ck["snapshot_files"] > 0
    assert [(r["environment"], r["batch"]) for r in ck["embedded_dispatch"]] == [
        ("one_step", 64),
        ("one_step", 512),
        ("calendar", 64),
        ("calendar", 512),
    ]
    assert all(r["attempts"] == 512 for r in ck["embedded_dispatch"])
    assert ck["embedded_one_step_rows_per_s_batch512"] > 0
    assert ck["bytes_per_attempt"] > 0  # the ledger's columns were found
    for key in ("e2e_s", "max_loop_stall_ms", "gc_max_pause_ms", "bytes_per_attempt"):
        assert isinstance(ck[key], int | float), key
        assert f"`{key}` = " in summary
    assert set(ck["stage_s"]) >= {"prepare", "commit", "resume"}
    _check_modes(ck, ck["in_flight"])
    assert "## Checkpoint modes side by side: aligned and unaligned" in summary
    assert by_key["unaligned_pause_p99"]["status"] == "not measured"  # 2k, not 200k
    drain = json.loads((tmp_path / "drain.json").read_text())
    assert drain["rollouts"] == result["drain"]["rollouts"]
    _check_sweep(drain)
    _check_preserved(json.loads((tmp_path / "preserved.json").read_text()))
    # the report re-renders from the JSON, and marks a dirty tree at the top
    drain["meta"]["source"] = {
        "commit": "abc1234",
        "commit_full": "abc1234" * 5 + "ab",
        "uncommitted_changes": ["runtime/_ledger.py"],
        "clean": False,
    }
    (tmp_path / "drain.json").write_text(json.dumps(drain))
    assert main(["report", "--out", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert summary.split("\n")[2].startswith("> **NOT FROM A CLEAN TREE.**")
    assert "`runtime/_ledger.py`" in summary
    assert "## Work preserved across a crash" in summary


COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results"


def test_report_writes_into_the_current_directory_by_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``--out`` the results are read and written in ``./benchmark-results``, never
    inside the installed package (the committed ones are in ``docs/benchmarks/results``)."""
    out = tmp_path / "benchmark-results"
    out.mkdir()
    for committed in COMMITTED.glob("*.json"):
        (out / committed.name).write_bytes(committed.read_bytes())
    monkeypatch.chdir(tmp_path)
    result = _run(capsys, "report", "--json")
    written = [Path(p).resolve() for p in result["files"]]
    assert written[-1] == out.resolve() / "SUMMARY.md"
    assert all(p.parent == out.resolve() for p in written), written
    assert {p.name for p in written} >= {"drain_wake_latency.png", "fanout.png"}


def _check_modes(ck: dict[str, Any], n: int) -> None:
    """Both modes measured on the same episodes, each until every episode moves again."""
    modes = ck["modes"]
    # embedded: the default configuration's aligned checkpoint between the two (test_bench_scale)
    assert [m for m in modes if m != "aligned_timeout"] == ["unaligned", "aligned"]
    for name, m in modes.items():
        assert m["checkpoint_mode"] == name and m["checkpoint_ok"] is True
        assert m["episodes_exported"] == n
        assert m["until_all_moving_s"] >= m["checkpoint_wall_s"] - 1e-3
        assert m["waiting_at_end"] <= max(16, n // 1000)
        assert m["pauses"]["episodes"] == n
        assert m["control_pauses"]["episodes"] == n
        assert m["scheduler_batches"] > 0
        assert m["scheduler_batch_max_ms"] >= m["scheduler_batch_p99_ms"] >= 0
        assert m["checkpoint_loop_cpu_s"] >= 0 and m["until_moving_loop_cpu_s"] >= 0
        assert m["checkpoint_loop_cpu_s"] <= m["until_moving_loop_cpu_s"] + 1e-3
        p = m["pauses"]
        assert p["pause_p50_ms"] <= p["pause_p99_ms"] <= p["pause_max_ms"]
    a, u = modes["aligned"], modes["unaligned"]
    # aligned parks every episode at its next boundary until the slowest turn in flight ends
    assert a["pauses"]["episodes_paused_over_threshold"] == n
    wait_s = a["turn_time_simulated_s"] or a["turn_time_wall_s"]  # virtual embedded, real on Ray
    assert a["pauses"]["boundary_gap_max_ms"] >= 1e3 * wait_s * 0.5
    assert a["moving_after_return_s"] >= 0
    # unaligned parks nothing: most episodes feel nothing at all, none waits a turn
    assert u["pauses"]["pause_p50_ms"] < a["pauses"]["pause_p50_ms"] / 10
    assert u["pauses"]["boundary_gap_max_ms"] < 1e3 * wait_s / 2
    assert ck["turn_times"]["p99_over_median"] >= 20


def _check_preserved(pv: dict[str, Any]) -> None:
    assert list(pv["modes"]) == ["unaligned", "aligned"]
    assert len(pv["kill_times_s"]) == pv["kills"]
    for name, m in pv["modes"].items():
        assert m["checkpoint_mode"] == name
        assert [k["kill_s"] for k in m["per_kill"]] == pv["kill_times_s"]  # the same kills
        assert m["boundary_mismatches"] == 0
        assert m["restores"] > 0
        for k in m["per_kill"]:
            assert 0 <= k["gymckpt_redone_rollout_s"] <= k["baseline_redone_rollout_s"]
    u, a = pv["modes"]["unaligned"], pv["modes"]["aligned"]
    # what the episodes felt, on the virtual clock: unaligned parks nothing
    assert u["measured_parked_fraction"] == 0.0 and u["held_per_checkpoint"] == 0.0
    assert u["parked_fraction_of_rollout_time"] == 0.0
    assert a["measured_parked_fraction"] > 0 and a["held_per_checkpoint"] > 0
    # the episodes' own record agrees with the timeline model
    assert a["measured_parked_fraction"] == pytest.approx(
        a["parked_fraction_of_rollout_time"], abs=0.03
    )
    assert 0 < a["held_pause_p50_s"] <= a["held_pause_p99_s"] <= a["held_pause_max_s"]
    assert a["held_pause_max_s"] <= pv["turn_times"]["cap_s"] + 1e-6
    assert pv["parked_fraction_of_rollout_time"] == a["parked_fraction_of_rollout_time"]
    assert pv["kills"] == len(pv["per_kill"]) == 6
    kills = [k["kill_s"] for k in pv["per_kill"]]
    assert kills == sorted(kills) and len(set(kills)) == 6
    # the timeline model agrees with every step boundary the real restore handed back
    assert pv["boundary_mismatches"] == 0
    assert pv["restores"] > 0
    assert pv["baseline_redone_fraction"] == 1.0
    assert 0 < pv["parked_fraction_of_rollout_time"] < 1
    kept_any = False
    for k in pv["per_kill"]:
        assert 0 <= k["gymckpt_redone_rollout_s"] <= k["baseline_redone_rollout_s"]
        assert k["baseline_redone_rollout_s"] == k["in_flight_rollout_s"]
        if k["restored_checkpoint"] is None:  # nothing to restore yet: both redo it all
            assert k["gymckpt_redone_fraction"] == 1.0 and k["restored_episodes"] == 0
        else:
            summary = k["restore_summary"]
            assert summary["restored"] == k["restored_episodes"] > 0
            assert k["kill_s"] >= k["checkpoint_s"]
            kept_any |= k["gymckpt_redone_fraction"] < 1.0
    assert kept_any
    assert 0 <= pv["gymckpt_redone_fraction_median"] <= 1.0


def test_heavy_turn_times() -> None:
    """The lognormal's p99 is at least 20 times its median, as drawn and as computed; its
    mean is the one asked for; plans are a function of (seed, row, slot)."""
    import random
    import statistics

    from gymckpt.benchmarks._heavy import TurnTimes, heavy_plan

    t = TurnTimes.with_mean(3.5, sigma=2.0, cap=21.0)
    assert t.mean_s() == pytest.approx(3.5, rel=1e-6)
    assert t.p99_over_median() >= 20 and t.quantile(0.5) == pytest.approx(t.median_s)
    rng = random.Random(1)
    draws = sorted(t.draw(rng) for _ in range(40_000))
    assert max(draws) == t.max_s
    assert draws[int(0.99 * len(draws))] / statistics.median(draws) >= 20
    assert statistics.fmean(draws) == pytest.approx(3.5, rel=0.05)
    a = heavy_plan(7, 3, 1, (4, 8), t, 0.5)
    assert a == heavy_plan(7, 3, 1, (4, 8), t, 0.5) != heavy_plan(7, 3, 2, (4, 8), t, 0.5)
    assert 4 <= a.turns == len(a.durations) <= 8
    assert TurnTimes(median_s=1.0, sigma=0.1, cap=2.0).p99_over_median() < 2


def test_pause_records_and_windows(tmp_path: Path) -> None:
    """Gaps over the threshold are kept one by one (all are summed), written to the
    process's file and read back by polling; a window's per-episode pauses count every
    episode in flight, and every episode moves again when the last held one starts."""
    from gymckpt.benchmarks._heavy import PauseRecorder, PauseSource, all_moving_at, pauses_in

    rec = PauseRecorder(tmp_path / "1.jsonl", flush_every_s=0.0)
    rec.turn_end("a", 1.0, 1.0, clock=10.0, perf=100.0)
    rec.turn_end("b", 1.0, 1.2, clock=10.0, perf=100.0)  # woke 200 ms late
    rec.turn_end("c", 1.0, 1.0, clock=10.0, perf=100.0)
    assert len(rec.last) == 3
    rec.turn_start("a", clock=10.0001, perf=100.0001)  # 0.1 ms: summed, not kept
    rec.turn_start("b", clock=12.0, perf=102.0)  # held 2 s
    assert rec.gap_count == 2 and rec.gap_s == pytest.approx(2.0001)
    assert rec.gaps == [("b", 100.0, pytest.approx(2.0), 102.0)]
    assert [o[0] for o in rec.overruns] == ["b"]
    src = PauseSource(tmp_path, in_process=False, episodes=10)
    assert src.waiting() == (1, 102.0)  # "c" is still at its boundary
    got = src.records()
    assert got.gaps == [("b", 100.0, pytest.approx(2.0), 102.0)]
    assert got.total("turn_s") == 3.0
    p = pauses_in(got, 99.0, 103.0, episodes=10)
    assert p["episodes_paused_over_threshold"] == 1 and p["pause_p50_ms"] == 0.0
    assert p["pause_max_ms"] == pytest.approx(2200.0)  # held 2 s + woke 200 ms late
    assert p["boundary_gap_max_ms"] == pytest.approx(2000.0)
    assert pauses_in(got, 101.0, 103.0, episodes=10)["pause_max_ms"] == 0.0  # outside
    assert all_moving_at(got, 99.0, 103.0) == 102.0
    assert all_moving_at(got, 101.0, 103.0) == 101.0  # none held in that window
    rec.turn_start("c", clock=10.5, perf=102.5)
    assert src.waiting()[0] == 0 and len(src.records().gaps) == 2  # only the new lines read


def test_scheduler_batch_monitor() -> None:
    """A task that blocks the loop makes a batch at least that long in wall time, and almost
    nothing in CPU time when it blocked without working."""
    import time

    import trio

    from gymckpt.benchmarks._common import SchedulerBatchMonitor

    mon = SchedulerBatchMonitor()

    async def main() -> None:
        trio.lowlevel.add_instrument(mon)
        mon.active = True
        await trio.sleep(0.001)
        time.sleep(0.03)  # noqa: ASYNC251 - blocks the loop on purpose, using no CPU
        await trio.sleep(0.001)
        mon.active = False
        trio.lowlevel.remove_instrument(mon)

    trio.run(main)
    r = mon.report()
    assert r["scheduler_batches"] >= 1
    assert r["scheduler_batch_max_ms"] >= 30.0
    assert r["scheduler_batch_max_cpu_ms"] < r["scheduler_batch_max_ms"] / 2
    assert r["scheduler_batch_max_steps"] >= 1


def test_preserved_timeline_model() -> None:
    from gymckpt.benchmarks.preserved import moving_time, park_boundary, parked_time

    durs = [2.0, 3.0, 5.0]  # boundaries at 10, 12, 15, 20 without checkpoints
    assert moving_time(10.0, durs, [], 11.0) == 1.0
    assert moving_time(10.0, durs, [], 13.0) == 3.0
    assert moving_time(10.0, durs, [], 99.0) == 10.0
    assert moving_time(10.0, durs, [], 5.0) == 0.0
    # a checkpoint prepared at 11 and resumed at 14: the episode finishes its first turn at
    # 12, parks until 14, and is 1 s into its second turn at 15
    win = [(11.0, 14.0)]
    assert moving_time(10.0, durs, win, 15.0) == 3.0
    assert parked_time(10.0, durs, win, 13.0) == 1.0
    assert parked_time(10.0, durs, win, 40.0) == 2.0  # ends at 22, not 20
    assert parked_time(10.0, durs, [], 40.0) == 0.0
    assert parked_time(10.0, durs, [(20.0, 25.0)], 40.0) == 5.0  # parked at its last boundary
    assert park_boundary(10.0, durs, win, win[0]) == 1
    # prepared exactly at a boundary: parked there
    assert park_boundary(10.0, durs, [(12.0, 13.0)], (12.0, 13.0)) == 1
    # started after the window opened, or completed before it
    assert park_boundary(11.5, durs, win, win[0]) is None
    assert park_boundary(0.0, durs, win, win[0]) == 3
    # a later window sees the delay of the earlier one: boundaries at 10, 12, (14), 17, 22
    wins = [(11.0, 14.0), (16.0, 30.0)]
    assert park_boundary(10.0, durs, wins, wins[1]) == 2
    assert moving_time(10.0, durs, wins, 40.0) == 10.0


def _drain_result(**fields: Any) -> DrainResult:
    """A drain result with an empty sweep and ``fields``, as ``Results.read`` structures it."""
    base = {
        "pending": 1,
        "baseline_wake_ms_median": 25.0,
        "config": {"trials": 1, "baseline_trials": 1, "interleave": 0},
        "sweep": [],
    }
    return read_result({**base, **fields}, DrainResult, "drain.json")


def test_targets_verdicts() -> None:
    drain = _drain_result(
        rollouts=200_000,
        drain_wake_us_median=40.0,
        drain_wake_ms_p99=0.3,
        speedup=3000.0,
        max_loop_stall_ms=9.0,
    )
    memory = {
        "method": "fresh subprocess per measurement",
        "results": [
            {
                "target_attempts": 1_000_000,
                "mode": "tracemalloc",
                "bytes": 101_000_000,
                "bytes_per_attempt": 101.0,
            },
            {
                "target_attempts": 1_000_000,
                "mode": "rss",
                "bytes": 90_000_000,
                "bytes_per_attempt": 90.0,
                "gc_full_ms_ledger_only": 3.0,
                "gc_full_ms_with_ledger": 40.0,
            },
        ],
    }
    ck = read_result(
        {
            "in_flight": 200_000,
            "config": {"instances": 1, "dispatch_batch": 64},
            "checkpoint_ok": True,
            "episodes_exported": 200_000,
            "pending_drained": 0,
            "snapshot_files": 1,
            "ledger_json_bytes": 1,
            "stages": [],
            "max_loop_stall_ms": 11.0,
            "e2e_s": 1.5,
            "turn_time_wall_s": 30.0,
            "embedded_dispatch": [{"batch": 64, "attempts": 1, "rows_per_s": 60_000}],
        },
        CheckpointResult,
        "checkpoint.json",
    )
    fo: dict[str, Any] = {
        "config": {"warmup": 1, "checkpoints": 1},
        "results": [
            {
                "actors": k,
                "ok": k < 16,
                "error": "TimeoutError: x",
                **{
                    op: {"stage_ms": 1.0, "slowest_ms": 1.0}
                    for op in ("prepare", "commit", "resume")
                },
            }
            for k in (1, 2, 4, 8, 16)
        ],
        "sizes_failed": [16],
        "models": {},
        "ray_dispatch": {"ok": True, "rows_per_s": 9_999},
    }
    pv = {
        "config": {
            "instances": 1,
            "rows_in_flight": 1,
            "group_size": 1,
            "groups_per_step": 1,
            "train_s": 1.0,
            "turns": [1, 2],
            "turn_s": [1.0, 2.0],
            "kill_window_s": [1.0, 2.0],
        },
        "kills": 10,
        "gymckpt_redone_fraction_median": 0.1,
        "gymckpt_redone_fraction_pooled": 0.12,
        "gymckpt_redone_rollout_s_total": 1.0,
        "baseline_redone_rollout_s_total": 10.0,
        "boundary_mismatches": 0,
        "restores": 10,
        "per_kill": [],
    }

    def verdicts(cr: dict[str, Any] | None = None) -> list[TargetRow]:
        return targets(
            drain,
            read_result(memory, MemoryResult, "memory.json"),
            ck,
            read_result(fo, FanoutResult, "fanout.json"),
            read_result(pv, PreservedResult, "preserved.json"),
            None if cr is None else read_result(cr, CheckpointRayResult, "checkpoint_ray.json"),
        )

    got = {t.key: t.status for t in verdicts()}
    assert got == {
        "ledger_bytes_per_attempt": "MISSED",
        "gc_full_ms_1M": "met",
        "drain_wake_median": "met",
        "drain_wake_p99": "MISSED",
        "drain_speedup": "met",
        "drain_stall": "met",
        "checkpoint_stall": "MISSED",
        "checkpoint_e2e": "met",
        "dispatch_embedded": "met",
        "checkpoint_e2e_ray": "not measured",
        "dispatch_ray": "MISSED",
        "fanout": "not measured",
        # results from before HTTP was measured: its rows are not run
        "dispatch_http": "not measured",
        "fanout_http": "not measured",
        "checkpoint_e2e_http": "not measured",
        # results without both modes (older ones): the mode rows are not measured
        "unaligned_pause_p99": "not measured",
        "unaligned_checkpoint_e2e": "not measured",
        "unaligned_checkpoint_stall": "not measured",
        "checkpoint_modes_ray": "not measured",
        "unaligned_parked": "not measured",
        "unaligned_redone": "not measured",
        "preserved": "met",
        "host_marks_overhead": "not measured",
        # the targets at scale: results without their figures
        **dict.fromkeys(SCALE_KEYS, "not measured"),
        "sandbox_incremental": "not measured",  # no sandbox.json: not run
    }
    fo["results"][-1]["ok"] = True
    fo["sizes_failed"] = []
    pv["boundary_mismatches"] = 1
    got = {t.key: t.status for t in verdicts()}
    assert got["fanout"] == "met" and got["preserved"] == "MISSED"
    no_memory = read_result({"method": "", "results": []}, MemoryResult, "memory.json")
    assert targets(drain, no_memory, None, None, None)[0].status == "not measured"
    # the checkpoint on Ray has no threshold: reported at 200k with 4 actors, else not
    # measured; a failed run is missed
    cr = {
        "config": {"in_flight": 200_000, "actors": 4, "turn_s": [1.0, 2.0]},
        "in_flight": 200_000,
        "actors": 4,
        "checkpoint_ok": True,
        "e2e_s": 3.0,
        "turn_time_wall_s": 20.0,
        "max_loop_stall_ms": 12.0,
    }

    def ray_row(cr: dict[str, Any]) -> TargetRow:
        return next(t for t in verdicts(cr) if t.key == "checkpoint_e2e_ray")

    assert ray_row(cr).status == "reported"
    assert ray_row(cr).measured.startswith("3.00 s close to resume (+ 20.0 s turn time)")
    assert ray_row({**cr, "in_flight": 20_000}).status == "not measured"
    assert ray_row({**cr, "actors": 2}).status == "not measured"
    failed = ray_row({**cr, "checkpoint_ok": False, "checkpoint_error": "gym_unavailable"})
    assert failed.status == "MISSED" and "gym_unavailable" in failed.measured


def test_fit_linear() -> None:
    from gymckpt.benchmarks.fanout import fit_linear

    m = fit_linear([1, 2, 4, 8, 16], [3 + 2 * k for k in (1, 2, 4, 8, 16)])
    assert m is not None
    assert (m["a_ms"], m["b_ms_per_actor"], m["r2"]) == (3.0, 2.0, 1.0)
    assert m["at"]["64"] == 131.0
    noisy = fit_linear([1, 2, 4], [1.0, 5.0, 2.0])
    assert noisy is not None and noisy["r2"] < 0.5
    assert fit_linear([4], [1.0]) is None
    assert fit_linear([4, 4], [1.0, 2.0]) is None


def test_all_refuses_a_dirty_tree_for_the_results(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gymckpt.benchmarks import cli, report

    def measured(**_kwargs: object) -> None:
        raise AssertionError("measured into the committed results from a dirty tree")

    monkeypatch.setattr(cli, "COMMITTED_RESULTS", tmp_path)
    monkeypatch.setattr(report, "run_all", measured)
    monkeypatch.setattr(
        cli,
        "source_info",
        lambda: {
            "commit": "abc1234",
            "commit_full": None,
            "uncommitted_changes": ["runtime/_gate.py"],
            "clean": False,
        },
    )
    assert main(["all", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes" in err and "runtime/_gate.py" in err
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_fanout_quick_json_and_a_failed_size(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    result = _run(capsys, "fanout", "--quick", "--json")
    assert result["actors"] == [1, 2] and result["sizes_failed"] == []
    for r in result["results"]:
        assert r["ok"] and r["checkpoints"] == 2
        for op in ("prepare", "commit", "resume"):
            assert r[op]["calls_per_checkpoint"] == r["actors"]  # one call per instance
            assert r[op]["slowest_ms"] >= r[op]["median_instance_ms"] > 0
            assert r[op]["stage_ms"] > 0
    assert result["models"]["commit_stage_ms"]["points"] == 2
    assert result["ray_dispatch"]["ok"] and result["ray_dispatch"]["attempts"] == 1_024
    assert result["ray_2_actors_rows_per_s"] > 0
    # a size whose actors do not start in time is a result, not a crash
    from gymckpt.benchmarks._common import Progress
    from gymckpt.benchmarks.fanout import FanoutConfig, run_fanout

    bad = run_fanout(
        FanoutConfig(actors=(2,), checkpoints=1, startup_timeout_s=0.001, dispatch_attempts=0),
        Progress(False),
    )
    assert bad["sizes_failed"] == [2] and bad["results"][0]["ok"] is False
    assert "Timeout" in bad["results"][0]["error"]
    assert bad["models"]["commit_stage_ms"] is None


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_checkpoint_on_ray_json(capsys: pytest.CaptureFixture[str]) -> None:
    """One whole checkpoint at 128 in flight on 4 Ray actors (a local cluster of the worker's
    own), through the CLI: every episode in flight is exported, every stage timed."""
    pytest.importorskip("ray")
    from gymckpt.benchmarks.checkpoint_ray import GYM_OPS
    from gymckpt.benchmarks.report import checkpoint_ray_section, targets
    from gymckpt.nurseries import STAGES

    r = _run(
        capsys,
        "checkpoint",
        "--backend",
        "ray",
        "--actors",
        "4",
        "--rollouts",
        "128",
        "--turn-mean",
        "1",
        "--json",
    )
    assert r["backend"] == "ray" and r["actors"] == 4 and r["label"] == "128"
    assert r["checkpoint_ok"] is True and r["checkpoint_error"] is None
    assert r["in_flight"] == r["episodes_exported"] == 128
    assert r["finished_before_checkpoint"] == 0  # the episodes outlast the measurement
    # every stage the coordinator ran is reported (no trainer files here: that one is not run)
    assert set(r["stage_s"]) == set(STAGES) - {"trainer_files"}
    assert all(v >= 0 for v in r["stage_s"].values())
    assert [s["stage"] for s in r["stages"]] == [
        "close+retire",
        "prepare",
        "commit",
        "ownership",
        "drain",
        "snapshot",
        "publish",
        "resume",
    ]
    # e2e is close to resume less the turn wait, as on the embedded Gym
    assert r["e2e_s"] == pytest.approx(r["checkpoint_wall_s"] - r["turn_time_wall_s"], abs=2e-3)
    assert r["turn_time_wall_s"] == pytest.approx(r["stage_s"]["prepare"], abs=0.05)
    assert 0 < r["e2e_s"] < r["checkpoint_wall_s"]
    # one prepare, commit and resume per actor; a stage waits for its slowest actor
    calls = r["gym_calls_by_op"]
    for op in ("prepare", "commit", "resume"):
        assert calls[op]["calls"] == 4 and calls[op]["stage"] == GYM_OPS[op]
        assert calls[op]["slowest_actor_ms"] >= calls[op]["median_actor_ms"] > 0
        assert calls[op]["slowest_actor_ms"] <= r["stage_s"][op] * 1e3 + 1.0
        assert calls[op]["slowest_actor"] in {f"gym-{i}" for i in range(4)}
    assert r["max_loop_stall_ms"] > 0 and r["gc_max_pause_ms"] >= 0
    assert r["fill_wall_s"] > 0 and r["fill_rows_per_s"] > 0
    assert r["snapshot_bytes"] > 0 and r["snapshot_files"] > 0
    assert r["config"]["turn_times"] == r["turn_times"]
    assert r["turn_times"]["mean_s"] == pytest.approx(1.0, abs=1e-3)
    _check_modes(r, 128)
    # the report: a table row per stage, and the targets row (128 is not the target's size)
    lines: list[str] = []
    ray_result = read_result(r, CheckpointRayResult, "checkpoint_ray.json")
    checkpoint_ray_section(lines.append, ray_result)
    table = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[0][2:] for line in table] == [s["stage"] for s in r["stages"]]
    assert "`prepare` " in next(line for line in table if line.startswith("| prepare |"))
    row = next(
        t
        for t in targets(
            _drain_result(
                rollouts=1, drain_wake_us_median=1.0, drain_wake_ms_p99=1.0, max_loop_stall_ms=1.0
            ),
            read_result({"method": "", "results": []}, MemoryResult, "memory.json"),
            None,
            None,
            None,
            ray_result,
        )
        if t.key == "checkpoint_e2e_ray"
    )
    assert row.status == "not measured" and "(at 128; the target is at 200K)" in row.measured
    # actors that do not start in time: an error that says so (bench all records it as a
    # failed result and carries on)
    from gymckpt.benchmarks._common import Progress
    from gymckpt.benchmarks.checkpoint_ray import CheckpointRayConfig, run_checkpoint_ray

    with pytest.raises(RuntimeError, match="TimeoutError"):
        run_checkpoint_ray(
            CheckpointRayConfig(in_flight=64, startup_timeout_s=0.001), Progress(False)
        )


def test_help_and_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["drain", "--help"]) == 0
    out = capsys.readouterr().out
    assert "wake latency" in out and "baseline" in out
    assert main(["drain", "--no-such-flag"]) == 2
    assert main(["drain", "--quick", "--pending", "5000"]) == 2
    assert "too small" in capsys.readouterr().err
    # --actors is Ray's, --instances the embedded Gym's: never silently ignored
    assert main(["checkpoint", "--actors", "2"]) == 2
    assert "--actors is for --backend ray" in capsys.readouterr().err
    assert main(["checkpoint", "--backend", "ray", "--instances", "2"]) == 2
    assert "--instances is for the embedded Gym" in capsys.readouterr().err
    assert main(["checkpoint", "--backend", "ray", "--actors", "0"]) == 2


def test_http_target_rows() -> None:
    """Issue 24's rows: HTTP's figures beside Ray's, with the ratio; a failed HTTP part is
    missed, saying why; at another size than the target's it is not measured."""
    drain = _drain_result(
        rollouts=1, drain_wake_us_median=1.0, drain_wake_ms_p99=1.0, max_loop_stall_ms=1.0
    )
    memory = read_result({"method": "", "results": []}, MemoryResult, "memory.json")

    def size(k: int, ms: float) -> dict[str, Any]:
        return {
            "actors": k,
            "ok": True,
            "checkpoint_wall_ms": 4 * ms,
            **{op: {"stage_ms": ms, "slowest_ms": ms} for op in ("prepare", "commit", "resume")},
        }

    fo: dict[str, Any] = {
        "config": {"warmup": 1, "checkpoints": 1},
        "results": [size(k, 10.0) for k in (1, 16)],
        "sizes_failed": [],
        "ray_dispatch": {"ok": True, "rows_per_s": 8_000},
        "http": {
            "results": [size(k, 25.0) for k in (1, 16)],
            "sizes_failed": [],
            "dispatch": {"ok": True, "rows_per_s": 2_000, "runs_rows_per_s": [1_900, 2_000]},
        },
    }
    cr: dict[str, Any] = {
        "config": {"in_flight": 10_000, "actors": 4},
        "in_flight": 10_000,
        "actors": 4,
        "checkpoint_ok": True,
        "e2e_s": 2.0,
        "http": {
            "config": {"in_flight": 10_000, "actors": 4},
            "in_flight": 10_000,
            "actors": 4,
            "backend": "http",
            "checkpoint_ok": True,
            "e2e_s": 3.0,
            "turn_time_wall_s": 20.0,
        },
    }

    def rows(fo: dict[str, Any], cr: dict[str, Any]) -> dict[str, TargetRow]:
        got = targets(
            drain,
            memory,
            None,
            read_result(fo, FanoutResult, "fanout.json"),
            None,
            read_result(cr, CheckpointRayResult, "checkpoint_ray.json"),
        )
        return {t.key: t for t in got}

    r = rows(fo, cr)
    assert r["dispatch_http"].status == "reported"
    assert r["dispatch_http"].measured == "2,000 rows/s (Ray 8,000 rows/s; HTTP/Ray 0.25\u00d7)"
    assert r["fanout_http"].status == "met"
    assert r["fanout_http"].measured.startswith("16 servers: prepare 25.0 ms (Ray 10.0 ms, 2.50")
    ck = r["checkpoint_e2e_http"]
    assert ck.status == "not measured" and "(at 10K; the target is at 200K)" in ck.measured
    assert "Ray 2.00 s, HTTP/Ray 1.50" in ck.measured
    big = {**cr, "http": {**cr["http"], "in_flight": 200_000}}
    assert rows(fo, big)["checkpoint_e2e_http"].status == "reported"
    fo["http"]["dispatch"] = {"ok": False, "error": "ServerExited: no --host-config"}
    fo["http"]["results"][1] = {"actors": 16, "ok": False, "error": "TimeoutError: x"}
    fo["http"]["sizes_failed"] = [16]
    r = rows(fo, {**cr, "http": {**cr["http"], "checkpoint_ok": False, "error": "boom"}})
    assert r["dispatch_http"].status == "MISSED" and "--host-config" in r["dispatch_http"].measured
    assert r["fanout_http"].status == "not measured" and "failed: 16 servers" in (
        r["fanout_http"].measured
    )
    assert (
        r["checkpoint_e2e_http"].status == "MISSED" and "boom" in r["checkpoint_e2e_http"].measured
    )


def _our_servers(marker: str) -> list[str]:
    """Command lines of live ``gymckpt serve`` processes whose work dir has ``marker``."""
    import subprocess

    out = subprocess.run(["pgrep", "-af", "gymckpt serve"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if marker in line]


@pytest.fixture
def own_temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Temporary directories made by this test (and the processes it starts) under a directory
    of its own, so ``_our_servers`` finds this test's servers only: another run's benchmark on
    the machine (same prefix, another temp directory) is not ours. A short path under the
    system's temp directory (Ray puts Unix sockets under it, whose paths are bounded)."""
    import shutil
    import tempfile

    own = tempfile.mkdtemp(prefix="gk-")
    monkeypatch.setenv("TMPDIR", own)
    monkeypatch.setattr(tempfile, "tempdir", own)
    yield own + "/"
    monkeypatch.undo()
    shutil.rmtree(own, ignore_errors=True)


@pytest.mark.timeout(300)
def test_fanout_over_http_quick_json(capsys: pytest.CaptureFixture[str], own_temp: str) -> None:
    """``fanout --backend http``: the sweep and the whole-loop dispatch on spawned
    ``gymckpt serve`` processes, every control call timed, and no server left running."""
    ours = own_temp
    result = _run(capsys, "fanout", "--quick", "--backend", "http", "--json")
    assert result["backends"] == ["http"]
    http = result["http"]
    assert http["sizes_failed"] == [] and [r["actors"] for r in http["results"]] == [1, 2]
    for r in http["results"]:
        assert r["ok"] and r["backend"] == "http" and r["checkpoints"] == 2
        for op in ("prepare", "commit", "resume"):
            assert r[op]["calls_per_checkpoint"] == r["actors"]  # one call per server
            assert r[op]["slowest_ms"] >= r[op]["median_instance_ms"] > 0
            assert r[op]["stage_ms"] >= r[op]["slowest_ms"]
    assert result["http_commit_ms_2_servers"] == http["results"][1]["commit"]["stage_ms"]
    disp = http["dispatch"]
    assert disp["ok"], disp.get("error")
    assert disp["backend"] == "http" and disp["attempts"] == 1_024 and disp["rows_per_s"] > 0
    assert result["http_2_servers_rows_per_s"] == disp["rows_per_s"]
    # Ray was not asked for: said, not measured, and no ratio made up
    assert result["results"][0]["ok"] is False and "--backend" in result["results"][0]["error"]
    assert result["http_over_ray"] == {"sizes": {}, "dispatch_rows_per_s": None}
    assert _our_servers(ours + "gymckpt-fanout-") == []


@pytest.mark.timeout(300)
def test_checkpoint_over_http_json(capsys: pytest.CaptureFixture[str], own_temp: str) -> None:
    """One whole checkpoint at 128 in flight on 2 spawned servers, both modes: every episode
    exported, one prepare/commit/resume per server, and no server left running."""
    ours = own_temp
    r = _run(
        capsys,
        "checkpoint",
        "--backend",
        "http",
        "--actors",
        "2",
        "--rollouts",
        "128",
        "--turn-mean",
        "1",
        "--json",
    )
    assert r["backend"] == "http" and r["actors"] == 2 and r["cluster_start_s"] is None
    assert r["checkpoint_ok"] is True and r["in_flight"] == r["episodes_exported"] == 128
    calls = r["gym_calls_by_op"]
    for op in ("prepare", "commit", "resume"):
        assert calls[op]["calls"] == 2
        assert calls[op]["slowest_actor"] in {"gym-0", "gym-1"}
    assert r["fill_rows_per_s"] > 0 and 0 < r["e2e_s"] < r["checkpoint_wall_s"]
    _check_modes(r, 128)
    lines: list[str] = []
    checkpoint_ray_section_http = read_result(r, CheckpointRayResult, "checkpoint_ray.json")
    from gymckpt.benchmarks.report import checkpoint_ray_section

    checkpoint_ray_section(lines.append, checkpoint_ray_section_http)
    assert lines[0].startswith("## Checkpoint end to end over HTTP (128 in flight, 2 servers)")
    assert _our_servers(ours + "gymckpt-bench-ray-") == []


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_fanout_both_backends_same_run(capsys: pytest.CaptureFixture[str], own_temp: str) -> None:
    """``fanout --backend both``: Ray and HTTP in one run, each with positive figures, and
    HTTP's as ratios of Ray's."""
    ours = own_temp
    pytest.importorskip("ray")
    result = _run(capsys, "fanout", "--quick", "--actors", "1", "--checkpoints", "1", "--json")
    assert result["backends"] == ["ray", "http"]
    assert result["results"][0]["ok"] and result["http"]["results"][0]["ok"]
    assert result["ray_2_actors_rows_per_s"] > 0 and result["http_2_servers_rows_per_s"] > 0
    ratios = result["http_over_ray"]
    assert ratios["dispatch_rows_per_s"] == pytest.approx(
        result["http_2_servers_rows_per_s"] / result["ray_2_actors_rows_per_s"], rel=1e-2
    )
    assert ratios["sizes"]["1"]["commit"]["stage"] > 0
    assert _our_servers(ours + "gymckpt-fanout-") == []
