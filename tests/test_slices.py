"""Bulk work in slices (``runtime._slices``): the single call's result, never more than
``SLICE`` items per C call (one call over 1M items holds the GIL for tens of ms)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, overload

import attrs
import pytest

from gymckpt.runtime._slices import (
    FREE_SLICE,
    SLICE,
    extend_in_slices,
    map_in_slices,
    pairs_in_slices,
    release_in_slices,
    set_in_slices,
)


class _Recorded(Sequence[Any]):
    """A sequence that records the length of every slice taken of it."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.slices: list[int] = []

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            got = self.items[i]
            self.slices.append(len(got))
            return got
        raise AssertionError("an item at a time: a Python step per item")


@pytest.mark.parametrize("n", [0, 1, SLICE, 2 * SLICE + 3])
def test_each_helper_is_its_single_call_a_slice_at_a_time(n: int) -> None:
    ids = [f"{i % (n // 2 + 1)}-0" for i in range(n)]  # with repeats
    names = [f"gym-{i % 3}" for i in range(n)]
    for helper, single in [
        (lambda s: set_in_slices(s), lambda: set(ids)),
        (lambda s: map_in_slices(str.upper, s), lambda: list(map(str.upper, ids))),
        (lambda s: extend_in_slices(["head"], s), lambda: ["head", *ids]),
        (lambda s: pairs_in_slices(s, names), lambda: set(zip(ids, names, strict=True))),
    ]:
        recorded = _Recorded(ids)
        assert helper(recorded) == single()
        assert all(k <= SLICE for k in recorded.slices)
        assert sum(recorded.slices) == n and len(recorded.slices) == -(-n // SLICE)


def test_set_in_slices_adds_to_a_set_given_and_pairs_need_equal_lengths() -> None:
    into = {"a"}
    assert set_in_slices(["b", "a"], into) is into and into == {"a", "b"}
    with pytest.raises(ValueError, match="pairs of 2 and 1 items"):
        pairs_in_slices(["a", "b"], ["x"])


_freed: list[int] = []


class _Noted:
    """An object that notes when it is freed (reference counting calls ``__del__``)."""

    def __del__(self) -> None:
        _freed.append(1)


@attrs.frozen
class _Reply:
    instance: str
    exported: tuple[_Noted, ...]
    sessions: tuple[_Noted, ...]


def _longest_free(release: Any, garbage: list[Any]) -> int:
    """The most objects freed between two lines of Python (outside their ``__del__``): the
    objects one C call freed at most. A line is where the interpreter may hand the GIL over."""
    runs = [0]

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        if frame.f_code is _Noted.__del__.__code__:
            if event == "call":
                runs[-1] += 1
            return None
        if event == "line":
            runs.append(0)
        return trace

    _freed.clear()
    sys.settrace(trace)
    try:
        release(garbage)
    finally:
        sys.settrace(None)
    return max(runs)


@pytest.mark.parametrize("n", [0, 3, 5000])
def test_a_checkpoints_garbage_is_freed_a_slice_at_a_time(n: int) -> None:
    """``release_in_slices`` frees everything it is given (dicts, tuples, lists and attrs
    instances taken apart) with no C call freeing more than ``FREE_SLICE`` objects: a dict of
    a few replies, each a tuple of 50k records, freed in one call holds the GIL (and so the
    event loop) for tens of ms. What something else still holds is left alone."""
    kept = _Noted()

    def garbage() -> list[Any]:
        replies = {
            f"gym-{i}": _Reply(
                f"gym-{i}", tuple(_Noted() for _ in range(n)), tuple(_Noted() for _ in range(n))
            )
            for i in range(4)
        }
        return [replies, [_Noted() for _ in range(n)], (kept,), {"k": [kept]}]

    whole = _longest_free(lambda g: g.clear(), garbage())
    assert whole == 9 * n  # one call frees everything
    assert len(_freed) == 9 * n
    items = garbage()
    longest = _longest_free(release_in_slices, items)
    assert items == []
    assert len(_freed) == 9 * n  # all of it, and not ``kept``
    assert longest <= FREE_SLICE
    if n > FREE_SLICE:
        assert longest == FREE_SLICE
