"""How the host awaits a user's code: one rule, whichever event loop the deployment runs.

**Environment code may call trio, anyio or asyncio, and mix them.** The host always runs
episodes under trio: embedded, in the trainer's trio run; on Ray, in a trio run the actor hosts
on its own asyncio loop (trio's guest mode, ``_trio_guest``). Each turn, ``agent.step(...)`` is
driven by ``UserCalls.wait`` in the episode's own trio task — and with it everything the step
awaits, the model's awaitable behind ``ctx.model`` included:

- what trio (or anyio, which then runs on trio) awaits goes to trio unchanged;
- an asyncio future it awaits (``asyncio.sleep``, an asyncio client's request, a task) is waited
  for in trio, its result or exception sent back in; a trio cancellation (fencing, shutdown, a
  deadline) cancels that future and arrives as trio's ``Cancelled``; a bare ``yield``
  (``asyncio.sleep(0)``) is a trio checkpoint;
- asyncio code finds a running asyncio loop: on Ray the actor's own, embedded the trainer's
  trio-asyncio loop if the serving task has one (``gymckpt.aio``), else one trio-asyncio loop
  opened for the whole trio run the first time a host serves in it (a system task; it closes
  when the run ends).

Not supported, because the step is a trio task and not an asyncio task: asyncio APIs that need
``asyncio.current_task()`` (``asyncio.timeout``, ``asyncio.TaskGroup``) raise their
``RuntimeError``, to which ``wait`` adds a note saying so (``NOT_AN_ASYNCIO_TASK``, in the logged
traceback): run such code in ``asyncio.ensure_future(...)`` (a real asyncio task) and await that,
or use trio/anyio for it. Synchronous user calls (``open``, ``export``, ``restore``, a model that
returns a value) are called as they are.

A host served under plain asyncio (anyio's asyncio backend, not through ``_trio_guest``) awaits
user code directly: there only asyncio and anyio work.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
import types
from collections.abc import Awaitable, Generator
from contextvars import ContextVar
from typing import Any, TypeVar, final

import attrs
import outcome
import sniffio
import trio

__all__ = ["GUEST_LOOP", "NOT_AN_ASYNCIO_TASK", "UserCalls"]

T = TypeVar("T")

GUEST_LOOP: trio.lowlevel.RunVar[asyncio.AbstractEventLoop | None] = trio.lowlevel.RunVar(
    "gymckpt_guest_loop", default=None
)
"""Set by ``_trio_guest`` for its trio run: the asyncio loop the run is hosted on. User asyncio
code under that run uses it."""


NOT_AN_ASYNCIO_TASK = (
    "gymckpt runs environment code in a trio task, which may call trio, anyio or asyncio; an "
    "asyncio API that needs asyncio.current_task() (asyncio.timeout, asyncio.TaskGroup) must "
    "run in an asyncio task of its own: await asyncio.ensure_future(coro)"
)
"""The note added to an asyncio error that says the code is not in an asyncio task."""

_NEEDS_A_TASK = re.compile(r"inside a task|parent task|current task")


@attrs.define(eq=False, slots=True)
class _SharedLoop:
    """The trio-asyncio loop of one trio run, opened on first use by a system task."""

    ready: Any
    loop: Any = None


_SHARED: trio.lowlevel.RunVar[_SharedLoop] = trio.lowlevel.RunVar("gymckpt_user_asyncio_loop")
"""This trio run's ``_SharedLoop`` (made on first use)."""


@final
@attrs.define(eq=False, slots=True)
class UserCalls:
    """The host's way to await user code (see the module docstring). ``open`` is called once
    the host serves, in the serving task (no await); ``wait(aw)`` awaits ``aw``.

    Invariant: under trio, every ``wait`` drives its awaitable in the calling trio task (an
    episode's), and asyncio's running loop is ``loop`` in that task from then on."""

    _trio: bool = False
    _token: Any = None
    _loop: Any = None
    """The asyncio loop user code runs on (None until known)."""
    _shared: _SharedLoop | None = None
    _set_loop: ContextVar[Any] | None = None
    """trio-asyncio's ``current_loop`` when trio-asyncio is imported (it decides what
    ``asyncio.get_running_loop()`` returns inside a trio task), else None."""

    def open(self) -> None:
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = None
        self._trio = library == "trio"
        if not self._trio:
            return
        self._token = trio.lowlevel.current_trio_token()
        guest = GUEST_LOOP.get()
        if guest is not None:  # a trio run hosted on an asyncio loop: user code uses that loop
            self._loop = guest
            if "trio_asyncio" in sys.modules:
                import trio_asyncio

                self._set_loop = trio_asyncio.current_loop
            return
        import trio_asyncio

        self._set_loop = trio_asyncio.current_loop
        self._loop = trio_asyncio.current_loop.get()
        if self._loop is None:
            self._shared = _shared_loop()
            self._loop = self._shared.loop

    async def wait(self, aw: Awaitable[T]) -> T:
        """Await the user's ``aw`` (see the module docstring)."""
        return (await self.wait_waited(aw))[0]

    async def wait_waited(self, aw: Awaitable[T]) -> tuple[T, bool]:
        """``wait``, and whether ``aw`` surely waited (went through the scheduler): True only
        when it yielded to trio; False when it returned at its first send, and outside trio,
        where it cannot be told (the caller then takes a checkpoint of its own)."""
        if not self._trio:
            return await aw, False
        if self._loop is None and self._shared is not None:
            try:
                await self._shared.ready.wait()
            except BaseException:  # cancelled before it ran: close it, never leave it unawaited
                if inspect.iscoroutine(aw):
                    aw.close()
                raise
            self._loop = self._shared.loop
        if self._set_loop is not None and self._set_loop.get() is not self._loop:
            self._set_loop.set(self._loop)  # for the rest of this task: an episode's
        it = aw.__await__()
        try:
            try:
                yielded = it.send(None)
            except StopIteration as stop:  # done without waiting (a short step): no driver
                done: T = stop.value
                return done, False
            result: T = await _drive(it, yielded, self._token)
            return result, True
        except RuntimeError as exc:
            if _NEEDS_A_TASK.search(str(exc)):
                exc.add_note(NOT_AN_ASYNCIO_TASK)
            raise


def _shared_loop() -> _SharedLoop:
    """This trio run's trio-asyncio loop for user code (opened by a system task on first use)."""
    import trio_asyncio

    try:
        return _SHARED.get()
    except LookupError:
        pass
    shared = _SharedLoop(trio.Event())
    _SHARED.set(shared)

    async def own_loop() -> None:
        async with trio_asyncio.open_loop() as loop:
            shared.loop = loop
            shared.ready.set()
            await trio.sleep_forever()

    trio.lowlevel.spawn_system_task(own_loop, name="gymckpt: asyncio loop for user code")
    return shared


@types.coroutine
def _drive(it: Generator[Any, Any, T], yielded: Any, token: Any) -> Generator[Any, Any, T]:
    """Run the awaitable's iterator ``it``, which has just yielded ``yielded``, to its end in
    this trio task: trio's traps pass through, asyncio futures are waited for in trio."""
    send: Any
    value: Any
    while True:
        try:
            if yielded is None:  # asyncio.sleep(0): one pass of the scheduler
                yield from _checkpoint().__await__()
                value = None
            elif asyncio.isfuture(yielded):
                value = yield from _wait_future(yielded, token).__await__()
            else:
                value = yield yielded
        except BaseException as exc:  # thrown into the user's code, as an await would
            send, value = it.throw, exc
        else:
            send = it.send
        try:
            yielded = send(value)
        except StopIteration as stop:
            return stop.value


async def _checkpoint() -> None:
    await trio.lowlevel.checkpoint()


async def _wait_future(fut: Any, token: Any) -> Any:
    """Wait in trio until the asyncio future ``fut`` is done; its outcome is the result. A
    trio cancel cancels ``fut`` and, once it is done cancelled, raises trio's ``Cancelled``."""
    task = trio.lowlevel.current_task()
    raise_cancel: Any = None
    fut._asyncio_future_blocking = False  # taken over: asyncio's task protocol is ours now

    def done(f: Any) -> None:  # on the asyncio loop's side: reschedule through the token
        token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.capture(f.result))

    fut.add_done_callback(done)

    def abort(raise_cancel_arg: Any) -> Any:
        nonlocal raise_cancel
        raise_cancel = raise_cancel_arg
        fut.cancel()
        return trio.lowlevel.Abort.FAILED  # done() still reschedules us

    try:
        return await trio.lowlevel.wait_task_rescheduled(abort)
    except asyncio.CancelledError:
        if raise_cancel is not None:
            raise_cancel()
        raise
