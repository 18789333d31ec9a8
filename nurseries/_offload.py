"""Run heavy synchronous work off the event loop.

Snapshot serialisation and file writes take O(in-flight) time; on the loop they would stall the
replies a checkpoint is waiting for. They run in a worker thread (``trio.to_thread``), except
under ``trio.testing.MockClock``: virtual time cannot wait for a real thread (the autojump clock
would leap past every pending deadline while the thread runs), so there the work runs inline and
the simulation stays deterministic.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import trio

__all__ = ["offload"]

T = TypeVar("T")


async def offload(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (inline under a MockClock); cancellable only before it starts."""
    # trio.testing is looked up, not imported: it imports pytest (~10k objects, which
    # every full collection would walk), and a MockClock exists only once it was imported.
    testing = sys.modules.get("trio.testing")
    if testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock):
        await trio.lowlevel.checkpoint()
        return fn()
    return await trio.to_thread.run_sync(fn)
