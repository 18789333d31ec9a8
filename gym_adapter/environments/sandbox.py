"""A sandbox participant: per session, a directory tree of files the agent edits and runs
commands in, checkpointed as a content-addressed manifest.

    sandbox = Sandbox(template=Path("project"), work_dir=Path("work"))
    env = Environment(agent=MyAgent(), participants=(sandbox,), model=my_model)

    # in the agent's step:
    box = ctx.session("sandbox")                 # a SandboxSession
    box.write("notes.txt", box.read("notes.txt") + b"one more line\\n")
    result = await box.run(["python", "-m", "pytest", "-q"])

Where things live (``work_dir/sandbox/<participant name>/``): ``blobs/``, the blob store (file
contents by sha256, written once, fsynced, never deleted this round), and ``trees/``, one
directory per session (``<session key>-<random>``). A session's tree is **copied** from the
template's blobs when it opens (never hardlinked: an in-place write would then change the
template and every other session); the template is read once per process, hashed into the
store, and must not change while a deployment runs. Trees are not deleted when their sessions
end: remove ``trees/`` between runs.

The session state a checkpoint holds is the manifest (``{"tree": {path: entry}, ...}``, see
``_sandbox_tree``), never the files: ``export`` scans the tree, hashing and storing only files
whose ``(size, mtime_ns, inode)`` changed since the last export, so the boundary mark an
unaligned checkpoint needs at every step boundary costs a ``lstat`` per entry plus what changed.
Every blob a manifest names is durable before ``export`` returns. ``restore`` checks the whole
manifest first (paths confined, symlinks resolving inside the tree, sizes within ``limits``,
blobs present) and materialises it in a new tree: a refused manifest changes nothing. An
unaligned cut that takes an episode in the middle of a command restores the tree of its last
step boundary, and the turn runs again against it.

The agent's file API (``read``, ``write``, ``list``, ``delete``) takes relative paths and
refuses any that leaves the tree, also through a symlink. Commands: ``_sandbox_commands``
(deadline, output limits, rlimits, optional bubblewrap, and what that does not protect).
"""

from __future__ import annotations

import builtins
import os
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from gymckpt.gym_adapter import EpisodeInfo

from ._sandbox_commands import ISOLATIONS, CommandLimits, CommandResult, run_command
from ._sandbox_tree import (
    MANIFEST_VERSION,
    BlobStore,
    ManifestRefused,
    TreeChanged,
    TreeLimits,
    TreeScanner,
    check_manifest,
    check_relative,
    materialise,
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

_STATE_KEYS: Final = frozenset({"version", "label", "tree"})


class SandboxPathError(ValueError):
    """A path given to a sandbox's file API leaves the tree (absolute, ``..``, through a
    symlink pointing out) or is not what the call needs (a directory to ``read``, say)."""


@attrs.define(eq=False, slots=True)
class SandboxSession:
    """One session's tree at ``root`` and what its exports remember (``scanner``).

    Invariant: every path the file API touches resolves inside ``root``; commands run with
    ``root`` as their working directory. Not safe to use from two tasks at once (a command and
    a write racing on one file are the agent's own race)."""

    root: Path
    label: str
    limits: TreeLimits
    commands: CommandLimits
    isolation: str
    scanner: TreeScanner
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

    def manifest(self) -> dict[str, Any]:
        """The tree's manifest now (every blob it names durable): what ``export`` returns."""
        with self.lock:
            tree = self.scanner.scan()
        return {"version": MANIFEST_VERSION, "label": self.label, "tree": tree}


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
    _template_tree: dict[str, Any] | None = attrs.field(default=None, init=False)
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
    def blobs(self) -> BlobStore:
        return BlobStore(self.home / "blobs")

    def template_tree(self) -> dict[str, Any]:
        """The template's manifest, taken once per process (its blobs stored)."""
        with self._lock:
            if self._template_tree is None:
                self._template_tree = TreeScanner(self.template, self.blobs, self.limits).scan()
            return self._template_tree

    def _session(self, label: str, tree: dict[str, Any]) -> SandboxSession:
        blobs = self.blobs
        root = self.home / "trees" / f"{label}-{secrets.token_hex(6)}"
        files = materialise(tree, blobs, root)
        scanner = TreeScanner(root, blobs, self.limits)
        for rel, digest in files:
            scanner.remember(rel, digest)
        return SandboxSession(root, label, self.limits, self.commands, self.isolation, scanner)

    def open(self, info: EpisodeInfo) -> SandboxSession:
        return self._session(info.session_key, self.template_tree())

    def export(self, state: SandboxSession) -> dict[str, Any]:
        return state.manifest()

    def restore(self, data: Any) -> SandboxSession:
        if not isinstance(data, dict) or set(data) != _STATE_KEYS:
            raise ManifestRefused(
                f"sandbox state must be an object with keys {sorted(_STATE_KEYS)}, got "
                f"{sorted(data) if isinstance(data, dict) else type(data).__name__}"
            )
        if data["version"] != MANIFEST_VERSION:
            raise ManifestRefused(
                f"sandbox manifest version {data['version']!r} is not {MANIFEST_VERSION}: "
                "restore it with the gymckpt that wrote it"
            )
        label = data["label"]
        if not isinstance(label, str) or not label or "/" in label or label.startswith("."):
            raise ManifestRefused(f"sandbox label {label!r} is not a plain name")
        tree = check_manifest(data["tree"], self.blobs, self.limits)
        return self._session(label, tree)
