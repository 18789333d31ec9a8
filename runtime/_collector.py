"""The cyclic garbage collector's full collections stay out of a checkpoint.

Why
---
A checkpoint is a short, bounded window (seconds) in which the event loop must keep answering:
replies land and the drain wakes. CPython's cyclic collector pauses the whole process — the loop
and every worker thread, since it holds the GIL — for a time proportional to the objects it
walks. A young-generation collection walks only recent survivors (bounded by the collector's
thresholds: well under a millisecond). A full collection walks every tracked object in the
process. The ledger keeps no collector-tracked object per attempt, but a process can still hold
millions of them (an embedded Gym host keeps a task per episode), and a checkpoint allocates
heavily (commit replies, manifests, serialised snapshots), which is exactly what makes a full
collection due: pauses of seconds, inside the window that must not stall.

So, while a checkpoint runs, the oldest generation's threshold is raised out of reach: young
collections go on as usual (garbage keeps being freed, nothing piles up), full collections wait.
When the last checkpoint in the process ends, the threshold is put back, and a full collection
that became due runs at the trainer's pace, as it would have without us (its cost is the size of
what the process holds, not the checkpoint's). Nothing is frozen, nothing leaks. A collector the
user switched off or re-tuned meanwhile is left as the user set it.
``RuntimeConfig.pause_collector = False`` opts out.

Once per process, ``open_rollouts`` also collects and then freezes what is alive when it starts
(``freeze_startup_objects``): the modules, classes and functions that gymckpt, trio, attrs and
cattrs import (tens of thousands of tracked objects, here 30 to 45 ms of every full collection)
and whatever the trainer built before. They live as long as the process, so walking them again
in every full collection buys nothing; frozen, they are still freed by reference counting when
they go. What the runtime allocates afterwards (the ledger keeps no tracked object per attempt)
is collected as usual. ``RuntimeConfig.freeze_startup_objects = False`` opts out.

Survivors of a checkpoint (``promote_survivors``). What is alive when a checkpoint has parked
Gym, and again when it ends, is what a process holds for the long run: the ledger, the
trainer's state and, in a process hosting Gym, every in-flight episode (a dozen tracked objects
each, 2.4M at 200k). Left to the collector, they are walked again and again: the young
generations walk them when a checkpoint's first allocations trigger a collection (CPython puts
objects back there uncounted, e.g. every coroutine it resumes), and a full collection walks all
of them once the pause ends (seconds at 200k). So at those points (and while a Gym host fills
up, every ``PROMOTE_EVERY`` episodes it starts) the runtime and the Gym host move everything
tracked into the permanent generation (``gc.freeze()``: O(1), a list splice,
no walk). Frozen objects are still freed by reference counting when they go; only garbage
*cycles* among them wait, so every ``FULL_COLLECTION_EVERY``-th promotion in a process
unfreezes instead, and the next full collection (at the trainer's pace, at the cost the
process would pay without any of this) frees what such cycles hold.
``RuntimeConfig.pause_collector = False`` (and ``HostConfig.freeze_survivors = False`` for a
Gym host) opts out.

Records made in bulk (``records_promoted``). A remote commit's answer becomes 100k record
objects per instance on the trainer's loop, a part of ~1k records per scheduler step. Each part
allocates a few thousand tracked objects: several young collections, and each young collection
walks not only the part but whatever CPython put back in the young generations uncounted since
the last one (every coroutine resumed, every dict that became tracked again: at 200k in flight,
the dispatcher's per-episode objects, tens of milliseconds a walk). So a part is made with the
collector off, and what is young at its end is promoted (``gc.freeze()``, O(1)): no collection
runs in the step, and the next one walks nothing of it. Records are acyclic; what was young
beside them is promoted as ``promote_survivors`` promotes it, without counting toward its
unfreeze cadence (a checkpoint makes hundreds of parts). A Gym host's commit does the same on
its side: each slice of an unaligned cut (1,024 episodes) and each instance's export of its
records from the boundary marks (bytes, lists of bytes and the reply's acyclic per-episode
records) is one such block. The collector is the process's: while one thread's block runs, no
collection runs in any thread (what they allocate is promoted at its end with the rest), and
blocks of several threads overlap: the collector stays off until the last one running ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "FULL_COLLECTION_EVERY",
    "collector_paused",
    "freeze_startup_objects",
    "promote_survivors",
    "records_promoted",
]

_OUT_OF_REACH = 1 << 30
_depth = 0
_saved: tuple[int, ...] | None = None
_startup_frozen = False
_promotions = 0
FULL_COLLECTION_EVERY = 256
"""Every this many ``promote_survivors`` calls in a process, one unfreezes instead (see the
module docstring). A checkpoint over K embedded instances promotes 2K + 1 times (and a host
once per ``PROMOTE_EVERY`` episodes it starts), so with 4 that is a full collection over
everything about every 28 checkpoints: garbage cycles among frozen objects wait that long, and a
process holding 200k episodes pays that collection (seconds) that often instead of after every
checkpoint."""


def freeze_startup_objects() -> bool:
    """``gc.collect()`` then ``gc.freeze()``, the first time in this process (see the module
    docstring); True if it froze now. A collector the user disabled is left alone."""
    global _startup_frozen
    if _startup_frozen or not gc.isenabled():
        return False
    _startup_frozen = True
    gc.collect()
    gc.freeze()
    return True


@contextmanager
def collector_paused(enabled: bool = True) -> Iterator[None]:
    """No automatic full (oldest-generation) collection inside the block; young collections go
    on. Nestable; restores the thresholds it found unless they were changed meanwhile."""
    global _depth, _saved
    if not enabled:
        yield
        return
    if _depth == 0:
        _saved = gc.get_threshold()
        gc.set_threshold(_saved[0], _saved[1], _OUT_OF_REACH)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _saved is not None:
            if gc.get_threshold()[2] == _OUT_OF_REACH:
                gc.set_threshold(*_saved)
            _saved = None


def promote_survivors() -> bool:
    """Move every tracked object into the permanent generation (``gc.freeze()``, no walk); True
    if it froze. Every ``FULL_COLLECTION_EVERY``-th call in the process unfreezes instead, so a
    full collection later frees garbage cycles among frozen objects (see the module docstring).
    A collector the user disabled is left alone."""
    global _promotions
    if not gc.isenabled():
        return False
    _promotions += 1
    if _promotions % FULL_COLLECTION_EVERY == 0:
        gc.unfreeze()
        return False
    gc.freeze()
    return True


_blocks = 0
"""How many ``records_promoted`` blocks run now, in every thread of the process."""
_blocks_lock = threading.Lock()


@contextmanager
def records_promoted() -> Iterator[None]:
    """No collection at all inside the block (meant for one short, synchronous build of
    acyclic records), then everything young promoted (``gc.freeze()``), so the young
    generations are empty and their count zero when it ends (module docstring).

    Blocks of several threads overlap (a host's export thread beside its loop's cut slices):
    the collector stays off until the last one running ends, which promotes. A collector the
    user switched off (off with no block running) is left off and nothing is frozen."""
    global _blocks
    with _blocks_lock:
        if _blocks == 0 and not gc.isenabled():
            ours = False
        else:
            ours = True
            _blocks += 1
            gc.disable()
    if not ours:
        yield
        return
    try:
        yield
    finally:
        with _blocks_lock:
            _blocks -= 1
            if _blocks == 0:
                gc.enable()
                gc.freeze()
