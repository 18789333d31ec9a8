"""Acceptance: rows in any order survive a real SIGKILL. A trainer process trains 16 rows given in
a shuffled order, checkpoints with rows trained, in flight and not yet reserved, and is
SIGKILLed; a second process restores and finishes. Every row is trained exactly once, the rows
reach Gym in the order given (first attempts, across both processes), and each episode got its
own row's task; a third run in the same work directory with the rows in another order exits 2
with one line saying what differs. Also: a repeated row is refused at open with exit code 2 and
one line naming both indices, before Gym is asked anything."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.subprocess

ROWS = [15, 0, 7, 3, 12, 1, 9, 5, 14, 2, 11, 6, 13, 4, 10, 8]
TASKS = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(16)]

TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    import orjson

    import gymckpt
    from gymckpt.gym_adapter import EmbeddedGym
    from gymckpt.testing.examples import task_reader

    workdir, log = Path(sys.argv[1]), Path(sys.argv[2])
    rows, tasks = orjson.loads(sys.argv[3]), orjson.loads(sys.argv[4])
    kill_after = int(sys.argv[5])

    def write(record):
        with log.open("ab") as f:
            f.write(orjson.dumps(record) + b"\\n")
            f.flush()
            os.fsync(f.fileno())

    def dispatched(instance, run_rows):
        for r in run_rows:
            write({"sent": r.row, "attempt": r.attempt, "claim": r.restored_from is not None})

    async def main():
        async with EmbeddedGym.host(task_reader(turn_s=0.2), instances=2) as gym:
            async with gymckpt.open_rollouts(
                gym, workdir, rows=rows, dataset=tasks, group_size=2, max_rows_in_flight=4,
                on_dispatch=dispatched,
            ) as ro:
                checkpoints = 0
                async for batch in ro.batches(groups_per_step=2):
                    for g in batch:
                        write({"trained": g.row, "seen": [r.payload["seen"] for r in g.results]})
                    outcome = await ro.checkpoint(b"{}")
                    if outcome.ok and outcome.episodes:
                        checkpoints += 1
                        if checkpoints == kill_after:
                            print("checkpointed", outcome.snapshot.path, flush=True)
                            os.kill(os.getpid(), signal.SIGKILL)
        print("done", flush=True)

    gymckpt.run(main)
    """
)


def _trainer(
    script: Path, workdir: Path, log: Path, rows: list[int], kill_after: int
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        str(script),
        str(workdir),
        str(log),
        orjson.dumps(rows).decode(),
        orjson.dumps(TASKS).decode(),
        str(kill_after),
    ]
    return subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
    )


def test_shuffled_rows_are_trained_once_each_in_order_across_a_sigkill(tmp_path: Path) -> None:
    script, workdir, log = tmp_path / "trainer.py", tmp_path / "w", tmp_path / "log"
    script.write_text(TRAINER)

    first = _trainer(script, workdir, log, ROWS, kill_after=2)
    assert first.returncode == -9, first.stderr  # a real SIGKILL after the checkpoint
    before = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    trained_before = [r["trained"] for r in before if "trained" in r]
    assert 0 < len(trained_before) < len(ROWS)

    second = _trainer(script, workdir, log, ROWS, kill_after=0)
    assert second.returncode == 0, second.stderr
    assert "done" in second.stdout and "resumed from snapshot" in second.stderr

    records = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    trained = [r["trained"] for r in records if "trained" in r]
    assert Counter(trained) == Counter(ROWS), trained  # every row exactly once, none lost
    for r in records:
        if "trained" in r:  # each attempt got its own row's task, every turn
            assert all(seen == [TASKS[r["trained"]]] * 3 for seen in r["seen"])
    first_sent = list(dict.fromkeys(r["sent"] for r in records if "sent" in r))
    assert first_sent == ROWS  # rows reach Gym in the order given, across the restore

    # the same work directory with the rows in another order: exit 2, one line saying so
    third = _trainer(script, workdir, log, ROWS[::-1], kill_after=0)
    assert third.returncode == 2, third.stderr
    [line] = third.stderr.splitlines()
    assert "the row order differs from the snapshot's" in line, line
    assert "the rows given differ" in line and "shuffle_seed=" in line, line


def test_a_repeated_row_is_refused_at_open_with_exit_2_naming_both_indices(
    tmp_path: Path,
) -> None:
    script, workdir, log = tmp_path / "trainer.py", tmp_path / "w", tmp_path / "log"
    script.write_text(TRAINER)
    run = _trainer(script, workdir, log, [1, 2, 1], kill_after=0)
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.splitlines()  # one line, no traceback
    assert line == (
        "gymckpt: error: rows[2] is row 1, which rows[0] names already: each row once (for "
        "several passes over the rows, pass epochs=)"
    ), line
    assert not log.exists()  # nothing was dispatched
