"""The simulation's deterministic scheduling (``determinism``): switched on only for a trio it
was written for, put back as it was, refused clearly otherwise."""

from __future__ import annotations

import importlib
import random

import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.app.simulation import determinism
from gymckpt.app.simulation.determinism import (
    TRIO_VERSIONS,
    SchedulingHookUnavailable,
    check_scheduling_hook,
    deterministic_scheduling,
)
from gymckpt.app.simulation.main import main_simulate

RUN = importlib.import_module("trio._core._run")


def test_the_installed_trio_is_one_the_hook_was_written_for() -> None:
    assert check_scheduling_hook() is RUN
    (lo_major, lo_minor), (hi_major, hi_minor) = TRIO_VERSIONS
    assert check_scheduling_hook(f"{lo_major}.{lo_minor}.0") is RUN
    assert check_scheduling_hook(f"{hi_major}.{hi_minor - 1}.9+dev") is RUN


@pytest.mark.parametrize("version", ["0.26.2", "0.36.0", "1.0.0", "nightly"])
def test_a_trio_outside_the_range_is_refused_naming_both(version: str) -> None:
    with pytest.raises(SchedulingHookUnavailable) as info:
        check_scheduling_hook(version)
    assert f"trio {version} is installed" in str(info.value)
    assert "written for trio >=0.27,<0.36" in str(info.value)


@pytest.mark.parametrize("was", [False, True])  # True: Hypothesis's plugin flipped it
def test_the_switch_is_on_inside_and_put_back_after(
    monkeypatch: pytest.MonkeyPatch, was: bool
) -> None:
    monkeypatch.setattr(RUN, "_ALLOW_DETERMINISTIC_SCHEDULING", was)
    state = RUN._r.getstate()
    with deterministic_scheduling(7):
        assert RUN._ALLOW_DETERMINISTIC_SCHEDULING is True
        assert RUN._r.random() == random.Random(7).random()  # seeded with the seed
    assert RUN._ALLOW_DETERMINISTIC_SCHEDULING is was
    assert RUN._r.getstate() == state


def _order(seed: int) -> list[int]:
    """The order in which ten tasks woken together run, under the hook."""
    ran: list[int] = []

    async def main() -> None:
        go = trio.Event()

        async def task(i: int) -> None:
            await go.wait()
            ran.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(task, i)
            await trio.testing.wait_all_tasks_blocked()
            go.set()

    with deterministic_scheduling(seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return ran


def test_a_seed_fixes_the_schedule() -> None:
    assert _order(3) == _order(3)
    assert len({tuple(_order(seed)) for seed in range(5)}) > 1


def test_a_missing_switch_is_refused_and_nothing_is_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(RUN, "_ALLOW_DETERMINISTIC_SCHEDULING")
    state = RUN._r.getstate()
    with pytest.raises(SchedulingHookUnavailable, match="_ALLOW_DETERMINISTIC_SCHEDULING NoneType"):
        with deterministic_scheduling(1):
            pytest.fail("entered without the switch")
    assert RUN._r.getstate() == state


def test_a_random_of_another_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RUN, "_r", object())
    with pytest.raises(SchedulingHookUnavailable, match="_r object"):
        check_scheduling_hook()


def test_the_simulation_refuses_before_any_seed_and_the_cli_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(determinism.trio, "__version__", "0.99.0")

    def no_seed(*_args: object, **_kw: object) -> None:
        pytest.fail("a seed ran on a trio the hook was not written for")

    monkeypatch.setattr("gymckpt.app.simulation.main.run_seed", no_seed)
    with pytest.raises(SchedulingHookUnavailable, match=r"trio 0\.99\.0 is installed"):
        main_simulate(1, 0, as_json=False)
    assert cli_main(["simulate", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gymckpt: error: trio 0.99.0 is installed") and err.count("\n") == 1
