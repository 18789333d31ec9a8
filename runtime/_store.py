"""The rollout snapshot store: atomic publish, strict load, offline verify (S8, S13, C6).

What a snapshot is
------------------
A rollout snapshot is one self-contained directory ``<root>/ckpt-NNNNNN``::

    gym_checkpoint.json      the GymManifest (topology, digests, exported episodes)
    ledger.json, ...         other top-level files, given to ``publish`` as bytes
    gym/<instance>/<participant>/...
                             each participant's committed state, written there by Gym
    objects/sha256/<aa>/<hex>
                             the objects the snapshot references: its records' chunks and
                             the objects participants' states name (``runtime._objects``)
    COMMITTED                the commit marker: a JSON CommitMarker naming every top-level
                             file with its sha256

Every path in the manifest is relative to the directory, so a snapshot can be copied, moved and
verified offline.

Incremental snapshots: shared objects, links as reference counts
----------------------------------------------------------------
A checkpoint writes what changed, not everything. A participant's records are chunks, each an
object (``_snapshot_format``: content-defined boundaries, so an unchanged run of sessions makes
the same chunk bytes again), and a participant may keep objects of its own that its states
name (a sandbox's file blobs). Every object goes first into the root's shared store
``<root>/objects/`` (bytes written, fsynced and renamed only if no snapshot stored them
before), then is hard-linked into the staging snapshot's own ``objects/`` (copied where a link
cannot be made). So:

- a snapshot directory holds every object it references: ``cp -r``, ``pin`` and
  ``shutil.copytree`` copy them, and it verifies and restores offline, anywhere;
- the bytes of an object exist once on the file system, however many snapshots link it;
- pruning deletes snapshot directories; the link counts are the reference counts. After a
  prune, the sweep deletes each shared object whose link count is 1 (no snapshot links it).
  The sweep runs in the store's lock, and only when this store has no staging directory
  open (``begin`` adds one under the same lock, ``publish``/``abort`` remove it): nothing is
  being linked meanwhile. An object already linked into a staging directory has a link count
  of 2 and is never swept whatever happens; one put into the shared store but not linked yet
  (a Gym outliving its trainer, a prune by another process) is put again if it vanished
  (``SnapshotObjects``). A shared object that a participant's own store links too (its link
  count stays above 1) is kept until the participant drops it.

``publish`` reports what the checkpoint wrote (``PublishStats``): bytes of the files only this
snapshot has (its own files, and objects no other snapshot or store links), and how many
objects it links that were there before.

What "complete" means
---------------------
A directory is a complete snapshot iff it holds a valid ``COMMITTED`` marker. The marker is the
last thing written, and a snapshot is built under ``<root>/.staging-<checkpoint_id>`` (which
nothing lists) and becomes visible by one ``rename``. Every file is fsynced before the marker is
written, the marker before the rename, the root after it. So a crash at any point leaves either
no new complete snapshot or a complete one, never a half-written one that looks complete.
Pruning renames a snapshot out of the ``ckpt-`` namespace before deleting it, for the same
reason.

The chain of trust on load: the marker's sha256 covers every top-level file, including the
manifest; the manifest's records digests cover each participant's ``records.json``, whose
references name its chunks (and the objects its states name) by their sha256. ``load_snapshot``
checks the first link and the manifest's structure; ``verify_snapshot`` the others (every
reference present, every object holding the bytes its name says), and the live topology.
Snapshot data is JSON through the library's converter, never pickle.

All I/O here is blocking; async callers run it with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Final, TypeVar, final

import attrs

from ._errors import ManifestError, TopologyMismatch, TrainerFilesRefused
from ._objects import OBJECT_REF_RE, OBJECTS_DIR, ObjectStore
from ._slices import pairs_in_slices, set_in_slices
from ._snapshot_format import (
    CHECKPOINT_SEQ_FILE,
    COMMIT_MARKER,
    GYM_STATE_DIR,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    MARKER_VERSION,
    OBJECTS_KEY,
    PARTICIPANT_KIND_RE,
    PARTICIPANT_KINDS,
    PIN_TMP_PREFIX,
    PRUNING_PREFIX,
    READ_MANIFEST_VERSIONS,
    RECORDS_FILE,
    SNAPSHOT_PREFIX,
    SNAPSHOT_RE,
    STAGING_PREFIX,
    TRAINER_FILES_DIR,
    CommitMarker,
    CommittedRecords,
    EpisodeColumns,
    GymManifest,
    ParticipantRecord,
    dump_manifest,
    dump_marker,
    load_manifest,
    load_marker,
    load_records,
    read_chunk,
    records_chunk_refs,
)
from ._topology import topology_differences

__all__ = [
    "COMMIT_MARKER",
    "GYM_STATE_DIR",
    "MARKER_VERSION",
    "TRAINER_FILES_DIR",
    "CommitMarker",
    "LoadedSnapshot",
    "PublishStats",
    "SnapshotInfo",
    "SnapshotStore",
    "check_snapshot",
    "fsync_dir",
    "load_snapshot",
    "object_problems",
    "own_trainer_files",
    "participant_state_problem",
    "read_snapshot_records",
    "records_digest",
    "trainer_entries_problems",
    "trainer_files_problems",
    "tree_size",
    "verify_snapshot",
    "write_atomic",
]

R = TypeVar("R", bound=CommittedRecords)
_DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
_RESERVED_NAMES: Final = frozenset(
    {COMMIT_MARKER, MANIFEST_NAME, GYM_STATE_DIR, TRAINER_FILES_DIR, OBJECTS_DIR}
)
_CHUNK: Final = 1 << 20


# -- low-level durable writes ------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """fsync directory ``path`` so the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old file or the new one.

    Writes a temp file in the same directory, flushes and fsyncs it, ``os.replace``s it over
    ``path`` and fsyncs the directory. On any error the temp file is removed. The temp file has
    a random name and is created ``O_EXCL | O_NOFOLLOW``: never an existing file, never through
    a symbolic link planted in the directory. ``mode``: the file's exact permissions from its
    creation on, whatever the umask (``0o600`` for a secret); None: ``0o644`` less the umask.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _fsync_tree(top: Path) -> None:
    """fsync every regular file and every directory under ``top`` (symlinks not followed)."""
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            file = Path(dirpath, name)
            if stat.S_ISREG(file.lstat().st_mode):
                _fsync_file(file)
        fsync_dir(Path(dirpath))


def _entry_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def _copy_over(source: Path, entry: Path) -> None:
    """Replace ``entry`` (a link, or a file that shares its inode) by a copy of ``source``'s
    bytes, atomically: a temp file next to it, then ``os.replace``."""
    tmp = entry.with_name(f".{entry.name}.{secrets.token_hex(6)}.tmp")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, entry)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def own_trainer_files(top: Path) -> int:
    """Make every file under ``top`` (the snapshot's ``trainer/``) a regular file of its own.

    A symbolic link to a regular file is replaced by a copy of that file's bytes, and a file
    that shares its inode with another path (a hard link) by a copy of itself: otherwise editing
    the target after the commit would change what the snapshot hands back, unseen (a link is
    digested by its target string). Anything else that is not a directory or a regular file (a
    link to a directory or to nothing, a fifo, socket or device) is ``TrainerFilesRefused``,
    naming the entry. Returns how many entries were replaced by copies.
    """
    copied = 0
    for dirpath, dirnames, filenames in os.walk(top):  # links are listed, never followed
        for name in sorted((*dirnames, *filenames)):
            entry = Path(dirpath, name)
            rel = f"{TRAINER_FILES_DIR}/{entry.relative_to(top).as_posix()}"
            st = entry.lstat()
            if stat.S_ISDIR(st.st_mode):
                continue
            if stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    _copy_over(entry, entry)
                    copied += 1
                continue
            if not stat.S_ISLNK(st.st_mode):
                raise TrainerFilesRefused(
                    f"{rel}: a {_entry_kind(st.st_mode)}, not a regular file; the trainer's "
                    "files must be regular files (and directories)"
                )
            target = os.readlink(entry)
            try:
                followed = entry.stat()
            except OSError:
                raise TrainerFilesRefused(
                    f"{rel}: a symbolic link to {target!r}, which does not exist; write the "
                    "file itself into the directory"
                ) from None
            if not stat.S_ISREG(followed.st_mode):
                raise TrainerFilesRefused(
                    f"{rel}: a symbolic link to {target!r}, a "
                    f"{_entry_kind(followed.st_mode)}; write the files themselves into the "
                    "directory (shutil.copytree for a directory)"
                )
            _copy_over(entry, entry)  # copyfile follows the link: the target's bytes
            copied += 1
    return copied


def trainer_entries_problems(top: Path, limit: int = 5) -> list[str]:
    """Entries under ``top`` (a snapshot's ``trainer/``) that are not regular files or
    directories, one line each (at most ``limit``, then a count): what ``verify`` refuses."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted((*dirnames, *filenames)):
            entry = Path(dirpath, name)
            rel = f"{TRAINER_FILES_DIR}/{entry.relative_to(top).as_posix()}"
            try:
                mode = entry.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                found.append(
                    f"{rel}: a symbolic link (to {os.readlink(entry)!r}) in the "
                    "trainer's files: what it points to can change after the commit"
                )
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(
                    f"{rel}: a {_entry_kind(mode)} in the trainer's files, not a regular file"
                )
    if len(found) > limit:
        found = [
            *found[:limit],
            f"{TRAINER_FILES_DIR}/: and {len(found) - limit} more such entries",
        ]
    return found


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed, vanished ones skipped)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def participant_state_problem(root: Path, participant: ParticipantRecord, where: str) -> str | None:
    """Why ``participant``'s committed state under ``root`` cannot be trusted, or None.

    The one check both sides make (S8): the runtime before it asks Gym to restore, and Gym
    before it installs anything. The state directory must stay inside ``root`` (no empty,
    absolute or ``..`` path, no symlink out), exist, and carry the committed records digest.
    """
    outside = state_dir_problem(participant.state_dir, root)
    if outside is not None:
        return f"{where} state directory {outside}"
    try:
        found = records_digest(root / participant.state_dir)
    except OSError:
        return f"{where} state directory {participant.state_dir} missing on disk"
    if found != participant.records_digest:
        return (
            f"{where} digest {_short(found)} on disk, "
            f"{_short(participant.records_digest)} committed"
        )
    return None


def read_snapshot_records(
    snapshot: Path, state_dir: str, expect: type[R] | None = None
) -> CommittedRecords:
    """The records of the participant whose state directory is ``state_dir`` in the snapshot
    directory ``snapshot`` (``load_records``, its chunks from the snapshot's own
    ``objects/``); ``OSError`` if the file is missing, ``ManifestError`` if it is bad."""
    what = f"{state_dir}/{RECORDS_FILE}"
    data = (Path(snapshot) / what).read_bytes()
    own = ObjectStore(Path(snapshot) / OBJECTS_DIR)
    if expect is None:
        return load_records(data, what, objects=own)
    return load_records(data, what, expect, objects=own)


def _short(hexdigest: str) -> str:
    """``sha256:0123456789ab…`` / ``0123456789ab…``: enough to tell two digests apart."""
    head, sep, tail = hexdigest.rpartition(":")
    return f"{head}{sep}{tail[:12]}…"


def records_digest(state_dir: Path) -> str:
    """``"sha256:<hex>"`` over a participant's state directory, deterministic and streaming.

    Covers every regular file under ``state_dir`` in sorted relative POSIX path order: for each,
    the path bytes, a NUL, then the sha256 of its content, so renaming, moving, adding or
    removing a file changes the digest as surely as editing one. Symlinks are never followed;
    one is covered by its target string. Directories themselves (empty ones included) are not
    covered. Raises ``FileNotFoundError`` / ``NotADirectoryError`` if ``state_dir`` is not a
    directory. Gym uses this same function for the digests in its commit replies.
    """
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        if state_dir.exists():
            raise NotADirectoryError(f"state directory {state_dir} is not a directory")
        raise FileNotFoundError(f"state directory {state_dir} does not exist")
    entries: list[tuple[str, Path]] = []
    for dirpath, _dirnames, filenames in os.walk(state_dir):
        for name in filenames:
            file = Path(dirpath, name)
            entries.append((file.relative_to(state_dir).as_posix(), file))
    entries.sort(key=lambda e: e[0].encode())
    outer = hashlib.sha256()
    for rel, file in entries:
        mode = file.lstat().st_mode
        if stat.S_ISLNK(mode):
            inner = hashlib.sha256(b"symlink\0" + os.fsencode(os.readlink(file)))
        elif stat.S_ISREG(mode):
            inner = hashlib.sha256()
            with open(file, "rb") as f:
                while chunk := f.read(_CHUNK):
                    inner.update(chunk)
        else:
            continue
        outer.update(rel.encode() + b"\0" + inner.digest())
    return f"sha256:{outer.hexdigest()}"


# -- records -------------------------------------------------------------------------------


@attrs.frozen
class PublishStats:
    """What one checkpoint wrote into the snapshot root (``SnapshotStore.publish``).

    ``bytes_written``: bytes of the snapshot's files that no other snapshot or store on the
    file system links (its top-level files, records, trainer files, and the objects that are
    new with it: their bytes were written for this checkpoint); ``objects_linked``: objects it
    links that another snapshot (or a participant's own store) held already, no bytes written;
    ``objects_new``: objects whose bytes are new with it."""

    bytes_written: int
    objects_linked: int
    objects_new: int


@attrs.frozen
class SnapshotInfo:
    """A complete snapshot on disk: where it is, which checkpoint, its sequence number.
    ``stats``: what its checkpoint wrote, on the one ``publish`` returned (None when listed)."""

    path: Path
    checkpoint_id: str
    seq: int
    stats: PublishStats | None = attrs.field(default=None, eq=False)


@attrs.frozen
class LoadedSnapshot:
    """A snapshot that passed ``load_snapshot``: marker checked, manifest validated.

    ``files`` holds every top-level file named by the marker except the manifest.
    """

    path: Path
    manifest: GymManifest
    files: dict[str, bytes]
    marker: CommitMarker


def _check_plain_name(name: str, what: str) -> None:
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or name != name.strip()
    ):
        raise ValueError(f"{what} {name!r} must be a plain file name")


def _read_marker(path: Path) -> CommitMarker | None:
    """The marker of ``path``, or None if it has none or an invalid one."""
    try:
        return load_marker((path / COMMIT_MARKER).read_bytes())
    except (OSError, ManifestError):
        return None


# -- the store -----------------------------------------------------------------------------


@final
@attrs.define(eq=False, slots=True)
class SnapshotStore:
    """Rollout snapshots under ``root``: staging, atomic publish, listing, pinning, pruning.

    Invariants:

    - only directories named ``ckpt-NNNNNN`` with a valid ``COMMITTED`` marker are listed;
    - sequence numbers grow: a new snapshot gets 1 + the highest ``ckpt-`` seq present (or
      published by this store);
    - ``prune`` never removes a snapshot in ``protect`` or pinned by this store, nor a staging
      directory that this store's ``begin`` created and that is not yet published or aborted.

    Methods are blocking and thread-safe (one lock around the namespace of ``root``).
    """

    root: Path = attrs.field(converter=Path)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _pinned: set[Path] = attrs.field(factory=set, init=False)
    _staging: set[Path] = attrs.field(factory=set, init=False)
    _sealed: dict[Path, str] = attrs.field(factory=dict, init=False)
    _last_seq: int = attrs.field(default=0, init=False)

    # -- writing ---------------------------------------------------------------------------

    def begin(self, checkpoint_id: str) -> Path:
        """Create a fresh, empty staging directory for ``checkpoint_id`` and return it.

        A leftover staging directory of the same id is removed first. ``<staging>/gym`` is
        created too: Gym commits each participant's state into it before ``publish``.
        """
        _check_plain_name(checkpoint_id, "checkpoint id")
        staging = self.root / f"{STAGING_PREFIX}{checkpoint_id}"
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            if staging.exists() or staging.is_symlink():
                _remove(staging)
            try:
                staging.mkdir()
                (staging / GYM_STATE_DIR).mkdir()
            except BaseException:  # a full disk leaves nothing behind
                _remove(staging)
                raise
            self._staging.add(staging)
        return staging

    def publish(
        self,
        staging: Path,
        manifest: GymManifest,
        files: Mapping[str, bytes],
        *,
        on_write: Callable[[str], None] | None = None,
    ) -> SnapshotInfo:
        """Make ``staging`` a complete snapshot ``ckpt-{seq:06d}`` and return where it is.

        Order (each step durable before the next): every file in ``files``, then the manifest,
        written atomically; every file and directory under ``staging/gym`` fsynced; the
        ``COMMITTED`` marker; the rename to ``ckpt-{seq:06d}``; an fsync of ``root``.

        Raises ``ValueError`` on a bad file name, a staging directory this store does not own,
        or a manifest whose ``checkpoint_id`` is not the one staged. The manifest's structure
        is validated as ``load_snapshot`` would (``ManifestError``), so nothing is published
        that could not be loaded; participant digests are not recomputed here.

        ``on_write(name)`` (fault injection only) is called after each top-level file is
        written, the manifest last, before the commit marker: a crash there must leave no new
        complete snapshot.
        """
        staging = Path(staging)
        if staging.parent != self.root or not staging.name.startswith(STAGING_PREFIX):
            raise ValueError(f"{staging} is not a staging directory of {self.root}")
        if staging.name != f"{STAGING_PREFIX}{manifest.checkpoint_id}":
            raise ValueError(
                f"manifest is for checkpoint {manifest.checkpoint_id!r} but {staging.name} "
                "was staged for another"
            )
        if not staging.is_dir():
            raise ValueError(f"staging directory {staging} does not exist")
        for name in files:
            _check_plain_name(name, "snapshot file name")
            if name in _RESERVED_NAMES:
                raise ValueError(f"snapshot file name {name!r} is reserved")
        _validate_manifest(manifest, staging)

        manifest_bytes = dump_manifest(manifest)
        digests: dict[str, str] = {}
        for name, data in files.items():
            write_atomic(staging / name, bytes(data))
            digests[name] = _sha256(data)
            if on_write is not None:
                on_write(name)
        write_atomic(staging / MANIFEST_NAME, manifest_bytes)
        digests[MANIFEST_NAME] = _sha256(manifest_bytes)
        if on_write is not None:
            on_write(MANIFEST_NAME)
        gym_dir = staging / GYM_STATE_DIR
        if gym_dir.is_dir():
            _fsync_tree(gym_dir)
        trees: dict[str, str] = {}
        trainer_dir = staging / TRAINER_FILES_DIR
        sealed = self._sealed.pop(staging, None)
        if sealed is not None:
            trees[TRAINER_FILES_DIR] = sealed
        elif trainer_dir.is_dir() and not trainer_dir.is_symlink():
            trees[TRAINER_FILES_DIR] = self.seal_trainer_files(staging, remember=False)

        with self._lock:
            seq = max(self._last_seq, self._highest_seq()) + 1
            marker = CommitMarker(
                version=MARKER_VERSION,
                checkpoint_id=manifest.checkpoint_id,
                seq=seq,
                files=dict(sorted(digests.items())),
                trees=trees,
            )
            write_atomic(staging / COMMIT_MARKER, dump_marker(marker))
            final_path = self.root / f"{SNAPSHOT_PREFIX}{seq:06d}"
            os.rename(staging, final_path)
            fsync_dir(self.root)
            self._last_seq = seq
            self._staging.discard(staging)
        return SnapshotInfo(final_path, manifest.checkpoint_id, seq, _publish_stats(final_path))

    def seal_trainer_files(self, staging: Path, *, remember: bool = True) -> str:
        """fsync and digest ``staging/trainer`` now; ``publish`` then reuses the digest.

        Weights can be large: sealing them when they are written, before Gym is parked, keeps
        their fsync and sha256 out of the window in which Gym waits for the checkpoint. First
        every file becomes a regular file of the snapshot's own (``own_trainer_files``: a link
        to a file is replaced by a copy of its bytes; a link to a directory or to nothing, or a
        special file, is ``TrainerFilesRefused``).
        """
        trainer_dir = Path(staging) / TRAINER_FILES_DIR
        if trainer_dir.is_symlink():
            raise TrainerFilesRefused(f"{TRAINER_FILES_DIR}/: a symbolic link, not a directory")
        own_trainer_files(trainer_dir)
        _fsync_tree(trainer_dir)
        digest = records_digest(trainer_dir)
        if remember:
            with self._lock:
                self._sealed[Path(staging)] = digest
        return digest

    def reserve_checkpoint_seq(self) -> int:
        """A checkpoint number never handed out before by any store on ``root``, durably.

        Checkpoint ids name Gym's prepare/commit calls and the staging directory, and Gym may
        outlive a trainer process; an id reused by the next incarnation could be confused with
        an old checkpoint. The high-water mark lives in ``<root>/.checkpoint-seq`` (written
        atomically before the number is returned) and never falls below the highest snapshot
        seq or marker seq present, so ids stay unique across incarnations even if the file is
        lost. An ``OSError`` (a full disk) leaves the mark unchanged.
        """
        mark = self.root / CHECKPOINT_SEQ_FILE
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                stored = int(mark.read_text().strip() or 0)
            except (FileNotFoundError, ValueError):
                stored = 0
            seqs = [info.seq for info in self.list_complete()]
            seq = max([stored, self._last_seq, self._highest_seq(), *seqs]) + 1
            write_atomic(mark, f"{seq}\n".encode())
        return seq

    def abort(self, staging: Path) -> None:
        """Remove a staging directory (no error if it is gone)."""
        staging = Path(staging)
        with self._lock:
            self._staging.discard(staging)
            self._sealed.pop(staging, None)
            _remove(staging)

    def _highest_seq(self) -> int:
        highest = 0
        if self.root.is_dir():
            for entry in os.scandir(self.root):
                m = SNAPSHOT_RE.fullmatch(entry.name)
                if m:
                    highest = max(highest, int(m.group(1)))
        return highest

    # -- reading ---------------------------------------------------------------------------

    def list_complete(self) -> list[SnapshotInfo]:
        """Every complete snapshot (valid marker) under ``root``, by ascending seq."""
        if not self.root.is_dir():
            return []
        found: list[SnapshotInfo] = []
        for entry in os.scandir(self.root):
            if not SNAPSHOT_RE.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            marker = _read_marker(path)
            if marker is not None:
                found.append(SnapshotInfo(path, marker.checkpoint_id, marker.seq))
        found.sort(key=lambda info: (info.seq, info.path.name))
        return found

    def latest_complete(self) -> SnapshotInfo | None:
        """The complete snapshot with the highest seq, or None.

        Raises ``ManifestError`` if a ``ckpt-`` directory newer than that one has no valid
        commit marker. A ``ckpt-`` name is only ever given by the rename that follows a durable
        marker, and only taken away by a rename, so such a directory is a published snapshot
        that was damaged, not a crash artefact: restoring an older snapshot instead (or starting
        afresh) would silently lose its work.
        """
        complete = self.list_complete()
        latest = complete[-1] if complete else None
        if self.root.is_dir():
            for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
                m = SNAPSHOT_RE.fullmatch(entry.name)
                if not m or not entry.is_dir(follow_symlinks=False):
                    continue
                if latest is not None and int(m.group(1)) <= latest.seq:
                    continue
                if _read_marker(Path(entry.path)) is None:
                    what = (
                        "no"
                        if not os.path.lexists(Path(entry.path, COMMIT_MARKER))
                        else ("an invalid")
                    )
                    older = latest.path.name if latest is not None else "none"
                    raise ManifestError(
                        f"{entry.path}: newest rollout snapshot has {what} {COMMIT_MARKER} "
                        f"marker (latest complete one: {older}); it was damaged after it was "
                        "published — repair it or move it out of the way to restore an older one"
                    )
        return latest

    # -- retention -------------------------------------------------------------------------

    def pin(self, info: SnapshotInfo, dest: Path) -> SnapshotInfo:
        """Copy the snapshot chosen for restore to ``dest`` and protect the copy (S13).

        The copy is built next to ``dest`` under a temp name, fsynced, then renamed into place,
        so ``dest`` is either absent or complete. Symlinks are copied as links (never followed),
        so a bad link stays detectable. If ``dest`` already holds a complete copy of the same
        checkpoint it is reused. ``dest`` must not sit in the ``ckpt-``/staging namespace of
        ``root``. Raises ``FileExistsError`` if ``dest`` holds anything else, ``ManifestError``
        if ``info`` is no longer a complete snapshot.
        """
        dest = Path(dest)
        if dest.parent.resolve() == self.root.resolve() and (
            SNAPSHOT_RE.fullmatch(dest.name) or dest.name.startswith(".")
        ):
            raise ValueError(f"pin destination {dest.name!r} would collide with the store")
        with self._lock:
            if dest.exists() or dest.is_symlink():
                existing = _read_marker(dest)
                if existing is None or existing.checkpoint_id != info.checkpoint_id:
                    raise FileExistsError(f"pin destination {dest} exists and is not this copy")
                self._pinned.add(dest.resolve())
                return SnapshotInfo(dest, existing.checkpoint_id, existing.seq)
            marker = _read_marker(info.path)
            if marker is None or marker.checkpoint_id != info.checkpoint_id:
                raise ManifestError(
                    f"{info.path}: not a complete rollout snapshot of {info.checkpoint_id}"
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f"{PIN_TMP_PREFIX}{dest.name}.{secrets.token_hex(6)}")
            try:
                shutil.copytree(info.path, tmp, symlinks=True)
                _fsync_tree(tmp)
                os.rename(tmp, dest)
            except BaseException:
                _remove(tmp)
                raise
            fsync_dir(dest.parent)
            self._pinned.add(dest.resolve())
        return SnapshotInfo(dest, marker.checkpoint_id, marker.seq)

    @property
    def pinned(self) -> frozenset[Path]:
        """Resolved paths this store will never prune."""
        return frozenset(self._pinned)

    def prune(self, keep: int, protect: Iterable[Path] = ()) -> list[Path]:
        """Delete all but the newest ``keep`` complete snapshots; return what was removed.

        Never removes a snapshot in ``protect`` or pinned by this store (so a snapshot chosen
        for restore survives retention). Also removes stale staging directories (ones this
        store is not currently using) and leftovers of interrupted prunes and pins. Incomplete
        ``ckpt-`` directories are left alone. A snapshot leaves the ``ckpt-`` namespace by one
        rename before it is deleted, so a crash mid-prune never leaves a damaged snapshot that
        looks complete. Returned: removed snapshot paths by seq, then removed staging paths.
        """
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep!r}")
        keep_safe = {Path(p).resolve() for p in protect}
        removed: list[Path] = []
        with self._lock:
            keep_safe |= self._pinned
            complete = self.list_complete()
            doomed = complete[: max(0, len(complete) - keep)]
            for info in doomed:
                if info.path.resolve() in keep_safe:
                    continue
                trash = self.root / f"{PRUNING_PREFIX}{info.path.name}.{secrets.token_hex(4)}"
                os.rename(info.path, trash)
                fsync_dir(self.root)
                _remove(trash)
                removed.append(info.path)
            if self.root.is_dir():
                for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
                    path = Path(entry.path)
                    if entry.name.startswith((PRUNING_PREFIX, PIN_TMP_PREFIX)):
                        _remove(path)
                    elif entry.name.startswith(STAGING_PREFIX) and path not in self._staging:
                        _remove(path)
                        removed.append(path)
            if not self._staging:  # nothing is being linked: the sweep (module docstring)
                self._sweep()
        return removed

    def _sweep(self) -> int:
        """Delete every shared object no snapshot links (link count 1) and the temp files of
        interrupted writes; how many objects went. Called in the lock, no staging open."""
        shared = ObjectStore.of_snapshot_root(self.root)
        swept = 0
        for ref in list(shared.refs()):
            path = shared.path(ref)
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_nlink <= 1:
                    path.unlink()
                    swept += 1
        top = shared.root / "sha256"
        if top.is_dir():
            for tmp in top.glob("*/.in.*.tmp"):
                tmp.unlink(missing_ok=True)
        return swept

    def prune_copies(self, pin_dir: Path) -> list[Path]:
        """Remove the restore copies under ``pin_dir`` this store does not pin; return them.

        Each restore copies its snapshot there (``pin``); once this store has restored (or
        not), the copies earlier incarnations made are stale: they are pruned with the
        snapshots, never the one this store pins. Leftover ``.pin-`` temp copies go too.
        """
        pin_dir = Path(pin_dir)
        removed: list[Path] = []
        with self._lock:
            if not pin_dir.is_dir():
                return removed
            for entry in sorted(os.scandir(pin_dir), key=lambda e: e.name):
                path = Path(entry.path)
                stale_copy = (
                    SNAPSHOT_RE.fullmatch(entry.name) is not None
                    and path.resolve() not in self._pinned
                )
                if stale_copy or entry.name.startswith(PIN_TMP_PREFIX):
                    _remove(path)
                    removed.append(path)
        return removed

    def __repr__(self) -> str:
        return (
            f"<SnapshotStore root={str(self.root)!r} staging={len(self._staging)} "
            f"pinned={len(self._pinned)} last_seq={self._last_seq}>"
        )


def _publish_stats(snapshot: Path) -> PublishStats:
    """``PublishStats`` of the snapshot directory ``snapshot``, from its files' link counts:
    an object linked by the shared store only (2 links) or by nothing else (a copy, 1) is new
    with it; one with more links was there before."""
    written = linked = new = 0
    objects = snapshot / OBJECTS_DIR
    for dirpath, _dirnames, filenames in os.walk(snapshot):
        is_object = Path(dirpath).is_relative_to(objects)
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if not stat.S_ISREG(st.st_mode):
                    continue
                if is_object and st.st_nlink > 2:
                    linked += 1
                    continue
                new += is_object
                written += st.st_size
    return PublishStats(written, linked, new)


def _remove(path: Path) -> None:
    """Remove a file, link or directory tree; no error if it is gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


# -- loading and validation ----------------------------------------------------------------


def load_snapshot(path: Path) -> LoadedSnapshot:
    """Load and strictly validate the snapshot at ``path``.

    Checks, each failure a one-line ``ManifestError`` naming the file and field: the directory
    exists; ``COMMITTED`` exists and is a valid marker; every file the marker names is present
    with the committed sha256; the manifest is non-empty JSON of the supported version with
    exactly the known keys; it has participant topology; kinds are known; names are unique;
    every ``state_dir`` is relative, free of ``..`` and stays inside the snapshot with symlinks
    followed; every episode's replica is an instance and its owner a participant of it.
    Participant state itself is checked by ``verify_snapshot``.
    """
    path = Path(path)
    if not path.is_dir():
        raise ManifestError(f"{path}: no such snapshot directory")
    marker_path = path / COMMIT_MARKER
    if not marker_path.is_file():
        raise ManifestError(f"{path}: not a complete rollout snapshot: no {COMMIT_MARKER} marker")
    try:
        marker = load_marker(marker_path.read_bytes())
    except ManifestError as exc:
        raise ManifestError(
            f"{path}: not a complete rollout snapshot: invalid {COMMIT_MARKER} marker ({exc})"
        ) from None
    if MANIFEST_NAME not in marker.files:
        raise ManifestError(f"{COMMIT_MARKER}: does not list {MANIFEST_NAME}")

    contents: dict[str, bytes] = {}
    for name, committed in marker.files.items():
        try:
            _check_plain_name(name, "file name")
        except ValueError as exc:
            raise ManifestError(f"{COMMIT_MARKER}: {exc}") from None
        file = path / name
        if file.is_symlink() or not file.is_file():
            raise ManifestError(f"{name}: listed in {COMMIT_MARKER} but missing from {path}")
        data = file.read_bytes()
        found = _sha256(data)
        if found != committed:
            raise ManifestError(
                f"{name}: sha256 {_short(found)} on disk, {_short(committed)} committed"
            )
        contents[name] = data

    manifest = load_manifest(contents.pop(MANIFEST_NAME))
    if manifest.checkpoint_id != marker.checkpoint_id:
        raise ManifestError(
            f"{MANIFEST_NAME}: checkpoint_id {manifest.checkpoint_id!r}, but {COMMIT_MARKER} "
            f"is for {marker.checkpoint_id!r}"
        )
    _validate_manifest(manifest, path)
    return LoadedSnapshot(path=path, manifest=manifest, files=contents, marker=marker)


def _validate_manifest(manifest: GymManifest, base: Path) -> None:
    """Structural checks of a manifest whose state directories are relative to ``base``."""
    bad = f"{MANIFEST_NAME}:"
    if manifest.version not in READ_MANIFEST_VERSIONS:
        raise ManifestError(
            f"{bad} version {manifest.version} is not supported "
            f"(this runtime reads version {MANIFEST_VERSION})"
        )
    if not manifest.instances:
        raise ManifestError(f"{bad} manifest has no participant topology (no instances)")
    participants: dict[str, set[str]] = {}
    state_dirs: dict[str, str] = {}
    for instance in manifest.instances:
        where = f"{bad} instance {instance.name}"
        if not instance.name:
            raise ManifestError(f"{bad} instance with an empty name")
        if instance.name in participants:
            raise ManifestError(f"{where} listed twice")
        if not instance.participants:
            raise ManifestError(
                f"{bad} manifest has no participant topology "
                f"(instance {instance.name} has no participants)"
            )
        names: set[str] = set()
        for p in instance.participants:
            who = f"{where}: participant {p.server_name}"
            if not p.server_name:
                raise ManifestError(f"{where}: participant with an empty server_name")
            if p.server_name in names:
                raise ManifestError(f"{who} listed twice")
            names.add(p.server_name)
            if not PARTICIPANT_KIND_RE.fullmatch(p.kind):
                raise ManifestError(
                    f"{who}: kind {p.kind!r} is not a participant kind name "
                    f"({PARTICIPANT_KIND_RE.pattern}, "
                    f"e.g. {', '.join(sorted(PARTICIPANT_KINDS))})"
                )
            if not _DIGEST_RE.fullmatch(p.records_digest):
                raise ManifestError(
                    f"{who}: records_digest {p.records_digest!r} is not sha256:<64 hex digits>"
                )
            _check_state_dir(p.state_dir, who, base)
            key = PurePosixPath(p.state_dir).as_posix()
            if key in state_dirs:
                raise ManifestError(
                    f"{who}: state_dir {p.state_dir!r} is also used by {state_dirs[key]}"
                )
            state_dirs[key] = f"{instance.name}/{p.server_name}"
        participants[instance.name] = names
    _validate_episodes(manifest.episodes, participants)


def _validate_episodes(episodes: EpisodeColumns, participants: Mapping[str, set[str]]) -> None:
    """Every episode listed once, on an instance of the manifest, owned by a participant of
    that instance: checked over the columns (a set per column, a set of ``(replica, owner)``
    pairs, built in slices: ``_slices``), no step per episode in Python."""
    bad = f"{MANIFEST_NAME}:"
    ids = episodes.rollout_id
    if len(set_in_slices(ids)) != len(ids):
        seen: set[str] = set()
        twice = next(rid for rid in ids if rid in seen or seen.add(rid))  # type: ignore[func-returns-value]
        raise ManifestError(f"{bad} episode {twice} listed twice")
    for replica, owner in pairs_in_slices(episodes.replica, episodes.owner):
        owners = participants.get(replica)
        if owners is not None and owner in owners:
            continue
        which = next(
            ep for ep in episodes if ep.replica == replica and ep.owner == owner
        ).rollout_id
        if owners is None:
            raise ManifestError(f"{bad} episode {which}: replica {replica!r} is not an instance")
        raise ManifestError(
            f"{bad} episode {which}: owner {owner!r} is not a participant of instance {replica}"
        )


def state_dir_problem(state_dir: str, root: Path | None = None) -> str | None:
    """Why ``state_dir`` does not name a directory strictly inside a snapshot, or None.

    The one "state stays inside the snapshot" rule, for the manifest's structure, for each
    participant's state, for the coordinator checking Gym's commit replies and for the
    conformance kit: not empty or ``.``, relative (no leading slash, backslash or drive), no
    ``..``, backslash or NUL. With ``root`` it also resolves the path under ``root`` (symlinks
    followed; a filesystem call) and requires it to stay strictly inside. The reason starts with
    the quoted ``state_dir``.
    """
    rel = PurePosixPath(state_dir)
    if not state_dir or rel == PurePosixPath("."):
        return f"{state_dir!r} must name a directory in the snapshot"
    if rel.is_absolute() or state_dir.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", state_dir):
        return f"{state_dir!r} is absolute; it must be relative"
    if ".." in rel.parts or "\\" in state_dir or "\0" in state_dir:
        return f"{state_dir!r} contains '..'; it must stay inside"
    if root is None:
        return None
    root_resolved = root.resolve()
    resolved = (root / rel).resolve()
    if resolved == root_resolved or not resolved.is_relative_to(root_resolved):
        return f"{state_dir!r} resolves to {resolved}, outside the snapshot"
    return None


def _check_state_dir(state_dir: str, who: str, base: Path) -> None:
    problem = state_dir_problem(state_dir, base)
    if problem is not None:
        raise ManifestError(f"{who}: state_dir {problem}")


# -- verification --------------------------------------------------------------------------


def trainer_files_problems(snapshot: LoadedSnapshot) -> list[str]:
    """Where the trainer's files on disk differ from the digests in the commit marker."""
    problems: list[str] = []
    if TRAINER_FILES_DIR not in snapshot.marker.trees and os.path.lexists(
        snapshot.path / TRAINER_FILES_DIR
    ):
        problems.append(f"{TRAINER_FILES_DIR}/: on disk but not committed in {COMMIT_MARKER}")
    for name, committed in sorted(snapshot.marker.trees.items()):
        tree = snapshot.path / name
        if name != TRAINER_FILES_DIR or tree.is_symlink():
            problems.append(f"{COMMIT_MARKER}: {name!r} is not a trainer files directory")
            continue
        try:
            found = records_digest(tree)
        except OSError:
            problems.append(f"{name}/: trainer files missing from {snapshot.path}")
            continue
        problems.extend(trainer_entries_problems(tree))
        if found != committed:
            problems.append(
                f"{name}/: trainer files digest {_short(found)} on disk, {_short(committed)} "
                "committed (a weight or optimizer file was edited, added or removed)"
            )
    return problems


def verify_snapshot(
    snapshot: LoadedSnapshot, live: Mapping[str, Sequence[tuple[str, str]]] | None = None
) -> list[str]:
    """Every difference between the snapshot's manifest and the disk (and ``live``), one line each.

    Always recomputes ``records_digest`` of each participant's state directory and of the
    trainer's files, and compares them with the committed digests, and checks every object
    reference and every object (``object_problems``). If ``live`` (instance
    name → ``[(server_name, kind)]`` in topology order) is given, the live deployment must
    match the recorded topology exactly:
    same instances, same participants in the same order, same kinds. An empty list means the
    snapshot may be installed.
    """
    diffs = trainer_files_problems(snapshot)
    trusted: list[ParticipantRecord] = []
    for instance in snapshot.manifest.instances:
        for p in instance.participants:
            where = f"instance {instance.name}: participant {p.server_name}"
            problem = participant_state_problem(snapshot.path, p, where)
            if problem is not None:
                diffs.append(problem)
            else:
                trusted.append(p)
    diffs.extend(object_problems(snapshot.path, trusted))
    if live is not None:
        diffs.extend(topology_differences(snapshot.manifest, live))
    return diffs


def object_problems(snapshot: Path, participants: Iterable[ParticipantRecord]) -> list[str]:
    """Every missing or changed object of the snapshot directory ``snapshot``, one line each
    naming its path: each chunk the ``participants``' ``records.json`` (digests checked
    already; a state directory without one holds no references) name,
    each object their states name (the index's ``objects`` list), and every object under
    ``objects/``, hashed against its name."""
    own = ObjectStore(Path(snapshot) / OBJECTS_DIR)
    problems: list[str] = []
    checked: set[str] = set()

    def check(ref: str, what: str) -> None:
        if ref in checked:
            return
        checked.add(ref)
        problem = own.problem(ref)
        if problem is not None:
            problems.append(f"{what}: {problem}")

    for p in participants:
        what = f"{p.state_dir}/{RECORDS_FILE}"
        try:
            refs = records_chunk_refs((Path(snapshot) / what).read_bytes(), what)
        except FileNotFoundError:
            continue  # a Gym whose state is other files: its digest covers them
        except (OSError, ManifestError) as exc:
            problems.append(f"{what}: {exc}")
            continue
        for key, chunk_refs in refs.items():
            for ref in chunk_refs:
                check(ref, f"{what} chunk of {key}")
        for ref in refs.get(OBJECTS_KEY, ()):
            if own.problem(ref) is not None:
                continue  # reported above
            try:
                named = read_chunk(own, ref, what)
            except ManifestError as exc:
                problems.append(str(exc))
                continue
            for obj in named:
                if not isinstance(obj, str) or not OBJECT_REF_RE.fullmatch(obj):
                    problems.append(f"{what}: {obj!r} in its objects list is not a reference")
                    continue
                check(obj, f"{what} object named by a state")
    for ref in own.refs():
        check(ref, OBJECTS_DIR)
    return problems


def check_snapshot(
    snapshot: LoadedSnapshot, live: Mapping[str, Sequence[tuple[str, str]]] | None = None
) -> None:
    """Raise ``TopologyMismatch`` listing every difference ``verify_snapshot`` finds."""
    diffs = verify_snapshot(snapshot, live)
    if diffs:
        raise TopologyMismatch(diffs)
