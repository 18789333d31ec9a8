"""Incremental snapshots (``runtime._store`` module docstring): records in content-defined chunks,
each an object of the root's shared store hard-linked into every snapshot that references it;
participants' own objects carried the same way; prune by link counts, then the sweep; verify
checks every reference; a snapshot directory stays self-contained. Real files, real links, a
real SIGKILL."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from plain_state import PlainState

from gymckpt.gym_adapter import Done, EmbeddedGym, Environment, EnvironmentRef, GymHost, RunRow
from gymckpt.gym_adapter._contract import GymControlError
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.runtime import (
    EpisodeRecord,
    InstanceRecord,
    ManifestError,
    ParticipantRecord,
    SnapshotStore,
    load_snapshot,
    records_digest,
)
from gymckpt.runtime._shared import (
    MANIFEST_VERSION,
    RECORDS_FILE,
    GymManifest,
    SessionRecords,
    chunk_records,
    read_snapshot_records,
    session_records_plain,
)
from gymckpt.runtime._store import verify_snapshot
from gymckpt.runtime.lowlevel import ObjectStore, SnapshotObjects

V4_SNAPSHOT = Path(__file__).parent / "data" / "snapshot-v4" / "ckpt-000001"


def deadline() -> float:
    return trio.current_time() + 30.0


# -- the store: chunks shared between snapshots, prune, sweep, verify, copies ----------------


SESSIONS = 8_000
"""Sessions of the test participant: several chunks of ~1,024 (``CHUNK_BITS``)."""


def _sessions(n: int, changed: int | None = None, inserted: int | None = None) -> dict[str, Any]:
    keys = [f"{row:06d}-0" for row in range(n)]
    states: list[Any] = [{"events": [row], "note": "x" * 200} for row in range(n)]
    if changed is not None:
        states[changed] = {"events": [changed, 1], "note": "changed"}
    if inserted is not None:  # a session between two others, in key order
        keys.insert(inserted + 1, f"{inserted:06d}-1")
        states.insert(inserted + 1, {"events": [], "note": "inserted"})
    return session_records_plain(
        "cal",
        "environment",
        "c",
        (keys, keys, [0] * len(keys), states),
        exported=(),
        retained=True,
    )


def _publish(
    store: SnapshotStore, checkpoint_id: str, changed: int | None = None, **edit: Any
) -> Any:
    """A snapshot of one instance whose participant ``cal`` holds 8,000 sessions (one of them
    ``changed``), written as the host writes records: chunks into the shared store, linked."""
    staging = store.begin(checkpoint_id)
    objects = SnapshotObjects.of_snapshot(staging, ObjectStore.of_snapshot_root(store.root))
    chunked = chunk_records(_sessions(SESSIONS, changed, **edit))
    refs = {k: [objects.put_bytes(c) for c in chunks] for k, chunks in chunked.chunks.items()}
    objects.sync()
    directory = staging / "gym" / "gym-0" / "cal"
    directory.mkdir(parents=True)
    (directory / RECORDS_FILE).write_bytes(chunked.index(refs))
    participant = ParticipantRecord(
        "cal", "environment", "gym/gym-0/cal", records_digest(directory)
    )
    manifest = GymManifest(
        MANIFEST_VERSION, checkpoint_id, (InstanceRecord("gym-0", (participant,)),), ()
    )
    return store.publish(staging, manifest, {"ledger.json": b"{}"})


def _objects_of(snapshot: Path) -> dict[str, os.stat_result]:
    own = ObjectStore(snapshot / "objects")
    return {ref: own.path(ref).stat() for ref in own.refs()}


def test_a_second_checkpoint_links_every_unchanged_chunk_and_writes_only_the_changed_one(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    first = _publish(store, "c1")
    second = _publish(store, "c2", changed=1500)
    a, b = _objects_of(first.path), _objects_of(second.path)
    assert len(a) > 3  # ~1,024 sessions a chunk
    shared = set(a) & set(b)
    assert len(set(b) - shared) == 1 and len(set(a) - shared) == 1  # one chunk changed
    for ref in shared:  # the same file: one inode, linked by the store and both snapshots
        assert (a[ref].st_ino, a[ref].st_dev) == (b[ref].st_ino, b[ref].st_dev)
        assert os.stat(ObjectStore.of_snapshot_root(store.root).path(ref)).st_nlink == 3
    assert first.stats.objects_linked == 0 and first.stats.objects_new == len(a)
    assert second.stats.objects_linked == len(shared) and second.stats.objects_new == 1
    assert second.stats.bytes_written < first.stats.bytes_written / 3
    records = read_snapshot_records(second.path, "gym/gym-0/cal", SessionRecords)
    assert len(records.sessions) == SESSIONS and records.sessions[1500].state["note"] == "changed"
    # a session inserted: content-defined boundaries, so only its chunk changes (the ones
    # after it do not shift)
    third = _publish(store, "c3", inserted=300)
    c = _objects_of(third.path)
    assert len(set(c) - set(a)) == 1 and third.stats.objects_new == 1
    records = read_snapshot_records(third.path, "gym/gym-0/cal", SessionRecords)
    assert (
        len(records.sessions) == SESSIONS + 1 and records.sessions[301].state["note"] == "inserted"
    )


def test_pruning_the_older_snapshot_keeps_the_newer_verifiable_and_sweeps_what_none_links(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    first = _publish(store, "c1")
    second = _publish(store, "c2", changed=3)
    only_first = set(_objects_of(first.path)) - set(_objects_of(second.path))
    shared = ObjectStore.of_snapshot_root(store.root)
    assert store.prune(1) == [first.path]
    assert verify_snapshot(load_snapshot(second.path)) == []
    assert [shared.has(ref) for ref in only_first] == [False]  # swept: no snapshot links it
    assert set(shared.refs()) == set(_objects_of(second.path))
    assert len(read_snapshot_records(second.path, "gym/gym-0/cal").sessions) == SESSIONS


def test_the_sweep_leaves_an_open_staging_directory_s_objects_alone(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    _publish(store, "c1")
    staging = store.begin("c2")
    objects = SnapshotObjects.of_snapshot(staging, ObjectStore.of_snapshot_root(store.root))
    ref = objects.put_bytes(b"being committed")
    store.prune(0)  # every snapshot goes; the staging directory is this store's, still open
    assert ObjectStore.of_snapshot_root(store.root).has(ref)
    assert objects.own.read(ref) == b"being committed"


def test_a_copied_snapshot_verifies_and_reads_on_its_own(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    _publish(store, "c1")
    second = _publish(store, "c2", changed=7)
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(second.path, copy)
    shutil.rmtree(store.root)  # the store and its shared objects are gone
    assert verify_snapshot(load_snapshot(copy)) == []
    records = read_snapshot_records(copy, "gym/gym-0/cal", SessionRecords)
    assert records.sessions[7].state["note"] == "changed"


def test_a_missing_or_changed_object_fails_verify_naming_its_path(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    info = _publish(store, "c1")
    index = orjson.loads((info.path / "gym/gym-0/cal" / RECORDS_FILE).read_bytes())
    first, second = index["chunks"]["sessions"][:2]
    own = ObjectStore(info.path / "objects")
    own.path(first).unlink()
    changed = own.path(second)
    data = changed.read_bytes()
    changed.unlink()  # the shared store's link keeps its bytes; the snapshot gets other ones
    changed.write_bytes(data.replace(b"x", b"y", 1))
    problems = verify_snapshot(load_snapshot(info.path))
    assert any(f"object {first} is missing ({own.path(first)})" in p for p in problems), problems
    assert any(f"object {second} holds" in p and "changed on disk" in p for p in problems)
    with pytest.raises(ManifestError, match=rf"chunk {first} missing \({own.path(first)}\)"):
        read_snapshot_records(info.path, "gym/gym-0/cal")


# -- a crash between the objects and the publish ----------------------------------------------

_CRASH_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gymckpt.runtime import SnapshotStore
    from gymckpt.runtime.lowlevel import ObjectStore, SnapshotObjects

    store = SnapshotStore(Path(sys.argv[1]))
    staging = store.begin("c2")
    objects = SnapshotObjects.of_snapshot(staging, ObjectStore.of_snapshot_root(store.root))
    ref = objects.put_bytes(b"an object of a checkpoint that never published")
    objects.sync()
    print(ref, flush=True)
    sys.stdin.read()  # killed here: objects written, nothing published
    """
)


@pytest.mark.subprocess
def test_a_sigkill_between_the_objects_and_the_publish_leaves_a_restorable_store(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    first = _publish(store, "c1")
    with subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, str(store.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as child:
        try:
            assert child.stdout is not None
            ref = child.stdout.readline().decode().strip()
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=60) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    shared = ObjectStore.of_snapshot_root(store.root)
    assert shared.has(ref)  # written before the kill
    fresh = SnapshotStore(store.root)
    latest = fresh.latest_complete()
    assert latest is not None and latest.path == first.path
    assert verify_snapshot(load_snapshot(latest.path)) == []
    assert len(read_snapshot_records(latest.path, "gym/gym-0/cal").sessions) == SESSIONS
    fresh.prune(1)  # the stale staging directory goes, then its object: nothing links it
    assert not shared.has(ref)
    assert verify_snapshot(load_snapshot(latest.path)) == []
    then = _publish(fresh, "c3", changed=0)  # and the store goes on
    assert then.seq == 2 and verify_snapshot(load_snapshot(then.path)) == []


# -- participants' own objects: the hook (Participant docstring) -------------------------------


@attrs.define
class Blobs:
    """A user participant keeping each session's text as an object of its own store: its
    exported state names the object (``object_refs``), ``restore`` reads it back."""

    objects: ObjectStore
    name: str = "blobs"
    kind: str = "environment"
    lie: bool = False

    def open(self, info: EpisodeInfo) -> Any:
        return {"text": ""}

    def export(self, state: Any) -> Any:
        if self.lie:  # names an object it never stored
            return {"ref": "sha256:" + hashlib.sha256(b"never stored").hexdigest()}
        return {"ref": self.objects.put_bytes(state["text"].encode(), set())}

    def restore(self, data: Any) -> Any:
        return {"text": self.objects.read(data["ref"]).decode()}

    def object_refs(self, data: Any) -> list[str]:
        return [data["ref"]]


class Writer(PlainState):
    """One turn a second, each appending a line to the blob; it never ends."""

    name, kind = "agent", "simple_agent"

    async def step(self, ctx: Any, state: Any) -> Done | None:
        await trio.sleep(1.0)
        ctx.session("blobs")["text"] += f"turn {ctx.turn}\n"
        return None


def _parts(reply: Any) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    record = InstanceRecord(
        reply.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, reply.instance, e.capture_keys) for e in reply.exported
    ]
    return record, episodes


async def _commit(blobs: Blobs, root: Path) -> Any:
    """The commit reply (or the error the commit raised) of a host with ``blobs``, once the
    agent wrote a few turns; and the committed blob's reference."""
    async with GymHost("gym-0", Environment(agent=Writer(), participants=(blobs,))) as host:
        stream = await host.run([RunRow("0-0", 0, 0, 0)])
        await trio.sleep(2.5)  # turns written
        await host.prepare("c1", deadline())
        try:
            reply: Any = await host.commit("c1", str(root), deadline())
        except GymControlError as exc:
            reply = exc
        await stream.aclose()
    if isinstance(reply, Exception):
        raise reply
    return reply, read_snapshot_records(root, "gym-0/blobs").sessions[0].state["ref"]


async def test_a_participant_s_objects_go_into_the_snapshot_and_back_into_a_fresh_store(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    reply, ref = await _commit(Blobs(ObjectStore(tmp_path / "first-store")), root)
    text = ObjectStore(root / "objects").read(ref)  # the snapshot holds it
    assert text.startswith(b"turn 0\nturn 1\n")
    record, episodes = _parts(reply)
    fresh = Blobs(ObjectStore(tmp_path / "fresh-store"))  # knows nothing of it
    environment = Environment(agent=Writer(), participants=(fresh,))
    async with GymHost("gym-0", environment) as host:
        await host.restore(str(root), record, episodes, deadline())
        assert host.session_states("blobs")["0-0"].state == {"text": text.decode()}
    assert fresh.objects.read(ref) == text  # put back from the snapshot, checked


async def test_a_restore_refuses_a_participant_object_missing_from_the_snapshot(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = tmp_path / "snap"
    reply, ref = await _commit(Blobs(ObjectStore(tmp_path / "first-store")), root)
    ObjectStore(root / "objects").path(ref).unlink()
    record, episodes = _parts(reply)
    environment = Environment(agent=Writer(), participants=(Blobs(ObjectStore(tmp_path / "f")),))
    async with GymHost("gym-0", environment) as host:
        with pytest.raises(Exception, match=rf"participant blobs: object {ref} is missing"):
            await host.restore(str(root), record, episodes, deadline())
        assert host.inventory().unclaimed == ()


async def test_a_commit_fails_naming_the_participant_and_an_object_missing_from_its_store(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    ref = "sha256:" + hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(GymControlError, match=rf"participant blobs: .*names object {ref}"):
        await _commit(Blobs(ObjectStore(tmp_path / "store"), lie=True), tmp_path / "snap")


# -- snapshots written before: version 4, records inline --------------------------------------


def test_a_version_4_snapshot_still_loads_verifies_and_reads(tmp_path: Path) -> None:
    copy = tmp_path / "ckpt-000001"
    shutil.copytree(V4_SNAPSHOT, copy)
    snap = load_snapshot(copy)
    assert snap.manifest.version == 4 and not (copy / "objects").exists()
    assert verify_snapshot(snap) == []
    records = read_snapshot_records(copy, "gym/gym-0/calendar", SessionRecords)
    assert records.sessions and records.retained


async def test_a_version_4_snapshot_still_restores_on_todays_host(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The golden run's first snapshot, as the release before chunks wrote it (calendar, two
    instances, seed 7): every instance restores its episodes from the inline records."""
    copy = tmp_path / "ckpt-000001"
    shutil.copytree(V4_SNAPSHOT, copy)
    snap = load_snapshot(copy)
    sim = CalendarConfig(turns=(2, 3), turn_s=(0.5, 1.5), mutation_p=1.0)
    environment = EnvironmentRef.to(calendar_environment, config=sim)
    async with EmbeddedGym.host(
        [environment, environment], 2, 7, tmp_path / "gym", sim.host_config()
    ) as gym:
        restored = 0
        for record in snap.manifest.instances:
            episodes = [e for e in snap.manifest.episodes if e.replica == record.name]
            reply = await gym.restore(record.name, str(copy), record, episodes, deadline())
            assert sorted(reply.restored) == sorted(e.rollout_id for e in episodes)
            restored += len(reply.restored)
    assert restored == len(snap.manifest.episodes) > 0


def test_records_of_a_newer_version_are_refused_saying_what_to_do(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    info = _publish(store, "c1")
    path = info.path / "gym/gym-0/cal" / RECORDS_FILE
    path.write_bytes(path.read_bytes().replace(b'"version":2', b'"version":3'))
    with pytest.raises(ManifestError, match=r"records version 3 is not supported .*newer gymckpt"):
        read_snapshot_records(info.path, "gym/gym-0/cal")
