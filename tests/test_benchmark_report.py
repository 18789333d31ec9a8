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
from gymckpt.benchmarks.report._summary import results_targets

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


def _mode(name: str, pause_p99_ms: float, moving_s: float, stall_ms: float) -> dict[str, object]:
    pauses = {
        "pause_p50_ms": 0.0,
        "pause_p99_ms": pause_p99_ms,
        "pause_max_ms": 2 * pause_p99_ms,
        "episodes_paused_over_threshold": 3,
        "episodes": 200_000,
    }
    return {
        "checkpoint_mode": name,
        "checkpoint_ok": True,
        "checkpoint_wall_s": moving_s - 0.1,
        "max_loop_stall_ms": stall_ms,
        "stages": [
            {
                "stage": "commit",
                "wall_ms": 1.0,
                "max_loop_stall_ms": 1.0,
                "max_loop_stall_cpu_ms": 1.0,
                "gc_pause_ms": 0.0,
                "in_gym_calls_ms": 0.0,
                "heartbeat_max_late_ms": 2 * stall_ms,  # the loop waited for the GIL
            }
        ],
        "until_all_moving_s": moving_s,
        "until_all_moving_excluding_turn_s": moving_s / 2,
        "until_moving_loop_cpu_s": moving_s / 3,
        "turn_time_simulated_s": 300.0,
        "scheduler_batch_max_ms": 4.0,
        "scheduler_batch_max_cpu_ms": 1.0,
        "pauses": pauses,
        "control_pauses": {**pauses, "pause_p99_ms": 0.5},
    }


def _preserved_mode(name: str, pooled: float, parked: float) -> dict[str, object]:
    return {
        "checkpoint_mode": name,
        "kills": 10,
        "restores": 9,
        "boundary_mismatches": 0,
        "per_kill": [],
        "gymckpt_redone_rollout_s_total": 10.0,
        "baseline_redone_rollout_s_total": 100.0,
        "gymckpt_redone_fraction_pooled": pooled,
        "measured_parked_fraction": parked,
        "parked_fraction_of_rollout_time": parked,
    }


def _checkpoint(unaligned: dict[str, object]) -> object:
    from gymckpt.benchmarks.report import CheckpointResult, read_result

    aligned = _mode("aligned", 300_000.0, 320.0, 100.0)
    data = {
        "in_flight": 200_000,
        "config": {"instances": 4, "dispatch_batch": 512},
        "checkpoint_ok": True,
        "episodes_exported": 200_000,
        "pending_drained": 0,
        "snapshot_files": 1,
        "ledger_json_bytes": 1,
        "stages": [],
        "max_loop_stall_ms": 1.0,
        "modes": {"unaligned": unaligned, "aligned": aligned},
        "turn_times": {"median_s": 50.0, "p99_s": 1000.0, "p99_over_median": 21.0},
    }
    return read_result(data, CheckpointResult, "checkpoint.json")


def _preserved(unaligned_pooled: float, unaligned_parked: float) -> object:
    from gymckpt.benchmarks.report import PreservedResult, read_result

    cfg = {
        "instances": 4,
        "rows_in_flight": 32,
        "group_size": 4,
        "groups_per_step": 8,
        "train_s": 5.0,
        "turns": [4, 24],
        "kill_window_s": [60.0, 600.0],
    }
    data = {
        "config": cfg,
        "kills": 10,
        "restores": 9,
        "boundary_mismatches": 0,
        "per_kill": [],
        "gymckpt_redone_rollout_s_total": 1.0,
        "baseline_redone_rollout_s_total": 10.0,
        "modes": {
            "unaligned": _preserved_mode("unaligned", unaligned_pooled, unaligned_parked),
            "aligned": _preserved_mode("aligned", 0.12, 0.14),
        },
    }
    return read_result(data, PreservedResult, "preserved.json")


def test_mode_targets_met_and_missed() -> None:
    """Issue 22's rows: each verdict follows its figure (all causes: the heartbeat's lateness
    counts as a stall), and the figures of both modes are shown side by side."""
    from typing import Any, cast

    from gymckpt.benchmarks.report._targets import _mode_rows

    def verdicts(ck: object, pv: object) -> dict[str, TargetRow]:
        rows: list[TargetRow] = []

        def row(
            key: str,
            fig: str,
            tgt: str,
            measured: str,
            ok: Any,
            exact: bool = True,
            why: str = "",
            report_only: bool = False,
        ) -> None:
            status = (
                Status.NOT_MEASURED
                if ok is None or not exact
                else Status.REPORTED
                if report_only and ok
                else Status.MET
                if ok
                else Status.MISSED
            )
            rows.append(TargetRow(key, fig, tgt, measured, status, why))

        _mode_rows(row, cast(Any, ck), None, cast(Any, pv))
        return {r.key: r for r in rows}

    good = verdicts(_checkpoint(_mode("unaligned", 4.0, 1.5, 3.0)), _preserved(0.10, 0.001))
    assert good["unaligned_pause_p99"].status is Status.MET
    assert "aligned 300.0 s" in good["unaligned_pause_p99"].measured
    assert good["unaligned_checkpoint_e2e"].status is Status.MET
    assert good["unaligned_checkpoint_stall"].status is Status.MET  # 6 ms heartbeat
    assert good["unaligned_parked"].status is Status.MET
    assert good["unaligned_redone"].status is Status.MET
    assert good["checkpoint_modes_ray"].status is Status.NOT_MEASURED
    bad = verdicts(_checkpoint(_mode("unaligned", 40.0, 2.5, 6.0)), _preserved(0.20, 0.02))
    assert {k: r.status for k, r in bad.items() if k != "checkpoint_modes_ray"} == {
        "unaligned_pause_p99": Status.MISSED,
        "unaligned_checkpoint_e2e": Status.MISSED,
        "unaligned_checkpoint_stall": Status.MISSED,  # 12 ms heartbeat, 6 ms task step
        "unaligned_parked": Status.MISSED,
        "unaligned_redone": Status.MISSED,
    }
    assert bad["unaligned_redone"].measured == "20.0 % (aligned 12.0 %; baseline 100 %)"
    none = verdicts(None, None)
    assert {r.status for r in none.values()} == {Status.NOT_MEASURED}


def test_modes_section_renders_both_modes() -> None:
    from typing import Any, cast

    from gymckpt.benchmarks.report._format import ratio
    from gymckpt.benchmarks.report._modes import modes_section

    lines: list[str] = []
    ck, pv = _checkpoint(_mode("unaligned", 4.0, 1.5, 3.0)), _preserved(0.10, 0.001)
    modes_section(lines.append, cast(Any, ck), None, cast(Any, pv))
    text = "\n".join(lines)
    assert "## Checkpoint modes side by side: aligned and unaligned" in text
    table = [line for line in lines if line.startswith("| embedded |")]
    assert [line.split(" | ")[1] for line in table] == ["unaligned", "aligned"]
    assert "+ 300 s simulated" in table[1] and "simulated" not in table[0]
    assert "4.0 ms / 8 ms" in table[0]  # pause p99 / max
    assert "embedded: unaligned / aligned, until every episode moves 0.005\u00d7" in text
    prows = [line for line in lines if line.startswith("| unaligned |")]
    assert len(prows) == 1 and "0.10 % / 0.10 %" in prows[0]
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(1.0, 4.0) == 0.25
    empty: list[str] = []
    modes_section(empty.append, None, None, None)  # older results: no section
    assert empty == []


def test_results_from_another_run_are_named(tmp_path: Path) -> None:
    """A result file that another command or commit wrote (a benchmark run on its own after
    ``all``) is named in SUMMARY.md's provenance, with its command and commit."""
    from gymckpt.benchmarks.report._summary import _other_runs

    run = {"command": "gymckpt bench all", "source": {"commit_full": "a" * 40}}
    dump(tmp_path / "drain.json", {**DRAIN, "meta": run})
    dump(tmp_path / "memory.json", {"method": "x", "results": [], "meta": run})
    dump(tmp_path / "dispatch.json", {"rows_per_config": 1, "results": []})  # no meta: same
    assert Results.read(tmp_path).others == {}
    later = {
        "command": "gymckpt bench memory",
        "source": {"commit_full": "b" * 40, "uncommitted_changes": []},
        "machine": {"date_utc": "2026-12-02 05:00 UTC"},
    }
    dump(tmp_path / "memory.json", {"method": "x", "results": [], "meta": later})
    got = Results.read(tmp_path)
    assert got.others == {"memory.json": later}
    lines: list[str] = []
    _other_runs(lines.append, got.others)
    assert lines[2] == (
        "- `memory.json`: `gymckpt bench memory` on 2026-12-02 05:00 UTC, commit "
        f"`{'b' * 40}`, clean tree."
    )


def test_mode_misses_say_what_it_would_take() -> None:
    """One paragraph per missed mode target, each naming what it would take; the pause's
    says whether the loop is over the target without a checkpoint too."""
    from typing import Any, cast

    from gymckpt.benchmarks.report._modes import mode_miss_lines

    keys = {
        "unaligned_pause_p99",
        "unaligned_checkpoint_e2e",
        "unaligned_checkpoint_stall",
        "unaligned_parked",
        "unaligned_redone",
    }
    ck = cast(Any, _checkpoint(_mode("unaligned", 40.0, 2.5, 6.0)))
    lines = mode_miss_lines(keys, ck, cast(Any, _preserved(0.20, 0.02)))
    assert len(lines) == 5 and all("*What it would take:*" in line for line in lines)
    assert "the checkpoint's own work on the loop" in lines[0]  # control p99 0.5 ms
    assert "unaligned 20.0 % > aligned 12.0 %" in lines[4]
    assert mode_miss_lines(set(), ck, None) == []
    assert mode_miss_lines(keys, None, None) == []


RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results"

HOST = {
    "per_step": {
        "env": "CartPole-v1",
        "episodes": 256,
        "steps_per_trial": 5595,
        "plain_us_per_step_median": 76.69,
        "host_us_per_step_median": 139.12,
        "host_overhead_us_per_step": 62.43,
        "host_over_plain_ratio": 1.814,
    },
    "loop": {
        "rows": 256,
        "group_size": 4,
        "embedded_2_instances_episodes_per_s": 326.7,
        "embedded_2_instances_episodes": 1024,
        "ray_2_actors_episodes_per_s": 323.2,
        "ray_2_actors_episodes": 1024,
    },
    "meta": {
        "command": "gymckpt bench host --json",
        "source": {"commit_full": "c" * 40, "uncommitted_changes": []},
        "machine": {"date_utc": "2026-12-02 06:00 UTC"},
    },
}
"""A ``host.json`` written before the unaligned mode's marks were measured."""


def _marks_of(ratio: float, cpu_ratio: float, **extra: object) -> dict[str, object]:
    on, off = 100.0 * (1 + ratio), 100.0
    return {
        "marks_us_per_step_median": on,
        "opted_out_us_per_step_median": off,
        "marks_overhead_us_per_step": on - off,
        "marks_overhead_ratio": ratio,
        "marks_cpu_us_per_step_median": 80.0 * (1 + cpu_ratio),
        "opted_out_cpu_us_per_step_median": 80.0,
        "marks_overhead_cpu_us_per_step": 80.0 * cpu_ratio,
        "marks_overhead_cpu_ratio": cpu_ratio,
        **extra,
    }


def _host_with_marks(cpu_ratio: float = 0.04, episodes: int = 256) -> dict[str, object]:
    return {
        **HOST,
        "marks": {
            "cartpole": _marks_of(0.05, cpu_ratio, env="CartPole-v1", episodes=episodes),
            "calendar": _marks_of(0.20, 0.15, episodes=64, turns=50),
        },
    }


def _summary(out: Path) -> str:
    """SUMMARY.md for the results in ``out``: the committed drain, memory and dispatch
    results beside whatever the test wrote."""
    from gymckpt.benchmarks.report import write_summary

    for name in ("drain.json", "memory.json", "dispatch.json"):
        (out / name).write_bytes((RESULTS / name).read_bytes())
    write_summary(out / "SUMMARY.md", Results.read(out), [])
    return (out / "SUMMARY.md").read_text()


def _marks_line(text: str) -> str:
    return next(line for line in text.splitlines() if "unaligned mode's per-step cost" in line)


def test_host_json_without_marks_reads_and_its_row_is_not_run(tmp_path: Path) -> None:
    """No ``host.json``: the row is not run and *Not measured here* says how to write one. A
    ``host.json`` from before the marks: read (its per-step and loop figures in the host
    section, named as another run's), the row still not run."""
    from gymckpt.benchmarks.report._summary import NOT_MEASURED

    text = _summary(tmp_path)
    assert Results.read(tmp_path).host is None
    assert _marks_line(text).endswith("| not run | **not measured** |")
    assert NOT_MEASURED in text and "## The Gym host on Gymnasium CartPole" not in text
    dump(tmp_path / "host.json", HOST)
    got = Results.read(tmp_path)
    assert got.host is not None and got.host.marks is None
    assert got.host.per_step.plain_us_per_step_median == 76.69
    assert got.host.loop.ray_2_actors_episodes_per_s == 323.2
    assert "host.json" in got.others
    row = next(t for t in results_targets(got) if t.key == "host_marks_overhead")
    assert (row.status, row.measured) == (Status.NOT_MEASURED, "not run")
    text = _summary(tmp_path)
    assert _marks_line(text).endswith("| not run | **not measured** |")
    assert "## The Gym host on Gymnasium CartPole" in text and NOT_MEASURED not in text
    assert "plain Gymnasium 76.7 µs, hosted 139.1 µs" in text
    assert "boundary marks: not measured (this `host.json` predates them" in text
    assert "Ray with 2 actors 323.2." in text


def test_host_json_marks_give_the_row_its_verdict(tmp_path: Path) -> None:
    """With ``marks`` the row is judged on the larger of wall and CPU at 256 episodes, its
    figure in the table, the µs per step on and off in the host section; ``marks`` are read
    as strictly as every result."""
    dump(tmp_path / "host.json", _host_with_marks(cpu_ratio=0.04))
    text = _summary(tmp_path)
    assert _marks_line(text).endswith(
        "| 5.0 % wall, 4.0 % CPU of a 100 µs step; calendar (50 turns) 20.0 % wall, "
        "15.0 % CPU | **met** |"
    )
    assert (
        "| CartPole, 256 episodes | 105.0 µs (83.2 µs CPU) | 100.0 µs (80.0 µs CPU) | "
        "5.0 % (4.0 % CPU) |"
    ) in text
    assert (
        "| calendar, 64 episodes of 50 turns | 120.0 µs (92.0 µs CPU) | 100.0 µs (80.0 µs CPU) "
        "| 20.0 % (15.0 % CPU) |"
    ) in text
    # a --no-ray run's figures merged into a file with Ray's: the loop names its own run
    merged = _host_with_marks()
    merged["loop"] = {**HOST["loop"], "meta": {"command": "gymckpt bench host --json"}}  # type: ignore[dict-item]
    dump(tmp_path / "host.json", merged)
    assert "(from an earlier run, `gymckpt bench host --json` on" in _summary(tmp_path)
    assert "per-step cost on CartPole" not in text.split("## Targets")[1]  # met: no miss
    dump(tmp_path / "host.json", _host_with_marks(cpu_ratio=0.11))
    text = _summary(tmp_path)
    assert _marks_line(text).endswith(" CPU | **MISSED** |")
    miss = next(line for line in text.splitlines() if line.startswith("- **The unaligned mode"))
    assert "CartPole 5.0 % wall, 11.0 % CPU > 10 %.**" in miss
    assert "add 5.0 µs (8.8 µs CPU) to a 100 µs (80 µs CPU) step opted out" in miss
    assert "*What it would take:* marks at most a tenth of a step, 10 µs wall and 8 µs" in miss
    dump(tmp_path / "host.json", _host_with_marks(episodes=32))
    row = next(t for t in results_targets(Results.read(tmp_path)) if t.key == "host_marks_overhead")
    assert row.status is Status.NOT_MEASURED and "(at 32; the target is at 256)" in row.measured
    bad = _host_with_marks()
    bad["marks"]["cartpole"]["marks_overhead_ratio"] = "0.05"  # type: ignore[index]
    dump(tmp_path / "host.json", bad)
    with pytest.raises(ValueError, match=r"host\.json\.marks\.cartpole\.marks_overhead_ratio"):
        Results.read(tmp_path)
    bad = _host_with_marks()
    del bad["marks"]["calendar"]["turns"]  # type: ignore[index]
    dump(tmp_path / "host.json", bad)
    with pytest.raises(
        ValueError, match=r"required field missing @ host\.json\.marks\.calendar\.turns"
    ):
        Results.read(tmp_path)


def test_the_results_index_names_every_committed_result() -> None:
    """``docs/benchmarks/index.md`` lists each committed result with the commit it measured."""
    index = (RESULTS.parent / "index.md").read_text(encoding="utf-8")
    for path in sorted(RESULTS.glob("*.json")):
        commit = json.loads(path.read_text())["meta"]["source"]["commit"]
        line = next((x for x in index.splitlines() if f"(results/{path.name})" in x), "")
        assert f"`{commit}`" in line, f"{path.name} (commit {commit}) is not in the index"


def _sandbox(sessions: int, second_bytes: int) -> dict[str, object]:
    first_full = sessions * 21 << 20
    return {
        "sessions": sessions,
        "template_files": 1000,
        "template_bytes": 20 << 20,
        "changed_fraction": 0.01,
        "first": {
            "full_bytes": first_full,
            "incremental_bytes": 21 << 20,
            "snapshot_bytes": 1 << 20,
            "object_bytes": 20 << 20,
        },
        "second": {
            "full_bytes": first_full,
            "incremental_bytes": second_bytes,
            "snapshot_bytes": 1 << 20,
            "object_bytes": second_bytes - (1 << 20),
        },
        "second_incremental_over_first_full": second_bytes / first_full,
        "second_over_first_incremental": second_bytes / (21 << 20),
        "mark": [{"changed_files": 0, "mark_ms_median": 20.0, "hashed": [0]}],
        "restore_ms_median": 150.0,
    }


def test_the_sandbox_rows_judge_the_second_checkpoint_against_the_first_written_whole() -> None:
    """``sandbox_incremental``: second incremental / first full under 5 % at 1,000 sessions
    (met or MISSED), the ratio to the first's incremental bytes printed beside it; another
    size is not measured; the mark and the restore are reported."""
    from gymckpt.benchmarks.report._records import SandboxResult
    from gymckpt.benchmarks.report._results import read_result
    from gymckpt.benchmarks.report._targets import _Rows, _sandbox_rows

    def rows(data: dict[str, object]) -> dict[str, TargetRow]:
        row = _Rows()
        _sandbox_rows(row, read_result(data, SandboxResult, "sandbox.json"))
        return {t.key: t for t in row.rows}

    met = rows(_sandbox(1000, 60 << 20))
    assert met["sandbox_incremental"].status is Status.MET
    assert "0.286 % of the first written whole" in met["sandbox_incremental"].measured
    assert "286 % of the first's incremental bytes" in met["sandbox_incremental"].measured
    assert met["sandbox_mark"].status is Status.REPORTED
    assert met["sandbox_restore"].status is Status.REPORTED
    missed = rows(_sandbox(1000, 2 << 30))
    assert missed["sandbox_incremental"].status is Status.MISSED
    small = rows(_sandbox(8, 1 << 20))
    assert small["sandbox_incremental"].status is Status.NOT_MEASURED
    assert small["sandbox_incremental"].measured.endswith("at 8 sessions")
    none = _Rows()
    _sandbox_rows(none, None)
    assert [(t.key, t.measured) for t in none.rows] == [("sandbox_incremental", "not run")]
