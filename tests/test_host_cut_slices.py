"""The unaligned cut in slices (``gym_adapter.host._cut``, ``ControlPlane._commit_cut``): no
scheduler step of the cut takes more than ``CUT_SLICE`` episodes, the loop runs other tasks
between two slices, and what the slicing lets happen between them keeps every episode exactly
once: an episode that ends after the cut's instant, before its slice comes, is taken at its
last step boundary and its final reply is held until the resume, so a restore replays its last
turn once.

The environment: each turn appends its number to a retained ``tally`` and asks the model once;
a call can be gated (it waits in a cancel scope the test ends). Virtual time (``MockClock``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from collections_seen import collections_seen

from gymckpt.gym_adapter import (
    CommitReply,
    Completed,
    Done,
    Environment,
    GymHost,
    HostConfig,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.host import _control, _cut, _records
from gymckpt.gym_adapter.host._cut import CUT_SLICE
from gymckpt.gym_adapter.host._episode import EpisodeInfo, call_id
from gymckpt.gym_adapter.host._episodes import DONE, Episode, request_digest
from gymckpt.gym_adapter.host._records import SORT_SLICE
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    rollout_id_for,
)

UNALIGNED = CheckpointMode.UNALIGNED
TURNS = 2


def key(row: int, turn: int, attempt: int = 0) -> str:
    """The capture key of the one model call of ``turn`` of slot ``row``-0."""
    digest = request_digest(orjson.dumps(f"q{turn}"))
    return f"{rollout_id_for(row, 0, attempt)}:{call_id(turn, digest, 0)}"


class Tally:
    """Retained: each turn of a slot appends its number (a mutation that must happen once)."""

    name, kind, retained = "tally", "environment", True

    def open(self, info: EpisodeInfo) -> Any:
        return {"turns": []}

    def export(self, state: Any) -> Any:
        return {"turns": list(state["turns"])}

    def restore(self, data: Any) -> Any:
        return {"turns": list(data["turns"])}


class Asker:
    """The agent: a turn mutates the tally, then asks the model once; ``TURNS`` turns."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"answers": []}

    def export(self, state: Any) -> Any:
        return {"answers": list(state["answers"])}

    def restore(self, data: Any) -> Any:
        return {"answers": list(data["answers"])}

    async def step(self, ctx: Any, state: Any) -> Done | None:
        ctx.session("tally")["turns"].append(ctx.turn)
        state["answers"].append(await ctx.model(f"q{ctx.turn}"))
        return Done(1.0) if ctx.turn + 1 == TURNS else None


@attrs.define
class GatedModel:
    """Answers every call; a gated key waits in ``scopes[k]`` until the test ends it."""

    gated: set[str] = attrs.field(factory=set)
    asked: list[str] = attrs.field(factory=list)
    scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)
    every_gate_reached: trio.Event = attrs.field(factory=trio.Event)

    async def __call__(self, k: str, request: Any, info: EpisodeInfo) -> str:
        self.asked.append(k)
        if k in self.gated:
            scope = self.scopes[k] = trio.CancelScope()
            if len(self.scopes) == len(self.gated):
                self.every_gate_reached.set()
            with scope:
                await trio.sleep_forever()
        return f"answer {k}"

    async def all_waiting(self) -> None:
        with trio.fail_after(30):
            await self.every_gate_reached.wait()


def deadline() -> float:
    return trio.current_time() + 30.0


@asynccontextmanager
async def host_at(tmp_path: Path, world: str, model: GatedModel) -> AsyncIterator[GymHost]:
    env = Environment(agent=Asker(), participants=(Tally(),), model=model)
    config = HostConfig(lease_s=600.0)
    async with GymHost("gym-0", env, work_dir=tmp_path / world, config=config) as host:
        yield host


def rows(n: int) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(n)]


class Steps(trio.abc.Instrument):
    """Counts every task step of the run (``now``: the current step's number)."""

    def __init__(self) -> None:
        self.now = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.now += 1


def slices_seen(
    monkeypatch: pytest.MonkeyPatch, steps: Steps, then: Callable[[int], None] | None = None
) -> list[tuple[int, int, list[Episode]]]:
    """Every call of the cut's ``take_cut`` as (episodes it took, the task step it ran in, the
    episodes); ``then(i)`` runs after the ``i``-th."""
    seen: list[tuple[int, int, list[Episode]]] = []
    real = _control.take_cut

    def counted(episodes: Sequence[Episode]) -> Any:
        episodes = list(episodes)
        seen.append((len(episodes), steps.now, episodes))
        out = real(episodes)
        if then is not None:
            then(len(seen) - 1)
        return out

    monkeypatch.setattr(_control, "take_cut", counted)
    return seen


async def test_no_step_of_the_cut_takes_more_than_cut_slice_episodes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``2 * CUT_SLICE + 3`` episodes, each inside its turn 1: the cut takes them in slices of
    at most ``CUT_SLICE``, each in a task step of its own (the cut yields to the loop between
    two), and all of them are taken, mid-turn, at step boundary 1."""
    n = 2 * CUT_SLICE + 3
    model = GatedModel(gated={key(r, 1) for r in range(n)})
    steps = Steps()
    seen = slices_seen(monkeypatch, steps)
    async with host_at(tmp_path, "world-a", model) as host:
        await host.run(rows(n))
        await model.all_waiting()
        await host.prepare("c1", deadline(), UNALIGNED)
        trio.lowlevel.add_instrument(steps)
        try:
            reply = await host.commit("c1", str(tmp_path / "snap"), deadline())
        finally:
            trio.lowlevel.remove_instrument(steps)
    sizes = [size for size, _, _ in seen]
    assert max(sizes) <= CUT_SLICE, f"one step of the cut took {max(sizes)} episodes"
    assert sum(sizes) == n and len(sizes) == 3
    at = [step for _, step, _ in seen]
    assert len(set(at)) == len(at), f"two slices of the cut ran in one task step ({at})"
    assert reply.mid_turn == n and len(reply.exported) == n
    assert {s.step_boundary for s in reply.sessions} == {1}


async def test_the_commit_sorts_the_cut_in_calls_of_bounded_work(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export thread sorts the cut's episodes by rollout ID: never in one C call of all of
    them (it holds the GIL, which the loop's thread waits for), in ``sorted_in_slices``."""
    n = SORT_SLICE + 3
    model = GatedModel(gated={key(r, 1) for r in range(n)})
    sorts: list[list[Any]] = []
    real = sorted

    def spy(items: Any, key: Any = None) -> list[Any]:
        sorts.append(list(items))
        return real(items, key=key)

    monkeypatch.setattr(_records, "sorted", spy, raising=False)
    async with host_at(tmp_path, "world-a", model) as host:
        await host.run(rows(n))
        await model.all_waiting()
        await host.prepare("c1", deadline(), UNALIGNED)
        reply = await host.commit("c1", str(tmp_path / "snap"), deadline())
    assert [e.rollout_id for e in reply.exported] == real(rollout_id_for(r, 0, 0) for r in range(n))
    cut = [s for s in sorts if s and isinstance(s[0], _cut.CutEpisode)]
    assert sum(len(s) for s in cut if len(s) <= SORT_SLICE) == n  # sorted a slice at a time
    assert max(len(s) for s in cut) == n  # then merged


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


async def next_replies(stream: Any, within_s: float) -> list[RunReply] | None:
    with trio.move_on_after(within_s):
        return list(await stream.__anext__())
    return None


async def test_an_episode_ending_between_two_slices_is_taken_at_its_boundary_exactly_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One episode per slice (``CUT_SLICE`` 1 here); the last row's call is let go once the
    first slice is taken, so it ends its last turn and its episode before its own slice comes.
    It is taken at step boundary 1 with that call completed (its own cut is its slice: nothing
    it did since the instant reached the trainer), its reply is not listed on the wire and
    reaches nobody until the resume; restored into a new world, its last turn runs once more:
    the tally holds each turn once, the call is answered from the capture."""
    n = 8
    last = rollout_id_for(n - 1, 0, 0)
    model = GatedModel(gated={key(r, 1) for r in range(n)})
    monkeypatch.setattr(_control, "CUT_SLICE", 1)
    seen = slices_seen(
        monkeypatch, Steps(), lambda i: model.scopes[key(n - 1, 1)].cancel() if i == 0 else None
    )
    root = tmp_path / "snap"
    async with host_at(tmp_path, "world-a", model) as host:
        stream = await host.run(rows(n))
        await model.all_waiting()
        await host.prepare("c1", deadline(), UNALIGNED)
        reply = await host.commit("c1", str(root), deadline())
        (at_its_slice,) = [ep for _, _, eps in seen for ep in eps if ep.rollout_id == last]
        assert at_its_slice.state == DONE, "the episode did not end before its slice"
        assert reply.on_wire == ()
        assert {s.rollout_id: s.step_boundary for s in reply.sessions}[last] == 1
        assert {e.rollout_id: e.capture_keys for e in reply.exported}[last] == (
            key(n - 1, 0),
            key(n - 1, 1),
        )
        assert await next_replies(stream, 20.0) is None, "a reply after the cut was delivered"
        await host.resume("c1", deadline())
        late = await next_replies(stream, 20.0)
        assert late is not None and [(r.rollout_id, type(r)) for r in late] == [(last, Completed)]
        for r in range(n - 1):
            model.scopes[key(r, 1)].cancel()

    again = GatedModel()
    record, episodes = manifest_parts(reply)
    async with host_at(tmp_path, "world-b", again) as host:
        restored = await host.restore(str(root), record, episodes, deadline())
        assert last in restored.restored
        tally = orjson.loads(orjson.dumps(host.session_states("tally")[f"{n - 1}-0"].state))
        assert tally == {"turns": [0]}, "taken after its boundary"
        stream = await host.run([RunRow(f"{last}-a1", n - 1, 0, 1, restored_from=last)])
        with trio.fail_after(60):
            got = [r async for batch in stream for r in batch]
        assert [type(r) for r in got] == [Completed]
        assert host.session_states("tally")[f"{n - 1}-0"].state == {"turns": [0, 1]}
    assert again.asked == [], "a call completed before the episode's cut asked again"


async def test_no_collection_runs_while_the_cut_is_taken_or_its_records_built(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each slice's ``take_cut`` and the export of the records from the marks (sorts, records,
    reply objects) run with no garbage collection, then promote what they made
    (``records_promoted``): a young collection there walks the cut's lists of 50k items and
    whatever the loop's thread put back in the young generations (gen1 pauses of 50-77 ms at
    200k on main). Collections are made due every 50 allocations here; none runs inside."""
    n = 2 * CUT_SLICE + 3
    model = GatedModel(gated={key(r, 1) for r in range(n)})
    inside: list[str] = []

    def spied(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            inside.append(name)
            try:
                return real(*args)
            finally:
                inside.pop()

        return call

    monkeypatch.setattr(_control, "take_cut", spied("take_cut", _control.take_cut))
    export = _control.ControlPlane._export_marks
    monkeypatch.setattr(_control.ControlPlane, "_export_marks", spied("export", export))
    async with host_at(tmp_path, "world-a", model) as host:
        await host.run(rows(n))
        await model.all_waiting()
        await host.prepare("c1", deadline(), UNALIGNED)
        with collections_seen((50, 1, 1), lambda: inside[-1] if inside else None) as during:
            reply = await host.commit("c1", str(tmp_path / "snap"), deadline())
    assert during == [], f"{len(during)} collections inside the cut or its export"
    assert len(reply.exported) == n and reply.mid_turn == n
