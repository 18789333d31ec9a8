"""The exactly-once judge shared by the demo and the simulation."""

from __future__ import annotations

from gymckpt.gym_adapter import SimConfig
from gymckpt.nurseries.app.verdict import judge

CONFIG = SimConfig(turns=(2, 3), mutation_p=0.0)


def test_a_clean_lineage_is_exactly_once() -> None:
    v = judge([(1, [0, 1]), (2, [2, 3])], 4, None, seed=0, config=CONFIG, group_size=2)
    assert v.ok and v.violations() == []
    assert (v.rows_trained, v.steps, v.duplicates, v.lost) == (4, 2, 0, ())


def test_duplicates_losses_and_repeated_steps_are_each_named() -> None:
    v = judge([(1, [0, 1]), (2, [1]), (2, [3])], 5, None, seed=0, config=CONFIG, group_size=2)
    assert not v.ok
    assert v.rows_twice == (1,) and v.duplicates == 1
    assert v.lost == (2, 4)
    assert v.steps_trained_twice == 1 and not v.steps_in_order
    said = "\n".join(v.violations())
    assert "1 rows trained more than once: [1]" in said
    assert "2 rows lost: [2, 4]" in said
    assert "lineage steps are not 1..n" in said


def test_sentinels_are_judged_against_the_plans() -> None:
    mutating = SimConfig(turns=(2, 3), mutation_p=1.0)
    v = judge([(1, [0])], 1, None, seed=0, config=mutating, group_size=2)
    assert v.sentinels_expected > 0 and len(v.sentinels_missing) == v.sentinels_expected
    assert not v.ok and "sentinels missing" in "\n".join(v.violations())
