"""Snapshot store and manifest validation (S8, S13, C6): publish, load, verify, pin, prune."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from gymckpt.runtime import (
    EpisodeRecord,
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    SnapshotStore,
    TopologyMismatch,
    load_snapshot,
    records_digest,
    verify_snapshot,
)
from gymckpt.runtime._shared import (
    COMMIT_MARKER,
    GYM_STATE_DIR,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    CommitMarker,
    GymManifest,
    check_snapshot,
)
from gymckpt.runtime.lowlevel import write_atomic

TOPOLOGY = {
    "gym-0": [
        ("agent", "simple_agent"),
        ("calendar", "environment"),
        ("model_proxy", "model_proxy"),
    ],
    "gym-1": [("agent", "legacy_agent"), ("calendar", "environment")],
}


def _stage(store: SnapshotStore, checkpoint_id: str) -> tuple[Path, GymManifest]:
    """Stage a snapshot as Gym would: participant state under gym/, then the manifest."""
    staging = store.begin(checkpoint_id)
    instances = []
    for instance, participants in TOPOLOGY.items():
        records = []
        for server_name, kind in participants:
            rel = f"{GYM_STATE_DIR}/{instance}/{server_name}"
            state = staging / rel
            (state / "sub").mkdir(parents=True)
            (state / "records.jsonl").write_bytes(f'{{"{instance}": "{server_name}"}}\n'.encode())
            (state / "sub" / "x.bin").write_bytes(b"\x00\x01" + checkpoint_id.encode())
            records.append(ParticipantRecord(server_name, kind, rel, records_digest(state)))
        instances.append(InstanceRecord(instance, tuple(records)))
    manifest = GymManifest(
        version=MANIFEST_VERSION,
        checkpoint_id=checkpoint_id,
        instances=tuple(instances),
        episodes=(EpisodeRecord("r-0-1-1", "calendar", "gym-0", ("cap-1", "cap-2")),),
    )
    return staging, manifest


def _publish(store: SnapshotStore, checkpoint_id: str = "ck-1") -> Path:
    staging, manifest = _stage(store, checkpoint_id)
    info = store.publish(staging, manifest, {"ledger.json": b'{"rows": []}', "results.json": b"[]"})
    return info.path


def _resign(snapshot: Path, name: str, data: bytes) -> None:
    """Replace a top-level file *and* its marker entry, to reach the checks behind the marker."""
    (snapshot / name).write_bytes(data)
    marker = json.loads((snapshot / COMMIT_MARKER).read_bytes())
    marker["files"][name] = hashlib.sha256(data).hexdigest()
    (snapshot / COMMIT_MARKER).write_text(json.dumps(marker))


Raw = dict[str, Any]


def _edit_manifest(snapshot: Path, edit: Callable[[Raw], object]) -> None:
    raw = json.loads((snapshot / MANIFEST_NAME).read_bytes())
    edit(raw)
    _resign(snapshot, MANIFEST_NAME, json.dumps(raw).encode())


# -- publish and load --------------------------------------------------------------------------


def test_publish_load_round_trip(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    staging, manifest = _stage(store, "ck-1")
    info = store.publish(staging, manifest, {"ledger.json": b'{"rows": [1]}'})
    assert info.seq == 1 and info.checkpoint_id == "ck-1"
    assert info.path == tmp_path / "snaps" / "ckpt-000001"
    assert not staging.exists()
    loaded = load_snapshot(info.path)
    assert loaded.manifest == manifest
    assert loaded.files == {"ledger.json": b'{"rows": [1]}'}
    assert loaded.marker == CommitMarker(
        version=1,
        checkpoint_id="ck-1",
        seq=1,
        files={
            "gym_checkpoint.json": hashlib.sha256(
                (info.path / MANIFEST_NAME).read_bytes()
            ).hexdigest(),
            "ledger.json": hashlib.sha256(b'{"rows": [1]}').hexdigest(),
        },
    )
    assert verify_snapshot(loaded, TOPOLOGY) == []
    check_snapshot(loaded, TOPOLOGY)
    assert store.list_complete() == [info]
    assert store.latest_complete() == info


def test_snapshot_can_be_moved_and_still_verifies(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path / "snaps"))
    moved = tmp_path / "elsewhere" / "copy"
    moved.parent.mkdir()
    os.rename(path, moved)
    assert verify_snapshot(load_snapshot(moved), TOPOLOGY) == []


def test_seq_grows_and_latest_is_newest(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    paths = [_publish(store, f"ck-{i}") for i in range(3)]
    assert [p.name for p in paths] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    latest = store.latest_complete()
    assert latest is not None and latest.checkpoint_id == "ck-2" and latest.seq == 3


def test_publish_rejects_bad_names_and_foreign_staging(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    staging, manifest = _stage(store, "ck-1")
    for name in ("a/b", "..", "", COMMIT_MARKER, MANIFEST_NAME, GYM_STATE_DIR):
        with pytest.raises(ValueError):
            store.publish(staging, manifest, {name: b"x"})
    with pytest.raises(ValueError, match="not a staging directory"):
        store.publish(tmp_path / "elsewhere", manifest, {})
    with pytest.raises(ValueError, match="checkpoint 'ck-2'"):
        store.publish(staging, attrs.evolve(manifest, checkpoint_id="ck-2"), {})
    assert store.list_complete() == []


def test_publish_rejects_manifest_without_topology(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    staging, manifest = _stage(store, "ck-1")
    with pytest.raises(ManifestError, match="no participant topology"):
        store.publish(staging, attrs.evolve(manifest, instances=()), {})
    assert store.list_complete() == []


# -- the commit marker -------------------------------------------------------------------------


def test_staging_dir_is_not_complete(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    staging, _manifest = _stage(store, "ck-1")
    assert store.list_complete() == []
    assert store.latest_complete() is None
    with pytest.raises(
        ManifestError, match=r"not a complete rollout snapshot: no COMMITTED marker"
    ):
        load_snapshot(staging)


def test_removed_marker_makes_dir_incomplete(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    first = _publish(store, "ck-1")
    second = _publish(store, "ck-2")
    (second / COMMIT_MARKER).unlink()
    assert [i.path for i in store.list_complete()] == [first]
    with pytest.raises(ManifestError, match=r"no COMMITTED marker"):
        load_snapshot(second)
    # the next publish does not reuse the incomplete directory's name
    assert _publish(store, "ck-3").name == "ckpt-000003"


def test_invalid_marker(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = _publish(store)
    (path / COMMIT_MARKER).write_bytes(b'{"version": 1')
    assert store.list_complete() == []
    with pytest.raises(ManifestError, match=r"invalid COMMITTED marker"):
        load_snapshot(path)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such snapshot directory"):
        load_snapshot(tmp_path / "nope")


def test_file_missing_after_commit(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    (path / "ledger.json").unlink()
    with pytest.raises(ManifestError, match=r"^ledger.json: listed in COMMITTED but missing"):
        load_snapshot(path)


# -- digests -----------------------------------------------------------------------------------


def test_hand_edited_manifest_names_file_and_both_digests(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    committed = hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
    raw = json.loads((path / MANIFEST_NAME).read_bytes())
    raw["episodes"]["replica"][0] = "gym-1"
    edited = json.dumps(raw).encode()
    (path / MANIFEST_NAME).write_bytes(edited)
    found = hashlib.sha256(edited).hexdigest()
    with pytest.raises(ManifestError) as info:
        load_snapshot(path)
    assert str(info.value) == (
        f"gym_checkpoint.json: sha256 {found[:12]}… on disk, {committed[:12]}… committed"
    )


def test_tampered_participant_state_lists_exactly_that_participant(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    snapshot = load_snapshot(path)
    committed = next(
        p.records_digest
        for p in snapshot.manifest.instances[1].participants
        if p.server_name == "calendar"
    )
    records = path / "gym" / "gym-1" / "calendar" / "sub" / "x.bin"
    data = bytearray(records.read_bytes())
    data[0] ^= 0x01
    records.write_bytes(bytes(data))
    found = records_digest(path / "gym" / "gym-1" / "calendar")
    diffs = verify_snapshot(snapshot)
    assert diffs == [
        f"instance gym-1: participant calendar digest {found[:19]}… on disk, "
        f"{committed[:19]}… committed"
    ]
    assert diffs[0].startswith("instance gym-1: participant calendar digest sha256:")
    with pytest.raises(TopologyMismatch) as info:
        check_snapshot(snapshot, TOPOLOGY)
    assert info.value.differences == tuple(diffs)


def test_missing_participant_state_dir(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    snapshot = load_snapshot(path)
    shutil.rmtree(path / "gym" / "gym-0" / "agent")
    assert verify_snapshot(snapshot) == [
        "instance gym-0: participant agent state directory gym/gym-0/agent missing on disk"
    ]


def test_records_digest_is_deterministic_and_sees_renames(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "d").mkdir(parents=True)
    (state / "a.txt").write_bytes(b"hello")
    (state / "d" / "b.txt").write_bytes(b"world")
    first = records_digest(state)
    assert first == records_digest(state)
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64
    os.rename(state / "a.txt", state / "c.txt")
    assert records_digest(state) != first
    os.rename(state / "c.txt", state / "a.txt")
    assert records_digest(state) == first
    (state / "empty").mkdir()  # an empty directory holds no records
    assert records_digest(state) == first
    # moving content between files changes the digest
    (state / "a.txt").write_bytes(b"hellow")
    (state / "d" / "b.txt").write_bytes(b"orld")
    assert records_digest(state) != first
    with pytest.raises(FileNotFoundError):
        records_digest(tmp_path / "nope")


# -- manifest structure ------------------------------------------------------------------------


def _manifest_error(tmp_path: Path, edit: Callable[[Path], object]) -> str:
    path = _publish(SnapshotStore(tmp_path))
    edit(path)
    with pytest.raises(ManifestError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_manifest(tmp_path: Path) -> None:
    def truncate(path: Path) -> None:
        _resign(path, MANIFEST_NAME, (path / MANIFEST_NAME).read_bytes()[:40])

    assert _manifest_error(tmp_path, truncate).startswith("gym_checkpoint.json: not valid JSON")


def test_truncated_manifest_without_resign_fails_the_digest(tmp_path: Path) -> None:
    def truncate(path: Path) -> None:
        (path / MANIFEST_NAME).write_bytes((path / MANIFEST_NAME).read_bytes()[:40])

    message = _manifest_error(tmp_path, truncate)
    assert message.startswith("gym_checkpoint.json: sha256 ") and "committed" in message


def test_empty_manifest(tmp_path: Path) -> None:
    message = _manifest_error(tmp_path, lambda p: _resign(p, MANIFEST_NAME, b""))
    assert message == "gym_checkpoint.json: file is empty"


def test_manifest_not_an_object(tmp_path: Path) -> None:
    message = _manifest_error(tmp_path, lambda p: _resign(p, MANIFEST_NAME, b"[1, 2]"))
    assert message == "gym_checkpoint.json: expected a JSON object, got list"


def test_foreign_version(tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        raw["version"] = MANIFEST_VERSION + 1
        raw["something_new"] = True

    message = _manifest_error(tmp_path, lambda p: _edit_manifest(p, edit))
    assert message == (
        f"gym_checkpoint.json: version {MANIFEST_VERSION + 1} is not supported "
        "(this runtime reads versions 4, 5 and 6): it was written by a newer gymckpt "
        "release: restore it with that release (or a newer one), or start this run fresh "
        "(restore=False, or another work directory)"
    )


def test_unknown_key(tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        raw["instances"][0]["participants"][1]["colour"] = "blue"

    message = _manifest_error(tmp_path, lambda p: _edit_manifest(p, edit))
    assert message.startswith("gym_checkpoint.json:")
    assert "colour" in message and "$.instances[0].participants[1]" in message


def test_missing_key(tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        del raw["instances"][1]["participants"][0]["records_digest"]

    message = _manifest_error(tmp_path, lambda p: _edit_manifest(p, edit))
    assert message.startswith("gym_checkpoint.json:")
    assert "$.instances[1].participants[0].records_digest" in message


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda raw: raw.update(instances=[]),
            "gym_checkpoint.json: manifest has no participant topology (no instances)",
        ),
        (
            lambda raw: raw["instances"][1].update(participants=[]),
            "gym_checkpoint.json: manifest has no participant topology "
            "(instance gym-1 has no participants)",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(kind="Robot!"),
            "gym_checkpoint.json: instance gym-0: participant agent: kind 'Robot!' is not a "
            "participant kind name ([a-z][a-z0-9_.-]{0,63}, e.g. environment, legacy_agent, "
            "model_proxy, simple_agent)",
        ),
        (
            lambda raw: raw["instances"][1].update(name="gym-0"),
            "gym_checkpoint.json: instance gym-0 listed twice",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][1].update(server_name="agent"),
            "gym_checkpoint.json: instance gym-0: participant agent listed twice",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(state_dir="/etc"),
            "gym_checkpoint.json: instance gym-0: participant agent: state_dir '/etc' is "
            "absolute; it must be relative",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(
                state_dir="gym/../../outside"
            ),
            "gym_checkpoint.json: instance gym-0: participant agent: state_dir "
            "'gym/../../outside' contains '..'; it must stay inside",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(state_dir=""),
            "gym_checkpoint.json: instance gym-0: participant agent: state_dir '' must name "
            "a directory in the snapshot",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(records_digest="abc"),
            "gym_checkpoint.json: instance gym-0: participant agent: records_digest 'abc' is "
            "not sha256:<64 hex digits>",
        ),
        (
            lambda raw: raw["episodes"]["replica"].__setitem__(0, "gym-9"),
            "gym_checkpoint.json: episode r-0-1-1: replica 'gym-9' is not an instance",
        ),
        (
            lambda raw: raw["episodes"].update(owner=["model_proxy"], replica=["gym-1"]),
            "gym_checkpoint.json: episode r-0-1-1: owner 'model_proxy' is not a participant "
            "of instance gym-1",
        ),
        (
            lambda raw: [column.append(column[0]) for column in raw["episodes"].values()],
            "gym_checkpoint.json: episode r-0-1-1 listed twice",
        ),
        (
            lambda raw: raw.update(checkpoint_id="ck-other"),
            "gym_checkpoint.json: checkpoint_id 'ck-other', but COMMITTED is for 'ck-1'",
        ),
        (
            lambda raw: raw["instances"][0]["participants"][0].update(version=1),
            None,
        ),
    ],
)
def test_invalid_manifest_structure(
    tmp_path: Path, edit: Callable[[Raw], object], expected: str | None
) -> None:
    message = _manifest_error(tmp_path, lambda p: _edit_manifest(p, edit))
    if expected is None:
        assert "version" in message and message.startswith("gym_checkpoint.json:")
    else:
        assert message == expected


def test_symlink_escaping_the_snapshot(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    def escape(path: Path) -> None:
        link = path / "gym" / "gym-0" / "link"
        link.symlink_to(outside, target_is_directory=True)
        _edit_manifest(
            path,
            lambda raw: raw["instances"][0]["participants"][0].update(state_dir="gym/gym-0/link"),
        )

    message = _manifest_error(tmp_path / "snaps", escape)
    assert message.startswith(
        "gym_checkpoint.json: instance gym-0: participant agent: state_dir 'gym/gym-0/link' "
        "resolves to "
    )
    assert message.endswith("outside the snapshot")


def test_symlink_inside_the_snapshot_is_fine(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    (path / "gym" / "alias").symlink_to("gym-0/agent", target_is_directory=True)
    _edit_manifest(
        path, lambda raw: raw["instances"][0]["participants"][0].update(state_dir="gym/alias")
    )
    assert verify_snapshot(load_snapshot(path)) == []


# -- live topology -----------------------------------------------------------------------------


def test_live_topology_differences_are_all_listed(tmp_path: Path) -> None:
    snapshot = load_snapshot(_publish(SnapshotStore(tmp_path)))
    live = {
        "gym-0": [
            ("agent", "simple_agent"),
            ("calendar", "environment"),
            ("model_proxy", "legacy_agent"),
            ("foo", "environment"),
        ],
        "gym-2": [("agent", "simple_agent")],
    }
    assert verify_snapshot(snapshot, live) == [
        "instance gym-0: participant model_proxy kind model_proxy committed, legacy_agent live",
        "instance gym-0: extra live participant foo",
        "instance gym-1: missing from the live deployment",
        "instance gym-2: live but not in the manifest",
    ]


def test_live_missing_participant_and_order(tmp_path: Path) -> None:
    snapshot = load_snapshot(_publish(SnapshotStore(tmp_path)))
    live = {
        "gym-0": [("model_proxy", "model_proxy"), ("agent", "simple_agent")],
        "gym-1": [
            ("agent", "legacy_agent"),
            ("calendar", "environment"),
            ("calendar", "environment"),
        ],
    }
    assert verify_snapshot(snapshot, live) == [
        "instance gym-0: participant calendar missing from the live deployment",
        "instance gym-0: participant order agent, model_proxy committed, model_proxy, agent live",
        "instance gym-1: live participant calendar listed twice",
    ]
    with pytest.raises(TopologyMismatch, match="3 difference"):
        check_snapshot(snapshot, live)


# -- pin and prune -----------------------------------------------------------------------------


def test_prune_keeps_newest_and_protected(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    paths = [_publish(store, f"ck-{i}") for i in range(5)]
    removed = store.prune(keep=2, protect=[paths[1]])
    assert removed == [paths[0], paths[2]]
    assert [i.path for i in store.list_complete()] == [paths[1], paths[3], paths[4]]
    assert store.prune(keep=2, protect=[paths[1]]) == []
    with pytest.raises(ValueError, match="keep must be >= 0"):
        store.prune(keep=-1)


def test_pin_copies_and_survives_pruning(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    paths = [_publish(store, f"ck-{i}") for i in range(3)]
    chosen = store.list_complete()[0]
    copy = store.pin(chosen, tmp_path / "restore" / "chosen")
    assert copy.path == tmp_path / "restore" / "chosen"
    assert (copy.checkpoint_id, copy.seq) == (chosen.checkpoint_id, chosen.seq)
    assert store.prune(keep=0) == paths
    assert store.list_complete() == []
    loaded = load_snapshot(copy.path)
    assert loaded.manifest.checkpoint_id == "ck-0"
    assert verify_snapshot(loaded, TOPOLOGY) == []
    # pinning again to the same place is idempotent; a different checkpoint there is refused
    assert store.pin(chosen, copy.path) == copy
    assert store.pinned == frozenset({copy.path.resolve()})
    leftovers = [p.name for p in (tmp_path / "restore").iterdir()]
    assert leftovers == ["chosen"]


def test_pinned_snapshot_inside_root_is_never_pruned(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    _publish(store, "ck-0")
    copy = store.pin(store.list_complete()[0], tmp_path / "snaps" / "restore-ck-0")
    assert store.prune(keep=0) == [tmp_path / "snaps" / "ckpt-000001"]
    assert copy.path.is_dir()
    with pytest.raises(ValueError, match="collide"):
        store.pin(copy, tmp_path / "snaps" / "ckpt-000009")


def test_pin_refuses_occupied_destination(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    _publish(store, "ck-0")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FileExistsError):
        store.pin(store.list_complete()[0], dest)


def test_prune_removes_stale_staging_but_not_active(tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    old = SnapshotStore(root)
    stale = old.begin("crashed")  # a previous process died here
    store = SnapshotStore(root)
    active, _manifest = _stage(store, "ck-live")
    assert store.prune(keep=3) == [stale]
    assert active.is_dir()
    store.abort(active)
    assert not active.exists()
    store.abort(active)  # already gone: no error


def test_begin_replaces_leftover_staging(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    staging = store.begin("ck-1")
    (staging / "gym" / "junk").write_bytes(b"x")
    again = store.begin("ck-1")
    assert again == staging
    assert list(again.iterdir()) == [again / "gym"]
    assert list((again / "gym").iterdir()) == []
    with pytest.raises(ValueError, match="plain file name"):
        store.begin("../escape")


# -- atomic writes -----------------------------------------------------------------------------


def test_write_atomic_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "ledger.json"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_write_atomic_failure_keeps_old_file_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "ledger.json"
    write_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_publish_leaves_no_temp_files(tmp_path: Path) -> None:
    path = _publish(SnapshotStore(tmp_path))
    assert sorted(p.name for p in path.iterdir()) == [
        COMMIT_MARKER,
        GYM_STATE_DIR,
        MANIFEST_NAME,
        "ledger.json",
        "results.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 2048])
def test_dumps_chunked_is_orjson_byte_for_byte(chunk: int) -> None:
    """Serialising long lists a chunk per call (so another thread gets the GIL between chunks)
    changes no byte: sorted or insertion-ordered keys, lists and tuples of any length around
    the chunk size, nested values untouched."""
    import orjson

    from gymckpt.runtime._shared import dumps_chunked

    rng = random.Random(chunk)
    for n in (0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk + 1, 50):
        items = [
            {"z": i, "a": [rng.random(), None, "é"], "m": {"y": 1, "b": 2}}
            for i in range(max(n, 0))
        ]
        obj = {"zeta": items, "alpha": tuple(range(max(n, 0))), "mid": "x", "n": {"k": items[:2]}}
        for option in (0, orjson.OPT_SORT_KEYS):
            assert dumps_chunked(obj, option, chunk=chunk) == orjson.dumps(obj, option=option)
    with pytest.raises(ValueError, match="compact"):
        dumps_chunked({}, orjson.OPT_INDENT_2)
