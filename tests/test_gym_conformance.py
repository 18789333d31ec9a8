"""Conformance suite for the Gym contract (``gym_adapter._contract.GymBackend``).

Every test runs against each backend factory in ``BACKENDS`` under trio's autojump clock, so
timings are virtual and exact. A test that checkpoints takes the ``mode`` fixture and runs in
both ``CheckpointMode``s (on Ray and HTTP the unaligned mode only in the cases
``REAL_TIME_UNALIGNED`` names: their time is real time); the ``unaligned`` section holds the
cases of that mode alone. A factory
is called like ``open_embedded`` (keyword arguments ``instances``, ``agent_kinds``, ``seed``,
``work_dir``, ``config``, ``faults``: the calendar workplace on the deployment's own
constructor) and yields a backend that also offers
``session_states(instance, participant)`` or ``retained_sessions(instance)`` (the calendar's
sessions are read through it, ``calendar_sessions_of``) and ``statistics()``. Adding the Ray
deployment is one line in ``BACKENDS``, and so is the HTTP one (``gymckpt serve`` processes,
real time like Ray).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    ADMISSION_CLOSED,
    CommitReply,
    Completed,
    EmbeddedGym,
    EnvironmentRef,
    EpisodeInfo,
    Failed,
    GymControlError,
    GymInstanceDead,
    Refused,
    ReplyStream,
    RunReply,
    RunRow,
    can_replace,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    EpisodePlan,
    calendar_environment,
    calendar_sessions_of,
    plan_episode,
    sentinel,
)
from gymckpt.gym_adapter.host._episodes import capture_key as host_capture_key
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    GymCheckpointUnavailable,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    records_digest,
    rollout_id_for,
)
from gymckpt.runtime._shared import (
    RECORDS_FILE,
    SessionRecords,
    read_snapshot_records,
)

Factory = Callable[..., AbstractAsyncContextManager[Any]]

BACKENDS = [
    pytest.param(lambda **kw: open_embedded(**kw), id="embedded"),
    pytest.param(
        lambda **kw: __import__("test_ray_backend").open_for_conformance(**kw),
        id="ray",
        marks=pytest.mark.ray,
    ),  # imports Ray only when a ray test runs
    pytest.param(
        lambda **kw: __import__("test_http_backend").open_for_conformance(**kw),
        id="http",
        marks=pytest.mark.http,
    ),  # real gymckpt serve processes
]

SEED = 7
FAST = CalendarConfig(turns=(2, 5), turn_s=(0.01, 0.05), mutation_p=1.0)
ALIGNED, UNALIGNED = CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED

REAL_TIME_UNALIGNED = frozenset(
    {
        "test_restore_and_claim_continue_each_episode_once",
        "test_unaligned_prepare_parks_nothing_and_each_instance_takes_its_own_cut",
        "test_unaligned_replies_after_the_cut_wait_for_the_resume",
    }
)
"""The tests that run unaligned on Ray and HTTP too (every other one runs unaligned embedded
only)."""


@pytest.fixture(params=BACKENDS)
def open_gym(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    factory: Factory = request.param

    def opener(**kwargs: Any) -> AbstractAsyncContextManager[Any]:
        kwargs.setdefault("seed", SEED)
        kwargs.setdefault("work_dir", tmp_path)
        kwargs.setdefault("config", FAST)
        return factory(**kwargs)

    return opener


@pytest.fixture(params=[ALIGNED, UNALIGNED], ids=["aligned", "unaligned"])
def mode(request: pytest.FixtureRequest) -> CheckpointMode:
    """The checkpoint mode of a test that checkpoints (both, see the module docstring)."""
    chosen: CheckpointMode = request.param
    if chosen is UNALIGNED:
        _unaligned_here(request)
    return chosen


@pytest.fixture
def unaligned(request: pytest.FixtureRequest) -> CheckpointMode:
    """``UNALIGNED``, for a case of that mode alone (skipped on Ray and HTTP unless
    ``REAL_TIME_UNALIGNED``)."""
    _unaligned_here(request)
    return UNALIGNED


def _unaligned_here(request: pytest.FixtureRequest) -> None:
    node = request.node
    ids = node.callspec.id.split("-")
    if {"ray", "http"} & set(ids) and node.originalname not in REAL_TIME_UNALIGNED:
        pytest.skip("real time: unaligned only in the REAL_TIME_UNALIGNED cases (CI time)")


# -- helpers -------------------------------------------------------------------------------


def deadline(seconds: float = 5.0) -> float:
    return trio.current_time() + seconds


def make_rows(n: int, *, attempt: int = 0, start: int = 0, slot: int = 0) -> list[RunRow]:
    return [
        RunRow(rollout_id_for(r, slot, attempt), r, slot, attempt) for r in range(start, start + n)
    ]


def plan_of(row: int, slot: int = 0, config: CalendarConfig = FAST) -> EpisodePlan:
    return plan_episode(SEED, row, slot, config)


def agent_kinds_of(instances: int, agent_kinds: str | Sequence[str]) -> list[str]:
    """The agent kind of each instance: one for all, or one each."""
    return [agent_kinds] * instances if isinstance(agent_kinds, str) else list(agent_kinds)


def open_embedded(
    *,
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    seed: int = 0,
    work_dir: Path | None = None,
    config: CalendarConfig | None = None,
    faults: Sequence[str] = (),
) -> AbstractAsyncContextManager[Any]:
    """The calendar workplace on ``EmbeddedGym.host``, one agent kind per instance."""
    cfg = config if config is not None else CalendarConfig()
    environments = [
        EnvironmentRef.to(calendar_environment, agent_kind=kind, config=cfg)
        for kind in agent_kinds_of(instances, agent_kinds)
    ]
    return EmbeddedGym.host(environments, instances, seed, work_dir, cfg.host_config(), faults)


def key_of(row: int, slot: int, turn: int, config: CalendarConfig = FAST) -> str:
    """The capture key of turn ``turn``'s model call of slot ``row``-``slot`` (attempt 0): the
    host's key of the call of the turn's plan payload."""
    request = plan_of(row, slot, config).payloads[turn]
    info = EpisodeInfo(rollout_id_for(row, slot, 0), row, slot, 0, 0, "")
    return host_capture_key(info, turn, hashlib.sha256(orjson.dumps(request)).hexdigest(), 0)


async def drain(stream: ReplyStream) -> list[RunReply]:
    replies: list[RunReply] = []
    async for batch in stream:
        replies.extend(batch)
    return replies


async def timed_batches(stream: ReplyStream) -> list[tuple[float, tuple[RunReply, ...]]]:
    start = trio.current_time()
    return [(trio.current_time() - start, tuple(batch)) async for batch in stream]


def expected_sentinels(row: int, slot: int = 0, config: CalendarConfig = FAST) -> list[str]:
    plan = plan_of(row, slot, config)
    return [sentinel(row, slot, t) for t in range(plan.turns) if plan.mutates[t]]


def manifest_parts(
    reply: CommitReply, prefix: str = ""
) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    record = InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, prefix + p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, reply.instance, e.capture_keys) for e in reply.exported
    ]
    exported = {e.rollout_id for e in reply.exported}
    episodes += [  # a legacy agent session owns what no participant exported (S10)
        EpisodeRecord(s.rollout_id, s.participant, reply.instance, s.capture_keys)
        for s in reply.sessions
        if s.rollout_id not in exported and s.kind == "legacy_agent" and s.step_boundary is not None
    ]
    return record, episodes


def read_records(root: Path, state_dir: str) -> Any:
    """A participant's committed records, typed (``AgentRecords``, ``SessionRecords``,
    ``StagedRecords`` by the role its keys say)."""
    return read_snapshot_records(root, state_dir)


@asynccontextmanager
async def checkpointed(
    open_gym: Factory,
    root: Path,
    *,
    rows: int = 4,
    park_after: float = 0.06,
    mode: CheckpointMode = ALIGNED,
    **kw: Any,
) -> AsyncIterator[tuple[CommitReply, Any]]:
    """Run ``rows`` episodes, checkpoint them in ``mode`` after ``park_after`` virtual seconds,
    commit to ``root``; yield (commit reply, gym) with the gym still prepared."""
    async with open_gym(**kw) as gym:
        stream = await gym.run("gym-0", make_rows(rows))
        await trio.sleep(park_after)
        await gym.prepare("gym-0", "ckpt-1", deadline(), mode)
        reply = await gym.commit("gym-0", "ckpt-1", str(root), deadline())
        yield reply, gym
        await stream.aclose()


# -- data plane ----------------------------------------------------------------------------


async def test_run_completes_every_row_once(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        stream = await gym.run("gym-0", make_rows(6))
        assert isinstance(stream, ReplyStream)
        replies = await drain(stream)
        assert sorted(r.rollout_id for r in replies) == [f"{r}-0" for r in range(6)]
        for r in replies:
            assert isinstance(r, Completed)
            plan = plan_of(int(r.rollout_id.split("-")[0]))
            assert (r.turns, r.reward) == (plan.turns, plan.reward)
        inv = await gym.inventory("gym-0")
        assert inv.running == inv.parked == inv.on_wire == ()
        assert inv.admission_open and not inv.prepared
        state = await calendar_sessions_of(gym, "gym-0")
        for row in range(6):
            assert list(state[f"{row}-0"].sentinels) == expected_sentinels(row)
        await stream.aclose()
        await stream.aclose()  # idempotent


async def test_replies_are_batched_per_flush_interval_and_max_batch(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    config = CalendarConfig(turns=(1, 1), turn_s=(0.01, 0.01), mutation_p=0.0, max_batch=4)
    async with open_gym(config=config) as gym:
        stream = await gym.run("gym-0", make_rows(10))
        batches = await timed_batches(stream)
    # all ten finish at t=0.01: full batches go at once, the rest when every row has replied
    assert [len(b) for _, b in batches] == [4, 4, 2]
    assert all(t == pytest.approx(0.01) for t, _ in batches)


async def test_on_wire_until_the_consumer_asks_for_the_next_batch(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, mode: CheckpointMode
) -> None:
    async with open_gym() as gym:
        stream = await gym.run("gym-0", make_rows(4))
        first = await stream.__anext__()
        ids = {r.rollout_id for r in first}
        inv = await gym.inventory("gym-0")
        assert ids <= set(inv.on_wire)
        prep = await gym.prepare("gym-0", "c", deadline(), mode)
        # never fewer than the inventory listed (nothing left the wire unasked); on Ray, in
        # real time, another row may have replied between the two calls
        assert prep.on_wire >= len(inv.on_wire)
        reply = await gym.commit("gym-0", "c", "state", deadline())
        assert ids <= set(reply.on_wire)
        assert not ids & {e.rollout_id for e in reply.exported}
        await gym.resume("gym-0", "c", deadline())
        second = await stream.__anext__()  # acknowledges ``first``
        inv = await gym.inventory("gym-0")
        assert not ids & set(inv.on_wire)
        assert {r.rollout_id for r in second} <= set(inv.on_wire)
        await drain(stream)
        assert (await gym.inventory("gym-0")).on_wire == ()


async def test_aclose_leaves_rows_running_and_clears_the_wire(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        stream = await gym.run("gym-0", make_rows(4))
        await stream.__anext__()
        await stream.aclose()
        # The 3 other rows keep running: each is running or (on Ray, in real time) has
        # completed meanwhile, its reply discarded. Completions counted before and after the
        # inventory bound it; under virtual time (embedded) both are 1 and all 3 run.
        before = (await gym.statistics()).instances[0].completed
        inv = await gym.inventory("gym-0")
        after = (await gym.statistics()).instances[0].completed
        assert inv.on_wire == ()
        assert len(inv.running) + before - 1 <= 3 <= len(inv.running) + after - 1, (
            inv,
            before,
            after,
        )
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        await trio.sleep(1)
        inv = await gym.inventory("gym-0")
        assert inv.running == inv.on_wire == ()
        assert (await gym.statistics()).instances[0].completed == 4


# -- admission and parking -------------------------------------------------------------------


async def test_admission_refused_while_prepared_and_stream_goes_on(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        first = await gym.run("gym-0", make_rows(3))
        await trio.sleep(0.02)
        await gym.prepare("gym-0", "c", deadline())
        late_rows = make_rows(3, start=10)
        late = await gym.run("gym-0", late_rows)
        refused = await drain(late)
        assert refused == [Refused(r.rollout_id, ADMISSION_CLOSED) for r in late_rows]
        inv = await gym.inventory("gym-0")
        assert not inv.admission_open
        assert sorted(inv.parked) == ["0-0", "1-0", "2-0"]
        await gym.resume("gym-0", "c", deadline())
        # the first stream was never interrupted; the refused rows go again with their identity
        again = await gym.run("gym-0", late_rows)
        assert sorted(r.rollout_id for r in await drain(first)) == ["0-0", "1-0", "2-0"]
        done = await drain(again)
        assert sorted(r.rollout_id for r in done) == [r.rollout_id for r in late_rows]
        assert all(isinstance(r, Completed) for r in done)
        assert (await gym.statistics()).instances[0].refused_rows == 3


async def test_nothing_progresses_while_prepared(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        stream = await gym.run("gym-0", make_rows(5))
        await trio.sleep(0.03)
        prep = await gym.prepare("gym-0", "c", deadline())
        inv = await gym.inventory("gym-0")
        assert inv.running == ()
        assert prep.parked == len(inv.parked) == 5
        before_state = await calendar_sessions_of(gym, "gym-0")
        before = (await gym.statistics()).instances[0]
        with trio.move_on_after(20) as scope:
            await stream.__anext__()
        assert scope.cancelled_caught
        assert await calendar_sessions_of(gym, "gym-0") == before_state
        after = (await gym.statistics()).instances[0]
        assert (after.model_calls, after.counters.get("mutations"), after.completed) == (
            before.model_calls,
            before.counters.get("mutations"),
            before.completed,
        )
        await gym.resume("gym-0", "c", deadline())
        assert len(await drain(stream)) == 5


async def test_prepare_parks_at_the_next_step_boundary(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        await gym.run("gym-0", make_rows(1))
        plan = plan_of(0)
        await trio.sleep(plan.durations[0] / 2)  # in the middle of turn 0
        t0 = trio.current_time()
        await gym.prepare("gym-0", "c", deadline())
        # prepare returned exactly when turn 0 ended, after its mutation
        assert trio.current_time() - t0 == pytest.approx(plan.durations[0] / 2)
        sessions = await calendar_sessions_of(gym, "gym-0")
        assert list(sessions["0-0"].sentinels) == [sentinel(0, 0, 0)]
        reply = await gym.commit("gym-0", "c", "s", deadline())
        assert reply.sessions[0].step_boundary == 1
        assert reply.exported[0].capture_keys == (key_of(0, 0, 0),)


async def test_prepare_past_its_deadline_times_out_naming_the_instance(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(config=CalendarConfig(turn_s=(5.0, 5.0))) as gym:
        await gym.run("gym-0", make_rows(2))
        await trio.sleep(0.1)
        with pytest.raises(GymCallTimeout, match="gym-0"):
            await gym.prepare("gym-0", "c", deadline(1.0))
        with pytest.raises(GymControlError, match="have not parked"):
            await gym.commit("gym-0", "c", "s", deadline())
        await gym.resume("gym-0", "c", deadline())
        assert (await gym.inventory("gym-0")).admission_open


async def test_control_calls_past_their_deadline_time_out(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        past = trio.current_time() - 1
        calls = [
            gym.prepare("gym-0", "c", past),
            gym.commit("gym-0", "c", "s", past),
            gym.resume("gym-0", "c", past),
            gym.retire("gym-0", ["x"], past),
            gym.retire_restored("gym-0", ["x"], past),
        ]
        for call in calls:
            with pytest.raises(GymCallTimeout, match="gym-0"):
                await call
        assert (await gym.inventory("gym-0")).admission_open


# -- commit ------------------------------------------------------------------------------------


async def test_commit_writes_records_whose_digests_match(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, mode=mode) as (reply, _gym):
        assert [(p.server_name, p.kind) for p in reply.participants] == [
            ("agent", "simple_agent"),
            ("calendar", "environment"),
            ("model_proxy", "model_proxy"),
        ]
        for p in reply.participants:
            assert p.state_dir == f"gym-0/{p.server_name}"
            assert p.records_digest == records_digest(root / p.state_dir)
        exported = {e.rollout_id: e for e in reply.exported}
        assert sorted(exported) == ["0-0", "1-0", "2-0", "3-0"]
        assert all(e.owner == "calendar" for e in exported.values())
        calendar = read_records(root, "gym-0/calendar")
        assert isinstance(calendar, SessionRecords)
        assert sorted(calendar.exported) == sorted(exported)
        agent = {s.rollout_id: s for s in read_records(root, "gym-0/agent").sessions}
        proxy = {s.rollout_id: s for s in read_records(root, "gym-0/model_proxy").staged}
        sessions = {s.rollout_id: s for s in reply.sessions}
        for rid, e in exported.items():
            row = int(rid.split("-")[0])
            boundary = agent[rid].step_boundary
            assert boundary == sessions[rid].step_boundary and boundary >= 1
            # unaligned, an episode inside turn ``boundary`` has made that turn's call already
            turns = boundary + (mode is UNALIGNED and boundary < plan_of(row).turns)
            assert e.capture_keys == tuple(key_of(row, 0, t) for t in range(turns))
            assert tuple(c.key for c in proxy[rid].calls) == e.capture_keys
        events = {s.key: [ev["sentinel"] for ev in s.state["events"]] for s in calendar.sessions}
        state = await calendar_sessions_of(_gym, "gym-0")
        assert events == {k: list(s.sentinels) for k, s in state.items()}


async def test_commit_needs_a_prepare_of_the_same_checkpoint(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, mode: CheckpointMode
) -> None:
    async with open_gym() as gym:
        with pytest.raises(GymControlError, match="not prepared"):
            await gym.commit("gym-0", "c", "s", deadline())
        await gym.prepare("gym-0", "c", deadline(), mode)
        with pytest.raises(GymControlError, match="checkpoint other is not prepared"):
            await gym.commit("gym-0", "other", "s", deadline())
        with pytest.raises(GymControlError, match="checkpoint c is open, not other"):
            await gym.resume("gym-0", "other", deadline())
        await gym.resume("gym-0", "c", deadline())
        await gym.resume("gym-0", "c", deadline())  # idempotent


async def test_legacy_agent_sessions_own_their_episodes(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, agent_kinds="legacy_agent", mode=mode) as (
        reply,
        _gym,
    ):
        assert reply.participants[0].kind == "legacy_agent"
        assert reply.exported == ()  # only the agent session holds a legacy episode
        assert {s.kind for s in reply.sessions} == {"legacy_agent"}
        assert all(s.capture_keys for s in reply.sessions)
        assert all(s.step_boundary is not None for s in reply.sessions)
        assert read_records(root, "gym-0/calendar").exported == ()


async def test_stranded_legacy_session_has_no_boundary_and_no_owner(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    config = CalendarConfig(mutation_p=1.0, strand_legacy_session=True)
    async with checkpointed(
        open_gym, tmp_path / "snap", agent_kinds="legacy_agent", config=config, mode=mode
    ) as (reply, _gym):
        stranded = [s.rollout_id for s in reply.sessions if s.step_boundary is None]
        assert stranded == ["0-0"]
        assert reply.exported == ()
        assert len(reply.sessions) == 4


# -- unaligned -----------------------------------------------------------------------------------

LONG = CalendarConfig(turns=(2, 2), turn_s=(2.0, 2.0), mutation_p=1.0)
"""Turns long enough (2 s; 10 s on Ray) that every checkpoint lands inside one."""


async def test_unaligned_prepare_parks_nothing_and_each_instance_takes_its_own_cut(
    open_gym: Factory,
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    unaligned: CheckpointMode,
) -> None:
    root = tmp_path / "snap"
    async with open_gym(instances=2, config=LONG) as gym:
        streams = [
            await gym.run("gym-0", make_rows(3)),
            await gym.run("gym-1", make_rows(2, start=10)),
        ]
        await trio.sleep(0.5)  # every episode inside turn 0, its model call made
        t0 = trio.current_time()
        for name, n in (("gym-0", 3), ("gym-1", 2)):
            prep = await gym.prepare(name, "c", deadline(), unaligned)
            assert prep.parked == 0
            inv = await gym.inventory(name)
            assert len(inv.running) == n and inv.parked == () and not inv.admission_open
        assert trio.current_time() - t0 < 1.0  # returned while every turn was in flight
        for name, rows in (("gym-0", range(3)), ("gym-1", range(10, 12))):
            reply = await gym.commit(name, "c", str(root), deadline())
            assert reply.mid_turn == len(rows)
            assert sorted(e.rollout_id for e in reply.exported) == [f"{r}-0" for r in rows]
            for e in reply.exported:  # at boundary 0, with turn 0's call
                assert e.capture_keys == (key_of(int(e.rollout_id.split("-")[0]), 0, 0, LONG),)
            assert {s.step_boundary for s in reply.sessions} == {0}
            calendar = read_records(root, f"{name}/calendar")
            assert {s.rollout_id: s.state["events"] for s in calendar.sessions} == {
                f"{r}-0": [] for r in rows
            }
        assert trio.current_time() - t0 < 1.0
        for name in ("gym-0", "gym-1"):
            await gym.resume(name, "c", deadline())
        for stream in streams:
            await stream.aclose()


async def test_unaligned_replies_after_the_cut_wait_for_the_resume(
    open_gym: Factory,
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    unaligned: CheckpointMode,
) -> None:
    config = CalendarConfig(turns=(1, 1), turn_s=(0.2, 0.2), mutation_p=1.0)  # 1 s on Ray
    async with open_gym(config=config) as gym:
        stream = await gym.run("gym-0", make_rows(3))
        await trio.sleep(0.1)  # every episode inside its one turn (0.2 s; 1 s on Ray)
        await gym.prepare("gym-0", "c", deadline(), unaligned)
        reply = await gym.commit("gym-0", "c", str(tmp_path / "snap"), deadline())
        assert reply.on_wire == () and reply.mid_turn == 3
        got: list[RunReply] = []

        async def read() -> None:
            got.extend(await drain(stream))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            with trio.fail_after(20):  # every episode ends after the cut (a condition, polled)
                while True:
                    if (await gym.statistics()).instances[0].completed == 3:
                        break
                    await trio.sleep(0.05)
            await trio.sleep(0.5)  # some flush intervals: nothing goes out
            inv = await gym.inventory("gym-0")
            assert got == [] and inv.running == () and inv.on_wire == ()
            assert await calendar_sessions_of(gym, "gym-0") != {}
            await gym.resume("gym-0", "c", deadline())
        assert sorted(r.rollout_id for r in got) == ["0-0", "1-0", "2-0"]
        assert all(isinstance(r, Completed) for r in got)


async def test_unaligned_restore_replays_a_mid_turn_episode_from_its_boundary(
    open_gym: Factory,
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    unaligned: CheckpointMode,
) -> None:
    """Taken inside turn 1 (its call made, its mutation not yet): the restored attempt plays
    turn 1 again from boundary 1, its call answered from the capture, the mutation once."""
    root = tmp_path / "snap"
    plan = plan_of(0, config=LONG)
    async with open_gym(config=LONG) as gym:
        await gym.run("gym-0", make_rows(1))
        await trio.sleep(plan.durations[0] + 0.5)
        await gym.prepare("gym-0", "c", deadline(), unaligned)
        reply = await gym.commit("gym-0", "c", str(root), deadline())
        assert (reply.mid_turn, reply.sessions[0].step_boundary) == (1, 1)
        assert reply.exported[0].capture_keys == (key_of(0, 0, 0, LONG), key_of(0, 0, 1, LONG))
        live = await calendar_sessions_of(gym, "gym-0")
        assert list(live["0-0"].sentinels) == [sentinel(0, 0, 0)]
    record, episodes = manifest_parts(reply)
    async with open_gym(config=LONG) as gym:
        await gym.restore("gym-0", str(root), record, episodes, deadline())
        claim = RunRow("0-0-a1", 0, 0, 1, "0-0")
        [done] = await drain(await gym.run("gym-0", [claim]))
        assert isinstance(done, Completed) and done.turns == 2
        stats = (await gym.statistics()).instances[0]
        assert (stats.model_replays, stats.model_calls) == (1, 0)  # t1's call: the capture
        session = (await calendar_sessions_of(gym, "gym-0"))["0-0"]
        assert list(session.sentinels) == [sentinel(0, 0, 0), sentinel(0, 0, 1)]  # once each
        assert stats.counters["mutations"] == 1  # turn 1's, in the restored world


# -- retire and lease ----------------------------------------------------------------------------


async def test_retire_refused_while_prepared_then_accepted(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, mode: CheckpointMode
) -> None:
    async with open_gym() as gym:
        stream = await gym.run("gym-0", make_rows(3))
        await trio.sleep(0.02)
        await gym.prepare("gym-0", "c", deadline(), mode)
        with pytest.raises(GymControlError, match="checkpoint c is open"):
            await gym.retire("gym-0", ["1-0"], deadline())
        with pytest.raises(GymControlError, match="checkpoint c is open"):
            await gym.retire_restored("gym-0", ["1-0"], deadline())
        await gym.resume("gym-0", "c", deadline())
        reply = await gym.retire("gym-0", ["1-0", "nope"], deadline())
        assert (reply.retired, reply.unknown) == (("1-0",), ("nope",))
        assert "1-0" not in await calendar_sessions_of(gym, "gym-0")
        replies = await drain(stream)  # the stream ends without the retired row
        assert sorted(r.rollout_id for r in replies) == ["0-0", "2-0"]
        again = await gym.retire("gym-0", ["1-0", "0-0"], deadline())
        assert again.retired == ("0-0",) and again.unknown == ("1-0",)
        assert "0-0" not in await calendar_sessions_of(gym, "gym-0")


async def test_lease_reopens_when_no_resume_arrives(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(config=CalendarConfig(mutation_p=1.0, lease_s=2.0)) as gym:
        stream = await gym.run("gym-0", make_rows(3))
        await trio.sleep(0.02)
        await gym.prepare("gym-0", "c", deadline())
        t0 = trio.current_time()
        replies = await drain(stream)  # only possible once the lease reopens
        assert trio.current_time() - t0 > 2.0
        assert len(replies) == 3
        inv = await gym.inventory("gym-0")
        assert inv.admission_open and not inv.prepared and inv.lease_reopened == 1
        await gym.resume("gym-0", "c", deadline())  # a late resume is harmless
        with pytest.raises(GymControlError, match="not prepared"):
            await gym.commit("gym-0", "c", "s", deadline())


async def test_commit_renews_the_lease(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, mode: CheckpointMode
) -> None:
    async with open_gym(config=CalendarConfig(lease_s=2.0)) as gym:
        await gym.prepare("gym-0", "c", deadline(), mode)
        await trio.sleep(1.5)
        await gym.commit("gym-0", "c", "s", deadline())
        await trio.sleep(1.5)
        assert (await gym.inventory("gym-0")).prepared
        await trio.sleep(1.0)
        assert (await gym.inventory("gym-0")).lease_reopened == 1


# -- restore -----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent_kind", ["simple_agent", "legacy_agent"])
async def test_restore_and_claim_continue_each_episode_once(
    open_gym: Factory,
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    agent_kind: str,
    mode: CheckpointMode,
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, agent_kinds=agent_kind, mode=mode) as (reply, _gym):
        live = await calendar_sessions_of(_gym, "gym-0")
    # what the calendar committed (unaligned on Ray, the live sessions move on after the cut)
    committed_state = {
        s.key: tuple(e["sentinel"] for e in s.state["events"])
        for s in read_records(root, "gym-0/calendar").sessions
    }
    if mode is ALIGNED:  # nothing moved since the commit
        assert committed_state == {k: v.sentinels for k, v in live.items()}
    record, episodes = manifest_parts(reply)
    assert {e.owner for e in episodes} == {"agent" if agent_kind == "legacy_agent" else "calendar"}
    async with open_gym(agent_kinds=agent_kind) as gym:
        restored = await gym.restore("gym-0", str(root), record, episodes, deadline())
        ids = sorted(e.rollout_id for e in episodes)
        assert sorted(restored.restored) == ids
        inv = await gym.inventory("gym-0")
        assert sorted(inv.unclaimed) == ids and inv.running == ()
        restored_state = await calendar_sessions_of(gym, "gym-0")
        assert {k: v.sentinels for k, v in restored_state.items()} == committed_state
        claims = [
            RunRow(rollout_id_for(int(rid.split("-")[0]), 0, 1), int(rid.split("-")[0]), 0, 1, rid)
            for rid in ids
        ]
        replies = await drain(await gym.run("gym-0", claims))
        assert sorted(r.rollout_id for r in replies) == sorted(c.rollout_id for c in claims)
        for r in replies:
            assert isinstance(r, Completed), r
            assert r.turns == plan_of(int(r.rollout_id.split("-")[0])).turns
        state = await calendar_sessions_of(gym, "gym-0")
        for claim in claims:
            session = state[f"{claim.row}-0"]
            assert (session.rollout_id, session.attempt) == (claim.rollout_id, 1)
            assert list(session.sentinels) == expected_sentinels(claim.row)  # each exactly once
        assert (await gym.inventory("gym-0")).unclaimed == ()
        # each turn's model call once: a call captured inside the turn a restored episode
        # replays (unaligned) is answered from the capture, every later one asked
        boundary = {s.rollout_id: s.step_boundary for s in reply.sessions}
        keys = {e.rollout_id: len(e.capture_keys) for e in episodes}
        stats = (await gym.statistics()).instances[0]
        assert stats.model_replays == sum(keys[rid] - boundary[rid] for rid in ids)
        assert stats.model_calls == sum(
            plan_of(int(rid.split("-")[0])).turns - keys[rid] for rid in ids
        )
        assert reply.mid_turn == sum(keys[rid] > boundary[rid] for rid in ids)
        assert (reply.mid_turn > 0) == (mode is UNALIGNED)
        # a restored episode is claimed once
        twice = await drain(await gym.run("gym-0", claims[:1]))
        assert isinstance(twice[0], Failed) and twice[0].failure_class == "data"
        assert "no unclaimed restored episode" in twice[0].message


async def test_claims_go_to_the_original_replica_as_attempt_plus_one(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=1) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    async with open_gym(instances=2) as gym:
        await gym.restore("gym-0", str(root), record, episodes, deadline())
        wrong_replica = await drain(await gym.run("gym-1", [RunRow("0-0-a1", 0, 0, 1, "0-0")]))
        wrong_attempt = await drain(await gym.run("gym-0", [RunRow("0-0-a2", 0, 0, 2, "0-0")]))
        wrong_slot = await drain(await gym.run("gym-0", [RunRow("0-1-a1", 0, 1, 1, "0-0")]))
        for replies, words in [
            (wrong_replica, "no unclaimed restored episode 0-0"),
            (wrong_attempt, "must be claimed by attempt 1"),
            (wrong_slot, "restored episode 0-0 is row 0 slot 0"),
        ]:
            assert isinstance(replies[0], Failed) and replies[0].failure_class == "data"
            assert words in replies[0].message
        assert (await gym.inventory("gym-0")).unclaimed == ("0-0",)
        ok = await drain(await gym.run("gym-0", [RunRow("0-0-a1", 0, 0, 1, "0-0")]))
        assert isinstance(ok[0], Completed)


async def test_claim_refused_while_prepared_stays_unclaimed(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=1, mode=mode) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    async with open_gym() as gym:
        await gym.restore("gym-0", str(root), record, episodes, deadline())
        await gym.prepare("gym-0", "c2", deadline(), mode)
        again = await gym.commit("gym-0", "c2", str(tmp_path / "snap2"), deadline())
        assert [e.rollout_id for e in again.exported] == ["0-0"]  # unclaimed are exported
        claim = RunRow("0-0-a1", 0, 0, 1, "0-0")
        assert await drain(await gym.run("gym-0", [claim])) == [Refused("0-0-a1")]
        await gym.resume("gym-0", "c2", deadline())
        assert (await gym.inventory("gym-0")).unclaimed == ("0-0",)


async def test_restored_model_calls_are_checked_against_their_capture_keys(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=1, mode=mode) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    assert episodes[0].capture_keys  # parked after at least one turn
    tampered = [EpisodeRecord("0-0", "calendar", "gym-0", ("0-0/t9",))]
    async with open_gym() as gym:
        await gym.restore("gym-0", str(root), record, tampered, deadline())
        replies = await drain(await gym.run("gym-0", [RunRow("0-0-a1", 0, 0, 1, "0-0")]))
        assert isinstance(replies[0], Failed) and replies[0].failure_class == "data"
        assert "capture keys" in replies[0].message and "0-0/t9" in replies[0].message


async def test_retire_restored_drops_unclaimed(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=3) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    async with open_gym() as gym:
        await gym.restore("gym-0", str(root), record, episodes, deadline())
        claimed = await gym.run("gym-0", [RunRow("0-0-a1", 0, 0, 1, "0-0")])
        dropped = await gym.retire_restored("gym-0", ["1-0", "0-0", "9-9"], deadline())
        assert dropped.retired == ("1-0",)
        assert dropped.unknown == ("0-0", "9-9")  # 0-0 is claimed, 9-9 never existed
        assert (await gym.inventory("gym-0")).unclaimed == ("2-0",)
        assert "1-0" not in await calendar_sessions_of(gym, "gym-0")
        late = await drain(await gym.run("gym-0", [RunRow("1-0-a1", 1, 0, 1, "1-0")]))
        assert isinstance(late[0], Failed)
        assert isinstance((await drain(claimed))[0], Completed)


async def test_restore_refuses_a_tampered_state_file_and_changes_nothing(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    path = root / "gym-0" / "calendar" / RECORDS_FILE
    path.write_bytes(path.read_bytes().replace(b'"kind":', b'"kind" :'))
    async with open_gym() as gym:
        with pytest.raises(TopologyMismatch) as info:
            await gym.restore("gym-0", str(root), record, episodes, deadline())
        assert len(info.value.differences) == 1
        assert "instance gym-0: participant calendar digest" in str(info.value)
        assert "on disk" in str(info.value) and "committed" in str(info.value)
        assert await calendar_sessions_of(gym, "gym-0") == {}
        assert (await gym.inventory("gym-0")).unclaimed == ()
        # a changed chunk of the records (an object of the snapshot) is one too, named
        path.write_bytes(path.read_bytes().replace(b'"kind" :', b'"kind":'))
        [chunk] = orjson.loads(path.read_bytes())["chunks"]["sessions"]
        chunk_path = root / "objects" / "sha256" / chunk[7:9] / chunk[7:]
        chunk_path.chmod(0o644)
        chunk_path.write_bytes(chunk_path.read_bytes().replace(b"sentinel:", b"sentinel:X"))
        with pytest.raises(TopologyMismatch, match=rf"chunk {chunk} at {chunk_path}.*changed"):
            await gym.restore("gym-0", str(root), record, episodes, deadline())
        assert await calendar_sessions_of(gym, "gym-0") == {}
        # a missing participant directory is a difference too
        (root / "gym-0" / "model_proxy" / RECORDS_FILE).unlink()
        (root / "gym-0" / "model_proxy").rmdir()
        with pytest.raises(TopologyMismatch, match=r"model_proxy state directory .* missing"):
            await gym.restore("gym-0", str(root), record, episodes, deadline())


async def test_restore_refuses_a_changed_topology_and_changes_nothing(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    async with open_gym(instances=2, agent_kinds=["legacy_agent", "simple_agent"]) as gym:
        with pytest.raises(
            TopologyMismatch, match="kind simple_agent committed, legacy_agent live"
        ):
            await gym.restore("gym-0", str(root), record, episodes, deadline())
        renamed = InstanceRecord(
            "gym-0",
            (
                record.participants[1],
                ParticipantRecord("planner", "environment", "gym-0/calendar", "sha256:" + "0" * 64),
                record.participants[2],
            ),
        )
        with pytest.raises(TopologyMismatch) as info:
            await gym.restore("gym-1", str(root), renamed, episodes, deadline())
        text = str(info.value)
        for words in [
            "manifest record is for instance gym-0",
            "participant planner missing from the live deployment",
            "extra live participant agent",
            "participant planner digest",
        ]:
            assert words in text
        p = record.participants
        reordered = InstanceRecord("gym-0", (p[1], p[0], p[2]))
        with pytest.raises(
            TopologyMismatch,
            match="participant order calendar, agent, model_proxy committed, "
            "agent, calendar, model_proxy live",
        ):
            await gym.restore("gym-1", str(root), reordered, episodes, deadline())
        moved = InstanceRecord("gym-1", record.participants)
        with pytest.raises(TopologyMismatch, match="episode 0-0 belongs to replica gym-0"):
            await gym.restore("gym-1", str(root), moved, episodes[:1], deadline())
        for name in gym.instances:
            assert await calendar_sessions_of(gym, name) == {}
            assert (await gym.inventory(name)).unclaimed == ()


async def test_restore_needs_an_idle_instance(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=4, mode=mode) as (reply, gym):
        record, episodes = manifest_parts(reply)
        assert episodes
        with pytest.raises(GymControlError, match="checkpoint ckpt-1 is open"):
            await gym.restore("gym-0", str(root), record, episodes, deadline())
        await gym.resume("gym-0", "ckpt-1", deadline())
        with pytest.raises(GymControlError, match="idle instance"):
            await gym.restore("gym-0", str(root), record, episodes, deadline())


# -- fencing -------------------------------------------------------------------------------------


async def test_a_stale_attempt_cannot_mutate_or_reply(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym() as gym:
        old = await gym.run("gym-0", make_rows(1))
        await trio.sleep(plan_of(0).durations[0] / 2)  # attempt 0 is inside turn 0
        new = await gym.run("gym-0", make_rows(1, attempt=1))
        old_replies, new_replies = await drain(old), await drain(new)
        assert old_replies == []
        assert [r.rollout_id for r in new_replies] == ["0-0-a1"]
        stats = (await gym.statistics()).instances[0]
        assert stats.counters["fenced_mutations"] == 1
        session = (await calendar_sessions_of(gym, "gym-0"))["0-0"]
        assert (session.rollout_id, session.attempt) == ("0-0-a1", 1)
        assert list(session.sentinels) == expected_sentinels(0)
        # an attempt older than the slot's current one is fenced at admission
        stale = await drain(await gym.run("gym-0", make_rows(1)))
        assert stale == []
        assert (await gym.statistics()).instances[0].stale_runs == 1
        sessions = await calendar_sessions_of(gym, "gym-0")
        assert list(sessions["0-0"].sentinels) == expected_sentinels(0)


async def test_a_fresh_attempt_fences_an_unclaimed_restored_one(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    async with checkpointed(open_gym, root, rows=1) as (reply, _gym):
        pass
    record, episodes = manifest_parts(reply)
    async with open_gym() as gym:
        await gym.restore("gym-0", str(root), record, episodes, deadline())
        fresh = await drain(await gym.run("gym-0", make_rows(1, attempt=1)))
        assert isinstance(fresh[0], Completed)
        assert (await gym.inventory("gym-0")).unclaimed == ()
        session = (await calendar_sessions_of(gym, "gym-0"))["0-0"]
        assert list(session.sentinels) == expected_sentinels(0)


async def test_hold_after_first_mutation_parks_that_episode(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    config = CalendarConfig(mutation_p=0.5, hold_after_first_mutation=True)
    async with open_gym(config=config) as gym:
        stream = await gym.run("gym-0", make_rows(6))
        first = min(
            (sum(p.durations[: p.mutates.index(True) + 1]), row)
            for row in range(6)
            if True in (p := plan_episode(SEED, row, 0, config)).mutates
        )[1]
        replies: list[RunReply] = []
        with trio.move_on_after(60):
            async for batch in stream:
                replies.extend(batch)
                if len(replies) == 5:
                    break
        held = f"{first}-0"
        assert held not in {r.rollout_id for r in replies}
        assert (await gym.inventory("gym-0")).running == (held,)
        await gym.prepare("gym-0", "c", deadline())
        reply = await gym.commit("gym-0", "c", str(tmp_path / "s"), deadline())
        assert [e.rollout_id for e in reply.exported] == [held]
        plan = plan_episode(SEED, first, 0, config)
        assert reply.sessions[0].step_boundary == plan.mutates.index(True) + 1
        await gym.resume("gym-0", "c", deadline())
        assert [r.rollout_id for r in await drain(stream)] == [held]


# -- faults --------------------------------------------------------------------------------------


async def test_fault_hang_never_answers(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(faults=["prepare:hang@1"]) as gym:
        with trio.move_on_after(30) as scope:
            await gym.prepare("gym-0", "c", deadline())
        assert scope.cancelled_caught
        assert (await gym.inventory("gym-0")).admission_open  # it never reached Gym
        await gym.prepare("gym-0", "c", deadline())  # the 2nd call is fine


async def test_fault_delay_then_deadline(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(faults=["prepare:delay:2"]) as gym:
        t0 = trio.current_time()
        await gym.prepare("gym-0", "c", deadline(5))
        assert trio.current_time() - t0 == pytest.approx(2)
        await gym.resume("gym-0", "c", deadline())
        with pytest.raises(GymCallTimeout, match="gym-0 prepare: deadline passed"):
            await gym.prepare("gym-0", "c", deadline(1))
        assert not (await gym.inventory("gym-0")).prepared


async def test_fault_error_is_a_control_error(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, mode: CheckpointMode
) -> None:
    async with open_gym(faults=["commit:error", "run:error@1"]) as gym:
        with pytest.raises(GymControlError, match="gym-0 run: injected fault run:error@1"):
            await gym.run("gym-0", make_rows(1))
        await gym.prepare("gym-0", "c", deadline(), mode)
        with pytest.raises(GymControlError) as info:
            await gym.commit("gym-0", "c", "s", deadline())
        assert (info.value.instance, info.value.operation) == ("gym-0", "commit")
        assert pickle.loads(pickle.dumps(info.value)).message == info.value.message


async def test_fault_unpicklable_becomes_checkpoint_unavailable(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(faults=["resume:unpicklable", "retire:unpicklable@2"]) as gym:
        await gym.prepare("gym-0", "c", deadline())
        with pytest.raises(GymCheckpointUnavailable) as info:
            await gym.resume("gym-0", "c", deadline())
        assert (info.value.instance, info.value.operation) == ("gym-0", "resume")
        assert "cannot be pickled" in str(info.value)
        clone = pickle.loads(pickle.dumps(info.value))
        assert str(clone) == str(info.value)
        await trio.sleep(FAST.lease_s)  # the resume failed; the lease reopens
        assert not (await gym.inventory("gym-0")).prepared
        await gym.retire("gym-0", [], deadline())
        with pytest.raises(GymCheckpointUnavailable):  # retire_restored counts as retire
            await gym.retire_restored("gym-0", [], deadline())


async def test_fault_dead_instance(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(instances=2, faults=["retire:dead@1"]) as gym:
        stream = await gym.run("gym-0", make_rows(4))
        other = await gym.run("gym-1", make_rows(2, start=10))
        await trio.sleep(0.02)
        with pytest.raises(GymInstanceDead, match="gym-0"):
            await gym.retire("gym-0", [], deadline())
        # its stream says so (the runtime tells a death from an early end by it)
        with pytest.raises(GymInstanceDead, match="gym-0"):
            await drain(stream)
        for call in [
            gym.run("gym-0", make_rows(1)),
            gym.prepare("gym-0", "c", deadline()),
            gym.inventory("gym-0"),
            gym.topology(),
        ]:
            with pytest.raises(GymInstanceDead, match="gym-0"):
                await call
        assert len(await drain(other)) == 2
        assert (await gym.statistics()).instances[0].dead


async def test_replace_brings_a_dead_instance_back_with_its_environment_state(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    """``replace`` (``ReplaceableGym``): the same name and topology, admission open, nothing
    running, unclaimed or on the wire; the calendar's sessions and events survive the death
    (durable log), and a retire of a dead attempt frees its session there."""
    async with open_gym(instances=2, faults=["prepare:dead@1"]) as gym:
        if not can_replace(gym):
            pytest.skip(f"{type(gym).__name__} cannot replace instances")
        done = await drain(await gym.run("gym-0", make_rows(2)))
        assert {r.rollout_id for r in done} == {"0-0", "1-0"}
        running = await gym.run("gym-0", make_rows(1, start=5))  # dies mid-episode
        await trio.sleep(0.02)
        before = await calendar_sessions_of(gym, "gym-0")
        assert before["0-0"].sentinels and "5-0" in before  # the dead one's session opened
        topology = await gym.topology()
        with pytest.raises(GymInstanceDead, match="gym-0"):
            await gym.prepare("gym-0", "c-1", deadline())
        with pytest.raises(GymInstanceDead, match="gym-0"):
            await drain(running)
        await gym.replace("gym-0", deadline(30.0))
        assert await gym.topology() == topology
        inv = await gym.inventory("gym-0")
        assert inv.admission_open and not inv.prepared
        assert inv.running == inv.parked == inv.unclaimed == inv.on_wire == ()
        after = await calendar_sessions_of(gym, "gym-0")
        assert after == before  # every session and event of the dead instance, once
        retired = await gym.retire("gym-0", ["5-0"], deadline())
        assert retired.retired == ("5-0",)  # the dead attempt's session is freed there
        assert "5-0" not in await calendar_sessions_of(gym, "gym-0")
        assert (await calendar_sessions_of(gym, "gym-0"))["0-0"] == before["0-0"]
        replies = await drain(await gym.run("gym-0", make_rows(1, start=5, attempt=1)))
        assert [r.rollout_id for r in replies] == ["5-0-a1"]
        assert (await calendar_sessions_of(gym, "gym-0"))["5-0"].sentinels == tuple(
            expected_sentinels(5)
        )
        # the other instance never noticed
        assert len(await drain(await gym.run("gym-1", make_rows(1, start=9)))) == 1


async def test_fault_refuse_refuses_every_row(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(faults=["run:refuse@1"]) as gym:
        rows = make_rows(3)
        refused = await drain(await gym.run("gym-0", rows))
        assert refused == [Refused(r.rollout_id, ADMISSION_CLOSED) for r in rows]
        assert len(await drain(await gym.run("gym-0", rows))) == 3


async def test_fault_drop_ends_the_stream_early(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(faults=["run:drop@1"]) as gym:
        replies = await drain(await gym.run("gym-0", make_rows(6)))
        assert len(replies) == 3
        # The 3 missing rows keep running in Gym: each is running or (on Ray, in real time)
        # has completed meanwhile, its reply going nowhere. Completions counted before and
        # after the inventory bound it; under virtual time (embedded) all 3 run.
        before = (await gym.statistics()).instances[0].completed
        inv = await gym.inventory("gym-0")
        after = (await gym.statistics()).instances[0].completed
        assert len(inv.running) + before - 3 <= 3 <= len(inv.running) + after - 3, (
            inv,
            before,
            after,
        )
        assert inv.on_wire == ()
        await trio.sleep(1)
        inv = await gym.inventory("gym-0")
        assert inv.running == inv.on_wire == ()  # their replies went nowhere
        missing = {f"{r}-0" for r in range(6)} - {r.rollout_id for r in replies}
        retired = await gym.retire("gym-0", sorted(missing), deadline())
        assert sorted(retired.retired) == sorted(missing)


# -- topology and determinism ---------------------------------------------------------------------


async def test_topology_lists_participants_in_order(
    open_gym: Factory, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_gym(instances=2, agent_kinds=["simple_agent", "legacy_agent"]) as gym:
        topo = await gym.topology()
        assert topo.names == gym.instances == ("gym-0", "gym-1")
        assert topo.instances[1].participants == (
            ("agent", "legacy_agent"),
            ("calendar", "environment"),
            ("model_proxy", "model_proxy"),
        )


async def _scenario(
    open_gym: Factory, seed: int, root: Path, mode: CheckpointMode = ALIGNED
) -> list[Any]:
    async with open_gym(seed=seed) as gym:
        stream = await gym.run("gym-0", make_rows(8))
        await trio.sleep(0.07)
        await gym.prepare("gym-0", "c", deadline(), mode)
        commit = await gym.commit("gym-0", "c", str(root), deadline())
        await gym.resume("gym-0", "c", deadline())
        # virtual times relative to the start differ only by float rounding of the clock base
        batches = [(round(t, 9), b) for t, b in await timed_batches(stream)]
        state = await calendar_sessions_of(gym, "gym-0")
    return [batches, commit, state]


async def test_same_seed_same_replies_and_timings(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, tmp_path: Path, mode: CheckpointMode
) -> None:
    first = await _scenario(open_gym, 3, tmp_path / "a", mode)
    second = await _scenario(open_gym, 3, tmp_path / "a", mode)
    other = await _scenario(open_gym, 4, tmp_path / "b", mode)
    assert first == second
    assert first[0] != other[0]


@pytest.mark.parametrize("n", [1, 2, 5])
async def test_drop_after_half_for_small_streams(
    open_gym: Factory, autojump_clock: trio.testing.MockClock, n: int
) -> None:
    async with open_gym(faults=["run:drop"]) as gym:
        replies = await drain(await gym.run("gym-0", make_rows(n)))
        assert len(replies) == n // 2
