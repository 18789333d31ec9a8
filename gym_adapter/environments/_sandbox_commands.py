"""One command in a sandbox: a subprocess with the tree as its working directory, a deadline,
bounded output and resource limits.

A command's environment is ``PATH``, ``HOME`` (the tree), ``LANG``, ``PWD`` and
``PYTHONDONTWRITEBYTECODE`` (a compiled ``.pyc`` records its source's mtime, so a tree would
depend on when it was restored). Every command is its own process group
(``start_new_session``); when it ends, or its deadline passes (a trio cancel scope), the whole
group is killed with ``SIGKILL``, so nothing it started in the background keeps changing the
tree into the next step boundary. Output beyond
``CommandLimits.max_output_bytes`` per stream is read and dropped, and the result says so
(``stdout_truncated``). ``resource.setrlimit`` in the child before ``exec`` bounds CPU seconds,
the size of any file it writes, its address space and (optionally) the processes of its user.

``isolation="bwrap"`` (or ``"auto"`` where ``bwrap`` is on ``PATH``) runs the command under
bubblewrap: the whole file system read-only except the tree (bound read-write) and a private
``/tmp``; new user, PID, network, IPC and UTS namespaces (no network at all); the command's
PID namespace dies with it (``--die-with-parent``), so even a process that left the process
group ends. What it does **not** protect: the kernel (one shared kernel; a kernel exploit
escapes), reading whatever the host's file system lets the user read, CPU and memory beyond
the rlimits (no cgroup), and ``isolation="none"``: then a command runs as the host's user with
the host's view of the file system and network, confined only by the rlimits and the working
directory, which is no confinement against a hostile command.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import attrs
import trio

__all__ = ["ISOLATIONS", "CommandLimits", "CommandResult", "bwrap_argv", "run_command"]

ISOLATIONS: Final = ("none", "bwrap", "auto")
_DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"


@attrs.frozen(kw_only=True)
class CommandLimits:
    """Limits of every command of a sandbox. ``timeout_s``: wall-clock deadline; ``cpu_s``:
    ``RLIMIT_CPU``; ``file_bytes``: ``RLIMIT_FSIZE`` (a larger write fails with ``EFBIG``);
    ``memory_bytes``: ``RLIMIT_AS``; ``processes``: ``RLIMIT_NPROC``, which counts *every*
    process of the user, not the command's (None: not set; set it when sandboxes run under a
    user of their own); ``max_output_bytes``: kept of stdout and of stderr each."""

    timeout_s: float = 60.0
    cpu_s: int = 60
    file_bytes: int = 64 << 20
    memory_bytes: int | None = 2 << 30
    processes: int | None = None
    max_output_bytes: int = 64 << 10

    def __attrs_post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"CommandLimits.timeout_s must be > 0, got {self.timeout_s!r}")
        for field in ("cpu_s", "file_bytes", "memory_bytes", "processes", "max_output_bytes"):
            value = getattr(self, field)
            if value is None and field in ("memory_bytes", "processes"):
                continue
            if type(value) is not int or value < 1:
                raise ValueError(f"CommandLimits.{field} must be an int >= 1, got {value!r}")


@attrs.frozen
class CommandResult:
    """How a command ended: its ``returncode`` (negative: the signal that killed it; None: its
    deadline passed and its process group was killed, ``timed_out``), the first
    ``max_output_bytes`` of each stream and whether more was dropped."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False

    def as_plain(self) -> dict[str, object]:
        """As a JSON value (output decoded as UTF-8, undecodable bytes replaced)."""
        return {
            "returncode": self.returncode,
            "stdout": self.stdout.decode(errors="replace"),
            "stderr": self.stderr.decode(errors="replace"),
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "timed_out": self.timed_out,
        }


def bwrap_argv(tree: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` under bubblewrap, the tree its only writable place (see the module docstring)."""
    root = str(tree)
    return [
        "bwrap",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--bind", root, root,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--chdir", root,
        "--",
        *argv,
    ]  # fmt: skip


def _limiter(limits: CommandLimits) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        if limits.memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        if limits.processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return apply


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _read(stream: trio.abc.ReceiveStream, limit: int, out: list[bytes]) -> bool:
    """Read ``stream`` to its end, keeping ``limit`` bytes in ``out``; whether more came."""
    kept = 0
    dropped = False
    while chunk := await stream.receive_some(65536):
        room = limit - kept
        if len(chunk) > room:
            dropped = True
            chunk = chunk[:room]
        if chunk:
            out.append(bytes(chunk))
            kept += len(chunk)
    return dropped


async def run_command(
    argv: Sequence[str], tree: Path, limits: CommandLimits, isolation: str = "none"
) -> CommandResult:
    """Run ``argv`` in ``tree`` (see the module docstring); never raises for how the command
    ends, only for a command that cannot start (``OSError``: no such program, say)."""
    if isolation == "auto":
        isolation = "bwrap" if shutil.which("bwrap") else "none"
    full = bwrap_argv(tree, argv) if isolation == "bwrap" else list(argv)
    env = {
        "PATH": _DEFAULT_PATH,
        "HOME": str(tree),
        "LANG": "C.UTF-8",
        "PWD": str(tree),
        "PYTHONDONTWRITEBYTECODE": "1",  # a .pyc holds its source's mtime: trees would differ
    }
    proc = await trio.lowlevel.open_process(
        full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tree,
        env=env,
        start_new_session=True,
        preexec_fn=_limiter(limits),
    )
    out: list[bytes] = []
    err: list[bytes] = []
    truncated = {"stdout": False, "stderr": False}
    assert proc.stdout is not None and proc.stderr is not None

    async def read(name: str, stream: trio.abc.ReceiveStream, into: list[bytes]) -> None:
        truncated[name] = await _read(stream, limits.max_output_bytes, into)

    async def reap() -> None:
        await proc.wait()
        _kill_group(proc.pid)  # what it left in its group: the pipes close, the readers end

    try:
        with trio.move_on_after(limits.timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, "stdout", proc.stdout, out)
                nursery.start_soon(read, "stderr", proc.stderr, err)
                nursery.start_soon(reap)
    finally:
        _kill_group(proc.pid)
        with trio.CancelScope(shield=True):
            await proc.wait()
            await proc.stdout.aclose()
            await proc.stderr.aclose()
    timed_out = deadline.cancelled_caught
    return CommandResult(
        None if timed_out else proc.returncode,
        b"".join(out),
        b"".join(err),
        truncated["stdout"],
        truncated["stderr"],
        timed_out,
    )
