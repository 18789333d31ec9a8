"""A journal that cannot record a claim of a restored episode stops its instance; the
replacement replays the journal, which still holds the episode under the ID the restore
exported, as a kept session. The runtime re-runs the slot fresh elsewhere, so the replacement
must free that session before the next commit, or the episode's mutations are kept twice.

Found by ``gymckpt simulate --hostile`` (seeds 1141: ``full_disk``, 1185: ``torn_record``):
the stream of the dead instance abandoned the claim (``ledger.abandon``) before the replacer
released the instance, and the abandon queued the claim's own ID for retirement but not the
exported one; the slot then forgot its restored state, so the release could not add it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.app.verdict import judge
from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.gym_adapter._shared import JOURNAL_FILE
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import EpisodeRecord, RecoveryLedger, RetireItem, RuntimeConfig
from gymckpt.runtime._ledger import dump_ledger_snapshot, load_ledger_snapshot

SIM = CalendarConfig(turns=(3, 4), turn_s=(0.5, 1.0), mutation_p=1.0, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)
ROWS = 8


def _m(ledger: RecoveryLedger, fn: Any) -> Any:
    return ledger.barrier.mutate_nowait(fn)


def _restored_claim_dispatched() -> RecoveryLedger:
    """A restored ledger whose claim ``7-0-a1`` of exported ``7-0`` is in flight on gym-1."""
    ledger = RecoveryLedger(group_size=2)
    _m(ledger, lambda: ledger.reserve_row(7))
    _m(ledger, lambda: ledger.mark_dispatched(["7-0", "7-1"], "gym-1", 2))
    snap = load_ledger_snapshot(dump_ledger_snapshot(ledger.to_snapshot()))
    restored, _ = RecoveryLedger.from_snapshot(
        snap, [EpisodeRecord("7-0", "calendar", "gym-1", ("7-0/t1",))]
    )
    _m(restored, lambda: restored.mark_dispatched(["7-0-a1"], "gym-1", 1))
    return restored


@pytest.mark.parametrize("stream_first", [True, False], ids=["stream-first", "release-first"])
def test_a_dead_claim_is_retired_under_its_exported_id_whoever_settles_it_first(
    stream_first: bool,
) -> None:
    """The dead instance's stream (``abandon``) or the replacer (``release_instance``) may
    settle the claim first; either way the replacement is asked to retire both IDs, with a
    plain retire (it holds no unclaimed episodes: a replayed session is a kept one)."""
    ledger = _restored_claim_dispatched()
    if stream_first:
        fresh = _m(ledger, lambda: ledger.abandon(["7-0-a1"], spend=False))
        assert [a.rollout_id for a in fresh] == ["7-0-a2"]
    _m(ledger, lambda: ledger.release_instance("gym-1"))
    queued = sorted(ledger.retire_queue()["gym-1"], key=lambda i: i.rollout_id)
    assert queued == [RetireItem("7-0", "gym-1"), RetireItem("7-0-a1", "gym-1")]
    assert ledger.get("7-0-a2") is not None and ledger.get("7-0-a2").restored is None  # type: ignore[union-attr]


def test_a_claim_abandoned_on_a_live_instance_keeps_a_queued_retire_restored() -> None:
    """A claim whose submission timed out queues its exported ID for ``retire_restored``
    (the episode may still wait unclaimed); abandoning it keeps that."""
    ledger = _restored_claim_dispatched()
    _m(ledger, lambda: ledger.record_orphans(["7-0"], "gym-1", restored=True))
    _m(ledger, lambda: ledger.abandon(["7-0-a1"]))
    queued = sorted(ledger.retire_queue()["gym-1"], key=lambda i: i.rollout_id)
    assert queued == [RetireItem("7-0", "gym-1", restored=True), RetireItem("7-0-a1", "gym-1")]


@contextmanager
def _claims_cannot_be_journaled(failed: list[str]) -> Iterator[None]:
    """``os.write`` of the first claim record (``["o", ...]``) to a session journal raises
    ENOSPC (a full disk); every other write goes through. ``failed`` gets the record."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if not failed and bytes(data[:5]) == b'["o",':
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if os.path.basename(path) == JOURNAL_FILE:
                failed.append(bytes(data).decode())
                raise OSError(errno.ENOSPC, "No space left on device (test)")
        return real_write(fd, data)

    os.write = write
    try:
        yield
    finally:
        os.write = real_write


async def test_a_claim_the_journal_cannot_record_is_not_kept_beside_its_rerun(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A checkpoint with episodes in flight on two instances, a crash, a restore into a fresh
    Gym (real journals on disk); the first claim cannot be journaled, so its instance stops
    and is replaced from the journal, which holds the restored episodes under their exported
    IDs, while the runtime re-runs them fresh (on the other instance, the replacement being
    down). Every row is trained once and every sentinel is in the final snapshot once."""
    work = tmp_path / "work"
    with trio.CancelScope() as crash:
        async with (
            EmbeddedGym.host(
                calendar_environment(config=SIM),
                instances=2,
                seed=3,
                work_dir=tmp_path / "gym-a",
                config=SIM.host_config(),
            ) as gym,
            open_rollouts(
                gym,
                work,
                rows=ROWS,
                group_size=2,
                config=CONFIG,
                max_rows_in_flight=4,
                handle_signals=False,
            ) as ro,
        ):
            # every episode in flight has mutated its calendar (a turn is at most 1s) and
            # none has ended (3 turns of at least 0.5s)
            await trio.sleep(1.2)
            outcome = await ro.checkpoint()
            assert outcome.ok, outcome.error
            crash.cancel()  # the trainer dies right after the checkpoint
            await trio.sleep_forever()
    assert crash.cancelled_caught
    lineage: list[tuple[int, tuple[int, ...]]] = []

    failed: list[str] = []
    with _claims_cannot_be_journaled(failed):
        async with (
            EmbeddedGym.host(
                calendar_environment(config=SIM),
                instances=2,
                seed=3,
                work_dir=tmp_path / "gym-b",
                config=SIM.host_config(),
            ) as gym,
            open_rollouts(
                gym,
                work,
                rows=ROWS,
                group_size=2,
                config=CONFIG,
                max_rows_in_flight=4,
                handle_signals=False,
            ) as ro,
        ):
            assert ro.restored is not None and ro.ledger.statistics().unclaimed == 8  # on both
            async with aclosing(ro.batches(1)) as batches:
                async for batch in batches:
                    lineage.append((len(lineage) + 1, tuple(g.row for g in batch)))
            final = await ro.checkpoint()
            assert final.ok and final.snapshot is not None, final.error
            # the journal failure stopped one; its attempts re-ran on the other
            assert gym.replacement_count("gym-0") + gym.replacement_count("gym-1") == 1
    assert failed, "no claim reached the journal"
    verdict = judge(lineage, ROWS, final.snapshot.path, seed=3, config=SIM, group_size=2)
    assert verdict.ok, verdict.violations()


@pytest.mark.subprocess
@pytest.mark.parametrize("seed", [1141, 1185])
def test_the_hostile_seeds_that_found_it_hold(seed: int) -> None:
    """The simulation's seeds, replayed as the CLI replays them (their schedule depends on
    string hashing, which the command pins)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "simulate",
            "--seeds",
            "1",
            "--start",
            str(seed),
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


@pytest.mark.subprocess
def test_a_hostile_seed_replays_exactly_in_process_whatever_the_string_hashing() -> None:
    """``run_seed`` called in process (no ``PYTHONHASHSEED`` pinned by the CLI) gives the same
    run under any string hashing: the dispatcher abandoned a dead stream's rows in the order
    of a set of rollout IDs, so the fresh attempts went out in hash order (seed 1141's
    fingerprint changed from one process to the next, and the violation came and went)."""
    code = (
        "from gymckpt.app.simulation.main import run_seed; "
        "print(run_seed(1141, hostile=True).fingerprint)"
    )
    prints = set()
    for hash_seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        prints.add(done.stdout.strip())
    assert len(prints) == 1, prints
