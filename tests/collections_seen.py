"""Which garbage collections start inside a block of a test, written once.

The "no collection while records are made" tests (a commit's parts decoded, a Ray commit
unpacked, a host's cut and export) each turn the collector on at known thresholds, hook
``gc.callbacks`` around the one call under test, and assert nothing started there.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["collections_seen"]


@contextmanager
def collections_seen(
    threshold: tuple[int, int, int] = (700, 10, 10),
    inside: Callable[[], str | None] = lambda: "",
) -> Iterator[list[tuple[str, int]]]:
    """``(inside(), generation)`` of each collection that starts in the block while
    ``inside()`` is not None, with the collector on at ``threshold``. On the way out the
    callback is removed, the thresholds found on the way in are back, and nothing stays
    frozen (what the code under test promoted is let go)."""
    found = gc.get_threshold()
    seen: list[tuple[str, int]] = []

    def started(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            where = inside()
            if where is not None:
                seen.append((where, info["generation"]))

    gc.enable()
    gc.set_threshold(*threshold)
    gc.callbacks.append(started)
    try:
        yield seen
    finally:
        gc.callbacks.remove(started)
        gc.set_threshold(*found)
        gc.unfreeze()
