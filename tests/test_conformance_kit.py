"""The conformance kit (``gymckpt.testing``) on the project's own environments and backends,
and on a broken environment it must reject."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio.testing

from gymckpt.gym_adapter import (
    Done,
    EmbeddedGym,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    HostConfig,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    CalendarServer,
    calendar_environment,
)
from gymckpt.testing import ConformanceError, check_backend, check_environment, examples

gymnasium_env = pytest.importorskip("gymckpt.gym_adapter.environments.gymnasium")

BUILTIN_IDS = [
    "CartPole-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Acrobot-v1",
    "Pendulum-v1",
    "FrozenLake-v1",
    "Taxi-v4",
    "CliffWalking-v1",
    "Blackjack-v1",
]


class Walk:
    """A deterministic environment: a position that the agent moves by the model's answer."""

    name, kind = "walk", "environment"

    def __init__(self, forget: bool = False) -> None:
        self.forget = forget

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {"pos": info.row}

    def export(self, state: dict[str, int]) -> Any:
        return {"pos": 0} if self.forget else state  # forget: a broken export

    def restore(self, data: Any) -> dict[str, int]:
        return dict(data)


class Walker:
    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> list[int]:
        return []

    def export(self, state: list[int]) -> Any:
        return state

    def restore(self, data: Any) -> list[int]:
        return list(data)

    async def step(self, ctx: EpisodeContext, state: list[int]) -> Done | None:
        walk = ctx.session("walk")
        walk["pos"] += await ctx.model(walk["pos"])
        state.append(walk["pos"])
        return Done(float(walk["pos"]), payload=state) if len(state) >= 6 else None


def _walk(forget: bool = False) -> Environment:
    return Environment(
        agent=Walker(), participants=(Walk(forget),), model=lambda key, pos, info: 1 + pos % 3
    )


async def test_kit_accepts_a_deterministic_environment(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    report = await check_environment(_walk(), tmp_path)
    assert {"spec", "completes", "restore_equivalence[2]", "model_calls_once[2]", "fencing"} <= set(
        report.checks
    )
    assert report.episodes > 8


async def test_kit_rejects_an_export_that_loses_state(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    with pytest.raises(ConformanceError, match=r"restore_equivalence\[1\]"):
        await check_environment(_walk(forget=True), tmp_path)


async def test_kit_rejects_an_unhostable_environment(tmp_path: Path) -> None:
    class Stranger(Walk):
        kind = "stranger"

    env = Environment(agent=Walker(), participants=(Stranger(),))
    with pytest.raises(ConformanceError, match=r"spec: .*register_participant_kind"):
        await check_environment(env, tmp_path)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
async def test_kit_on_every_builtin_gymnasium_codec(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, env_id: str
) -> None:
    env = gymnasium_env.gymnasium_environment(env_id, max_episode_steps=40)
    report = await check_environment(env, tmp_path, rows=2, park_after=(1, 5))
    assert "restore_equivalence[5]" in report.checks


@pytest.mark.parametrize("agent_kind", ["simple_agent", "legacy_agent"])
async def test_kit_on_the_calendar_workplace(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, agent_kind: str
) -> None:
    """The built-in calendar is an Environment like any user's: the same kit passes it, its
    retained calendar sessions included."""
    env = calendar_environment(
        agent_kind, CalendarConfig(turns=(3, 5), turn_s=(0.01, 0.03), mutation_p=0.7)
    )
    report = await check_environment(env, tmp_path, park_after=(1, 2))
    assert {"restore_equivalence[2]", "model_calls_once[2]", "fencing", "retained_journal"} <= set(
        report.checks
    )


class _Forgetful(CalendarServer):
    """A retained participant whose restore drops its events."""

    def restore(self, data: Any) -> Any:
        return super().restore({"events": []})


async def test_kit_rejects_retained_sessions_a_replacement_would_lose(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = calendar_environment(
        config=CalendarConfig(turns=(2, 3), turn_s=(0.01, 0.02), mutation_p=1.0)
    )
    env = attrs.evolve(env, participants=(_Forgetful(),))
    with pytest.raises(ConformanceError, match="retained_journal"):
        await check_environment(env, tmp_path, park_after=(1,))


USAGE_CHECKS = (
    "trainer_terms",
    "trainer_restart[running]",
    "trainer_restart[prepared]",
    "second_trainer",
    "shuffled_restore",
)


async def test_backend_kit_on_the_embedded_calendar(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.03))),
        instances=2,
        work_dir=tmp_path / "live",
    ) as gym:
        report = await check_backend(gym, tmp_path)
    assert {"commit[aligned]", "cut[aligned]", "commit[unaligned]", "cut[unaligned]"} <= set(
        report.checks
    )
    assert "prepare_mode" in report.checks and report.episodes == 104
    assert set(USAGE_CHECKS) <= set(report.checks)


async def test_backend_kit_on_the_embedded_host(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = gymnasium_env.gymnasium_environment("CartPole-v1", pace_s=0.001)
    async with EmbeddedGym.host(
        env, instances=2, work_dir=tmp_path / "live", config=HostConfig()
    ) as gym:
        report = await check_backend(gym, tmp_path)
    assert "restore_refuses_mismatch" in report.checks


async def test_kit_by_import_path_on_the_example(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    report = await check_environment("gymckpt.testing.examples:guess_the_number", tmp_path)
    assert "restore_equivalence[3]" in report.checks


class _NoMode:
    """A backend written before the checkpoint modes: its ``prepare`` takes no ``mode``."""

    def __init__(self, gym: Any) -> None:
        self._gym = gym

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gym, name)

    async def prepare(self, instance: str, checkpoint_id: str, deadline_ts: float) -> Any:
        return await self._gym.prepare(instance, checkpoint_id, deadline_ts)


async def test_backend_kit_names_a_prepare_that_takes_no_mode(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with EmbeddedGym.host(calendar_environment(), work_dir=tmp_path / "live") as gym:
        with pytest.raises(ConformanceError) as info:
            await check_backend(_NoMode(gym), tmp_path)  # type: ignore[arg-type]
    text = str(info.value)
    assert "prepare_mode: _NoMode.prepare(instance: 'str', checkpoint_id: 'str'," in text
    assert "prepare(instance, checkpoint_id, deadline_ts, mode=CheckpointMode.ALIGNED)" in text
    assert "commit[aligned]" not in text and "TypeError" not in text  # the rest passed


class _LeakyCut(_NoMode):
    """A backend that reopens its instance as soon as an unaligned commit returns: replies
    produced after the cut reach the trainer before the checkpoint resumes."""

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: Any = None,
        alignment_timeout_s: float | None = None,
    ) -> Any:
        self._mode = mode
        return await self._gym.prepare(
            instance, checkpoint_id, deadline_ts, *([mode] if mode else [])
        )

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> Any:
        reply = await self._gym.commit(instance, checkpoint_id, state_root, deadline_ts)
        if self._mode is not None:
            await self._gym.resume(instance, checkpoint_id, deadline_ts)
        return reply


async def test_backend_kit_rejects_replies_after_the_cut_before_the_resume(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with EmbeddedGym.host(
        calendar_environment(config=CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.03))),
        work_dir=tmp_path / "live",
    ) as gym:
        with pytest.raises(ConformanceError, match=r"cut\[unaligned\]: replies \['1-2', "):
            await check_backend(_LeakyCut(gym), tmp_path)  # type: ignore[arg-type]


async def test_kit_runs_concurrent_model_calls_across_an_aligned_and_an_unaligned_cut(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``parallel_calls`` asks three calls at once each turn (two identical): both checkpoint
    modes restore it to the uninterrupted run's payloads, and no captured call is asked again
    (start-order call ids failed the unaligned checks)."""
    report = await check_environment(
        "gymckpt.testing.examples:parallel_calls", tmp_path, rows=6, park_after=(1, 2)
    )
    for k in (1, 2):
        for label in (f"[{k}]", f"[{k},unaligned]"):
            assert f"restore_equivalence{label}" in report.checks
            assert f"model_calls_once{label}@asyncio" in report.checks


async def test_kit_rejects_an_agent_whose_restored_turn_asks_another_request(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An agent whose requests depend on the attempt does not replay as it ran: an unaligned
    cut takes it mid-turn, and the restored turn fails closed (``ModelRequestChanged``)."""

    class Fickle(examples.ParallelAgent):
        async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
            await ctx.model({"turn": ctx.turn, "ask": "plan", "attempt": ctx.info.attempt})
            await trio.sleep(0.1 + 0.03 * ctx.info.row)  # the cut finds row 0 here, in turn 1
            return Done(1.0) if ctx.turn >= 2 else None

    env = attrs.evolve(examples.parallel_calls(), agent=Fickle())
    says = r"(?s)restore_equivalence\[1,unaligned\].*ended without asking again"
    with pytest.raises(ConformanceError, match=says):
        await check_environment(env, tmp_path, rows=2, park_after=(1,))


class _NoTerms(_NoMode):
    """A backend written before trainer terms: no ``attach`` or ``release``."""

    def __getattr__(self, name: str) -> Any:
        if name in ("attach", "release"):
            raise AttributeError(name)
        return getattr(self._gym, name)


async def test_backend_kit_names_a_backend_without_trainer_terms(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with EmbeddedGym.host(calendar_environment(), work_dir=tmp_path / "live") as gym:
        with pytest.raises(ConformanceError) as info:
            await check_backend(_NoTerms(gym), tmp_path)  # type: ignore[arg-type]
    text = str(info.value)
    assert "trainer_terms: _NoTerms has no attach(instance, trainer, deadline_ts)" in text
    assert "trainer_restart" not in text and "commit[aligned]" not in text  # the rest passed


class _AttachNotForwarded(_NoMode):
    """A backend whose ``attach`` only remembers the trainer and answers a takeover itself:
    its instances never learn of the new term, so they fence nothing and refuse no one."""

    def __init__(self, gym: Any) -> None:
        super().__init__(gym)
        self._holders: dict[str, Any] = {}

    async def attach(self, instance: str, trainer: Any, deadline_ts: float) -> Any:
        from gymckpt.gym_adapter import AttachReply

        previous = self._holders.get(instance)
        self._holders[instance] = trainer
        return AttachReply(instance, previous != trainer, previous)

    async def release(self, instance: str, trainer: Any, deadline_ts: float) -> None:
        pass


async def test_backend_kit_rejects_a_restart_that_fences_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Term 2 of a run attaching while term 1's episodes run or its checkpoint is open (the
    trainer was SIGKILLed): a backend whose instances never see the attach leaves them there,
    and lets a second run in."""
    async with EmbeddedGym.host(
        calendar_environment(config=CalendarConfig(turns=(2, 4), turn_s=(0.01, 0.03))),
        instances=2,
        work_dir=tmp_path / "live",
    ) as gym:
        with pytest.raises(ConformanceError) as info:
            await check_backend(_AttachNotForwarded(gym), tmp_path)  # type: ignore[arg-type]
    text = str(info.value)
    assert "trainer_restart[running]: gym-0: after term 2 attached, term 1's episodes" in text
    assert "trainer_restart[prepared]: gym-0: term 2's attach aborted None" in text
    assert "second_trainer: gym-0: a trainer of another lineage attached" in text
    assert "commit[aligned]" not in text  # the contract checks passed


async def test_backend_kit_on_instances_another_run_holds_fails_by_name(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The kit's trainers are a run of their own: instances an unfinished run holds refuse
    them, and the kit says so instead of raising out of ``check_backend``."""
    from gymckpt.runtime import TrainerTerm

    async with EmbeddedGym.host(calendar_environment(), work_dir=tmp_path / "live") as gym:
        holder = TrainerTerm("0123456789abcdef0123456789abcdef", 1, "/runs/unfinished")
        for name in gym.instances:
            await gym.sim(name).attach(holder, 1e9)
        with pytest.raises(ConformanceError) as info:
            await check_backend(gym, tmp_path)
    text = str(info.value)
    assert "trainer_restart: instance gym-0 attach: the instance serves another training" in text
    assert "/runs/unfinished" in text and "run it on instances no unfinished run holds" in text


# -- a participant that keeps files in a tree, and captured steps ---------------------------------

TREE_CHECKS = (
    "export_round_trip[1]",
    "restore_refuses_bad_data[1]",
    "restore_equivalence[1]",
    "restore_equivalence[2,unaligned]",
)
STEP_CHECKS = ("captured_steps_once[1]", "captured_steps_once[2,unaligned]")


async def test_kit_on_the_sandbox_with_commands_and_a_captured_step(tmp_path: Path) -> None:
    """The sandbox participant (real processes for its commands, so real time) and an agent
    whose side effect is a captured step pass every check in both modes, on both loops."""
    report = await check_environment(
        examples.sandbox_scribe(tmp_path), tmp_path / "kit", rows=2, park_after=(1, 2)
    )
    checks = set(report.checks)
    assert {*TREE_CHECKS, *STEP_CHECKS, "fencing"} <= checks
    assert {f"{c}@asyncio" for c in (*TREE_CHECKS, *STEP_CHECKS)} <= checks


async def test_kit_on_the_sandbox_files_and_steps_under_the_autojump_clock(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The same without commands (a real process's wait is no virtual time), in virtual time:
    each step's function runs as often across a park as uninterrupted, and none the snapshot
    captured runs again after a cut."""
    env = examples.sandbox_scribe(tmp_path, commands=False)
    report = await check_environment(env, tmp_path / "kit", park_after=(1, 2))
    assert {*TREE_CHECKS, *STEP_CHECKS, "export_round_trip[2]"} <= set(report.checks)


class LiveSession:
    """A session's files in a directory of its own (the file API ``Scribe`` uses)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def append(self, rel: str, data: str) -> None:
        with open(self.root / rel, "a") as f:
            f.write(data)

    def list(self) -> list[str]:
        return sorted(os.listdir(self.root))


class LiveTree:
    """A user's participant that keeps a session's files in a directory copied from a
    template, and exports the directory's name instead of its contents: its restore reopens
    the live tree, with whatever was written in it after the checkpoint."""

    name, kind = "sandbox", "environment"

    def __init__(self, root: Path, template: Path) -> None:
        self.root, self.template = root, template

    def open(self, info: EpisodeInfo) -> LiveSession:
        root = self.root / f"{info.session_key}-{secrets.token_hex(4)}"
        shutil.copytree(self.template, root, symlinks=True)
        return LiveSession(root)

    def export(self, state: LiveSession) -> Any:
        return {"dir": str(state.root)}

    def restore(self, data: Any) -> LiveSession:
        return LiveSession(Path(data["dir"]))


async def test_kit_rejects_a_tree_participant_whose_export_names_its_live_directory(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An unaligned cut takes the episode mid-turn, after its line was appended; the restore
    reopens the live tree, which holds that line, and the turn runs again: twice."""
    template = examples.scribe_template(tmp_path)
    env = examples.sandbox_scribe(
        tmp_path, commands=False, sandbox=LiveTree(tmp_path / "live", template)
    )
    with pytest.raises(ConformanceError, match=r"restore_equivalence\[1,unaligned\]"):
        await check_environment(env, tmp_path / "kit", rows=2, park_after=(1,))


async def test_kit_rejects_a_tree_restore_that_loses_file_modes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A tree participant whose restore loses the executable bit: the payloads agree, the
    export of the restored tree does not (``export_round_trip``, naming the difference)."""
    from gymckpt.gym_adapter.environments.sandbox import Sandbox

    class ModeLoser(Sandbox):
        def restore(self, data: Any) -> Any:
            session = super().restore(data)
            for path in session.root.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    path.chmod(0o644)
            return session

    box = ModeLoser(examples.scribe_template(tmp_path), tmp_path / "work")
    env = examples.sandbox_scribe(tmp_path, commands=False, sandbox=box)
    with pytest.raises(ConformanceError) as info:
        await check_environment(env, tmp_path / "kit", rows=2, park_after=(1,))
    text = str(info.value)
    assert "export_round_trip[1]: " in text and "sandbox/" in text  # names the session
    assert "restore_equivalence[1]" not in text  # the payloads agree


async def test_kit_rejects_a_captured_step_asked_with_other_arguments_after_a_cut(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A step whose arguments depend on the attempt: the turn a cut took mid-way asks it again
    with other arguments after the restore, and fails closed (``CapturedStepChanged``)."""

    class Fickle(examples.Scribe):
        async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
            probe = {"turn": ctx.turn, "attempt": ctx.info.attempt}
            await ctx.captured_step("probe", probe, lambda a: a["turn"])
            return await super().step(ctx, state)

    env = attrs.evolve(examples.sandbox_scribe(tmp_path, commands=False), agent=Fickle(False))
    says = r"(?s)restore_equivalence\[1,unaligned\].*the arguments differ"
    with pytest.raises(ConformanceError, match=says):
        await check_environment(env, tmp_path / "kit", rows=2, park_after=(1,))


async def test_kit_rejects_a_host_that_runs_a_captured_step_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose captured steps run their function even when the capture answers them
    (every restored turn asks its side effect again): the payloads still agree, the step
    counts do not, in both modes."""
    from gymckpt.gym_adapter.host._episodes import StepContext

    real = StepContext.captured_step

    async def runs_it_anyway(self: Any, name: str, args: Any, fn: Any) -> Any:
        if self.info.attempt > 0:
            fn(args)
        return await real(self, name, args, fn)

    monkeypatch.setattr(StepContext, "captured_step", runs_it_anyway)
    env = examples.sandbox_scribe(tmp_path, commands=False)
    with pytest.raises(ConformanceError) as info:
        await check_environment(env, tmp_path / "kit", rows=2, park_after=(1,))
    text = str(info.value)
    assert "captured_steps_once[1]: captured steps' functions ran " in text
    assert "captured_steps_once[1,unaligned]: " in text and "ran again after the restore" in text
    assert "restore_equivalence" not in text


async def test_backend_kit_on_an_embedded_gym_of_sandboxes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The backend kit drives a Gym whose sessions are sandbox trees and whose agent runs
    captured steps like any other: commits, cuts in both modes, restores, trainer restarts."""
    env = examples.sandbox_scribe(tmp_path, commands=False)
    async with EmbeddedGym.host(env, instances=2, work_dir=tmp_path / "live") as gym:
        report = await check_backend(gym, tmp_path / "kit")
    assert {"commit[aligned]", "cut[aligned]", "commit[unaligned]", "cut[unaligned]"} <= set(
        report.checks
    )
    assert {"restore_refuses_mismatch", *USAGE_CHECKS} <= set(report.checks)
