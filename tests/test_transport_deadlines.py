"""Deadlines cross as the time left and are re-anchored on the receiver's clock."""

from __future__ import annotations

import math

import pytest

from gymckpt.gym_adapter.transports._deadlines import WireDeadline


def test_the_time_left_travels_and_time_in_transit_counts_as_spent() -> None:
    wire = WireDeadline.send(deadline_ts=105.0, now=100.0, wall=1_000.0)
    assert wire == WireDeadline(5.0, 1_000.0)
    # the receiver's monotonic clock is unrelated; 1.5 s passed on the wall clock meanwhile
    assert wire.local(now=7.0, wall=1_001.5) == pytest.approx(10.5)
    assert wire.local(now=7.0, wall=1_000.0) == 12.0


def test_a_receiver_whose_wall_clock_is_behind_counts_no_time_spent() -> None:
    wire = WireDeadline.send(deadline_ts=3.0, now=1.0, wall=500.0)
    assert wire.local(now=50.0, wall=499.0) == 52.0


def test_a_deadline_already_passed_stays_passed() -> None:
    wire = WireDeadline.send(deadline_ts=1.0, now=2.0, wall=0.0)
    assert wire.remaining_s == -1.0
    assert wire.local(now=10.0, wall=0.0) < 10.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1"])
def test_a_deadline_must_be_finite_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="remaining_s"):
        WireDeadline(bad, 0.0)  # type: ignore[arg-type]
