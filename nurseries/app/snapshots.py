"""``gymckpt snapshots list|prune DIR``: the rollout snapshots of a work directory, offline.

DIR is a trainer's work directory (``snapshots/`` and ``restored/`` in it) or a snapshot root.
Listing reads only commit markers. Pruning takes the work directory's lock first, so it never
races a running trainer (which prunes by itself): with a trainer on DIR it stops, exit 2,
naming the trainer's pid. A copy under ``restored/`` is pinned — a restore made it and works
from it — and is never pruned here; a running trainer removes its predecessors' copies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gymckpt.nurseries import RESTORED_DIR, SNAPSHOTS_DIR
from gymckpt.runtime import ManifestError, SnapshotInfo, SnapshotStore, WorkDirLock, tree_size

__all__ = ["list_snapshots", "prune_snapshots"]


def _roots(raw: str) -> tuple[Path, SnapshotStore, Path | None]:
    path = Path(raw)
    if not path.is_dir():
        raise ManifestError(f"{path}: no such directory")
    if (path / SNAPSHOTS_DIR).is_dir():
        return path, SnapshotStore(path / SNAPSHOTS_DIR), path / RESTORED_DIR
    return path, SnapshotStore(path), None


def _row(info: SnapshotInfo, pinned: bool) -> dict[str, Any]:
    return {"name": info.path.name, "path": str(info.path), "checkpoint_id": info.checkpoint_id,
            "seq": info.seq, "bytes": tree_size(info.path), "pinned": pinned}


def _listing(raw: str) -> dict[str, Any]:
    path, store, restored = _roots(raw)
    rows = [_row(info, False) for info in store.list_complete()]
    if restored is not None and restored.is_dir():
        rows += [_row(info, True) for info in SnapshotStore(restored).list_complete()]
    return {"dir": str(path), "snapshots": rows}


def _print_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        where = f"{RESTORED_DIR}/{r['name']} (pinned)" if r["pinned"] else r["name"]
        print(f"{where:<28} {r['checkpoint_id']:<12} {r['bytes'] / 2**20:9.2f} MiB")


def list_snapshots(raw: str, as_json: bool) -> int:
    """``gymckpt snapshots list DIR``: every complete snapshot, oldest first, then pinned copies."""
    listing = _listing(raw)
    if as_json:
        print(json.dumps(listing, sort_keys=True))
    elif not listing["snapshots"]:
        print(f"no complete rollout snapshot in {listing['dir']}")
    else:
        _print_rows(listing["snapshots"])
    return 0


def prune_snapshots(raw: str, keep: int, as_json: bool) -> int:
    """``gymckpt snapshots prune DIR --keep N``: all but the newest N snapshots go."""
    if keep < 0:
        raise ValueError(f"--keep must be >= 0, got {keep}")
    path, store, _restored = _roots(raw)
    lock = WorkDirLock(path)
    lock.acquire()  # WorkDirLocked (exit 2) while a trainer runs here
    try:
        removed = [p for p in store.prune(keep) if p.name.startswith("ckpt-")]
    finally:
        lock.release()
    listing = _listing(raw)
    if as_json:
        print(json.dumps({**listing, "removed": [str(p) for p in removed]}, sort_keys=True))
    else:
        for p in removed:
            print(f"removed {p.name}")
        kept = [r for r in listing["snapshots"] if not r["pinned"]]
        print(f"kept {len(kept)} snapshot(s)"
              f"{' (' + ', '.join(r['name'] for r in kept) + ')' if kept else ''}")
    return 0
