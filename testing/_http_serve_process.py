"""A real ``gymckpt serve`` process for tests: started on a free port, read until its readiness
line (with a deadline), its stderr kept line by line, stopped with SIGTERM (with a deadline;
SIGKILL only if it does not exit in time, and the test then fails on its exit code)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import trio

__all__ = ["READINESS", "ServeProcess", "open_raw_run", "serve_process", "tree_digest"]

READINESS: Final = re.compile(
    r"^gymckpt serve: instance (?P<name>\S+) serving at (?P<url>https?://\S+:(?P<port>\d+)) "
    r"\(incarnation (?P<incarnation>[0-9a-f]{32})\)$"
)
"""The readiness line, exactly as ``gymckpt serve`` prints it."""


@attrs.define(eq=False)
class ServeProcess:
    """A running ``gymckpt serve``: its URL, incarnation, token, and stderr so far."""

    process: trio.Process
    work_dir: Path
    url: str = ""
    incarnation: str = ""
    instance: str = ""
    token_file: Path = Path()
    lines: list[str] = attrs.field(factory=list)
    line_added: trio.Event = attrs.field(factory=trio.Event)
    eof: trio.Event = attrs.field(factory=trio.Event)

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def wait_for_line(self, pattern: str | re.Pattern[str], within_s: float = 10.0) -> str:
        """The first stderr line matching ``pattern`` (waits for it, up to ``within_s``)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        with trio.fail_after(within_s):
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                if self.eof.is_set():
                    raise AssertionError(
                        f"gymckpt serve ended without a line matching {rx.pattern!r}:\n"
                        + "\n".join(self.lines)
                    )
                self.line_added = trio.Event()
                await self.line_added.wait()

    async def stop(self, within_s: float = 15.0) -> int:
        """SIGTERM, then its exit code (SIGKILL past ``within_s``: then -9)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(within_s):
            return await self.process.wait()
        self.process.kill()
        return await self.process.wait()


async def open_raw_run(url: str, token: str, body: bytes) -> trio.SocketStream:
    """A ``POST /run`` written by hand on a plain socket, read until the admission header line
    arrived (for tests that leave a stream half read: httpx's iterators must be exhausted)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    head = (
        f"POST /run HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    got = b""
    with trio.fail_after(10):
        while b'{"seq":0,"replies":[]}' not in got:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise AssertionError(f"the server closed the stream before its header: {got!r}")
            got += chunk
    if not got.startswith(b"HTTP/1.1 200"):
        raise AssertionError(f"/run answered {got[:200]!r}")
    return stream


async def _read_stderr(proc: ServeProcess, stream: Any) -> None:
    buf = b""
    async for chunk in stream:
        buf += chunk
        *done, buf = buf.split(b"\n")
        for raw in done:
            proc.lines.append(raw.decode(errors="replace"))
        if done:
            proc.line_added.set()
    if buf:
        proc.lines.append(buf.decode(errors="replace"))
    proc.eof.set()
    proc.line_added.set()


@asynccontextmanager
async def serve_process(
    work_dir: Path,
    environment: str = "gymckpt.gym_adapter.environments.calendar:calendar_environment",
    *args: str,
    instance: str = "gym-0",
    ready_timeout: float = 30.0,
    expect_ready: bool = True,
) -> AsyncIterator[ServeProcess]:
    """``gymckpt serve ENVIRONMENT --port 0 --work-dir WORK_DIR --instance NAME ARGS...``,
    yielded once it printed its readiness line; stopped with SIGTERM on leaving."""
    cmd: Sequence[str] = [
        sys.executable,
        "-m",
        "gymckpt",
        "serve",
        environment,
        "--port",
        "0",
        "--work-dir",
        str(work_dir),
        "--instance",
        instance,
        *args,
    ]
    process = await trio.lowlevel.open_process(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=dict(os.environ),
    )  # fmt: skip
    proc = ServeProcess(process, work_dir)
    async with trio.open_nursery() as nursery:
        assert process.stderr is not None
        nursery.start_soon(_read_stderr, proc, process.stderr)
        try:
            if expect_ready:
                line = await proc.wait_for_line(READINESS, ready_timeout)
                m = READINESS.match(line)
                assert m is not None
                proc.url, proc.incarnation, proc.instance = (
                    m.group("url"),
                    m.group("incarnation"),
                    m.group("name"),
                )
                proc.token_file = (
                    Path(args[list(args).index("--token-file") + 1])
                    if "--token-file" in args
                    else work_dir / "token"
                )
            yield proc
        finally:
            with trio.CancelScope(shield=True):
                await proc.stop()
                with trio.move_on_after(5):
                    await proc.eof.wait()
            nursery.cancel_scope.cancel()


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path: the sha256 of its bytes (symlinks by their
    target)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
