"""What every deployment does the same way with its arguments."""

from __future__ import annotations

import pytest

from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.gym_adapter.transports._deployment import instance_names, per_instance
from gymckpt.testing.examples import guess_the_number


def test_instance_names() -> None:
    assert instance_names(3) == ("gym-0", "gym-1", "gym-2")
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match="instances must be >= 1"):
            instance_names(bad)  # type: ignore[arg-type]


def test_one_environment_for_all_or_one_each() -> None:
    assert per_instance("pkg.mod:env", 2) == ("pkg.mod:env", "pkg.mod:env")
    assert per_instance(["a:b", "c:d"], 2) == ("a:b", "c:d")
    with pytest.raises(ValueError, match="got 1 environments for 2 instances"):
        per_instance(("a:b",), 2)


async def test_a_deployment_hosts_one_environment_per_instance() -> None:
    from gymckpt.gym_adapter.environments.calendar import calendar_environment

    envs = [guess_the_number(), calendar_environment("legacy_agent")]
    async with EmbeddedGym.host(envs, instances=2) as gym:
        topology = await gym.topology()
    assert topology.instances[0].participants[0][1] != topology.instances[1].participants[0][1]
    assert topology.instances[1].participants[0] == ("agent", "legacy_agent")
