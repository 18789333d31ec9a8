"""Bulk work in slices (``runtime._slices``): the single call's result, never more than
``SLICE`` items per C call (one call over 1M items holds the GIL for tens of ms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import pytest

from gymckpt.runtime._slices import (
    SLICE,
    extend_in_slices,
    map_in_slices,
    pairs_in_slices,
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
