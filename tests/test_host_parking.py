"""The host's parking (``gym_adapter.host._parking``): a prepare closes admission and parks every
moving episode at its next step boundary; a reopen restarts them in chunks; the lease reopens a
prepared instance by itself, for its own generation only.

Each test drives a ``Parking`` directly under trio's autojump clock; episodes are bare records
and "restarting" one only records it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter.host._episode import EpisodeFenced, EpisodeInfo
from gymckpt.gym_adapter.host._episodes import BOUNDARY, MOVING, Episode
from gymckpt.gym_adapter.host._parking import RESUME_CHUNK, Parking

LEASE_S = 10.0


def episode(n: int) -> Episode:
    return Episode(EpisodeInfo(f"r{n}", n, 0, 0, 0, "gym-0"), {}, MOVING)


def never_fenced(ep: Episode) -> bool:
    return False


@asynccontextmanager
async def serving(restarted: list[Episode]) -> AsyncIterator[Parking]:
    parking = Parking(LEASE_S, freeze_survivors=False)
    async with trio.open_nursery() as nursery:
        parking.open(nursery.start_soon, restarted.append)
        yield parking
        parking.close()
        parking.release_all()
        nursery.cancel_scope.cancel()


def moving(parking: Parking, n: int) -> Episode:
    ep = episode(n)
    parking.started()
    return ep


async def test_a_moving_episode_passes_a_boundary_until_a_prepare_parks_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        assert await parking.boundary(ep, never_fenced) is True
        assert parking.admission_open and parking.moving == 1
        gen = parking.prepare("ckpt-1")
        assert not parking.admission_open and parking.prepared and gen == 1
        assert await parking.boundary(ep, never_fenced) is False
        assert ep.state == BOUNDARY and parking.moving == 0
        assert await parking.wait_parked(gen, trio.current_time() + 1.0) is True


async def test_a_second_prepare_keeps_the_generation_and_a_reopen_then_prepare_starts_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        assert parking.prepare("ckpt-1") == 1
        assert parking.prepare("ckpt-2") == 1 and parking.checkpoint_id == "ckpt-2"
        parking.reopen()
        assert parking.admission_open and not parking.prepared
        assert parking.checkpoint_id is None
        assert parking.prepare("ckpt-3") == 2


async def test_waiting_for_parking_ends_at_the_deadline_or_when_the_last_episode_parks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        gen = parking.prepare("ckpt-1")
        start = trio.current_time()
        assert await parking.wait_parked(gen, start + 2.0) is False  # it never reached one
        assert trio.current_time() == start + 2.0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(parking.boundary, ep, never_fenced)
            assert await parking.wait_parked(gen, trio.current_time() + 2.0) is True
        assert trio.current_time() == start + 2.0  # parked at once, no time passed


async def test_an_ending_moving_episode_counts_as_parked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        moving(parking, 0)
        gen = parking.prepare("ckpt-1")
        parking.ended(MOVING)
        assert parking.moving == 0
        assert await parking.wait_parked(gen, trio.current_time() + 1.0) is True
        parking.ended(BOUNDARY)  # a parked one ending changes no count
        assert parking.moving == 0


async def test_a_reopen_restarts_the_parked_in_chunks_and_a_new_prepare_keeps_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    restarted: list[Episode] = []
    async with serving(restarted) as parking:
        eps = [moving(parking, n) for n in range(2 * RESUME_CHUNK + 1)]
        parking.prepare("ckpt-1")
        for ep in eps:
            assert await parking.boundary(ep, never_fenced) is False
        parking.reopen()
        await trio.testing.wait_all_tasks_blocked()
        assert restarted == eps  # every one, in the order they parked


async def test_a_prepare_during_the_restart_keeps_the_chunks_not_started_yet_parked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    restarted: list[Episode] = []
    every: list[Episode] = []

    def restart(ep: Episode) -> None:
        restarted.append(ep)
        every.append(ep)
        if len(every) == RESUME_CHUNK:  # the first chunk is out: a checkpoint comes
            parking.prepare("ckpt-2")

    parking = Parking(LEASE_S, freeze_survivors=False)
    async with trio.open_nursery() as nursery:
        parking.open(nursery.start_soon, restart)
        eps = [moving(parking, n) for n in range(2 * RESUME_CHUNK + 1)]
        parking.prepare("ckpt-1")
        for ep in eps:
            assert await parking.boundary(ep, never_fenced) is False
        parking.reopen()
        await trio.testing.wait_all_tasks_blocked()
        assert restarted == eps[:RESUME_CHUNK]  # the rest stayed parked
        for ep in restarted:  # the started ones park again as their tasks run
            assert await parking.boundary(ep, never_fenced) is False
        restarted.clear()
        parking.reopen()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(restarted, key=lambda ep: ep.info.row) == eps
        assert len(restarted) == len(eps)
        nursery.cancel_scope.cancel()


async def test_a_restarted_episode_moves_again_or_parks_again_if_prepared_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        parking.prepare("ckpt-1")
        await parking.boundary(ep, never_fenced)
        parking.reopen()
        assert await parking.boundary(ep, never_fenced) is True
        assert ep.state == MOVING and parking.moving == 1
        parking.prepare("ckpt-2")
        await parking.boundary(ep, never_fenced)
        parking.reopen()
        parking.prepare("ckpt-3")  # before the restarted task ran
        assert await parking.boundary(ep, never_fenced) is False
        assert ep.state == BOUNDARY and parking.moving == 0


async def test_a_fenced_episode_raises_at_its_boundary(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        with pytest.raises(EpisodeFenced):
            await parking.boundary(ep, lambda _: True)
        assert parking.moving == 1  # its caller ends it (``ended``)


async def test_a_held_episode_waits_at_its_boundary_until_a_prepare(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        ep.hold = True
        result: list[bool] = []

        async def step() -> None:
            result.append(await parking.boundary(ep, never_fenced))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(step)
            await trio.sleep(100.0)
            assert result == [] and ep.state == BOUNDARY and parking.moving == 0
            parking.prepare("ckpt-1")
        assert result == [False] and not ep.hold


async def test_the_lease_reopens_its_own_generation_once_and_never_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    expired: list[float] = []

    def reopen() -> None:
        expired.append(trio.current_time())
        parking.reopen()

    async with serving([]) as parking:
        start = trio.current_time()
        parking.prepare("ckpt-1")
        parking.arm_lease(reopen)
        await trio.sleep(LEASE_S / 2)
        parking.arm_lease(reopen)  # a commit re-arms it: the lease counts from there
        await trio.sleep(LEASE_S * 0.75)
        assert expired == []
        await trio.sleep(LEASE_S)
        assert expired == [start + LEASE_S * 1.5] and parking.admission_open
        parking.prepare("ckpt-2")
        parking.arm_lease(reopen)
        parking.reopen()  # resumed in time: its lease never fires
        await trio.sleep(2 * LEASE_S)
        assert len(expired) == 1


async def test_a_closed_parking_arms_no_lease_and_restarts_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    restarted: list[Episode] = []
    async with serving(restarted) as parking:
        ep = moving(parking, 0)
        gen = parking.prepare("ckpt-1")
        await parking.boundary(ep, never_fenced)
        parking.close()
        assert not parking.admission_open
        parking.arm_lease(lambda: restarted.append(ep))
        parking.release_all()
        parking.reopen()
        await trio.sleep(2 * LEASE_S)
        assert restarted == []
        assert await parking.wait_parked(gen, trio.current_time() + 1.0) is True


async def test_parking_says_where_it_is_in_its_repr(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        assert repr(parking) == (
            "<Parking open checkpoint=None generation=0 moving=1 parked=0 lease=False>"
        )
        parking.prepare("ckpt-1")
        parking.arm_lease(lambda: None)
        await parking.boundary(ep, never_fenced)
        assert repr(parking) == (
            "<Parking prepared checkpoint=ckpt-1 generation=1 moving=0 parked=1 lease=True>"
        )


# -- an unaligned prepare (park=False) ---------------------------------------------------------


async def test_an_unaligned_prepare_parks_nothing_and_waits_for_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        gen = parking.prepare("ckpt-1", park=False)
        assert parking.prepared and not parking.parks and not parking.admission_open
        start = trio.current_time()
        assert await parking.wait_parked(gen, start + 5.0) is True  # one moves: no wait
        assert trio.current_time() == start
        assert await parking.boundary(ep, never_fenced) is True  # passes its boundary on
        assert ep.state == MOVING and parking.moving == 1
        assert "parked=0" in repr(parking)


async def test_an_unaligned_prepare_lets_a_held_episode_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        ep = moving(parking, 0)
        ep.hold = True
        result: list[bool] = []

        async def step() -> None:
            result.append(await parking.boundary(ep, never_fenced))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(step)
            await trio.sleep(100.0)
            assert result == [] and ep.state == BOUNDARY and parking.moving == 0
            parking.prepare("ckpt-1", park=False)
        assert result == [True] and not ep.hold
        assert ep.state == MOVING and parking.moving == 1
        ep.hold = True  # held while an unaligned checkpoint is open: not even a pause
        assert await parking.boundary(ep, never_fenced) is True
        assert ep.state == MOVING and parking.moving == 1 and not ep.hold


async def test_a_later_prepare_keeps_the_mode_of_the_open_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving([]) as parking:
        parking.prepare("ckpt-1")
        assert parking.prepare("ckpt-1", park=False) == 1 and parking.parks  # still parks
        parking.reopen()
        parking.prepare("ckpt-2", park=False)
        assert not parking.parks
        parking.reopen()
        parking.prepare("ckpt-3")  # a new checkpoint takes its own mode
        assert parking.parks


async def test_an_unaligned_prepare_during_a_restart_lets_every_parked_episode_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    restarted: list[Episode] = []
    async with serving(restarted) as parking:
        eps = [moving(parking, n) for n in range(2 * RESUME_CHUNK + 1)]
        parking.prepare("ckpt-1")  # aligned: every one parks
        for ep in eps:
            assert await parking.boundary(ep, never_fenced) is False
        parking.reopen()
        parking.prepare("ckpt-2", park=False)  # before the restart ran: it parks nothing
        await trio.testing.wait_all_tasks_blocked()
        assert restarted == eps
        for ep in eps:  # each restarted task moves on, though a checkpoint is open
            assert await parking.boundary(ep, never_fenced) is True
        assert parking.moving == len(eps) and "parked=0" in repr(parking)
