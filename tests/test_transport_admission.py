"""The admission header and the shape a fault gives one run."""

from __future__ import annotations

import pytest

from gymckpt.gym_adapter import Completed, FaultSpec
from gymckpt.gym_adapter.transports._admission import (
    HEADER_SEQ,
    ReplyBatch,
    RunShape,
    admission_header,
)


def test_the_header_comes_first_and_carries_nothing() -> None:
    header = admission_header()
    assert header.is_header and header.seq == HEADER_SEQ and header.replies == ()
    batch = ReplyBatch(HEADER_SEQ + 1, (Completed("r", 1.0, 1),))
    assert not batch.is_header
    with pytest.raises(ValueError, match="no replies"):
        ReplyBatch(HEADER_SEQ, (Completed("r", 1.0, 1),))
    with pytest.raises(ValueError):
        ReplyBatch(-1)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, RunShape()),
        ("run:refuse", RunShape(refuse_all=True)),
        ("run:drop", RunShape(drop_after=2)),
        ("run:hang", RunShape(inject=FaultSpec("run", "hang"))),
        ("run:delay:0.5", RunShape(inject=FaultSpec("run", "delay", None, 0.5))),
    ],
)
def test_a_fault_shapes_the_run(spec: str | None, expected: RunShape) -> None:
    parsed = FaultSpec.parse(spec) if spec is not None else None
    assert RunShape.of(parsed, ["r0", "r1", "r2", "r3", "r4"]) == expected
