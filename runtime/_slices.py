"""Bulk work over a checkpoint's million items in slices, so the event loop is never held.

A checkpoint's heavy work runs in a worker thread (``offload``), but the thread shares the GIL
with the event loop, and the interpreter only hands the GIL over *between* bytecodes: one C
call over 1M items (``set(ids)``, ``list(map(f, column))``, ``frozenset(ids)``) holds it from
start to end, 20 to 100 ms in which the loop cannot run. These helpers do the same work in
calls of at most ``SLICE`` items each; between two calls the loop gets the GIL within the
switch interval. Same results as the single call, in the same order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, TypeVar

import attrs

__all__ = [
    "SLICE",
    "extend_in_slices",
    "map_in_slices",
    "pairs_in_slices",
    "release_in_slices",
    "set_in_slices",
]

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)
U = TypeVar("U")

SLICE: Final = 16_384
"""Items per C call: ~1 ms of work each on one core (a set insert or a map step is tens of ns)."""

FREE_SLICE: Final = 1024
"""The most items of one container ``release_in_slices`` lets go of in one C call (an object
freed costs more than a set insert: its own fields, and a dict or a tuple of its own)."""

_TAKEN_APART: Final = 64
"""A container of at most this many items is taken apart item by item (its items may be large
themselves); a larger one is let go of ``FREE_SLICE`` items at a time."""


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


def release_in_slices(items: list[Any]) -> None:
    """Let go of ``items`` (emptied) so that no C call frees more than ``FREE_SLICE`` items of
    one container (or a small container's worth): freeing a checkpoint's replies and columns
    (a dict of a few replies, each a tuple of 50k records) in one call holds the GIL, and so
    the event loop, until the last object is gone (tens of ms at 200k episodes).

    Dicts, lists, tuples, sets and attrs instances that only ``items`` holds are taken apart:
    a small one's items (an attrs instance's fields) are let go of the same way, one by one; a
    large one's (over ``_TAKEN_APART``) are copied to a list and freed ``FREE_SLICE`` at a time.
    An object something else still holds is only dropped (freeing it frees nothing)."""
    stack = items
    refs = sys.getrefcount
    while stack:
        obj = stack.pop()
        if refs(obj) > 2:  # held elsewhere (``obj`` and the call's argument are the 2)
            del obj
            continue
        kind = type(obj)
        if kind is dict:
            parts: list[Any] = [*obj.values(), *obj]
        elif kind in (list, tuple, set, frozenset):
            parts = list(obj)
        elif attrs.has(kind):
            stack.extend([getattr(obj, a.name) for a in attrs.fields(kind)])
            del obj
            continue
        else:
            del obj
            continue
        del obj  # its items live on in ``parts``: nothing freed here but the container
        if len(parts) <= _TAKEN_APART:
            stack.extend(parts)
            del parts  # else it would keep them alive past their turn on ``stack``
            continue
        while parts:
            del parts[-FREE_SLICE:]
