"""Kill points: how a training program lets ``gymckpt chaos`` aim its SIGKILLs at checkpoint
stages. Nothing happens unless ``gymckpt chaos`` runs the program.

A program calls ``arm_kill_points(rollouts)`` once ``open_rollouts`` has opened. Under chaos
(environment variable ``GYMCKPT_CHAOS_MARKS`` set) it prints ``ARMED`` on stderr at once (the
program is past its start-up and restore: timed kills are drawn after that moment), then one
line at each stage of each checkpoint of this process, ``gymckpt-chaos-mark: STAGE N`` (``N``
counts this process's checkpoints from 1): that is how chaos learns, from the uninterrupted
run, which stages the program reaches and how often. With ``GYMCKPT_CHAOS_KILL_AT=STAGE@N`` it
SIGKILLs itself at that stage of its ``N``-th checkpoint. The stages are the coordinator's hook
points (``HOOK_POINTS``) and ``mid_publish``: the snapshot's files and manifest written, its
commit marker not yet.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from gymckpt.nurseries import HOOK_POINTS, Rollouts
from gymckpt.runtime import SnapshotInfo, SnapshotStore
from gymckpt.runtime._shared import MANIFEST_NAME, GymManifest

__all__ = [
    "ARMED",
    "KILL_AT_ENV",
    "MARK",
    "MARKS_ENV",
    "MID_PUBLISH",
    "STAGES",
    "arm_kill_points",
    "parse_kill_at",
    "read_marks",
]

MARKS_ENV = "GYMCKPT_CHAOS_MARKS"
"""Set (to "1") by ``gymckpt chaos`` for every run: print the stage marks."""
KILL_AT_ENV = "GYMCKPT_CHAOS_KILL_AT"
"""Set by ``gymckpt chaos`` to ``STAGE@N`` for a run whose kill is aimed at a stage."""
MARK = "gymckpt-chaos-mark:"
"""The head of a stage mark line on stderr."""
MID_PUBLISH = "mid_publish"
STAGES = (*HOOK_POINTS, MID_PUBLISH)
"""Every stage a kill can be aimed at, in the order a checkpoint passes them."""

ARMED = f"{MARK} armed"
"""The line ``arm_kill_points`` prints at once: the program's runtime is open (restored)."""

_MARK_LINE = re.compile(rf"^{re.escape(MARK)} (\w+) (\d+)$")


def parse_kill_at(raw: str) -> tuple[str, int]:
    """``STAGE@N`` as (stage, N); ``ValueError`` saying what is wrong."""
    stage, _, n = raw.partition("@")
    if stage not in STAGES or not n.isdigit() or int(n) < 1:
        raise ValueError(
            f"{KILL_AT_ENV}={raw!r}: expected STAGE@N, STAGE one of {', '.join(STAGES)}, N >= 1"
        )
    return stage, int(n)


def read_marks(text: str) -> list[tuple[str, int]]:
    """The stage marks, in order, of a program's stderr ``text``."""
    return [(m[1], int(m[2])) for m in map(_MARK_LINE.match, text.splitlines()) if m]


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _MarkingStore:
    """A ``SnapshotStore`` that calls ``on_manifest(checkpoint_id)`` once a snapshot's
    manifest is written, before its commit marker; all else delegates."""

    def __init__(self, inner: SnapshotStore, on_manifest: Any) -> None:
        self._inner = inner
        self._on_manifest = on_manifest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def publish(
        self, staging: Path, manifest: GymManifest, files: Mapping[str, bytes]
    ) -> SnapshotInfo:
        def on_write(name: str) -> None:
            if name == MANIFEST_NAME:
                self._on_manifest(manifest.checkpoint_id)

        return self._inner.publish(staging, manifest, files, on_write=on_write)


def arm_kill_points(rollouts: Rollouts, environ: Mapping[str, str] = os.environ) -> None:
    """Under ``gymckpt chaos``: mark each checkpoint stage of this process on stderr, and
    SIGKILL this process at the stage ``GYMCKPT_CHAOS_KILL_AT`` names. Outside chaos, nothing.
    A malformed ``GYMCKPT_CHAOS_KILL_AT`` is a ``ValueError`` naming it."""
    if not environ.get(MARKS_ENV):
        return
    kill_at = parse_kill_at(environ[KILL_AT_ENV]) if environ.get(KILL_AT_ENV) else None
    print(ARMED, file=sys.stderr, flush=True)
    coordinator = rollouts.coordinator
    inner_hook = coordinator.on_stage
    ordinals: dict[str, int] = {}

    def reached(checkpoint_id: str, stage: str) -> None:
        n = ordinals.setdefault(checkpoint_id, len(ordinals) + 1)
        print(f"{MARK} {stage} {n}", file=sys.stderr, flush=True)
        if kill_at == (stage, n):
            _sigkill_self()

    def on_stage(checkpoint_id: str, point: str) -> None:
        reached(checkpoint_id, point)
        if inner_hook is not None:
            inner_hook(checkpoint_id, point)

    coordinator.on_stage = on_stage
    coordinator.store = cast(
        SnapshotStore, _MarkingStore(coordinator.store, lambda cid: reached(cid, MID_PUBLISH))
    )
