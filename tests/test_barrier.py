"""MutationBarrier: holds, queued mutations, selective wakeups, cancellation."""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from gymckpt.runtime import ANY, MutationBarrier


async def test_mutation_runs_and_counts() -> None:
    barrier = MutationBarrier()
    box: list[int] = []
    assert await barrier.mutate(lambda: box.append(1) or 7) == 7
    assert barrier.mutate_nowait(lambda: len(box)) == 1
    assert barrier.statistics().mutations == 2


async def test_in_mutation_flag_only_inside_fn() -> None:
    barrier = MutationBarrier()
    seen: list[bool] = []
    barrier.mutate_nowait(lambda: seen.append(barrier.in_mutation))
    assert seen == [True]
    assert not barrier.in_mutation


async def test_mutations_do_not_nest() -> None:
    barrier = MutationBarrier()
    with pytest.raises(RuntimeError, match="do not nest"):
        barrier.mutate_nowait(lambda: barrier.mutate_nowait(lambda: None))
    assert not barrier.in_mutation


async def test_hold_queues_mutations_in_order_undisturbed() -> None:
    barrier = MutationBarrier()
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        async with barrier.hold("checkpoint"):
            with pytest.raises(trio.WouldBlock):
                barrier.mutate_nowait(lambda: None)
            for name in "abc":
                nursery.start_soon(barrier.mutate, lambda n=name: order.append(n))
                await trio.testing.wait_all_tasks_blocked()
            assert order == []
            assert barrier.statistics().queued_mutations == 3
            assert barrier.holder == "checkpoint"
        # released: queued mutations run in FIFO order
    assert order == ["a", "b", "c"]
    assert barrier.statistics().held is False


async def test_second_holder_waits_for_first() -> None:
    barrier = MutationBarrier()
    order: list[str] = []

    async def second() -> None:
        async with barrier.hold("second"):
            order.append("second")

    async with trio.open_nursery() as nursery:
        async with barrier.hold("first"):
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            order.append("first")
    assert order == ["first", "second"]


async def test_wait_until_returns_at_once_when_true() -> None:
    barrier = MutationBarrier()
    await barrier.wait_until(lambda: True, keys=["x"])
    assert barrier.statistics().waiters == 0


async def test_waiter_woken_on_its_key_only() -> None:
    barrier = MutationBarrier()
    state = {"x": 0, "y": 0}
    calls = {"n": 0}

    def pred() -> bool:
        calls["n"] += 1
        return state["x"] >= 2

    done = trio.Event()

    async def waiter() -> None:
        await barrier.wait_until(pred, keys=["x"])
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert calls["n"] == 1
        # mutations that do not touch "x" never evaluate the predicate
        for _ in range(100):
            await barrier.mutate(lambda: state.__setitem__("y", state["y"] + 1), touched=["y"])
        assert calls["n"] == 1
        await barrier.mutate(lambda: state.__setitem__("x", 1), touched=["x"])
        assert calls["n"] == 2 and not done.is_set()
        await barrier.mutate(lambda: state.__setitem__("x", 2), touched=["x"])
        await done.wait()
    assert calls["n"] == 3
    assert barrier.statistics().waiters == 0


async def test_any_waiter_sees_every_mutation() -> None:
    barrier = MutationBarrier()
    counter = {"n": 0}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(barrier.wait_until, lambda: counter["n"] == 3, [ANY])
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            await barrier.mutate(lambda: counter.__setitem__("n", counter["n"] + 1))
    assert counter["n"] == 3


async def test_cancelled_waiter_predicate_not_evaluated_again() -> None:
    # trio-util's test_predicate_eval_scope, for our barrier
    barrier = MutationBarrier()
    calls = {"n": 0}

    def pred() -> bool:
        calls["n"] += 1
        return False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(barrier.wait_until, pred, ["k"])
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert calls["n"] == 1
    await barrier.mutate(lambda: None, touched=["k"])
    assert calls["n"] == 1
    assert barrier.statistics().waiters == 0


async def test_cancelled_queued_mutation_never_runs() -> None:
    barrier = MutationBarrier()
    ran: list[int] = []
    async with barrier.hold("ckpt"):
        with trio.move_on_after(1) as scope:  # autojump is not on; cancel explicitly
            scope.cancel()
            await barrier.mutate(lambda: ran.append(1))
    assert ran == []
    assert barrier.statistics().queued_mutations == 0


async def test_queued_mutation_error_reaches_its_caller_only() -> None:
    barrier = MutationBarrier()
    order: list[int] = []
    errors: list[str] = []

    def boom() -> None:
        raise ValueError("bad change")

    async def failing() -> None:
        try:
            await barrier.mutate(boom)
        except ValueError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        async with barrier.hold("ckpt"):
            for i in range(20):
                if i == 7:
                    nursery.start_soon(failing)
                    await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(barrier.mutate, lambda i=i: order.append(i))
                await trio.testing.wait_all_tasks_blocked()  # queue in a known order
            assert barrier.statistics().queued_mutations == 21
    assert order == list(range(20)) and errors == ["bad change"]


async def test_wait_settled_checks_only_touched_keys_and_wakes_once() -> None:
    barrier = MutationBarrier()
    landed: set[str] = set()
    checked: list[str] = []

    def settled(key: object) -> bool:
        checked.append(str(key))
        return key in landed

    keys = [f"k{i}" for i in range(100)]
    done = trio.Event()

    async def drain() -> None:
        await barrier.wait_settled(set(keys), settled)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        assert len(checked) == 100  # once each on entry
        checked.clear()
        for i in range(1000):  # unrelated traffic costs the waiter nothing
            await barrier.mutate(lambda: None, touched=[f"other{i}"])
        assert checked == []
        for key in keys:
            await barrier.mutate(lambda k=key: landed.add(k), touched=[key])
        await done.wait()
    assert checked == keys  # one check per landed key, nothing re-evaluated
    assert barrier.statistics().waiters == 0


async def test_cancelled_wait_settled_unregisters_everything() -> None:
    barrier = MutationBarrier()
    with trio.move_on_after(0) as scope:
        scope.cancel()
        await barrier.wait_settled({"a", "b"}, lambda k: False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(barrier.wait_settled, {"a", "b"}, lambda k: False)
        await trio.testing.wait_all_tasks_blocked()
        assert barrier.statistics().waiters == 1
        nursery.cancel_scope.cancel()
    assert barrier.statistics().waiters == 0
    assert barrier._settle == {}


async def test_wait_settled_empties_the_callers_set_and_a_cancel_leaves_the_unsettled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    barrier = MutationBarrier()
    landed: set[str] = set()
    keys = {"a", "b", "c"}
    with trio.move_on_after(4):
        async with trio.open_nursery() as nursery:

            async def land_a() -> None:
                await trio.sleep(1)
                await barrier.mutate(lambda: landed.add("a"), touched=["a"])

            nursery.start_soon(land_a)
            await barrier.wait_settled(keys, lambda k: k in landed)
    assert (trio.current_time(), keys) == (4.0, {"b", "c"})
    assert barrier.statistics().waiters == 0 and barrier._settle == {}
    with pytest.raises(TypeError, match="set of keys"):
        await barrier.wait_settled(["x"], lambda k: True)  # type: ignore[arg-type]
    done = {"x", "y"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(barrier.wait_settled, done, lambda k: k in landed)
        await trio.testing.wait_all_tasks_blocked()
        for key in ("x", "y"):
            await barrier.mutate(lambda k=key: landed.add(k), touched=[key])
    assert done == set()


async def test_cancelled_wait_settled_is_not_woken_by_a_later_mutation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its task is parked directly: a cancelled wait must never be rescheduled again."""
    barrier = MutationBarrier()
    landed: set[str] = set()
    keys = {"a"}
    with trio.move_on_after(1):
        await barrier.wait_settled(keys, lambda k: k in landed)
    await barrier.mutate(lambda: landed.add("a"), touched=["a"])
    await trio.sleep(5)
    assert trio.current_time() == 6.0 and keys == {"a"}


async def test_wait_settled_waiters_sharing_keys_each_wake_on_their_own_last_key() -> None:
    barrier = MutationBarrier()
    landed: set[str] = set()
    woke: list[str] = []

    async def waiter(name: str, keys: set[str]) -> None:
        await barrier.wait_settled(keys, lambda k: k in landed)
        woke.append(name)

    async def land(key: str) -> None:
        await barrier.mutate(lambda: landed.add(key), touched=[key])
        await trio.testing.wait_all_tasks_blocked()

    cancelled = trio.CancelScope()

    async def cancelled_waiter() -> None:
        with cancelled:
            await waiter("b", {"b"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "ab", {"a", "b"})
        nursery.start_soon(cancelled_waiter)
        nursery.start_soon(waiter, "bc", {"b", "c"})
        await trio.testing.wait_all_tasks_blocked()
        assert barrier.statistics().waiters == 3
        cancelled.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert barrier.statistics().waiters == 2
        await land("b")
        assert woke == []
        await land("c")
        assert woke == ["bc"]
        await land("a")
    assert woke == ["bc", "ab"] and barrier._settle == {}


async def test_a_drain_sized_wait_adds_no_tracked_object_per_key() -> None:
    """The drain parks on every pending rollout ID: a full collection must not walk an object
    per ID (at 200k pending, that would be 200k of them)."""
    barrier = MutationBarrier()
    keys = {f"{r}-0" for r in range(20_000)}
    gc.collect()
    before = len(gc.get_objects())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(barrier.wait_settled, keys, lambda k: False)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        added = len(gc.get_objects()) - before
        assert barrier.statistics().waiters == 1
        nursery.cancel_scope.cancel()
    assert added < 200, added
    assert barrier._settle == {}
