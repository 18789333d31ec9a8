"""gymckpt.runtime.lowlevel: what a backend author may use beyond ``gymckpt.runtime``.

A backend author writes a ``GymBackend`` (a deployment of Gym instances) or an environment
that runs on one. Beside the records a backend returns and the error family (in
``gymckpt.runtime``), such code may need the runtime's own tools, and these are public,
documented API, stable like the front door (as ``trio.lowlevel`` is trio's):

- errors that cross a process: ``crossable_error`` (an error as it may leave a backend:
  itself if it pickles, else a retryable ``GymCheckpointUnavailable`` naming it),
  ``crossing_boundary`` (a block every ``Exception`` leaves pickle-safe) and
  ``unpicklable_error`` (what stands in for an error the other side could not send);
- plain data: ``checked_json`` (the canonical JSON bytes of a state or reply, or
  ``NotPlainData`` naming the first value that is not plain) and ``plain_problem`` (that
  problem as text, or None);
- files a commit writes: ``write_atomic`` (a file that is either old or new after a crash)
  and ``fsync_dir`` (a directory's entries made durable);
- objects shared between snapshots: ``ObjectStore`` (content-addressed, immutable files in a
  snapshot root's ``objects/``), ``SnapshotObjects`` (a snapshot's own objects, linked from
  the shared store), ``object_ref`` and ``parse_object_ref`` (the ``sha256:<hex>`` strings
  that name them);
- the garbage collector around a checkpoint: ``collector_paused`` (full collections deferred
  while a checkpoint runs) and ``promote_survivors`` (what survived moved out of the
  collector's generations); ``records_promoted`` (records made in bulk with no collection, then
  promoted).

Nothing here is needed by a trainer, and nothing here is re-exported by ``gymckpt.runtime``.
The plumbing gymckpt's own packages share (the work directory's file names, the snapshot's
records and their readers, the converter) is private: ``gymckpt.runtime._shared``.
"""

from __future__ import annotations

from ._collector import collector_paused, promote_survivors, records_promoted
from ._errors import crossable_error, crossing_boundary, unpicklable_error
from ._objects import ObjectStore, SnapshotObjects, object_ref, parse_object_ref
from ._plain import checked_json, plain_problem
from ._store import fsync_dir, write_atomic

__all__ = [
    "ObjectStore",
    "SnapshotObjects",
    "checked_json",
    "collector_paused",
    "crossable_error",
    "crossing_boundary",
    "fsync_dir",
    "object_ref",
    "parse_object_ref",
    "plain_problem",
    "promote_survivors",
    "records_promoted",
    "unpicklable_error",
    "write_atomic",
]
