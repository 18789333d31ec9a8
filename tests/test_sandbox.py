"""The sandbox participant's rules: the manifest and what a mark hashes, the restore's checks
(hostile trees refused and nothing written), the file API's confinement, and commands (a
deadline that kills the whole process group, bounded output, resource limits)."""

from __future__ import annotations

import math
import os
import select
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import EpisodeInfo
from gymckpt.gym_adapter.environments import _sandbox_tree
from gymckpt.gym_adapter.environments._sandbox_commands import bwrap_argv
from gymckpt.gym_adapter.environments.sandbox import (
    CommandLimits,
    ManifestRefused,
    Sandbox,
    SandboxPathError,
    SandboxSession,
    TreeChanged,
    TreeLimits,
)
from gymckpt.runtime.lowlevel import ObjectStore, object_ref

INFO = EpisodeInfo("3-1", 3, 1, 0, 7, "gym-0")


def template(root: Path) -> Path:
    t = root / "template"
    (t / "src").mkdir(parents=True, exist_ok=True)
    (t / "README").write_text("read me\n")
    (t / "src" / "main.sh").write_text("echo hi\n")
    os.chmod(t / "src" / "main.sh", 0o755)
    if not (t / "run").is_symlink():
        os.symlink("src/main.sh", t / "run")
    return t


def sandbox(tmp_path: Path, **kw: Any) -> Sandbox:
    return Sandbox(template(tmp_path), tmp_path / "work", **kw)


def trees(box: Sandbox) -> list[str]:
    return sorted(os.listdir(box.home / "trees"))


def test_a_session_starts_as_the_template_and_exports_a_manifest_of_it(tmp_path: Path) -> None:
    box = sandbox(tmp_path)
    s = box.open(INFO)
    assert s.read("README") == b"read me\n" and s.list() == ["README", "run", "src"]
    assert os.readlink(s.root / "run") == "src/main.sh"
    m = box.export(s)
    assert m["version"] == 2 and m["label"] == "3-1" and m["changes"] == {}
    assert m["base"] == box.template_base()[0]  # the template's tree, an object
    tree = s.tree()
    assert tree["run"] == {"kind": "symlink", "target": "src/main.sh"}
    assert tree["src"] == {"kind": "dir", "mode": 0o755}
    main = tree["src/main.sh"]
    assert main["mode"] == 0o755 and main["size"] == 8
    assert blob(box, main["digest"]) == b"echo hi\n"  # stored once, by digest
    assert orjson.loads(box.objects.read(m["base"])) == tree
    assert s.scanner.hashed == 0  # copied from the template's blobs: nothing read again


def test_a_mark_hashes_only_the_files_whose_stat_key_changed(tmp_path: Path) -> None:
    box = sandbox(tmp_path)
    s = box.open(INFO)
    box.export(s)
    s.write("new.txt", "one\n")
    s.append("README", "more\n")
    first = box.export(s)
    assert s.scanner.hashed == 2
    s.scanner.known = {  # as if both were hashed long ago (not racily clean any more)
        rel: (key, digest) for rel, (key, digest) in _sandbox_tree_known(s).items()
    }
    hashed = s.scanner.hashed
    assert box.export(s) == first and s.scanner.hashed == hashed  # nothing changed: none read


def _sandbox_tree_known(s: SandboxSession) -> dict[str, Any]:
    out = {}
    for rel, entry in box_manifest(s).items():
        if entry["kind"] == "file":
            st = os.lstat(s.root / rel)
            out[rel] = ((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino), entry["digest"])
    return out


def box_manifest(s: SandboxSession) -> dict[str, Any]:
    return s.tree()


def blob(box: Sandbox, digest: str) -> bytes:
    return box.objects.path(object_ref(digest)).read_bytes()


def with_changes(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return dict(state, changes=dict(state["changes"], **changes))


def test_a_same_size_rewrite_right_after_a_mark_is_still_seen(tmp_path: Path) -> None:
    """Racily clean: a rewrite in the same timestamp tick as the mark keeps size and mtime."""
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("f", "aaaa")
    box.export(s)
    assert "f" not in s.scanner.known  # written in the mark's tick: not trusted next mark
    st = os.lstat(s.root / "f")
    s.write("f", "bbbb")
    os.utime(s.root / "f", ns=(st.st_atime_ns, st.st_mtime_ns))  # the same tick
    assert s.read("f") == b"bbbb"
    m = box.export(s)
    assert blob(box, m["changes"]["f"]["digest"]) == b"bbbb"


def test_restore_materialises_the_tree_exactly_in_a_new_directory(tmp_path: Path) -> None:
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("src/data.bin", bytes(range(256)) * 10, mode=0o600)
    os.chmod(s.root / "src", 0o750)
    s.delete("README")
    m = box.export(s)
    r = box.restore(m)
    assert r.root != s.root and r.label == "3-1"
    assert box.export(r) == m
    assert r.read("src/data.bin") == bytes(range(256)) * 10
    assert (r.root / "src" / "data.bin").stat().st_mode & 0o777 == 0o600
    assert (r.root / "src").stat().st_mode & 0o777 == 0o750
    assert (r.root / "run").is_symlink() and r.scanner.hashed == 0


def _refused(box: Sandbox, state: Any, match: str) -> None:
    before = trees(box)
    with pytest.raises(ManifestRefused, match=match):
        box.restore(state)
    assert trees(box) == before  # a refused manifest changes nothing


@pytest.mark.parametrize(
    ("rel", "entry", "match"),
    [
        ("out", {"kind": "symlink", "target": "/etc"}, "resolves outside the tree"),
        ("out", {"kind": "symlink", "target": "../.."}, "resolves outside the tree"),
        ("src/out", {"kind": "symlink", "target": "../../x"}, "resolves outside the tree"),
        ("../evil", {"kind": "dir", "mode": 0o755}, "not normalised"),
        ("src/../../evil", {"kind": "dir", "mode": 0o755}, "not normalised"),
        ("/etc/evil", {"kind": "dir", "mode": 0o755}, "absolute"),
        ("run/evil", {"kind": "dir", "mode": 0o755}, "parent run is not a directory"),
        ("x", {"kind": "dir", "mode": 0o4755}, "not permission bits"),
        ("x", {"kind": "fifo", "mode": 0o644}, "not file, dir or symlink"),
    ],
)
def test_a_hostile_manifest_is_refused_and_writes_nothing(
    tmp_path: Path, rel: str, entry: Any, match: str
) -> None:
    box = sandbox(tmp_path)
    m = box.export(box.open(INFO))
    _refused(box, with_changes(m, **{rel: entry}), match)


def test_a_symlink_out_through_another_symlink_is_refused(tmp_path: Path) -> None:
    """``d -> .`` is inside; ``e -> d/..`` is lexically ``.`` but the kernel resolves ``d``
    first, so ``e`` is the tree's parent."""
    box = sandbox(tmp_path)
    m = box.export(box.open(INFO))
    m["changes"]["d"] = {"kind": "symlink", "target": "."}
    m["changes"]["e"] = {"kind": "symlink", "target": "d/.."}
    _refused(box, m, "e: symlink target 'd/..' resolves outside")
    del m["changes"]["e"]
    m["changes"]["loop"] = {"kind": "symlink", "target": "loop"}
    _refused(box, m, "loop: symlink target 'loop' resolves outside")


def test_a_file_over_the_limit_or_a_missing_or_corrupt_blob_is_refused(tmp_path: Path) -> None:
    box = sandbox(tmp_path, limits=TreeLimits(max_file_bytes=100))
    m = box.export(box.open(INFO))
    big = with_changes(m, huge={"kind": "file", "mode": 0o644, "size": 1 << 40,
                                "digest": "0" * 64})  # fmt: skip
    _refused(box, big, "huge: 1099511627776 bytes, over the limit of 100")
    missing = with_changes(m, gone={"kind": "file", "mode": 0o644, "size": 3,
                                    "digest": "1" * 64})  # fmt: skip
    _refused(
        box, missing, f"object sha256:{'1' * 64} missing: restore from a snapshot that holds it "
        r"\(3 bytes"
    )  # fmt: skip
    digest = box.open(INFO).tree()["README"]["digest"]
    path = box.objects.path(object_ref(digest))
    os.chmod(path, 0o644)
    path.write_bytes(b"READ ME\n")  # same size, other bytes
    _refused(box, m, "does not hash to its name")
    for name in os.listdir(box.home / "trees"):
        assert not name.startswith(".")  # the half-built tree was removed


def test_a_tree_a_restore_would_refuse_is_refused_at_export(tmp_path: Path) -> None:
    box = sandbox(tmp_path, limits=TreeLimits(max_file_bytes=1000))
    s = box.open(INFO)
    os.symlink("/etc/passwd", s.root / "passwd")
    with pytest.raises(TreeChanged, match="passwd resolve outside the tree"):
        box.export(s)
    os.unlink(s.root / "passwd")
    with open(s.root / "sparse", "wb") as f:
        f.truncate(1 << 30)  # an enormous file, no disk used
    with pytest.raises(TreeChanged, match="sparse is 1073741824 bytes, over the limit of 1000"):
        box.export(s)
    os.unlink(s.root / "sparse")
    os.mkfifo(s.root / "pipe")
    with pytest.raises(TreeChanged, match="not a regular file, directory or symlink"):
        box.export(s)


def test_a_file_changed_while_hashed_is_read_again_then_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("log", "start\n")
    real = _sandbox_tree._copy_hashing
    writes = {"left": 1}

    def racing(source: Path, tmp: Path, limit: int) -> Any:
        if source.name == "log" and writes["left"]:  # between the scan's lstat and the read
            writes["left"] -= 1
            with open(source, "a") as f:  # a process still writing in the tree
                f.write("more\n")
        return real(source, tmp, limit)

    monkeypatch.setattr(_sandbox_tree, "_copy_hashing", racing)
    m = box.export(s)  # changed once: read again, the manifest has the bytes as they stand
    assert blob(box, m["changes"]["log"]["digest"]) == b"start\nmore\n"
    assert m["changes"]["log"]["size"] == len(b"start\nmore\n")
    writes["left"] = 100
    s.write("log", "again\n")
    with pytest.raises(TreeChanged, match="changed while it was hashed, 4 times"):
        box.export(s)


def test_the_file_api_never_leaves_the_tree(tmp_path: Path) -> None:
    box = sandbox(tmp_path, limits=TreeLimits(max_file_bytes=10))
    s = box.open(INFO)
    (tmp_path / "secret").write_text("x")
    os.symlink(str(tmp_path), s.root / "up")
    for bad in ("../secret", "/etc/passwd", "up/secret", "src/../../secret", ""):
        with pytest.raises(SandboxPathError):
            s.read(bad)
        with pytest.raises(SandboxPathError):
            s.write(bad, "x")
    with pytest.raises(SandboxPathError, match="over the sandbox's limit"):
        s.write("big", b"x" * 11)
    s.delete("up")  # the link, never its target
    assert (tmp_path / "secret").exists() and "up" not in s.list()


def test_bad_configuration_is_refused_where_it_enters(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_file_bytes must be an int >= 1"):
        TreeLimits(max_file_bytes=0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        CommandLimits(timeout_s=0)
    with pytest.raises(ValueError, match="isolation must be one of"):
        sandbox(tmp_path, isolation="docker")
    with pytest.raises(ValueError, match="is not a directory"):
        Sandbox(tmp_path / "nope", tmp_path / "work")
    if shutil.which("bwrap") is None:
        with pytest.raises(ValueError, match="bwrap is not on PATH"):
            sandbox(tmp_path, isolation="bwrap")


def test_bwrap_binds_only_the_tree_writable_and_unshares_everything(tmp_path: Path) -> None:
    argv = bwrap_argv(tmp_path, ["make", "test"])
    assert argv[:5] == ["bwrap", "--ro-bind", "/", "/", "--dev"]
    assert ["--bind", str(tmp_path), str(tmp_path)] == argv[argv.index("--bind") :][:3]
    assert {"--unshare-all", "--die-with-parent", "--new-session"} <= set(argv)
    assert argv[-3:] == ["--", "make", "test"]


# -- commands ---------------------------------------------------------------------------------


async def test_a_command_runs_in_the_tree_with_bounded_output(tmp_path: Path) -> None:
    box = sandbox(tmp_path, commands=CommandLimits(max_output_bytes=1000, timeout_s=60))
    s = box.open(INFO)
    r = await s.run(["sh", "-c", "pwd; sh run; yes | head -c 100000; echo err >&2; exit 3"])
    assert r.returncode == 3 and not r.timed_out
    assert r.stdout.startswith(f"{s.root}\nhi\n".encode()) and len(r.stdout) == 1000
    assert r.stdout_truncated and r.stderr == b"err\n" and not r.stderr_truncated
    assert r.as_plain()["stdout_truncated"] is True


async def test_a_command_that_never_ends_is_killed_with_its_group_at_the_deadline(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    box = sandbox(tmp_path, commands=CommandLimits(timeout_s=30))
    s = box.open(INFO)
    os.mkfifo(s.root / "ready")
    autojump_clock.autojump_threshold = math.inf  # virtual time stands still until it is ready
    result: list[Any] = []
    async with trio.open_nursery() as nursery:
        command = ["sh", "-c", "sleep 1000 & echo $! > ready; while :; do sleep 1; done"]
        nursery.start_soon(lambda: _append(result, s.run(command)))
        bg = int(await trio.to_thread.run_sync((s.root / "ready").read_text))
        autojump_clock.autojump_threshold = 0  # now the 30 s deadline passes at once
    [r] = result
    assert r.timed_out and r.returncode is None
    try:
        fd = os.pidfd_open(bg)
    except ProcessLookupError:
        return  # gone already
    try:
        # readable once it exited (killed with its group); a real-time bound, in a thread
        ready, _, _ = await trio.to_thread.run_sync(select.select, [fd], [], [], 20.0)
        assert ready, f"background process {bg} outlived its command's deadline"
    finally:
        os.close(fd)


async def _append(into: list[Any], aw: Any) -> None:
    into.append(await aw)


async def test_resource_limits_bound_what_a_command_writes(tmp_path: Path) -> None:
    box = sandbox(tmp_path, commands=CommandLimits(file_bytes=4096, timeout_s=60))
    s = box.open(INFO)
    r = await s.run(["sh", "-c", "head -c 100000 /dev/zero > big"])
    assert r.returncode != 0  # SIGXFSZ or EFBIG
    assert (s.root / "big").stat().st_size <= 4096


# -- the state's format (v2: a base tree object and the changes) and the objects hook ---------


def big_template(root: Path, files: int = 200) -> Path:
    t = root / "template"
    for i in range(files):
        f = t / f"pkg{i % 10}" / f"mod{i}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"# module {i}\n" + "x = 1\n" * 50)
    return t


def test_a_state_carries_only_the_changes_against_the_template_deletions_too(
    tmp_path: Path,
) -> None:
    box = Sandbox(big_template(tmp_path), tmp_path / "work")
    s = box.open(INFO)
    untouched = orjson.dumps(box.export(s))
    assert len(untouched) < 200  # no entry of the 200-file template in it
    s.write("pkg1/mod1.py", "changed\n")
    s.write("pkg1/new.py", "new\n")
    s.delete("pkg2/mod2.py")
    m = box.export(s)
    assert sorted(m["changes"]) == ["pkg1/mod1.py", "pkg1/new.py", "pkg2/mod2.py"]
    assert m["changes"]["pkg2/mod2.py"] is None  # a deletion
    r = box.restore(m)
    assert r.tree() == s.tree() and box.export(r) == m
    assert not (r.root / "pkg2" / "mod2.py").exists()  # the deletion holds in the restored tree
    assert r.read("pkg1/mod1.py") == b"changed\n"


def test_a_state_whose_base_object_is_missing_is_refused_naming_it(tmp_path: Path) -> None:
    box = sandbox(tmp_path)
    m = box.export(box.open(INFO))
    other = tmp_path / "other-template"
    other.mkdir()
    (other / "README").write_text("another project\n")
    fresh = Sandbox(other, tmp_path / "elsewhere")  # a store without that base object
    (fresh.home / "trees").mkdir(parents=True)
    _refused(fresh, m, f"object {m['base']} missing: restore from a snapshot that holds it")
    _refused(box, dict(m, base="sha256:" + "2" * 64), "missing: restore from a snapshot")
    _refused(box, dict(m, base="template"), "is not an object reference")
    gone = with_changes(m, nothere=None)
    _refused(box, gone, "delete 'nothere', which the base tree does not hold")
    orphan = with_changes(m, src=None)  # the directory goes, its files stay: refused
    _refused(box, orphan, "parent src is not a directory")


def test_an_unknown_version_or_shape_is_refused_with_what_to_do(tmp_path: Path) -> None:
    box = sandbox(tmp_path)
    box.open(INFO)
    m = box.export(box.open(INFO))
    _refused(box, dict(m, version=3), "version 3 is not one this gymckpt reads .1, 2.: restore")
    _refused(box, {"version": 2, "label": "x", "tree": {}}, "keys .'base', 'changes'")
    _refused(box, dict(m, changes=[]), "changes must be an object")


def test_a_version_1_state_with_its_blobs_in_the_old_blob_store_still_restores(
    tmp_path: Path,
) -> None:
    """Releases before the object store exported the whole tree and kept blobs in ``blobs/``."""
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("src/new.txt", "new\n")
    tree = s.tree()
    legacy = box.home / "blobs"
    for entry in tree.values():
        if entry["kind"] == "file":
            digest = entry["digest"]
            (legacy / digest[:2]).mkdir(parents=True, exist_ok=True)
            (legacy / digest[:2] / digest).write_bytes(blob(box, digest))
    shutil.rmtree(box.home / "objects")
    old = {"version": 1, "label": "3-1", "tree": tree}
    elsewhere = Sandbox(box.template, tmp_path / "work")  # a new process: nothing cached
    r = elsewhere.restore(old)
    assert r.tree() == tree and r.read("src/new.txt") == b"new\n"
    assert elsewhere.export(r)["changes"] == {"src/new.txt": tree["src/new.txt"]}
    assert sorted(elsewhere.object_refs(old)) == sorted(
        object_ref(e["digest"]) for e in tree.values() if e["kind"] == "file"
    )


def test_object_refs_names_the_base_its_files_and_the_changed_files_each_once(
    tmp_path: Path,
) -> None:
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("src/new.txt", "new\n")
    s.write("copy", "read me\n")  # the same bytes as README: one object
    m = box.export(s)
    refs = list(box.object_refs(m))
    files = {object_ref(e["digest"]) for e in s.tree().values() if e["kind"] == "file"}
    assert refs[0] == m["base"] and len(refs) == len(set(refs))
    assert set(refs[1:]) == files  # README, src/main.sh, src/new.txt
    assert all(box.objects.has(ref) for ref in refs)


def test_a_fresh_store_given_the_objects_the_hook_names_restores_the_state(
    tmp_path: Path,
) -> None:
    """What a host that keeps participant objects with its snapshots does: at restore it puts
    each named object missing from ``objects`` there (listed as it goes: the base first, then
    what the base names), then calls ``restore``."""
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("src/data.bin", bytes(range(256)))
    m = box.export(s)
    snapshot = ObjectStore(tmp_path / "snapshot-objects")
    dirty: set[Path] = set()
    for ref in box.object_refs(m):  # at commit
        snapshot.put_file(box.objects.path(ref), ref, dirty)
    other = tmp_path / "other"
    shutil.copytree(box.template, other / "template", symlinks=True)
    fresh = Sandbox(other / "template", other / "work")
    put: list[str] = []
    for ref in fresh.object_refs(m):  # at restore, on another machine
        if not fresh.objects.has(ref):
            fresh.objects.put_file(snapshot.path(ref), ref, dirty)
            put.append(ref)
    assert put[0] == m["base"] and len(put) == 4  # the base, README, main.sh, data.bin
    r = fresh.restore(m)
    assert r.tree() == s.tree() and r.read("src/data.bin") == bytes(range(256))


def test_an_in_place_write_after_a_mark_leaves_the_marked_state_restorable(
    tmp_path: Path,
) -> None:
    """The store holds a copy of each file, never a link to the tree's file: an append (same
    inode) after the mark changes the tree, not the object the mark named."""
    box = sandbox(tmp_path)
    s = box.open(INFO)
    s.write("notes", "first\n")
    marked = box.export(s)
    s.append("notes", "second\n")  # in place: the same inode
    assert blob(box, marked["changes"]["notes"]["digest"]) == b"first\n"
    assert box.restore(marked).read("notes") == b"first\n"
