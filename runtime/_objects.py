"""Content-addressed objects shared between snapshots: what lets a checkpoint write only what
changed.

Layout
------
An object store is a directory (a snapshot root's ``objects/``)::

    objects/sha256/<first two hex digits>/<the 64 hex digits>

Each file holds exactly the bytes whose sha256 is its name. An object is written once (a temp
file in the same directory, fsynced, renamed into place) and never changed after; a reference
to it is the string ``"sha256:<64 hex digits>"`` (``object_ref``). Two writers of the same
bytes race harmlessly: both renames put the same content in place.

What is durable when
--------------------
``put_bytes`` and ``put_file`` fsync the object's bytes before the rename and record every
directory whose entries changed in the caller's ``dirty`` set; ``sync(dirty)`` fsyncs those
directories. A caller names an object in anything it publishes only after ``sync``: so a crash
never leaves a published reference to an object that is not durable.

Snapshots link what they reference
----------------------------------
``SnapshotObjects`` is how a snapshot being built gets its objects: each goes into the root's
shared store first (bytes written only if no earlier snapshot stored them: fsynced, renamed),
then is hard-linked into the snapshot directory's own ``objects/`` (same layout). So a snapshot
directory holds every object it references (a copy of the directory is complete and verifies
offline) while the bytes exist once on disk, and the file system's link counts say which
objects some snapshot still references. Where a link cannot be made (another file system, a
file system without hard links) the object is copied instead.

Objects are removed only by the snapshot store's sweep, which deletes a shared object no
snapshot links any more (see ``runtime._store``); nothing here deletes.

All I/O here is blocking; async callers run it in a thread.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "OBJECTS_DIR",
    "OBJECT_REF_RE",
    "ObjectStore",
    "SnapshotObjects",
    "object_ref",
    "parse_object_ref",
]

OBJECTS_DIR: Final = "objects"
"""The object store's directory in a snapshot root."""
_ALGORITHM: Final = "sha256"
OBJECT_REF_RE: Final = re.compile(r"sha256:([0-9a-f]{64})")
"""A reference to an object: ``sha256:`` and the 64 lowercase hex digits of its digest."""
_HEX_RE: Final = re.compile(r"[0-9a-f]{64}")
_CHUNK: Final = 1 << 20
_SYNC_THREADS: Final = 16
_PARALLEL_SYNC_MIN: Final = 8


def object_ref(hexdigest: str) -> str:
    """The reference naming the object whose sha256 is ``hexdigest``."""
    if not _HEX_RE.fullmatch(hexdigest):
        raise ValueError(f"{hexdigest!r} is not a sha256 hex digest (64 lowercase hex digits)")
    return f"{_ALGORITHM}:{hexdigest}"


def parse_object_ref(ref: object) -> str:
    """The hex digest ``ref`` names; ``ValueError`` saying what a reference looks like if
    ``ref`` is not one (it came from a file: nothing is trusted)."""
    if not isinstance(ref, str) or not (m := OBJECT_REF_RE.fullmatch(ref)):
        raise ValueError(f"{ref!r} is not an object reference ('sha256:' and 64 hex digits)")
    return m.group(1)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.frozen(slots=True)
class ObjectStore:
    """The objects under ``root`` (a snapshot root's ``objects/``).

    Invariant: a file at ``path(h)`` holds bytes whose sha256 is ``h``, unless something outside
    gymckpt changed it (``problem`` finds that). Objects are immutable: nothing here opens one
    for writing after its rename."""

    root: Path = attrs.field(converter=Path)

    @classmethod
    def of_snapshot_root(cls, snapshot_root: Path) -> ObjectStore:
        """The store shared by the snapshots under ``snapshot_root``."""
        return cls(Path(snapshot_root) / OBJECTS_DIR)

    def path(self, ref: str) -> Path:
        """Where the object ``ref`` (a reference, see ``object_ref``) lives."""
        h = parse_object_ref(ref)
        return self.root / _ALGORITHM / h[:2] / h

    def has(self, ref: str) -> bool:
        return self.path(ref).is_file()

    def refs(self) -> Iterator[str]:
        """Every object present (temp files of an interrupted write left out)."""
        top = self.root / _ALGORITHM
        if not top.is_dir():
            return
        for fan in sorted(top.iterdir()):
            if not fan.is_dir():
                continue
            for entry in sorted(fan.iterdir()):
                if _HEX_RE.fullmatch(entry.name) and entry.name[:2] == fan.name:
                    yield object_ref(entry.name)

    def put_bytes(self, data: bytes, dirty: set[Path]) -> str:
        """Store ``data`` (unless present); its reference. Directories to fsync go in
        ``dirty``."""
        ref = object_ref(hashlib.sha256(data).hexdigest())
        final = self.path(ref)
        if final.is_file():
            return ref
        self._place(final, dirty, lambda fd: _write_all(fd, data))
        return ref

    def put_file(self, source: Path, ref: str, dirty: set[Path]) -> str:
        """Store the file ``source``, whose content the caller says is the object ``ref``
        (unless present). It is hard-linked when it can be (same file system; both sides
        treat it as immutable), else copied; the bytes placed are hashed and must be ``ref``,
        else ``ValueError`` and nothing is placed."""
        final = self.path(ref)
        if final.is_file():
            return ref
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".in.{secrets.token_hex(8)}.tmp"
        try:
            try:
                os.link(source, tmp, follow_symlinks=False)
            except OSError:
                _copy(source, tmp)
            got = _hash_file(tmp)
            if object_ref(got) != ref:
                raise ValueError(f"{source} holds sha256:{got}, not {ref}: not stored")
            self._rename(tmp, final, dirty)
        finally:
            tmp.unlink(missing_ok=True)
        return ref

    def read(self, ref: str) -> bytes:
        """The object's bytes, checked against its name (``ValueError`` if they differ)."""
        data = self.path(ref).read_bytes()
        if object_ref(hashlib.sha256(data).hexdigest()) != ref:
            raise ValueError(f"object {ref} does not hold the bytes it names (changed on disk)")
        return data

    def problem(self, ref: str) -> str | None:
        """What is wrong with object ``ref`` (missing, or bytes that do not match), or None."""
        path = self.path(ref)
        if not path.is_file():
            return f"object {ref} is missing ({path})"
        got = object_ref(_hash_file(path))
        if got != ref:
            return f"object {ref} holds {got}: changed on disk"
        return None

    @staticmethod
    def sync(dirty: set[Path]) -> None:
        """fsync every directory in ``dirty`` (deepest first: a level's directories together,
        in a few threads, since a file system commits concurrent fsyncs in one go) and empty
        it."""
        levels: dict[int, list[Path]] = {}
        for d in dirty:
            levels.setdefault(len(d.parts), []).append(d)
        for depth in sorted(levels, reverse=True):
            batch = levels[depth]
            if len(batch) < _PARALLEL_SYNC_MIN:
                for d in batch:
                    _fsync_dir(d)
                continue
            with ThreadPoolExecutor(max_workers=_SYNC_THREADS) as pool:
                list(pool.map(_fsync_dir, batch))  # raises the first error
        dirty.clear()

    def _place(self, final: Path, dirty: set[Path], write: object) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".in.{secrets.token_hex(8)}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444
        )
        try:
            try:
                write(fd)  # type: ignore[operator]
                os.fsync(fd)
            finally:
                os.close(fd)
            self._rename(tmp, final, dirty)
        finally:
            tmp.unlink(missing_ok=True)

    def _rename(self, tmp: Path, final: Path, dirty: set[Path]) -> None:
        os.replace(tmp, final)
        dirty.add(final.parent)
        dirty.add(final.parent.parent)  # a new fan-out directory's entry
        dirty.add(self.root)


@attrs.define(eq=False, slots=True)
class SnapshotObjects:
    """The objects of one snapshot being built (module docstring): ``own`` is the snapshot
    directory's ``objects/``, ``shared`` the root's store (None: a snapshot outside any
    store, whose objects are written straight into ``own``).

    Invariant: once ``put_bytes``/``put_file`` returned a reference, ``own`` holds the object
    (a link to the shared one, or a copy); it is durable once ``sync`` returned. Not
    thread-safe: one caller per writer (the participant records of one instance); ``put_all``
    uses threads of its own."""

    own: ObjectStore
    shared: ObjectStore | None
    dirty: set[Path] = attrs.field(factory=set)

    @classmethod
    def of_snapshot(cls, snapshot: Path, shared: ObjectStore | None) -> SnapshotObjects:
        """The objects of the snapshot directory ``snapshot``, shared through ``shared``."""
        return cls(ObjectStore(Path(snapshot) / OBJECTS_DIR), shared)

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` as an object of the snapshot; its reference."""
        if self.shared is None:
            return self.own.put_bytes(data, self.dirty)
        for _ in range(_RETRIES):
            ref = self.shared.put_bytes(data, self.dirty)
            if self._link(ref):
                return ref
        return self.own.put_bytes(data, self.dirty)  # swept each time: a copy of its own

    def put_all(self, datas: Sequence[bytes]) -> list[str]:
        """``put_bytes`` of each of ``datas``, in order; their references. Many are placed
        together in a few threads: each new object is fsynced before its rename, and a file
        system commits concurrent fsyncs in one go."""
        if len(datas) < _PARALLEL_SYNC_MIN:
            return [self.put_bytes(d) for d in datas]
        with ThreadPoolExecutor(max_workers=_SYNC_THREADS) as pool:
            placed = list(pool.map(self._put_alone, datas))  # raises the first error
        for _, dirty in placed:
            self.dirty |= dirty
        return [ref for ref, _ in placed]

    def _put_alone(self, data: bytes) -> tuple[str, set[Path]]:
        """``put_bytes`` with a ``dirty`` set of its own (one per thread)."""
        alone = SnapshotObjects(self.own, self.shared)
        return alone.put_bytes(data), alone.dirty

    def put_file(self, source: Path, ref: str) -> str:
        """Store the file ``source``, which must hold the object ``ref`` (``ValueError`` if
        it does not), as an object of the snapshot."""
        if self.shared is None:
            return self.own.put_file(source, ref, self.dirty)
        for _ in range(_RETRIES):
            self.shared.put_file(source, ref, self.dirty)
            if self._link(ref):
                return ref
        return self.own.put_file(source, ref, self.dirty)

    def sync(self) -> None:
        """fsync every directory the puts changed: what they placed is durable."""
        ObjectStore.sync(self.dirty)

    def _link(self, ref: str) -> bool:
        """Link the shared object ``ref`` into ``own`` (or copy it where no link can be
        made); False if the shared object vanished meanwhile (swept: put it again)."""
        assert self.shared is not None
        final = self.own.path(ref)
        if final.is_file():
            return True
        final.parent.mkdir(parents=True, exist_ok=True)
        source = self.shared.path(ref)
        try:
            os.link(source, final, follow_symlinks=False)
        except FileExistsError:
            return True
        except FileNotFoundError:
            return False
        except OSError:  # EXDEV, EPERM, EMLINK: a copy, checked as it is placed
            if not source.is_file():
                return False
            self.own.put_file(source, ref, self.dirty)
            return True
        self.dirty.update((final.parent, final.parent.parent, self.own.root))
        return True


_RETRIES: Final = 3


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _copy(source: Path, tmp: Path) -> None:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444
        )
        try:
            while chunk := os.read(fd, _CHUNK):
                _write_all(out, chunk)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)
