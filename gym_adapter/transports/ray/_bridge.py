"""trio → asyncio → Ray: how the trio side waits for a Ray result, and how it gives up.

``RayGym.host`` opens one trio-asyncio loop for the deployment's lifetime. Submitting a call
(``actor.method.remote(...)``) is a plain synchronous call; *waiting* for it always happens in an
asyncio task on that loop (``Bridge``), never from trio directly: an ``ObjectRef`` awaited
outside an asyncio loop has no loop to wrap its future in, and one awaited on some other loop
resolves there. The task returns an ``outcome`` (errors of the Ray task are values), so the only
thing that can interrupt the wait is the trio side. This module and the deployment (``ray/_gym``,
which opens the loop) are the only places that touch trio-asyncio.

**Cancellation is real.** The runtime bounds every control call by its deadline plus reply grace
in its own trio cancel scope (``nurseries._calls.bounded_call``, S5). When that scope fires,
``trio_asyncio.run_aio_future`` cancels the asyncio task and waits until it has *finished* — so
no asyncio task or future is left pending — and then ``Bridge.resolve`` calls ``ray.cancel`` on
the Ray task before the ``Cancelled`` propagates: Ray drops it if it has not started (queued
behind a stuck loop, or never scheduled because its actor cannot be placed) and cancels its
coroutine at its next ``await`` if it has. ``BridgeStatistics`` lets tests prove that nothing was
left behind, on either side.

**Streams** are read through a ``GeneratorCursor``: the ref of the next object, taken from Ray's
streaming generator, is kept on the cursor until its value is read, so an interrupted wait loses
nothing and the next one picks it up.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Coroutine
from contextlib import suppress
from typing import Any, Final, TypeVar, final

import attrs
import outcome
import ray
import trio_asyncio

__all__ = ["END", "Bridge", "BridgeStatistics", "GeneratorCursor", "Result", "cancel_quietly"]

T = TypeVar("T")

END: Final = object()
"""The value of a ``GeneratorCursor.advance`` once the generator is exhausted."""

Result = outcome.Value[Any] | outcome.Error
"""A Ray result on the trio side: a value, or the error the Ray call raised."""


@attrs.frozen
class BridgeStatistics:
    """The trio↔asyncio↔Ray bridge of one deployment."""

    waits: int
    """Ray results waited for (control calls, views, stream objects)."""
    cancelled: int
    """Ray calls cancelled with ``ray.cancel`` because the trio side gave up on them."""
    calls_pending: int
    """asyncio tasks waiting for a call's result (0 whenever no call is in progress)."""
    asyncio_pending: int
    """asyncio tasks not done on the deployment's loop: the calls, plus one per stream whose
    consumer is waiting for its next batch (0 whenever nobody waits)."""


def cancel_quietly(ref: Any) -> None:
    """``ray.cancel(ref)``; a call that finished meanwhile, or whose actor is gone, is fine."""
    with suppress(Exception):
        ray.cancel(ref)


async def _outcome_of(ref: Any) -> Result:
    try:
        return outcome.Value(await ref)
    except Exception as exc:
        return outcome.Error(exc)


@final
@attrs.define(eq=False)
class GeneratorCursor:
    """A Ray streaming generator read one object at a time (on the bridge's loop)."""

    gen: Any
    _ref: Any = attrs.field(init=False, default=None)
    """Taken from the generator, its value not read yet."""

    async def advance(self) -> Result:
        """The next object (value or error, ``END`` at the end). Interrupted anywhere, it
        loses nothing: a ref taken from the generator is kept for the next call.

        An object already there is taken without a round trip through the event loop (Ray's
        awaitables each hop from a Ray thread to the loop); otherwise it is awaited."""
        gen = self.gen
        if self._ref is None:
            try:
                if gen.next_ready():
                    self._ref = next(gen)
                else:
                    self._ref = await gen.__anext__()
            except (StopIteration, StopAsyncIteration):
                return outcome.Value(END)
            except Exception as exc:
                return outcome.Error(exc)
        ref: Any = self._ref
        try:
            # ready *here* (no fetch from another node on the loop's thread), or awaited
            ready, _ = ray.wait([ref], timeout=0, fetch_local=True)
            result: Result = outcome.Value(ray.get(ref) if ready else await ref)
        except Exception as exc:
            result = outcome.Error(exc)
        self._ref = None
        return result

    def cancel(self) -> None:
        """Cancel the generator (one held by backpressure lets go too)."""
        cancel_quietly(self.gen)


@final
class Bridge:
    """trio → asyncio → Ray: every wait on Ray is an asyncio task on the deployment's
    trio-asyncio loop, awaited from trio with ``trio_asyncio.run_aio_future``."""

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self._calls: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.waits = 0
        self.cancelled = 0
        self.cancelled_refs: deque[Any] = deque(maxlen=64)

    async def _run(self, coro: Coroutine[Any, Any, T], *, call: bool = False) -> T:
        task: asyncio.Task[T] = self._loop.create_task(coro)
        self._tasks.add(task)
        if call:
            self._calls.add(task)
        self.waits += 1
        # On trio cancellation this cancels the task and returns only once it has finished.
        result: T = await trio_asyncio.run_aio_future(task)
        return result

    async def resolve(self, ref: Any) -> Result:
        """``ref``'s result. If the wait is interrupted (trio cancellation), the Ray call is
        cancelled before the interruption propagates."""
        try:
            return await self._run(_outcome_of(ref), call=True)
        except BaseException:
            self.cancel(ref)
            raise

    async def advance(self, cursor: GeneratorCursor) -> Result:
        """The next object of ``cursor`` (an interrupted wait leaves the cursor usable)."""
        return await self._run(cursor.advance())

    def cancel(self, ref: Any) -> None:
        self.cancelled += 1
        self.cancelled_refs.append(ref)
        cancel_quietly(ref)

    def statistics(self) -> BridgeStatistics:
        calls = sum(1 for t in self._calls if not t.done())
        pending = {t for t in self._tasks if not t.done()}
        pending |= asyncio.all_tasks(self._loop)
        return BridgeStatistics(self.waits, self.cancelled, calls, len(pending))

    def __repr__(self) -> str:
        return f"<Bridge waits={self.waits} cancelled={self.cancelled}>"
