"""An instance that dies inside a retire (its journal tore the free's record) answers nothing.

Found by ``gymckpt simulate --hostile`` (seed 1647, ``torn_record``): a dropped stream's
abandoned attempts were retired at once on their instance; the first free's record was torn
and the instance died right there, inside the call, yet the call went on and returned a reply:
the kill had ended the other episodes, so they read as unknown (freed, to the runtime), and the
runtime forgot them. The replacement replayed the journal, which still held all of them (the
free never completed), and nothing retired them there: their mutations were committed beside
their fresh re-runs' (sentinels more than once). A dead instance's reply must not be taken as
an answer: the retire raises ``GymInstanceDead``, the attempts stay queued, and the replacement
frees them before the next checkpoint commits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import GymHost, GymInstanceDead, RunRow
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_host, calendar_state
from gymckpt.gym_adapter.host._journal import JOURNAL_FILE

SIM = CalendarConfig(turns=(4, 4), turn_s=(1.0, 1.0), mutation_p=1.0)


@contextmanager
def _first_free_torn(host: list[GymHost], torn: list[bytes]) -> Iterator[None]:
    """The first free record (``["d", ...]``) written to a session journal is written without
    its last byte and its instance dies right there, as ``torn_record`` does in the hostile
    simulation; every other write goes through. ``torn`` gets the record."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if not torn and bytes(data[:5]) == b'["d",':
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if os.path.basename(path) == JOURNAL_FILE:
                torn.append(bytes(data))
                real_write(fd, bytes(data)[:-1])
                host[0].kill()  # the process dies inside its append
                return len(data)
        return real_write(fd, data)

    os.write = write
    try:
        yield
    finally:
        os.write = real_write


@pytest.mark.parametrize("running", [True, False], ids=["running", "completed"])
async def test_an_instance_that_dies_inside_a_retire_reports_dead_and_its_replacement_frees(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, running: bool
) -> None:
    """Two attempts that mutated their calendars (still running, or completed and kept) are
    retired in one call; the first free is torn and kills the instance. The retire raises
    ``GymInstanceDead`` (before the fix it answered: the running ones unknown, or both retired,
    freed only in the dead process's memory); the replacement replays both slots, and a
    retire there frees them."""
    rows = [RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)]
    torn: list[bytes] = []
    async with calendar_host("gym-0", work_dir=tmp_path, config=SIM) as host:
        stream = await host.run(rows)
        await trio.sleep(1.5 if running else 10.0)  # a turn mutated; or every episode ended
        held = {k: s.sentinels for k, s in calendar_state(host).items()}
        assert set(held) == {"0-0", "1-0"} and all(held.values())
        with _first_free_torn([host], torn), pytest.raises(GymInstanceDead):
            await host.retire(["0-0", "1-0"], trio.current_time() + 1)
        assert host.dead and torn
        await stream.aclose()
    async with calendar_host("gym-0", work_dir=tmp_path, config=SIM, recover=True) as again:
        assert {k: s.sentinels for k, s in calendar_state(again).items()} == held
        reply = await again.retire(["0-0", "1-0"], trio.current_time() + 1)
        assert sorted(reply.retired) == ["0-0", "1-0"]
        assert calendar_state(again) == {}


@pytest.mark.subprocess
def test_the_hostile_seed_that_found_it_holds() -> None:
    """Seed 1647 of the hostile simulation, replayed as the CLI replays it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "simulate",
            "--seeds",
            "1",
            "--start",
            "1647",
            "--hostile",
            "--real-usage",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed, 0 failed" in done.stdout
