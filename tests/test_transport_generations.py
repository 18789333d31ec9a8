"""Incarnations: a late failure of a replaced incarnation marks nothing."""

from __future__ import annotations

import pytest

from gymckpt.gym_adapter.transports._incarnations import Incarnations
from gymckpt.runtime import GymInstanceDead


def test_a_dead_instance_refuses_calls_until_its_replacement_is_installed() -> None:
    gens = Incarnations.of(["gym-0", "gym-1"])
    assert gens.live("gym-0", "prepare") == 0
    gens.mark_dead("gym-0", 0)
    with pytest.raises(GymInstanceDead, match="gym-0"):
        gens.live("gym-0", "prepare")
    assert gens.live("gym-1", "prepare") == 0  # the other instance is untouched
    new = gens.begin_replacement("gym-0")
    assert new == 1 and gens.is_dead("gym-0")
    gens.installed("gym-0", new)
    assert gens.live("gym-0", "run") == 1 and gens.serving("gym-0", 1)
    assert gens.statistics().incarnations == (("gym-0", 1), ("gym-1", 0))


def test_a_late_failure_of_the_old_incarnation_marks_nothing() -> None:
    gens = Incarnations.of(["gym-0"])
    old = gens.live("gym-0", "run")
    gens.installed("gym-0", gens.begin_replacement("gym-0"))
    assert not gens.serving("gym-0", old)
    gens.mark_dead("gym-0", old)  # the old actor's stream fails late
    assert not gens.is_dead("gym-0") and gens.statistics().dead == ()


def test_an_instance_being_replaced_is_dead_for_every_incarnation() -> None:
    gens = Incarnations.of(["gym-0"])
    new = gens.begin_replacement("gym-0")
    assert not gens.serving("gym-0", 0) and not gens.serving("gym-0", new)
    with pytest.raises(RuntimeError, match="incarnation 0 installed"):
        gens.installed("gym-0", 0)


def test_an_unknown_instance_is_named() -> None:
    gens = Incarnations.of(["gym-0"])
    with pytest.raises(ValueError, match="unknown instance 'gym-9'"):
        gens.live("gym-9", "run")
