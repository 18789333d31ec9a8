"""A sandbox participant: per session, a directory tree of files the agent edits and runs
commands in, checkpointed as a content-addressed manifest.

    sandbox = Sandbox(template=Path("project"), work_dir=Path("work"))
    env = Environment(agent=MyAgent(), participants=(sandbox,), model=my_model)

    # in the agent's step:
    box = ctx.session("sandbox")                 # a SandboxSession
    box.write("notes.txt", box.read("notes.txt") + b"one more line\\n")
    result = await box.run(["python", "-m", "pytest", "-q"])

Where things live (``work_dir/sandbox/<participant name>/``): ``objects/``, the sandbox's
``ObjectStore`` (file contents and base trees by sha256, written once, fsynced; nothing here
deletes one), and ``trees/``, one directory per session (``<session key>-<random>``). A
session's tree is **copied** from the template's objects when it opens (never hardlinked: an
in-place write would then change the template and every other session); the template is read
once per process, hashed into the store, and must not change while a deployment runs. Trees are
not deleted when their sessions end: remove ``trees/`` between runs.

The session state a checkpoint holds is small and grows with what the agent changed: ``{"version":
2, "label": ..., "base": <the reference of the template's tree, an object>, "changes": {path:
entry or null}}`` (see ``_sandbox_tree``), never the files. ``export`` scans the tree, hashing
and storing only files whose ``(size, mtime_ns, ctime_ns, inode)`` changed since the last
export, so the boundary mark an unaligned checkpoint needs at every step boundary costs a
``lstat`` per entry plus what changed. Every object a state names is durable before ``export``
returns. ``restore`` rebuilds the base and the changes and checks the whole tree first (paths
confined, symlinks resolving inside the tree, sizes within ``limits``, objects present) and
materialises it in a new tree: a refused state changes nothing. A version-1 state (the whole
tree inline, its blobs in the ``blobs/`` directory of older releases) still restores. An
unaligned cut that takes an episode in the middle of a command restores the tree of its last
step boundary, and the turn runs again against it.

Snapshots that carry the objects: ``objects`` and ``object_refs`` are the participant-objects
hook of the episode API. ``object_refs(state)`` lists every object a state names (its base
first, then the files of its changes and of its base), so a host that keeps them with its
snapshots can put them back into ``objects`` before ``restore`` on another machine.

The agent's file API (``read``, ``write``, ``list``, ``delete``) takes relative paths and
refuses any that leaves the tree, also through a symlink. Commands: ``_sandbox_commands``
(deadline, output limits, rlimits, optional bubblewrap, and what that does not protect).
"""

from __future__ import annotations

import builtins
import os
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from gymckpt.gym_adapter import EpisodeInfo
from gymckpt.runtime.lowlevel import ObjectStore, object_ref, parse_object_ref

from ._sandbox_commands import ISOLATIONS, CommandLimits, CommandResult, run_command
from ._sandbox_tree import (
    MANIFEST_VERSION,
    V1_MANIFEST_VERSION,
    ManifestRefused,
    Tree,
    TreeChanged,
    TreeLimits,
    TreeScanner,
    apply_changes,
    check_manifest,
    check_relative,
    load_tree,
    materialise,
    tree_bytes,
    tree_changes,
)

__all__ = [
    "CommandLimits",
    "CommandResult",
    "ManifestRefused",
    "Sandbox",
    "SandboxPathError",
    "SandboxSession",
    "TreeChanged",
    "TreeLimits",
]

_STATE_KEYS: Final = {
    MANIFEST_VERSION: frozenset({"version", "label", "base", "changes"}),
    V1_MANIFEST_VERSION: frozenset({"version", "label", "tree"}),
}
_LEGACY_BLOBS: Final = "blobs"
"""Where releases before the object store kept a sandbox's blobs (``blobs/<aa>/<hex>``)."""


class SandboxPathError(ValueError):
    """A path given to a sandbox's file API leaves the tree (absolute, ``..``, through a
    symlink pointing out) or is not what the call needs (a directory to ``read``, say)."""


@attrs.define(eq=False, slots=True)
class SandboxSession:
    """One session's tree at ``root`` and what its exports remember (``scanner``).

    Invariant: every path the file API touches resolves inside ``root``; commands run with
    ``root`` as their working directory; ``base_tree`` with a state's ``changes`` applied is
    the tree that state was taken of. Not safe to use from two tasks at once (a command and a
    write racing on one file are the agent's own race)."""

    root: Path
    label: str
    limits: TreeLimits
    commands: CommandLimits
    isolation: str
    scanner: TreeScanner
    base: str
    """The reference of the base tree's object (the template's, or the restored state's)."""
    base_tree: Tree
    """The tree ``base`` holds; shared between sessions, never changed."""
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    """Held by an export: a mark on the event loop and a commit's export in a worker thread
    never scan one tree at once."""

    def _inside(self, rel: str, *, follow_last: bool = True) -> Path:
        try:
            check_relative(rel)
        except ValueError as exc:
            raise SandboxPathError(str(exc)) from None
        base = self.root.resolve()
        path = base / rel
        parent = path.parent.resolve()
        resolved = path.resolve() if follow_last else parent / path.name
        for p in (parent, resolved):
            if p != base and base not in p.parents:
                raise SandboxPathError(f"path {rel!r} resolves outside the sandbox tree")
        return resolved

    def read(self, rel: str) -> bytes:
        """The bytes of file ``rel``."""
        path = self._inside(rel)
        if not path.is_file():
            raise SandboxPathError(f"{rel!r} is not a file of the sandbox tree")
        return path.read_bytes()

    def write(self, rel: str, data: bytes | str, mode: int | None = None) -> None:
        """Replace (or create) file ``rel`` with ``data`` (a str is written as UTF-8); its
        parent directories are made. ``mode``: its permission bits (None: kept, or 0o644)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if len(raw) > self.limits.max_file_bytes:
            raise SandboxPathError(
                f"{rel!r}: {len(raw)} bytes, over the sandbox's limit of "
                f"{self.limits.max_file_bytes} per file"
            )
        path = self._inside(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._inside(rel)  # the directories made are inside too
        if path.is_dir():
            raise SandboxPathError(f"{rel!r} is a directory of the sandbox tree")
        with open(path, "wb") as f:
            f.write(raw)
        if mode is not None:
            os.chmod(path, mode & 0o777)

    def append(self, rel: str, data: bytes | str) -> None:
        """Add ``data`` at the end of file ``rel`` (made if missing)."""
        path = self._inside(rel)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        size = path.stat().st_size if path.exists() else 0
        if size + len(raw) > self.limits.max_file_bytes:
            raise SandboxPathError(f"{rel!r} would be over the sandbox's per-file limit")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.write(raw)

    def list(self, rel: str = "") -> builtins.list[str]:
        """The names in directory ``rel`` (the tree's top for ``""``), sorted."""
        path = self.root.resolve() if rel == "" else self._inside(rel)
        if not path.is_dir():
            raise SandboxPathError(f"{rel!r} is not a directory of the sandbox tree")
        return sorted(os.listdir(path))

    def delete(self, rel: str) -> None:
        """Remove file or symlink ``rel`` (the link itself, never its target), or an empty
        directory."""
        path = self._inside(rel, follow_last=False)
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()

    async def run(self, argv: Sequence[str], timeout_s: float | None = None) -> CommandResult:
        """Run ``argv`` in the tree under the sandbox's limits (``timeout_s`` overrides the
        deadline); see ``CommandResult``."""
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"a command is a non-empty list of strings, got {argv!r}")
        limits = self.commands
        if timeout_s is not None:
            limits = attrs.evolve(limits, timeout_s=timeout_s)
        return await run_command(argv, self.root, limits, self.isolation)

    def tree(self) -> Tree:
        """The whole tree as it stands now (path -> entry; every object it names durable)."""
        with self.lock:
            return self.scanner.scan()

    def manifest(self) -> dict[str, Any]:
        """The session's state now, what ``export`` returns: its base and the changes against
        it (every object it names durable)."""
        changes = tree_changes(self.base_tree, self.tree())
        return {
            "version": MANIFEST_VERSION,
            "label": self.label,
            "base": self.base,
            "changes": changes,
        }


@attrs.define(eq=False, slots=True)
class Sandbox:
    """The sandbox participant (kind ``environment``; see the module docstring).

    ``template``: the directory every session's tree starts as; ``work_dir``: where the blobs
    and the trees live (the host's work directory, say); ``limits``: what a tree may hold (a
    restored manifest over them is refused); ``commands``: every command's limits;
    ``isolation``: ``"none"``, ``"bwrap"`` (refused at construction when ``bwrap`` is not on
    ``PATH``) or ``"auto"``. ``retained``: sessions outlive their episodes (a workspace the
    world keeps)."""

    template: Path = attrs.field(converter=Path)
    work_dir: Path = attrs.field(converter=Path)
    name: str = "sandbox"
    kind: str = "environment"
    limits: TreeLimits = attrs.field(factory=TreeLimits)
    commands: CommandLimits = attrs.field(factory=CommandLimits)
    isolation: str = "none"
    retained: bool = False
    _bases: dict[str, Tree] = attrs.field(factory=dict, init=False)
    """Base trees read (or, the template's, taken) by this process, by reference."""
    _template_base: str | None = attrs.field(default=None, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.isolation == "bwrap":
            import shutil

            if shutil.which("bwrap") is None:
                raise ValueError(
                    "isolation='bwrap' but bwrap is not on PATH (install bubblewrap, or use "
                    "isolation='auto' to run without it where it is missing)"
                )
        if not self.template.is_dir():
            raise ValueError(f"sandbox template {self.template} is not a directory")

    @property
    def home(self) -> Path:
        return self.work_dir / "sandbox" / self.name

    @property
    def objects(self) -> ObjectStore:
        """Where the objects the sandbox's states name live (``home/objects``): file contents
        and base trees. The participant-objects hook."""
        return ObjectStore(self.home / "objects")

    def template_base(self) -> tuple[str, Tree]:
        """The template's tree and the reference of its object, taken once per process (its
        files and the tree itself stored, durable)."""
        with self._lock:
            if self._template_base is None:
                objects = self.objects
                tree = TreeScanner(self.template, objects, self.limits).scan()
                dirty: set[Path] = set()
                ref = objects.put_bytes(tree_bytes(tree), dirty)
                ObjectStore.sync(dirty)
                self._bases[ref] = tree
                self._template_base = ref
            return self._template_base, self._bases[self._template_base]

    def _base(self, ref: Any) -> Tree:
        """The base tree of reference ``ref`` (``ManifestRefused`` if it is not one or its
        object is missing or corrupt)."""
        with self._lock:
            tree = self._bases.get(ref) if isinstance(ref, str) else None
        if tree is None:
            tree = load_tree(self.objects, ref)
            with self._lock:
                self._bases.setdefault(ref, tree)
        return tree

    def _session(self, label: str, base: str, base_tree: Tree, tree: Tree) -> SandboxSession:
        objects = self.objects
        root = self.home / "trees" / f"{label}-{secrets.token_hex(6)}"
        files = materialise(tree, objects, root)
        scanner = TreeScanner(root, objects, self.limits)
        for rel, digest in files:
            scanner.remember(rel, digest)
        return SandboxSession(
            root, label, self.limits, self.commands, self.isolation, scanner, base, base_tree
        )

    def open(self, info: EpisodeInfo) -> SandboxSession:
        base, tree = self.template_base()
        return self._session(info.session_key, base, tree, tree)

    def export(self, state: SandboxSession) -> dict[str, Any]:
        return state.manifest()

    def restore(self, data: Any) -> SandboxSession:
        version = data.get("version") if isinstance(data, dict) else None
        if version not in _STATE_KEYS:
            raise ManifestRefused(
                f"sandbox state version {version!r} is not one this gymckpt reads "
                f"({', '.join(map(str, sorted(_STATE_KEYS)))}): restore it with the gymckpt "
                "that wrote it"
            )
        keys = _STATE_KEYS[version]
        if set(data) != keys:
            raise ManifestRefused(
                f"sandbox state version {version} must be an object with keys {sorted(keys)}, "
                f"got {sorted(data)}"
            )
        label = data["label"]
        if not isinstance(label, str) or not label or "/" in label or label.startswith("."):
            raise ManifestRefused(f"sandbox label {label!r} is not a plain name")
        if version == V1_MANIFEST_VERSION:
            base, base_tree = self.template_base()
            self._import_legacy_blobs(data["tree"])
            tree = check_manifest(data["tree"], self.objects, self.limits)
        else:
            self.template_base()  # the local template's files: present when it is the same
            base, base_tree = data["base"], self._base(data["base"])
            tree = apply_changes(base_tree, data["changes"])
            tree = check_manifest(tree, self.objects, self.limits)
        return self._session(label, base, base_tree, tree)

    def object_refs(self, data: Any) -> Iterator[str]:
        """Every object the exported state ``data`` names, each once: a version-2 state's base
        first, then the files its changes name, then the files of the base tree (read from
        ``objects``: listed when the base object is there, as it is at every export and once
        a host has put it back). What ``restore`` would refuse is left out (it refuses it)."""
        if not isinstance(data, Mapping):
            return
        seen: set[str] = set()
        if data.get("version") == V1_MANIFEST_VERSION:
            yield from _file_refs(data.get("tree"), seen)
            return
        base = data.get("base")
        if not _is_ref(base):
            return
        seen.add(base)
        yield base
        yield from _file_refs(data.get("changes"), seen)
        if self.objects.has(base):
            try:
                base_tree = self._base(base)
            except ManifestRefused:
                return
            yield from _file_refs(base_tree, seen)

    def _import_legacy_blobs(self, tree: Any) -> None:
        """Put into ``objects`` each blob a version-1 tree names that the ``blobs/`` directory
        of an older release holds and ``objects`` lacks (linked, its bytes checked against its
        name). Objects are immutable and named by content: this changes no tree."""
        legacy = self.home / _LEGACY_BLOBS
        if not legacy.is_dir() or not isinstance(tree, Mapping):
            return
        objects, dirty = self.objects, set[Path]()
        for ref in _file_refs(tree, set()):
            digest = parse_object_ref(ref)
            source = legacy / digest[:2] / digest
            if not objects.has(ref) and source.is_file():
                try:
                    objects.put_file(source, ref, dirty)
                except ValueError:
                    continue  # corrupt: the check that follows reports it missing
        ObjectStore.sync(dirty)


def _is_ref(value: object) -> bool:
    try:
        parse_object_ref(value)
    except ValueError:
        return False
    return True


def _file_refs(tree: Any, seen: set[str]) -> Iterator[str]:
    """The references of the files ``tree`` (entries, or changes with nulls) names, each not in
    ``seen`` (added to it)."""
    if not isinstance(tree, Mapping):
        return
    for entry in tree.values():
        if isinstance(entry, Mapping) and entry.get("kind") == "file":
            digest = entry.get("digest")
            if not isinstance(digest, str):
                continue
            try:
                ref = object_ref(digest)
            except ValueError:
                continue
            if ref not in seen:
                seen.add(ref)
                yield ref
