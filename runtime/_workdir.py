"""One trainer per work directory: an OS-level lock on ``<workdir>/.gymckpt.lock``.

(The same lock keeps one ``gymckpt serve`` per Gym instance directory, ``<work_dir>/<instance>``:
a second server would cut the first one's journal of retained sessions.)

Two trainers on one work directory (a second launch by mistake, a scheduler retry while the first
still runs) would race on the snapshot namespace: one of them dies at its next checkpoint with a
confusing rename error, after both have dispatched work to Gym. The lock makes the second one
fail at start instead, naming the holder.

Why ``fcntl.flock`` and not a pid file: the kernel drops an ``flock`` when the holding process
dies in any way, SIGKILL included, so a crashed trainer never leaves a stale lock behind that a
human must remove — exactly the case a restore exists for. The pid written into the file is only
for the message; the lock itself is the open file description.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import final

import attrs

from ._errors import WorkDirLocked
from ._snapshot_format import COMMIT_MARKER, LOCK_FILE, RESTORED_DIR, SNAPSHOTS_DIR

__all__ = ["LOCK_FILE", "WorkDirLock", "workdir_of"]


def workdir_of(path: Path | str) -> Path | None:
    """The trainer work directory that ``path`` is, or is inside of, or None.

    Every form a snapshot tool is documented to take names the same work directory, whose lock
    a running trainer holds: the work directory itself (it holds ``snapshots/`` or the lock
    file), its ``snapshots/`` or ``restored/`` directory, or one snapshot in either of those.
    None for a directory that belongs to no work directory (a snapshot root or a snapshot
    copied elsewhere). Symbolic links and ``..`` are resolved first. Blocking (filesystem
    calls).
    """
    path = Path(path).resolve()
    if (path / SNAPSHOTS_DIR).is_dir() or (path / LOCK_FILE).exists():
        return path
    if path.name in (SNAPSHOTS_DIR, RESTORED_DIR):
        return path.parent
    snapshot = path.name.startswith("ckpt-") or os.path.lexists(path / COMMIT_MARKER)
    if snapshot and path.parent.name in (SNAPSHOTS_DIR, RESTORED_DIR):
        return path.parent.parent
    return None


@final
@attrs.define(eq=False, slots=True)
class WorkDirLock:
    """An exclusive, non-blocking lock on a work directory held by this process.

    Invariants: while ``held``, no other process (or other ``WorkDirLock`` in this process) can
    acquire the same directory; the lock is released by ``release`` or by the death of the
    process, whichever comes first. Blocking I/O: call it off the event loop.

    ``refusal``: the error ``acquire`` raises when another holds it (``WorkDirLocked`` for a
    trainer's work directory, ``InstanceDirLocked`` for a Gym server's instance directory).
    """

    workdir: Path = attrs.field(converter=Path)
    refusal: type[WorkDirLocked] = attrs.field(default=WorkDirLocked, kw_only=True)
    _fd: int | None = attrs.field(default=None, init=False)

    @property
    def path(self) -> Path:
        return self.workdir / LOCK_FILE

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise ``refusal`` naming the holder's pid. Never waits."""
        if self._fd is not None:
            raise RuntimeError(f"{self.workdir} is already locked by this WorkDirLock")
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self.refusal(str(self.workdir), holder) from None
            raise
        with contextlib.suppress(OSError):  # a full disk must not stop the holder
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (no error if not held)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the only descriptor releases the flock

    def __repr__(self) -> str:
        return f"<WorkDirLock {str(self.workdir)!r} held={self.held}>"


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0).decode().strip()
        return int(raw) if raw else None
    except (OSError, ValueError):
        return None
