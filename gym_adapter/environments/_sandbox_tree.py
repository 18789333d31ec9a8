"""A sandbox's directory tree as a content-addressed manifest: taken cheaply, restored exactly.

A **tree** maps each relative path to its entry: a ``file`` (the sha256 of its bytes in hex, its
size and its permission bits), a ``dir`` (its permission bits) or a ``symlink`` (its target,
kept as a link). File contents are objects of an ``ObjectStore`` (``gymckpt.runtime.lowlevel``;
the sandbox's is ``work_dir/sandbox/<name>/objects``): one file per digest, written with fsync
and an atomic rename, so a state a commit holds never names an object that a crash can lose.
Nothing here deletes an object.

A **state** (version ``MANIFEST_VERSION``, 2) does not carry its whole tree: it names a *base*
tree, itself an object (``tree_bytes``: the tree's canonical JSON; the sandbox's template), and
carries only the ``changes`` against it (``tree_changes``: path -> entry, or None for a path
the base has and the tree does not), so a session's state grows with what the agent changed,
not with the template. ``apply_changes`` rebuilds the tree; a version-1 state holds the whole
tree inline and still restores.

``TreeScanner`` takes a tree. It keeps, per file, the ``(size, mtime_ns, ctime_ns, inode)`` it
last hashed at (its *stat key*), and hashes (and stores) only files whose key changed since, so
a mark at every step boundary costs a ``lstat`` per entry plus the bytes that changed. The
ctime is in the key because no tool can set it: a rewrite that puts the old mtime back
(``touch -d``, an archive extracted) still changes it. A file whose mtime or ctime is within
``RACY_NS`` of a scan is hashed again at the next scan (a write in the same filesystem-timestamp
tick as the scan keeps its size and its times: git's "racily clean" entries). A file that
changes while it is hashed is read again (``CHANGE_RETRIES`` times), then refused
(``TreeChanged``).

Files a restore writes get the fixed mtime ``MTIME_EPOCH``: a tree's bytes and times do not
depend on when it was restored, and the scanner trusts them from the start (any later write
sets a current mtime).

``check_manifest`` is every rule a restore needs, applied to the rebuilt tree before anything
is written: paths relative, normalised and without ``..``; every parent of an entry a ``dir``
entry (so no write goes through a link); every symlink's target, followed through the tree's
own links, inside the tree; every size within the limits; every object present with its size.
``materialise`` then builds the tree in a fresh directory beside the destination and renames it
into place: a refused state, or an object found corrupt while copied, changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import secrets
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from gymckpt.runtime.lowlevel import ObjectStore, object_ref, parse_object_ref

__all__ = [
    "CHANGE_RETRIES",
    "MANIFEST_VERSION",
    "MTIME_EPOCH",
    "RACY_NS",
    "V1_MANIFEST_VERSION",
    "ManifestRefused",
    "TreeChanged",
    "TreeLimits",
    "TreeScanner",
    "apply_changes",
    "check_manifest",
    "check_relative",
    "has_blob",
    "load_tree",
    "materialise",
    "store_file",
    "tree_bytes",
    "tree_changes",
]

MANIFEST_VERSION: Final = 2
"""A sandbox state's version: a base tree (an object) and the changes against it. Version 1
(``V1_MANIFEST_VERSION``, the whole tree inline) still restores."""
V1_MANIFEST_VERSION: Final = 1
MTIME_EPOCH: Final = 946_684_800_000_000_000
"""2000-01-01T00:00:00Z in ns: the mtime of every file a restore writes."""
RACY_NS: Final = 1_000_000_000
"""A file modified this close to a scan (or after it) is hashed again at the next scan."""
CHANGE_RETRIES: Final = 3
"""How many times a file that changed while being hashed is read again before it is refused."""
_CHUNK: Final = 1 << 20
_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")
_MAX_LINK_HOPS: Final = 40
_MODE_BITS: Final = 0o777


class ManifestRefused(ValueError):
    """A manifest breaks a rule of ``check_manifest`` (or a blob it names is missing or
    corrupt): nothing was written."""


class TreeChanged(RuntimeError):
    """A tree could not be taken as it stood: a file kept changing while it was hashed (a
    process still writing in the sandbox), or an entry is not a file, directory or symlink."""


@attrs.frozen
class TreeLimits:
    """What a tree may hold: ``max_file_bytes`` per file, ``max_tree_bytes`` in all, and
    ``max_entries`` paths. A manifest over any is refused on restore; a tree over any is
    refused on export."""

    max_file_bytes: int = 64 << 20
    max_tree_bytes: int = 1 << 30
    max_entries: int = 100_000

    def __attrs_post_init__(self) -> None:
        for field in ("max_file_bytes", "max_tree_bytes", "max_entries"):
            value = getattr(self, field)
            if type(value) is not int or value < 1:
                raise ValueError(f"TreeLimits.{field} must be an int >= 1, got {value!r}")


def has_blob(objects: ObjectStore, digest: str, size: int) -> bool:
    """Whether ``objects`` holds the blob of sha256 ``digest`` (hex) with ``size`` bytes."""
    try:
        return os.stat(objects.path(object_ref(digest))).st_size == size
    except FileNotFoundError:
        return False


def store_file(
    objects: ObjectStore, source: Path, before: os.stat_result, limit: int, dirty: set[Path]
) -> tuple[str, os.stat_result]:
    """Store the bytes of regular file ``source`` (``before``: its ``lstat``) in ``objects``;
    their sha256 (hex) and the stat they are of. The bytes are copied while hashed into a
    private temp file, which ``ObjectStore.put_file`` then places (the tree's file is never
    linked into the store: an in-place write would change an immutable object). Directories
    to fsync go in ``dirty``. ``TreeChanged`` when its stat key moved while it was read, every
    retry."""
    if not objects.root.is_dir():
        objects.root.mkdir(parents=True, exist_ok=True)
        dirty.add(objects.root.parent)
    for _ in range(CHANGE_RETRIES + 1):
        tmp = objects.root / f".in.{secrets.token_hex(8)}.tmp"
        try:
            digest, after = _copy_hashing(source, tmp, limit)
            if _stat_key(after) != _stat_key(before):
                before = os.lstat(source)
                continue
            objects.put_file(tmp, object_ref(digest), dirty)
            return digest, after
        finally:
            tmp.unlink(missing_ok=True)
    raise TreeChanged(
        f"file {source} changed while it was hashed, {CHANGE_RETRIES + 1} times: is a "
        "process still writing in the sandbox? (a command's whole process group is killed "
        "when it ends; one that left its group keeps running)"
    )


def _copy_hashing(source: Path, tmp: Path, limit: int) -> tuple[str, os.stat_result]:
    """Copy ``source`` to ``tmp`` (fsynced), hashing it; (digest, ``source``'s stat after)."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            while chunk := os.read(fd, _CHUNK):
                size += len(chunk)
                if size > limit:
                    raise TreeChanged(f"file {source} grew over the limit of {limit} bytes")
                h.update(chunk)
                os.write(out, chunk)
            os.fsync(out)
        finally:
            os.close(out)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return h.hexdigest(), after


StatKey = tuple[int, int, int, int]
Tree = dict[str, dict[str, Any]]
"""A tree: relative path -> entry (see the module docstring)."""


def _stat_key(st: os.stat_result) -> StatKey:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


@attrs.define(eq=False, slots=True)
class TreeScanner:
    """The manifest of the tree at ``root``, taken again and again: files whose
    ``(size, mtime_ns, inode)`` did not change since they were last hashed are not read (see
    the module docstring). ``hashed`` counts the files read, for tests and metrics."""

    root: Path
    objects: ObjectStore
    limits: TreeLimits
    known: dict[str, tuple[StatKey, str]] = attrs.field(factory=dict)
    """Relative path -> (the stat key it was hashed at, its digest): trusted next scan."""
    hashed: int = 0

    def remember(self, rel: str, digest: str) -> None:
        """``rel`` holds the blob ``digest`` now (just written by a restore, its mtime
        ``MTIME_EPOCH``): not hashed again until its stat key changes. Its ctime is recent, but
        any write after this sets a current mtime, so it is trusted at once."""
        st = os.lstat(self.root / rel)
        if st.st_mtime_ns == MTIME_EPOCH:
            self.known[rel] = (_stat_key(st), digest)

    def scan(self) -> dict[str, dict[str, Any]]:
        """The tree's manifest now, every new blob durable in the store."""
        start = time.time_ns()
        dirty: set[Path] = set()
        entries: dict[str, dict[str, Any]] = {}
        known: dict[str, tuple[StatKey, str]] = {}
        total = 0
        stack = [""]
        while stack:
            top = stack.pop()
            with os.scandir(self.root / top if top else self.root) as it:
                listing = sorted(it, key=lambda e: e.name)
            for entry in listing:
                rel = f"{top}/{entry.name}" if top else entry.name
                if len(entries) >= self.limits.max_entries:
                    raise TreeChanged(
                        f"sandbox tree {self.root} has over {self.limits.max_entries} entries"
                    )
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    entries[rel] = {"kind": "symlink", "target": os.readlink(entry.path)}
                elif stat.S_ISDIR(st.st_mode):
                    entries[rel] = {"kind": "dir", "mode": st.st_mode & _MODE_BITS}
                    stack.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    digest, st = self._digest(rel, Path(entry.path), st, start, known, dirty)
                    total += st.st_size
                    entries[rel] = {
                        "kind": "file",
                        "digest": digest,
                        "size": st.st_size,
                        "mode": st.st_mode & _MODE_BITS,
                    }
                else:
                    raise TreeChanged(
                        f"sandbox path {rel} is not a regular file, directory or symlink "
                        f"(mode {oct(st.st_mode)}): a sandbox cannot export it"
                    )
        escapes = [
            rel
            for rel, e in entries.items()
            if e["kind"] == "symlink" and _link_escapes(entries, rel)
        ]
        if escapes:  # refused here too: no snapshot holds a tree its restore would refuse
            raise TreeChanged(
                f"sandbox symlink(s) {', '.join(escapes[:10])} resolve outside the tree: a "
                "sandbox cannot export them"
            )
        if total > self.limits.max_tree_bytes:
            raise TreeChanged(
                f"sandbox tree {self.root} holds {total} bytes, over the limit of "
                f"{self.limits.max_tree_bytes}"
            )
        ObjectStore.sync(dirty)  # every new blob durable before the manifest is out
        self.known = known
        return entries

    def _digest(
        self,
        rel: str,
        path: Path,
        st: os.stat_result,
        start: int,
        known: dict[str, tuple[StatKey, str]],
        dirty: set[Path],
    ) -> tuple[str, os.stat_result]:
        """The digest of file ``rel`` and the stat it is the digest of (``st`` unless it
        changed while it was hashed)."""
        if st.st_size > self.limits.max_file_bytes:
            raise TreeChanged(
                f"sandbox file {rel} is {st.st_size} bytes, over the limit of "
                f"{self.limits.max_file_bytes}"
            )
        key = _stat_key(st)
        cached = self.known.get(rel)
        if cached is not None and cached[0] == key:
            known[rel] = cached
            return cached[1], st
        digest, after = store_file(self.objects, path, st, self.limits.max_file_bytes, dirty)
        self.hashed += 1
        key = _stat_key(after)
        if max(key[1], key[2]) < start - RACY_NS:  # not racily clean: trusted next scan
            known[rel] = (key, digest)
        return digest, after


def check_relative(rel: object) -> str:
    """``rel`` if it is a normalised relative path inside a tree, else ``ValueError`` naming
    what is wrong (absolute, empty, ``.`` or ``..`` parts, a NUL)."""
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"path {rel!r} must be a non-empty string")
    if rel.startswith("/"):
        raise ValueError(f"path {rel!r} is absolute: sandbox paths are relative to the tree")
    if "\0" in rel:
        raise ValueError(f"path {rel!r} holds a NUL")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"path {rel!r} is not normalised (no empty, '.' or '..' parts): it must stay "
            "inside the tree"
        )
    return rel


def _link_escapes(entries: Mapping[str, Any], rel: str) -> bool:
    """Whether symlink ``rel``'s target, resolved through the manifest's own symlinks as the
    kernel would (a ``..`` after a link goes up from where the link points), leaves the tree
    (or is absolute, or loops past ``_MAX_LINK_HOPS``)."""
    parts: list[str] = []
    hops = 0
    todo = list(reversed(rel.split("/")))  # components still to walk, as a stack
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                return True
            parts.pop()
            continue
        parts.append(name)
        here = "/".join(parts)
        entry = entries.get(here)
        if isinstance(entry, Mapping) and entry.get("kind") == "symlink":
            hops += 1
            target = entry.get("target")
            if hops > _MAX_LINK_HOPS or not isinstance(target, str) or target.startswith("/"):
                return True
            parts.pop()
            todo.extend(reversed(target.split("/")))
    return False


def check_manifest(
    manifest: Any, objects: ObjectStore, limits: TreeLimits
) -> dict[str, dict[str, Any]]:
    """The entries of ``manifest`` (an exported sandbox state's ``tree``), or
    ``ManifestRefused`` naming every rule it breaks (module docstring). Reads only the blob
    store's directory entries: nothing is written."""
    if not isinstance(manifest, Mapping):
        raise ManifestRefused(f"sandbox tree must be an object, got {type(manifest).__name__}")
    problems: list[str] = []
    if len(manifest) > limits.max_entries:
        problems.append(f"{len(manifest)} entries, over the limit of {limits.max_entries}")
    total = 0
    for rel, entry in manifest.items():
        try:
            check_relative(rel)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        parent = posixpath.dirname(rel)
        if parent and not (
            isinstance(manifest.get(parent), Mapping) and manifest[parent].get("kind") == "dir"
        ):
            problems.append(f"{rel}: its parent {parent} is not a directory of the tree")
        problem = _entry_problem(manifest, rel, entry, objects, limits)
        if problem is not None:
            problems.append(f"{rel}: {problem}")
        elif entry["kind"] == "file":
            total += entry["size"]
    if total > limits.max_tree_bytes:
        problems.append(f"files total {total} bytes, over the limit of {limits.max_tree_bytes}")
    if problems:
        raise ManifestRefused("sandbox manifest refused: " + "; ".join(problems[:20]))
    return dict(manifest)


def _entry_problem(
    manifest: Mapping[str, Any], rel: str, entry: Any, objects: ObjectStore, limits: TreeLimits
) -> str | None:
    if not isinstance(entry, Mapping):
        return "entry is not an object"
    kind = entry.get("kind")
    if kind == "symlink":
        target = entry.get("target")
        if set(entry) != {"kind", "target"} or not isinstance(target, str) or not target:
            return "a symlink entry is {kind, target} with a non-empty target"
        if "\0" in target or _link_escapes(manifest, rel):
            return f"symlink target {target!r} resolves outside the tree"
        return None
    mode = entry.get("mode")
    if type(mode) is not int or mode & ~_MODE_BITS:
        return f"mode {mode!r} is not permission bits (0 to 0o777)"
    if kind == "dir":
        return None if set(entry) == {"kind", "mode"} else "a dir entry is {kind, mode}"
    if kind != "file":
        return f"kind {kind!r} is not file, dir or symlink"
    digest, size = entry.get("digest"), entry.get("size")
    if set(entry) != {"kind", "mode", "digest", "size"}:
        return "a file entry is {kind, mode, digest, size}"
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        return f"digest {digest!r} is not a sha256 in hex"
    if type(size) is not int or size < 0:
        return f"size {size!r} is not a count of bytes"
    if size > limits.max_file_bytes:
        return f"{size} bytes, over the limit of {limits.max_file_bytes}"
    if not has_blob(objects, digest, size):
        return (
            f"object sha256:{digest} missing: restore from a snapshot that holds it ({size} "
            f"bytes expected in {objects.root})"
        )
    return None


def materialise(
    entries: Mapping[str, Mapping[str, Any]], objects: ObjectStore, dest: Path
) -> list[tuple[str, str]]:
    """Build the tree of checked ``entries`` at ``dest`` (which must not exist): in a fresh
    sibling directory, renamed into place when complete; (relative path, digest) of each file.
    A blob whose bytes do not hash to its name raises ``ManifestRefused`` and leaves nothing."""
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"sandbox tree {dest} exists already")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.tmp")
    tmp.mkdir(mode=0o700)
    files: list[tuple[str, str]] = []
    try:
        for rel in sorted(entries):  # a parent sorts before its children
            entry = entries[rel]
            path = tmp / rel
            kind = entry["kind"]
            if kind == "dir":
                path.mkdir(mode=0o700)
            elif kind == "symlink":
                os.symlink(entry["target"], path)
            else:
                _copy_out(objects, entry["digest"], path)
                os.chmod(path, entry["mode"])
                os.utime(path, ns=(MTIME_EPOCH, MTIME_EPOCH))
                files.append((rel, entry["digest"]))
        for rel in sorted(entries, reverse=True):  # a directory's mode once its children exist
            if entries[rel]["kind"] == "dir":
                os.chmod(tmp / rel, entries[rel]["mode"])
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
    except BaseException:
        _remove_tree(tmp)
        raise
    return files


def _copy_out(objects: ObjectStore, digest: str, path: Path) -> None:
    h = hashlib.sha256()
    source = objects.path(object_ref(digest))
    with open(source, "rb") as src, open(path, "xb") as out:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != digest:
        raise ManifestRefused(
            f"object {source} does not hash to its name (it holds {h.hexdigest()}): "
            "the sandbox's object store is corrupt"
        )


def _remove_tree(path: Path) -> None:
    """Remove ``path`` even where a restored mode forbids writing in it."""
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def tree_bytes(tree: Mapping[str, Any]) -> bytes:
    """The canonical JSON of ``tree`` (keys sorted, no spaces): what a base object holds."""
    return orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)


def tree_changes(base: Mapping[str, Any], tree: Mapping[str, Any]) -> dict[str, Any]:
    """What turns ``base`` into ``tree``: each path whose entry differs (or is new) -> its
    entry in ``tree``, each path ``base`` has and ``tree`` has not -> None; in path order.
    Invariant: ``apply_changes(base, tree_changes(base, tree)) == tree``."""
    changes: dict[str, Any] = {rel: e for rel, e in tree.items() if base.get(rel) != e}
    changes.update((rel, None) for rel in base if rel not in tree)
    return dict(sorted(changes.items()))


def apply_changes(base: Mapping[str, Any], changes: Any) -> Tree:
    """``base`` with ``changes`` applied (see ``tree_changes``), unchecked (``check_manifest``
    checks the result); ``ManifestRefused`` if ``changes`` is not an object of entries or
    nulls, or deletes a path ``base`` does not have."""
    if not isinstance(changes, Mapping):
        raise ManifestRefused(
            f"sandbox changes must be an object (path -> entry or null), got "
            f"{type(changes).__name__}"
        )
    tree = dict(base)
    strays = []
    for rel, entry in changes.items():
        if entry is not None:
            tree[rel] = entry
        elif tree.pop(rel, None) is None:
            strays.append(rel)
    if strays:
        raise ManifestRefused(
            f"sandbox changes delete {', '.join(map(repr, strays[:10]))}, which the base tree "
            "does not hold: the state was not written against this base"
        )
    return tree


def load_tree(objects: ObjectStore, ref: Any) -> Tree:
    """The tree that object ``ref`` holds (a base), or ``ManifestRefused`` saying what is
    wrong: not a reference, missing from ``objects``, changed on disk, or not a JSON object."""
    try:
        parse_object_ref(ref)
    except ValueError as exc:
        raise ManifestRefused(f"sandbox base: {exc}") from None
    if not objects.has(ref):
        raise ManifestRefused(
            f"sandbox base tree: object {ref} missing: restore from a snapshot that holds it "
            f"(the sandbox's objects are in {objects.root})"
        )
    try:
        tree = orjson.loads(objects.read(ref))
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise ManifestRefused(f"sandbox base tree {ref}: {exc}") from None
    if not isinstance(tree, dict):
        raise ManifestRefused(f"sandbox base tree {ref} is not a JSON object of entries")
    return tree
