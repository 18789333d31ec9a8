"""Tests of ``gym_adapter.host._user_calls``: how ``UserCalls.wait`` drives a user's step.

Under trio the step runs in the calling trio task: trio's own waits pass through, an asyncio
future it awaits is waited for in trio (its result or exception sent back in), a trio cancel
cancels that future and arrives as trio's ``Cancelled``, and a user's exception surfaces as
itself, with the user's frames in its traceback. Not under trio, ``wait`` just awaits. (The
asyncio-task rule's note and a cancel before the loop opens: tests/test_event_loops.py.)
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from typing import Any

import pytest
import trio
import trio.testing
import trio_asyncio

from gymckpt.gym_adapter.host._user_calls import NOT_AN_ASYNCIO_TASK, UserCalls


def opened() -> UserCalls:
    calls = UserCalls()
    calls.open()
    return calls


async def test_a_step_that_never_waits_returns_its_value() -> None:
    async def step() -> int:
        return 7

    assert await opened().wait(step()) == 7


async def test_trio_waits_pass_through_to_trio(autojump_clock: trio.testing.MockClock) -> None:
    calls = opened()

    async def step() -> str:
        await trio.sleep(3)
        await trio.sleep(2)
        return "slept"

    t0 = trio.current_time()
    assert await calls.wait(step()) == "slept"
    assert trio.current_time() - t0 == 5


async def test_an_asyncio_future_s_result_is_sent_back_in() -> None:
    calls = opened()
    seen: list[Any] = []

    async def step() -> int:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_result, 41)
        value = await fut
        seen.append(value)
        await asyncio.sleep(0)  # a bare yield: a trio checkpoint
        return value + 1

    assert await calls.wait(step()) == 42
    assert seen == [41]


async def test_an_asyncio_future_s_exception_is_thrown_into_the_step() -> None:
    calls = opened()

    async def step() -> str:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_exception, LookupError("no such row"))
        try:
            await fut
        except LookupError as exc:
            return f"caught {exc}"
        return "not thrown"

    assert await calls.wait(step()) == "caught no such row"


async def test_an_asyncio_task_runs_on_the_loop_and_its_result_comes_back() -> None:
    calls = opened()

    async def child() -> str:
        await asyncio.sleep(0)
        return "child"

    async def step() -> str:
        return await asyncio.ensure_future(child())

    assert await calls.wait(step()) == "child"


async def test_every_step_of_a_trio_run_finds_the_same_running_asyncio_loop() -> None:
    loops: list[Any] = []

    async def step() -> None:
        loops.append(asyncio.get_running_loop())

    first, second = opened(), opened()
    await first.wait(step())
    await first.wait(step())
    await second.wait(step())
    assert len(loops) == 3 and loops[0] is loops[1] is loops[2]
    assert trio_asyncio.current_loop.get() is loops[0]  # from then on in this task


async def test_the_trainer_s_trio_asyncio_loop_is_the_one_user_code_runs_on() -> None:
    async with trio_asyncio.open_loop() as loop:
        calls = opened()

        async def step() -> Any:
            return asyncio.get_running_loop()

        assert await calls.wait(step()) is loop


async def test_a_trio_cancel_cancels_the_awaited_future_and_arrives_as_cancelled() -> None:
    calls = opened()
    futures: list[asyncio.Future[None]] = []
    thrown: list[type[BaseException]] = []
    waiting = trio.Event()

    async def step() -> None:
        fut = asyncio.get_running_loop().create_future()
        futures.append(fut)
        waiting.set()
        try:
            await fut
        except BaseException as exc:
            thrown.append(type(exc))
            raise

    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await calls.wait(step())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await waiting.wait()
        scope.cancel()
    assert scope.cancelled_caught
    assert futures[0].cancelled()
    assert thrown == [trio.Cancelled]


async def test_a_cancelled_step_is_closed_its_finally_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls = opened()
    cleaned: list[str] = []

    async def step() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append("finally")

    coro = step()
    with trio.move_on_after(1) as scope:
        await calls.wait(coro)
    assert scope.cancelled_caught
    assert cleaned == ["finally"]
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


async def test_a_user_exception_surfaces_with_the_user_s_traceback() -> None:
    calls = opened()

    def deep_in_user_code(n: int) -> None:
        raise ValueError(f"bad turn {n}")

    async def user_step() -> None:
        await trio.lowlevel.checkpoint()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_result, 3)
        deep_in_user_code(await fut)

    with pytest.raises(ValueError, match="bad turn 3") as info:
        await calls.wait(user_step())
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-2:] == ["user_step", "deep_in_user_code"]
    assert not getattr(info.value, "__notes__", [])


async def test_an_exception_before_the_first_wait_surfaces_too() -> None:
    async def user_step() -> None:
        raise KeyError("at once")

    with pytest.raises(KeyError, match="at once") as info:
        await opened().wait(user_step())
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "user_step"


async def test_only_an_asyncio_task_error_gets_the_note() -> None:
    async def user_step() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("something else broke")

    with pytest.raises(RuntimeError, match="something else broke") as info:
        await opened().wait(user_step())
    assert NOT_AN_ASYNCIO_TASK not in getattr(info.value, "__notes__", [])


def test_not_under_trio_wait_just_awaits() -> None:
    async def main() -> tuple[str, Any, Any]:
        calls = opened()  # under asyncio: no trio-asyncio loop, no driving

        async def step() -> Any:
            await asyncio.sleep(0)
            return asyncio.get_running_loop()

        running = asyncio.get_running_loop()
        return "ok", await calls.wait(step()), running

    word, loop, running = asyncio.run(main())
    assert word == "ok" and loop is running


def test_opened_outside_any_event_loop_wait_just_awaits() -> None:
    calls = opened()  # no async library here: wait will await directly

    async def step() -> int:
        await asyncio.sleep(0)
        return 5

    async def main() -> int:
        return await calls.wait(step())

    assert asyncio.run(main()) == 5
