"""``gymckpt snapshots prune`` takes the trainer's lock whatever form of DIR it is given.

DIR may be the work directory, its ``snapshots/`` root (also spelt with ``..`` or through a
symbolic link), one snapshot in it, or ``restored/``: in every form, while another process holds
the work directory's lock (a trainer), prune stops with exit 2 naming that process's pid and
touches nothing — not the snapshots, and not the staging directory of the checkpoint the
trainer is writing. ``--keep 0`` is refused; ``--all`` says it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig, WorkDirLock, workdir_of

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0, lease_s=30.0)

HOLDER = """
import sys
from gymckpt.runtime import WorkDirLock
lock = WorkDirLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
lock.release()
"""


def make_workdir(workdir: Path) -> None:
    """Three snapshots by a real trainer, then a restore (a pinned copy under restored/)."""

    async def run() -> None:
        for gym_dir in ("gym", "gym2"):
            async with EmbeddedGym.host(
                calendar_environment(config=SIM),
                instances=2,
                seed=3,
                work_dir=workdir.parent / gym_dir,
                config=SIM.host_config(),
            ) as gym:
                async with open_rollouts(
                    gym,
                    workdir,
                    rows=12,
                    group_size=2,
                    config=CONFIG,
                    max_rows_in_flight=6,
                    keep_snapshots=0,
                ) as ro:
                    for _ in range(3 if gym_dir == "gym" else 1):
                        await trio.sleep(1)
                        assert (await ro.checkpoint()).ok

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def snapshot_names(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "snapshots").iterdir())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    make_workdir(work)
    return work


@pytest.fixture
def trainer(workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the work directory's lock, as a running trainer does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_prune_refuses_in_every_form_of_dir_while_a_trainer_holds_the_lock(
    workdir: Path,
    trainer: subprocess.Popen[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the checkpoint the trainer is writing right now
    staging = workdir / "snapshots" / ".staging-run-0099"
    (staging / "gym").mkdir(parents=True)
    before = snapshot_names(workdir)
    assert "ckpt-000004" in before and ".staging-run-0099" in before
    link = tmp_path / "snaps-link"
    link.symlink_to(workdir / "snapshots", target_is_directory=True)
    forms = [
        workdir,
        workdir / "snapshots",
        workdir / "snapshots" / ".." / "snapshots",
        link,
        workdir / "snapshots" / "ckpt-000001",
        workdir / "restored",
        workdir / "restored" / "ckpt-000003",
    ]
    capsys.readouterr()
    for form in forms:
        for how in (["--keep", "1"], ["--all"]):
            assert cli_main(["snapshots", "prune", str(form), *how]) == 2, (form, how)
            err = capsys.readouterr().err
            assert f"in use by process {trainer.pid}" in err, (form, err)
            assert snapshot_names(workdir) == before, form  # nothing touched, staging kept
    assert sorted(p.name for p in (workdir / "restored").iterdir()) == ["ckpt-000003"]
    for form in forms:  # every form names the same work directory
        assert workdir_of(form) == workdir.resolve(), form


def test_prune_through_the_snapshot_root_once_the_trainer_is_gone(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "snapshots" / ".staging-run-0099").mkdir()  # a crashed trainer's leftover
    capsys.readouterr()
    assert (
        cli_main(["snapshots", "prune", str(workdir / "snapshots"), "--keep", "1", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [Path(p).name for p in out["removed"]] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert [(r["name"], r["pinned"]) for r in out["snapshots"]] == [
        ("ckpt-000004", False),
        ("ckpt-000003", True),
    ]  # the pinned copy is listed and kept
    assert [n for n in snapshot_names(workdir) if not n.startswith(".")] == [
        "ckpt-000004",
        "objects",  # the objects the snapshots share
    ]
    assert ".staging-run-0099" not in snapshot_names(workdir)
    assert not (workdir / "snapshots" / ".gymckpt.lock").exists()  # the work directory's lock
    # the lock is free again: a trainer can take it
    lock = WorkDirLock(workdir)
    lock.acquire()
    lock.release()


def test_keep_0_is_refused_and_all_removes_every_snapshot(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_names(workdir)
    capsys.readouterr()
    assert cli_main(["snapshots", "prune", str(workdir), "--keep", "0"]) == 2
    err = capsys.readouterr().err
    assert "--keep must be >= 1, got 0" in err and "--all" in err, err
    assert snapshot_names(workdir) == before
    with pytest.raises(SystemExit) as both:  # argparse: one or the other
        cli_main(["snapshots", "prune", str(workdir), "--keep", "2", "--all"])
    assert both.value.code == 2
    capsys.readouterr()
    assert cli_main(["snapshots", "prune", str(workdir), "--all"]) == 0
    assert "kept 0 snapshot(s)" in capsys.readouterr().out
    assert [n for n in snapshot_names(workdir) if n.startswith("ckpt-")] == []
    assert sorted(p.name for p in (workdir / "restored").iterdir()) == ["ckpt-000003"]  # pinned


def test_prune_of_one_snapshot_or_of_the_restore_copies_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_names(workdir)
    capsys.readouterr()
    assert (
        cli_main(["snapshots", "prune", str(workdir / "snapshots" / "ckpt-000002"), "--keep", "1"])
        == 2
    )
    assert "is one snapshot; prune takes its work directory or snapshot root" in (
        capsys.readouterr().err
    )
    assert cli_main(["snapshots", "prune", str(workdir / "restored"), "--keep", "1"]) == 2
    assert "holds the copies restores work from" in capsys.readouterr().err
    assert snapshot_names(workdir) == before
    assert (workdir / "restored" / "ckpt-000003").is_dir()
