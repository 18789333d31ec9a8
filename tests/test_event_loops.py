"""One environment, both event loops: environment code may call trio, anyio or asyncio.

Embedded, the host runs under the trainer's trio run; an agent that waits with ``asyncio.sleep``
(on a trio-asyncio loop the host provides), ``trio.sleep`` or ``anyio.sleep`` completes its
episodes the same. ``check_environment`` runs each check under trio and again with the host in a
trio run hosted on an asyncio loop (a Ray actor's case); on Ray itself:
tests/test_ray_event_loops.py.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import gymckpt.aio
from gymckpt.gym_adapter import (
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    EpisodeContext,
    Failed,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.transports._trio_guest import GuestRunEnded, TrioGuest
from gymckpt.nurseries import open_rollouts
from gymckpt.testing import ConformanceError, check_environment
from gymckpt.testing import loop_examples as examples

LIBRARIES = ["trio", "asyncio", "anyio", "mixed"]


def _env(library: str) -> Environment:
    env: Environment = getattr(examples, f"{library}_sleeper")()
    return env


async def _play(host: GymHost, n: int) -> dict[str, RunReply]:
    got: dict[str, RunReply] = {}
    async for batch in await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(n)]):
        got.update({r.rollout_id: r for r in batch})
    return got


@pytest.mark.parametrize("library", LIBRARIES)
async def test_each_library_completes_episodes_on_an_embedded_host(library: str) -> None:
    async with GymHost("gym-0", _env(library), 0) as host:
        got = await _play(host, 4)
    assert got == {
        f"{r}-0": Completed(f"{r}-0", float(3 * r + 3), 3, [r, r + 1, r + 2]) for r in range(4)
    }


@pytest.mark.parametrize("library", ["trio", "asyncio"])
async def test_each_library_trains_through_a_checkpoint_embedded(
    tmp_path: Path, library: str
) -> None:
    rewards: dict[tuple[int, int], float] = {}
    async with (
        EmbeddedGym.host(_env(library), instances=2, work_dir=tmp_path / "gym") as gym,
        open_rollouts(gym, tmp_path / "run", rows=6, group_size=2, max_rows_in_flight=3) as ro,
    ):
        async with aclosing(ro.batches(2)) as batches:  # type: ignore[type-var]
            async for batch in batches:
                rewards.update(
                    {(g.row, s): r.reward for g in batch for s, r in enumerate(g.results)}
                )
                assert (await ro.checkpoint()).ok
    assert rewards == {(row, s): float(3 * row + 3) for row in range(6) for s in range(2)}


async def test_a_trio_cancel_reaches_an_asyncio_wait_and_the_episode_is_fenced() -> None:
    """A newer attempt fences an episode blocked in ``asyncio.sleep``: the asyncio wait is
    cancelled (trio's cancel arrives as asyncio's cancellation is turned into trio's), no reply
    comes from the old attempt, the new one completes."""
    cancelled: list[str] = []

    class Stuck(examples.Sleeper):
        async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
            if ctx.info.attempt == 0:
                try:
                    await asyncio.sleep(3600)
                except BaseException as exc:
                    cancelled.append(type(exc).__name__)
                    raise
            return await super().step(ctx, state)

    env = Environment(agent=Stuck("asyncio"), model=_env("asyncio").model)
    old: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, 0) as host, trio.open_nursery() as nursery:

        async def read_old() -> None:
            async for batch in await host.run([RunRow("0-0", 0, 0, 0)]):
                old.update({r.rollout_id: r for r in batch})

        nursery.start_soon(read_old)
        await trio.testing.wait_all_tasks_blocked()
        new: dict[str, RunReply] = {}
        async for batch in await host.run([RunRow("0-0-a1", 0, 0, 1)]):
            new.update({r.rollout_id: r for r in batch})
        nursery.cancel_scope.cancel()
    assert cancelled == ["Cancelled"] and not old
    assert new == {"0-0-a1": Completed("0-0-a1", 3.0, 3, [0, 1, 2])}


def test_an_asyncio_trainer_s_loop_is_the_one_its_environment_runs_on(tmp_path: Path) -> None:
    """Under ``gymckpt.aio`` the environment's asyncio code runs on the trainer's own loop, so
    an asyncio object made by the trainer is usable in ``step``."""
    seen: list[bool] = []

    async def main() -> None:
        trainer_loop = asyncio.get_running_loop()

        class Probe(examples.Sleeper):
            async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
                seen.append(asyncio.get_running_loop() is trainer_loop)
                return await super().step(ctx, state)

        env = Environment(agent=Probe("asyncio"), model=_env("asyncio").model)
        async with (
            gymckpt.aio.open_gym(lambda: EmbeddedGym.host(env, work_dir=tmp_path)) as gym,
            gymckpt.aio.open_rollouts(
                gym, tmp_path / "run", rows=2, group_size=1, handle_signals=False
            ) as ro,
        ):
            async for _ in ro.batches(1):
                pass

    gymckpt.aio.run(main)
    assert seen and all(seen)


# -- check_environment under both loops --------------------------------------------------------


@pytest.mark.parametrize("library", LIBRARIES)
async def test_check_environment_runs_every_check_under_both_loops(
    tmp_path: Path, library: str
) -> None:
    report = await check_environment(_env(library), tmp_path, rows=2, park_after=(1,))
    assert {
        "completes",
        "completes@asyncio",
        "restore_equivalence[1]@asyncio",
        "fencing@asyncio",
    } <= set(report.checks)


class _OnlyOnTrioAsyncio(examples.Sleeper):
    """Works where asyncio code runs on trio-asyncio's loop (embedded), not on a plain asyncio
    loop (a Ray actor's)."""

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        loop = asyncio.get_running_loop()
        if not type(loop).__module__.startswith("trio_asyncio"):
            raise RuntimeError(f"needs trio-asyncio, runs on {type(loop).__name__}")
        return await super().step(ctx, state)


async def test_check_environment_names_the_loop_an_environment_fails_under(
    tmp_path: Path,
) -> None:
    env = Environment(agent=_OnlyOnTrioAsyncio("asyncio"), model=_env("asyncio").model)
    with pytest.raises(ConformanceError) as info:
        await check_environment(env, tmp_path, rows=2, park_after=(1,))
    message = str(info.value)
    assert "- completes@asyncio:" in message and "needs trio-asyncio" in message
    assert "- completes:" not in message  # the trio run passed it


# -- the guest run itself ------------------------------------------------------------------------


def test_a_cancelled_guest_call_returns_once_its_trio_task_ended() -> None:
    ended: list[str] = []

    async def serve(ready: Any) -> None:
        ready()
        await trio.sleep_forever()

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        finally:
            ended.append("trio task")

    async def main() -> None:
        guest = await TrioGuest.start(serve)
        call = asyncio.ensure_future(guest.call(forever))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert ended == ["trio task"]
        await guest.stop()
        with pytest.raises(GuestRunEnded, match="trio run ended"):
            await guest.call(forever)

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(main())


def test_an_error_in_a_guest_call_reaches_the_asyncio_caller() -> None:
    async def serve(ready: Any) -> None:
        ready()
        await trio.sleep_forever()

    async def boom() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("boom")

    async def main() -> None:
        guest = await TrioGuest.start(serve)
        with pytest.raises(KeyError, match="boom"):
            await guest.call(boom)
        assert guest.running  # one failed call does not end the run
        await guest.stop()

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(main())


class _Timed(examples.Sleeper):
    """asyncio.timeout needs an asyncio task: directly in ``step`` it raises (with the rule in
    a note), inside ``asyncio.ensure_future`` it works."""

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        async def timed() -> int:
            async with asyncio.timeout(10):
                await asyncio.sleep(0.001)
            return 1

        n = await (asyncio.ensure_future(timed()) if self.library == "task" else timed())
        return Done(float(n))


async def test_asyncio_code_that_needs_a_task_runs_in_ensure_future() -> None:
    async with GymHost("gym-0", Environment(agent=_Timed("task")), 0) as host:
        assert await _play(host, 1) == {"0-0": Completed("0-0", 1.0, 1, None)}


async def test_asyncio_code_that_needs_a_task_fails_naming_the_rule() -> None:
    from gymckpt.gym_adapter.host._user_calls import NOT_AN_ASYNCIO_TASK, UserCalls

    calls = UserCalls()
    calls.open()
    with pytest.raises(RuntimeError, match="inside a task") as info:
        await calls.wait(_Timed("direct").step(None, {}))  # type: ignore[arg-type]
    assert info.value.__notes__ == [NOT_AN_ASYNCIO_TASK]
    async with GymHost("gym-0", Environment(agent=_Timed("direct")), 0) as host:
        (reply,) = (await _play(host, 1)).values()
    assert isinstance(reply, Failed) and "Timeout should be used inside a task" in reply.message


async def test_a_step_cancelled_before_the_loop_for_user_code_opens_is_closed() -> None:
    """A cancel while the host waits for its asyncio loop closes the user's step coroutine: it
    is never left unawaited (a RuntimeWarning, an error under filterwarnings = error)."""
    from gymckpt.gym_adapter.host._user_calls import UserCalls

    calls = UserCalls()
    calls.open()  # no trio-asyncio loop in this run: the host's opens in a system task

    async def step() -> None:
        await trio.lowlevel.checkpoint()

    coro = step()
    with trio.CancelScope() as scope:
        scope.cancel()
        await calls.wait(coro)
    assert scope.cancelled_caught
    assert coro.cr_frame is None  # closed


def test_a_guest_run_that_cannot_serve_raises_its_own_error_at_start() -> None:
    async def serve(ready: Any) -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("cannot open the journal")

    async def main() -> None:
        with pytest.raises(KeyError, match="cannot open the journal"):
            await TrioGuest.start(serve)

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(main())
