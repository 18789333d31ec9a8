"""A trio run hosted on a running asyncio loop (trio's guest mode), and calls into it.

Why: a Gym host runs user code under trio everywhere (``host/_user_calls``), so that
environment code may call trio, anyio or asyncio whether the instance is embedded, a Ray actor
or an HTTP server. A Ray async actor is an asyncio program; ``TrioGuest`` starts a trio run
*as a guest* of the actor's loop: trio's tasks run in the loop's thread, between its callbacks
(only trio's wait for I/O and timers sits in a helper thread), so there is still one thread
touching the host, and a task that blocks the thread (the ``hang`` fault's stuck loop) stops
both loops, as a stuck loop does.

Invariants:

- Every touch of state owned by the guest run (the host, its streams) happens in a trio task of
  the run, reached through ``call`` (await a trio function from asyncio) or ``soon`` (a
  synchronous function, fire and forget, in submission order). The one exception is a read
  that needs no trio context, made from the loop's thread between trio's ticks: the actor's
  ``Outbox.take_ready`` (an unbounded memory stream's ``receive_nowait``).
- ``call`` returns (or raises) only once its trio task has finished: an asyncio cancellation of
  the caller (Ray's ``ray.cancel``) cancels the trio task's cancel scope, waits for it to end,
  then raises ``CancelledError``; so a cancelled call leaves nothing running.
- Once the run has ended (``stop``, or its main task failed) ``call`` raises
  ``GuestRunEnded`` naming why.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, final

import outcome
import trio

from ..host._user_calls import GUEST_LOOP

__all__ = ["GuestRunEnded", "TrioGuest", "run_on_an_asyncio_loop"]

T = TypeVar("T")


class GuestRunEnded(RuntimeError):
    """A call reached a trio guest run that has ended."""


@final
class TrioGuest:
    """One trio guest run on the running asyncio loop, serving ``serve`` (a trio function
    taking a ``started()`` callback: call it once serving, then run until cancelled).

    ``await TrioGuest.start(serve)`` returns once ``serve`` called ``started``; ``await
    guest.stop()`` cancels it and returns once the run has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._main_scope: trio.CancelScope | None = None
        self._ended: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        self._why_ended: str | None = None

    @classmethod
    async def start(cls, serve: Callable[[Callable[[], None]], Awaitable[None]]) -> TrioGuest:
        loop = asyncio.get_running_loop()
        guest = cls(loop)
        started: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not started.done():
                started.set_result(None)

        trio.lowlevel.start_guest_run(
            guest._main,
            serve,
            ready,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=guest._done,
            host_uses_signal_set_wakeup_fd=True,  # the asyncio loop owns the wakeup fd
        )
        either: list[asyncio.Future[Any]] = [started, guest._ended]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            guest._ended.result().unwrap()  # the run ended before serving: its error
            raise GuestRunEnded("the trio run ended before it served")
        return guest

    async def _main(
        self, serve: Callable[[Callable[[], None]], Awaitable[None]], ready: Callable[[], None]
    ) -> None:
        GUEST_LOOP.set(self._loop)
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._main_scope = scope
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    await serve(ready)
                    scope.cancel()  # serve returned: the calls still running end with it
            except BaseExceptionGroup as group:  # the one error of serve, as serve raised it
                if len(group.exceptions) == 1 and not isinstance(
                    group.exceptions[0], (trio.Cancelled, BaseExceptionGroup)
                ):
                    raise group.exceptions[0] from None
                raise

    def _done(self, result: outcome.Outcome[None]) -> None:
        if isinstance(result, outcome.Error):
            self._why_ended = f"its trio run failed: {result.error!r}"
        else:
            self._why_ended = "its trio run ended"
        if not self._ended.done():
            self._ended.set_result(result)

    @property
    def running(self) -> bool:
        return self._why_ended is None

    async def stop(self) -> None:
        """Cancel the run and wait until it has ended (its failure, if any, is raised)."""
        if self._why_ended is None:
            self.soon(self._cancel_main)
        result = await asyncio.shield(self._ended)
        result.unwrap()

    def _cancel_main(self) -> None:
        if self._main_scope is not None:
            self._main_scope.cancel()

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run the synchronous ``fn(*args)`` in the trio run soon (in submission order, before
        any later ``call`` starts); dropped if the run has ended."""
        if self._token is None or self._why_ended is not None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` in a new trio task of the run, from asyncio (see the module
        docstring for cancellation)."""
        if self._why_ended is not None or self._token is None:
            raise GuestRunEnded(f"not served: {self._why_ended or 'its trio run never started'}")
        result: asyncio.Future[outcome.Outcome[T]] = self._loop.create_future()
        scope = trio.CancelScope()

        def deliver(o: outcome.Outcome[T]) -> None:
            if not result.done():
                result.set_result(o)

        async def task() -> None:
            delivered = False
            try:
                with scope:
                    try:
                        value = await fn(*args)
                    except Exception as exc:
                        deliver(outcome.Error(exc))
                    else:
                        deliver(outcome.Value(value))
                    delivered = True
            finally:
                if not delivered:  # cancelled: by the caller (it raises), or the run ends
                    deliver(
                        outcome.Error(
                            GuestRunEnded(
                                "the call was cancelled: its caller was, or the trio run ended"
                            )
                        )
                    )

        def begin() -> None:
            if self._nursery is None:
                deliver(outcome.Error(GuestRunEnded("not served")))
                return
            try:
                self._nursery.start_soon(task)
            except RuntimeError as exc:  # the nursery is closed: the run is ending
                deliver(outcome.Error(GuestRunEnded(f"not served: {exc}")))

        try:
            self._token.run_sync_soon(begin)
        except trio.RunFinishedError:
            raise GuestRunEnded(f"not served: {self._why_ended or 'its trio run ended'}") from None
        try:
            got = await asyncio.shield(result)
        except asyncio.CancelledError:
            self.soon(scope.cancel)
            while not result.done() and self._why_ended is None:
                either: list[asyncio.Future[Any]] = [result, self._ended]
                try:
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    continue  # cancelled again: the trio task must still end first
            raise
        return got.unwrap()


def run_on_an_asyncio_loop(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run the trio function ``fn(*args)`` the way a Ray actor runs its Gym host: in a trio run
    hosted on an asyncio loop (a fresh plain one, in this thread, whatever event loop policy
    trio-asyncio installed), and return its result. Blocks this thread until it has ended."""

    async def serve(ready: Callable[[], None]) -> None:
        ready()
        await trio.sleep_forever()

    async def main() -> T:
        guest = await TrioGuest.start(serve)
        try:
            return await guest.call(fn, *args)
        finally:
            await guest.stop()

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(main())
