"""The C3 fault grammar: every valid OP/KIND, clear errors for bad specs, @N counting."""

from __future__ import annotations

import pickle

import pytest

from gymckpt.gym_adapter import FAULT_GRAMMAR, FaultPlan, FaultSpec
from gymckpt.gym_adapter._faults import FAULT_KINDS, FAULT_OPS

VALID = [
    (op, kind)
    for op in FAULT_OPS
    for kind in FAULT_KINDS
    if kind not in ("refuse", "drop") or op == "run"
]


@pytest.mark.parametrize(("op", "kind"), VALID)
def test_every_valid_combination_parses(op: str, kind: str) -> None:
    arg = ":0.25" if kind == "delay" else ""
    spec = FaultSpec.parse(f"{op}:{kind}{arg}")
    assert (spec.op, spec.kind, spec.nth) == (op, kind, None)
    assert spec.arg == (0.25 if kind == "delay" else None)
    at_n = FaultSpec.parse(f"{op}:{kind}@3{arg}")
    assert at_n.nth == 3
    assert FaultSpec.parse(str(at_n)) == at_n


def test_valid_combination_count() -> None:
    # 6 ops x 5 general kinds, plus refuse and drop on run
    assert len(VALID) == 6 * 5 + 2


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("checkpoint:hang", "unknown OP 'checkpoint'"),
        ("prepare:explode", "unknown KIND 'explode'"),
        ("prepare:refuse", "applies to OP run only"),
        ("commit:drop", "applies to OP run only"),
        ("prepare:delay", "delay needs ARG"),
        ("prepare:delay:soon", "ARG must be a number"),
        ("prepare:delay:-1", "finite number of seconds >= 0"),
        ("prepare:delay:nan", "finite number of seconds >= 0"),
        ("prepare:delay:inf", "finite number of seconds >= 0"),
        ("prepare:hang:2", "takes no ARG"),
        ("prepare:hang@0", "@N must be a positive integer"),
        ("prepare:hang@-1", "@N must be a positive integer"),
        ("prepare:hang@x", "@N must be a positive integer"),
        ("prepare:hang@", "@N must be a positive integer"),
        ("prepare", "expected 2 or 3"),
        ("prepare:delay:1:2", "expected 2 or 3"),
        ("", "expected 2 or 3"),
    ],
)
def test_bad_specs_say_what_is_wrong_and_show_the_grammar(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match="bad fault spec") as info:
        FaultSpec.parse(spec)
    message = str(info.value)
    assert why in message
    assert FAULT_GRAMMAR in message
    assert "\n" not in message


def test_constructed_specs_are_validated_too() -> None:
    with pytest.raises(ValueError, match="applies to OP run only"):
        FaultSpec("retire", "drop")
    with pytest.raises(ValueError, match="delay needs ARG"):
        FaultSpec("run", "delay")


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="must be a string"):
        FaultSpec.parse(3)  # type: ignore[arg-type]


def test_nth_call_counting_is_per_op_and_deterministic() -> None:
    plan = FaultPlan(["prepare:error@2", "commit:hang"])
    seen = [(op, plan.check(op)) for op in ["prepare", "commit", "prepare", "prepare", "commit"]]
    assert [(op, str(s) if s else None) for op, s in seen] == [
        ("prepare", None),
        ("commit", "commit:hang"),
        ("prepare", "prepare:error@2"),
        ("prepare", None),
        ("commit", "commit:hang"),
    ]
    assert plan.calls("prepare") == 3
    assert plan.calls("commit") == 2
    assert plan.fired == (("commit:hang", 1), ("prepare:error@2", 2), ("commit:hang", 2))


def test_retire_restored_counts_as_retire() -> None:
    plan = FaultPlan(["retire:error@2"])
    assert plan.check("retire") is None
    spec = plan.check("retire_restored")
    assert spec is not None and spec.kind == "error"
    assert plan.calls("retire") == 2


def test_first_matching_spec_wins() -> None:
    plan = FaultPlan([FaultSpec.parse("run:drop@1"), "run:refuse"])
    first, second = plan.check("run"), plan.check("run")
    assert first is not None and first.kind == "drop"
    assert second is not None and second.kind == "refuse"


def test_unknown_ops_never_fault() -> None:
    plan = FaultPlan(["prepare:hang"])
    assert plan.check("inventory") is None
    assert plan.check("topology") is None


def test_plan_and_specs_pickle() -> None:
    plan = FaultPlan(["prepare:delay@2:0.5", "run:drop"])
    plan.check("prepare")
    clone = pickle.loads(pickle.dumps(plan))
    assert clone.specs == plan.specs
    spec = clone.check("prepare")
    assert spec is not None and spec.arg == 0.5
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_plan_accepts_a_single_spec() -> None:
    assert FaultPlan("run:drop").specs == (FaultSpec("run", "drop"),)
