"""Aligned checkpoints complete whatever the turn length (the alignment timeout).

An aligned checkpoint parks every episode at its next step boundary, but waits for that at most
``RuntimeConfig.alignment_timeout_s`` (Flink's aligned-checkpoint timeout): the episodes still
inside a turn then are taken unaligned by that checkpoint, at their last step boundary with the
model calls they had completed. So one long turn (a long generation, a test suite run) neither
fails checkpoints nor keeps the other episodes parked for longer than the timeout, and a
restore of such a checkpoint is exactly once: each turn's mutation once, no completed model call
asked again. An environment that opts out of unaligned cuts has no boundary marks to cut at: it
is waited for until the control timeout, as without an alignment timeout.

The environment: each turn appends its number to the episode's ``tally`` (a mutation that must
happen once), asks the model once, then works ``SHORT_S``; turn 1 of row 0 works ``LONG_S``.
Virtual time throughout (``MockClock``); the model counts every ask by row, turn and call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import anyio
import attrs
import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.demo.journal import JOURNAL
from gymckpt.app.simulation.modes import ModeWatch
from gymckpt.gym_adapter import (
    CommitReply,
    Done,
    EmbeddedGym,
    Environment,
    EnvironmentRef,
    GymHost,
    HostConfig,
    HttpGym,
    InstanceInventory,
    PrepareReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_from_environ_path,
)
from gymckpt.gym_adapter.host._episode import EpisodeInfo, parse_call_id, split_capture_key
from gymckpt.gym_adapter.host._episodes import BOUNDARY, MOVING, Episode
from gymckpt.gym_adapter.host._parking import Parking
from gymckpt.nurseries import CheckpointOutcome, open_rollouts
from gymckpt.runtime import (
    CheckpointMode,
    GymCallTimeout,
    ManifestError,
    RuntimeConfig,
    SnapshotStore,
    rollout_id_for,
    runtime_config_from_toml,
)
from gymckpt.testing import ConformanceError, check_backend

LONG_S = 120.0
"""Row 0's turn 1: longer than every timeout (control 10 s, lease 60 s)."""
SHORT_S = 0.5
TURNS = 3
EVERY_S = 5.0
"""The trainer checkpoints every 5 virtual seconds."""
ROWS = 160
"""Rows 1.. keep three slots busy with short episodes (1.5 s each) while row 0's turn runs."""


@attrs.define
class World:
    """What the episodes did, seen from outside Gym: model asks by (row, turn, call), and when
    each turn of each attempt started and ended."""

    asked: Counter[tuple[int, int, int]] = attrs.field(factory=Counter)
    turns: dict[str, list[tuple[int, float, float]]] = attrs.field(factory=dict)
    long_turn: list[tuple[float, float]] = attrs.field(factory=list)

    async def model(self, key: str, request: Any, info: EpisodeInfo) -> str:
        call = parse_call_id(split_capture_key(key)[1])
        self.asked[(info.row, call.turn, call.occurrence)] += 1
        await trio.lowlevel.checkpoint()
        return f"answer {info.row}:t{call.turn}"


class Tally:
    """Per episode: each turn appends its number."""

    name, kind = "tally", "environment"

    def open(self, info: EpisodeInfo) -> Any:
        return {"turns": []}

    def export(self, state: Any) -> Any:
        return {"turns": list(state["turns"])}

    def restore(self, data: Any) -> Any:
        return {"turns": list(data["turns"])}


@attrs.define
class Worker:
    """The agent: a mutation, a model call, then work (row 0's turn 1 works ``LONG_S``)."""

    world: World
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"answers": []}

    def export(self, state: Any) -> Any:
        return {"answers": list(state["answers"])}

    def restore(self, data: Any) -> Any:
        return {"answers": list(data["answers"])}

    async def step(self, ctx: Any, state: Any) -> Done | None:
        started = trio.current_time()
        ctx.session("tally")["turns"].append(ctx.turn)
        state["answers"].append(await ctx.model({"turn": ctx.turn}))
        long = ctx.info.row == 0 and ctx.turn == 1
        await anyio.sleep(LONG_S if long else SHORT_S)
        ended = trio.current_time()
        if long:
            self.world.long_turn.append((started, ended))
        self.world.turns.setdefault(ctx.info.rollout_id, []).append((ctx.turn, started, ended))
        if ctx.turn + 1 == TURNS:
            payload = {"tally": list(ctx.session("tally")["turns"]), "answers": state["answers"]}
            return Done(1.0, payload=payload)
        return None


def environment(world: World, *, unaligned: bool = True) -> Environment:
    return Environment(
        agent=Worker(world), participants=(Tally(),), model=world.model, unaligned=unaligned
    )


async def train(
    world: World, work: Path, gym_dir: Path, *, stop_after: int | None = None
) -> tuple[list[tuple[float, CheckpointOutcome]], list[dict[str, Any]], dict[str, float]]:
    """Train ``ROWS`` rows with the default runtime config, checkpointing every ``EVERY_S``
    virtual seconds; after ``stop_after`` checkpoints that took an episode mid-turn, stop
    (the trainer goes away with everything in flight, as a killed one does). Returns each
    checkpoint with the time it started, the payloads trained, and the final metrics."""
    outcomes: list[tuple[float, CheckpointOutcome]] = []
    payloads: list[dict[str, Any]] = []
    async with EmbeddedGym.host(environment(world), instances=2, seed=0, work_dir=gym_dir) as gym:
        async with open_rollouts(
            gym, work, rows=ROWS, group_size=1, config=RuntimeConfig(), max_rows_in_flight=4
        ) as rollouts:
            done = trio.Event()

            async def checkpoints(stop: trio.CancelScope) -> None:
                while not done.is_set():
                    with trio.move_on_after(EVERY_S):
                        await done.wait()
                    if done.is_set():
                        return
                    at = trio.current_time()
                    outcomes.append((at, await rollouts.checkpoint()))
                    taken = sum(1 for _, o in outcomes if o.ok and o.mid_turn)
                    if stop_after is not None and taken >= stop_after:
                        stop.cancel()

            with trio.CancelScope() as stop:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(checkpoints, stop)
                    async for batch in rollouts.batches(groups_per_step=1):
                        payloads.extend(r.payload for g in batch for r in g.results)
                    done.set()
            metrics = rollouts.metrics.snapshot()
    return outcomes, payloads, metrics


async def test_a_turn_longer_than_every_timeout_fails_no_aligned_checkpoint(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Row 0's turn 1 runs 120 s while the trainer takes an aligned checkpoint every 5 s: every
    checkpoint completes, each one taken while that turn runs takes row 0 mid-turn and every
    other episode at a boundary, and its prepare waits exactly the alignment timeout (1 s),
    not the control timeout (10 s). The other episodes never wait at a boundary for longer
    than one checkpoint. (Before the alignment timeout, every prepare failed after 10 s.)"""
    config = RuntimeConfig()
    assert config.checkpoint_mode is CheckpointMode.ALIGNED  # the default, as train() runs
    world = World()
    outcomes, payloads, metrics = await train(world, tmp_path / "work", tmp_path / "gym")
    assert config.alignment_timeout_s == 1.0

    ((long_start, long_end),) = world.long_turn
    assert long_end - long_start == LONG_S
    during = [o for at, o in outcomes if long_start < at and at + 1.0 < long_end]
    # one every 5 s after the last ended, each taking the 1 s alignment timeout
    assert len(during) >= LONG_S // (EVERY_S + 1.0) - 1, [o.checkpoint_id for o in during]
    failed = [(o.checkpoint_id, o.reason, o.error) for _, o in outcomes if not o.ok]
    assert failed == []
    for o in during:
        assert (o.mid_turn, o.at_boundary) == (1, o.episodes - 1), o
        assert o.stage_s["prepare"] == config.alignment_timeout_s, o.stage_s
    beside = [o.episodes for o in during if o.episodes > 1]  # short ones taken parked
    assert len(beside) >= 3, [o.episodes for o in during]
    assert metrics["checkpoint/mid_turn_total"] == sum(o.mid_turn for _, o in outcomes)
    assert metrics["checkpoint/last_mid_turn"] == outcomes[-1][1].mid_turn

    # every other episode waited at a boundary at most the alignment timeout (no stage but
    # the prepare takes virtual time here: the checkpoint is that wait)
    assert max(sum(o.stage_s.values()) for _, o in outcomes) == config.alignment_timeout_s
    for rid, turns in world.turns.items():
        if not rid.startswith("0-"):
            gaps = [b[1] - a[2] for a, b in pairwise(turns)]
            assert max(gaps, default=0.0) <= config.alignment_timeout_s, (rid, turns)

    # trained exactly once, every turn's mutation once, every model call asked once
    assert sorted(p["answers"][0].split(":")[0] for p in payloads) == sorted(
        f"answer {r}" for r in range(ROWS)
    )
    assert all(p["tally"] == list(range(TURNS)) for p in payloads)
    assert set(world.asked.values()) == {1}
    assert len(world.asked) == ROWS * TURNS


async def test_restoring_a_checkpoint_that_took_a_long_turn_unaligned_is_exactly_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A trainer goes away (everything in flight abandoned) after two aligned checkpoints took
    row 0 mid-turn by the alignment timeout; a new trainer restores the latest into a new Gym.
    Row 0's turn 1 runs again from its boundary: its mutation once (the tally restored is the
    boundary's), its completed model calls answered from the capture (asked once in all), and
    every row trained exactly once."""
    world = World()
    work = tmp_path / "work"
    first, trained, _ = await train(world, work, tmp_path / "gym-a", stop_after=2)
    latest = SnapshotStore(work / "snapshots").list_complete()[-1]
    (taken,) = [o for _, o in first if o.ok and o.snapshot is not None and o.snapshot == latest]
    assert taken.mid_turn == 1
    assert world.long_turn == [], "the long turn ended before the trainer went away"
    asked_before = Counter(world.asked)
    assert asked_before[(0, 1, 0)] == 1  # row 0's turn 1 asked its call before the cut

    world.long_turn.clear()
    second, payloads, _ = await train(world, work, tmp_path / "gym-b")
    assert all(o.ok for _, o in second)
    before, after = (
        Counter(int(p["answers"][0].split(":")[0].removeprefix("answer ")) for p in ps)
        for ps in (trained, payloads)
    )
    assert set(after.values()) == {1} and set(before) | set(after) == set(range(ROWS))
    assert 0 not in before
    restored_row0 = [p for p in payloads if p["answers"][0].startswith("answer 0:")]
    assert len(restored_row0) == 1
    assert restored_row0[0]["tally"] == list(range(TURNS)), "a mutation applied twice"
    assert restored_row0[0]["answers"] == [f"answer 0:t{t}" for t in range(TURNS)]
    # no call the snapshot captured was asked again: row 0's turns 0 and 1 asked once in all
    assert world.asked[(0, 0, 0)] == 1 and world.asked[(0, 1, 0)] == 1


async def test_an_environment_that_opts_out_is_waited_for_until_the_control_timeout(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``Environment(unaligned=False)`` keeps no boundary marks, so no episode of it can be
    taken mid-turn: its aligned prepare ignores the alignment timeout and waits for every
    episode until the call's deadline, failing (retryably) as before if a turn outlasts it."""
    world = World()
    env = environment(world, unaligned=False)
    async with GymHost("gym-0", env, work_dir=tmp_path / "g", config=HostConfig()) as host:
        await host.run([RunRow(rollout_id_for(0, 0, 0), 0, 0, 0)])
        await trio.sleep(SHORT_S + 1.0)  # row 0 is inside its long turn 1
        t0 = trio.current_time()
        with pytest.raises(GymCallTimeout, match="did not reach a step boundary"):
            await host.prepare("c1", t0 + 10.0, CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
        assert trio.current_time() - t0 == 10.0


@pytest.mark.parametrize(
    "backend",
    [pytest.param("http", marks=pytest.mark.http), pytest.param("ray", marks=pytest.mark.ray)],
)
async def test_the_alignment_timeout_reaches_a_gym_in_another_process(
    tmp_path: Path, backend: str
) -> None:
    """Over HTTP (a real ``gymckpt serve`` on loopback) and on Ray (an actor), in real time:
    the prepare request carries the alignment timeout, and the remote host honours it. Both
    episodes are inside a turn of 8 s; the aligned prepare returns after the 0.5 s alignment
    timeout with neither parked (without it the host would wait for them to end their turn and
    park both), and the commit takes both mid-turn, at their first step boundary."""
    config = CalendarConfig(turns=(2, 2), turn_s=(8.0, 8.0), mutation_p=1.0)
    if backend == "http":
        gym_at = HttpGym.spawn(
            calendar_from_environ_path(),
            work_dir=tmp_path / "gym",
            seed=5,
            state_root=tmp_path,
            config=config.host_config(),
            environ=config.environ(),
        )
    else:
        from gymckpt.gym_adapter import RayGym  # Ray only when the ray case runs

        gym_at = RayGym.host(
            EnvironmentRef.to(calendar_environment, config=config),
            work_dir=tmp_path / "gym",
            seed=5,
            config=config.host_config(),
        )
    async with gym_at as gym:
        await gym.run("gym-0", [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in (0, 1)])
        with trio.fail_after(30):  # another process: nothing to wait on but its counts
            while (await gym.statistics()).instances[0].model_calls < 2:  # noqa: ASYNC110
                await trio.sleep(0.05)  # both asked turn 0's model call: inside their turn
        asked = trio.current_time()
        prepared = await gym.prepare(
            "gym-0", "c1", asked + 30.0, CheckpointMode.ALIGNED, alignment_timeout_s=0.5
        )
        assert trio.current_time() - asked >= 0.5
        assert prepared.parked == 0
        reply = await gym.commit("gym-0", "c1", str(tmp_path / "snap"), asked + 30.0)
        assert reply.mid_turn == 2
        assert sorted(s.step_boundary for s in reply.sessions) == [0, 0]
        await gym.resume("gym-0", "c1", trio.current_time() + 30.0)


@pytest.mark.subprocess
def test_sigkill_after_an_aligned_checkpoint_took_episodes_by_the_timeout_is_exactly_once(
    tmp_path: Path,
) -> None:
    """The demo's two processes (a real SIGKILL after the first checkpoint, a restore in a new
    process), aligned, with ``alignment_timeout_s = 0`` in ``[runtime]``: every episode inside
    a turn at a prepare is taken unaligned at once. The run is exactly once (every row and
    step once, every calendar sentinel once) and the snapshot phase 2 restored had taken
    episodes mid-turn."""
    conf = tmp_path / "demo.toml"
    conf.write_text("[runtime]\nalignment_timeout_s = 0.0\n")
    work = tmp_path / "w"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gymckpt", "demo", "--checkpoint-mode", "aligned"),
            *("--crash-after-checkpoint", "1", "--rows", "32", "--json"),
            *("--workdir", str(work), "--config", str(conf)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exactly_once"] is True and report["killed_with_sigkill"] is True, report
    assert report["checkpoint_mode"] == "aligned" and report["restores"] == 1
    assert report["duplicates"] == report["lost"] == report["steps_trained_twice"] == 0
    assert report["sentinels_duplicated"] == report["sentinels_missing"] == 0
    assert report["rows_trained"] == 32 and report["checkpoints_failed"] == 0
    lines = [orjson.loads(x) for x in (work / JOURNAL).read_bytes().splitlines()]
    taken = {r["checkpoint"]: r["mid_turn"] for r in lines if "checkpoint" in r and r["ok"]}
    (restored,) = [r["snapshot"] for r in lines if "restore_to_step" in r]
    assert taken[restored] > 0, taken
    assert sum(taken.values()) == report["episodes_mid_turn"] > 0


def test_the_alignment_timeout_must_be_below_the_control_timeout(tmp_path: Path) -> None:
    """Refused where it enters, naming both knobs and what to do: in ``RuntimeConfig`` and in
    a configuration file's ``[runtime]`` (exit code 2 on the command line)."""
    with pytest.raises(ValueError, match=r"alignment_timeout_s \(10\) must be < control_timeout"):
        RuntimeConfig(alignment_timeout_s=10.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        RuntimeConfig(alignment_timeout_s=-1.0)
    with pytest.raises(ValueError, match="finite"):
        RuntimeConfig(alignment_timeout_s=float("inf"), control_timeout_s=1e308)
    assert RuntimeConfig(alignment_timeout_s=0.0).alignment_timeout_s == 0.0
    job = tmp_path / "job.toml"
    job.write_text("[runtime]\nalignment_timeout_s = 2.5\ncontrol_timeout_s = 5.0\n")
    assert runtime_config_from_toml(job).alignment_timeout_s == 2.5
    job.write_text("[runtime]\ncontrol_timeout_s = 1.0\n")
    with pytest.raises(ManifestError, match=r"job.toml.*lower alignment_timeout_s"):
        runtime_config_from_toml(job)


class _NoAlignmentTimeout:
    """A backend whose ``prepare`` takes a mode but no ``alignment_timeout_s``."""

    def __init__(self, gym: Any) -> None:
        self._gym = gym

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gym, name)

    async def prepare(
        self, instance: str, checkpoint_id: str, deadline_ts: float, mode: Any = None
    ) -> Any:
        return await self._gym.prepare(instance, checkpoint_id, deadline_ts, mode)


async def test_the_backend_kit_names_a_prepare_that_takes_no_alignment_timeout(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The trainer passes the alignment timeout to every prepare: ``check_backend`` says so
    before a run would abort on the ``TypeError``."""
    async with EmbeddedGym.host(calendar_environment(), work_dir=tmp_path / "live") as gym:
        with pytest.raises(ConformanceError) as info:
            await check_backend(_NoAlignmentTimeout(gym), tmp_path)  # type: ignore[arg-type]
    text = str(info.value)
    assert "prepare_alignment_timeout: _NoAlignmentTimeout.prepare(" in text
    assert "prepare_mode" not in text and "commit[unaligned]" not in text  # the rest passed
    assert "takes no alignment_timeout_s" in text and "alignment_timeout_s=None)" in text


async def test_a_timed_out_alignment_belongs_to_its_generation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``Parking.alignment_timed_out`` is set for the generation whose prepare gave up waiting
    (never for a stale one, never when nothing parks), keeps parking the stragglers that reach
    their boundary meanwhile, and a new generation starts without it."""
    parking = Parking(60.0, freeze_survivors=False)
    async with trio.open_nursery() as nursery:
        parking.open(nursery.start_soon, lambda ep: None)
        ep = Episode(EpisodeInfo("r0", 0, 0, 0, 0, "gym-0"), {}, MOVING)
        parking.started()
        gen = parking.prepare("c1")
        assert await parking.wait_parked(gen, trio.current_time() + 1.0) is False
        parking.time_out_alignment(gen - 1)  # a stale generation: nothing
        assert not parking.alignment_timed_out
        parking.time_out_alignment(gen)
        assert parking.alignment_timed_out and parking.parks
        assert await parking.boundary(ep, lambda ep: False) is False  # a straggler parks
        assert ep.state == BOUNDARY and parking.moving == 0
        parking.reopen()
        assert not parking.prepared
        parking.prepare("c2", park=False)
        parking.time_out_alignment(parking.generation)  # nothing parks: nothing to cut
        assert not parking.alignment_timed_out
        parking.reopen()
        parking.prepare("c3")
        assert not parking.alignment_timed_out  # a new generation starts aligned
        parking.close()
        parking.release_all()
        nursery.cancel_scope.cancel()


@attrs.define
class _PlantedHost:
    running: tuple[str, ...] = ()
    unaligned: bool = True
    dead: bool = False

    @property
    def environment(self) -> Any:
        return type("E", (), {"unaligned": self.unaligned})()

    def inventory(self) -> InstanceInventory:
        return InstanceInventory("gym-0", False, True, self.running, (), (), (), 0)


@attrs.define
class _PlantedGym:
    """Answers a prepare after ``wait_s`` virtual seconds, and a commit with ``mid_turn``."""

    host: _PlantedHost
    wait_s: float = 0.0
    mid_turn: int = 0

    def sim(self, name: str) -> _PlantedHost:
        return self.host

    async def prepare(self, instance: str, checkpoint_id: str, *args: Any, **kw: Any) -> Any:
        await trio.sleep(self.wait_s)
        return PrepareReply(instance, checkpoint_id, 0, 0)

    async def commit(self, instance: str, checkpoint_id: str, *args: Any) -> Any:
        return CommitReply(instance, checkpoint_id, (), (), (), mid_turn=self.mid_turn)


async def test_the_simulation_watch_holds_aligned_mid_turn_episodes_to_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``ModeWatch`` (the simulation's check of each checkpoint's mode), against planted
    replies: an aligned prepare may leave episodes running only after its alignment timeout
    and on an environment that takes cuts, and its commit may take at most those mid-turn."""
    found: list[str] = []
    gym = _PlantedGym(_PlantedHost(running=("0-0",)), wait_s=1.0, mid_turn=1)
    watch = ModeWatch(gym, cast(EmbeddedGym, gym), CheckpointMode.ALIGNED, found.append)
    await watch.prepare("gym-0", "c1", 0.0, CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
    await watch.commit("gym-0", "c1", "/s", 0.0)
    assert found == []  # waited the timeout, took the one it left running
    gym.mid_turn = 2
    await watch.commit("gym-0", "c1", "/s", 0.0)
    assert found == [
        "c1: aligned commit of gym-0 took 2 episodes mid-turn, its prepare left 1 running (an "
        "aligned checkpoint takes mid-turn only the episodes that had not parked within the "
        "alignment timeout)"
    ]
    found.clear()
    gym.wait_s = 0.5
    await watch.prepare("gym-0", "c2", 0.0, CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
    assert found == [
        "c2: aligned prepare of gym-0 left 1 episodes running after 0.5s, before its "
        "alignment timeout (1.0s)"
    ]
    found.clear()
    gym.host.unaligned, gym.wait_s = False, 1.0
    await watch.prepare("gym-0", "c3", 0.0, CheckpointMode.ALIGNED, alignment_timeout_s=1.0)
    assert found == [
        "c3: aligned prepare of gym-0 left 1 episodes running on an environment that opts "
        "out of unaligned cuts (it must wait)"
    ]
