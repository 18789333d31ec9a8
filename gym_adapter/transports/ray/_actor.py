"""One Gym instance as a Ray async actor: a ``GymHost`` under trio, hosted on the actor's loop.

This module runs inside a Ray worker process. Ray calls the actor's methods on its asyncio
loop; the instance itself runs under trio, in a trio run hosted on that same loop (trio's guest
mode, ``_trio_guest.TrioGuest``, started by ``start``): the host runs user code under trio
everywhere, so an environment may call trio, anyio or asyncio (``host/_user_calls``) and runs the
same embedded and on Ray. Every method body that touches the instance runs in that trio run
(``TrioGuest.call``; acknowledgements without a reply through ``TrioGuest.soon``); a Ray
cancellation of a call cancels its trio task and returns once the task has ended. (The trio side
of the driver waits on Ray through ``ray/_bridge``, which with ``ray/_gym`` is all that touches
trio-asyncio; no trio-asyncio here.) The driver decides everything deployment-wide (the
``FaultPlan`` counts, dead instances, stream ids); the actor executes: it re-anchors each
deadline on the trio run's clock, applies the fault it was handed for real, runs the call on its
instance and makes sure whatever it raises can cross Ray. The actor builds its environment
itself from its name (``load_environment``: an import path or an ``EnvironmentRef``), so no
environment is pickled and every environment, the calendar workplace too, is hosted the same way.

Data plane and acknowledgement
------------------------------
``run`` is a Ray streaming generator. Its first object is the admission header
(``_admission``): the rows' fate (admitted, refused, fenced) is decided before the
driver's ``run`` returns, as it is in-process (S1: a checkpoint must never overtake a submission
the ledger counts). Then every object is one ``ReplyBatch``: whatever the instance's flusher
has produced by the time the generator looks (several of its timer-flushed batches coalesce into
one Ray object, up to
``max_replies``), because Ray charges a fixed cost per streamed object.

The generator reads the instance's batches *without* acknowledging them (``Outbox``,
``_outbox``, shared with the HTTP server): a reply stays on the wire (listed by
``commit``) after it entered Ray and until the consumer asks for the batch after the one that
carried it. The consumer says so with ``ack(sid, seq)`` (every batch up to ``seq``), and the
driver repeats its latest acknowledgements with every control and view call, which apply them
before anything else (``acks``).
``close_stream`` acknowledges what the consumer received, discards what it did not (yielded into
Ray but never read), and ends the stream: its rows keep running. Ray's generator backpressure
stops the generator a couple of objects ahead of the consumer, so a slow consumer gets fewer,
larger batches.

A commit's reply crosses Ray packed (``_commit_wire``): its per-episode records as JSON chunks,
packed one chunk per scheduler step, so neither Ray's serialiser nor the freeing of 100k record
objects holds the actor's loop in one piece.

Faults (C3) are executed here for real, in the trio run: ``hang`` never answers (optionally
after blocking the thread for ``stuck_loop_s`` — a stuck loop: the guest run shares the actor
loop's thread, so nothing on the instance moves, no other call is served, not even the lease
timer); ``delay`` sleeps; ``error`` raises ``GymControlError``;
``unpicklable`` raises Gym's own unpicklable ``CoordinationError``; ``dead`` ends the worker
process (``os._exit``), so Ray reports the actor dead to every caller.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.lowlevel
import attrs

from gymckpt.runtime import TrainerTerm
from gymckpt.runtime.lowlevel import crossing_boundary

from ..._contract import RunReply, RunRow
from ..._faults import FaultSpec, inject_fault
from ...host._host import GymHost, HostConfig
from ...host._load import EnvironmentRef, load_environment
from .._admission import HEADER_SEQ, ReplyBatch, RunShape, admission_header
from .._deadlines import WireDeadline
from .._interpreter import instance_switch_interval
from .._outbox import Outbox, Outboxes
from .._trio_guest import TrioGuest
from .._verbs import CONTROL_VERBS, call_host
from ._commit_wire import pack_commit

__all__ = ["HEADER_SEQ", "ActorCallStatistics", "GymActor"]

_VIEWS: Final = frozenset(
    {"topology", "inventory", "session_states", "retained_sessions", "statistics"}
)
_STREAM_ENDED = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


@attrs.frozen
class ActorCallStatistics:
    """What one actor has on its hands (for tests: a cancelled call must leave nothing)."""

    instance: str
    active: tuple[tuple[str, int], ...]
    """Calls running right now, by operation (the asking ``calls()`` is not counted)."""
    started: int
    cancelled: tuple[tuple[str, int], ...]
    """Calls cancelled while running (``ray.cancel``), by operation."""
    streams: int
    """Streams whose outbox is still registered (not yet fully acknowledged or closed)."""

    @property
    def in_progress(self) -> int:
        return sum(n for _, n in self.active)


class GymActor:
    """A Ray async actor hosting one ``GymHost`` (wrapped with ``ray.remote`` by the driver)
    serving the environment named by ``environment`` (an import path or an ``EnvironmentRef``,
    built here). ``start`` serves it in a trio run hosted on the actor's loop; ``stop`` ends
    it. ``recover``: a replacement, which continues the retained sessions the instance of the
    same name journaled in ``work_dir``."""

    def __init__(
        self,
        name: str,
        environment: str | EnvironmentRef,
        seed: int,
        work_dir: str | None,
        config: HostConfig,
        stuck_loop_s: float = 0.0,
        recover: bool = False,
    ) -> None:
        instance_switch_interval()  # this worker process is the instance's own
        wd = Path(work_dir) if work_dir else None
        self._sim = GymHost(name, load_environment(environment), seed, wd, config, recover=recover)
        self._stuck_loop_s = stuck_loop_s
        self._guest: TrioGuest | None = None
        self._starting: asyncio.Lock = asyncio.Lock()
        self._streams = Outboxes()
        self._active: Counter[str] = Counter()
        self._cancelled: Counter[str] = Counter()
        self._started = 0

    @property
    def name(self) -> str:
        return self._sim.name

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> str:
        """Serve the instance; returns the Ray node ID the actor was placed on."""
        async with self._starting:
            if self._guest is None:
                sim = self._sim

                async def serve(ready: Callable[[], None]) -> None:
                    async with sim:
                        ready()
                        await anyio.sleep_forever()

                self._guest = await TrioGuest.start(serve)
        import ray  # only ever imported inside a Ray worker

        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id

    async def stop(self) -> None:
        """End the instance cleanly (every episode cancelled, every stream ended)."""
        if self._guest is not None:
            await self._guest.stop()

    def _in_trio(self) -> TrioGuest:
        if self._guest is None:
            raise RuntimeError(f"instance {self.name} is not serving: call start first")
        return self._guest

    # -- bookkeeping -------------------------------------------------------------------------

    @contextmanager
    def _track(self, op: str) -> Iterator[None]:
        self._active[op] += 1
        self._started += 1
        try:
            yield
        except asyncio.CancelledError:
            self._cancelled[op] += 1
            raise
        finally:
            self._active[op] -= 1

    async def calls(self) -> ActorCallStatistics:
        return ActorCallStatistics(
            instance=self.name,
            active=tuple(sorted((op, n) for op, n in self._active.items() if n)),
            started=self._started,
            cancelled=tuple(sorted(self._cancelled.items())),
            streams=len(self._streams),
        )

    async def _inject(self, spec: FaultSpec, op: str) -> None:
        # ``dead``: the process exits for real; Ray reports ActorDiedError to every caller
        await inject_fault(spec, self.name, op, lambda: os._exit(1), self._stuck_loop_s)

    # -- control plane (each body runs in the trio run) --------------------------------------------

    def _apply_acks(self, acks: dict[int, int]) -> None:
        self._streams.apply_acks(acks)

    async def control(
        self,
        op: str,
        args: Mapping[str, Any],
        deadline: WireDeadline,
        fault: FaultSpec | None,
        acks: dict[int, int],
        trainer: str | None = None,
    ) -> Any:
        """Run control call ``op`` with its named ``args`` (``RemoteGym``'s) by ``deadline``
        (re-anchored on the trio run's clock), once the stream acknowledgements ``acks``
        (sid -> seq) are applied. ``trainer``: the caller's term as ``TrainerTerm.header``
        gives it, checked before the acknowledgements act."""
        with self._track(op), crossing_boundary(self.name, op):
            return await self._in_trio().call(
                self._control, op, args, deadline, fault, acks, trainer
            )

    async def _control(
        self,
        op: str,
        args: Mapping[str, Any],
        deadline: WireDeadline,
        fault: FaultSpec | None,
        acks: dict[int, int],
        trainer_header: str | None,
    ) -> Any:
        trainer = None if trainer_header is None else TrainerTerm.parse(trainer_header)
        if op != "attach":  # an attach is the takeover itself (``GymHost.attach``)
            self._sim.check_trainer(trainer, op)
        self._apply_acks(acks)
        deadline_ts = deadline.local(anyio.current_time(), time.time())
        if fault is not None:
            await self._inject(fault, op)
        if op not in CONTROL_VERBS:
            raise ValueError(f"unknown control operation {op!r}")
        reply = await call_host(self._sim, op, args, deadline_ts, trainer)
        if op == "attach" and reply.took_over:  # the older term's streams are gone with them
            self._streams.forget_all()
        if op == "commit":  # its records as JSON chunks, packed and freed in slices
            box = [reply]
            del reply
            return await pack_commit(box)
        return reply

    async def view(self, what: str, acks: dict[int, int], args: Mapping[str, Any]) -> Any:
        """``topology``, ``inventory``, ``session_states(participant)``, ``retained_sessions``
        or ``statistics`` of the instance with its named ``args``, once the stream
        acknowledgements ``acks`` are applied."""
        with self._track(what):
            if what not in _VIEWS:
                self._in_trio().soon(self._apply_acks, acks)
                raise ValueError(f"unknown view {what!r}")
            with crossing_boundary(self.name, what):
                return await self._in_trio().call(self._view, what, acks, args)

    async def _view(self, what: str, acks: dict[int, int], args: Mapping[str, Any]) -> Any:
        self._apply_acks(acks)
        await anyio.lowlevel.checkpoint()
        return getattr(self._sim, what)(**args)

    # -- data plane ------------------------------------------------------------------------------

    async def _open_run(
        self, sid: int, rows: Sequence[RunRow], shape: RunShape, trainer: str | None
    ) -> Outbox:
        term = None if trainer is None else TrainerTerm.parse(trainer)
        if shape.inject is not None:
            await self._inject(shape.inject, "run")
        stream = await self._sim.run(
            rows, refuse_all=shape.refuse_all, drop_after=shape.drop_after, trainer=term
        )
        return self._streams.open(sid, self._sim, stream)

    def _finish_run(self, sid: int, box: Outbox, completed: bool) -> None:
        # cancelled: the consumer is gone, nothing more is delivered (``Outboxes.finish``)
        self._streams.finish(sid, box, completed)

    async def run(
        self,
        sid: int,
        rows: Sequence[RunRow],
        shape: RunShape,
        per_row: bool,
        max_replies: int,
        trainer: str | None = None,
    ) -> AsyncIterator[ReplyBatch]:
        """Streaming generator: the admission header, then one ``ReplyBatch`` per object.
        ``trainer``: the caller's term (``TrainerTerm.header``), checked by the instance."""
        with self._track("run"):
            guest = self._in_trio()
            with crossing_boundary(self.name, "run"):
                box = await guest.call(self._open_run, sid, rows, shape, trainer)
            completed = False
            try:
                yield admission_header()
                while True:
                    cap = 1 if per_row else max_replies
                    replies: list[RunReply] | None = box.take_ready(cap)
                    if not replies:  # nothing ready: wait for the instance in the trio run
                        replies = await guest.call(box.take, cap)
                    if replies is None:
                        break
                    if per_row:
                        seqs = [box.register((r,)) for r in replies]
                        for seq, r in zip(seqs, replies, strict=True):
                            yield ReplyBatch(seq, (r,))
                    else:
                        yield ReplyBatch(box.register(replies), tuple(replies))
                completed = True
            finally:
                guest.soon(self._finish_run, sid, box, completed)

    async def ack(self, sid: int, upto: int) -> None:
        """The consumer asked for the batch after ``upto``."""
        self._in_trio().soon(self._apply_acks, {sid: upto})

    async def close_stream(self, sid: int, upto: int) -> None:
        """The consumer closed the stream having received every batch up to ``upto``."""
        self._in_trio().soon(self._close_stream, sid, upto)

    def _close_stream(self, sid: int, upto: int) -> None:
        self._streams.close(sid, upto)
