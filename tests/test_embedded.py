"""Tests of ``gym_adapter.transports._embedded``: ``EmbeddedGym.host``, ``EmbeddedGym.serve_hosts``,
``replace`` and ``replacements``, and what the deployment refuses.

The backend contract itself (every call, every fault kind) is the conformance suite's
(tests/test_gym_conformance.py); here: what the embedded deployment adds around its hosts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    EmbeddedGym,
    Environment,
    EnvironmentSpecError,
    GymControlError,
    GymHost,
    GymInstanceDead,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter._faults import FaultPlan
from gymckpt.gym_adapter.environments.calendar import (
    CalendarAgent,
    CalendarConfig,
    CalendarServer,
    calendar_environment,
    calendar_host,
)
from gymckpt.runtime import GymCallTimeout

FAST = CalendarConfig(turns=(2, 3), turn_s=(0.01, 0.02), mutation_p=1.0)


def deadline(seconds: float = 5.0) -> float:
    return trio.current_time() + seconds


def rows(n: int, start: int = 0) -> list[RunRow]:
    return [RunRow(f"{r}-0", r, 0, 0) for r in range(start, start + n)]


async def drain(stream: ReplyStream) -> list[RunReply]:
    return [reply async for batch in stream for reply in batch]


def env() -> Environment:
    return calendar_environment(config=FAST)


def not_serving(host: GymHost) -> bool:
    """Whether ``host`` is out of its context (its task group closed)."""
    return host._tg is None


# -- host ----------------------------------------------------------------------------------


async def test_host_serves_one_named_instance_each_until_the_context_exits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with EmbeddedGym.host(env(), instances=3) as gym:
        assert gym.instances == ("gym-0", "gym-1", "gym-2")
        hosts = [gym.sim(n) for n in gym.instances]
        assert [h.name for h in hosts] == list(gym.instances)
        assert len({id(h) for h in hosts}) == 3
        assert not any(not_serving(h) for h in hosts)  # serving on entry, nothing awaited
        assert len(await drain(await gym.run("gym-2", rows(2)))) == 2
    assert all(not_serving(h) for h in hosts)


async def test_host_takes_one_environment_per_instance(
    autojump_clock: trio.testing.MockClock,
) -> None:
    legacy = calendar_environment("legacy_agent", FAST)
    async with EmbeddedGym.host([env(), legacy], instances=2) as gym:
        topo = await gym.topology()
        assert [i.participants[0] for i in topo.instances] == [
            ("agent", "simple_agent"),
            ("agent", "legacy_agent"),
        ]


async def test_host_passes_seed_config_and_work_dir_to_each_instance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cfg = FAST.host_config()
    async with EmbeddedGym.host(env, instances=2, seed=11, work_dir=tmp_path, config=cfg) as gym:
        for name in gym.instances:
            host = gym.sim(name)
            assert (host.seed, host.config, host.work_dir) == (11, cfg, tmp_path)
            assert host.journal_path == tmp_path / name / host.journal_path.name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instances": 0}, "instances must be >= 1, got 0"),
        ({"instances": True}, "instances must be >= 1, got True"),
        ({"instances": 3, "environment": "two"}, "got 2 environments for 3 instances"),
        ({"faults": ["prepare:explode"]}, "explode"),
        (
            {"environment": "gymckpt.gym_adapter.environments.calendar:CALENDAR"},
            "is a str, not an Environment",
        ),
    ],
)
async def test_host_refuses_bad_arguments_before_serving(kwargs: dict, message: str) -> None:
    if kwargs.get("environment") == "two":
        kwargs["environment"] = [env(), env()]
    kwargs.setdefault("environment", env())
    entered = False
    with pytest.raises(ValueError, match=message):
        async with EmbeddedGym.host(**kwargs):
            entered = True
    assert not entered


async def test_host_refuses_an_environment_that_cannot_be_hosted() -> None:
    bad = Environment(agent=CalendarAgent(FAST), participants=(CalendarServer(), CalendarServer()))
    with pytest.raises(EnvironmentSpecError):
        async with EmbeddedGym.host([env(), bad], instances=2):
            pytest.fail("served an environment that cannot be hosted")


async def test_one_fault_plan_counts_calls_across_the_deployment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with EmbeddedGym.host(env(), instances=2, faults=["prepare:error@2"]) as gym:
        assert gym.faults.calls("prepare") == 0
        await gym.prepare("gym-0", "c", deadline())  # call 1
        with pytest.raises(GymControlError, match="gym-1 prepare"):
            await gym.prepare("gym-1", "c", deadline())  # call 2, another instance
        assert gym.faults.calls("prepare") == 2
        assert gym.faults.fired == (("prepare:error@2", 2),)
        assert (await gym.statistics()).faults_fired == gym.faults.fired


async def test_a_dead_instance_refuses_calls_without_counting_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with EmbeddedGym.host(env(), instances=2, faults=["prepare:dead@1"]) as gym:
        with pytest.raises(GymInstanceDead, match="gym-0"):
            await gym.prepare("gym-0", "c", deadline())
        assert gym.sim("gym-0").dead and not gym.sim("gym-1").dead
        counted = gym.faults.calls("prepare")
        for _ in range(3):
            with pytest.raises(GymInstanceDead) as info:
                await gym.prepare("gym-0", "c", deadline())
            assert (info.value.instance, info.value.operation) == ("gym-0", "prepare")
        with pytest.raises(GymInstanceDead):
            await gym.run("gym-0", rows(1))
        assert gym.faults.calls("prepare") == counted  # never reached the plan
        assert gym.faults.calls("run") == 0
        await gym.prepare("gym-1", "c", deadline())  # the other lives
        assert repr(gym).startswith("<EmbeddedGym instances=2 dead=1 faults=<FaultPlan")


async def test_an_unknown_instance_is_refused_naming_the_instances(
    autojump_clock: trio.testing.MockClock,
) -> None:
    message = r"unknown instance 'gym-7' \(instances: gym-0, gym-1\)"
    async with EmbeddedGym.host(env(), instances=2) as gym:
        with pytest.raises(ValueError, match=message):
            gym.sim("gym-7")
        with pytest.raises(ValueError, match=message):
            gym.replacement_count("gym-7")
        with pytest.raises(ValueError, match=message):
            await gym.replace("gym-7", deadline())
        with pytest.raises(ValueError, match=message):
            await gym.prepare("gym-7", "c", deadline())
        assert gym.faults.calls("prepare") == 0


# -- replace and replacements ----------------------------------------------------------------


async def test_replace_serves_a_new_instance_of_the_same_name_seed_and_config(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(env(), instances=2, seed=5, work_dir=tmp_path) as gym:
        assert len(await drain(await gym.run("gym-1", rows(2)))) == 2
        old = gym.sim("gym-1")
        topology = await gym.topology()
        await gym.replace("gym-1", deadline())
        new = gym.sim("gym-1")
        assert new is not old and old.dead and not new.dead
        assert (new.name, new.seed, new.config, new.work_dir) == (
            old.name,
            old.seed,
            old.config,
            old.work_dir,
        )
        assert new.recover and not old.recover  # it continues the dead one's journal
        assert await gym.topology() == topology
        assert (gym.replacement_count("gym-1"), gym.replacement_count("gym-0")) == (1, 0)
        await gym.replace("gym-1", deadline())
        assert gym.replacement_count("gym-1") == 2
        assert [r.instance for r in gym.replacements] == [
            "gym-1",
            "gym-1",
        ]  # one shape (Replacement)
        stats = await gym.statistics()
        assert [s.dead for s in stats.replaced] == [True, True]
        assert len(await drain(await gym.run("gym-1", rows(1, start=7)))) == 1
        latest = gym.sim("gym-1")
    assert not_serving(latest)  # a replacement lives exactly as long as the deployment


async def test_replace_past_its_deadline_times_out_and_counts_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with EmbeddedGym.host(env(), work_dir=tmp_path) as gym:
        old = gym.sim("gym-0")
        with pytest.raises(GymCallTimeout, match="instance gym-0 replace: not serving") as info:
            await gym.replace("gym-0", trio.current_time() - 1.0)
        assert (info.value.instance, info.value.operation) == ("gym-0", "replace")
        assert gym.replacement_count("gym-0") == 0 and gym.sim("gym-0") is old
        assert old.dead  # killed first
        await gym.replace("gym-0", deadline())  # a later replace with time to spare works
        assert gym.replacement_count("gym-0") == 1 and not gym.sim("gym-0").dead
        assert len(await drain(await gym.run("gym-0", rows(1)))) == 1


async def test_a_deployment_that_cannot_build_a_replacement_refuses_to_replace() -> None:
    host = calendar_host("gym-0", config=FAST)
    gym = EmbeddedGym([host], FaultPlan())
    with pytest.raises(GymInstanceDead) as info:
        await gym.replace("gym-0", deadline())
    assert (info.value.instance, info.value.operation) == ("gym-0", "replace")
    assert gym.replacement_count("gym-0") == 0 and not host.dead  # nothing was killed


# -- serve_hosts -----------------------------------------------------------------------------


async def test_serve_hosts_serves_the_callers_hosts_and_builds_replacements_with_make(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hosts = [calendar_host(f"gym-{i}", seed=i, work_dir=tmp_path, config=FAST) for i in range(2)]
    made: list[str] = []

    def make(name: str) -> GymHost:
        made.append(name)
        return calendar_host(name, seed=99, work_dir=tmp_path, config=FAST, recover=True)

    plan = FaultPlan(["retire:error@1"])
    async with EmbeddedGym.serve_hosts(hosts, plan, make) as gym:
        assert gym.instances == ("gym-0", "gym-1") and gym.faults is plan
        assert [gym.sim(n) for n in gym.instances] == hosts  # the very hosts, in order
        assert not any(not_serving(h) for h in hosts)
        with pytest.raises(GymControlError, match="gym-0 retire"):
            await gym.retire("gym-0", [], deadline())
        assert made == []
        await gym.replace("gym-1", deadline())
        assert made == ["gym-1"] and gym.sim("gym-1").seed == 99
        replacement = gym.sim("gym-1")
        assert len(await drain(await gym.run("gym-1", rows(1)))) == 1
    assert not_serving(hosts[0]) and not_serving(replacement)


async def test_serve_hosts_stops_serving_when_the_body_raises(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The body's error comes out (in an exception group: the deployment's task group is
    anyio's, strict under trio) and the hosts are out of their contexts."""
    hosts = [calendar_host("gym-0", config=FAST)]
    with pytest.raises(BaseException) as info:
        async with EmbeddedGym.serve_hosts(hosts, FaultPlan(), lambda n: hosts[0]):
            raise KeyError("the body failed")
    error = info.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, KeyError) and error.args == ("the body failed",)
    assert not_serving(hosts[0])
