"""The rate-limited failure log of a Gym host (``gym_adapter.host._log``): the first ``burst``
failures are logged under ``gymckpt.gym`` as WARNINGs (the last of them says what happens next),
then one line per ``every_s`` seconds of the injected clock with the count left out since the
previous line; ``total`` counts every failure, and tracebacks ride along."""

from __future__ import annotations

import logging

import pytest

from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._log import BURST, EVERY_S, LOGGER, FailureLog, episode_label


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gymckpt.gym"]


def test_defaults_and_logger() -> None:
    assert LOGGER.name == "gymckpt.gym"
    log = FailureLog(lambda: 0.0)
    assert (log.burst, log.every_s) == (BURST, EVERY_S) == (10, 30.0)
    assert (log.logged, log.suppressed, log.total) == (0, 0, 0)


def test_episode_label() -> None:
    info = EpisodeInfo("3-1", row=3, slot=1, attempt=0, seed=7, instance="gym-0")
    assert episode_label(info) == "episode 3-1 (row 3 slot 1 attempt 0) on gym-0"


def test_burst_then_one_line_per_interval(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt.gym")
    log = FailureLog(clock, burst=3, every_s=10.0)
    for i in range(3):
        log.warn(f"f{i}")
    assert messages(caplog) == [
        "f0",
        "f1",
        "f2 (further failures on this instance: one line every 10s, "
        "with a count of those left out)",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    caplog.clear()
    clock.now += 9.999
    for i in range(4):
        log.warn(f"g{i}")
    assert messages(caplog) == []
    assert (log.logged, log.suppressed, log.total) == (3, 4, 7)
    clock.now += 0.001  # exactly every_s after the burst's last line
    log.warn("h")
    assert messages(caplog) == ["h (4 more failures not logged since the last line)"]
    assert log.suppressed == 0
    caplog.clear()
    clock.now += 5.0
    log.warn("i")
    assert messages(caplog) == []
    clock.now += 5.0
    log.warn("j")
    assert messages(caplog) == ["j (1 more failures not logged since the last line)"]
    assert (log.logged, log.suppressed, log.total) == (5, 0, 10)


def test_after_a_quiet_interval_a_line_has_no_count(
    caplog: pytest.LogCaptureFixture, clock: Clock
) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt.gym")
    log = FailureLog(clock, burst=1, every_s=2.0)
    log.warn("a")
    clock.now += 2.0
    log.warn("b")
    assert messages(caplog)[1] == "b"


def test_clock_read_only_from_the_end_of_the_burst(clock: Clock) -> None:
    log = FailureLog(clock, burst=3, every_s=1.0)
    log.warn("a")
    log.warn("b")
    assert clock.calls == 0
    log.warn("c")
    assert clock.calls == 1


def test_traceback_is_attached(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt.gym")
    log = FailureLog(clock)
    try:
        raise ValueError("user step broke")
    except ValueError as e:
        log.warn("episode x: step raised", e)
    log.warn("episode y: bad Done")
    first, second = caplog.records
    assert first.exc_info is not None and first.exc_info[1].args == ("user step broke",)
    assert "user step broke" in caplog.text
    assert not second.exc_info


def test_burst_zero_rate_limits_from_the_first(
    caplog: pytest.LogCaptureFixture, clock: Clock
) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt.gym")
    log = FailureLog(clock, burst=0, every_s=5.0)
    log.warn("a")
    log.warn("b")
    clock.now += 5.0
    log.warn("c")
    assert messages(caplog) == ["a", "c (1 more failures not logged since the last line)"]
    assert log.total == 3


def test_instances_limit_independently(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.WARNING, logger="gymckpt.gym")
    a, b = FailureLog(clock, burst=1), FailureLog(clock, burst=1)
    a.warn("a0")
    a.warn("a1")
    b.warn("b0")
    assert [m.split(" ")[0] for m in messages(caplog)] == ["a0", "b0"]
