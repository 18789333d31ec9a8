"""One start of the program under test: its own process group, its output in files, waits
with deadlines, a SIGKILL of the group or of one descendant, and nothing left behind.

Every start gets a new session (``start_new_session``), so the program and whatever it spawns
(``gymckpt serve`` instances, a model server) share one process group that ``kill_group``
SIGKILLs at once. Descendants that left the group are tracked from ``/proc`` while the program
runs and SIGKILLed too when the start ends, so a chaos run leaves no orphan process.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

__all__ = ["GONE_TIMEOUT_S", "Start", "descendants"]

GONE_TIMEOUT_S: Final = 10.0
"""How long ``Start.close`` waits, in all, for the descendants it SIGKILLed to end."""


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process ``/proc`` shows (Linux)."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        out[int(entry.name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...), in pid order."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


@attrs.define(eq=False, slots=True)
class Start:
    """One start of ``argv`` in ``cwd``-independent isolation: stdout and stderr appended to
    ``log_dir/stdout`` and ``log_dir/stderr``. The owner must call ``close`` (a ``with``
    block does), which SIGKILLs whatever of it still runs."""

    proc: subprocess.Popen[bytes]
    started: float
    seen: dict[int, str] = attrs.field(factory=dict)
    """Every descendant seen while it ran, with its start time (killed at ``close`` if that
    same process is still alive: a pid reused since is left alone)."""

    @classmethod
    def spawn(cls, argv: Sequence[str], log_dir: Path, env: Mapping[str, str]) -> Start:
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "stdout", "ab") as out, open(log_dir / "stderr", "ab") as err:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
                start_new_session=True,
            )
        return cls(proc, time.monotonic())

    def __enter__(self) -> Start:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code, or None if it still runs after ``timeout_s`` (the descendants it
        spawned meanwhile are noted for ``close``)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            self._note()
            step = min(0.05, deadline - time.monotonic())
            try:
                return self.proc.wait(timeout=max(0.0, step))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    return None

    def wait_for_line(self, path: Path, line: str, timeout_s: float) -> float | None:
        """Seconds from the start until ``line`` appeared in the file ``path`` (the program's
        output), or None if the program ended or ``timeout_s`` passed first (looked at every
        ``wait`` slice, 50 ms)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if line in path.read_text(errors="replace").splitlines():
                    return time.monotonic() - self.started
            if self.wait(min(0.05, deadline - time.monotonic())) is not None:
                return None
        return None

    def victims(self) -> list[int]:
        """The processes a kill may pick: the program itself, then its live descendants."""
        return [self.proc.pid, *descendants(self.proc.pid)]

    def kill(self, rng: random.Random) -> str:
        """SIGKILL one process picked at random among ``victims``: the program itself kills
        its whole process group (a crashed trainer's machine); a descendant (a Gym server, a
        model server) dies alone and the program lives on. Returns what was killed."""
        pool = self.victims()
        victim = rng.choice(pool)
        if victim == self.proc.pid:
            self.kill_group()
            return "program"
        name = _name(victim)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        return f"descendant {name}"

    def kill_group(self) -> None:
        """SIGKILL the program's process group (and so every child that stayed in it)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """SIGKILL the group and every descendant seen, reap the program, and return once every
        descendant it killed has ended (at most ``GONE_TIMEOUT_S``): a SIGKILL is delivered at
        once, but a process ends only when the kernel next runs it, later on a loaded
        machine."""
        if self.proc.poll() is None:
            self._note()
        self.kill_group()
        killed: dict[int, str] = {}
        for pid, started in self.seen.items():
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed[pid] = started
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        _wait_ended(killed, time.monotonic() + GONE_TIMEOUT_S)

    def _note(self) -> None:
        with contextlib.suppress(OSError):
            for pid in descendants(self.proc.pid):
                started = _start_time(pid)
                if started is not None:
                    self.seen.setdefault(pid, started)


def _wait_ended(pids: Mapping[int, str], deadline: float) -> None:
    """Until each process of ``pids`` (pid -> its start time) has ended or ``deadline``
    (``time.monotonic``) passes. A zombie has ended (it runs nothing; its parent or init reaps
    it). Each end is awaited as an event where the kernel has pidfds (one turns readable when
    its process ends), else ``/proc`` is read every 10 ms; a pid whose start time differs is
    another process and is not waited for."""
    for pid, started in pids.items():
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except (AttributeError, OSError):  # no pidfds here
            while _running(pid, started) and time.monotonic() < deadline:
                time.sleep(0.01)
            continue
        try:
            if _start_time(pid) == started:
                select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)


def _running(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] != "Z" and fields[19] == started


def _start_time(pid: int) -> str | None:
    """The start time ``/proc`` gives ``pid`` (field 22 of its stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def _name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [w.decode(errors="replace") for w in cmd if w][:3]
    return f"{pid} ({' '.join(words)})" if words else str(pid)
