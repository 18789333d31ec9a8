"""Crash control of the demo's phase 1 (``demo_crash``): SIGKILL at one hook point of one
checkpoint, or between a snapshot's manifest and its commit marker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gymckpt.app.demo import crash as demo_crash
from gymckpt.app.demo.crash import CrashingStore, install_crash
from gymckpt.app.demo.options import MID_PUBLISH, DemoOptions
from gymckpt.runtime._shared import MANIFEST_NAME


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(demo_crash, "sigkill_self", lambda: seen.append("SIGKILL"))
    return seen


def test_a_hook_point_of_the_chosen_checkpoint_kills(kills: list[str]) -> None:
    rollouts = SimpleNamespace(coordinator=SimpleNamespace(on_stage=None, store=None))
    opts = DemoOptions(crash_stage="after_commit", crash_after_checkpoint=2)
    install_crash(opts, 1, 2, rollouts)
    rollouts.coordinator.on_stage("p1-0001", "after_commit")
    rollouts.coordinator.on_stage("p1-0002", "before_publish")
    assert kills == []
    rollouts.coordinator.on_stage("p1-0002", "after_commit")
    assert kills == ["SIGKILL"]


class Store:
    def __init__(self) -> None:
        self.written: list[str] = []

    def publish(self, staging: Any, manifest: Any, files: Any, *, on_write: Any) -> str:
        for name in ("ledger.json", MANIFEST_NAME, "COMMIT"):
            self.written.append(name)
            on_write(name)
        return "info"

    def latest_complete(self) -> None:
        return None


def test_mid_publish_kills_after_the_manifest_of_that_checkpoint_only(kills: list[str]) -> None:
    rollouts = SimpleNamespace(coordinator=SimpleNamespace(on_stage=None, store=Store()))
    install_crash(DemoOptions(crash_stage=MID_PUBLISH), 2, 1, rollouts)
    store = rollouts.coordinator.store
    assert isinstance(store, CrashingStore) and store.latest_complete() is None  # delegates
    assert store.publish(None, SimpleNamespace(checkpoint_id="p2-0002"), {}) == "info"  # type: ignore[arg-type]
    assert kills == []
    store.publish(None, SimpleNamespace(checkpoint_id="p2-0001"), {})  # type: ignore[arg-type]
    assert kills == ["SIGKILL"]


@pytest.mark.subprocess
def test_a_kill_before_the_first_snapshot_commits_judges_the_fresh_restart(
    tmp_path: Path,
) -> None:
    """Phase 1 SIGKILLs itself mid-publish of its first checkpoint: no complete snapshot, so
    phase 2 starts over from the beginning (the runtime's correct behaviour). The verdict
    judges against that point, not against phase 1's discarded steps: exactly once, no
    restore, no duplicate (it reported 8 duplicates and exit 3 before the fresh start was
    journaled)."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gymckpt", "demo", "--rows", "16", "--json"),
            *("--crash-after-checkpoint", "1", "--crash-at-stage", MID_PUBLISH),
            *("--workdir", str(tmp_path / "work")),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stdout)
    assert report["killed_with_sigkill"] and report["restores"] == 0, report
    assert (report["duplicates"], report["steps_trained_twice"], report["lost"]) == (0, 0, 0)
    assert report["exactly_once"] is True and done.returncode == 0, done.stderr[-2000:]
