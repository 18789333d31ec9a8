"""The Gym host's committed records: what ``build_records`` writes for each role, what it refuses,
and how ``read_committed`` reads them back typed (every difference collected, none raised)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from gymckpt.gym_adapter.host._episodes import StagedModelCall
from gymckpt.gym_adapter.host._records import (
    KeptExportError,
    build_records,
    read_committed,
    write_records,
)
from gymckpt.runtime import InstanceRecord, ParticipantRecord, records_digest
from gymckpt.runtime._shared import (
    RECORDS_FILE,
    AgentRecords,
    AgentSession,
    SessionRecord,
    SessionRecords,
    StagedCall,
    StagedEpisode,
    StagedRecords,
    chunk_records,
    dump_records,
    load_records,
    records_to_plain,
)
from gymckpt.runtime.lowlevel import SnapshotObjects


def inline(chunked: Any) -> bytes:
    """The records ``chunked`` holds, as one inline ``records.json`` (version 1) reads them."""
    plain = dict(chunked.head)
    for key, chunks in chunked.chunks.items():
        plain[key] = [e for c in chunks for e in orjson.loads(c)]
    return dump_records(plain)


def S(key: str, response: object) -> StagedModelCall:
    """A staged call of a request with digest 0...0 at policy version 0."""
    return StagedModelCall(key, response, "0" * 64, 0)


class Part:
    """A participant whose export hands back what its session holds."""

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind

    def export(self, session: Any) -> Any:
        if isinstance(session, Exception):
            raise session
        return session


AGENT = Part("agent", "simple_agent")
CALENDAR = Part("calendar", "environment")
TOOL = Part("tool", "tool.x")
LIVE = (
    ("agent", "simple_agent"),
    ("calendar", "environment"),
    ("tool", "tool.x"),
    ("model_proxy", "model_proxy"),
)


def episode(row: int, turn: int, agent: Any, calendar: Any, tool: Any = "t") -> Any:
    rid = f"{row}-0-a0"
    return SimpleNamespace(
        rollout_id=rid,
        key=f"{row}-0",
        turn=turn,
        staged=[S(f"{row}-0:t0-c0", {"text": "hi"})],
        info=SimpleNamespace(rollout_id=rid, row=row, slot=0, attempt=0, seed=0, instance="gym-0"),
        sessions={"agent": agent, "calendar": calendar, "tool": tool},
    )


def environment(model: bool = True) -> Any:
    return SimpleNamespace(
        agent=AGENT, participants=(CALENDAR, TOOL), model=object() if model else None
    )


def build(held: list[Any], kept: tuple[Any, ...] = (), stranded: str | None = None) -> Any:
    return build_records(environment(), "calendar", (CALENDAR,), "c7", held, list(kept), stranded)


def test_each_role_gets_its_own_records_and_the_owner_exports_the_held_episodes() -> None:
    held = [episode(0, 2, {"r": [1.0]}, {"events": [1]}), episode(1, 1, None, {"events": []})]
    kept = (("0-5", "0-5-a1", 1, {"calendar": {"events": [9]}}),)
    data, refused = build(held, kept, stranded="1-0-a0")
    assert refused == [] and sorted(data) == ["agent", "calendar", "model_proxy", "tool"]
    agent = load_records(inline(data["agent"]), RECORDS_FILE, AgentRecords)
    assert [s.step_boundary for s in agent.sessions] == [2, None]  # stranded: no boundary
    assert agent.exported is None  # an environment owns the episodes
    calendar = load_records(inline(data["calendar"]), RECORDS_FILE, SessionRecords)
    assert calendar.exported == ("0-0-a0", "1-0-a0") and calendar.retained
    assert [s.key for s in calendar.sessions] == ["0-0", "0-5", "1-0"]  # kept slots, by key
    assert calendar.sessions[1].state == {"events": [9]}
    tool = load_records(inline(data["tool"]), RECORDS_FILE, SessionRecords)
    assert tool.exported == () and not tool.retained and len(tool.sessions) == 2
    staged = load_records(inline(data["model_proxy"]), RECORDS_FILE, StagedRecords)
    assert staged.staged[0].calls == (StagedCall("0-0:t0-c0", {"text": "hi"}, "0" * 64, 0),)


def test_a_held_episode_whose_state_is_not_plain_data_is_refused_and_left_out() -> None:
    held = [
        episode(0, 2, {"r": 1}, {"events": []}),
        episode(1, 1, {"r": math.nan}, {}),
        episode(2, 1, {}, ValueError("no export")),
    ]
    data, refused = build(held)
    why = {r.rollout_id: r.message for r in refused}
    assert sorted(why) == ["1-0-a0", "2-0-a0"]
    assert "nan" in why["1-0-a0"] and "raised ValueError('no export')" in why["2-0-a0"]
    agent = load_records(inline(data["agent"]), RECORDS_FILE, AgentRecords)
    assert [s.rollout_id for s in agent.sessions] == ["0-0-a0"]


def test_a_retained_session_that_cannot_be_exported_fails_the_commit() -> None:
    with pytest.raises(KeptExportError, match="retained session 0-5 of 0-5-a1 attempt 1"):
        build([], (("0-5", "0-5-a1", 1, {"calendar": {"x": math.inf}}),))


def _commit(tmp_path: Path) -> InstanceRecord:
    data, _ = build([episode(0, 2, {"r": [1.0]}, {"events": [1]})])
    participants = []
    objects = SnapshotObjects.of_snapshot(tmp_path, None)  # a commit's state root: its objects/
    for server, kind in LIVE:
        write_records(tmp_path / "gym-0" / server, data[server], objects, None, server)
        participants.append(
            ParticipantRecord(
                server, kind, f"gym-0/{server}", records_digest(tmp_path / "gym-0" / server)
            )
        )
    return InstanceRecord("gym-0", tuple(participants))


def test_committed_records_read_back_typed_in_the_role_of_their_place(tmp_path: Path) -> None:
    record = _commit(tmp_path)
    diffs, loaded = read_committed("gym-0", LIVE, tmp_path, record)
    assert diffs == []
    assert [type(loaded[s]) for s, _ in LIVE] == [
        AgentRecords,
        SessionRecords,
        SessionRecords,
        StagedRecords,
    ]
    assert loaded["calendar"].sessions[0].state == {"events": [1]}


def test_records_that_do_not_parse_are_one_difference_each_naming_the_file_and_field(
    tmp_path: Path,
) -> None:
    record = _commit(tmp_path)
    # swap the agent's and the calendar's files, digests re-committed: each parses, wrongly
    agent, calendar = (tmp_path / "gym-0" / n / RECORDS_FILE for n in ("agent", "calendar"))
    a, c = agent.read_bytes(), calendar.read_bytes()
    agent.write_bytes(c)
    calendar.write_bytes(a.replace(b'"row":0,', b""))
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(
                p.server_name, p.kind, p.state_dir, records_digest(tmp_path / p.state_dir)
            )
            for p in record.participants
        ),
    )
    diffs, loaded = read_committed("gym-0", LIVE, tmp_path, record)
    assert sorted(loaded) == ["model_proxy", "tool"]
    assert len(diffs) == 2
    assert diffs[0].startswith(
        "instance gym-0: participant agent records unreadable (gym-0/agent/records.json: "
    )
    assert "extra fields found (retained) @ $" in diffs[0]
    assert diffs[1].startswith(
        "instance gym-0: participant calendar records unreadable (gym-0/calendar/records.json: "
    )


def test_a_tampered_file_is_a_digest_difference_before_it_is_read(tmp_path: Path) -> None:
    record = _commit(tmp_path)
    (tmp_path / "gym-0" / "tool" / RECORDS_FILE).write_bytes(b"{}")
    diffs, loaded = read_committed("gym-0", LIVE, tmp_path, record)
    assert len(diffs) == 1 and "participant tool digest" in diffs[0] and "tool" not in loaded


def typed_records(held: list[Any], kept: tuple[Any, ...], stranded: str | None) -> dict[str, Any]:
    """The records ``build`` writes, as the snapshot format's typed records (one object per
    session): what the columns must serialise to, byte for byte."""
    sessions = tuple(
        AgentSession(
            ep.rollout_id,
            ep.info.row,
            ep.info.slot,
            ep.info.attempt,
            None if ep.rollout_id == stranded else ep.turn,
            ep.sessions["agent"],
        )
        for ep in held
    )
    rids = tuple(ep.rollout_id for ep in held)

    def of(name: str) -> list[SessionRecord]:
        return [
            SessionRecord(ep.key, ep.rollout_id, ep.info.attempt, ep.sessions[name]) for ep in held
        ]

    calendar = sorted(
        [*of("calendar"), *(SessionRecord(k, r, a, s["calendar"]) for k, r, a, s in kept)],
        key=lambda s: s.key,
    )
    return {
        "agent": AgentRecords("agent", "simple_agent", "c7", sessions),
        "calendar": SessionRecords("calendar", "environment", "c7", rids, True, tuple(calendar)),
        "tool": SessionRecords("tool", "tool.x", "c7", (), False, tuple(of("tool"))),
        "model_proxy": StagedRecords(
            "model_proxy",
            "model_proxy",
            "c7",
            tuple(
                StagedEpisode(ep.rollout_id, tuple(StagedCall(*c) for c in ep.staged))
                for ep in held
            ),
        ),
    }


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_records_built_from_columns_are_the_typed_records_bytes(n: int) -> None:
    held = [
        episode(row, row % 3, {"r": [row, None]}, {"events": [row]}, tool=[row, "x"])
        for row in (4, 1, 7, 2, 9)[:n]
    ]
    for ep in held[::2]:
        ep.staged.append(S(f"{ep.key}:t1-c0", [1.5, {"k": None}]))
    kept = (
        ("3-0", "0-0-a2", 2, {"calendar": {"events": [3]}}),
        ("0-0", "9-0-a1", 1, {"calendar": None}),
    )
    stranded = held[1].rollout_id if n > 1 else None
    data, refused = build(held, kept, stranded)
    assert refused == []
    for server, record in typed_records(held, kept, stranded).items():
        assert data[server] == chunk_records(records_to_plain(record)), server
        assert load_records(inline(data[server]), RECORDS_FILE, type(record)) == record
