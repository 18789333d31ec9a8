"""Crash control of the demo's phase 1 (``demo_crash``): SIGKILL at one hook point of one
checkpoint, or between a snapshot's manifest and its commit marker."""

from __future__ import annotations

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
