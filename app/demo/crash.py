"""Crash control of the demo's phase 1: SIGKILL itself at a checkpoint stage.

With ``--crash-at-stage``, phase 1 kills itself at one of the coordinator's hook points of its
checkpoint number ``--crash-after-checkpoint`` (counting attempts), or at ``mid_publish``:
after the snapshot's files and manifest are written, before its commit marker. Without it,
the parent kills phase 1 once that checkpoint is published (``demo_parent``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from gymckpt.runtime import SnapshotInfo, SnapshotStore
from gymckpt.runtime._shared import MANIFEST_NAME, GymManifest

from .options import MID_PUBLISH, DemoOptions

__all__ = ["CrashingStore", "install_crash", "sigkill_self"]


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingStore:
    """A ``SnapshotStore`` whose ``publish`` of one checkpoint SIGKILLs the process after the
    manifest is written and before the commit marker (``mid_publish``); all else delegates."""

    def __init__(self, inner: SnapshotStore, checkpoint_id: str) -> None:
        self._inner = inner
        self._checkpoint_id = checkpoint_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def publish(
        self, staging: Path, manifest: GymManifest, files: Mapping[str, bytes]
    ) -> SnapshotInfo:
        def on_write(name: str) -> None:
            if name == MANIFEST_NAME and manifest.checkpoint_id == self._checkpoint_id:
                sigkill_self()

        return self._inner.publish(staging, manifest, files, on_write=on_write)


def install_crash(opts: DemoOptions, phase: int, crash_after: int, rollouts: Any) -> None:
    """SIGKILL this process at ``opts.crash_stage`` of checkpoint ``crash_after``."""
    stage = opts.crash_stage
    target = f"p{phase}-{crash_after:04d}"
    coordinator = rollouts.coordinator
    if stage == MID_PUBLISH:
        coordinator.store = cast(SnapshotStore, CrashingStore(coordinator.store, target))
        return

    def on_stage(checkpoint_id: str, point: str) -> None:
        if checkpoint_id == target and point == stage:
            sigkill_self()

    coordinator.on_stage = on_stage
