"""The Gym host and the episode API, on a small user environment (a counter and a scripted model).

Every test runs the host in-process under trio's autojump clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    EnvironmentSpecError,
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymHost,
    HostConfig,
    RunReply,
    RunRow,
    StateParticipant,
    parse_call_id,
    register_participant_kind,
    split_capture_key,
)
from gymckpt.runtime import (
    EpisodeRecord,
    EpisodeResult,
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    RecoveryLedger,
    TopologyMismatch,
)
from gymckpt.runtime._ledger import dump_ledger_snapshot, load_ledger_snapshot

FAR = 1e9


def short(key: str) -> str:
    """Capture key ``key`` without its request digest: ``"{attempt}:t{turn}-c{occurrence}"``."""
    attempt, call = split_capture_key(key)
    parts = parse_call_id(call)
    return f"{attempt}:t{parts.turn}-c{parts.occurrence}"


@attrs.define
class Tally:
    """The environment participant's session: every increment applied, by turn."""

    applied: list[int] = attrs.field(factory=list)


class Counter:
    name, kind = "counter", "environment"

    def open(self, info: EpisodeInfo) -> Tally:
        return Tally()

    def export(self, state: Tally) -> Any:
        return state.applied

    def restore(self, data: Any) -> Tally:
        return Tally(list(data))


@attrs.define
class AgentState:
    rewards: list[float] = attrs.field(factory=list)


@attrs.define
class Script:
    """An agent playing ``turns`` turns, ``turn_s`` each; the model's answer is added to the
    counter every turn."""

    turns: int = 3
    turn_s: float = 1.0
    payload_items: int = 0
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> AgentState:
        return AgentState()

    def export(self, state: AgentState) -> Any:
        return attrs.asdict(state)

    def restore(self, data: Any) -> AgentState:
        return AgentState(**data)

    async def step(self, ctx: EpisodeContext, state: AgentState) -> Done | None:
        answer = await ctx.model({"turn": ctx.turn})
        await anyio.sleep(self.turn_s)
        ctx.session("counter").applied.append(answer)
        state.rewards.append(1.0)
        if ctx.turn + 1 >= self.turns:
            return Done(
                sum(state.rewards),
                payload={"rewards": state.rewards, "pad": [0] * self.payload_items},
            )
        return None


@attrs.define
class Model:
    calls: list[str] = attrs.field(factory=list)

    def __call__(self, key: str, request: Any, info: EpisodeInfo) -> int:
        self.calls.append(key)
        return 10 * info.slot + request["turn"]


def environment(model: Model | None = None, **script: Any) -> Environment:
    return Environment(
        agent=Script(**script),
        participants=(Counter(),),
        model=model if model is not None else Model(),
    )


async def replies(stream: Any) -> list[RunReply]:
    out: list[RunReply] = []
    async for batch in stream:
        out.extend(batch)
    return out


def rows(*specs: tuple[int, int, int]) -> Sequence[RunRow]:
    return [RunRow(f"{r}-{s}" + (f"-a{a}" if a else ""), r, s, a) for r, s, a in specs]


# -- the environment is checked when the deployment starts -------------------------------------


def test_unknown_kind_fails_at_start_naming_the_registry() -> None:
    class Odd(Counter):
        kind = "ledger_of_odds"

    env = Environment(agent=Script(), participants=(Odd(),), model=Model())
    with pytest.raises(EnvironmentSpecError, match="register_participant_kind") as info:
        GymHost("gym-0", env)
    assert "'counter'" in str(info.value) and "ledger_of_odds" in str(info.value)
    register_participant_kind("ledger_of_odds", "environment")
    GymHost("gym-0", env)  # open kinds: registered, it is hosted


def test_spec_errors_name_every_problem() -> None:
    class NoStep:
        name, kind = "agent", "simple_agent"

        def open(self, info: EpisodeInfo) -> None: ...
        def export(self, state: Any) -> None: ...
        def restore(self, data: Any) -> None: ...

    env = Environment(agent=NoStep(), participants=(Counter(), Counter()))  # type: ignore[arg-type]
    with pytest.raises(EnvironmentSpecError) as info:
        env.check()
    text = str(info.value)
    assert "has no async step" in text and "names used twice: counter" in text


def test_state_participant_round_trips_attrs_through_the_converter() -> None:
    p = StateParticipant("counter", "environment", Tally, lambda info: Tally([1]))
    state = p.open(EpisodeInfo("0-0", 0, 0, 0, 0, "gym-0"))
    assert p.restore(p.export(state)) == Tally([1])
    with pytest.raises(ManifestError, match="extra"):
        p.restore({"applied": [1], "extra": 2})  # strict: unknown keys are errors


# -- episodes, payloads, fencing ----------------------------------------------------------------


async def test_episode_payload_reaches_the_reply(autojump_clock: trio.testing.MockClock) -> None:
    model = Model()
    async with GymHost("gym-0", environment(model)) as host:
        got = await replies(await host.run(rows((0, 1, 0))))
    assert got == [Completed("0-1", 3.0, 3, {"rewards": [1.0, 1.0, 1.0], "pad": []})]
    assert [short(k) for k in model.calls] == ["0-1:t0-c0", "0-1:t1-c0", "0-1:t2-c0"]


async def test_payload_over_the_limit_fails_the_episode_clearly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = attrs.evolve(environment(payload_items=100), max_payload_bytes=100)
    async with GymHost("gym-0", env) as host:
        (reply,) = await replies(await host.run(rows((0, 0, 0))))
    assert isinstance(reply, Failed) and reply.failure_class == "data"
    assert "over the limit of 100" in reply.message and "max_payload_bytes" in reply.message


async def test_a_fresh_attempt_fences_the_old_one(autojump_clock: trio.testing.MockClock) -> None:
    async with (
        GymHost("gym-0", environment(turns=3, turn_s=1.0)) as host,
        trio.open_nursery() as nursery,
    ):
        old_stream = await host.run(rows((0, 0, 0)))
        old: list[RunReply] = []

        async def read_old() -> None:
            old.extend(await replies(old_stream))

        nursery.start_soon(read_old)
        await trio.sleep(1.5)  # attempt 0 is inside its second turn
        new = await replies(await host.run(rows((0, 0, 1))))
        stale = await replies(await host.run(rows((0, 0, 0))))  # an older attempt: ignored
    assert old == [] and stale == []
    assert [type(r) for r in new] == [Completed]
    stats = host.statistics()
    assert stats.fenced_episodes == 1 and stats.completed == 1 and stats.stale_runs == 1


# -- checkpoint, restore, claim ------------------------------------------------------------------


async def test_commit_restore_claim_continues_without_repeating_model_calls(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    model = Model()
    env = environment(model, turns=4, turn_s=1.0)
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run(rows((3, 1, 0)))
        await trio.sleep(1.5)
        prep = await host.prepare("c1", FAR)
        assert prep.parked == 1
        reply = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    assert [tuple(map(short, e.capture_keys)) for e in reply.exported] == [
        ("3-1:t0-c0", "3-1:t1-c0")
    ]
    assert [(e.owner, e.rollout_id) for e in reply.exported] == [("counter", "3-1")]
    assert [s.step_boundary for s in reply.sessions] == [2]
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    episode = EpisodeRecord("3-1", "counter", "gym-0", reply.exported[0].capture_keys)

    model2 = Model()
    async with GymHost("gym-0", environment(model2, turns=4), work_dir=tmp_path) as fresh:
        restored = await fresh.restore("snap", record, [episode], FAR)
        assert restored.restored == ("3-1",)
        claim = RunRow("3-1-a1", 3, 1, 1, restored_from="3-1")
        (done,) = await replies(await fresh.run([claim]))
    assert isinstance(done, Completed) and done.turns == 4
    assert done.payload["rewards"] == [1.0] * 4
    # turns 0 and 1 were not asked again
    assert [short(k) for k in model2.calls] == ["3-1-a1:t2-c0", "3-1-a1:t3-c0"]


async def test_restore_refuses_tampered_state_and_changes_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", environment(turns=4), work_dir=tmp_path) as host:
        stream = await host.run(rows((0, 0, 0)))
        await trio.sleep(1.5)
        await host.prepare("c1", FAR)
        reply = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    (tmp_path / "snap" / "gym-0" / "counter" / "records.json").write_bytes(b"{}")
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    async with GymHost("gym-0", environment(turns=4), work_dir=tmp_path) as fresh:
        with pytest.raises(TopologyMismatch, match="counter"):
            await fresh.restore("snap", record, [EpisodeRecord("0-0", "counter", "gym-0")], FAR)
        assert fresh.inventory().unclaimed == ()


# -- the trainer gets the payload, exactly once across a restore ------------------------------


async def test_ledger_snapshot_keeps_completed_payloads() -> None:
    ledger = RecoveryLedger(group_size=2)
    payload = {"observations": [[0.1, 0.2]], "actions": [1], "rewards": [0.5]}

    def play() -> None:
        ledger.reserve_row(0)
        ledger.mark_dispatched(["0-0", "0-1"], "gym-0", 1)
        ledger.complete("0-0", 1, EpisodeResult(0.5, 1, payload))
        ledger.complete("0-1", 1, EpisodeResult(0.25, 2))

    await ledger.barrier.mutate(play)
    snap = load_ledger_snapshot(dump_ledger_snapshot(ledger.to_snapshot()))
    restored, summary = RecoveryLedger.from_snapshot(snap)
    assert summary.completed_untrained == 2
    (group,) = await restored.barrier.mutate(lambda: restored.take_ready(1))
    assert [r.payload for r in group.results] == [payload, None]
    assert group.results[0] == EpisodeResult(0.5, 1, payload)


class Scoreboard(Counter):
    """A participant of a kind the project does not know (registered by the user)."""

    name, kind = "scoreboard", "scoreboard"


@pytest.mark.parametrize("custom_kind", [False, True])
async def test_trainer_gets_every_payload_once_across_a_restore(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, custom_kind: bool
) -> None:
    from gymckpt.nurseries import open_rollouts

    env = environment(turns=3, turn_s=1.0)
    if custom_kind:  # open kinds: committed, published, verified and restored like any other
        register_participant_kind("scoreboard", "passive")
        env = attrs.evolve(env, participants=(*env.participants, Scoreboard()))
    seen: list[tuple[int, int]] = []
    for phase in (1, 2):
        async with (
            EmbeddedGym.host(
                env, instances=2, work_dir=tmp_path / "gym", config=HostConfig(lease_s=30.0)
            ) as gym,
            open_rollouts(gym, tmp_path, rows=12, group_size=2, max_rows_in_flight=6) as ro,
        ):
            if phase == 2:
                assert ro.restore_summary is not None and ro.restore_summary.restored > 0
            async with aclosing(ro.batches(2)) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    for g in batch:
                        for slot, r in enumerate(g.results):
                            assert r.payload["rewards"] == [1.0, 1.0, 1.0]
                            seen.append((g.row, slot))
                    outcome = await ro.checkpoint()
                    assert outcome.ok
                    if phase == 1 and len(seen) >= 8:
                        break
    assert sorted(seen) == [(r, s) for r in range(12) for s in range(2)]


class _Ticker:
    """An agent whose every turn takes one virtual second and notes the scheduler batch it
    started in (``batch`` is advanced by a task that yields once per batch)."""

    name, kind = "agent", "simple_agent"

    def __init__(self) -> None:
        self.batch = 0
        self.started: list[int] = []

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        self.started.append(self.batch)
        await anyio.sleep(1.0)
        return None


async def test_a_resume_wakes_parked_episodes_in_chunks_not_all_in_one_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Waking every parked episode in one scheduler batch stalls the loop for as long as they
    all take to reach their next await (about a second at 200k here): a resume wakes them
    RESUME_CHUNK at a time, a batch apart, and every one of them wakes."""
    from gymckpt.gym_adapter.host._host import RESUME_CHUNK

    agent = _Ticker()
    n = 2 * RESUME_CHUNK + 500
    async with GymHost("gym-0", Environment(agent=agent)) as host:
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(n)])
        await trio.sleep(0.5)
        await host.prepare("c", trio.current_time() + FAR)
        assert host.statistics().parked == n
        agent.started.clear()

        class CountBatches(trio.abc.Instrument):
            def before_io_wait(self, timeout: float) -> None:  # once per scheduler batch
                agent.batch += 1

        counter = CountBatches()
        trio.lowlevel.add_instrument(counter)
        await host.resume("c", trio.current_time() + FAR)
        while len(agent.started) < n:
            await trio.lowlevel.checkpoint()
        trio.lowlevel.remove_instrument(counter)
        per_batch = [agent.started.count(b) for b in sorted(set(agent.started))]
        assert max(per_batch) <= RESUME_CHUNK and len(per_batch) >= 3, per_batch


def _episode_tasks() -> list[trio.lowlevel.Task]:
    """Live tasks running a host episode (``GymHost._episode_main``), in trio's task tree."""
    out, todo = [], [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        if task.name.endswith("GymHost._episode_main"):
            out.append(task)
        todo.extend(t for n in task.child_nurseries for t in n.child_tasks)
    return out


async def test_parked_episodes_are_data_not_tasks_and_a_resume_restarts_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A parked episode keeps no task (a suspended task is a dozen collector-tracked objects,
    and 200k of them parking at once filled the youngest generation inside the checkpoint):
    prepare leaves none alive; a resume starts one per episode again, and each continues from
    its boundary — a second checkpoint parks them at a later turn, nothing is lost."""
    agent = _Ticker()
    n = 300
    async with GymHost("gym-0", Environment(agent=agent)) as host:
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(n)])
        await trio.sleep(0.5)
        assert len(_episode_tasks()) == n
        await host.prepare("c1", trio.current_time() + FAR)
        await trio.testing.wait_all_tasks_blocked()
        assert host.statistics().parked == n
        assert len(_episode_tasks()) == 0
        turns = host.statistics().turns
        await host.resume("c1", trio.current_time() + FAR)
        await trio.sleep(2.5)
        assert len(_episode_tasks()) == n
        await host.prepare("c2", trio.current_time() + FAR)
        assert host.statistics().parked == n
        assert host.statistics().turns >= turns + 2 * n  # every one went on turning
        # prepared again before a resume's restart reached everyone: the rest stay parked
        await host.resume("c2", trio.current_time() + FAR)
        await host.prepare("c3", trio.current_time() + FAR)
        assert host.statistics().parked == n
        await host.resume("c3", trio.current_time() + FAR)
        await trio.sleep(1.5)
        assert len(_episode_tasks()) == n


@pytest.mark.parametrize("freeze", [True, False])
async def test_parked_and_restarted_episodes_leave_the_collectors_generations(
    autojump_clock: trio.testing.MockClock, freeze: bool
) -> None:
    """Once every episode is parked, and once a resume has started them all again, the host
    moves what the process holds into the permanent generation (``promote_survivors``): the
    young collections of the commit and the full collection after the checkpoint no longer
    walk every episode's objects. ``HostConfig.freeze_survivors = False`` leaves them."""
    import gc

    def walked(objs: list[object]) -> int:  # gc.get_objects() leaves out frozen objects
        ids = {id(o) for o in gc.get_objects()}
        return sum(id(o) in ids for o in objs)

    gc.unfreeze()  # a clean start: whatever earlier tests froze is walked again
    n = 200
    config = HostConfig(freeze_survivors=freeze)
    env = Environment(agent=_Ticker(), participants=(Counter(),))
    async with GymHost("gym-0", env, config=config) as host:
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(n)])
        await trio.sleep(0.5)
        await host.prepare("c", trio.current_time() + FAR)
        sessions = [view.state for view in host.session_states("counter").values()]
        assert len(sessions) == n
        assert walked(sessions) == (0 if freeze else n)
        await host.resume("c", trio.current_time() + FAR)
        await trio.testing.wait_all_tasks_blocked()
        coros = [task.coro for task in _episode_tasks()]
        assert len(coros) == n
        assert walked(coros) == (0 if freeze else n)
    gc.unfreeze()


@pytest.mark.parametrize("freeze", [True, False])
async def test_every_promote_every_episodes_started_the_host_promotes_what_it_holds(
    autojump_clock: trio.testing.MockClock, freeze: bool
) -> None:
    """While Gym fills up, a full collection would walk every episode started so far (a second
    at 50k): every PROMOTE_EVERY episodes started, the host promotes what the process holds, so
    it walks only those started since."""
    import gc

    from gymckpt.gym_adapter.host._host import PROMOTE_EVERY

    gc.unfreeze()
    env = Environment(agent=_Ticker(), participants=(Counter(),))
    async with GymHost("gym-0", env, config=HostConfig(freeze_survivors=freeze)) as host:
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(PROMOTE_EVERY - 1)])
        first = [view.state for view in host.session_states("counter").values()]
        ids = {id(o) for o in gc.get_objects()}
        assert all(id(o) in ids for o in first)  # not yet
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(PROMOTE_EVERY, PROMOTE_EVERY + 2)])
        ids = {id(o) for o in gc.get_objects()}
        assert sum(id(o) in ids for o in first) == (0 if freeze else len(first))
        host.kill()
    gc.unfreeze()


async def test_under_trio_episodes_are_plain_trio_tasks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Under trio each episode is a task of a trio nursery inside the host's task group, its
    coroutine the host's own, not one started through anyio (whose task handle adds a cancel
    scope and an event to every task: four times the cost per episode here)."""
    async with GymHost("gym-0", Environment(agent=_Ticker())) as host:
        await trio.lowlevel.checkpoint()  # the host's episode nursery opens
        await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(5)])
        tasks = _episode_tasks()
        assert len(tasks) == 5
        assert all(t.coro.cr_code is GymHost._episode_main.__code__ for t in tasks)


# -- a consumer that reads the batches itself (the Ray actor's outbox) -------------------------


async def test_a_consumer_reading_batches_itself_acknowledges_discards_and_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with GymHost("gym-0", environment(turns=1, turn_s=1.0)) as host:
        stream = await host.run(rows((0, 0, 0), (1, 0, 0)))
        st = stream.run_stream
        first = await st.receive.receive()
        got = sorted(r.rollout_id for r in first)
        assert got == ["0-0", "1-0"] and host.inventory().on_wire == ("0-0", "1-0")
        host.ack_replies(st, ["0-0"])  # received: off the wire
        assert host.inventory().on_wire == ("1-0",)
        host.discard_replies(st, [r for r in first if r.rollout_id == "1-0"])
        assert host.inventory().on_wire == () and host.statistics().discarded_replies == 1
        more = await host.run(rows((2, 0, 0)))
        await trio.sleep(5.0)  # its batch is sent, never read
        assert host.inventory().on_wire == ("2-0",)
        host.close_consumer(more.run_stream)  # the consumer went away: sent batches are lost
        assert host.inventory().on_wire == () and host.statistics().streams == 1
        host.forget_stream(st)  # read to its end: no longer listed
        assert host.statistics().streams == 0
