"""Tests for ``gymckpt.runtime._workdir``: one trainer per work directory.

``workdir_of`` maps every documented form of a path (the work directory, its ``snapshots/`` or
``restored/``, one snapshot in either, through ``..`` or a symbolic link) to the work directory,
and anything else to None. ``WorkDirLock`` is an exclusive, non-blocking ``flock`` on
``<workdir>/.gymckpt.lock``: a second holder, in this process or another, gets
``WorkDirLocked`` naming the holder's pid; the lock goes with ``release`` or the holder's death.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gymckpt.runtime._errors import BadInput, WorkDirLocked
from gymckpt.runtime._snapshot_format import COMMIT_MARKER, LOCK_FILE
from gymckpt.runtime._workdir import WorkDirLock, workdir_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "run"
    (wd / "snapshots" / "ckpt-000001").mkdir(parents=True)
    (wd / "snapshots" / ".staging-x").mkdir()
    (wd / "snapshots" / ".staging-x" / COMMIT_MARKER).write_text("{}")
    (wd / "restored" / "ckpt-000003").mkdir(parents=True)
    return wd


@pytest.fixture
def lock(tmp_path: Path) -> Iterator[WorkDirLock]:
    lk = WorkDirLock(tmp_path / "run")
    yield lk
    lk.release()


def test_lock_file_name() -> None:
    assert LOCK_FILE == ".gymckpt.lock"


def test_every_form_names_the_work_directory(workdir: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(workdir / "snapshots", target_is_directory=True)
    forms: list[Path | str] = [
        workdir,
        str(workdir),
        workdir / "snapshots",
        workdir / "restored",
        workdir / "snapshots" / "ckpt-000001",
        workdir / "restored" / "ckpt-000003",
        workdir / "snapshots" / ".staging-x",  # not ckpt-*, but it holds COMMITTED
        workdir / "snapshots" / ".." / "snapshots",
        link,
        link / "ckpt-000001",
    ]
    for form in forms:
        assert workdir_of(form) == workdir.resolve(), form


def test_a_work_directory_with_only_its_lock_file_is_one(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    assert workdir_of(tmp_path / "wd") is None
    (tmp_path / "wd" / LOCK_FILE).touch()
    assert workdir_of(tmp_path / "wd") == (tmp_path / "wd").resolve()


def test_what_belongs_to_no_work_directory_is_none(workdir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "copies"
    (elsewhere / "ckpt-000001").mkdir(parents=True)
    (elsewhere / "mine").mkdir()
    (elsewhere / "mine" / COMMIT_MARKER).write_text("{}")
    (workdir / "snapshots" / "other").mkdir()
    assert workdir_of(elsewhere) is None  # a snapshot root that is no snapshots/
    assert workdir_of(elsewhere / "ckpt-000001") is None  # a snapshot copied elsewhere
    assert workdir_of(elsewhere / "mine") is None
    assert workdir_of(workdir / "snapshots" / "other") is None  # neither ckpt-* nor committed
    assert workdir_of(tmp_path / "nothing-here") is None


def test_acquire_creates_the_directory_and_writes_our_pid(lock: WorkDirLock) -> None:
    assert not lock.held and not lock.workdir.exists()
    lock.acquire()
    assert lock.held
    assert lock.path == lock.workdir / LOCK_FILE
    assert lock.path.read_text() == f"{os.getpid()}\n"
    assert repr(lock) == f"<WorkDirLock {str(lock.workdir)!r} held=True>"


def test_the_workdir_is_a_path_whatever_it_is_given_as(tmp_path: Path) -> None:
    lk = WorkDirLock(str(tmp_path / "a"))
    assert lk.workdir == tmp_path / "a" and isinstance(lk.workdir, Path)


def test_a_second_lock_in_this_process_is_refused_naming_the_holder(lock: WorkDirLock) -> None:
    lock.acquire()
    other = WorkDirLock(lock.workdir)
    with pytest.raises(WorkDirLocked) as info:
        other.acquire()
    assert not other.held and lock.held
    assert info.value.pid == os.getpid()
    assert info.value.workdir == str(lock.workdir)
    assert f"work directory {lock.workdir} is in use by process {os.getpid()}" in str(info.value)
    assert isinstance(info.value, BadInput)
    assert lock.path.read_text() == f"{os.getpid()}\n"  # the refused one wrote nothing


def test_acquiring_twice_with_one_lock_is_a_programming_error(lock: WorkDirLock) -> None:
    lock.acquire()
    with pytest.raises(RuntimeError, match="already locked by this WorkDirLock"):
        lock.acquire()
    assert lock.held


def test_release_frees_it_and_clears_the_pid(lock: WorkDirLock) -> None:
    lock.release()  # not held: no error
    lock.acquire()
    lock.release()
    assert not lock.held
    assert lock.path.read_text() == ""
    assert repr(lock).endswith("held=False>")
    other = WorkDirLock(lock.workdir)
    other.acquire()
    other.release()
    lock.acquire()  # and the first one can take it again
    assert lock.held


def test_a_holder_whose_pid_is_unknown_is_another_process(lock: WorkDirLock) -> None:
    lock.workdir.mkdir(parents=True)
    for content in (b"", b"not a pid\n"):
        lock.path.write_bytes(content)
        fd = os.open(lock.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(WorkDirLocked) as info:
                lock.acquire()
        finally:
            os.close(fd)
        assert info.value.pid is None
        assert "is in use by another process;" in str(info.value)
        assert not lock.held


HOLDER = """
import sys
from gymckpt.runtime._workdir import WorkDirLock
WorkDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_another_process_holds_it_until_it_dies_even_by_sigkill(lock: WorkDirLock) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".typecheck")}
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock.workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "locked\n"
            with pytest.raises(WorkDirLocked) as info:
                lock.acquire()
            assert info.value.pid == holder.pid
            assert f"in use by process {holder.pid}" in str(info.value)
            holder.send_signal(signal.SIGKILL)
            assert holder.wait(timeout=10) == -signal.SIGKILL
            assert lock.path.read_text() == f"{holder.pid}\n"  # a stale pid, no stale lock
            lock.acquire()
            assert lock.path.read_text() == f"{os.getpid()}\n"
        finally:
            if holder.poll() is None:
                holder.kill()
