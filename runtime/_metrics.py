"""Counters and gauges with a flat ``snapshot()`` (C5).

Names are ``rollout/…`` for the data plane and ``checkpoint/…`` for the control plane. Updating a
metric is a dict operation: cheap enough for the per-reply hot path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

__all__ = ["ADMISSION_CLOSED_ROWS", "Metrics"]

ADMISSION_CLOSED_ROWS = "rollout/gym_admission_closed_rows_total"

_PREFIXES = ("rollout/", "checkpoint/")


@attrs.define(eq=False, slots=True)
class Metrics:
    """A registry of counters (monotonic), gauges (last value) and ages (seconds since a
    ``mark``, read at each ``snapshot``: e.g. the time since the last completed checkpoint)."""

    clock: Callable[[], float] = attrs.field(default=time.monotonic, kw_only=True)
    _counters: dict[str, float] = attrs.field(factory=dict, init=False)
    _gauges: dict[str, float] = attrs.field(factory=dict, init=False)
    _marks: dict[str, float] = attrs.field(factory=dict, init=False)

    @staticmethod
    def _check(name: str) -> None:
        if not name.startswith(_PREFIXES):
            raise ValueError(f"metric name {name!r} must start with one of {_PREFIXES}")

    def inc(self, name: str, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0) to counter ``name``."""
        if amount < 0:
            raise ValueError(f"counter {name!r} cannot decrease (amount {amount!r})")
        counters = self._counters
        if name not in counters:
            self._check(name)
            counters[name] = 0.0
        counters[name] += amount

    def set(self, name: str, value: float) -> None:
        """Set gauge ``name`` to ``value``."""
        if name not in self._gauges:
            self._check(name)
        self._gauges[name] = float(value)

    def mark(self, name: str) -> None:
        """From now on, ``name`` reads the seconds since this call."""
        if name not in self._marks:
            self._check(name)
        self._marks[name] = self.clock()

    def get(self, name: str, default: float = 0.0) -> float:
        """The current value of a counter, gauge or age."""
        if name in self._counters:
            return self._counters[name]
        if name in self._marks:
            return self.clock() - self._marks[name]
        return self._gauges.get(name, default)

    def snapshot(self, *, ages: bool = True) -> dict[str, float]:
        """Every metric by name, as a new dict (ages computed now; without them with
        ``ages=False``: they read the wall clock, so a deterministic replay leaves them out)."""
        out = dict(self._counters)
        out.update(self._gauges)
        if ages and self._marks:
            now = self.clock()
            out.update({name: now - t for name, t in self._marks.items()})
        return out
