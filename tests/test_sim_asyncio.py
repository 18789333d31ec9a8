"""The simulated Gym under asyncio: the same code a Ray actor runs, on the other event loop.

Plain (sync) tests that call ``anyio.run(..., backend="asyncio")``; real time, short turns.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import anyio.lowlevel
import sniffio

from gymckpt.gym_adapter import (
    Completed,
    EmbeddedGym,
    Refused,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_host,
    calendar_sessions_of,
    calendar_state,
    plan_episode,
    sentinel,
)
from gymckpt.runtime import EpisodeRecord, InstanceRecord, ParticipantRecord, records_digest

CONFIG = CalendarConfig(turns=(2, 4), turn_s=(0.001, 0.003), mutation_p=1.0, flush_interval_s=0.001)
SEED = 11


def rows(n: int, attempt: int = 0) -> list[RunRow]:
    suffix = f"-a{attempt}" if attempt else ""
    return [RunRow(f"{r}-0{suffix}", r, 0, attempt) for r in range(n)]


def deadline(seconds: float = 10.0) -> float:
    return anyio.current_time() + seconds


async def drain(stream: ReplyStream) -> list[RunReply]:
    return [reply async for batch in stream for reply in batch]


def sentinels(row: int) -> list[str]:
    plan = plan_episode(SEED, row, 0, CONFIG)
    return [sentinel(row, 0, t) for t in range(plan.turns) if plan.mutates[t]]


def test_runs_to_completion_under_asyncio() -> None:
    async def main() -> None:
        assert sniffio.current_async_library() == "asyncio"
        asyncio.get_running_loop()
        async with calendar_host("gym-0", seed=SEED, config=CONFIG) as inst:
            replies = await drain(await inst.run(rows(5)))
            assert sorted(r.rollout_id for r in replies) == [f"{r}-0" for r in range(5)]
            assert all(isinstance(r, Completed) for r in replies)
            state = calendar_state(inst)
            for r in range(5):
                assert list(state[f"{r}-0"].sentinels) == sentinels(r)

    anyio.run(main, backend="asyncio")


def test_prepare_commit_resume_under_asyncio(tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedGym.host(
            calendar_environment(config=CONFIG),
            seed=SEED,
            work_dir=tmp_path,
            config=CONFIG.host_config(),
        ) as gym:
            stream = await gym.run("gym-0", rows(4))
            await anyio.sleep(0.002)
            prep = await gym.prepare("gym-0", "c", deadline())
            refused = await drain(await gym.run("gym-0", rows(1, attempt=1)))
            assert refused == [Refused("0-0-a1")]
            reply = await gym.commit("gym-0", "c", "snap", deadline())
            for p in reply.participants:
                assert p.records_digest == records_digest(tmp_path / "snap" / p.state_dir)
            assert len(reply.exported) == prep.parked
            await gym.resume("gym-0", "c", deadline())
            assert len(await drain(stream)) == 4
            inv = await gym.inventory("gym-0")
            assert inv.admission_open and inv.running == inv.on_wire == ()

    anyio.run(main, backend="asyncio")


def test_restore_and_claim_under_asyncio(tmp_path: Path) -> None:
    root = tmp_path / "snap"

    async def main() -> None:
        async with EmbeddedGym.host(
            calendar_environment(config=CONFIG), seed=SEED, config=CONFIG.host_config()
        ) as gym:
            stream = await gym.run("gym-0", rows(4))
            with anyio.fail_after(5):
                await gym.prepare("gym-0", "c", deadline())
                reply = await gym.commit("gym-0", "c", str(root), deadline())
            await stream.aclose()
        assert reply.exported
        record = InstanceRecord(
            "gym-0",
            tuple(
                ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
                for p in reply.participants
            ),
        )
        episodes = [
            EpisodeRecord(e.rollout_id, e.owner, "gym-0", e.capture_keys) for e in reply.exported
        ]
        async with EmbeddedGym.host(
            calendar_environment(config=CONFIG), seed=SEED, config=CONFIG.host_config()
        ) as gym:
            await gym.restore("gym-0", str(root), record, episodes, deadline())
            claims = [
                RunRow(f"{e.rollout_id}-a1", int(e.rollout_id.split("-")[0]), 0, 1, e.rollout_id)
                for e in episodes
            ]
            with anyio.fail_after(5):
                replies = await drain(await gym.run("gym-0", claims))
            assert sorted(r.rollout_id for r in replies) == sorted(c.rollout_id for c in claims)
            assert all(isinstance(r, Completed) for r in replies)
            state = await calendar_sessions_of(gym, "gym-0")
            for c in claims:
                assert list(state[f"{c.row}-0"].sentinels) == sentinels(c.row)
            assert (await gym.inventory("gym-0")).unclaimed == ()

    anyio.run(main, backend="asyncio")


def test_serve_in_a_task_group_like_a_ray_actor() -> None:
    async def main() -> None:
        inst = calendar_host("gym-3", agent_kind="legacy_agent", seed=SEED, config=CONFIG)
        async with anyio.create_task_group() as tg:
            await tg.start(inst.serve)
            replies = await drain(await inst.run(rows(2)))
            assert len(replies) == 2
            assert inst.topology().participants[0] == ("agent", "legacy_agent")
            tg.cancel_scope.cancel()
        assert "gym-3" in repr(inst)

    anyio.run(main, backend="asyncio")


def test_episodes_run_as_plain_asyncio_tasks_of_a_task_group() -> None:
    """Under asyncio (a Ray actor) each episode is a task of an ``asyncio.TaskGroup`` inside
    the host's task group, not a task through anyio's (whose task handle adds a cancel scope
    and an event to every task: six times the cost per episode here); they still end with the
    host."""
    from gymckpt.gym_adapter import GymHost

    code = GymHost._episode_main.__code__
    slow = CalendarConfig(turns=(2, 2), turn_s=(5.0, 5.0), flush_interval_s=0.001)

    def episode_tasks() -> int:
        return sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "cr_code", None) is code)

    async def main() -> None:
        async with calendar_host("gym-0", seed=SEED, config=slow) as inst:
            await anyio.lowlevel.checkpoint()  # the host's episode task group starts
            await inst.run(rows(6))  # admitted: their tasks exist (scheduled or running)
            assert episode_tasks() == 6
        await anyio.lowlevel.checkpoint()
        assert episode_tasks() == 0

    anyio.run(main, backend="asyncio")
