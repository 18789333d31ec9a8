"""A user's environment that does everything wrong: nothing it does is lost, hidden or an abort.

Host level, embedded, under trio's autojump clock: non-finite numbers and non-JSON values are
refused where they are handed over (naming the episode and the field); a state that cannot be
exported at a commit fails its episode (or the commit, retryably), so a commit that succeeds
is restorable; an agent-only environment restores; a failed attempt's retained sessions are
freed; every failure of user code is a rate-limited WARNING with its traceback, and counted on
the trainer's side.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
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
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymControlError,
    GymHost,
    HostConfig,
    RunReply,
    RunRow,
)
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import (
    EpisodeRecord,
    EpisodeResult,
    InstanceRecord,
    NotPlainData,
    ParticipantRecord,
    RecoveryLedger,
    RuntimeConfig,
)
from gymckpt.runtime._ledger import dump_ledger_snapshot
from gymckpt.runtime._shared import (
    SessionRecords,
    read_snapshot_records,
)

FAR = 1e9
NAN, INF = float("nan"), float("inf")
Step = Callable[[EpisodeContext, dict[str, Any]], Awaitable[Done | None]]


class Store:
    """An environment participant: a list of events per session. ``bad`` is exported instead
    of the state when the state says ``poison``."""

    kind = "environment"

    def __init__(self, name: str = "store", *, retained: bool = False, bad: Any = None) -> None:
        self.name, self.retained, self.bad = name, retained, bad

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"events": []}

    def export(self, state: dict[str, Any]) -> Any:
        if state.get("poison"):
            if isinstance(self.bad, Exception):
                raise self.bad
            return {"events": state["events"], "bad": self.bad}
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return {"events": list(data["events"])}


@attrs.define
class Agent:
    """An agent running ``script`` each turn (default: ``turns`` turns of one second)."""

    script: Step | None = None
    turns: int = 3
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"t": 0}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        if self.script is not None:
            return await self.script(ctx, state)
        await anyio.sleep(1.0)
        state["t"] += 1
        return Done(1.0, payload={"t": state["t"]}) if state["t"] >= self.turns else None


def ending(done: Done) -> Step:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        return done

    return script


async def replies(stream: Any) -> list[RunReply]:
    out: list[RunReply] = []
    async for batch in stream:
        out.extend(batch)
    return out


def row(r: int, s: int = 0, a: int = 0) -> RunRow:
    return RunRow(f"{r}-{s}" + (f"-a{a}" if a else ""), r, s, a)


def record_of(reply: Any) -> InstanceRecord:
    return InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )


async def one_reply(env: Environment) -> RunReply:
    async with GymHost("gym-0", env) as host:
        (reply,) = await replies(await host.run([row(0, 1)]))
    return reply


def assert_names_episode(message: str, rid: str = "0-1", r: int = 0, s: int = 1) -> None:
    assert f"episode {rid} (row {r} slot {s} attempt 0) on gym-0" in message, message


# -- values handed over are finite plain data, or refused naming the episode and the field -----


@pytest.mark.parametrize("reward", [NAN, INF, -INF, "1.0", None])
async def test_a_reward_that_is_not_a_finite_number_fails_the_episode_naming_it(
    autojump_clock: trio.testing.MockClock, reward: Any
) -> None:
    reply = await one_reply(Environment(agent=Agent(ending(Done(reward)))))
    assert isinstance(reply, Failed) and reply.failure_class == "data", reply
    assert "Done.reward" in reply.message and "not a finite number" in reply.message
    assert_names_episode(reply.message)


@pytest.mark.parametrize("turns", [NAN, 2.0, -1, True, "3"])
async def test_turns_that_are_not_a_count_fail_the_episode_naming_it(
    autojump_clock: trio.testing.MockClock, turns: Any
) -> None:
    reply = await one_reply(Environment(agent=Agent(ending(Done(1.0, turns=turns)))))
    assert isinstance(reply, Failed) and "Done.turns" in reply.message, reply
    assert_names_episode(reply.message)


async def test_a_numpy_reward_is_a_float_and_round_trips() -> None:
    np = pytest.importorskip("numpy")
    reply = await one_reply(Environment(agent=Agent(ending(Done(np.float32(0.5))))))
    assert reply == Completed("0-1", 0.5, 1, None) and type(reply.reward) is float


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ([0, 1, 2, {"x": NAN}], "payload[3].x"),
        ({"obs": [[0.0, INF]]}, "payload.obs[0][1]"),
        ({"actions": {1, 2}}, "payload.actions is a set"),
    ],
)
async def test_a_payload_that_is_not_finite_plain_data_is_refused_naming_the_field(
    autojump_clock: trio.testing.MockClock, payload: Any, where: str
) -> None:
    reply = await one_reply(Environment(agent=Agent(ending(Done(1.0, payload=payload)))))
    assert isinstance(reply, Failed) and reply.failure_class == "data", reply
    assert where in reply.message, reply.message
    assert_names_episode(reply.message)


async def test_a_payload_with_none_round_trips_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    payload = {"a": [None, 1.5, {"b": None}], "c": "null"}
    reply = await one_reply(Environment(agent=Agent(ending(Done(2.0, payload=payload)))))
    assert reply == Completed("0-1", 2.0, 1, payload)


async def test_a_non_finite_model_response_is_refused_where_it_is_staged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        await ctx.model("go")
        return Done(1.0)

    def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        return {"logits": [0.0, NAN]}

    reply = await one_reply(Environment(agent=Agent(script), model=model))
    assert isinstance(reply, Failed) and reply.failure_class == "data"
    assert "response.logits[1]" in reply.message and "0-1:t0-" in reply.message
    assert_names_episode(reply.message)


# -- a state that cannot be exported at a commit fails its episode, never the run --------------


def poisoning(rows_to_poison: set[int]) -> Step:
    """Three one-second turns; at turn 1 the store of the rows given is poisoned."""

    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        store = ctx.session("store")
        store["events"].append(f"{ctx.info.session_key}/{ctx.turn}")
        if ctx.turn == 1 and ctx.info.row in rows_to_poison:
            store["poison"] = True
        await anyio.sleep(1.0)
        return Done(1.0, payload=store["events"]) if ctx.turn >= 2 else None

    return script


@pytest.mark.parametrize(
    "bad",
    [{1, 2}, NAN, [1.0, -INF], RuntimeError("export broke")],
    ids=["set", "nan", "inf", "raises"],
)
async def test_a_parked_episode_whose_state_cannot_be_exported_fails_and_the_commit_restores(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, bad: Any
) -> None:
    env = Environment(agent=Agent(poisoning({0})), participants=(Store(bad=bad),))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host, trio.open_nursery() as nursery:
        got: list[RunReply] = []

        async def read(stream: Any) -> None:
            async for batch in stream:
                got.extend(batch)

        nursery.start_soon(read, await host.run([row(0), row(1)]))
        await trio.sleep(1.5)  # both in turn 1: the store of row 0 is poisoned
        await host.prepare("c1", FAR)
        commit = await host.commit("c1", "snap", FAR)
        assert [e.rollout_id for e in commit.exported] == ["1-0"]
        assert [s.rollout_id for s in commit.sessions] == ["1-0"]
        assert "0-0" in commit.on_wire  # its failure is on the wire: the checkpoint drains it
        await trio.sleep(0.1)
        (failed,) = got
        assert isinstance(failed, Failed) and failed.failure_class == "data"
        assert_names_episode(failed.message, "0-0", 0, 0)
        assert "c1" in failed.message
        await host.resume("c1", FAR)
    assert [type(r) for r in got] == [Failed, Completed]
    for path in (tmp_path / "snap" / "gym-0").glob("*/records.json"):
        assert b"0-0" not in path.read_bytes()
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        restored = await fresh.restore(
            "snap", record_of(commit), [EpisodeRecord("1-0", "store", "gym-0")], FAR
        )
        assert restored.restored == ("1-0",)
        (done,) = await replies(await fresh.run([RunRow("1-0-a1", 1, 0, 1, "1-0")]))
    assert done == Completed("1-0-a1", 1.0, 3, ["1-0/0", "1-0/1", "1-0/2"])


@pytest.mark.parametrize(
    "bad", [{1, 2}, NAN, RuntimeError("export broke")], ids=["set", "nan", "raises"]
)
async def test_a_retained_state_that_cannot_be_exported_fails_the_commit_retryably(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, bad: Any
) -> None:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        ctx.session("store")["poison"] = True
        return Done(1.0)

    env = Environment(agent=Agent(script), participants=(Store(retained=True, bad=bad),))
    async with GymHost("gym-0", env) as host:
        assert [type(r) for r in await replies(await host.run([row(0)]))] == [Completed]
        await host.prepare("c1", FAR)
        with pytest.raises(GymControlError, match="retained session 0-0 of 0-0"):
            await host.commit("c1", str(tmp_path / "snap"), FAR)
        await host.resume("c1", FAR)  # the instance goes on; a later checkpoint may retire it
        await host.retire(["0-0"], FAR)
        await host.prepare("c2", FAR)
        await host.commit("c2", str(tmp_path / "snap2"), FAR)


# -- an agent-only environment ---------------------------------------------------------------


def agent_only() -> Environment:
    return Environment(agent=Agent(turns=4))


async def test_an_agent_only_environment_checkpoints_and_restores(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with GymHost("gym-0", agent_only(), work_dir=tmp_path) as host:
        stream = await host.run([row(2, 1)])
        await trio.sleep(1.5)
        await host.prepare("c1", FAR)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    assert [(e.owner, e.rollout_id) for e in commit.exported] == [("agent", "2-1")]
    async with GymHost("gym-0", agent_only(), work_dir=tmp_path) as fresh:
        restored = await fresh.restore(
            "snap", record_of(commit), [EpisodeRecord("2-1", "agent", "gym-0")], FAR
        )
        assert restored.restored == ("2-1",)
        (done,) = await replies(await fresh.run([RunRow("2-1-a1", 2, 1, 1, "2-1")]))
    assert done == Completed("2-1-a1", 1.0, 4, {"t": 4})


async def test_an_agent_only_environment_resumes_a_run_embedded(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    seen: list[tuple[int, int]] = []
    for phase in (1, 2):
        async with (
            EmbeddedGym.host(
                agent_only(),
                instances=2,
                work_dir=tmp_path / "gym",
                config=HostConfig(lease_s=30.0),
            ) as gym,
            open_rollouts(
                gym, tmp_path, rows=8, group_size=2, max_rows_in_flight=4, handle_signals=False
            ) as ro,
        ):
            if phase == 2:
                assert ro.restore_summary is not None and ro.restore_summary.restored > 0
            async with aclosing(ro.batches(1)) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    seen.extend((g.row, s) for g in batch for s in range(len(g.results)))
                    assert (await ro.checkpoint()).ok
                    if phase == 1 and len(seen) >= 6:
                        break
    assert sorted(seen) == [(r, s) for r in range(8) for s in range(2)]


async def test_the_conformance_kit_passes_an_agent_only_environment(tmp_path: Path) -> None:
    from gymckpt.testing import check_environment

    report = await check_environment(agent_only(), tmp_path)
    assert report.ok if hasattr(report, "ok") else report


# -- a failed attempt's retained sessions are freed ------------------------------------------


async def test_a_failed_attempts_retained_mutation_is_not_kept_beside_its_retry(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        ctx.session("calendar")["events"].append(f"sentinel-{ctx.info.session_key}")
        if ctx.info.attempt == 0:
            raise RuntimeError("the agent crashed after booking")
        return Done(1.0)

    env = Environment(agent=Agent(script), participants=(Store("calendar", retained=True),))
    async with (
        GymHost("gym-0", env, work_dir=tmp_path) as a,
        GymHost("gym-1", env, work_dir=tmp_path) as b,
    ):
        (first,) = await replies(await a.run([row(5, 1)]))
        assert isinstance(first, Failed) and first.failure_class == "data"
        (retry,) = await replies(await b.run([row(5, 1, 1)]))
        assert isinstance(retry, Completed)
        sentinels: list[str] = []
        for host in (a, b):
            await host.prepare("c1", FAR)
            commit = await host.commit("c1", "snap", FAR)
            records = read_snapshot_records(
                tmp_path / "snap", f"{host.name}/calendar", SessionRecords
            )
            sentinels += [e for s in records.sessions for e in s.state["events"]]
            assert commit.exported == ()
        assert a.session_states("calendar") == {}
        assert a.statistics().failed == 1
    assert sentinels == ["sentinel-5-1"]


# -- every failure of user code is a WARNING with its traceback, rate-limited ----------------


async def _raises(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
    raise ZeroDivisionError("the user's own bug")


async def _no_model(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
    await ctx.model("x")
    return None


async def _no_session(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
    ctx.session("nosuch")
    return None


async def _bad_done(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
    return "finished"  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("script", "what", "traceback"),
    [
        (_raises, "ZeroDivisionError", "_raises"),
        (_no_model, "has no model", "_no_model"),
        (_no_session, "no participant 'nosuch'", "_no_session"),
        (_bad_done, "step returned str", None),
        (ending(Done(NAN)), "Done.reward is nan", None),
    ],
)
async def test_a_failure_of_user_code_is_a_warning_naming_the_episode_with_its_traceback(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    script: Step,
    what: str,
    traceback: str | None,
) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt")
    reply = await one_reply(Environment(agent=Agent(script)))
    assert isinstance(reply, Failed)
    (rec,) = [r for r in caplog.records if r.name == "gymckpt.gym"]
    assert rec.levelno == logging.WARNING
    assert what in rec.getMessage()
    assert_names_episode(rec.getMessage())
    if traceback is None:
        assert rec.exc_info is None
    else:
        assert rec.exc_info is not None and traceback in caplog.text


async def test_open_and_export_raising_are_warnings_with_tracebacks(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    class Broken(Store):
        def open(self, info: EpisodeInfo) -> dict[str, Any]:
            if info.row == 0:
                raise OSError("no such calendar")
            return super().open(info)

    caplog.set_level(logging.WARNING, logger="gymckpt")
    env = Environment(agent=Agent(poisoning({1})), participants=(Broken(bad=KeyError("lost")),))
    async with GymHost("gym-0", env) as host:
        stream = await host.run([row(0), row(1)])
        await trio.sleep(1.5)
        await host.prepare("c1", FAR)
        await host.commit("c1", str(tmp_path / "snap"), FAR)
        await host.resume("c1", FAR)
        assert [type(r) for r in await replies(stream)] == [Failed, Failed]
    opened, exported = [r for r in caplog.records if r.name == "gymckpt.gym"]
    assert "opening its sessions raised OSError" in opened.getMessage()
    assert "exporting its session state at checkpoint c1 raised KeyError" in exported.getMessage()
    assert_names_episode(exported.getMessage(), "1-0", 1, 0)
    assert opened.exc_info is not None and exported.exc_info is not None
    assert "def open" not in caplog.text  # tracebacks, not sources
    assert "raise OSError" in caplog.text and "raise self.bad" in caplog.text


async def test_failure_warnings_are_rate_limited_per_instance_with_a_count(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "gymckpt.gym"]

    async with GymHost("gym-0", Environment(agent=Agent(_raises))) as host:
        await replies(await host.run([row(r) for r in range(25)]))
        assert len(lines()) == 10  # the first ten, then one line per interval
        assert "one line every 30s" in lines()[-1]
        await trio.sleep(10.0)
        await replies(await host.run([row(r) for r in range(25, 30)]))
        assert len(lines()) == 10
        await trio.sleep(25.0)
        await replies(await host.run([row(r) for r in range(30, 32)]))
        assert len(lines()) == 11
        assert "(20 more failures not logged since the last line)" in lines()[-1]
        assert "(row 3" in lines()[-1] and "on gym-0" in lines()[-1]  # one of rows 30, 31
        assert host.failure_log.total == 32 and host.failure_log.suppressed == 1


# -- the trainer side: a Completed with a non-finite reward is a data failure; counted -------


async def test_the_dispatcher_refuses_a_non_finite_reward_from_the_wire_and_counts_failures(
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gymckpt.gym_adapter.host._turns as host_module

    def lying(instance: str, ep: Any, done: Done, limit: int) -> RunReply:
        if ep.info.row == 1:  # a Gym that does not check what it sends
            return Completed(ep.rollout_id, NAN, 1, None)
        if ep.info.row == 0:  # an int is a finite number: taken as a float
            return Completed(ep.rollout_id, 1, 1, None)
        return Completed(ep.rollout_id, 1.0, 1, None)

    monkeypatch.setattr(host_module, "completed_reply", lying)
    config = RuntimeConfig(max_row_attempts=2, data_failure_budget=10)
    async with (
        EmbeddedGym.host(
            Environment(agent=Agent(turns=1)), instances=1, work_dir=tmp_path / "gym"
        ) as gym,
        open_rollouts(
            gym, tmp_path, rows=3, group_size=1, config=config, handle_signals=False
        ) as ro,
    ):
        trained = [g.row async for batch in ro.batches(1) for g in batch]
        assert (await ro.checkpoint()).ok
        metrics = ro.metrics.snapshot()
    assert sorted(trained) == [0, 2]
    assert metrics["rollout/episode_failures_total"] == 2  # both attempts of row 1
    assert metrics["rollout/episode_failures_data_total"] == 2
    assert metrics.get("rollout/episode_failures_infra_total", 0) == 0


async def test_the_ledger_writer_refuses_a_non_finite_number_instead_of_writing_null() -> None:
    for result, where in [
        (EpisodeResult(NAN, 1), "reward nan"),
        (EpisodeResult(1.0, 1, {"x": [INF]}), "payload.x[0] is inf"),
    ]:
        ledger = RecoveryLedger(group_size=1)

        def play(ledger: RecoveryLedger = ledger, result: EpisodeResult = result) -> None:
            ledger.reserve_row(0)
            ledger.mark_dispatched(["0-0"], "gym-0", 1)
            ledger.complete("0-0", 1, result)

        await ledger.barrier.mutate(play)
        with pytest.raises(NotPlainData, match=re.escape(where)) as info:
            dump_ledger_snapshot(ledger.to_snapshot())
        assert "row 0 slot 0 attempt 0" in str(info.value)


async def test_a_checkpoint_that_fails_an_unexportable_episode_is_ok_and_restorable(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """End to end: the failed episode's reply is drained by the checkpoint like any reply on
    the wire, the snapshot restores, and every row is trained once."""

    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        store = ctx.session("store")
        if ctx.info.row == 0 and ctx.info.attempt == 0:
            store["poison"] = True  # attempt 0 of row 0 cannot be exported from here on
        await anyio.sleep(1.0)
        turns = 6 if ctx.info.row == 0 else 1
        return Done(1.0, payload=ctx.info.attempt) if ctx.turn + 1 >= turns else None

    env = Environment(agent=Agent(script), participants=(Store(bad={"a", "set"}),))
    trained: list[tuple[int, int]] = []
    outcomes = []
    for phase in (1, 2):
        async with (
            EmbeddedGym.host(
                env, instances=1, work_dir=tmp_path / "gym", config=HostConfig(lease_s=30.0)
            ) as gym,
            open_rollouts(
                gym, tmp_path, rows=4, group_size=1, max_rows_in_flight=4, handle_signals=False
            ) as ro,
        ):
            async with aclosing(ro.batches(1)) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    trained.extend((g.row, g.results[0].payload) for g in batch)
                    outcomes.append(await ro.checkpoint())
                    if phase == 1:
                        break
            if phase == 1:
                metrics = ro.metrics.snapshot()
    assert outcomes and all(o.ok for o in outcomes)
    assert metrics["rollout/episode_failures_data_total"] == 1
    assert sorted(r for r, _ in trained) == [0, 1, 2, 3]
    assert dict(trained)[0] == 1  # row 0 trained from its retry, attempt 1


@pytest.mark.parametrize(("bad", "what"), [(NAN, "is nan"), ({1}, "is a set")])
async def test_a_retained_state_that_cannot_be_journaled_fails_the_episode_not_the_instance(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, bad: Any, what: str
) -> None:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        ctx.session("store")["events"].append(bad if ctx.info.row == 0 else "ok")
        return Done(1.0)

    env = Environment(agent=Agent(script), participants=(Store(retained=True),))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        got = await replies(await host.run([row(0), row(1)]))
        assert sorted(type(r).__name__ for r in got) == ["Completed", "Failed"]
        (failed,) = [r for r in got if isinstance(r, Failed)]
        assert failed.rollout_id == "0-0" and failed.failure_class == "data"
        assert "journaled state" in failed.message and what in failed.message
        assert not host.dead
    journal = (tmp_path / "gym-0" / "sessions.journal").read_bytes()
    assert b"null" not in journal


async def test_a_restore_journals_the_committed_data_without_asking_export_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A snapshot that committed is restorable even if the participant's export fails after
    the restore: the journal is rewritten from the committed records, not from a second
    export, and a replacement replaying it continues the committed session."""

    class Spoiled(Store):
        def restore(self, data: Any) -> dict[str, Any]:
            return {**super().restore(data), "poison": True}

    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        ctx.session("store")["events"].append("booked")
        return Done(1.0)

    env = Environment(agent=Agent(script), participants=(Store(retained=True),))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        await replies(await host.run([row(0)]))
        await host.prepare("c1", FAR)
        commit = await host.commit("c1", "snap", FAR)
    spoiled = Environment(
        agent=Agent(script), participants=(Spoiled(retained=True, bad=RuntimeError("no")),)
    )
    async with GymHost("gym-0", spoiled, work_dir=tmp_path) as fresh:
        await fresh.restore("snap", record_of(commit), [], FAR)
        assert list(fresh.session_states("store")) == ["0-0"]
    async with GymHost("gym-0", env, work_dir=tmp_path, recover=True) as replacement:
        (view,) = replacement.session_states("store").values()
        assert view.state == {"events": ["booked"]}


def test_the_plain_data_check_names_the_place_and_lets_none_through() -> None:
    import dataclasses

    from gymckpt.runtime.lowlevel import checked_json

    @dataclasses.dataclass
    class Point:
        x: float
        y: Any = None

    assert checked_json({"a": [None, 1.5, (2, None)], "b": Point(1.0)}, "v") == (
        b'{"a":[null,1.5,[2,null]],"b":{"x":1.0,"y":null}}'
    )
    for value, where in [
        ({"a": (1, NAN)}, "v.a[1] is nan"),
        ({"p": Point(INF)}, "v.p.x is inf"),
        ({"k": {1: 2}}, "v.k: key 1 is int"),
        ([[None], {"s"}], "v[1] is a set"),
        ({"not id": [None, -INF]}, "v['not id'][1] is -inf"),
    ]:
        with pytest.raises(NotPlainData, match=re.escape(where)):
            checked_json(value, "v")
    np = pytest.importorskip("numpy")
    with pytest.raises(NotPlainData, match=re.escape("v.obs[1][0] is")):
        checked_json({"obs": np.array([[0.0, 1.0], [np.nan, 2.0]]), "n": None}, "v")


async def test_a_state_holding_none_is_committed_and_restored_as_it_was(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def script(ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        ctx.session("store")["events"].append(None)
        await anyio.sleep(1.0)
        return Done(1.0, payload=ctx.session("store")["events"]) if ctx.turn >= 1 else None

    env = Environment(agent=Agent(script), participants=(Store(),))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([row(0)])
        await trio.sleep(0.5)
        await host.prepare("c1", FAR)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    assert [e.rollout_id for e in commit.exported] == ["0-0"]
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        await fresh.restore(
            "snap", record_of(commit), [EpisodeRecord("0-0", "store", "gym-0")], FAR
        )
        (done,) = await replies(await fresh.run([RunRow("0-0-a1", 0, 0, 1, "0-0")]))
    assert done == Completed("0-0-a1", 1.0, 2, [None, None])
