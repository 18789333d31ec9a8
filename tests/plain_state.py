"""Trivial session states for test participants, written once.

A test participant whose state handling is not what its test checks inherits its ``open``,
``export`` and ``restore`` from one of these and writes only what the test is about (its
``step``, its fields). Both are slotless mixins (``__slots__ = ()``), so an ``attrs.define``
subclass keeps its slots. A participant whose export or restore *is* the point of its test (one
that breaks, counts, shares its live state, runs in a thread) writes its own.
"""

from __future__ import annotations

from typing import Any

from gymckpt.gym_adapter.host._episode import EpisodeInfo

__all__ = ["CountState", "PlainState"]


class PlainState:
    """A session state of ``{}``, exported and restored as it is (the same object)."""

    __slots__ = ()

    def open(self, info: EpisodeInfo) -> Any:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data


class CountState:
    """A session state of ``{"n": 0}``, exported and restored as a copy: what was exported never
    changes with the live state (a participant that counts in ``state["n"]``)."""

    __slots__ = ()

    def open(self, info: EpisodeInfo) -> Any:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        return dict(state)

    def restore(self, data: Any) -> Any:
        return dict(data)
