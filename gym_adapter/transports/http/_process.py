"""One spawned ``gymckpt serve`` process, as ``HttpGym.spawn`` supervises it.

``ServerProcess.start`` starts the command, reads the server's stderr line by line until the one
readiness line (``gymckpt serve: instance NAME serving at URL (incarnation HEX)``) or a
deadline, and returns what it says (``Ready``). Every line the server writes goes to its log
file (``log_path``), before and after readiness: ``drain`` keeps reading, so a chatty server
never blocks on a full pipe. ``wait`` returns once the process has exited (a pidfd, no
polling); ``kill`` SIGKILLs it, ``stop`` asks with SIGTERM first and kills after a bound.

**No orphans.** The child is started from the calling thread (the trio run's, never a worker
thread) with ``PR_SET_PDEATHSIG = SIGKILL`` (Linux): when that thread's process dies, however
(a SIGKILLed trainer included), the kernel kills the server. (``trio.lowlevel.open_process``
forks from a worker thread, and the parent-death signal fires when the *forking thread* exits,
i.e. whenever trio's thread cache retires it: unusable here.) A child whose parent died before
it set the signal kills itself at once. The same ``preexec_fn`` lowers the child's priority
(``instance_niceness``, ``transports/_niceness``) before it starts any thread.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, final

import attrs
import trio

from .._niceness import lower_this_process

__all__ = ["READY_LINE", "Ready", "ServerExited", "ServerProcess"]

READY_LINE: Final = re.compile(
    r"^gymckpt serve: instance (?P<name>\S+) serving at (?P<url>https?://\S+) "
    r"\(incarnation (?P<incarnation>[0-9a-f]{32})\)$"
)
"""The one line a server logs on stderr once it serves."""
STOP_TIMEOUT_S: Final = 5.0
"""How long ``stop`` waits after SIGTERM before it SIGKILLs."""
_PR_SET_PDEATHSIG: Final = 1
_TAIL_BYTES: Final = 2000


class ServerExited(RuntimeError):
    """A spawned server exited before it said it serves (its log's tail in the message)."""


@attrs.frozen
class Ready:
    """What a server's readiness line says."""

    name: str
    url: str
    incarnation: str


def _preexec(instance_niceness: int) -> Callable[[], None] | None:
    """The ``preexec_fn`` that ties the child's life to this thread's process (Linux) and runs
    it ``instance_niceness`` steps below this one (``transports/_niceness``), before it starts
    any thread."""
    if not sys.platform.startswith("linux"):
        return (lambda: lower_this_process(instance_niceness)) if instance_niceness else None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: go now
            os.kill(os.getpid(), signal.SIGKILL)
        lower_this_process(instance_niceness)

    return preexec


@final
class ServerProcess:
    """A started server process (see the module docstring). Not reusable once exited."""

    def __init__(self, popen: subprocess.Popen[bytes], stderr: int, log_path: Path) -> None:
        self._popen = popen
        self._stderr = trio.lowlevel.FdStream(stderr)
        self._log_path = log_path
        self._buffer = b""
        self._exited = trio.Event()
        self._waiting = False
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): poll in ``wait``
            self._pidfd = None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    @property
    def log_path(self) -> Path:
        return self._log_path

    @classmethod
    async def start(
        cls,
        command: Sequence[str],
        log_path: Path,
        deadline_ts: float,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        instance_niceness: int = 0,
    ) -> tuple[ServerProcess, Ready]:
        """Start ``command`` (in ``cwd``, ``environ`` added to this process's environment,
        ``instance_niceness`` steps below this process) and
        wait, until ``deadline_ts`` (``trio.current_time()``), for its readiness line. Raises
        ``ServerExited`` if it exits first, ``TimeoutError`` if the deadline passes (the process
        is killed then); either way nothing is left running."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        try:
            popen = subprocess.Popen(  # noqa: ASYNC220 - from this thread, for the death signal
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=write_end,
                env={**os.environ, **environ} if environ else None,
                cwd=cwd,
                preexec_fn=_preexec(instance_niceness),  # a prctl and a nice, no lock taken
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        proc = cls(popen, read_end, log_path)
        ready: Ready | None = None
        try:
            with trio.move_on_at(deadline_ts):
                ready = await proc._readiness()
            if ready is None:
                raise TimeoutError(
                    f"gymckpt serve (pid {popen.pid}) did not say it serves by the deadline; "
                    f"its log {log_path} ends: {proc.tail()!r}"
                )
        except BaseException:
            with trio.CancelScope(shield=True):
                await proc.kill()
                await proc.aclose()
            raise
        return proc, ready

    async def _readiness(self) -> Ready:
        while True:
            line = await self._line()
            if line is None:
                await self.wait()
                raise ServerExited(
                    f"gymckpt serve exited with code {self.returncode} before it served; "
                    f"its log {self._log_path} ends: {self.tail()!r}"
                )
            match = READY_LINE.match(line.decode(errors="replace").strip())
            if match is not None:
                return Ready(match["name"], match["url"].rstrip("/"), match["incarnation"])

    async def _line(self) -> bytes | None:
        """The next line of stderr (also written to the log), or None at its end."""
        while b"\n" not in self._buffer:
            chunk = await self._stderr.receive_some(65536)
            if not chunk:
                rest, self._buffer = self._buffer, b""
                self._log(rest)
                return rest or None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        self._log(line + b"\n")
        return line

    def _log(self, data: bytes) -> None:
        if data:
            with self._log_path.open("ab") as f:
                f.write(data)

    def tail(self) -> str:
        """The last lines of the server's log."""
        try:
            data = self._log_path.read_bytes()[-_TAIL_BYTES:]
        except OSError:
            return ""
        return data.decode(errors="replace").strip()

    async def drain(self) -> None:
        """Copy the server's stderr to its log until it closes (the process exited)."""
        if self._buffer:
            self._log(self._buffer)
            self._buffer = b""
        while True:
            try:
                chunk = await self._stderr.receive_some(65536)
            except trio.ClosedResourceError:
                return
            if not chunk:
                return
            self._log(chunk)

    async def wait(self) -> int:
        """Wait until the process has exited; its return code (any number of tasks may)."""
        if self._waiting:
            await self._exited.wait()
            return self._popen.wait()
        self._waiting = True
        try:
            return await self._wait()
        finally:
            self._waiting = False

    async def _wait(self) -> int:
        if self._pidfd is not None:
            if self._popen.poll() is None:
                await trio.lowlevel.wait_readable(self._pidfd)
        else:  # pragma: no cover - Linux always has pidfds here
            await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
        code = self._popen.wait()
        self._exited.set()
        return code

    def exited(self) -> bool:
        """Has the process exited (reaped or not)?"""
        return self._popen.poll() is not None

    async def kill(self) -> int:
        """SIGKILL the process (if still running) and wait for it."""
        if self._popen.poll() is None:
            self._popen.kill()
        return await self.wait()

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; waits for the exit (shield it to run it
        while cancelled)."""
        if self._popen.poll() is None:
            self._popen.terminate()
            with trio.move_on_after(timeout_s):
                return await self.wait()
        return await self.kill()

    async def aclose(self) -> None:
        """Release the process's descriptors (after it exited)."""
        await self._stderr.aclose()
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            os.close(fd)

    def __repr__(self) -> str:
        state = "running" if self._popen.poll() is None else f"exited {self._popen.returncode}"
        return f"<ServerProcess pid={self._popen.pid} {state}>"
