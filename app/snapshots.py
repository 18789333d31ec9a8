"""``gymckpt snapshots list|prune DIR``: the rollout snapshots of a work directory, offline.

DIR is a trainer's work directory (``snapshots/`` and ``restored/`` in it) or a snapshot root
(the work directory's ``snapshots/``, or one of its own elsewhere).

Pruning takes the lock of the work directory DIR belongs to, whatever form DIR has — the work
directory, its ``snapshots/`` or ``restored/``, or one snapshot in them (``workdir_of``) — so it
never runs beside a trainer (which prunes by itself, and whose running checkpoint's staging
directory a prune would delete): with a trainer there it stops, exit 2, naming the trainer's
pid. A snapshot root that belongs to no work directory is locked itself. ``--keep`` is at least
1; removing every snapshot takes ``--all``. A copy under ``restored/`` is pinned — a restore
made it and works from it — and is never pruned here; a running trainer removes its
predecessors' copies.

Listing reads only commit markers and takes no lock: it is safe beside a running trainer (a
snapshot the trainer prunes meanwhile is simply not listed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from gymckpt.runtime import ManifestError, SnapshotInfo, SnapshotStore, WorkDirLock, workdir_of
from gymckpt.runtime._shared import COMMIT_MARKER, RESTORED_DIR, SNAPSHOTS_DIR, tree_size

__all__ = ["list_snapshots", "prune_snapshots"]


@attrs.frozen
class _Target:
    """What DIR names: the store to list or prune, the pinned copies, the lock to take."""

    path: Path
    store: SnapshotStore
    restored: Path | None
    lock_dir: Path
    """The work directory DIR belongs to (or DIR itself if it belongs to none)."""
    refused: str | None
    """Why pruning DIR makes no sense (one snapshot, the restore copies), or None."""


def _target(raw: str) -> _Target:
    path = Path(raw)
    if not path.is_dir():
        raise ManifestError(f"{path}: no such directory")
    workdir = workdir_of(path)
    lock_dir = workdir if workdir is not None else path
    here = path.resolve()
    if (path / SNAPSHOTS_DIR).is_dir() or here == workdir:
        return _Target(
            path, SnapshotStore(path / SNAPSHOTS_DIR), path / RESTORED_DIR, lock_dir, None
        )
    restored = workdir / RESTORED_DIR if workdir is not None else None
    if (path / COMMIT_MARKER).exists() or path.name.startswith("ckpt-"):
        return _Target(
            path,
            SnapshotStore(path),
            None,
            lock_dir,
            f"{path} is one snapshot; prune takes its work directory or snapshot root",
        )
    if workdir is not None and here == workdir / RESTORED_DIR:
        return _Target(
            path,
            SnapshotStore(path),
            None,
            lock_dir,
            f"{path} holds the copies restores work from (pinned); prune the work "
            f"directory {workdir} instead",
        )
    return _Target(path, SnapshotStore(path), restored, lock_dir, None)


def _row(info: SnapshotInfo, pinned: bool) -> dict[str, Any]:
    return {
        "name": info.path.name,
        "path": str(info.path),
        "checkpoint_id": info.checkpoint_id,
        "seq": info.seq,
        "bytes": tree_size(info.path),
        "pinned": pinned,
    }


def _listing(target: _Target) -> dict[str, Any]:
    rows = [_row(info, False) for info in target.store.list_complete()]
    restored = target.restored
    if restored is not None and restored.is_dir():
        rows += [_row(info, True) for info in SnapshotStore(restored).list_complete()]
    return {"dir": str(target.path), "snapshots": rows}


def _print_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        where = f"{RESTORED_DIR}/{r['name']} (pinned)" if r["pinned"] else r["name"]
        print(f"{where:<28} {r['checkpoint_id']:<12} {r['bytes'] / 2**20:9.2f} MiB")


def list_snapshots(raw: str, as_json: bool) -> int:
    """``gymckpt snapshots list DIR``: every complete snapshot, oldest first, then pinned copies."""
    listing = _listing(_target(raw))
    if as_json:
        print(json.dumps(listing, sort_keys=True))
    elif not listing["snapshots"]:
        print(f"no complete rollout snapshot in {listing['dir']}")
    else:
        _print_rows(listing["snapshots"])
    return 0


def prune_snapshots(raw: str, keep: int | None, as_json: bool, every: bool = False) -> int:
    """``gymckpt snapshots prune DIR --keep N`` (N >= 1): all but the newest N snapshots go;
    ``--all``: every snapshot goes. Refused while a trainer holds DIR's work directory."""
    if every and keep is not None:
        raise ValueError("--keep and --all exclude each other")
    if every:
        keep = 0
    elif keep is None:
        raise ValueError("say how many snapshots to keep (--keep N), or --all")
    elif keep < 1:
        raise ValueError(
            f"--keep must be >= 1, got {keep}: --keep 0 would remove every "
            "snapshot; say --all to mean that"
        )
    target = _target(raw)
    lock = WorkDirLock(target.lock_dir)
    lock.acquire()  # WorkDirLocked (exit 2) while a trainer runs there
    try:
        if target.refused is not None:
            raise ValueError(target.refused)
        removed = [p for p in target.store.prune(keep) if p.name.startswith("ckpt-")]
    finally:
        lock.release()
    listing = _listing(target)
    if as_json:
        print(json.dumps({**listing, "removed": [str(p) for p in removed]}, sort_keys=True))
    else:
        for p in removed:
            print(f"removed {p.name}")
        kept = [r for r in listing["snapshots"] if not r["pinned"]]
        print(
            f"kept {len(kept)} snapshot(s)"
            f"{' (' + ', '.join(r['name'] for r in kept) + ')' if kept else ''}"
        )
    return 0
