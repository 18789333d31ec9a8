"""Behaviour of the orchestration (S1-S11, S13) on the embedded Gym, under the autojump clock.

Each test asserts what a user of the runtime cares about: counts, identities, budgets spent,
messages, and that admission reopens and the deadline pause is released whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import CommitReply, EmbeddedGym, ExportedEpisode, RunRow
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_state,
)
from gymckpt.nurseries import CheckpointCoordinator, Rollouts, open_rollouts, snapshot_problems
from gymckpt.nurseries._shared import PAUSE_HOLDER
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    AttemptState,
    CheckpointInvariantError,
    CheckpointsFailed,
    DeadlineRegistry,
    DispatchGate,
    Metrics,
    RecoveryLedger,
    RuntimeConfig,
    SnapshotStore,
    StrandedSessionError,
    TopologyMismatch,
    load_snapshot,
)
from gymckpt.runtime._ledger import load_ledger_snapshot

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)


@asynccontextmanager
async def running(
    tmp_path: Path,
    *,
    rows: int = 12,
    group_size: int = 2,
    instances: int = 2,
    faults: Sequence[str] = (),
    sim: CalendarConfig = SIM,
    config: RuntimeConfig = CONFIG,
    agent_kinds: str = "simple_agent",
    **kw: Any,
) -> AsyncIterator[tuple[EmbeddedGym, Rollouts]]:
    async with EmbeddedGym.host(
        calendar_environment(agent_kinds, config=sim),
        instances=instances,
        seed=3,
        work_dir=tmp_path / "gym",
        faults=faults,
        config=sim.host_config(),
    ) as gym:
        async with open_rollouts(
            gym,
            tmp_path,
            rows=rows,
            group_size=group_size,
            config=config,
            max_rows_in_flight=6,
            **kw,
        ) as ro:
            yield gym, ro


async def train_all(ro: Rollouts, per_step: int = 2) -> list[int]:
    rows: list[int] = []
    async for batch in ro.batches(per_step):
        rows.extend(g.row for g in batch)
    return rows


def dispatched(ledger: RecoveryLedger) -> int:
    return ledger.statistics().by_state["dispatched"]


def assert_released(ro: Rollouts) -> None:
    assert ro.coordinator.gate.is_open
    assert PAUSE_HOLDER not in ro.coordinator.deadlines.holders


# -- S1 -----------------------------------------------------------------------------------------


async def test_s1_nothing_is_dispatched_before_admission(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (gym, ro):
        gate = ro.coordinator.gate
        # the dispatcher may already be inside its first admission: close waits for it
        await gate.close("test")
        sent = ro.dispatcher.statistics().rows_sent
        await trio.sleep(10)  # episodes finish; new attempts wait at the closed gate
        assert ro.dispatcher.statistics().rows_sent == sent
        # the dispatcher's submissions (one per instance planned), holding reserved attempts
        waiting = gate.statistics().waiting
        assert 1 <= waiting == ro.dispatcher.statistics().submissions <= len(gym.instances)
        reserved = ro.ledger.statistics().by_state["reserved"]
        assert reserved > 0 and dispatched(ro.ledger) == 0
        for n in gym.instances:
            assert (await gym.inventory(n)).running == ()
        await gate.reopen()
        await trio.sleep(1)
        outcome = await ro.checkpoint()
        assert outcome.ok
        snap = load_snapshot(outcome.snapshot.path)  # type: ignore[union-attr]
        # a checkpoint counts only attempts that reached Gym: ledger and manifest agree
        assert snapshot_problems(snap).all == []
        led = load_ledger_snapshot(snap.files["ledger.json"])
        assert sum(a.state == "dispatched" for a in led.attempts) == outcome.episodes
        assert sorted(await train_all(ro)) == list(range(12))
        assert_released(ro)


async def test_s1_a_checkpoint_keeps_admission_closed_from_close_to_resume(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Nothing reaches Gym between the checkpoint's close and its resume (even while Gym's
    own admission is open again, e.g. during the retire stage)."""
    async with running(tmp_path, rows=40, faults=["commit:delay:1.5"]) as (_gym, ro):
        await trio.sleep(1)
        seen: list[tuple[str, bool, int]] = []
        ro.coordinator.on_stage = lambda _cid, point: seen.append(
            (point, ro.coordinator.gate.is_open, ro.dispatcher.statistics().rows_sent)
        )
        outcome = await ro.checkpoint()
        assert outcome.ok, outcome.error
        assert seen[0][0] == "before_prepare" and len(seen) >= 4
        assert not any(is_open for _, is_open, _ in seen), seen
        assert len({sent for _, _, sent in seen}) == 1, seen
        assert ro.coordinator.gate.is_open


# -- S2 -----------------------------------------------------------------------------------------


async def test_s2_refusals_cost_nothing_and_are_resent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, faults=["run:refuse@1"]) as (_gym, ro):
        rows = await train_all(ro)
        assert sorted(rows) == list(range(12))
        refused = ro.metrics.get(ADMISSION_CLOSED_ROWS)
        assert refused > 0
        assert ro.dispatcher.statistics().refused == refused
        stats = ro.ledger.statistics()
        assert stats.row_attempts_spent == 0 and stats.data_failures == 0
        assert stats.rows_failed == 0


async def test_s2_refused_rows_keep_their_identity(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ids: list[str] = []
    async with running(tmp_path, faults=["run:refuse@1"]) as (_gym, ro):
        async for batch in ro.batches(2):
            ids.extend(rid for g in batch for rid in g.rollout_ids)
    assert all("-a" not in rid for rid in ids)  # re-sent as the same attempt


# -- S3 -----------------------------------------------------------------------------------------


async def test_s3_early_stream_end_abandons_retires_and_resends_fresh(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ids: list[str] = []
    async with running(tmp_path, faults=["run:drop@1"]) as (gym, ro):
        async for batch in ro.batches(2):
            ids.extend(rid for g in batch for rid in g.rollout_ids)
        d = ro.dispatcher.statistics()
        assert d.early_ends == 1
        assert d.retired_now > 0 and d.retire_failures == 0
        assert ro.ledger.statistics().retire_queue == 0
        gs = await gym.statistics()
        assert sum(i.retired for i in gs.instances) >= d.retired_now
    fresh = [rid for rid in ids if rid.endswith("-a1")]
    assert len(fresh) == d.retired_now  # each abandoned row re-sent under a new rollout ID
    assert len(ids) == 12 * 2 and len(set(ids)) == len(ids)


# -- S4 -----------------------------------------------------------------------------------------


async def test_s4_dropped_group_is_retired_before_prepare(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (gym, ro):
        ledger = ro.ledger
        await trio.sleep(0.1)
        row = next(
            r for r in ledger.rows() if all(ledger.is_in_flight(f"{r}-{s}") for s in range(2))
        )
        await ledger.barrier.mutate(lambda: ledger.drop_row(row))
        assert ledger.statistics().retire_queue == 2
        outcome = await ro.checkpoint()
        assert outcome.ok, outcome.error
        assert ledger.statistics().retire_queue == 0
        assert ro.metrics.get("checkpoint/retired_dropped_total") == 2
        for n in gym.instances:
            inv = await gym.inventory(n)
            assert not {f"{row}-0", f"{row}-1"} & set(inv.running + inv.parked)
        rows = await train_all(ro)
        assert row not in rows and sorted([*rows, row]) == list(range(12))


# -- S5 -----------------------------------------------------------------------------------------


async def test_s5_hung_prepare_is_bounded_and_named(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, faults=["prepare:hang@1"]) as (_gym, ro):
        await trio.sleep(1)
        t0 = trio.current_time()
        outcome = await ro.checkpoint()
        elapsed = trio.current_time() - t0
        assert not outcome.ok and outcome.reason == "gym_unavailable"
        assert "did not answer prepare" in (outcome.error or "")
        assert re.search(r"instance gym-\d did not answer prepare within 2s", outcome.error or "")
        assert outcome.stage_s["prepare"] == pytest.approx(2.5)  # deadline + reply grace
        assert elapsed < 2.5 + 2.5 + 0.1  # plus at most one bounded best-effort resume
        assert_released(ro)
        again = await ro.checkpoint()
        assert again.ok
        assert sorted(await train_all(ro)) == list(range(12))


async def test_s5_lost_resume_lease_reopens_gym(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, faults=["resume:hang@1"]) as (gym, ro):
        await trio.sleep(1)
        outcome = await ro.checkpoint()
        assert outcome.ok  # the snapshot is published before resume
        assert ro.metrics.get("checkpoint/resume_failures_total") == 1
        assert_released(ro)
        assert sorted(await train_all(ro)) == list(range(12))
        reopened = [(await gym.inventory(n)).lease_reopened for n in gym.instances]
        assert sum(reopened) == 1


# -- S6 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault", ["commit:error@1", "prepare:unpicklable@1", "commit:hang@1", "prepare:dead@1"]
)
async def test_s6_gym_failures_are_retryable(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, fault: str
) -> None:
    async with running(tmp_path, faults=[fault]) as (_gym, ro):
        await trio.sleep(1)
        outcome = await ro.checkpoint()
        assert not outcome.ok and outcome.reason == "gym_unavailable"
        if "unpicklable" in fault:
            assert "cannot be pickled" in (outcome.error or "")
        assert ro.coordinator.consecutive_failures == 1
        failed = ro.coordinator.statistics()
        assert (failed.checkpoints_ok, failed.checkpoints_failed) == (0, 1)
        assert failed.consecutive_failures == 1
        assert_released(ro)
        rows = await train_all(ro)
        assert sorted(rows) == list(range(12))  # nothing lost, nothing twice
        if "dead" not in fault:
            assert (await ro.checkpoint()).ok
            assert ro.coordinator.consecutive_failures == 0
            after = ro.coordinator.statistics()
            assert (after.checkpoints_ok, after.consecutive_failures) == (1, 0)
            assert after.last_checkpoint_seq > failed.last_checkpoint_seq


async def test_s6_too_many_failures_in_a_row_raise(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, faults=["commit:error"]) as (_gym, ro):
        for _ in range(CONFIG.max_consecutive_failures):
            assert not (await ro.checkpoint()).ok
        with pytest.raises(CheckpointsFailed, match="3 checkpoints failed in a row"):
            await ro.checkpoint()
        assert_released(ro)


class ForeignEpisodeGym:
    """Wraps a backend; its commit reply exports an episode the ledger never dispatched."""

    def __init__(self, inner: EmbeddedGym) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def instances(self) -> tuple[str, ...]:
        return self._inner.instances

    async def commit(self, instance: str, cid: str, root: str, deadline: float) -> CommitReply:
        reply = await self._inner.commit(instance, cid, root, deadline)
        ghost = ExportedEpisode("999-0", "calendar", ())
        return CommitReply(
            reply.instance,
            reply.checkpoint_id,
            reply.participants,
            (*reply.exported, ghost),
            reply.on_wire,
            reply.sessions,
        )


async def test_s6_ownership_mismatch_aborts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=1,
        seed=1,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as inner:
        gym = ForeignEpisodeGym(inner)
        async with open_rollouts(
            gym,
            tmp_path,
            rows=4,
            group_size=2,  # type: ignore[arg-type]
            config=CONFIG,
        ) as ro:
            await trio.sleep(1)
            with pytest.raises(CheckpointInvariantError, match="does not hold"):
                await ro.checkpoint()
            assert_released(ro)
            assert SnapshotStore(tmp_path / "snapshots").list_complete() == []


# -- S7 -----------------------------------------------------------------------------------------


async def test_s7_deadlines_pause_while_parked_and_other_holders_stay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, faults=["commit:delay@1:1.5"]) as (_gym, ro):
        deadlines = ro.coordinator.deadlines
        deadlines.register("request-x", "a test request", 10.0)
        deadlines.pause("refit")  # a colocated engine's own pause
        deadlines.release("refit")
        t0 = trio.current_time()
        deadlines.pause("refit")
        outcome = await ro.checkpoint()
        assert outcome.ok and trio.current_time() - t0 >= 1.5
        assert deadlines.holders == {"refit"}  # ours released, theirs kept
        assert deadlines.remaining("request-x") == pytest.approx(10.0)
        deadlines.release("refit")
        await trio.sleep(1)
        assert deadlines.remaining("request-x") == pytest.approx(9.0)
        deadlines.discard("request-x")


async def test_s7_the_checkpoint_pauses_deadlines_by_itself(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """No other holder: only the checkpoint's own pause keeps a request deadline still while
    Gym is parked (and it is released after)."""
    async with running(tmp_path, faults=["commit:delay:1.5"]) as (_gym, ro):
        deadlines = ro.coordinator.deadlines
        seen: list[frozenset[str]] = []
        ro.coordinator.on_stage = lambda _cid, point: seen.append(frozenset(deadlines.holders))
        deadlines.register("request-y", "a test request", 10.0)
        t0 = trio.current_time()
        outcome = await ro.checkpoint()
        assert outcome.ok and trio.current_time() - t0 >= 1.5
        assert seen and all(h == {PAUSE_HOLDER} for h in seen)
        assert deadlines.holders == frozenset()
        assert deadlines.remaining("request-y") == pytest.approx(10.0, abs=0.01)
        deadlines.discard("request-y")


async def test_s4_a_drop_recorded_during_the_retire_stage_waits_for_the_next_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, rows=40) as (gym, ro):
        ledger = ro.ledger
        await trio.sleep(1)
        rows = sorted(
            r for r in ledger.rows() if all(ledger.is_in_flight(f"{r}-{s}") for s in range(2))
        )
        first, later = rows[0], rows[1]
        await ledger.barrier.mutate(lambda: ledger.drop_row(first))
        real_retire = gym.retire

        async def retire(instance: str, ids: Any, deadline: float) -> Any:
            if ledger.get(f"{later}-0") is not None:  # a drop lands while Gym retires
                await ledger.barrier.mutate(lambda: ledger.drop_row(later))
            return await real_retire(instance, ids, deadline)

        gym.retire = retire  # type: ignore[method-assign]
        outcome = await ro.checkpoint()
        assert outcome.ok, outcome.error
        left = {i.rollout_id for items in ledger.retire_queue().values() for i in items}
        assert left == {f"{later}-0", f"{later}-1"}
        assert (await ro.checkpoint()).ok
        assert ledger.statistics().retire_queue == 0


# -- S8 -----------------------------------------------------------------------------------------


async def _one_snapshot(tmp_path: Path, after_s: float = 1.0) -> Path:
    async with running(tmp_path, rows=40) as (_gym, ro):
        await trio.sleep(after_s)
        outcome = await ro.checkpoint()
        assert outcome.ok and outcome.episodes > 0
        return outcome.snapshot.path  # type: ignore[union-attr]


async def test_s8_tampered_state_is_refused_and_gym_untouched(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = await _one_snapshot(tmp_path)
    records = path / "gym" / "gym-1" / "calendar" / "records.json"
    data = bytearray(records.read_bytes())
    data[len(data) // 2] ^= 0x01
    records.write_bytes(bytes(data))
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym2",
        config=SIM.host_config(),
    ) as gym:
        with pytest.raises(TopologyMismatch, match="gym-1: participant calendar digest"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=2, config=CONFIG):
                pass
        for n in gym.instances:  # refused before any instance installed anything
            inv = await gym.inventory(n)
            assert inv.unclaimed == () and inv.parked == () and inv.running == ()
            assert calendar_state(gym.sim(n)) == {}
            assert gym.sim(n).statistics().restored == 0


async def test_s8_changed_topology_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _one_snapshot(tmp_path)
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=3,
        seed=3,
        work_dir=tmp_path / "gym3",
        config=SIM.host_config(),
    ) as gym:
        with pytest.raises(TopologyMismatch, match="gym-2"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=2, config=CONFIG):
                pass
    async with EmbeddedGym.host(
        calendar_environment("legacy_agent", config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym4",
        config=SIM.host_config(),
    ) as gym:
        with pytest.raises(TopologyMismatch, match="legacy_agent"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=2, config=CONFIG):
                pass


# -- S9 -----------------------------------------------------------------------------------------


async def test_s9_checkpoints_drain_replies_on_the_wire(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sim = CalendarConfig(turns=(1, 2), turn_s=(0.05, 0.2), lease_s=30.0, flush_interval_s=0.5)
    trained: list[int] = []
    async with running(tmp_path, rows=400, sim=sim) as (_gym, ro):

        async def trainer() -> None:
            trained.extend(await train_all(ro))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trainer)
            drained = 0
            for _ in range(50):
                await trio.sleep(0.37)
                outcome = await ro.checkpoint()
                assert outcome.ok, outcome.error
                assert snapshot_problems(load_snapshot(outcome.snapshot.path)).all == []  # type: ignore[union-attr]
                drained += outcome.drained
                if drained:
                    break
            # replies were on the wire at commit, and the drain waited for exactly those
            assert drained > 0
            assert ro.metrics.get("checkpoint/drain_pending") > 0
    assert sorted(trained) == list(range(400))


# -- S10 ----------------------------------------------------------------------------------------


async def test_s10_legacy_sessions_own_their_episodes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, agent_kinds="legacy_agent") as (_gym, ro):
        await trio.sleep(1)
        outcome = await ro.checkpoint()
        assert outcome.ok and outcome.episodes > 0
        snap = load_snapshot(outcome.snapshot.path)  # type: ignore[union-attr]
        assert {e.owner for e in snap.manifest.episodes} == {"agent"}
        assert sorted(await train_all(ro)) == list(range(12))


async def test_s10_stranded_legacy_session_fails_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sim = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), lease_s=30.0, strand_legacy_session=True)
    async with running(tmp_path, agent_kinds="legacy_agent", sim=sim) as (_gym, ro):
        await trio.sleep(1)
        t0 = trio.current_time()
        with pytest.raises(StrandedSessionError, match="parked legacy agent sessions"):
            await ro.checkpoint()
        assert trio.current_time() - t0 < CONFIG.drain_timeout_s
        assert_released(ro)


# -- S11 ----------------------------------------------------------------------------------------


async def test_s11_restored_episodes_dispatched_once_on_their_replica(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # some episodes completed before the cut, so restored ones do not alternate replicas in
    # the dispatcher's round-robin order (a replica chosen by round robin would pass unseen)
    path = await _one_snapshot(tmp_path, after_s=3.0)
    exported = {e.rollout_id: e.replica for e in load_snapshot(path).manifest.episodes}
    claims: list[tuple[str, RunRow]] = []
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym2",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym,
            tmp_path,
            rows=40,
            group_size=2,
            config=CONFIG,
            on_dispatch=lambda i, rows: claims.extend((i, r) for r in rows),
        ) as ro:
            assert ro.restore_summary is not None
            assert ro.restore_summary.restored == len(exported)
            rows = await train_all(ro)
        gs = await gym.statistics()
    restored = [(i, r) for i, r in claims if r.restored_from is not None]
    assert sorted(r.restored_from for _, r in restored) == sorted(exported)  # each once
    for instance, r in restored:
        assert instance == exported[r.restored_from]  # original replica
        assert r.rollout_id == f"{r.restored_from}-a1"  # attempt + 1
    assert sum(i.episodes_claimed for i in gs.instances) == len(exported)
    assert len(rows) == len(set(rows))


async def test_s11_unclaimed_restored_episodes_are_retired(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = await _one_snapshot(tmp_path)
    snap = load_snapshot(path)
    ledger, summary = RecoveryLedger.from_snapshot(
        load_ledger_snapshot(snap.files["ledger.json"]), snap.manifest.episodes
    )
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym2",
        config=SIM.host_config(),
    ) as gym:
        for rec in snap.manifest.instances:
            eps = [e for e in snap.manifest.episodes if e.replica == rec.name]
            await gym.restore(rec.name, str(path), rec, eps, trio.current_time() + 5)
        unclaimed = ledger.unclaimed()
        assert len(unclaimed) == summary.restored > 0
        row = unclaimed[0].row
        await ledger.barrier.mutate(lambda: ledger.drop_row(row))
        queued = sum(len(v) for v in ledger.retire_queue().values())
        assert queued >= 1
        metrics = Metrics()
        coordinator = CheckpointCoordinator(
            gym,
            ledger,
            DispatchGate(),
            DeadlineRegistry(),
            SnapshotStore(tmp_path / "s2"),
            CONFIG,
            metrics,
            run_id="t",
        )
        (tmp_path / "s2").mkdir()
        outcome = await coordinator.checkpoint()
        assert outcome.ok, outcome.error
        assert metrics.get("checkpoint/restore_retire_total") == queued
        left = 0
        for n in gym.instances:
            left += len((await gym.inventory(n)).unclaimed)
        assert left == summary.restored - queued


# -- S13 ----------------------------------------------------------------------------------------


async def test_s13_snapshot_chosen_for_restore_outlives_pruning(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    original = await _one_snapshot(tmp_path)
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym2",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, tmp_path, rows=40, group_size=2, config=CONFIG, keep_snapshots=1
        ) as ro:
            assert ro.restored is not None
            pinned = ro.restored.pinned.path
            assert pinned != original and pinned.exists()
            for _ in range(3):
                assert (await ro.checkpoint()).ok
            assert not original.exists()  # retention pruned the original
            assert load_snapshot(pinned).manifest.checkpoint_id == "run-0001"  # copy intact
            await train_all(ro)


async def test_attempt_states_after_a_full_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (_gym, ro):
        await train_all(ro)
        stats = ro.ledger.statistics()
        assert stats.rows_trained == 12 and stats.attempts == 0
        assert stats.by_state == {s.value: 0 for s in AttemptState}


async def test_hung_run_submission_does_not_hold_the_gate(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ids: list[str] = []
    async with running(tmp_path, faults=["run:hang@1"]) as (_gym, ro):
        t0 = trio.current_time()
        closed_at: list[float] = []
        ro.coordinator.on_stage = lambda _cid, point: (
            closed_at.append(trio.current_time()) if point == "before_prepare" else None
        )
        outcome = await ro.checkpoint()  # closing the gate waits for the hung admission
        assert outcome.ok, outcome.error
        # the close (then the retire stage) waited for the hung submission, and no longer
        assert closed_at[0] - t0 <= CONFIG.control_timeout_s + CONFIG.reply_grace_s + 0.1
        assert closed_at[0] - t0 >= CONFIG.control_timeout_s + CONFIG.reply_grace_s - 0.1
        assert ro.metrics.get("rollout/run_submit_timeouts_total") == 1
        async for batch in ro.batches(2):
            ids.extend(rid for g in batch for rid in g.rollout_ids)
        assert ro.ledger.statistics().retire_queue == 0  # retired before the next prepare
    assert len(ids) == 24 and len(set(ids)) == 24
    assert any(rid.endswith("-a1") for rid in ids)  # the lost submission was re-sent fresh


async def test_a_hung_submission_does_not_hold_submissions_to_other_instances(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Submissions to different instances do not wait for each other: while the first
    ``gym.run`` hangs inside its admission, rows go to the other instance and are DISPATCHED
    there (inside their own admission, S1), and their episodes run and complete."""
    sent: list[tuple[float, str, int]] = []

    def audit(instance: str, rows: Sequence[RunRow]) -> None:
        sent.append((trio.current_time(), instance, len(rows)))

    async with running(tmp_path, faults=["run:hang@1"], on_dispatch=audit) as (gym, ro):
        await trio.sleep(1.0)  # well inside the hung call's bound (2.5 s)
        assert trio.current_time() < CONFIG.control_timeout_s + CONFIG.reply_grace_s
        stats = ro.dispatcher.statistics()
        assert ro.coordinator.gate.statistics().admitting >= 1  # the hung one, still inside
        assert stats.submissions >= 1 and stats.rows_sent > 0
        assert ro.metrics.get("rollout/run_submit_timeouts_total") == 0
        hung = set(gym.instances) - {name for _t, name, _n in sent}
        assert len(hung) == 1, sent  # every instance but the hung one got rows
        assert dispatched(ro.ledger) + ro.ledger.statistics().by_state["completed"] > 0
        assert sum(n for _t, _name, n in sent) == stats.rows_sent
        rows = await train_all(ro)
    assert sorted(rows) == list(range(12))
    assert ro.metrics.get("rollout/run_submit_timeouts_total") == 1


async def test_asking_for_more_groups_than_rows_in_flight_does_not_deadlock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (_gym, ro):  # max_rows_in_flight=6
        sizes = []
        async for batch in ro.batches(10):
            sizes.append(len(batch))
    assert sum(sizes) == 12 and max(sizes) <= 6
