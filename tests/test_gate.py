"""DispatchGate: admission, closing waits for admissions, gate IDs, cancelled waiters."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from gymckpt.runtime import DispatchGate


async def test_admit_yields_gate_id_and_reopen_changes_it() -> None:
    gate = DispatchGate()
    async with gate.admit() as gid:
        assert gid == 1
    await gate.close("ckpt")
    assert not gate.is_open
    assert await gate.reopen() == 2
    async with gate.admit() as gid:
        assert gid == 2
    assert await gate.reopen() == 2  # idempotent while open


async def test_close_waits_for_admission_in_progress() -> None:
    gate = DispatchGate()
    events: list[str] = []
    inside = trio.Event()
    submit = trio.Event()

    async def admission() -> None:
        async with gate.admit():
            inside.set()
            await submit.wait()  # the caller submits to Gym here
            events.append("dispatched")

    async def closer() -> None:
        await gate.close("ckpt")
        events.append("closed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(admission)
        await inside.wait()
        nursery.start_soon(closer)
        await trio.testing.wait_all_tasks_blocked()
        assert events == [] and gate.statistics().admitting == 1
        submit.set()
    assert events == ["dispatched", "closed"]


async def test_waiters_park_while_closed_and_run_after_reopen() -> None:
    gate = DispatchGate()
    await gate.close("ckpt")
    admitted: list[int] = []

    async def waiter() -> None:
        async with gate.admit() as gid:
            admitted.append(gid)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == [] and gate.statistics().waiting == 3
        await gate.reopen()
    assert admitted == [2, 2, 2]
    assert gate.statistics().waiting == 0


async def test_cancelled_gate_waiter_leaves_nothing_behind() -> None:
    gate = DispatchGate()
    await gate.close("ckpt")
    body_ran = False

    async def waiter() -> None:
        nonlocal body_ran
        async with gate.admit():
            body_ran = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics().waiting == 1
        nursery.cancel_scope.cancel()
    stats = gate.statistics()
    assert (stats.waiting, stats.admitting, body_ran) == (0, 0, False)
    # the condition's lock is free: close/reopen and admission work at once
    await gate.reopen()
    async with gate.admit() as gid:
        assert gid == 2


async def test_double_close_is_misuse() -> None:
    gate = DispatchGate()
    await gate.close("a")
    with pytest.raises(RuntimeError, match="already closed by 'a'"):
        await gate.close("b")


async def test_admissions_do_not_wait_for_each_other() -> None:
    gate = DispatchGate()
    slow_inside, release_slow = trio.Event(), trio.Event()
    order: list[str] = []

    async def slow() -> None:
        async with gate.admit():
            slow_inside.set()
            await release_slow.wait()  # a submission to a slow instance
            order.append("slow")

    async def fast() -> None:
        async with gate.admit():
            order.append("fast")

    async def closer() -> None:
        await gate.close("ckpt")
        order.append("closed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await slow_inside.wait()
        nursery.start_soon(fast)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["fast"] and gate.statistics().admitting == 1
        nursery.start_soon(closer)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["fast"]  # the close waits for the slow admission still in progress
        release_slow.set()
    assert order == ["fast", "slow", "closed"]


async def test_an_open_gate_admits_without_its_lock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Passing an open gate never queues for the condition's lock (held here by someone else,
    as a reopen holds it briefly): submissions do not wait for each other on it. A closed gate
    is waited at under the lock, and a close still waits for the lock-free admissions."""
    gate = DispatchGate()
    order: list[str] = []
    inside, release = trio.Event(), trio.Event()

    async def admission(name: str) -> None:
        async with gate.admit() as gid:
            order.append(f"{name}@{gid}")
            inside.set()
            await release.wait()

    async with trio.open_nursery() as nursery:
        async with gate._cond:  # the lock is held: an open gate still admits
            nursery.start_soon(admission, "a")
            with trio.fail_after(1):  # queued for the lock, it would never get in
                await inside.wait()
            assert order == ["a@1"] and gate.statistics().admitting == 1
        closing = trio.Event()

        async def closer() -> None:
            await gate.close("ckpt")
            order.append("closed")
            closing.set()

        nursery.start_soon(closer)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["a@1"] and not gate.is_open  # closed, waiting for "a" to finish
        nursery.start_soon(admission, "b")  # a closed gate: "b" waits (for the lock, then at it)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["a@1"]
        release.set()
        await closing.wait()
        assert order == ["a@1", "closed"]
        assert await gate.reopen() == 2
    assert order == ["a@1", "closed", "b@2"]


async def test_a_close_cancelled_while_admissions_finish_reopens_the_gate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = DispatchGate()
    inside, release = trio.Event(), trio.Event()

    async def admission() -> None:
        async with gate.admit():
            inside.set()
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(admission)
        await inside.wait()
        with trio.move_on_after(1) as scope:
            await gate.close("ckpt")
        assert scope.cancelled_caught
        assert gate.is_open and gate.gate_id == 1 and gate.statistics().closed_by is None
        release.set()
    async with gate.admit() as gid:
        assert gid == 1
