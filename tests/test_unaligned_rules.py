"""The unaligned checkpoint's rules, end to end on the Gym host and through the trainer.

An unaligned checkpoint never waits for a turn: ``prepare`` parks nothing, and ``commit`` is
the instance's *cut*. Each rule here is checked where a user would see it break:

* an episode in the middle of a turn is taken at its last step boundary (the session states it
  had there, not the ones its turn has changed since) with the model calls it completed before
  the cut, so after a restore its turn replays from that boundary: each mutation once, no
  completed call asked twice, the call in progress asked again;
* a reply produced after the cut is held: not listed on the wire, not delivered, until the
  checkpoint resumes (or the lease reopens the instance, or a second commit of the checkpoint
  takes a new cut, which lists it);
* nothing parks, episodes pass their boundaries on; an environment that opts out
  (``Environment(unaligned=False)``) is parked as an aligned checkpoint parks it;
* what the cut took is fixed at the cut: a call completed, or a turn ended, after it (while
  the commit writes its records) is not in the snapshot.

The environment is our own: each turn appends its number to a retained ``tally`` (a mutation
kept across episodes and journaled), then asks the model twice. A call can be *gated*: it waits
in a cancel scope the test ends, so a cut lands exactly inside a turn. Virtual time throughout
(trio's ``MockClock``); a wait that must not end is bounded in virtual seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    CommitReply,
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    GymHost,
    HostConfig,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.host._episode import EpisodeInfo, call_id, split_capture_key
from gymckpt.gym_adapter.host._episodes import request_digest
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    InstanceRecord,
    ParticipantRecord,
    RuntimeConfig,
    load_snapshot,
    rollout_id_for,
)

UNALIGNED = CheckpointMode.UNALIGNED
TURNS = 3
"""Every episode plays three turns of two model calls each."""


REQUESTS = ("first", "second")
"""A turn's two requests, in the order it asks them."""


def key(row: int, turn: int, call: int, attempt: int = 0) -> str:
    """The capture key of model call ``call`` (of ``REQUESTS``) of slot ``row``-0 asked by
    attempt ``attempt``."""
    request = orjson.dumps(REQUESTS[call])
    digest = request_digest(request)
    return f"{rollout_id_for(row, 0, attempt)}:{call_id(turn, digest, 0)}"


def answer(k: str) -> str:
    """The model's answer to call ``k``: the same for every attempt of the slot (a
    deterministic model answers the question, not the attempt that asks it)."""
    attempt, call = split_capture_key(k)
    return f"answer {attempt.split('-a')[0]}:{call}"


def answers(row: int, turns: int = TURNS) -> list[list[str]]:
    """The trajectory of ``row`` after ``turns`` turns, every call answered once."""
    return [[answer(key(row, t, 0)), answer(key(row, t, 1))] for t in range(turns)]


class Tally:
    """Retained: each turn of a slot appends its number (a mutation that must happen once)."""

    name, kind, retained = "tally", "environment", True

    def open(self, info: EpisodeInfo) -> Any:
        return {"turns": []}

    def export(self, state: Any) -> Any:
        return {"turns": list(state["turns"])}

    def restore(self, data: Any) -> Any:
        return {"turns": list(data["turns"])}


HOLDS = 5
"""Row 5 holds itself at its step boundary 1 (``ctx.hold()``) until a checkpoint is prepared."""


class Relay:
    """The agent: a turn mutates the tally, then asks the model twice; ``TURNS`` turns."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"answers": []}

    def export(self, state: Any) -> Any:
        return {"answers": [list(a) for a in state["answers"]]}

    def restore(self, data: Any) -> Any:
        return {"answers": [list(a) for a in data["answers"]]}

    async def step(self, ctx: Any, state: Any) -> Done | None:
        ctx.session("tally")["turns"].append(ctx.turn)
        first = await ctx.model(REQUESTS[0])
        second = await ctx.model(REQUESTS[1])
        state["answers"].append([first, second])
        if ctx.info.row == HOLDS and ctx.turn == 0:
            ctx.hold()
        if ctx.turn + 1 == TURNS:
            return Done(1.0, payload=state["answers"])
        return None


@attrs.define
class GatedModel:
    """The model, outside Gym (one per world): answers every call, records each ask in order.
    A gated key's call waits in a cancel scope (``scopes[k]``) until the test ends it;
    ``reached(k)`` is set once ``k`` was asked."""

    gated: set[str] = attrs.field(factory=set)
    asked: list[str] = attrs.field(factory=list)
    scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)
    _reached: dict[str, trio.Event] = attrs.field(factory=dict)

    def reached(self, k: str) -> trio.Event:
        return self._reached.setdefault(k, trio.Event())

    async def __call__(self, k: str, request: Any, info: EpisodeInfo) -> str:
        self.asked.append(k)
        if k in self.gated:
            scope = self.scopes[k] = trio.CancelScope()
            self.reached(k).set()
            with scope:
                await trio.sleep_forever()
        else:
            self.reached(k).set()
        return answer(k)

    def release(self, k: str) -> None:
        self.scopes[k].cancel()


def environment(model: GatedModel, *, unaligned: bool = True) -> Environment:
    return Environment(agent=Relay(), participants=(Tally(),), model=model, unaligned=unaligned)


def deadline(seconds: float = 30.0) -> float:
    return trio.current_time() + seconds


@asynccontextmanager
async def host_at(
    tmp_path: Path, world: str, model: GatedModel, *, lease_s: float = 600.0, unaligned: bool = True
) -> AsyncIterator[GymHost]:
    env = environment(model, unaligned=unaligned)
    config = HostConfig(lease_s=lease_s)
    async with GymHost("gym-0", env, work_dir=tmp_path / world, config=config) as host:
        yield host


def row(r: int) -> RunRow:
    return RunRow(rollout_id_for(r, 0, 0), r, 0, 0)


async def reached(model: GatedModel, *keys: str) -> None:
    with trio.fail_after(30):
        for k in keys:
            await model.reached(k).wait()


async def next_replies(stream: ReplyStream, within_s: float) -> list[RunReply] | None:
    """The next batch of ``stream`` within ``within_s`` virtual seconds, or None."""
    with trio.move_on_after(within_s):
        try:
            return list(await stream.__anext__())
        except StopAsyncIteration:
            raise AssertionError("the reply stream ended before its replies") from None
    return None


def manifest_parts(reply: CommitReply) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    """What a snapshot's manifest holds of this commit (as the coordinator writes it)."""
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


async def replay(
    tmp_path: Path, root: Path, reply: CommitReply, rid: str, r: int
) -> tuple[GatedModel, Completed, dict[str, Any], dict[str, Any]]:
    """Restore ``reply``'s snapshot into a fresh host (a new world, its own model) and run
    ``rid`` on as attempt + 1. Returns that world's model, the final reply, and the tally and
    agent states the restore installed."""
    model = GatedModel()
    record, episodes = manifest_parts(reply)
    async with host_at(tmp_path, "world-b", model) as host:
        restored = await host.restore(str(root), record, episodes, deadline())
        assert rid in restored.restored
        # copies: a session view is the live state, which the claim's turns change
        tally = orjson.loads(orjson.dumps(host.session_states("tally")[f"{r}-0"].state))
        agent = orjson.loads(orjson.dumps(host.session_states("agent")[f"{r}-0"].state))
        stream = await host.run([RunRow(f"{rid}-a1", r, 0, 1, restored_from=rid)])
        with trio.fail_after(60):
            got = [reply async for batch in stream for reply in batch]
        assert len(got) == 1 and isinstance(got[0], Completed), got
        final_tally = host.session_states("tally")[f"{r}-0"].state
    assert final_tally == {"turns": list(range(TURNS))}, "each turn's mutation exactly once"
    return model, got[0], tally, agent


# -- a mid-turn episode: taken at its boundary, its post-cut reply held -----------------------


async def test_a_mid_turn_episode_is_taken_at_its_boundary_and_its_later_reply_held(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Row 0 is cut in turn 1, inside its second call (its tally already holds turn 1's
    mutation, its first call of turn 1 is answered). The snapshot holds it as it was at step
    boundary 1 with the three calls completed before the cut; the reply it sends when its
    turns end after the cut reaches nobody until the checkpoint resumes. Restored into a new
    world, attempt + 1 replays turn 1: turn 1's first call answered from the capture, its
    second (in progress at the cut) asked again, each turn's mutation once."""
    model = GatedModel(gated={key(0, 1, 1)})
    root = tmp_path / "snap"
    async with host_at(tmp_path, "world-a", model) as host:
        stream = await host.run([row(0)])
        await reached(model, key(0, 1, 1))
        assert host.session_states("tally")["0-0"].state == {"turns": [0, 1]}  # turn 1 mutated

        prepared = await host.prepare("c1", deadline(), UNALIGNED)
        assert prepared.parked == 0
        reply = await host.commit("c1", str(root), deadline())
        assert reply.mid_turn == 1
        assert [(e.rollout_id, e.capture_keys) for e in reply.exported] == [
            ("0-0", (key(0, 0, 0), key(0, 0, 1), key(0, 1, 0)))
        ]
        assert [(s.rollout_id, s.step_boundary) for s in reply.sessions] == [("0-0", 1)]
        assert reply.on_wire == ()

        model.release(key(0, 1, 1))  # the old attempt goes on: turns 1 and 2 end after the cut
        await reached(model, key(0, 2, 1))
        assert await next_replies(stream, 20.0) is None, "a reply after the cut was delivered"
        assert host.inventory().on_wire == ()

        await host.resume("c1", deadline())
        late = await next_replies(stream, 20.0)
        assert late is not None, "the held reply was never delivered after the resume"
        assert [(r.rollout_id, type(r).__name__) for r in late] == [("0-0", "Completed")]
    assert model.asked == [key(0, t, c) for t in range(TURNS) for c in (0, 1)]

    again, done, tally, agent = await replay(tmp_path, root, reply, "0-0", 0)
    assert tally == {"turns": [0]}, "taken at its current state, not at its step boundary"
    assert agent == {"answers": answers(0, 1)}
    assert again.asked == [key(0, 1, 1, 1), key(0, 2, 0, 1), key(0, 2, 1, 1)], (
        "a completed call asked twice, or the call in progress not asked again"
    )
    assert done.turns == TURNS and done.payload == answers(0)


# -- what the cut took is fixed at the cut ---------------------------------------------------


async def test_a_call_completed_in_the_cuts_scheduler_batch_is_in_the_snapshot_only_before_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows 0 and 1 wait in their last call (turn 2, call 1) when the commit starts. One call
    is ended so that it resumes before the commit's task in the next scheduler batch, the other
    (a deadline that expires as that batch forms) after it: trio runs a batch forward or
    backward, so one of them completes its call, its turn and its episode before the cut, the
    other right after it, while the commit (one scheduling point after its cut) writes its
    records. The one before is not exported and its reply is on the wire; the one after is
    exported at step boundary 2 without that call, and its reply waits for the resume.
    Restored, it asks that call again, and nothing else.

    trio runs each batch forward or backward; under pytest it shuffles them instead
    (pytest-trio makes its scheduler deterministic for Hypothesis), which would leave both
    calls on the same side of the cut a third of the time: trio's own rule is put back here."""
    monkeypatch.setattr(trio._core._run, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    last = {r: key(r, 2, 1) for r in (0, 1)}
    model = GatedModel(gated=set(last.values()))
    root = tmp_path / "snap"
    async with host_at(tmp_path, "world-a", model) as host:
        stream = await host.run([row(0), row(1)])
        await reached(model, *last.values())
        await host.prepare("c1", deadline(), UNALIGNED)
        model.release(last[0])  # rescheduled now: before the commit's task in the next batch
        model.scopes[last[1]].deadline = trio.current_time()  # as that batch forms: after it
        reply = await host.commit("c1", str(root), deadline())
        exported = {e.rollout_id: e.capture_keys for e in reply.exported}
        boundaries = {s.rollout_id: s.step_boundary for s in reply.sessions}
        assert len(exported) == 1, (exported, reply.on_wire)  # one on each side of the cut
        (cut,) = exported
        r = int(cut.split("-")[0])
        before = f"{1 - r}-0"
        assert reply.on_wire == (before,)
        assert exported[cut] == tuple(key(r, t, c) for t in range(3) for c in (0, 1))[:-1], (
            "a call completed after the cut is in the snapshot"
        )
        assert boundaries == {cut: 2}, "the turn recorded is not the boundary the cut took"
        assert reply.mid_turn == 1
        first = await next_replies(stream, 20.0)
        assert first is not None and [x.rollout_id for x in first] == [before]
        assert await next_replies(stream, 20.0) is None, "a reply after the cut was delivered"
        await host.resume("c1", deadline())
        late = await next_replies(stream, 20.0)
        assert late is not None and [x.rollout_id for x in late] == [cut]

    again, done, tally, agent = await replay(tmp_path, root, reply, cut, r)
    assert tally == {"turns": [0, 1]} and agent == {"answers": answers(r, 2)}
    assert again.asked == [key(r, 2, 1, attempt=1)]
    assert done.turns == TURNS and done.payload == answers(r)


# -- held replies: released on resume, on the lease, by a second commit ------------------------


async def test_the_lease_releases_the_replies_held_since_the_cut(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """No resume comes (the trainer died mid-checkpoint): the lease reopens the instance after
    ``lease_s`` and puts the held reply on the wire then, not before."""
    model = GatedModel(gated={key(0, 1, 1)})
    async with host_at(tmp_path, "world-a", model, lease_s=5.0) as host:
        stream = await host.run([row(0)])
        await reached(model, key(0, 1, 1))
        await host.prepare("c1", deadline(), UNALIGNED)
        await host.commit("c1", str(tmp_path / "snap"), deadline())
        committed_at = trio.current_time()
        model.release(key(0, 1, 1))
        late = await next_replies(stream, 60.0)
        assert late is not None, "the lease reopened the instance but kept its replies held"
        assert [x.rollout_id for x in late] == ["0-0"]
        assert trio.current_time() >= committed_at + 5.0
        assert host.statistics().lease_reopened == 1


async def test_a_second_commit_of_the_checkpoint_lists_what_the_first_held(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A checkpoint may commit an instance again (a new cut). A reply held since the first cut
    was produced before the second: the second lists it on the wire (the checkpoint drains
    it) and no longer exports its episode. It is delivered once."""
    model = GatedModel(gated={key(0, 1, 1), key(1, 0, 1)})
    async with host_at(tmp_path, "world-a", model) as host:
        stream = await host.run([row(0), row(1)])
        await reached(model, key(0, 1, 1), key(1, 0, 1))
        await host.prepare("c1", deadline(), UNALIGNED)
        first = await host.commit("c1", str(tmp_path / "snap-1"), deadline())
        assert [e.rollout_id for e in first.exported] == ["0-0", "1-0"]
        model.release(key(0, 1, 1))
        await reached(model, key(0, 2, 1))
        assert await next_replies(stream, 20.0) is None  # held
        second = await host.commit("c1", str(tmp_path / "snap-2"), deadline())
        assert [e.rollout_id for e in second.exported] == ["1-0"]
        assert second.on_wire == ("0-0",), "a reply held since the first cut is not on the wire"
        assert second.mid_turn == 1
        got = await next_replies(stream, 20.0)
        assert got is not None and [x.rollout_id for x in got] == ["0-0"]
        await host.resume("c1", deadline())
        model.release(key(1, 0, 1))
        rest = await next_replies(stream, 20.0)
        assert rest is not None and [x.rollout_id for x in rest] == ["1-0"]


# -- nothing parks; an environment that opts out parks ------------------------------------------


async def test_an_unaligned_prepare_parks_nothing_and_episodes_pass_their_boundaries(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """With row 0 inside a turn that does not end, the prepare returns at once; row 1 goes on
    through its boundaries and ends while the checkpoint is open, and so does row 5, which
    held itself at a boundary until a checkpoint came (it is let go, not parked)."""
    model = GatedModel(gated={key(0, 0, 1), key(1, 0, 1)})
    async with host_at(tmp_path, "world-a", model) as host:
        stream = await host.run([row(0), row(1), row(HOLDS)])
        await reached(model, key(0, 0, 1), key(1, 0, 1), key(HOLDS, 0, 1))
        await trio.sleep(5.0)
        assert key(HOLDS, 1, 0) not in model.asked  # held at boundary 1
        try:
            prepared = await host.prepare("c1", deadline(5.0), UNALIGNED)
        except GymCallTimeout as exc:
            raise AssertionError(f"an unaligned prepare waited for a turn to end: {exc}") from exc
        assert prepared.parked == 0
        model.release(key(1, 0, 1))
        try:
            await reached(model, key(1, 2, 1), key(HOLDS, 2, 1))
        except trio.TooSlowError:
            raise AssertionError(
                "an episode parked at a boundary of an unaligned checkpoint"
            ) from None
        assert host.inventory().parked == ()
        reply = await host.commit("c1", str(tmp_path / "snap"), deadline())
        assert [e.rollout_id for e in reply.exported] == ["0-0"] and reply.mid_turn == 1
        assert reply.on_wire == ("1-0", f"{HOLDS}-0")  # ended before the cut: drained
        got = await next_replies(stream, 20.0)
        assert got is not None and [x.rollout_id for x in got] == ["1-0", f"{HOLDS}-0"]


async def test_an_environment_that_opts_out_is_parked_by_an_unaligned_checkpoint(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``Environment(unaligned=False)`` keeps no boundary marks: an unaligned checkpoint parks
    its episodes at their next boundary, as an aligned one does, and exports them there."""
    model = GatedModel(gated={key(0, 1, 1)})
    root = tmp_path / "snap"
    async with host_at(tmp_path, "world-a", model, unaligned=False) as host:
        await host.run([row(0)])
        await reached(model, key(0, 1, 1))
        prepared: list[Any] = []

        async def prepare() -> None:
            prepared.append(await host.prepare("c1", deadline(), UNALIGNED))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prepare)
            await trio.sleep(5.0)
            assert prepared == [], "an opted-out environment's turn in flight was not waited for"
            model.release(key(0, 1, 1))
        assert prepared[0].parked == 1
        reply = await host.commit("c1", str(root), deadline())
        assert reply.mid_turn == 0
        assert [(s.rollout_id, s.step_boundary) for s in reply.sessions] == [("0-0", 2)]
        assert host.inventory().parked == ("0-0",)
        await host.resume("c1", deadline())

    _, done, tally, _agent = await replay(tmp_path, root, reply, "0-0", 0)
    assert tally == {"turns": [0, 1]}
    assert done.payload == answers(0)


# -- through the trainer: exactly once across a crash ----------------------------------------


CONFIG = RuntimeConfig(
    control_timeout_s=5.0,
    reply_grace_s=0.5,
    drain_timeout_s=10.0,
    lease_s=600.0,
    checkpoint_mode="unaligned",
)


@asynccontextmanager
async def embedded(tmp_path: Path, world: str, model: GatedModel) -> AsyncIterator[EmbeddedGym]:
    async with EmbeddedGym.host(
        environment(model), instances=1, work_dir=tmp_path / world, config=HostConfig(lease_s=600.0)
    ) as gym:
        yield gym


async def test_through_the_trainer_a_checkpoint_mid_turn_restores_exactly_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Four rows of one episode each. Rows 1-3 are trained, then the checkpoint comes while
    row 0 is inside turn 1; row 0 then ends in the old world, is trained there, and the trainer
    crashes. A new trainer on a new Gym restores the snapshot: row 0 resumes at its boundary
    (attempt + 1), asks only the call that was in progress and the later ones, and every row is
    trained once in the restored lineage, each turn's mutation once."""
    model = GatedModel(gated={key(0, 1, 1)})
    work = tmp_path / "work"
    trained: list[int] = []
    async with embedded(tmp_path, "world-a", model) as gym:
        async with open_rollouts(
            gym, work, rows=4, group_size=1, config=CONFIG, max_rows_in_flight=4
        ) as ro:
            outcome = None
            steps = ro.batches(1, state=lambda: orjson.dumps(trained))
            async with aclosing(steps) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    trained.extend(g.row for g in batch)
                    if len(trained) == 3:
                        await reached(model, key(0, 1, 1))
                        outcome = await ro.checkpoint(orjson.dumps(trained))
                        assert outcome.ok, outcome.error
                        assert outcome.mid_turn == 1
                        model.release(key(0, 1, 1))
                    elif len(trained) == 4:
                        break  # the crash: nothing more is saved
    assert outcome is not None and outcome.snapshot is not None
    assert trained[3] == 0 and sorted(trained) == [0, 1, 2, 3]
    snap = load_snapshot(outcome.snapshot.path)
    assert [e.capture_keys for e in snap.manifest.episodes] == [
        (key(0, 0, 0), key(0, 0, 1), key(0, 1, 0))
    ]

    again = GatedModel()
    async with embedded(tmp_path, "world-b", again) as gym:
        async with open_rollouts(
            gym, work, rows=4, group_size=1, config=CONFIG, max_rows_in_flight=4
        ) as ro:
            assert ro.trainer_state is not None
            before = orjson.loads(ro.trainer_state)
            after: list[int] = []
            payloads: dict[int, Any] = {}
            async for batch in ro.batches(1):
                for g in batch:
                    after.append(g.row)
                    payloads[g.row] = [r.payload for r in g.results]
            tally = gym.sim("gym-0").session_states("tally")
    assert sorted(before) == [1, 2, 3] and after == [0], (before, after)
    assert payloads[0] == [answers(0)]
    assert again.asked == [key(0, 1, 1, 1), key(0, 2, 0, 1), key(0, 2, 1, 1)]
    assert {k: v.state for k, v in tally.items()} == {
        f"{r}-0": {"turns": [0, 1, 2]} for r in range(4)
    }
