"""Table cells and inline figures of the report: every number the report prints goes through
``fmt`` (``n/a`` for a figure that is missing or not finite), so a result without a key reads
as not measured instead of failing the report."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._common import label

__all__ = ["TIMES", "Add", "at_size", "first_line", "fmt", "stall"]

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
