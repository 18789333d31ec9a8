"""``restore_latest``'s own rules, called directly: pin first (S13), every check before Gym is
asked anything (S8), all-or-nothing across instances; and the small rules beside it
(``SnapshotProblems.raise_if_any``, ``saved_step``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym, RestoreReply, RetireReply, Topology
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import SnapshotProblems, open_rollouts, restore_latest
from gymckpt.nurseries._restore import saved_step
from gymckpt.runtime import (
    EpisodeRecord,
    GymCheckpointUnavailable,
    GymControlError,
    InstanceRecord,
    ManifestError,
    RuntimeConfig,
    SnapshotStore,
    TopologyMismatch,
)
from gymckpt.runtime._shared import STEP_FILE, StepRecord, dump_step

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0, lease_s=30.0)


@attrs.define
class RecordingGym:
    """An embedded Gym whose restore-side calls are recorded; ``fail_restore`` instances
    refuse to restore. It cannot replace instances (no ``replace``)."""

    gym: EmbeddedGym
    fail_restore: set[str] = attrs.field(factory=set)
    calls: list[str] = attrs.field(factory=list)

    @property
    def instances(self) -> Sequence[str]:
        return self.gym.instances

    async def topology(self) -> Topology:
        self.calls.append("topology")
        return await self.gym.topology()

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        self.calls.append(f"restore:{instance}")
        if instance in self.fail_restore:
            raise GymControlError(instance, "restore", "refused")
        return await self.gym.restore(instance, state_root, record, episodes, deadline_ts)

    async def retire(self, instance: str, ids: Sequence[str], deadline_ts: float) -> RetireReply:
        self.calls.append(f"retire:{instance}")
        return await self.gym.retire(instance, ids, deadline_ts)

    async def retire_restored(
        self, instance: str, ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        self.calls.append(f"retire_restored:{instance}")
        return await self.gym.retire_restored(instance, ids, deadline_ts)


async def one_snapshot(tmp_path: Path) -> SnapshotStore:
    """A run that checkpoints with episodes in flight on both instances, then stops."""
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, tmp_path, rows=40, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(1.0)
            outcome = await ro.checkpoint()
            assert outcome.ok and outcome.episodes > 0
    return SnapshotStore(tmp_path / "snapshots")


def fresh_gym(tmp_path: Path, name: str) -> EmbeddedGym:
    return EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=tmp_path / name,
        config=SIM.host_config(),
    )


async def test_no_snapshot_restores_nothing_and_asks_gym_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    async with fresh_gym(tmp_path, "gym") as gym:
        recording = RecordingGym(gym)
        got = await restore_latest(recording, store, tmp_path / "pin", CONFIG)  # type: ignore[arg-type]
    assert got is None and recording.calls == []


async def test_restore_reads_a_pinned_copy_and_installs_every_instance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = await one_snapshot(tmp_path)
    async with fresh_gym(tmp_path, "gym2") as gym:
        recording = RecordingGym(gym)
        run = await restore_latest(recording, store, tmp_path / "pin", CONFIG, group_size=2)  # type: ignore[arg-type]
        assert run is not None
        assert run.pinned.path.parent == tmp_path / "pin"  # S13: a copy, not the snapshot
        assert run.pinned.path != run.snapshot.path and run.snapshot.path.is_dir()
        assert recording.calls[0] == "topology"
        assert sorted(c for c in recording.calls if c.startswith("restore:")) == [
            "restore:gym-0",
            "restore:gym-1",
        ]
        assert run.summary.restored > 0 and run.step == 0
        held = [len((await gym.inventory(n)).unclaimed) for n in gym.instances]
        assert sum(held) == run.summary.restored


async def test_every_check_runs_before_gym_is_asked_to_install(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = await one_snapshot(tmp_path)
    async with fresh_gym(tmp_path, "gym2") as gym:
        recording = RecordingGym(gym)
        with pytest.raises(ManifestError, match="group_size 2, this run asks for 4"):
            await restore_latest(recording, store, tmp_path / "pin", CONFIG, group_size=4)  # type: ignore[arg-type]
        assert recording.calls == ["topology"]  # asked, bounded, then nothing
        for n in gym.instances:
            assert (await gym.inventory(n)).unclaimed == ()


async def test_a_restore_failing_on_one_instance_is_rolled_back_on_all(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = await one_snapshot(tmp_path)
    async with fresh_gym(tmp_path, "gym2") as gym:
        recording = RecordingGym(gym, fail_restore={"gym-1"})
        with pytest.raises(GymCheckpointUnavailable, match="gym-1 restore: refused"):
            await restore_latest(recording, store, tmp_path / "pin", CONFIG)  # type: ignore[arg-type]
        rolled_back = sorted(c for c in recording.calls if c.startswith("retire_restored:"))
        assert rolled_back == ["retire_restored:gym-0", "retire_restored:gym-1"]
        for n in gym.instances:  # none holds a claimable restored episode
            assert (await gym.inventory(n)).unclaimed == ()
        # the rollback left the Gym clean: a corrected restart restores into it
        recording.fail_restore.clear()
        run = await restore_latest(recording, store, tmp_path / "pin2", CONFIG)  # type: ignore[arg-type]
        assert run is not None and run.summary.restored > 0


def test_raise_if_any_names_state_first_then_the_ledger() -> None:
    SnapshotProblems((), ()).raise_if_any(Path("/s"))  # nothing found: nothing raised
    with pytest.raises(TopologyMismatch, match="gym-1: digest"):
        SnapshotProblems(("gym-1: digest",), ("ledger.json: bad",)).raise_if_any(Path("/s"))
    with pytest.raises(ManifestError, match=r"^/s: ledger.json: bad; ledger.json: worse$"):
        SnapshotProblems((), ("ledger.json: bad", "ledger.json: worse")).raise_if_any(Path("/s"))
    assert SnapshotProblems(("a",), ("b",)).all == ["a", "b"]


def test_saved_step_is_zero_without_step_json_and_a_bad_one_is_refused() -> None:
    assert saved_step({}) == 0
    assert saved_step({STEP_FILE: dump_step(StepRecord(7))}) == 7
    with pytest.raises(ManifestError, match=STEP_FILE):
        saved_step({STEP_FILE: b'{"step": -1}'})
