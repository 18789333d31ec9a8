"""DispatchGate: admission to Gym, a ``trio.Condition`` (S1).

An attempt becomes DISPATCHED *inside* ``admit()``, in the same ledger mutation as its
submission to Gym — never before it waited here. ``close()`` shuts the gate under the
condition's lock and then returns only after every admission in progress has finished; from
then on a checkpoint counts only attempts that really reached Gym. Each ``reopen()`` starts a
new gate ID, which the ledger records per attempt so a streamed completion can be matched to the
admission it came from.

Admissions do not exclude each other: the lock is taken only to wait at a closed gate (and to
close or reopen it), never to pass an open one and never across the body, so a submission to one
Gym instance never waits for a slow submission to another, nor queues behind it for the lock.
The gate ID cannot change under an admission in progress, because a
reopen needs a close first, and a close waits for every admission to finish.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import final

import attrs
import trio

__all__ = ["DispatchGate", "GateStatistics"]


@attrs.frozen
class GateStatistics:
    """A read-only view of the gate."""

    open: bool
    gate_id: int
    admitting: int
    waiting: int
    closed_by: str | None


@final
@attrs.define(eq=False, slots=True)
class DispatchGate:
    """Admission open/closed, a gate ID per opening, and admissions that closing waits for."""

    _cond: trio.Condition = attrs.field(factory=trio.Condition, init=False)
    _open: bool = attrs.field(default=True, init=False)
    _gate_id: int = attrs.field(default=1, init=False)
    _admitting: int = attrs.field(default=0, init=False)
    _waiting: int = attrs.field(default=0, init=False)
    _closed_by: str | None = attrs.field(default=None, init=False)
    _idle: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def gate_id(self) -> int:
        """The ID of the current (or, while closed, the last) opening."""
        return self._gate_id

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[int]:
        """Wait for admission, then hold it while the body submits; yields the gate ID.

        The body should submit to Gym and mark the attempts DISPATCHED before it exits; a
        checkpoint's ``close`` waits for it, so keep it bounded. Other admissions run meanwhile.
        A waiter cancelled while the gate is closed leaves nothing behind (the condition
        re-acquires its lock, then ``Cancelled`` unwinds).

        An open gate admits without taking the condition's lock: after one checkpoint, the
        check and the count of the admission are one synchronous step, so a ``close`` either
        sees this admission in progress (and waits for it) or has already closed the gate
        (and this call waits at it under the lock, as before). Submissions to different
        instances never queue for the lock behind one another.
        """
        await trio.lowlevel.checkpoint()
        if self._open:
            self._admitting += 1
            gate_id = self._gate_id
        else:
            gate_id = await self._wait_open()
        try:
            yield gate_id
        finally:
            self._admitting -= 1
            if not self._admitting:
                self._idle.unpark_all()

    async def _wait_open(self) -> int:
        """The slow path of ``admit``: wait under the lock until the gate is open, then count
        the admission; returns the gate ID."""
        async with self._cond:
            self._waiting += 1
            try:
                while not self._open:
                    await self._cond.wait()
            finally:
                self._waiting -= 1
            self._admitting += 1
            return self._gate_id

    async def close(self, by: str) -> None:
        """Close admission; returns once no admission is in progress.

        Cancelled while it waits for admissions in progress, it reopens the gate (same gate ID:
        nothing was counted under the close), so a caller that never got the close owes no
        reopen.
        """
        async with self._cond:
            if not self._open:
                raise RuntimeError(f"gate already closed by {self._closed_by!r}")
            self._open = False
            self._closed_by = by
            try:
                while self._admitting:
                    await self._idle.park()
            except BaseException:
                self._open = True
                self._closed_by = None
                self._cond.notify_all()
                raise

    async def reopen(self) -> int:
        """Reopen admission under a new gate ID and wake every waiter; returns the new ID.

        Idempotent when already open (returns the current ID). Callers in ``finally`` blocks
        shield it: it only waits for the lock, which admissions hold briefly.
        """
        async with self._cond:
            if not self._open:
                self._open = True
                self._closed_by = None
                self._gate_id += 1
                self._cond.notify_all()
            return self._gate_id

    def statistics(self) -> GateStatistics:
        return GateStatistics(
            open=self._open,
            gate_id=self._gate_id,
            admitting=self._admitting,
            waiting=self._waiting,
            closed_by=self._closed_by,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<DispatchGate open={s.open} gate_id={s.gate_id} waiting={s.waiting}>"
