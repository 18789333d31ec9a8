"""DeadlineRegistry: pause-aware deadlines with named holders (S7), in virtual time."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from gymckpt.runtime import DeadlineExpired, DeadlineRegistry, DeadlineStatistics


async def test_deadline_expires_at_budget(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    start = trio.current_time()
    reg.register("row-1", "generate row 1", 5.0)
    assert reg.remaining("row-1") == 5.0
    await trio.sleep(3)
    assert reg.remaining("row-1") == 2.0
    assert reg.expired() == []
    await trio.sleep(2)
    assert trio.current_time() - start == 5.0
    assert reg.remaining("row-1") == 0.0
    [exc] = reg.expired()
    assert (exc.key, exc.what, exc.budget_s) == ("row-1", "generate row 1", 5.0)
    assert "row-1" in str(exc) and "generate row 1" in str(exc)


async def test_pause_stops_ticking(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    reg.register("row-1", "generate", 5.0)
    await trio.sleep(1)
    reg.pause("checkpoint")
    await trio.sleep(100)
    assert reg.remaining("row-1") == 4.0
    assert reg.expired() == []
    reg.register("row-2", "registered while paused", 2.0)
    await trio.sleep(10)
    assert reg.remaining("row-2") == 2.0
    reg.release("checkpoint")
    await trio.sleep(1)
    assert reg.remaining("row-1") == 3.0
    assert reg.remaining("row-2") == 1.0


async def test_two_holders_release_independently(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    reg.register("row-1", "generate", 5.0)
    reg.pause("checkpoint")
    reg.pause("refit")
    assert reg.holders == frozenset({"checkpoint", "refit"})
    await trio.sleep(10)
    reg.release("checkpoint")
    assert reg.paused
    assert reg.holders == frozenset({"refit"})
    await trio.sleep(10)
    assert reg.remaining("row-1") == 5.0
    reg.release("refit")
    assert not reg.paused
    await trio.sleep(4)
    assert reg.remaining("row-1") == 1.0


async def test_holder_misuse_errors() -> None:
    reg = DeadlineRegistry()
    reg.pause("checkpoint")
    with pytest.raises(RuntimeError, match="already paused by 'checkpoint'"):
        reg.pause("checkpoint")
    with pytest.raises(RuntimeError, match="not paused by 'refit'"):
        reg.release("refit")
    reg.release("checkpoint")
    with pytest.raises(RuntimeError, match="not paused by 'checkpoint'"):
        reg.release("checkpoint")


async def test_register_misuse_errors() -> None:
    reg = DeadlineRegistry()
    reg.register("k", "w", 1.0)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("k", "w", 1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        reg.register("j", "w", 0.0)
    with pytest.raises(KeyError, match="no deadline registered for 'nope'"):
        reg.remaining("nope")
    reg.discard("k")
    reg.discard("k")  # absent: no error
    assert "k" not in reg


async def test_paused_by_releases_on_error() -> None:
    reg = DeadlineRegistry()
    with pytest.raises(ZeroDivisionError), reg.paused_by("checkpoint"):
        assert reg.holders == frozenset({"checkpoint"})
        1 / 0  # noqa: B018
    assert not reg.paused


async def test_scope_cancels_body_and_names_key(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    start = trio.current_time()
    reached_end = False
    with pytest.raises(DeadlineExpired) as info, reg.scope("row-7", "tool call on gym-0", 3.0):
        await trio.sleep(10)
        reached_end = True
    assert not reached_end
    assert trio.current_time() - start == 3.0
    assert (info.value.key, info.value.what, info.value.budget_s) == (
        "row-7",
        "tool call on gym-0",
        3.0,
    )
    assert "row-7" not in reg
    assert reg.statistics().expired_total == 1


async def test_scope_finishing_in_time_discards_key(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    with reg.scope("row-1", "generate", 3.0):
        await trio.sleep(2)
        assert reg.remaining("row-1") == 1.0
    assert "row-1" not in reg
    assert reg.statistics().active == 0


async def test_scope_deadline_moves_with_pauses(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    start = trio.current_time()

    async def checkpoint_then_refit() -> None:
        await trio.sleep(1)
        reg.pause("checkpoint")
        await trio.sleep(4)
        reg.pause("refit")
        await trio.sleep(1)
        reg.release("checkpoint")  # refit still holds: nothing ticks
        await trio.sleep(2)
        reg.release("refit")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoint_then_refit)
        with pytest.raises(DeadlineExpired), reg.scope("row-1", "generate", 3.0):
            await trio.sleep_forever()
    # paused from t=1 to t=8: 3s of budget end at t=10
    assert trio.current_time() - start == 10.0


async def test_scope_deadline_is_inf_while_paused(autojump_clock: trio.testing.MockClock) -> None:
    reg = DeadlineRegistry()
    reg.pause("refit")
    with reg.scope("row-1", "generate", 1.0):
        await trio.sleep(50)
        reg.release("refit")
        await trio.sleep(0.5)
    assert reg.statistics().expired_total == 0


async def test_scope_duplicate_key_is_rejected_and_kept() -> None:
    reg = DeadlineRegistry()
    reg.register("row-1", "generate", 1.0)
    with pytest.raises(ValueError, match="already registered"), reg.scope("row-1", "x", 1.0):
        pass  # pragma: no cover
    assert "row-1" in reg


async def test_discarding_scoped_key_lifts_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reg = DeadlineRegistry()
    with reg.scope("row-1", "generate", 1.0):
        reg.discard("row-1")
        await trio.sleep(5)


async def test_expired_reports_what_and_counts_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reg = DeadlineRegistry()
    reg.register("a", "generate row a", 2.0)
    reg.register("b", "retire row b", 1.0)
    reg.register("c", "generate row c", 9.0)
    await trio.sleep(2)
    first = reg.expired()
    assert [(e.key, e.what) for e in first] == [("b", "retire row b"), ("a", "generate row a")]
    assert [(e.key, e.what) for e in reg.expired()] == [
        ("b", "retire row b"),
        ("a", "generate row a"),
    ]
    assert reg.statistics() == DeadlineStatistics(
        active=3, paused=False, holders=frozenset(), expired_total=2
    )


async def test_statistics_and_repr() -> None:
    reg = DeadlineRegistry()
    reg.register("a", "generate", 1.0)
    reg.pause("refit")
    reg.pause("checkpoint")
    assert reg.statistics() == DeadlineStatistics(
        active=1, paused=True, holders=frozenset({"refit", "checkpoint"}), expired_total=0
    )
    assert repr(reg) == (
        "<DeadlineRegistry active=1 paused=True holders=checkpoint,refit expired_total=0>"
    )
    assert not math.isinf(reg.remaining("a"))


async def test_a_pause_in_slices_lets_the_loop_run_and_is_the_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``pause_in_slices``/``release_in_slices`` (the checkpoint's pause: ~8k scopes at 1M in
    flight, one step of ~15 ms otherwise): other tasks run between slices of
    ``RETARGET_SLICE`` scopes, every scope is ``inf`` once the pause returns and none expires
    while paused, and after the release each expires at its budget plus the pause."""
    from gymckpt.runtime._deadlines import RETARGET_SLICE

    reg = DeadlineRegistry()
    n = 2 * RETARGET_SLICE + 7
    scopes: list[trio.CancelScope] = []
    expired: list[float] = []
    steps_between = 0
    start = trio.current_time()

    async def one(i: int) -> None:
        try:
            with reg.scope(f"row-{i}", "generate", 3.0 + i / n):
                scopes.append(reg._scoped[f"row-{i}"].scope)  # type: ignore[arg-type]
                await trio.sleep_forever()
        except DeadlineExpired:
            expired.append(trio.current_time() - start)

    other_scope = trio.CancelScope()

    async def other() -> None:  # busy: cancelled once the pause returned (autojump needs idle)
        nonlocal steps_between
        with other_scope:
            while True:
                await trio.lowlevel.checkpoint()
                steps_between += 1

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
        await trio.sleep(1)
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        before = steps_between
        await reg.pause_in_slices("checkpoint")
        assert steps_between > before  # three slices: the loop ran in between
        other_scope.cancel()
        assert all(s.deadline == math.inf for s in scopes) and len(scopes) == n
        await trio.sleep(10)
        assert expired == []
        await reg.release_in_slices("checkpoint")
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    # paused from t=1 to t=11: budgets 3 to 4 s end between t=13 and t=14
    assert len(expired) == n and min(expired) >= 13.0 and max(expired) <= 14.0
    with pytest.raises(RuntimeError, match="not paused by 'checkpoint'"):
        await reg.release_in_slices("checkpoint")
