"""The shared object store of a snapshot root (runtime._objects): content-addressed, written
once, checked on read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gymckpt.runtime.lowlevel import ObjectStore, SnapshotObjects, object_ref, parse_object_ref


def test_put_bytes_places_the_bytes_under_their_digest_once(tmp_path: Path) -> None:
    store = ObjectStore.of_snapshot_root(tmp_path)
    dirty: set[Path] = set()
    ref = store.put_bytes(b"hello", dirty)
    assert ref == object_ref(hashlib.sha256(b"hello").hexdigest())
    assert store.path(ref).read_bytes() == b"hello"
    assert store.root in dirty
    ObjectStore.sync(dirty)
    assert not dirty
    assert store.put_bytes(b"hello", dirty) == ref and not dirty  # present: nothing written
    assert list(store.refs()) == [ref]
    assert store.read(ref) == b"hello"
    assert store.problem(ref) is None


def test_a_changed_object_is_found_and_refused_on_read(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "objects")
    ref = store.put_bytes(b"hello", set())
    path = store.path(ref)
    path.chmod(0o644)
    path.write_bytes(b"hellp")
    assert "changed on disk" in (store.problem(ref) or "")
    with pytest.raises(ValueError, match="does not hold"):
        store.read(ref)
    other = object_ref("0" * 64)
    assert "missing" in (store.problem(other) or "")


def test_put_file_checks_what_it_places(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "objects")
    src = tmp_path / "blob"
    src.write_bytes(b"data")
    ref = object_ref(hashlib.sha256(b"data").hexdigest())
    assert store.put_file(src, ref, set()) == ref
    assert store.read(ref) == b"data"
    with pytest.raises(ValueError, match="not stored"):
        store.put_file(src, object_ref("1" * 64), set())
    assert not store.path(object_ref("1" * 64)).exists()
    assert [p.name for p in store.path(ref).parent.iterdir()] == [ref.split(":")[1]]


@pytest.mark.parametrize("bad", ["sha256:XYZ", "md5:" + "0" * 64, 7, "sha256:" + "A" * 64])
def test_a_reference_that_is_not_one_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="not an object reference"):
        parse_object_ref(bad)


def test_put_all_places_many_objects_in_order_each_linked_from_the_shared_store(
    tmp_path: Path,
) -> None:
    shared = ObjectStore.of_snapshot_root(tmp_path)
    objects = SnapshotObjects.of_snapshot(tmp_path / ".staging-c1", shared)
    datas = [b"chunk %d" % i for i in range(20)] + [b"chunk 3"]  # threads, and a duplicate
    refs = objects.put_all(datas)
    assert refs == [object_ref(hashlib.sha256(d).hexdigest()) for d in datas]
    assert objects.dirty  # the directories to fsync, gathered from every thread
    objects.sync()
    assert not objects.dirty
    for ref, data in zip(refs, datas, strict=True):
        assert objects.own.read(ref) == data
        assert objects.own.path(ref).stat().st_ino == shared.path(ref).stat().st_ino
