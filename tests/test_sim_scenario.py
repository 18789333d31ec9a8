"""What a seed draws (``scenario``): a pure function of the seed, within the bounds a
runtime can finish, each dimension from a generator of its own."""

from __future__ import annotations

import re

import attrs

from gymckpt.app.simulation.scenario import (
    MAX_LIVES,
    Crash,
    Scenario,
    draw_scenario,
    replay_command,
)
from gymckpt.nurseries import HOOK_POINTS

EVERY_CALL = re.compile(r"^(\w+):(\w+)(:[\d.]+)?$")  # a spec without @N: every call


def test_a_scenario_is_a_pure_function_of_its_seed() -> None:
    assert draw_scenario(9) == draw_scenario(9) != draw_scenario(10)
    assert draw_scenario(9).seed == 9 and draw_scenario(9).max_lives == MAX_LIVES


def test_draws_stay_within_what_a_runtime_can_finish() -> None:
    for seed in range(300):
        sc = draw_scenario(seed)
        assert len(sc.kinds()) == sc.instances
        assert sc.max_rows_in_flight >= sc.groups_per_step  # else a step can never fill
        for spec in (*sc.faults, *sc.restore_faults):
            m = EVERY_CALL.match(spec)
            if m and m.group(1) == "run":  # never refuse or fail every submission forever
                assert m.group(2) in ("drop", "delay", "hang", "dead"), spec
        for crash in sc.crashes:
            if crash is not None and crash.point is not None:
                assert crash.point in HOOK_POINTS and crash.checkpoint is not None
        for n, point in (*sc.stage_drops, *sc.stage_deaths):
            assert 1 <= n <= 3 and point in HOOK_POINTS
        if sc.restore_retry:
            assert sc.instances > 1


def test_every_dimension_is_drawn_somewhere() -> None:
    scs = [draw_scenario(seed) for seed in range(200)]
    assert any(sc.stage_drops for sc in scs) and any(sc.stage_deaths for sc in scs)
    assert any(sc.rollback for sc in scs) and any(sc.restore_retry for sc in scs)
    assert any(sc.late_end_s for sc in scs)
    assert any(c is not None and c.at_s is not None for sc in scs for c in sc.crashes)
    assert any(c is not None and c.point == "after_publish" for sc in scs for c in sc.crashes)


def test_hostile_acts_leave_the_other_draws_as_they_were() -> None:
    for seed in range(50):
        hostile = draw_scenario(seed, hostile=True)
        assert attrs.evolve(hostile, hostile=()) == draw_scenario(seed)


def test_a_scenario_describes_itself_and_its_replay() -> None:
    sc = Scenario(crashes=(None, Crash(checkpoint=2, point="after_publish")))
    text = sc.describe()
    assert "rows 12 x group 2 on 2 instance(s) [simple,simple]" in text
    assert "crashes #1: crash at after_publish of checkpoint 2" in text
    assert str(Crash(at_s=1.5)) == "crash at 1.5s"
    assert sc.sim_config().lease_s == sc.runtime_config().lease_s == sc.lease_s
    assert replay_command(4) == "gymckpt simulate --seeds 1 --start 4"
    assert replay_command(4, hostile=True).endswith(" --hostile")
