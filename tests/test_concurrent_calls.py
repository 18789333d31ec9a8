"""Concurrent model calls in one turn (issue 31, finding 2): a call's identity does not depend on
the order the scheduler starts it in, so after a restore, aligned or unaligned, every call the
snapshot captured is answered from the capture and none is asked again.

The agent asks ``len(PARTS)`` requests at once each turn, two of them identical, with trio's
nursery, an anyio task group or ``asyncio.gather``. Before its call a branch waits a moment
that depends on the attempt's parity (as a tool's latency varies), so a restored attempt starts
its calls in the opposite order to the attempt that was cut; trio randomises the rest. The
calls done, the turn waits a second, then appends its number to a retained ``tally`` (a
mutation that must happen once). An unaligned cut lands there: inside turn 1, all of its calls
complete. ``ROWS`` episodes, so that a start-order call id (the old ``t{turn}-c{n}``) fails
many of them, whatever order trio picks. Virtual time (trio's ``MockClock``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    CommitReply,
    Completed,
    Done,
    Environment,
    EpisodeInfo,
    Failed,
    GymHost,
    HostStatistics,
    RunReply,
    RunRow,
)
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    rollout_id_for,
)

ROWS = 16
TURNS = 3
PARTS = ("plan", "search", "plan", "code")
"""A turn's requests, asked at once: ``plan`` twice (identical requests are interchangeable)."""
CUT_AT = 1.9
"""Inside turn 1 of every episode, after its calls completed (turn 0 ends by 1.4 s; turn 1's
calls are done 0.4 s after it starts, its mutation comes a second after them)."""


class Tally:
    """Retained: each turn of a slot appends its number (a mutation that must happen once)."""

    name, kind, retained = "tally", "environment", True

    def open(self, info: EpisodeInfo) -> Any:
        return []

    def export(self, state: Any) -> Any:
        return list(state)

    def restore(self, data: Any) -> Any:
        return list(data)


@attrs.define
class Fanout:
    """The agent: ``PARTS`` model calls at once (``how``: trio, anyio or asyncio), then the
    tally. ``changed``: asks ``code`` as ``code!`` (a request other than the captured one)."""

    how: str
    changed: bool = False
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"answers": []}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Done | None:
        attempt = ctx.info.attempt
        answers: list[Any] = [None] * len(PARTS)

        async def ask(i: int) -> None:
            # a tool's latency before the call: the opposite start order on the next attempt
            order = i if attempt % 2 == 0 else len(PARTS) - 1 - i
            if self.how == "asyncio":
                await asyncio.sleep(0.01 * order)
            else:
                await anyio.sleep(0.01 * order)
            part = PARTS[i] + ("!" if self.changed and PARTS[i] == "code" else "")
            answers[i] = await ctx.model({"turn": ctx.turn, "part": part})

        if self.how == "trio":
            async with trio.open_nursery() as nursery:
                for i in range(len(PARTS)):
                    nursery.start_soon(ask, i)
        elif self.how == "anyio":
            async with anyio.create_task_group() as tg:
                for i in range(len(PARTS)):
                    tg.start_soon(ask, i)
        else:
            await asyncio.gather(*(ask(i) for i in range(len(PARTS))))
        state["answers"].append(answers)
        await anyio.sleep(1.0)
        ctx.session("tally").append(ctx.turn)
        return Done(1.0, payload=state["answers"]) if ctx.turn + 1 == TURNS else None


@attrs.define
class Model:
    """Answers the question (the same for every attempt); ``asked`` counts each (slot, turn,
    part) it was asked. Its latency depends on the request and the row."""

    asyncio: bool = False
    asked: Counter[tuple[str, int, str]] = attrs.field(factory=Counter)

    async def __call__(self, key: str, request: Any, info: EpisodeInfo) -> Any:
        self.asked[(info.session_key, request["turn"], request["part"])] += 1
        latency = 0.1 * (1 + (len(request["part"]) + info.row) % 3)
        if self.asyncio:
            await asyncio.sleep(latency)
        else:
            await trio.sleep(latency)
        return f"{request['part']}@{request['turn']}"


def environment(how: str, model: Model, changed: bool = False) -> Environment:
    return Environment(agent=Fanout(how, changed), participants=(Tally(),), model=model)


def expected_answers() -> list[list[str]]:
    return [[f"{p}@{t}" for p in PARTS] for t in range(TURNS)]


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


async def replies(stream: Any) -> list[RunReply]:
    return [r async for batch in stream for r in batch]


@attrs.define
class Run:
    """What ``cut_and_restore`` saw: the commit, the claims' replies, the model of each host,
    the new host's statistics and its tally sessions."""

    reply: CommitReply
    done: list[RunReply]
    first: Model
    second: Model
    stats: HostStatistics
    tallies: dict[str, Any]


async def cut_and_restore(
    tmp_path: Path, how: str, mode: CheckpointMode, *, changed: bool = False
) -> Run:
    """Run ``ROWS`` episodes, checkpoint at ``CUT_AT`` (``mode``), restore into a fresh host,
    let attempt 1 claim each."""
    root = tmp_path / "snap"
    first = Model(asyncio=how == "asyncio")
    async with GymHost("gym-0", environment(how, first)) as host:
        start = trio.current_time()
        stream = await host.run([RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(ROWS)])
        await trio.sleep_until(start + CUT_AT)
        await host.prepare("c1", deadline(), mode)
        reply = await host.commit("c1", str(root), deadline())
        await stream.aclose()
    assert len(reply.exported) == ROWS
    if mode is CheckpointMode.UNALIGNED:
        assert reply.mid_turn == ROWS and {s.step_boundary for s in reply.sessions} == {1}
    else:
        assert {s.step_boundary for s in reply.sessions} == {2}
    record, episodes = manifest_parts(reply)
    second = Model(asyncio=how == "asyncio")
    fresh = GymHost("gym-0", environment(how, second, changed), work_dir=tmp_path / "work")
    async with fresh:
        await fresh.restore(str(root), record, episodes, deadline())
        claims = [
            RunRow(rollout_id_for(r, 0, 1), r, 0, 1, rollout_id_for(r, 0, 0)) for r in range(ROWS)
        ]
        done = await replies(await fresh.run(claims))
        tallies = {k: v.state for k, v in fresh.session_states("tally").items()}
        stats = fresh.statistics()
    assert len(done) == ROWS
    return Run(reply, done, first, second, stats, tallies)


@pytest.mark.parametrize("how", ["trio", "anyio", "asyncio"])
@pytest.mark.parametrize("mode", [CheckpointMode.UNALIGNED, CheckpointMode.ALIGNED])
async def test_concurrent_calls_are_replayed_after_a_restore_and_none_is_asked_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, how: str, mode: CheckpointMode
) -> None:
    run = await cut_and_restore(tmp_path, how, mode)
    failed = [r for r in run.done if not isinstance(r, Completed)]
    assert not failed, failed[:2]
    assert all(isinstance(r, Completed) and r.payload == expected_answers() for r in run.done)
    # unaligned, turn 1's calls (all complete at the cut) are answered from the capture
    replayed = ROWS * len(PARTS) if mode is CheckpointMode.UNALIGNED else 0
    assert run.stats.model_replays == replayed
    # each question asked once across both hosts (``plan`` twice a turn: it is in PARTS twice)
    both = run.first.asked + run.second.asked
    assert len(both) == ROWS * TURNS * len(set(PARTS))
    assert all(n == PARTS.count(part) for (_, _, part), n in both.items())
    asked_again = [k for k in run.second.asked if k in run.first.asked]
    assert not asked_again, asked_again[:4]
    assert run.tallies == {f"{r}-0": [0, 1, 2] for r in range(ROWS)}  # each mutation once


async def test_a_restored_turn_that_asks_a_changed_request_fails_closed_after_asking_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The cut took turn 1 with its four calls done; the restored agent asks ``code!`` where
    the capture holds ``code``: the other three are answered from the capture, ``code!`` is
    asked of the model (it may have been the call in flight at the cut), and when the turn ends
    the staged ``code`` was never asked again: the episode fails as data, naming it."""
    run = await cut_and_restore(tmp_path, "trio", CheckpointMode.UNALIGNED, changed=True)
    assert all(isinstance(r, Failed) and r.failure_class == "data" for r in run.done)
    message = run.done[0].message if isinstance(run.done[0], Failed) else ""
    assert "restored turn 1 ended without asking again 1 model call(s)" in message, message
    assert set(run.second.asked) == {(f"{r}-0", 1, "code!") for r in range(ROWS)}
    assert run.stats.model_replays == ROWS * 3
