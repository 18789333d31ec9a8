"""The invariants the simulation checks live (``checks``): each reports what differs, one
line per finding, and never raises; the livelock budget and the census of trio tasks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
import trio

from gymckpt.app.simulation.checks import (
    StepBudget,
    all_tasks,
    check_not_parked,
    check_restored_claims,
    check_restored_installs,
)
from gymckpt.gym_adapter import EmbeddedGym, GymStatistics, RunRow


@pytest.fixture
def found() -> list[str]:
    return []


def row(rid: str, restored_from: str | None) -> RunRow:
    return RunRow(rid, 0, 0, 1, restored_from=restored_from)


def test_restored_claims_once_each_on_their_replica(found: list[str]) -> None:
    replicas = {"1-0": "gym-0", "2-0": "gym-1"}
    claims = [
        ("gym-0", row("1-0-a1", "1-0")),
        ("gym-1", row("2-0-a1", "2-0")),
        ("gym-1", row("3-0", None)),
    ]
    seen = check_restored_claims(found.append, claims, replicas, refused=False)
    assert found == [] and seen == {"1-0": 1, "2-0": 1}


def test_restored_claims_twice_elsewhere_or_unknown_are_named(found: list[str]) -> None:
    replicas = {"1-0": "gym-0"}
    claims = [
        ("gym-0", row("1-0-a1", "1-0")),
        ("gym-1", row("1-0-a1", "1-0")),
        ("gym-0", row("9-0-a1", "9-0")),
    ]
    check_restored_claims(found.append, claims, replicas, refused=False)
    assert found == [
        "restored episode 1-0 dispatched 2 times",
        "1-0-a1 dispatched to gym-1, but 1-0 was restored on gym-0",
        "9-0-a1 claims 9-0, which was not restored",
    ]
    found.clear()
    check_restored_claims(found.append, claims[:2], replicas, refused=True)  # re-sent (S2)
    assert found == ["1-0-a1 dispatched to gym-1, but 1-0 was restored on gym-0"]


def gym_stats(claimed: int, restored: tuple[int, ...], replaced: int = 0) -> GymStatistics:
    hosts = [
        SimpleNamespace(instance=f"gym-{i}", restored=n, episodes_claimed=0)
        for i, n in enumerate(restored)
    ]
    hosts[0].episodes_claimed = claimed
    return cast(
        GymStatistics,
        SimpleNamespace(replaced=tuple(hosts[:replaced]), instances=tuple(hosts[replaced:])),
    )


def test_restored_installs_add_up(found: list[str]) -> None:
    kw = dict(journal_stopped=False, replaced_at_open=0, installed_before={})
    check_restored_installs(
        found.append, gym_stats(2, (2, 1)), claimed_restored=2, restored=3, **kw
    )  # type: ignore[arg-type]
    assert found == []
    check_restored_installs(
        found.append, gym_stats(3, (2, 2)), claimed_restored=2, restored=3, **kw
    )  # type: ignore[arg-type]
    assert found == [
        "Gym continued 3 restored episodes, the runtime claimed 2 (each restored episode "
        "continues once)",
        "Gym installed 4 restored episodes, the ledger holds 3 unclaimed",
    ]


def test_installs_of_a_rolled_back_restore_and_of_hosts_replaced_before_open_do_not_count(
    found: list[str],
) -> None:
    gs = gym_stats(1, (5, 2, 1), replaced=1)  # gym-0 generation 0 replaced before the open
    check_restored_installs(
        found.append,
        gs,
        claimed_restored=1,
        restored=2,
        journal_stopped=False,
        replaced_at_open=1,
        installed_before={("gym-1", 0): 1},
    )
    assert found == []


def test_fewer_continued_than_claimed_only_after_a_journal_fault(found: list[str]) -> None:
    gs = gym_stats(1, (2,))
    check_restored_installs(
        found.append,
        gs,
        claimed_restored=2,
        restored=2,
        journal_stopped=True,
        replaced_at_open=0,
        installed_before={},
    )
    assert found == []
    check_restored_installs(
        found.append,
        gs,
        claimed_restored=2,
        restored=2,
        journal_stopped=False,
        replaced_at_open=0,
        installed_before={},
    )
    assert len(found) == 1 and found[0].startswith("Gym continued 1")


def test_a_parked_instance_past_its_lease_is_named(found: list[str]) -> None:
    def sim(dead: bool, prepared: bool, admission_open: bool) -> SimpleNamespace:
        inv = SimpleNamespace(prepared=prepared, admission_open=admission_open, lease_reopened=2)
        return SimpleNamespace(dead=dead, inventory=lambda: inv)

    sims = {
        "gym-0": sim(False, False, True),
        "gym-1": sim(False, True, True),
        "gym-2": sim(True, True, False),
    }
    gym = cast(EmbeddedGym, SimpleNamespace(instances=list(sims), sim=sims.__getitem__))
    assert check_not_parked(found.append, gym, 30.0) == 4  # the dead one is not asked
    assert found == ["gym-1 still parked 31s after the last checkpoint"]


async def test_the_step_budget_cancels_a_livelock_once() -> None:
    with trio.CancelScope() as scope:
        budget = StepBudget(50, scope)
        trio.lowlevel.add_instrument(budget)
        try:
            while True:
                await trio.lowlevel.checkpoint()  # zero time, forever
        finally:
            trio.lowlevel.remove_instrument(budget)
    assert scope.cancelled_caught and budget.exceeded and 50 < budget.steps < 60


async def test_the_task_census_sees_a_task_left_behind() -> None:
    before = all_tasks()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever, name="left behind")
        await trio.testing.wait_all_tasks_blocked()
        assert [t.name for t in all_tasks() - before] == ["left behind"]
        nursery.cancel_scope.cancel()
    assert all_tasks() == before
