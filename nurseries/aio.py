"""The rollouts from an asyncio trainer, through trio-asyncio (the project's one bridge).

The drivers of many RL trainers are asyncio programs. The runtime is trio; trio-asyncio runs an
asyncio loop inside trio, so an asyncio trainer keeps its ``async def`` code and the same
semantics — the checkpoint protocol, restore, preemption by SIGTERM/SIGINT, the work
directory lock — come from the very same trio code::

    async def main():                      # an asyncio coroutine
        async with gymckpt.aio.open_embedded_gym(instances=2) as gym:
            async with gymckpt.aio.open_rollouts(gym, "work", rows=32, group_size=4) as ro:
                async for batch in ro.batches(groups_per_step=4, state=save):
                    ...                    # asyncio code: await other asyncio libraries here
                    await ro.checkpoint(save())

    gymckpt.aio.run(main)                  # in place of asyncio.run(main())

Every call crosses the bridge with ``trio_asyncio.trio_as_aio``; a trio task never runs asyncio
code and vice versa. Only an asyncio loop opened by ``run`` (trio-asyncio's) can host these
calls: a plain ``asyncio.run`` cannot run trio code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio_asyncio

from gymckpt.gym_adapter import EmbeddedGym, Environment, EnvironmentRef, GymBackend
from gymckpt.gym_adapter.environments.calendar import calendar_environment
from gymckpt.runtime import CompletedGroup

from ._coordinator import CheckpointOutcome
from ._run import run as run_trio
from ._trainer import FilesFn, Rollouts, StateFn
from ._trainer import open_rollouts as open_trio_rollouts

__all__ = ["AioRollouts", "open_embedded_gym", "open_gym", "open_rollouts", "run"]

T = TypeVar("T")
G = TypeVar("G", bound=GymBackend)


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run the asyncio coroutine function ``main`` on trio-asyncio's loop (in place of
    ``asyncio.run(main())``); run-ending errors end with one line and an exit code, as
    ``gymckpt.run``."""

    async def host() -> T:
        async with trio_asyncio.open_loop():
            return await trio_asyncio.aio_as_trio(main)()

    return run_trio(host)


@asynccontextmanager
async def _hold_open(enter: Callable[[], AbstractAsyncContextManager[T]]) -> AsyncIterator[T]:
    """Hold a trio async context manager open from asyncio code.

    trio-asyncio would run ``__aenter__`` and ``__aexit__`` in two different trio tasks, but a
    nursery (``open_rollouts`` runs the dispatcher in one) must be entered and exited by the
    same task. So one trio task enters the context, hands its value over and waits to be told
    to exit; an error on entry or exit is raised here.
    """
    handed: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    done = trio.Event()

    async def hold() -> None:  # a trio task
        async with enter() as value:
            handed.set_result(value)
            await done.wait()

    holder = asyncio.ensure_future(trio_asyncio.trio_as_aio(hold)())
    await asyncio.wait({handed, holder}, return_when=asyncio.FIRST_COMPLETED)
    if not handed.done():
        holder.result()  # raises the error from entering
        raise RuntimeError("the trio context ended before it was entered")
    try:
        yield handed.result()
    finally:
        done.set()
        await holder


def open_embedded_gym(
    environment: Environment | EnvironmentRef | str | None = None, **kw: Any
) -> AbstractAsyncContextManager[EmbeddedGym]:
    """``EmbeddedGym.host(environment, **kw)`` from asyncio code; without ``environment``, the
    built-in calendar workplace (``calendar_environment()``)."""
    env = environment if environment is not None else calendar_environment()
    return _hold_open(lambda: EmbeddedGym.host(env, **kw))


def open_gym(enter: Callable[[], AbstractAsyncContextManager[G]]) -> AbstractAsyncContextManager[G]:
    """Any Gym deployment from asyncio code: ``enter`` returns the trio context that opens it,
    e.g. ``lambda: EmbeddedGym.host(my_env, instances=2)`` (your own environment) or
    ``lambda: RayGym.host("pkg.module:env", instances=4)``. The context is entered and exited
    by one trio task, as trio requires; what it yields is handed to the asyncio code."""
    return _hold_open(enter)


class AioRollouts:
    """``Rollouts`` seen from asyncio: the same object behind (``trio_rollouts``), with the
    awaitables and iterators a trainer uses wrapped to run on the trio side."""

    __slots__ = ("trio_rollouts",)

    def __init__(self, rollouts: Rollouts) -> None:
        self.trio_rollouts = rollouts

    def __getattr__(self, name: str) -> Any:  # plain attributes: trainer_state, metrics, ...
        return getattr(self.trio_rollouts, name)

    def batches(
        self,
        groups_per_step: int,
        *,
        state: StateFn | None = None,
        files: FilesFn | None = None,
        log_metrics: Callable[[dict[str, float], int], None] | None = None,
    ) -> AsyncIterator[list[CompletedGroup]]:
        it = self.trio_rollouts.batches(
            groups_per_step, state=state, files=files, log_metrics=log_metrics
        )
        return trio_asyncio.trio_as_aio(it)

    async def next_batch(self, groups: int) -> list[CompletedGroup]:
        return await trio_asyncio.trio_as_aio(self.trio_rollouts.next_batch)(groups)

    async def checkpoint(
        self, trainer_state: bytes | None = None, *, files: FilesFn | None = None
    ) -> CheckpointOutcome:
        async def call() -> CheckpointOutcome:
            return await self.trio_rollouts.checkpoint(trainer_state, files=files)

        return await trio_asyncio.trio_as_aio(call)()


@asynccontextmanager
async def open_rollouts(
    gym: GymBackend, workdir: Path | str, **kw: Any
) -> AsyncIterator[AioRollouts]:
    """``gymckpt.open_rollouts`` from asyncio code: the same arguments, the same semantics."""
    async with _hold_open(lambda: open_trio_rollouts(gym, workdir, **kw)) as rollouts:
        yield AioRollouts(rollouts)
