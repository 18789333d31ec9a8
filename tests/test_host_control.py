"""The host's control plane (``gym_adapter._host_control``): a restore reads the committed
participant records typed (``AgentRecords``, ``SessionRecords``, ``StagedRecords``) and either
installs everything (unclaimed episodes, kept retained sessions, the journal rewritten to the
committed data) or, on any difference, raises ``TopologyMismatch`` naming each and changes
nothing.

One real ``GymHost`` commits a snapshot (an episode completed and kept, one parked); a fresh
host restores it, after the test rewrote a participant's records (digest recomputed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import Done, Environment, GymHost, RunRow
from gymckpt.gym_adapter._contract import CommitReply
from gymckpt.gym_adapter._episode import EpisodeInfo
from gymckpt.gym_adapter._host_journal import replay_journal
from gymckpt.runtime import (
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    records_digest,
)
from gymckpt.runtime.lowlevel import RECORDS_FILE, SessionRecords, dump_records, load_records


@attrs.define
class Cal:
    """A retained participant; ``broken``: its restore raises."""

    name: str = "cal"
    kind: str = "environment"
    retained: bool = True
    broken: bool = False

    def open(self, info: EpisodeInfo) -> Any:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        return dict(state)

    def restore(self, data: Any) -> Any:
        if self.broken:
            raise ValueError("calendar will not restore")
        return dict(data)


class Notes:
    name, kind = "notes", "environment"

    def open(self, info: EpisodeInfo) -> Any:
        return []

    def export(self, state: Any) -> Any:
        return list(state)

    def restore(self, data: Any) -> Any:
        return list(data)


class Agent:
    """Row 0 ends after one turn; any other row runs on (one turn a second)."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await trio.sleep(1.0)
        ctx.session("cal")["n"] += 1
        ctx.session("notes").append(ctx.turn)
        return Done(1.0) if ctx.info.row == 0 else None


def environment(cal: Cal | None = None) -> Environment:
    return Environment(agent=Agent(), participants=(cal or Cal(), Notes()))


def deadline() -> float:
    return trio.current_time() + 30.0


def manifest_parts(reply: CommitReply) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    record = InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, reply.instance, e.capture_keys) for e in reply.exported
    ]
    return record, episodes


async def committed(tmp_path: Path) -> tuple[Path, InstanceRecord, list[EpisodeRecord]]:
    root = tmp_path / "snap"
    async with GymHost("gym-0", environment()) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)])
        await trio.sleep(2.5)  # 0-0 completed (kept), 1-0 in its third turn
        await host.prepare("c1", deadline())
        reply = await host.commit("c1", str(root), deadline())
        await stream.aclose()
    record, episodes = manifest_parts(reply)
    assert [e.rollout_id for e in episodes] == ["1-0"]
    return root, record, episodes


def rewrite(root: Path, record: InstanceRecord, name: str, change: Any) -> InstanceRecord:
    """``record`` after participant ``name``'s records became ``change(records)``."""
    parts = []
    for p in record.participants:
        if p.server_name == name:
            path = root / p.state_dir / RECORDS_FILE
            records = load_records(path.read_bytes(), str(path), SessionRecords)
            path.write_bytes(dump_records(change(records)))
            p = attrs.evolve(p, records_digest=records_digest(root / p.state_dir))
        parts.append(p)
    return attrs.evolve(record, participants=tuple(parts))


@asynccontextmanager
async def fresh(tmp_path: Path, cal: Cal | None = None) -> AsyncIterator[GymHost]:
    async with GymHost("gym-0", environment(cal), work_dir=tmp_path / "work") as host:
        yield host


async def test_a_restore_installs_the_unclaimed_episode_the_kept_session_and_their_journal(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root, record, episodes = await committed(tmp_path)
    async with fresh(tmp_path) as host:
        reply = await host.restore(str(root), record, episodes, deadline())
        assert reply.restored == ("1-0",)
        assert host.inventory().unclaimed == ("1-0",)
        cal = host.session_states("cal")
        assert {k: (v.rollout_id, v.state) for k, v in cal.items()} == {
            "0-0": ("0-0", {"n": 1}),  # completed and kept
            "1-0": ("1-0", {"n": 3}),  # parked after its third turn
        }
        assert host.session_states("notes")["1-0"].state == [0, 1, 2]
        assert "0-0" not in host.session_states("notes")  # not retained: not kept
        path = host.journal_path
        assert path is not None
        journal = replay_journal(path.read_bytes())
        assert {k: (s.rollout_id, s.states) for k, s in journal.items()} == {
            "0-0": ("0-0", {"cal": {"n": 1}}),
            "1-0": ("1-0", {"cal": {"n": 3}}),
        }


async def test_an_episode_the_records_hold_no_session_of_is_a_difference_and_nothing_changes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root, record, episodes = await committed(tmp_path)
    record = rewrite(root, record, "notes", lambda r: attrs.evolve(r, sessions=()))
    async with fresh(tmp_path) as host:
        with pytest.raises(TopologyMismatch) as info:
            await host.restore(str(root), record, episodes, deadline())
        assert list(info.value.differences) == [
            "instance gym-0: episode 1-0 has no notes session in the committed records"
        ]
        assert host.inventory().unclaimed == () and host.session_states("cal") == {}


async def test_an_owner_that_does_not_export_the_episode_is_a_difference(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root, record, episodes = await committed(tmp_path)
    record = rewrite(root, record, "cal", lambda r: attrs.evolve(r, exported=()))
    async with fresh(tmp_path) as host:
        with pytest.raises(TopologyMismatch, match="episode 1-0 not exported by cal"):
            await host.restore(str(root), record, episodes, deadline())


async def test_a_participant_whose_restore_raises_is_a_difference_for_held_and_kept_sessions(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root, record, episodes = await committed(tmp_path)
    async with fresh(tmp_path, Cal(broken=True)) as host:
        with pytest.raises(TopologyMismatch) as info:
            await host.restore(str(root), record, episodes, deadline())
        text = str(info.value)
        assert "episode 1-0: committed session state cannot be restored" in text
        assert "calendar will not restore" in text
        with pytest.raises(TopologyMismatch) as info:  # no held episode: only kept ones
            await host.restore(str(root), record, [], deadline())
        assert "retained sessions of cal cannot be restored" in str(info.value)
        assert host.inventory().unclaimed == () and host.session_states("cal") == {}


async def test_a_kept_slot_missing_from_the_records_of_a_retained_participant_is_a_difference(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root, record, episodes = await committed(tmp_path)
    record = rewrite(
        root,
        record,
        "cal",
        lambda r: attrs.evolve(r, sessions=tuple(s for s in r.sessions if s.key != "1-0")),
    )
    async with fresh(tmp_path) as host:
        with pytest.raises(TopologyMismatch, match="episode 1-0 has no cal session"):
            await host.restore(str(root), record, episodes, deadline())
        assert host.session_states("cal") == {}
