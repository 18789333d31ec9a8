"""The sandbox on the Gym host, under trio's autojump clock: an unaligned cut takes an episode
in the middle of a turn at its step boundary's tree (the mark), and the restored turn runs again
against it, so its line is in the tree once; a tree a restore would refuse fails its episode
(data) at the commit, naming the path, and the other episodes commit and restore; a retained
sandbox is journaled, and an instance's replacement continues its tree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import attrs
import trio
import trio.testing

from gymckpt.gym_adapter import (
    Completed,
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.sandbox import Sandbox
from gymckpt.runtime import CheckpointMode, EpisodeRecord, InstanceRecord, ParticipantRecord

FAR = 1e9


class Writer:
    """Each turn appends ``turn N`` to ``log``, then works for a second; 3 turns. A row in
    ``escape`` plants a symlink out of its tree in turn 1."""

    name, kind = "agent", "simple_agent"

    def __init__(self, escape: frozenset[int] = frozenset()) -> None:
        self.escape = escape

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        box = ctx.session("sandbox")
        if ctx.turn == 3:
            return Done(1.0, payload={"log": box.read("log").decode(), "tree": box.list()})
        box.append("log", f"turn {ctx.turn}\n")
        if ctx.turn == 1 and ctx.info.row in self.escape:
            os.symlink("/etc", box.root / "out")
        await anyio.sleep(1.0)
        return None


def environment(tmp_path: Path, escape: frozenset[int] = frozenset()) -> Environment:
    template = tmp_path / "template"
    template.mkdir(exist_ok=True)
    (template / "log").write_text("")
    sandbox = Sandbox(template, tmp_path / "gym")
    return Environment(agent=Writer(escape), participants=(sandbox,))


def record_of(reply: Any) -> InstanceRecord:
    return InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )


async def _collect(stream: Any, into: list[RunReply]) -> None:
    async for batch in stream:
        into.extend(batch)


async def test_an_unaligned_cut_mid_turn_restores_the_boundary_tree_and_runs_the_turn_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = environment(tmp_path)
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await trio.sleep(1.5)  # in turn 1: its line is written, the turn is not over
        await host.prepare("c1", FAR, CheckpointMode.UNALIGNED)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    [exported] = commit.exported
    assert commit.mid_turn == 1  # taken inside turn 1, after its line was written
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        restored = await fresh.restore(
            "snap", record_of(commit), [EpisodeRecord("0-0", exported.owner, "gym-0")], FAR
        )
        assert restored.restored == ("0-0",)
        got: list[RunReply] = []
        await _collect(await fresh.run([RunRow("0-0-a1", 0, 0, 1, "0-0")]), got)
    [done] = got
    assert isinstance(done, Completed), done
    assert done.payload["log"] == "turn 0\nturn 1\nturn 2\n"  # turn 1's line once


async def test_a_tree_with_a_symlink_out_fails_its_episode_at_the_commit_naming_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = environment(tmp_path, escape=frozenset({0}))
    got: list[RunReply] = []
    async with GymHost("gym-0", env, work_dir=tmp_path) as host, trio.open_nursery() as nursery:
        nursery.start_soon(_collect, await host.run([RunRow("0-0", 0, 0, 0)]), got)
        nursery.start_soon(_collect, await host.run([RunRow("1-0", 1, 0, 0)]), got)
        await trio.sleep(1.5)
        await host.prepare("c1", FAR)
        commit = await host.commit("c1", "snap", FAR)
        assert [e.rollout_id for e in commit.exported] == ["1-0"]
        await host.resume("c1", FAR)
    failed = next(r for r in got if r.rollout_id == "0-0")
    assert isinstance(failed, Failed) and failed.failure_class == "data"
    assert "out resolve outside the tree" in failed.message
    async with GymHost("gym-0", env, work_dir=tmp_path) as fresh:
        restored = await fresh.restore(
            "snap",
            record_of(commit),
            [EpisodeRecord("1-0", commit.exported[0].owner, "gym-0")],
            FAR,
        )
        assert restored.restored == ("1-0",)
        again: list[RunReply] = []
        await _collect(await fresh.run([RunRow("1-0-a1", 1, 0, 1, "1-0")]), again)
    [done] = again
    assert isinstance(done, Completed) and done.payload["log"] == "turn 0\nturn 1\nturn 2\n"


async def test_a_retained_sandbox_is_journaled_and_a_replacement_continues_its_tree(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A retained sandbox (a workspace the world keeps) outlives its episode; the host journals
    its manifest after every turn, and the replacement of the instance (``recover=True``)
    materialises the same tree from the blob store."""
    env = environment(tmp_path)
    env = attrs.evolve(env, participants=(attrs.evolve(env.participants[0], retained=True),))
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        got: list[RunReply] = []
        await _collect(await host.run([RunRow("0-0", 0, 0, 0)]), got)
        [kept] = host.retained_sessions()["sandbox"].values()
    async with GymHost("gym-0", env, work_dir=tmp_path, recover=True) as again:
        [view] = again.session_states("sandbox").values()
        assert view.state.read("log") == b"turn 0\nturn 1\nturn 2\n"
        assert view.state.manifest() == kept.state


async def test_a_snapshot_restores_on_a_host_whose_sandbox_store_is_empty(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The participant-objects hook end to end: the commit keeps the objects the sandbox's
    states name (``object_refs``) with the snapshot; a host whose sandbox has a fresh, empty
    ``objects`` store gets them back before ``restore``, and the episode finishes."""
    env = environment(tmp_path)
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await trio.sleep(1.5)
        await host.prepare("c1", FAR, CheckpointMode.UNALIGNED)
        commit = await host.commit("c1", "snap", FAR)
        await stream.aclose()
    [exported] = commit.exported
    moved = Sandbox(tmp_path / "template", tmp_path / "another-machine")
    assert not moved.objects.root.exists()
    env2 = attrs.evolve(env, participants=(moved,))
    async with GymHost("gym-0", env2, work_dir=tmp_path) as fresh:
        restored = await fresh.restore(
            "snap", record_of(commit), [EpisodeRecord("0-0", exported.owner, "gym-0")], FAR
        )
        assert restored.restored == ("0-0",)
        got: list[RunReply] = []
        await _collect(await fresh.run([RunRow("0-0-a1", 0, 0, 1, "0-0")]), got)
    [done] = got
    assert isinstance(done, Completed), done
    assert done.payload["log"] == "turn 0\nturn 1\nturn 2\n"
