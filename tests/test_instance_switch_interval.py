"""A process that hosts a Gym instance hands its event loop the GIL back soon
(``transports/_interpreter``): a Ray actor and ``gymckpt serve`` set the switch interval to
``SWITCH_INTERVAL_S`` (a shorter one a user chose is kept); nothing else does."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gymckpt.app.serve import add_serve_parser, main_serve
from gymckpt.gym_adapter import EnvironmentRef
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.gym_adapter.transports._interpreter import (
    SWITCH_INTERVAL_S,
    instance_switch_interval,
)
from gymckpt.gym_adapter.transports.ray._actor import GymActor
from gymckpt.nurseries import ExitCode


@pytest.fixture(autouse=True)
def default_interval() -> Iterator[None]:
    """Each test starts at CPython's default and leaves this process as it found it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_lowered_and_a_shorter_one_kept() -> None:
    instance_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    sys.setswitchinterval(SWITCH_INTERVAL_S / 5)
    instance_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S / 5)


def test_a_ray_actor_sets_it_in_its_worker_process(tmp_path: Path) -> None:
    cfg = CalendarConfig()
    env = EnvironmentRef.to(calendar_environment, agent_kind="simple_agent", config=cfg)
    GymActor("gym-0", env, 0, str(tmp_path), cfg.host_config())  # what Ray's worker runs
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)


def test_gymckpt_serve_sets_it_before_it_serves(tmp_path: Path) -> None:
    """``main_serve`` in this process, with an environment that does not load: it sets the
    interval, then fails as bad input (exit 2) without serving."""
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "gymckpt_no_such_module:factory", "--work-dir", str(tmp_path), "--port", "0"]
    )
    assert main_serve(args) == ExitCode.BAD_INPUT
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
