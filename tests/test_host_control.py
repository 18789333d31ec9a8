"""The host's control plane (``gym_adapter.host._control``): a restore reads the committed
participant records typed (``AgentRecords``, ``SessionRecords``, ``StagedRecords``) and either
installs everything (unclaimed episodes, kept retained sessions, the journal rewritten to the
committed data) or, on any difference, raises ``TopologyMismatch`` naming each and changes
nothing.

One real ``GymHost`` commits a snapshot (an episode completed and kept, one parked); a fresh
host restores it, after the test rewrote a participant's records (digest recomputed).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from plain_state import CountState, PlainState

from gymckpt.gym_adapter import Completed, Done, Environment, Failed, GymHost, HostConfig, RunRow
from gymckpt.gym_adapter._contract import CommitReply, GymControlError
from gymckpt.gym_adapter.host._episode import EpisodeInfo, call_id
from gymckpt.gym_adapter.host._episodes import request_digest
from gymckpt.gym_adapter.host._journal import replay_journal
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    records_digest,
)
from gymckpt.runtime._shared import (
    RECORDS_FILE,
    SessionRecords,
    dump_records,
    read_snapshot_records,
)


@attrs.define
class Cal(CountState):
    """A retained participant; ``broken``: its restore raises."""

    name: str = "cal"
    kind: str = "environment"
    retained: bool = True
    broken: bool = False

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


class Agent(PlainState):
    """Row 0 ends after one turn; any other row runs on (one turn a second)."""

    name, kind = "agent", "simple_agent"

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
            records = read_snapshot_records(root, p.state_dir, SessionRecords)
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


# -- the unaligned cut ---------------------------------------------------------------------------

UNALIGNED = CheckpointMode.UNALIGNED


@attrs.define
class Ledger:
    """A retained participant: a log of the turns that mutated it; ``fail_at``: its export
    raises once the log is that long (a mark at that boundary holds the problem)."""

    name: str = "ledger"
    kind: str = "environment"
    retained: bool = True
    fail_at: int | None = None

    def open(self, info: EpisodeInfo) -> Any:
        return []

    def export(self, state: Any) -> Any:
        if len(state) == self.fail_at:
            raise ValueError("ledger export broke")
        return list(state)

    def restore(self, data: Any) -> Any:
        return list(data)


class Talker:
    """Each turn (3 s): a model call (0.5 s), 1 s of work, the ledger mutation, a second model
    call (0.5 s), 1 s of work. Row r ends after 2 + r turns; ``hold`` rows call ``ctx.hold()``
    after turn 0. A ``spin`` row waits 4 s in turn 0, then plays 50 turns that never wait
    (from then on it is at a step boundary whenever another task runs), then ends."""

    name, kind = "agent", "simple_agent"

    def __init__(
        self, hold: frozenset[int] = frozenset(), spin: frozenset[int] = frozenset()
    ) -> None:
        self.hold, self.spin = hold, spin

    def open(self, info: EpisodeInfo) -> Any:
        return {"answers": []}

    def export(self, state: Any) -> Any:
        return state  # the live state itself: only a mark's serialisation keeps it apart

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Done | None:
        if ctx.info.row in self.spin:
            if ctx.turn == 0:
                await trio.sleep(4.0)
            return Done(0.0) if ctx.turn >= 50 else None
        state["answers"].append(await ctx.model({"turn": ctx.turn, "call": 0}))
        await trio.sleep(1.0)
        ctx.session("ledger").append(ctx.turn)
        state["answers"].append(await ctx.model({"turn": ctx.turn, "call": 1}))
        await trio.sleep(1.0)
        if ctx.turn == 0 and ctx.info.row in self.hold:
            ctx.hold()
        return Done(1.0, payload=state["answers"]) if ctx.turn + 1 >= 2 + ctx.info.row else None


@attrs.define
class SlowModel:
    """Answers after 0.5 s; ``asked``: every capture key it was asked, in order."""

    asked: list[str] = attrs.field(factory=list)

    async def __call__(self, key: str, request: Any, info: EpisodeInfo) -> Any:
        self.asked.append(key)
        await trio.sleep(0.5)
        return {"key": key}


def talking(
    model: SlowModel | None = None, *, ledger: Ledger | None = None, **kw: Any
) -> Environment:
    return Environment(
        agent=Talker(**kw), participants=(ledger or Ledger(),), model=model or SlowModel()
    )


def call_key(rid: str, turn: int, call: int) -> str:
    """The capture key of ``Talker``'s call ``call`` of ``turn``, asked by attempt ``rid``."""
    request = orjson.dumps({"call": call, "turn": turn})  # canonical: keys sorted
    return f"{rid}:{call_id(turn, request_digest(request), 0)}"


def staged_keys(row: int, upto: list[tuple[int, int]]) -> tuple[str, ...]:
    return tuple(call_key(f"{row}-0", t, c) for t, c in upto)


async def cut_at(host: GymHost, at: float, root: Path, checkpoint: str = "c1") -> CommitReply:
    """Prepare (unaligned) and commit at virtual time ``at``; the prepare takes no time."""
    await trio.sleep_until(at)
    prep = await host.prepare(checkpoint, deadline(), UNALIGNED)
    assert prep.parked == 0 and trio.current_time() == at
    return await host.commit(checkpoint, str(root), deadline())


async def test_a_cut_takes_an_episode_in_a_model_call_at_its_boundary_without_that_call(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with GymHost("gym-0", talking()) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("1-0", 1, 0, 0)])
        # turn 1 runs 3-6 s: its first call is done at 3.5, the mutation at 4.5, the second
        # call in progress from 4.5 to 5
        reply = await cut_at(host, start + 4.75, root)
        assert reply.mid_turn == 1 and reply.on_wire == ()
        [exported] = reply.exported
        assert exported.capture_keys == staged_keys(1, [(0, 0), (0, 1), (1, 0)])
        [session] = reply.sessions
        assert session.step_boundary == 1 and session.capture_keys == exported.capture_keys
        assert host.session_states("ledger")["1-0"].state == [0, 1]  # live: mutated in turn 1
        ledger = {s.rollout_id: s.state for s in read_sessions(root, "ledger")}
        assert ledger == {"1-0": [0]}  # the cut: as it was at boundary 1
        agent = read_snapshot_records(root, "gym-0/agent")
        assert [s.state for s in agent.sessions] == [
            {"answers": [{"key": call_key("1-0", 0, 0)}, {"key": call_key("1-0", 0, 1)}]}
        ]
        proxy = read_snapshot_records(root, "gym-0/model_proxy")
        assert [c.key for c in proxy.staged[0].calls] == list(exported.capture_keys)
        assert trio.current_time() == start + 4.75  # nothing waited for the turn
        await host.resume("c1", deadline())
        await stream.aclose()


def read_sessions(root: Path, name: str) -> Any:
    return read_snapshot_records(root, f"gym-0/{name}", SessionRecords).sessions


async def test_a_reply_after_the_cut_waits_for_the_resume(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", talking()) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)])
        reply = await cut_at(host, start + 4.75, tmp_path / "snap")
        assert sorted(e.rollout_id for e in reply.exported) == ["0-0", "1-0"]
        assert reply.mid_turn == 2
        got: list[tuple[float, str]] = []

        async def read() -> None:
            async for batch in stream:
                got.extend((trio.current_time() - start, r.rollout_id) for r in batch)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep_until(start + 20.0)  # 0-0 ended at 6 s, 1-0 at 9 s: both held
            assert got == [] and host.inventory().on_wire == ()
            assert host.inventory().running == ()
            await host.resume("c1", deadline())
        assert [rid for _, rid in got] == ["0-0", "1-0"]
        assert {t for t, _ in got} == {20.0}


async def test_the_lease_puts_the_replies_held_since_the_cut_on_the_wire(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", talking(), config=HostConfig(lease_s=30.0)) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await cut_at(host, start + 4.75, tmp_path / "snap")
        [batch] = [b async for b in stream]
        assert [r.rollout_id for r in batch] == ["0-0"]
        assert trio.current_time() - start == pytest.approx(4.75 + 30.0)  # the commit's lease
        assert host.inventory().lease_reopened == 1


async def test_a_second_commit_of_the_checkpoint_first_releases_what_the_first_held(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", talking()) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)])
        first = await cut_at(host, start + 4.75, tmp_path / "one")
        assert sorted(e.rollout_id for e in first.exported) == ["0-0", "1-0"]
        await trio.sleep_until(start + 6.5)  # 0-0 ended at 6 s, after the first cut
        assert host.inventory().on_wire == ()
        second = await host.commit("c1", str(tmp_path / "two"), deadline())
        assert second.on_wire == ("0-0",)  # before this cut: on the wire, drained
        assert [e.rollout_id for e in second.exported] == ["1-0"]
        assert second.sessions[0].step_boundary == 2 and second.mid_turn == 1
        batch = await stream.__anext__()
        assert [r.rollout_id for r in batch] == ["0-0"]
        assert trio.current_time() < start + 7.0  # delivered without a resume
        await host.resume("c1", deadline())
        assert [r.rollout_id for b in [b async for b in stream] for r in b] == ["1-0"]


async def test_an_episode_whose_mark_holds_a_problem_fails_as_data_its_reply_on_the_wire(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = talking(ledger=Ledger(fail_at=1))  # boundary 1 of every episode cannot be exported
    async with GymHost("gym-0", env) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("1-0", 1, 0, 0)])
        reply = await cut_at(host, start + 4.75, tmp_path / "snap")
        assert reply.exported == () and reply.sessions == () and reply.mid_turn == 0
        assert reply.on_wire == ("1-0",)
        [batch] = [b async for b in stream]  # it goes out before any resume: drained
        [failed] = batch
        assert isinstance(failed, Failed) and failed.failure_class == "data"
        assert failed.message == (
            "episode 1-0 (row 1 slot 0 attempt 0) on gym-0: exporting its ledger session "
            "state at step boundary 1 raised ValueError('ledger export broke')"
        )
        assert trio.current_time() == start + 4.75
        assert host.inventory().running == () and host.statistics().failed == 1
        await host.resume("c1", deadline())


async def test_an_environment_that_opts_out_is_parked_as_aligned_in_the_unaligned_mode(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = attrs.evolve(talking(), unaligned=False)
    async with GymHost("gym-0", env) as host:
        start = trio.current_time()
        stream = await host.run([RunRow("1-0", 1, 0, 0)])
        await trio.sleep_until(start + 4.75)
        prep = await host.prepare("c1", deadline(), UNALIGNED)
        assert prep.parked == 1 and trio.current_time() == start + 6.0  # turn 1 ended
        reply = await host.commit("c1", str(tmp_path / "snap"), deadline())
        assert reply.mid_turn == 0 and reply.sessions[0].step_boundary == 2
        assert reply.exported[0].capture_keys == staged_keys(1, [(0, 0), (0, 1), (1, 0), (1, 1)])
        await host.resume("c1", deadline())
        await stream.aclose()


async def test_mid_turn_counts_the_episodes_taken_inside_a_turn(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", talking(spin=frozenset({9}))) as host:
        start = trio.current_time()
        rows = [RunRow(f"{r}-0", r, 0, 0) for r in (0, 1, 2, 9)]
        stream = await host.run(rows)
        aligned = await host.prepare("c0", deadline())
        assert aligned.parked == 4
        assert (await host.commit("c0", str(tmp_path / "c0"), deadline())).mid_turn == 0
        await host.resume("c0", deadline())
        reply = await cut_at(host, start + 4.0, tmp_path / "c1")  # 9-0 spins from 4 s on
        assert reply.mid_turn == 3 and len(reply.exported) == 4
        boundary = {s.rollout_id: s.step_boundary for s in reply.sessions}
        assert boundary["1-0"] == 1 and 1 < boundary["9-0"] < 50
        await host.resume("c1", deadline())
        await stream.aclose()


async def test_an_attempt_fenced_inside_its_turn_is_not_taken_by_the_cut(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with GymHost("gym-0", talking()) as host:
        start = trio.current_time()
        old = await host.run([RunRow("1-0", 1, 0, 0)])
        await trio.sleep_until(start + 1.0)  # attempt 0 is inside turn 0
        new = await host.run([RunRow("1-0-a1", 1, 0, 1)])  # takes the slot; 0 runs on, fenced
        reply = await cut_at(host, start + 1.25, root)
        assert [e.rollout_id for e in reply.exported] == ["1-0-a1"]
        assert [s.rollout_id for s in reply.sessions] == ["1-0-a1"] and reply.mid_turn == 1
        assert [s.rollout_id for s in read_sessions(root, "ledger")] == ["1-0-a1"]
        await host.resume("c1", deadline())
        assert [b async for b in old] == []
        assert [r.rollout_id for b in [b async for b in new] for r in b] == ["1-0-a1"]


async def test_a_restored_mid_turn_episode_replays_its_turn_asking_only_the_call_in_progress(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with GymHost("gym-0", talking()) as host:
        start = trio.current_time()
        await host.run([RunRow("1-0", 1, 0, 0)])
        reply = await cut_at(host, start + 4.75, root)  # turn 1's second call in progress
    record, episodes = manifest_parts(reply)
    model = SlowModel()
    async with GymHost("gym-0", talking(model), work_dir=tmp_path / "work") as host:
        await host.restore(str(root), record, episodes, deadline())
        stream = await host.run([RunRow("1-0-a1", 1, 0, 1, "1-0")])
        [[done]] = [b async for b in stream]
        assert isinstance(done, Completed) and done.turns == 3
        # the first three calls were answered before the cut, to attempt 0 (their keys name it);
        # the rest are attempt 1's
        keys = [call_key("1-0", t, c) for t, c in [(0, 0), (0, 1), (1, 0)]]
        keys += [call_key("1-0-a1", t, c) for t, c in [(1, 1), (2, 0), (2, 1)]]
        assert done.payload == [{"key": k} for k in keys]
        assert (
            model.asked == keys[3:]
        )  # turn 1's call 1: asked again, by the attempt that restores it
        stats = host.statistics()
        assert (stats.model_replays, stats.model_calls) == (1, 3)  # t1/c0 from the capture
        assert host.session_states("ledger")["1-0"].state == [0, 1, 2]  # each mutation once


# -- a commit the lease overtakes ------------------------------------------------------------------


class Slow:
    """A retained participant whose ``export`` in a worker thread (a commit's) says it started
    and then waits until the test lets it go."""

    name, kind, retained = "slow", "environment", True

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()

    def open(self, info: EpisodeInfo) -> Any:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            self.started.set()
            assert self.go.wait(30.0), "the test never let the export go"
        return dict(state)

    def restore(self, data: Any) -> Any:
        return dict(data)


class Quick(PlainState):
    """Turns of 10 ms; row 0 ends after one, every other row runs on."""

    name, kind = "agent", "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await trio.sleep(0.01)
        return Done(1.0) if ctx.info.row == 0 else None


@pytest.mark.parametrize("mode", list(CheckpointMode), ids=lambda m: m.value)
async def test_a_commit_the_lease_overtakes_fails_instead_of_answering(
    tmp_path: Path, mode: CheckpointMode
) -> None:
    """Real time (the export runs in a worker thread): the lease (0.2 s) runs out while the
    commit's thread exports a kept session, which waits until the lease has reopened the
    instance; the commit must not report records that are no cut of the instance."""
    slow = Slow()
    env = Environment(agent=Quick(), participants=(slow,))
    async with GymHost("gym-0", env, config=HostConfig(lease_s=0.2)) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)])
        assert [r.rollout_id for r in await stream.__anext__()] == ["0-0"]  # kept: its slot
        await host.prepare("c1", trio.current_time() + 10, mode)
        async with trio.open_nursery() as nursery:

            async def commit() -> None:
                with pytest.raises(GymControlError, match="checkpoint c1 reopened while it was"):
                    await host.commit("c1", str(tmp_path / "snap"), trio.current_time() + 10)

            nursery.start_soon(commit)
            assert await trio.to_thread.run_sync(slow.started.wait, 10.0)
            with trio.fail_after(10.0):
                # the lease has no event of its own to wait on: its timer runs on this loop
                while host.inventory().prepared:  # noqa: ASYNC110 - bounded by fail_after
                    await trio.sleep(0.01)
            slow.go.set()
        inv = host.inventory()
        assert inv.lease_reopened == 1 and not inv.prepared and host.statistics().commits == 0
        await stream.aclose()
