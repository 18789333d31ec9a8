"""Where a host gets its environment: import paths, ``EnvironmentRef``s (a factory and its
arguments), factories and environments; every bad name is refused saying what is wrong."""

from __future__ import annotations

import pickle

import pytest

from gymckpt.gym_adapter import Environment, EnvironmentRef, load_environment
from gymckpt.gym_adapter.environments.calendar import (
    CalendarAgent,
    CalendarConfig,
    calendar_environment,
    calendar_from_environ_path,
)
from gymckpt.testing.examples import guess_the_number


def test_a_ref_names_a_factory_and_its_arguments_and_builds_it() -> None:
    config = CalendarConfig(turns=(3, 3))
    ref = EnvironmentRef.to(calendar_environment, agent_kind="legacy_agent", config=config)
    assert ref.path == "gymckpt.gym_adapter.environments.calendar:calendar_environment"
    env = load_environment(ref)
    assert isinstance(env.agent, CalendarAgent)
    assert (env.agent.kind, env.agent.config) == ("legacy_agent", config)
    assert pickle.loads(pickle.dumps(ref)) == ref  # what crosses to an actor: a name, data


def test_a_ref_keeps_its_arguments_in_name_order() -> None:
    a = EnvironmentRef("m:f", {"b": 1, "a": 2})
    b = EnvironmentRef("m:f", {"a": 2, "b": 1})
    assert a == b and a.kwargs == (("a", 2), ("b", 1))


def test_import_paths_factories_and_environments() -> None:
    env = guess_the_number()
    assert load_environment(env) is env
    assert isinstance(load_environment("gymckpt.testing.examples:guess_the_number"), Environment)
    assert isinstance(load_environment(guess_the_number), Environment)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("no_colon", "must look like 'package.module:name'"),
        ("no_such_module_x:env", "cannot import no_such_module_x"),
        ("gymckpt.testing.examples:nothing", "has no nothing"),
        ("gymckpt.testing.examples:__all__", "not an Environment"),
        (
            EnvironmentRef("gymckpt.gym_adapter.environments.calendar:AGENT_KINDS"),
            "names no factory",
        ),
        (42, "is a int: give an Environment, a factory of one"),
        (None, "is a NoneType: give an Environment"),
    ],
)
def test_bad_names_are_refused(source: object, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        load_environment(source)  # type: ignore[arg-type]


def test_a_ref_with_a_malformed_path_is_refused_on_construction() -> None:
    with pytest.raises(ValueError, match="must look like"):
        EnvironmentRef("calendar_environment")


def test_the_calendar_workplace_is_named_like_any_other_environment() -> None:
    """No factory per deployment: a reference per instance (embedded, Ray), an import path
    (``gymckpt serve``, its config in the server's environment)."""
    config = CalendarConfig(lease_s=7.0)
    refs = [
        EnvironmentRef.to(calendar_environment, agent_kind=kind, config=config)
        for kind in ("simple_agent", "legacy_agent", "simple_agent")
    ]
    kinds = [load_environment(ref).agent.kind for ref in refs]
    assert kinds == ["simple_agent", "legacy_agent", "simple_agent"]
    assert refs[0] == refs[2]
    assert load_environment(calendar_from_environ_path("legacy_agent")).agent.kind == (
        "legacy_agent"
    )


def test_a_gymnasium_id_loads_the_adapter_named_by_its_import_path() -> None:
    """``gymnasium:ID`` is ``GYMNASIUM_FACTORY`` called with ``ID``: the host names the adapter,
    it does not import it (``test_layers``)."""
    gymnasium_env = pytest.importorskip("gymckpt.gym_adapter.environments.gymnasium")
    env = load_environment("gymnasium:CartPole-v1")
    assert isinstance(env.participants[0], gymnasium_env.GymnasiumParticipant)
    assert env.participants[0].env_id == "CartPole-v1"
