"""The benchmarks of the targets at scale: the embedded checkpoint's third mode (the default
configuration's alignment timeout, several checkpoints per mode, the share that completes),
the trainer side alone (``bench checkpoint --backend null``), the targets' rows and misses, and
``bench issue34`` (every step at quick sizes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gymckpt.benchmarks.checkpoint import (
    against_unaligned,
    measured_runtime_config,
    mode_config,
    reference_mode,
    repeats_summary,
)
from gymckpt.benchmarks.cli import main
from gymckpt.benchmarks.report._scale_run import scale_verdicts
from gymckpt.runtime import RuntimeConfig


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert err == ""  # stderr is not a terminal here: no progress lines
    result: dict[str, Any] = json.loads(out)
    return result


def _mode_run(ok: bool, until: float, p99: float, mid_turn: int = 0) -> dict[str, Any]:
    return {
        "checkpoint_ok": ok,
        "checkpoint_error": None if ok else "prepare timed out",
        "checkpoint_failure": None if ok else "gym_unavailable",
        "until_all_moving_s": until,
        "until_all_moving_with_wait_s": until,
        "mid_turn": mid_turn,
        "pauses": {"pause_p50_ms": p99 / 10, "pause_p99_ms": p99},
    }


def test_aligned_timeout_is_the_default_configurations_timeouts() -> None:
    base = measured_runtime_config()
    cfg = mode_config(base, "aligned_timeout")
    default = RuntimeConfig()
    assert cfg.checkpoint_mode.value == "aligned"
    assert (cfg.control_timeout_s, cfg.alignment_timeout_s) == (
        default.control_timeout_s,
        default.alignment_timeout_s,
    )
    assert cfg.lease_s == base.lease_s  # every other bound the measured run's
    pure = mode_config(base, "aligned")
    assert pure.alignment_timeout_s == base.alignment_timeout_s
    assert mode_config(base, "unaligned").checkpoint_mode.value == "unaligned"


def test_a_failed_checkpoint_counts_as_not_complete() -> None:
    """A mode whose checkpoints fail (the reference protocol when a turn outlasts its bound)
    is 0 % complete, a figure rather than the end of the run; a mode with some failures is
    summarised by its completed checkpoints."""
    cfg = RuntimeConfig()
    failed = repeats_summary([_mode_run(False, 9.0, 9e3) for _ in range(3)], cfg)
    assert (failed["checkpoints"], failed["completed"], failed["complete_pct"]) == (3, 0, 0.0)
    assert failed["checkpoint_ok"] is False and failed["pause_p99_ms_median"] is None
    assert [r["checkpoint_failure"] for r in failed["repeats"]] == ["gym_unavailable"] * 3
    some = repeats_summary(
        [
            _mode_run(True, 1.0, 100.0, 7),
            _mode_run(False, 9.0, 9e3),
            _mode_run(True, 3.0, 300.0, 9),
        ],
        cfg,
    )
    assert (some["completed"], some["complete_pct"]) == (2, 66.7)
    assert some["checkpoint_ok"] is True and some["until_all_moving_s"] == 1.0  # lower median
    assert some["pause_p99_ms_median"] == 200.0 and some["mid_turn_median"] == 8
    unaligned = repeats_summary([_mode_run(True, 0.5, 5.0)], cfg)
    modes = {"unaligned": unaligned, "aligned_timeout": some, "aligned": failed}
    against_unaligned(modes)
    assert some["vs_unaligned"]["until_all_moving_s"] == 2.0
    assert some["vs_unaligned"]["pause_p99_ms_median"] == 40.0
    assert failed["vs_unaligned"]["until_all_moving_s"] is None  # failed: no ratio
    # the top level of the result is a mode that completed
    assert reference_mode(modes, ("unaligned", "aligned_timeout", "aligned")) == "unaligned"


@pytest.mark.timeout(300)
def test_embedded_checkpoint_measures_three_modes(capsys: pytest.CaptureFixture[str]) -> None:
    """The default modes on the same episodes, each measured twice: the alignment timeout's
    checkpoints complete with episodes taken mid-turn (the turns' p99 is far above both of its
    timeouts), and each mode's cost is given against pure unaligned in the same run."""
    r = _run(capsys, "checkpoint", "--quick", "--rollouts", "800", "--checkpoints", "2", "--json")
    modes = r["modes"]
    assert list(modes) == ["unaligned", "aligned_timeout", "aligned"]
    for name, m in modes.items():
        assert m["checkpoint_mode"] == name
        assert (m["checkpoints"], len(m["repeats"])) == (2, 2)
        assert m["complete_pct"] == 100.0, m["repeats"]
        assert m["control_pauses"]["episodes"] == 800  # measured after its first checkpoint
    t = modes["aligned_timeout"]
    assert (t["control_timeout_s"], t["alignment_timeout_s"]) == (10.0, 1.0)
    assert r["turn_times"]["p99_s"] > 10 * t["control_timeout_s"]
    assert t["mid_turn_median"] > 0  # the turns still in flight at the timeout were cut
    assert modes["aligned"]["mid_turn_median"] == 0  # the reference protocol waits for them
    # the wait the episodes felt: at most the alignment timeout, not the slowest turn
    assert 1.0 <= t["until_all_moving_with_wait_s"] < r["turn_times"]["cap_s"]
    assert t["vs_unaligned"]["until_all_moving_with_wait_s"] > 1
    assert r["reference_mode"] == "aligned"


@pytest.mark.timeout(300)
def test_the_reference_protocol_fails_where_the_alignment_timeout_completes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Turns whose p99 outlasts every timeout, the reference protocol's one-hour bound
    included: its checkpoint fails (gym_unavailable), counted 0 % complete rather than ending
    the run, while the default alignment timeout's completes with the rest taken mid-turn."""
    r = _run(
        capsys,
        "checkpoint",
        "--quick",
        "--rollouts",
        "400",
        "--turn-mean",
        "2000",
        "--modes",
        "aligned_timeout,aligned",
        "--checkpoints",
        "1",
        "--json",
    )
    assert r["turn_times"]["p99_s"] > 3 * 3600
    t, a = r["modes"]["aligned_timeout"], r["modes"]["aligned"]
    assert (t["complete_pct"], t["checkpoint_ok"]) == (100.0, True)
    assert t["mid_turn_median"] > 0
    assert (a["complete_pct"], a["checkpoint_ok"]) == (0.0, False)
    assert a["checkpoint_failure"] == "gym_unavailable", a["checkpoint_error"]
    assert r["reference_mode"] == "aligned_timeout"  # the top level is a checkpoint that completed


def test_checkpoint_modes_are_checked_where_they_enter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "--modes", "aligned,sideways"]) == 2
    assert "aligned_timeout" in capsys.readouterr().err  # the choices are named
    assert main(["preserved", "--modes", "aligned_timeout"]) == 2  # embedded checkpoint only
    assert main(["checkpoint", "--backend", "ray", "--checkpoints", "2"]) == 2
    assert main(["checkpoint", "--backend", "null", "--modes", "aligned"]) == 2
    assert main(["checkpoint", "--checkpoints", "0"]) == 2
    capsys.readouterr()


@pytest.mark.timeout(120)
def test_trainer_side_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """One whole checkpoint against a Gym that answers at once: every episode in flight is
    exported, the figures are the runtime's (no time inside Gym's calls to speak of)."""
    r = _run(capsys, "checkpoint", "--backend", "null", "--quick", "--rollouts", "4000", "--json")
    assert r["checkpoint_ok"] is True, r["checkpoint_error"]
    assert r["in_flight"] == r["episodes_exported"] == 4000
    assert r["close_to_resume_s"] == r["checkpoint_wall_s"] > 0
    assert r["stall_all_causes_ms"] >= r["max_loop_stall_ms"]
    assert [s["stage"] for s in r["stages"]][:3] == ["close+retire", "prepare", "commit"]
    assert set(r["stage_s"]) >= {"ownership", "snapshot", "publish", "resume"}


@pytest.mark.timeout(600)
def test_issue34_quick_runs_every_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``bench issue34 --quick``: every step runs and writes its result; no target is passed
    at quick sizes; with the figures at the targets' sizes the rows judge them and each miss
    says what it would take."""
    r = _run(capsys, "issue34", "--quick", "--no-ray", "--json", "--out", str(tmp_path))
    assert {k: s["ok"] for k, s in r["steps"].items()} == {
        "trainer_side": True,
        "dispatch": True,
        "host": True,
        "checkpoint": True,
        "checkpoint_ray": None,
    }
    ck = json.loads((tmp_path / "checkpoint.json").read_text())
    # the turns outlast every timeout: the reference protocol fails, the timeout completes
    assert ck["modes"]["aligned"]["complete_pct"] == 0.0
    assert ck["modes"]["aligned_timeout"]["complete_pct"] == 100.0
    keys = [t["key"] for t in r["targets"]]
    assert keys == [
        "unaligned_pause_p99",
        "unaligned_checkpoint_e2e",
        "unaligned_checkpoint_stall",
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
    ]
    assert {t["status"] for t in r["targets"]} == {"not measured"}  # quick: none judged
    report = (tmp_path / "ISSUE34.md").read_text()
    assert "issue34 --quick" in report and "| figure | target | measured | |" in report
    # the same results at the targets' sizes, with two misses
    ck["in_flight"] = 200_000
    t = ck["modes"]["aligned_timeout"]
    t["repeats"].append(
        {
            **t["repeats"][0],
            "checkpoint_ok": False,
            "checkpoint_error": "boom",
            "checkpoint_failure": "gym_unavailable",
        }
    )
    t.update(checkpoints=3, completed=2, complete_pct=66.7)
    (tmp_path / "checkpoint.json").write_text(json.dumps(ck))
    u = ck["modes"]["unaligned"]
    remote = {
        "config": {"in_flight": 200_000, "actors": 4},
        "checkpoint_ok": True,
        "in_flight": 200_000,
        "actors": 4,
        "modes": {"unaligned": u},
    }
    (tmp_path / "checkpoint_ray.json").write_text(
        json.dumps({**remote, "http": {**remote, "client_sockets_max": 25_000}})
    )
    rows, misses = scale_verdicts(tmp_path)
    by_key = {t.key: t.status.value for t in rows}
    assert by_key["aligned_timeout_complete"] == "MISSED"
    assert by_key["http_sockets"] == "MISSED"
    assert by_key["ray_until_moving"] in ("met", "MISSED")  # judged at 200k, 4 actors
    text = "\n".join(misses)
    assert "2 of 3 completed" in text and "gym_unavailable: boom" in text
    assert "HTTP sockets 25,000 > 1,000" in text and "What it would take" in text
