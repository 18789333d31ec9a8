"""The trainer's files are regular files inside the snapshot, never links out of it.

A ``files=`` writer that links a file into ``trainer/`` (to save a copy) gets the file's bytes
copied in place of the link, and one that hard-links a file gets a copy of its own: editing the
original after the commit changes nothing the snapshot holds or a restore hands back. A link to
a directory or to nothing, or a fifo, fails that checkpoint as ``trainer_files`` (retried at the
next one, named in the outcome), leaving no staging directory behind. ``gymckpt verify``
refuses a snapshot that already holds a link under ``trainer/``, and so does a restore.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.gym_adapter import (
    EmbeddedGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import Rollouts, open_rollouts
from gymckpt.runtime import RuntimeConfig, TopologyMismatch, load_snapshot, records_digest
from gymckpt.runtime._shared import COMMIT_MARKER

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)


@asynccontextmanager
async def running(workdir: Path, gym_dir: Path, **kw: Any) -> AsyncIterator[Rollouts]:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=gym_dir,
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, workdir, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6, **kw
        ) as ro:
            yield ro


def staging_dirs(workdir: Path) -> list[str]:
    return [p.name for p in (workdir / "snapshots").iterdir() if p.name.startswith(".staging")]


async def test_linked_trainer_files_are_copied_and_edits_of_the_target_change_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "cache"
    outside.mkdir()
    (outside / "model.bin").write_bytes(b"weights v1" * 1000)
    (outside / "optimizer.bin").write_bytes(b"adam v1" * 100)

    def write(directory: Path) -> None:
        (directory / "model.bin").symlink_to(outside / "model.bin")  # absolute link
        (directory / "shards").mkdir()
        os.link(outside / "optimizer.bin", directory / "shards" / "optimizer.bin")  # hard link
        (directory / "alias.bin").symlink_to("model.bin")  # relative, inside trainer/

    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        outcome = await ro.checkpoint(b"{}", files=write)
        assert outcome.ok and outcome.snapshot is not None, outcome.error
        published = outcome.snapshot.path / "trainer"
    for rel in ("model.bin", "alias.bin", "shards/optimizer.bin"):
        entry = published / rel
        assert not entry.is_symlink() and entry.is_file(), rel
    assert (published / "shards" / "optimizer.bin").stat().st_nlink == 1
    assert (published / "alias.bin").read_bytes() == b"weights v1" * 1000

    # the originals are edited in place after the commit
    (outside / "model.bin").write_bytes(b"weights v2, edited" * 1000)
    fd = os.open(outside / "optimizer.bin", os.O_WRONLY)  # same inode: what a hard link shares
    os.pwrite(fd, b"EDITED", 0)
    os.close(fd)
    assert cli_main(["verify", str(outcome.snapshot.path)]) == 0
    capsys.readouterr()
    async with running(tmp_path / "w", tmp_path / "gym2") as ro:
        assert ro.trainer_files is not None
        assert (ro.trainer_files / "model.bin").read_bytes() == b"weights v1" * 1000
        assert (ro.trainer_files / "shards" / "optimizer.bin").read_bytes() == b"adam v1" * 100


@pytest.mark.parametrize("bad", ["directory link", "dangling link", "fifo"])
async def test_a_link_to_a_directory_a_dangling_link_or_a_fifo_fails_the_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, bad: str
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.bin").write_bytes(b"x")

    def write(directory: Path) -> None:
        (directory / "ok.bin").write_bytes(b"fine")
        if bad == "directory link":
            (directory / "weights").symlink_to(outside, target_is_directory=True)
        elif bad == "dangling link":
            (directory / "weights").symlink_to(tmp_path / "nothing-here")
        else:
            os.mkfifo(directory / "weights")

    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        failed = await ro.checkpoint(b"{}", files=write)
        assert not failed.ok and failed.reason == "trainer_files", failed
        assert failed.error is not None and "trainer/weights" in failed.error, failed.error
        assert staging_dirs(tmp_path / "w") == []
        assert ro.coordinator.gate.statistics().open
        assert ro.metrics.snapshot()["checkpoint/trainer_files_total"] == 1
        good = await ro.checkpoint(b"{}", files=lambda d: (d / "ok.bin").write_bytes(b"fine"))
        assert good.ok, good.error  # retried: the next checkpoint goes through


async def test_verify_and_restore_refuse_a_link_inside_trainer_of_an_existing_snapshot(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        outcome = await ro.checkpoint(
            b"{}", files=lambda d: (d / "model.bin").write_bytes(b"weights v1")
        )
        assert outcome.ok and outcome.snapshot is not None
    snap = outcome.snapshot.path
    # what a snapshot committed with a link looks like: the link, digested by its target
    target = tmp_path / "model.bin"
    target.write_bytes(b"weights v1")
    (snap / "trainer" / "model.bin").unlink()
    (snap / "trainer" / "model.bin").symlink_to(target)
    marker = json.loads((snap / COMMIT_MARKER).read_bytes())
    marker["trees"]["trainer"] = records_digest(snap / "trainer")
    (snap / COMMIT_MARKER).write_text(json.dumps(marker))
    assert load_snapshot(snap).marker.trees["trainer"] == records_digest(snap / "trainer")

    capsys.readouterr()
    assert cli_main(["verify", str(snap)]) == 2
    err = capsys.readouterr().err
    assert f"trainer/model.bin: a symbolic link (to {str(target)!r})" in err, err

    with pytest.RaisesGroup(
        pytest.RaisesExc(
            TopologyMismatch,
            match=r"trainer/model.bin: a "
            r"symbolic link",
        ),
        flatten_subgroups=True,
        allow_unwrapped=True,
    ):
        async with running(tmp_path / "w", tmp_path / "gym2"):
            pass
