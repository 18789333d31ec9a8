"""Bulk work over a checkpoint's million items in slices, so the event loop is never held.

A checkpoint's heavy work runs in a worker thread (``offload``), but the thread shares the GIL
with the event loop, and the interpreter only hands the GIL over *between* bytecodes: one C
call over 1M items (``set(ids)``, ``list(map(f, column))``, ``frozenset(ids)``) holds it from
start to end, 20 to 100 ms in which the loop cannot run. These helpers do the same work in
calls of at most ``SLICE`` items each; between two calls the loop gets the GIL within the
switch interval. Same results as the single call, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final, TypeVar

__all__ = [
    "SLICE",
    "extend_in_slices",
    "map_in_slices",
    "pairs_in_slices",
    "set_in_slices",
]

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)
U = TypeVar("U")

SLICE: Final = 16_384
"""Items per C call: ~1 ms of work each on one core (a set insert or a map step is tens of ns)."""


def set_in_slices(items: Sequence[H], into: set[H] | None = None) -> set[H]:
    """``set(items)`` (added to ``into`` when given), ``SLICE`` items per call."""
    out: set[H] = set() if into is None else into
    for j in range(0, len(items), SLICE):
        out.update(items[j : j + SLICE])
    return out


def map_in_slices(fn: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``list(map(fn, items))``, ``SLICE`` items per call (``fn`` a C function: a bound
    ``__getitem__``, ``bool``)."""
    out: list[U] = []
    for j in range(0, len(items), SLICE):
        out.extend(map(fn, items[j : j + SLICE]))
    return out


def extend_in_slices(out: list[T], items: Sequence[T]) -> list[T]:
    """``out.extend(items)``, ``SLICE`` items per call; ``out``."""
    for j in range(0, len(items), SLICE):
        out.extend(items[j : j + SLICE])
    return out


def pairs_in_slices(first: Sequence[T], second: Sequence[U]) -> set[tuple[T, U]]:
    """``set(zip(first, second, strict=True))``, ``SLICE`` pairs per call."""
    if len(first) != len(second):
        raise ValueError(f"pairs of {len(first)} and {len(second)} items")
    out: set[tuple[T, U]] = set()
    for j in range(0, len(first), SLICE):
        out.update(zip(first[j : j + SLICE], second[j : j + SLICE], strict=True))
    return out
