"""The checkpoint mode of a simulated scenario (``modes``): what each life's
checkpoints took mid-turn is counted and reported, and ``ModeWatch`` finds an unaligned
checkpoint that parks an episode, a prepare that asks for the wrong mode and an aligned commit
that takes an episode mid-turn — in the real runtime and Gym with the rule broken, and against
planted replies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import trio

from gymckpt.app.simulation.main import Tally, _json_summary
from gymckpt.app.simulation.modes import ModeWatch
from gymckpt.app.simulation.runner import run_scenario
from gymckpt.app.simulation.scenario import Scenario
from gymckpt.gym_adapter import CommitReply, EmbeddedGym, InstanceInventory, PrepareReply
from gymckpt.gym_adapter.host._control import ControlPlane
from gymckpt.nurseries import _pending
from gymckpt.runtime import CheckpointMode

ALIGNED, UNALIGNED = CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED
SC = Scenario(seed=4, rows=8, group_size=2, instances=2, turns=(2, 4), turn_s=(0.2, 1.0))


@pytest.mark.parametrize("mode", [ALIGNED, UNALIGNED], ids=lambda m: m.value)
async def test_each_mode_is_counted_and_unaligned_takes_episodes_mid_turn(
    tmp_path: Path, autojump_clock: trio.abc.Clock, mode: CheckpointMode
) -> None:
    report = await run_scenario(attrs.evolve(SC, checkpoint_mode=mode), tmp_path)
    assert report.ok, report.violations
    (life,) = report.lives
    assert life.checkpoint_mode == mode.value and life.episodes_taken > 0
    if mode is ALIGNED:
        assert life.episodes_mid_turn == 0
    else:  # the calendar agent awaits its model call, then sleeps its turn: always in a turn
        assert 0 < life.episodes_mid_turn <= life.episodes_taken
    out = report.to_json()
    assert out["checkpoint_mode"] == mode.value
    assert out["episodes_mid_turn"] == life.episodes_mid_turn
    assert out["incarnations"][0]["episodes_taken"] == life.episodes_taken
    tally = Tally()
    tally.add(report)
    summary = _json_summary(tally, 1, SC.seed, 1.0, False, [report])
    assert summary["seeds_by_mode"] == {mode.value: 1}
    assert summary["checkpoints_by_mode"] == {mode.value: life.checkpoints_ok}
    assert summary["episodes_mid_turn"] == life.episodes_mid_turn


async def test_an_unaligned_checkpoint_that_parks_is_a_violation(
    tmp_path: Path, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's rule broken on purpose: every prepare parks as aligned does. The watch sees
    the prepare reply's parked episodes and the host's inventory holding them."""
    real = ControlPlane.prepare

    async def parks_anyway(
        self: ControlPlane,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        return await real(self, checkpoint_id, deadline_ts, ALIGNED)

    monkeypatch.setattr(ControlPlane, "prepare", parks_anyway)
    report = await run_scenario(attrs.evolve(SC, checkpoint_mode=UNALIGNED), tmp_path)
    assert any("unaligned prepare of gym-" in v and "parked" in v for v in report.violations)
    assert any("left" in v and "episodes parked on gym-" in v for v in report.violations)


async def test_a_prepare_that_asks_for_the_wrong_mode_is_a_violation(
    tmp_path: Path, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator's rule broken on purpose: it drops the mode, so Gym gets the default
    (aligned) prepare although the runtime is configured unaligned."""

    async def drops_the_mode(
        gym: Any,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        *,
        mode: CheckpointMode,
        alignment_timeout_s: float,
    ) -> object:
        return await gym.prepare(instance, checkpoint_id, deadline_ts)

    monkeypatch.setattr(_pending, "_prepare_in", drops_the_mode)
    report = await run_scenario(attrs.evolve(SC, checkpoint_mode=UNALIGNED), tmp_path)
    assert any("asked for a aligned checkpoint" in v for v in report.violations)
    assert report.episodes_mid_turn == 0  # nothing was taken mid-turn either


@attrs.frozen
class _Host:
    parked: tuple[str, ...] = ()
    dead: bool = False
    environment: Any = attrs.field(factory=lambda: type("E", (), {"unaligned": True})())

    def inventory(self) -> InstanceInventory:
        return InstanceInventory("gym-0", False, True, (), self.parked, (), (), 0)


@attrs.define
class _Gym:
    host: _Host
    instances: tuple[str, ...] = ("gym-0",)
    prepare_reply: PrepareReply = attrs.field(factory=lambda: PrepareReply("gym-0", "c1", 0, 0))
    commit_reply: CommitReply = attrs.field(factory=lambda: CommitReply("gym-0", "c1", (), (), ()))

    def sim(self, name: str) -> _Host:
        return self.host

    async def prepare(self, *args: Any, **kwargs: Any) -> PrepareReply:
        return self.prepare_reply

    async def commit(self, *args: Any) -> CommitReply:
        return self.commit_reply


def _watch(gym: _Gym, mode: CheckpointMode, found: list[str]) -> ModeWatch:
    return ModeWatch(gym, cast(EmbeddedGym, gym), mode, found.append)


async def test_the_watch_against_planted_replies() -> None:
    found: list[str] = []
    gym = _Gym(_Host())
    watch = _watch(gym, UNALIGNED, found)
    await watch.prepare("gym-0", "c1", 0.0, UNALIGNED)
    watch.at_stage("c1", "after_commit")
    assert found == [] and watch.prepares == 1
    gym.prepare_reply = PrepareReply("gym-0", "c1", 3, 0)
    await watch.prepare("gym-0", "c1", 0.0, UNALIGNED)
    assert found == [
        "c1: unaligned prepare of gym-0 parked 3 episodes (an unaligned checkpoint parks none)"
    ]
    found.clear()
    gym.host = _Host(parked=("0-0",))
    watch.at_stage("c1", "before_publish")
    assert found == [
        "c1 at before_publish: unaligned checkpoint left 1 episodes parked on gym-0 (0-0)"
    ]
    found.clear()
    gym.host = _Host(parked=("0-0",), environment=type("E", (), {"unaligned": False})())
    watch.at_stage("c1", "before_publish")  # an environment that opts out parks: not held to it
    gym.host = _Host(parked=("0-0",), dead=True)
    watch.at_stage("c1", "before_publish")  # a dead instance has no inventory
    assert found == []

    aligned = _watch(gym, ALIGNED, found)
    gym.host = _Host(parked=("0-0",))
    await aligned.prepare("gym-0", "c2", 0.0, ALIGNED)
    aligned.at_stage("c2", "after_prepare")  # aligned parks: nothing to say
    assert found == []
    gym.commit_reply = CommitReply("gym-0", "c2", (), (), (), mid_turn=2)
    await aligned.commit("gym-0", "c2", "/s", 0.0)
    await watch.commit("gym-0", "c2", "/s", 0.0)  # unaligned: mid-turn is what it does
    assert aligned.commits_mid_turn == watch.commits_mid_turn == 2
    assert found == [
        "c2: aligned commit of gym-0 took 2 episodes mid-turn, its prepare left 0 running (an "
        "aligned checkpoint takes mid-turn only the episodes that had not parked within the "
        "alignment timeout)"
    ]
