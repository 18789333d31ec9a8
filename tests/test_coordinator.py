"""The checkpoint's parts, directly: what a ``PendingCheckpoint`` gives back on each path, the
``CheckpointFailureManager``'s budget, and the ``CheckpointStatsTracker``'s numbers.

The pending checkpoint runs against the runtime's own gate, deadline registry and snapshot store,
with a Gym that records its control calls and fails or hangs on request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import CommitReply
from gymckpt.nurseries._checkpoint_stats import CheckpointStatsTracker
from gymckpt.nurseries._failure_manager import CheckpointFailureManager
from gymckpt.nurseries._pending import PAUSE_HOLDER, PendingCheckpoint, TrainerFilesFailed
from gymckpt.runtime import (
    CheckpointsFailed,
    DeadlineRegistry,
    DispatchGate,
    FailureKind,
    GymCheckpointUnavailable,
    GymControlError,
    InstanceRecord,
    Metrics,
    ParticipantRecord,
    RuntimeConfig,
    SnapshotStore,
    TrainerFilesRefused,
)
from gymckpt.runtime._shared import MANIFEST_VERSION, GymManifest

NAMES = ("gym-0", "gym-1")
CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5)


@attrs.define
class RecordingGym:
    """The three control calls a pending checkpoint makes, recorded; ``fail`` names calls
    (``"prepare:gym-1"``) that raise, ``hang`` calls that never answer."""

    calls: list[str] = attrs.field(factory=list)
    fail: set[str] = attrs.field(factory=set)
    hang: set[str] = attrs.field(factory=set)
    hanging: trio.Event = attrs.field(factory=trio.Event)

    async def _call(self, op: str, instance: str) -> None:
        key = f"{op}:{instance}"
        self.calls.append(key)
        if key in self.hang:
            self.hanging.set()
            await trio.sleep_forever()
        if key in self.fail:
            raise GymControlError(instance, op, "refused")

    async def prepare(
        self, instance: str, checkpoint_id: str, deadline: float, *args: Any, **kwargs: Any
    ) -> None:
        await self._call("prepare", instance)

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline: float
    ) -> CommitReply:
        await self._call("commit", instance)
        (Path(state_root) / instance / "env").mkdir(parents=True)
        return CommitReply(instance, checkpoint_id, (), (), ())

    async def resume(self, instance: str, checkpoint_id: str, deadline: float) -> None:
        await self._call("resume", instance)


@attrs.define
class Parts:
    pending: PendingCheckpoint
    gym: RecordingGym
    gate: DispatchGate
    deadlines: DeadlineRegistry
    store: SnapshotStore
    resume_failures: list[Exception]
    points: list[str]

    def staging_dirs(self) -> list[Path]:
        return sorted(self.store.root.glob(".staging-*"))

    def assert_given_back(self, *, gate_id: int) -> None:
        """Admission open (under ``gate_id``), no pause held, no staging directory left."""
        stats = self.gate.statistics()
        assert stats.open and stats.gate_id == gate_id, stats
        assert self.deadlines.statistics().holders == frozenset()
        assert self.staging_dirs() == []


def parts(tmp_path: Path, gym: RecordingGym | None = None) -> Parts:
    gym = gym if gym is not None else RecordingGym()
    gate, deadlines = DispatchGate(), DeadlineRegistry()
    store = SnapshotStore(tmp_path / "snapshots")
    store.root.mkdir(parents=True, exist_ok=True)
    failures: list[Exception] = []
    points: list[str] = []
    pending = PendingCheckpoint(
        "run-0001",
        gym,
        store,
        gate,
        deadlines,
        CONFIG,  # type: ignore[arg-type]
        on_point=lambda cid, point: points.append(f"{cid}:{point}"),
        on_resume_failed=failures.append,
    )
    return Parts(pending, gym, gate, deadlines, store, failures, points)


class Boom(Exception):
    pass


async def test_failure_before_admission_closes_gives_back_only_the_staging_dir(
    tmp_path: Path,
) -> None:
    p = parts(tmp_path)

    def writer(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(b"w")
        raise ValueError("the trainer's own bug")

    with pytest.raises(TrainerFilesFailed) as info:
        async with p.pending:
            await p.pending.write_trainer_files(writer)
    assert isinstance(info.value.error, ValueError)
    p.assert_given_back(gate_id=1)  # never closed: the same gate ID, no reopen
    assert p.gym.calls == []


async def test_refused_trainer_files_leave_no_staging_dir(tmp_path: Path) -> None:
    p = parts(tmp_path)

    def writer(directory: Path) -> None:
        (directory / "dangling").symlink_to(directory / "nowhere")

    with pytest.raises(TrainerFilesRefused):
        async with p.pending:
            await p.pending.write_trainer_files(writer)
    p.assert_given_back(gate_id=1)


async def test_failure_after_close_reopens_and_releases_the_pause_without_resuming(
    tmp_path: Path,
) -> None:
    p = parts(tmp_path)
    with pytest.raises(Boom):
        async with p.pending:
            await p.pending.close_admission()
            assert p.gate.statistics().closed_by == "run-0001"
            await p.pending.pause_deadlines()
            assert p.deadlines.statistics().holders == frozenset({PAUSE_HOLDER})
            raise Boom  # e.g. the retire stage failed
    p.assert_given_back(gate_id=2)
    assert p.gym.calls == []  # Gym was never asked to park


async def test_a_failed_prepare_resumes_every_instance(tmp_path: Path) -> None:
    p = parts(tmp_path, RecordingGym(fail={"prepare:gym-1"}))
    with pytest.raises(GymCheckpointUnavailable, match="gym-1 prepare: refused"):
        async with p.pending:
            await p.pending.close_admission()
            await p.pending.pause_deadlines()
            await p.pending.prepare(NAMES)
    assert sorted(c for c in p.gym.calls if c.startswith("resume")) == [
        "resume:gym-0",
        "resume:gym-1",
    ]
    p.assert_given_back(gate_id=2)


async def test_a_failure_after_commit_removes_the_staging_dir_and_resumes(tmp_path: Path) -> None:
    p = parts(tmp_path)
    with pytest.raises(Boom):
        async with p.pending:
            await p.pending.close_admission()
            await p.pending.pause_deadlines()
            await p.pending.prepare(NAMES)
            replies = await p.pending.commit(NAMES)
            assert sorted(replies) == list(NAMES)
            assert repr(p.pending) == (
                "<PendingCheckpoint run-0001 holds=staging,admission,pause parked=2 stages=0>"
            )
            assert len(p.staging_dirs()) == 1
            raise Boom  # e.g. the ownership rule failed
    assert sorted(c for c in p.gym.calls if c.startswith("resume")) == [
        "resume:gym-0",
        "resume:gym-1",
    ]
    p.assert_given_back(gate_id=2)


async def test_a_published_checkpoint_keeps_its_snapshot_and_resumes_once(tmp_path: Path) -> None:
    p = parts(tmp_path)
    async with p.pending:
        await p.pending.close_admission()
        await p.pending.pause_deadlines()
        await p.pending.prepare(NAMES)
        await p.pending.commit(NAMES)
        digest = "sha256:" + "0" * 64
        instances = tuple(
            InstanceRecord(n, (ParticipantRecord("env", "environment", f"gym/{n}/env", digest),))
            for n in NAMES
        )
        manifest = GymManifest(MANIFEST_VERSION, "run-0001", instances, ())
        info = await p.pending.publish(manifest, {"ledger.json": b"{}"})
        await p.pending.resume()
    assert info.path.is_dir() and info.checkpoint_id == "run-0001"
    assert [c for c in p.gym.calls if c.startswith("resume")] != []
    assert len([c for c in p.gym.calls if c.startswith("resume")]) == len(NAMES)
    p.assert_given_back(gate_id=2)
    assert p.resume_failures == []


async def test_a_failed_resume_is_reported_not_raised(tmp_path: Path) -> None:
    p = parts(tmp_path, RecordingGym(fail={"resume:gym-0"}))
    async with p.pending:
        await p.pending.prepare(NAMES)
        await p.pending.resume()
    assert len(p.resume_failures) == 1
    assert "gym-0" in str(p.resume_failures[0])
    assert len([c for c in p.gym.calls if c.startswith("resume")]) == len(NAMES)  # not twice


async def test_a_resume_cut_short_is_retried_by_the_shielded_release(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    gym = RecordingGym(hang={"resume:gym-1"})
    p = parts(tmp_path, gym)
    with trio.CancelScope() as scope:
        async with p.pending:
            await p.pending.close_admission()
            await p.pending.pause_deadlines()
            await p.pending.prepare(NAMES)

            async def cancel_once_hanging() -> None:
                await gym.hanging.wait()
                gym.hang.clear()  # the retry answers
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_once_hanging)
                await p.pending.resume()
    assert scope.cancelled_caught
    resumes = [c for c in gym.calls if c.startswith("resume")]
    assert sorted(resumes) == ["resume:gym-0", "resume:gym-0", "resume:gym-1", "resume:gym-1"]
    p.assert_given_back(gate_id=2)


async def test_release_runs_whole_under_cancellation(tmp_path: Path) -> None:
    p = parts(tmp_path)
    with trio.CancelScope() as scope:
        async with p.pending:
            await p.pending.close_admission()
            await p.pending.pause_deadlines()
            await p.pending.prepare(NAMES)
            await p.pending.commit(NAMES)
            scope.cancel()
            await trio.sleep(1)
    assert scope.cancelled_caught
    assert sorted(c for c in p.gym.calls if c.startswith("resume")) == [
        "resume:gym-0",
        "resume:gym-1",
    ]
    p.assert_given_back(gate_id=2)


async def test_stages_are_timed_failed_ones_too_and_hooks_name_the_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    p = parts(tmp_path)
    with p.pending.stage("close"):
        await trio.sleep(1.5)
    with pytest.raises(Boom), p.pending.stage("retire"):
        await trio.sleep(0.25)
        raise Boom
    p.pending.hook("before_prepare")
    assert p.pending.stage_s == {"close": 1.5, "retire": 0.25}
    assert p.points == ["run-0001:before_prepare"]


# -- the failure manager -----------------------------------------------------------------


def test_the_budget_tolerates_max_failures_in_a_row_and_raises_on_the_next() -> None:
    budget = CheckpointFailureManager(2)
    cause = GymControlError("gym-0", "prepare", "refused")
    for n in (1, 2):
        assert budget.count() == n
        budget.check(FailureKind.GYM_UNAVAILABLE, "refused", cause)  # tolerated
    assert budget.consecutive == 2
    budget.count()
    with pytest.raises(CheckpointsFailed) as info:
        budget.check(FailureKind.SNAPSHOT_IO, "disk full", cause)
    assert str(info.value) == (
        "3 checkpoints failed in a row (max_consecutive_failures=2); last (snapshot_io): disk full"
    )
    assert info.value.__cause__ is cause


def test_a_completed_checkpoint_resets_the_budget() -> None:
    budget = CheckpointFailureManager(1)
    budget.count()
    budget.succeeded()
    assert budget.consecutive == 0
    assert budget.count() == 1
    budget.check(FailureKind.GYM_UNAVAILABLE, "x", Boom())  # one in a row: tolerated


def test_a_zero_budget_raises_on_the_first_failure_and_a_negative_one_is_refused() -> None:
    budget = CheckpointFailureManager(0)
    budget.count()
    with pytest.raises(CheckpointsFailed):
        budget.check(FailureKind.GYM_UNAVAILABLE, "x", Boom())
    with pytest.raises(ValueError):
        CheckpointFailureManager(-1)


# -- the statistics tracker ----------------------------------------------------------------


async def test_the_tracker_counts_and_reports_each_outcome(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics(clock=trio.current_time)
    stats = CheckpointStatsTracker(metrics)
    start = {
        k: metrics.get(k, -1)
        for k in (
            "checkpoint/completed_total",
            "checkpoint/failed_total",
            "checkpoint/restored_total",
        )
    }
    assert start == dict.fromkeys(start, 0)  # present from the start

    started = trio.current_time()
    await trio.sleep(2)
    stats.failed(
        "run-0001",
        FailureKind.GYM_UNAVAILABLE,
        "gym-0 prepare: refused",
        1,
        {"prepare": 0.5},
        started,
    )
    assert metrics.get("checkpoint/gym_unavailable_total") == 1
    assert metrics.get("checkpoint/consecutive_failures") == 1
    assert metrics.get("checkpoint/stage_prepare_s") == 0.5
    assert metrics.get("checkpoint/last_duration_s") == 2
    assert "checkpoint run-0001 failed (gym_unavailable, 1 in a row" in caplog.text

    stats.aborted("run-0002", RuntimeError("mismatch"), {}, started)
    assert metrics.get("checkpoint/invariant_failures_total") == 1
    assert "checkpoint run-0002 aborted the run: mismatch" in caplog.text

    stats.trainer_code_failed()
    stats.completed({"publish": 0.25})
    stats.record_last(started, 4096)
    assert (stats.ok_total, stats.failed_total) == (1, 3)
    assert metrics.get("checkpoint/failed_total") == 3
    assert metrics.get("checkpoint/completed_total") == metrics.get("checkpoint/ok_total") == 1
    assert metrics.get("checkpoint/consecutive_failures") == 0
    assert metrics.get("checkpoint/last_size_bytes") == 4096


def test_the_tracker_keeps_stage_counters() -> None:
    metrics = Metrics()
    stats = CheckpointStatsTracker(metrics)
    stats.retired_dropped(3)
    stats.restore_retired(2)
    stats.resume_failed()
    stats.drain_pending(7)
    got: Callable[[str], float] = metrics.get
    assert got("checkpoint/retired_dropped_total") == 3
    assert got("checkpoint/restore_retire_total") == 2
    assert got("checkpoint/resume_failures_total") == 1
    assert got("checkpoint/drain_pending") == 7
