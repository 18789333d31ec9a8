"""The snapshot's on-disk format: every record round-trips, bad input is refused by name, and
records as the Gym host writes them read back."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest
from cattrs.preconf.orjson import make_converter

from gymckpt.runtime import ManifestError, _store
from gymckpt.runtime._snapshot_format import (
    COMMIT_MARKER,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    MARKER_VERSION,
    RECORDS_FILE,
    AgentRecords,
    AgentSession,
    CommitMarker,
    EpisodeColumns,
    EpisodeRecord,
    GymManifest,
    InstanceRecord,
    ParticipantRecord,
    SessionRecord,
    SessionRecords,
    StagedCall,
    StagedEpisode,
    StagedRecords,
    StepRecord,
    agent_records_plain,
    dump_manifest,
    dump_marker,
    dump_records,
    dump_step,
    load_manifest,
    load_marker,
    load_records,
    load_step,
    records_to_plain,
    session_records_plain,
    staged_records_plain,
)

DIGEST = "sha256:" + "ab" * 32

MANIFEST = GymManifest(
    MANIFEST_VERSION,
    "c7",
    (
        InstanceRecord(
            "gym-0",
            (
                ParticipantRecord("agent", "simple_agent", "gym/gym-0/agent", DIGEST),
                ParticipantRecord("calendar", "environment", "gym/gym-0/calendar", DIGEST),
            ),
        ),
    ),
    (
        EpisodeRecord("0-0-a0", "calendar", "gym-0", ("0-0:t0-c0",)),
        EpisodeRecord("1-1-a2", "calendar", "gym-0"),
    ),
)
MARKER = CommitMarker(MARKER_VERSION, "c7", 3, {MANIFEST_NAME: "ab" * 32}, {"trainer": DIGEST})
AGENT = AgentRecords(
    "agent",
    "simple_agent",
    "c7",
    (
        AgentSession("0-0-a0", 0, 0, 0, 2, {"r": [1.0]}),
        AgentSession("1-1-a2", 1, 1, 2, None, None),
    ),  # stranded: no step boundary
)
OWNING_AGENT = AgentRecords(
    "agent",
    "legacy_agent",
    "c7",
    (AgentSession("0-0-a0", 0, 0, 0, 0, [1, "x"]),),
    exported=("0-0-a0",),
)
SESSIONS = SessionRecords(
    "calendar",
    "environment",
    "c7",
    ("0-0-a0",),
    True,
    (
        SessionRecord("0-0", "0-0-a0", 0, {"events": [{"sentinel": "s1"}]}),
        SessionRecord("0-5", "0-5-a1", 1, {"events": []}),
    ),
)
STAGED = StagedRecords(
    "model_proxy",
    "model_proxy",
    "c7",
    (
        StagedEpisode(
            "0-0-a0",
            (
                StagedCall("0-0:t0-c0", {"text": "hi"}, "a" * 64, 0),
                StagedCall("k", 2.5, "b" * 64, 3),
            ),
        ),
        StagedEpisode("1-1-a2", ()),
    ),
)
PARTICIPANT_RECORDS = [AGENT, OWNING_AGENT, SESSIONS, STAGED]

# As ``gym_adapter.host._records.build_records`` writes them (keys sorted, compact): the
# agent's without ``exported`` and with a stranded session, an environment's retained
# sessions, the model proxy's staged calls.
WRITTEN = {
    AgentRecords: (
        b'{"checkpoint_id":"c7","kind":"simple_agent","participant":"agent","sessions":['
        b'{"attempt":0,"rollout_id":"0-0-a0","row":0,"slot":0,"state":{"r":[1.0]},'
        b'"step_boundary":2},{"attempt":2,"rollout_id":"1-1-a2","row":1,"slot":1,"state":null,'
        b'"step_boundary":null}]}'
    ),
    SessionRecords: (
        b'{"checkpoint_id":"c7","exported":["0-0-a0","1-1-a2"],"kind":"environment",'
        b'"participant":"calendar","retained":true,"sessions":[{"attempt":0,"key":"0-0",'
        b'"rollout_id":"0-0-a0","state":{"events":[{"sentinel":"s1"}]}},{"attempt":1,'
        b'"key":"0-5","rollout_id":"0-5-a1","state":{"events":[{"sentinel":"k"}]}}]}'
    ),
    StagedRecords: (
        b'{"checkpoint_id":"c7","kind":"model_proxy","participant":"model_proxy","staged":['
        b'{"calls":[{"key":"0-0:t0-c0","policy_version":0,"request_digest":"%s",'
        b'"response":{"text":"hi"}},{"key":"0-0:t1-c0","policy_version":3,"request_digest":"%s",'
        b'"response":[1,2.5]}],"rollout_id":"0-0-a0"},{"calls":[],"rollout_id":"1-1-a2"}]}'
        % (b"a" * 64, b"b" * 64)
    ),
}


# -- round trips -----------------------------------------------------------------------------


def test_the_manifest_the_marker_and_the_step_round_trip() -> None:
    assert load_manifest(dump_manifest(MANIFEST)) == MANIFEST
    assert load_marker(dump_marker(MARKER)) == MARKER
    assert load_step(dump_step(StepRecord(4))) == StepRecord(4)
    assert orjson.loads(dump_step(StepRecord(4, 2))) == {"step": 4, "policy_version": 2}
    assert load_step(b'{"step": 4}') == StepRecord(4, 0)  # written before versions were kept


@pytest.mark.parametrize("records", PARTICIPANT_RECORDS, ids=lambda r: type(r).__name__)
def test_participant_records_round_trip_with_and_without_their_role(records: Any) -> None:
    data = dump_records(records)
    assert load_records(data, RECORDS_FILE, type(records)) == records
    assert load_records(data, RECORDS_FILE) == records  # the role read from the keys


def from_columns(r: Any) -> dict[str, Any]:
    """``r`` built as the Gym host builds its records: from columns, no object per session."""
    if isinstance(r, AgentRecords):
        cols = tuple(
            [getattr(s, f) for s in r.sessions]
            for f in ("rollout_id", "row", "slot", "attempt", "step_boundary", "state")
        )
        return agent_records_plain(r.participant, r.kind, r.checkpoint_id, cols, r.exported)
    if isinstance(r, SessionRecords):
        cols = tuple(
            [getattr(s, f) for s in r.sessions] for f in ("key", "rollout_id", "attempt", "state")
        )
        return session_records_plain(
            r.participant, r.kind, r.checkpoint_id, cols, exported=r.exported, retained=r.retained
        )
    calls = [
        (e.rollout_id, [(c.key, c.response, c.request_digest, c.policy_version) for c in e.calls])
        for e in r.staged
    ]
    return staged_records_plain(r.participant, r.kind, r.checkpoint_id, calls)


@pytest.mark.parametrize("records", PARTICIPANT_RECORDS, ids=lambda r: type(r).__name__)
def test_records_built_from_columns_write_the_records_bytes(records: Any) -> None:
    plain = from_columns(records)
    assert plain == records_to_plain(records)
    assert dump_records(plain) == dump_records(records)


@pytest.mark.parametrize("records", PARTICIPANT_RECORDS, ids=lambda r: type(r).__name__)
def test_the_fast_unstructuring_is_the_converters_own(records: Any) -> None:
    """The hand-written hooks write what cattrs' generated ones would (``exported`` of an agent
    that does not own its episodes left out)."""
    generic = orjson.loads(orjson.dumps(make_converter().unstructure(records)))
    if isinstance(records, AgentRecords) and records.exported is None:
        del generic["exported"]
    assert orjson.loads(orjson.dumps(records_to_plain(records))) == generic


@pytest.mark.parametrize("cls", list(WRITTEN), ids=lambda c: c.__name__)
def test_records_as_the_host_writes_them_read_back_and_write_the_same_bytes(cls: type) -> None:
    records = load_records(WRITTEN[cls], RECORDS_FILE)
    assert type(records) is cls
    assert dump_records(records) == WRITTEN[cls]


def test_what_the_records_hold_of_the_user_is_handed_back_as_it_was() -> None:
    back = load_records(WRITTEN[AgentRecords], RECORDS_FILE, AgentRecords)
    assert back.sessions[0].state == {"r": [1.0]} and back.sessions[1].state is None
    assert back.sessions[1].step_boundary is None and back.exported is None
    staged = load_records(WRITTEN[StagedRecords], RECORDS_FILE, StagedRecords)
    assert staged.staged[0].calls[1] == StagedCall("0-0:t1-c0", [1, 2.5], "b" * 64, 3)


# -- refusals ---------------------------------------------------------------------------------


def _edit(data: bytes, change: Any) -> bytes:
    raw = orjson.loads(data)
    change(raw)
    return orjson.dumps(raw)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r["sessions"][0].pop("row"), r"required field missing @ \$\.sessions\[0\]\.row"),
        (lambda r: r.update(extra=1), r"extra fields found \(extra\)"),
        (
            lambda r: r["sessions"][1].update(attempt="2"),
            r"expected int @ \$\.sessions\[1\]\.attempt",
        ),
        (
            lambda r: r["sessions"][0].update(step_boundary=True),
            r"\$\.sessions\[0\]\.step_boundary",
        ),
        (lambda r: r.update(sessions={}), r"expected a list, got dict\) @ \$\.sessions$"),
    ],
)
def test_bad_agent_records_are_refused_naming_the_file_and_the_field(
    change: Any, says: str
) -> None:
    data = _edit(WRITTEN[AgentRecords], change)
    with pytest.raises(ManifestError, match=r"^gym-0/agent/records\.json: .*" + says):
        load_records(data, "gym-0/agent/records.json", AgentRecords)


def test_records_of_another_role_are_refused_by_what_differs() -> None:
    with pytest.raises(ManifestError, match=r"extra fields found \(retained\) @ \$$"):
        load_records(WRITTEN[SessionRecords], RECORDS_FILE, AgentRecords)
    with pytest.raises(ManifestError, match=r"required field missing @ \$\.staged"):
        load_records(
            WRITTEN[AgentRecords].replace(b'"sessions"', b'"staged"'), RECORDS_FILE, StagedRecords
        )


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "file is empty"),
        (b'{"participant": ', "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_records_that_are_not_a_json_object_are_refused(data: bytes, says: str) -> None:
    with pytest.raises(ManifestError, match=f"^{RECORDS_FILE}: {says}"):
        load_records(data, RECORDS_FILE)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"step": -1}', r"step\.json: step must be an integer >= 0, got -1"),
        (b'{"step": "3"}', r"step\.json: .*expected int @ \$\.step"),
        (b'{"step": true}', r"step\.json: .*expected int @ \$\.step"),
        (b"{}", r"step\.json: required field missing @ \$\.step"),
        (b'{"step": 1, "steps": 2}', r"step\.json: extra fields found \(steps\)"),
        (b"4", r"^step\.json: expected a JSON object, got int$"),
    ],
)
def test_a_bad_step_file_is_refused_naming_it(data: bytes, says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        load_step(data)


def test_a_manifest_or_a_marker_of_another_version_is_refused_saying_which_is_read() -> None:
    manifest = _edit(dump_manifest(MANIFEST), lambda r: r.update(version=7, future=True))
    reads = (
        r"is not supported \(this runtime reads versions 4, 5 and 6\): it was written by a newer"
    )
    with pytest.raises(ManifestError, match=rf"^{MANIFEST_NAME}: version 7 {reads}.*fresh"):
        load_manifest(manifest)
    marker = _edit(dump_marker(MARKER), lambda r: r.update(version=2))
    reads = r"is not supported \(this runtime reads version 1\)$"
    with pytest.raises(ManifestError, match=rf"^{COMMIT_MARKER}: marker version 2 {reads}"):
        load_marker(marker)


def test_a_version_1_snapshot_is_refused_saying_why_and_what_to_do() -> None:
    """Version 1 staged calls have no request digest: a restore could not check a replayed
    call, so the snapshot is refused (exit 2, a ``ManifestError``), not read half-checked."""
    manifest = _edit(dump_manifest(MANIFEST), lambda r: r.update(version=1))
    with pytest.raises(ManifestError, match=r"version 1 is not supported .*no request digest"):
        load_manifest(manifest)


def test_a_version_2_snapshot_is_refused_because_its_capture_keys_have_the_old_shape() -> None:
    """Version 2 capture keys are ``"{row}-{slot}/t{turn}/c{n}"``: a restore looks staged calls
    up by the call id of ``"{attempt_key}:t{turn}-{request digest}-c{occurrence}"``, so it would
    find none and ask the model again; the snapshot is refused saying so, and what to do."""
    manifest = _edit(dump_manifest(MANIFEST), lambda r: r.update(version=2))
    with pytest.raises(ManifestError, match=r"version 2 is not supported .*old shape.*fresh"):
        load_manifest(manifest)
    for odd in ([2], "2", True):  # not a version this runtime ever wrote: no hint, still refused
        bad = _edit(dump_manifest(MANIFEST), lambda r, v=odd: r.update(version=v))
        reads = r"is not supported \(this runtime reads versions 4, 5 and 6\)$"
        with pytest.raises(ManifestError, match=reads):
            load_manifest(bad)


def test_a_version_3_snapshot_is_refused_because_its_call_ids_follow_start_order() -> None:
    """Version 3 call ids are ``"t{turn}-c{n}"``, numbered in the order the calls started
    (which concurrent calls do not keep): a restore finds staged calls by request, so it would
    find none of them and ask the model again; refused saying so, and what to do."""
    manifest = _edit(dump_manifest(MANIFEST), lambda r: r.update(version=3))
    with pytest.raises(ManifestError, match=r"version 3 is not supported .*order calls.*fresh"):
        load_manifest(manifest)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.pop("seq"), r"required field missing @ \$\.seq"),
        (lambda r: r["files"].update({MANIFEST_NAME: 3}), r"expected str @ \$\.files"),
        (lambda r: r.update(signed=True), r"extra fields found \(signed\)"),
    ],
)
def test_a_bad_marker_is_refused_naming_the_field(change: Any, says: str) -> None:
    with pytest.raises(ManifestError, match=f"^{COMMIT_MARKER}: .*{says}"):
        load_marker(_edit(dump_marker(MARKER), change))


# -- one home -----------------------------------------------------------------------------------


def test_the_store_re_exports_the_marker_it_writes() -> None:
    assert _store.CommitMarker is CommitMarker and _store.MARKER_VERSION is MARKER_VERSION


def test_the_manifest_is_written_as_orjson_writes_it_a_chunk_at_a_time() -> None:
    """Version 6: the header indented as orjson indents it, the episodes' columns compact on one
    line (one list per field, whatever the episodes); a manifest of version 5 (still read) is
    written as that version was: an indented object per episode."""
    from gymckpt.runtime._converter import JSON_CHUNK

    episodes = tuple(
        EpisodeRecord(f"{i}-0-a0", "calendar", f"gym-{i % 3}", ("k\n1", "k2") if i % 2 else ())
        for i in range(2 * JSON_CHUNK + 5)
    )
    indent = orjson.OPT_INDENT_2
    for each in (episodes, MANIFEST.episodes):
        manifest = attrs.evolve(MANIFEST, episodes=each)
        generic = make_converter().unstructure(manifest)
        head = {k: v for k, v in generic.items() if k != "episodes"}
        columns = orjson.dumps(generic["episodes"])
        assert columns.startswith(b'{"rollout_id":[') and b"\n" not in columns
        written = dump_manifest(manifest)
        assert written == orjson.dumps(head, option=indent)[:-2] + (
            b',\n  "episodes": ' + columns + b"\n}"
        )
        assert load_manifest(written) == manifest
        assert list(load_manifest(written).episodes) == list(each)
        old = attrs.evolve(manifest, version=5)
        objects = dict(head, version=5, episodes=[make_converter().unstructure(e) for e in each])
        assert dump_manifest(old) == orjson.dumps(objects, option=indent)
        assert load_manifest(dump_manifest(old)) == old


def test_a_version_5_manifest_of_an_object_per_episode_is_read_as_columns() -> None:
    """The manifest a snapshot of the previous release holds (version 5: an object per
    episode) restores: its episodes are read in order, as the columns version 6 writes."""
    old = b"""{
  "version": 5,
  "checkpoint_id": "c7",
  "instances": [{"name": "gym-0", "participants": [{"server_name": "calendar",
    "kind": "environment", "state_dir": "gym/gym-0/calendar", "records_digest": "%s"}]}],
  "episodes": [
    {"rollout_id": "0-0-a0", "owner": "calendar", "replica": "gym-0", "capture_keys": ["k"]},
    {"rollout_id": "1-1-a2", "owner": "calendar", "replica": "gym-0", "capture_keys": []}
  ]
}""" % DIGEST.encode()
    manifest = load_manifest(old)
    assert manifest.version == 5
    assert manifest.episodes == EpisodeColumns(
        ("0-0-a0", "1-1-a2"), ("calendar",) * 2, ("gym-0",) * 2, (("k",), ())
    )
    assert manifest.episodes[1] == EpisodeRecord("1-1-a2", "calendar", "gym-0")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda e: e["owner"].pop(), r"owner has 1 entries, rollout_id 2"),
        (lambda e: e["capture_keys"].append([]), r"capture_keys has 3 entries, rollout_id 2"),
        (lambda e: e["replica"].__setitem__(0, 7), r"expected str .*\$\.episodes\.replica"),
        (lambda e: e.pop("owner"), r"required field missing @ \$\.episodes\.owner"),
        (lambda e: e.update(extra=[]), r"extra fields found \(extra\) @ \$\.episodes"),
    ],
)
def test_episode_columns_of_another_shape_are_refused_naming_the_column(
    change: Any, says: str
) -> None:
    bad = _edit(dump_manifest(MANIFEST), lambda r: change(r["episodes"]))
    with pytest.raises(ManifestError, match=f"^{MANIFEST_NAME}: .*{says}"):
        load_manifest(bad)


@pytest.mark.parametrize("chunk", [1, 2, 3, 1000])
def test_indented_chunks_are_orjsons_bytes(chunk: int) -> None:
    from gymckpt.runtime._snapshot_format import _dumps_indented_chunked

    obj = {
        "a": [],
        "b": {},
        "c": [1, {"x": [1, 2], "y": "a\nb", "z": {}}],
        "d": [[], [[1]], {"k": []}, "s"] * 3,
        "e": list(range(7)),
        "f": [{"k": [i, "s"], "n": None} for i in range(5)],
    }
    assert _dumps_indented_chunked(obj, chunk) == orjson.dumps(obj, option=orjson.OPT_INDENT_2)
    assert _dumps_indented_chunked({}, chunk) == b"{}"
