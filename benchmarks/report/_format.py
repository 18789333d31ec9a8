"""Table cells and inline figures of the report: every number the report prints goes through
``fmt`` (``n/a`` for a figure that is missing or not finite), so a result without a key reads
as not measured instead of failing the report."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._common import label

__all__ = ["TIMES", "Add", "at_size", "first_line", "fmt", "pct", "ratio", "stall", "turns_text"]

Add = Callable[[str], None]
"""Appends one line of Markdown to the report being written."""

TIMES = "\u00d7"  # the multiplication sign, for "1000x"


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:,.{digits}f}{unit}"


def first_line(text: Any, limit: int = 300) -> str:
    """``text``'s first non-empty line, at most ``limit`` characters (for a table cell)."""
    line = next((t.strip() for t in str(text).splitlines() if t.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def stall(v: Any) -> str:
    return "< 0.1 ms" if v is None else fmt(v, " ms", 2)


def at_size(n: int | None, want: int) -> str:
    """' (at 10k; the target is at 200k)' when a figure was measured at another size."""
    if n is None or n == want:
        return ""
    return f" (at {label(n).upper()}; the target is at {label(want).upper()})"


def turns_text(turn_s: Sequence[float] | None, times: Mapping[str, Any] | None) -> str:
    """The turn lengths a run drew: a uniform range (older results) or the lognormal's
    median, p99 and cap."""
    if times:
        return (
            f"lognormal, median {fmt(times.get('median_s'), ' s', 2)}, p99 "
            f"{fmt(times.get('p99_s'), ' s', 1)} ({fmt(times.get('p99_over_median'), TIMES, 0)} "
            f"the median), capped at {fmt(times.get('cap_s'), ' s', 1)}"
        )
    if turn_s:
        return f"{turn_s[0]:g} to {turn_s[1]:g} s"
    return "n/a"


def pct(fraction: float | None, digits: int = 1) -> str:
    """A fraction as a percentage (``n/a`` for None)."""
    return fmt(None if fraction is None else 100 * fraction, " %", digits)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` (HTTP's over Ray's, one mode's over the other's); None when either is
    missing or ``b`` is not positive."""
    return None if a is None or b is None or b <= 0 else a / b
