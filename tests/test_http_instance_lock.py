"""One ``gymckpt serve`` per instance directory (``<work_dir>/<instance>``), with real processes.

A second server of the same instance on the same work directory is refused before it opens
anything: exit 2, one line naming the directory and the holder's pid, and every byte of the
work directory (the journal of retained sessions above all) as it was. When the live server
then dies by SIGKILL, its ``--recover`` replacement comes back with every retained session.
Another instance on the same work directory is its own directory and serves beside it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from http_wire_client import control, rows, run_to_end

from gymckpt.gym_adapter.host._journal import JOURNAL_FILE
from gymckpt.testing._http_serve_process import serve_process, tree_digest

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180)]

CAL = "gymckpt.gym_adapter.environments.calendar:calendar_environment"
SESSIONS = 12


def _serve_cmd(work_dir: Path, port: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "gymckpt", "serve", CAL,
        "--work-dir", str(work_dir), "--instance", "gym-0", "--port", port, *args,
    ]  # fmt: skip


async def test_a_second_server_of_one_instance_exits_2_and_changes_nothing(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    journal = work / "gym-0" / JOURNAL_FILE
    async with serve_process(work, CAL) as first:
        async with httpx.AsyncClient(base_url=first.url, headers=first.auth(), timeout=20) as c:
            _, ended, replies = await run_to_end(c, 1, rows(SESSIONS))
            assert ended and len(replies) == SESSIONS
            retained = await control(c, "retained_sessions")
            assert sum(len(v) for v in retained.values()) == SESSIONS
        before, journal_bytes = tree_digest(work), journal.read_bytes()
        assert journal_bytes
        port = first.url.rsplit(":", 1)[1]
        # the same port (as a scheduler restarting "the" server would) and a free one
        for where in (port, "0"):
            second = await trio.run_process(
                _serve_cmd(work, where),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            lines = second.stderr.decode().splitlines()
            assert second.returncode == 2, lines
            assert journal.read_bytes() == journal_bytes
            assert tree_digest(work) == before
            assert len(lines) == 1, lines
            pattern = (
                rf"^gymckpt: error: serve: instance directory {re.escape(str(work / 'gym-0'))} "
                rf"is in use by process {first.process.pid}; one Gym instance \(gymckpt serve, "
                r"or a host with this work_dir\) per instance directory"
            )
            assert re.match(pattern, lines[0]), lines[0]
        # another instance on the same work directory is another directory: it serves
        async with serve_process(work, CAL, instance="gym-1") as other:
            assert other.instance == "gym-1"
        # the live server dies; its replacement continues every retained session
        first.process.send_signal(signal.SIGKILL)
        await first.process.wait()
    async with serve_process(work, CAL, "--recover") as again:
        async with httpx.AsyncClient(base_url=again.url, headers=again.auth(), timeout=20) as c:
            assert await control(c, "retained_sessions") == retained
