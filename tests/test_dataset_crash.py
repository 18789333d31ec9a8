"""Acceptance: a real trainer process checkpoints with a JSONL dataset and is SIGKILLed; a second
process restores against an edited dataset and exits 2 naming the row, and its Gym was asked
nothing that installs, retires or runs anything (every call it got is logged by the script)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from gymckpt.runtime import SnapshotStore

pytestmark = pytest.mark.subprocess

TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    import gymckpt
    from gymckpt.gym_adapter import EmbeddedGym
    from gymckpt.testing.examples import task_reader

    workdir, dataset, calls = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])

    class Recorded:
        '''The backend, every call it gets appended to ``calls`` before it runs.'''

        def __init__(self, gym):
            self._gym = gym

        def __getattr__(self, name):
            attr = getattr(self._gym, name)
            if not callable(attr):
                return attr

            def call(*args, **kwargs):
                with calls.open("a") as log:
                    log.write(name + "\\n")
                return attr(*args, **kwargs)

            return call

    async def main():
        async with EmbeddedGym.host(task_reader(turn_s=0.2), instances=2) as gym:
            async with gymckpt.open_rollouts(
                Recorded(gym), workdir, dataset=dataset, group_size=2, max_rows_in_flight=6
            ) as ro:
                async for batch in ro.batches(groups_per_step=2):
                    outcome = await ro.checkpoint(b"{}")
                    if outcome.ok and outcome.episodes:
                        print("checkpointed", outcome.snapshot.path, flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)

    gymckpt.run(main)
    """
)

TASKS = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(30)]


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write(path: Path, tasks: list[dict[str, object]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in tasks))


def test_a_restore_against_an_edited_dataset_exits_2_naming_the_row(tmp_path: Path) -> None:
    script, dataset, workdir = tmp_path / "trainer.py", tmp_path / "tasks.jsonl", tmp_path / "w"
    script.write_text(TRAINER)
    _write(dataset, TASKS)

    def trainer(calls: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(script), str(workdir), str(dataset), str(calls)]
        return subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, check=False
        )

    first = trainer(tmp_path / "calls-1")
    assert first.returncode == -9, first.stderr  # a real SIGKILL after the checkpoint
    assert "checkpointed" in first.stdout
    assert "restore" not in (tmp_path / "calls-1").read_text().split()
    [snap] = SnapshotStore(workdir / "snapshots").list_complete()
    before = _files(workdir / "snapshots")

    edited = [dict(t) for t in TASKS]
    edited[1]["answer"] = 3  # a row every snapshot covers (row 0 and 1 were dispatched first)
    _write(dataset, edited)
    second = trainer(tmp_path / "calls-2")
    assert second.returncode == 2, second.stderr
    [line] = second.stderr.splitlines()  # one line, no traceback
    assert line.startswith(f"gymckpt: error: {snap.path}: dataset row 1 differs"), line
    log = tmp_path / "calls-2"
    asked = log.read_text().split() if log.exists() else []  # none: refused before topology
    installs = {"restore", "retire", "retire_restored", "prepare", "commit", "resume", "run"}
    assert not installs & set(asked), asked  # Gym was asked nothing that changes it
    assert _files(workdir / "snapshots") == before  # nor was the snapshot

    _write(dataset, TASKS)  # the dataset the snapshot was made with: it restores
    third = trainer(tmp_path / "calls-3")
    assert third.returncode == -9, third.stderr
    assert "restore" in (tmp_path / "calls-3").read_text().split()
