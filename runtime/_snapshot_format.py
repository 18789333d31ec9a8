"""The rollout snapshot's on-disk format: every file name, every version, every record.

A published snapshot ``ckpt-NNNNNN/`` holds the commit marker (written last: its presence makes
the snapshot complete, and it lists every other top-level file with its sha256), the Gym
manifest, the ledger, the trainer's step and state and files, and Gym's participant records
under ``gym/``::

    COMMITTED                 CommitMarker     (MARKER_VERSION)
    gym_checkpoint.json       GymManifest      (MANIFEST_VERSION)
    ledger.json               LedgerSnapshot   (LEDGER_SNAPSHOT_VERSION)
    step.json                 StepRecord
    trainer.json              the trainer's state: opaque bytes, not a record of ours
    trainer/                  the trainer's files: opaque, digested in the marker
    gym/<instance>/<participant>/records.json
                              AgentRecords | SessionRecords | StagedRecords, as an index
                              of chunks (RECORDS_VERSION)
    objects/sha256/<aa>/<hex> the snapshot's objects: record chunks, participants' objects

Every record is a frozen attrs class structured through the library's strict converter
(``_converter``): a missing, extra or wrongly typed key, a value out of range or an unsupported
version is a ``ManifestError`` that names the file and the field, never a ``KeyError`` for the
caller to catch. What a record holds that is the user's (a participant's exported session
state, a model response) is finite plain data, handed back as it was written. Semantic checks
across records (topology, digests, paths inside the snapshot) belong to the store and to Gym's
restore; this module only says what each file is.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar, cast, overload

import attrs
import orjson

from ._converter import JSON_CHUNK, converter, dumps, dumps_chunked, loads, structure
from ._errors import ManifestError
from ._ledger_records import EpisodeResult, RestoredGymState, RetireItem
from ._objects import OBJECT_REF_RE, ObjectStore
from ._plain import NotPlainData, checked_json

__all__ = [
    "CHECKPOINT_SEQ_FILE",
    "CHUNK_BITS",
    "CHUNK_MAX",
    "COMMIT_MARKER",
    "GYM_STATE_DIR",
    "LEDGER_COLUMNS",
    "LEDGER_FILE",
    "LEDGER_SNAPSHOT_VERSION",
    "LOCK_FILE",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "MARKER_VERSION",
    "NEWER_MANIFEST_ADVICE",
    "OBJECTS_KEY",
    "OBJECT_EPISODES_VERSIONS",
    "PARTICIPANT_KINDS",
    "PARTICIPANT_KIND_RE",
    "PIN_TMP_PREFIX",
    "PRUNING_PREFIX",
    "READ_LEDGER_VERSIONS",
    "READ_MANIFEST_VERSIONS",
    "RECORDS_FILE",
    "RECORDS_VERSION",
    "RESTORED_DIR",
    "SNAPSHOTS_DIR",
    "SNAPSHOT_PREFIX",
    "SNAPSHOT_RE",
    "STAGING_PREFIX",
    "STEP_FILE",
    "TRAINER_FILES_DIR",
    "TRAINER_STATE_FILE",
    "AgentRecords",
    "AgentSession",
    "AttemptRow",
    "ChunkedRecords",
    "CommitMarker",
    "CommittedRecords",
    "EpisodeColumns",
    "EpisodeRecord",
    "GymManifest",
    "InstanceRecord",
    "LedgerSnapshot",
    "ParticipantRecord",
    "SessionRecord",
    "SessionRecords",
    "StagedCall",
    "StagedEpisode",
    "StagedRecords",
    "StepRecord",
    "agent_records_plain",
    "chunk_records",
    "dump_ledger_snapshot",
    "dump_manifest",
    "dump_marker",
    "dump_records",
    "dump_step",
    "ledger_bytes",
    "load_ledger_snapshot",
    "load_manifest",
    "load_marker",
    "load_records",
    "load_step",
    "read_chunk",
    "records_chunk_refs",
    "records_to_plain",
    "session_records_plain",
    "split_chunks",
    "staged_records_plain",
]

R = TypeVar("R", bound="AgentRecords | SessionRecords | StagedRecords")

# -- file and directory names --------------------------------------------------------------

COMMIT_MARKER: Final = "COMMITTED"
"""The commit marker: written last, it makes the snapshot complete."""
MANIFEST_NAME: Final = "gym_checkpoint.json"
"""The Gym manifest: participant topology, digests and exported episodes."""
LEDGER_FILE: Final = "ledger.json"
"""The recovery ledger's snapshot: attempts, rows trained and failed, results not yet trained."""
TRAINER_STATE_FILE: Final = "trainer.json"
"""The state the trainer saved with the checkpoint (opaque bytes, JSON or not)."""
STEP_FILE: Final = "step.json"
"""The trainer facade's step counter (``StepRecord``): steps trained before this snapshot,
across every incarnation (a resumed run's logger steps go on from it, never backwards)."""
TRAINER_FILES_DIR: Final = "trainer"
"""The directory holding the trainer's own files (weights, optimizer shards)."""
GYM_STATE_DIR: Final = "gym"
"""The directory Gym's participants commit their records under (each in its ``state_dir``)."""
RECORDS_FILE: Final = "records.json"
"""In a participant's ``state_dir``: its committed records (``load_records``)."""
SNAPSHOTS_DIR: Final = "snapshots"
"""In the work directory: the snapshot store (``ckpt-NNNNNN/`` …)."""
RESTORED_DIR: Final = "restored"
"""In the work directory: the pinned copies of the snapshots restores started from."""
LOCK_FILE: Final = ".gymckpt.lock"
"""In the work directory (not a snapshot): the lock one trainer holds while it runs."""

SNAPSHOT_PREFIX: Final = "ckpt-"
"""A complete snapshot's directory is ``ckpt-`` and its sequence number, six digits or more."""
SNAPSHOT_RE: Final = re.compile(r"ckpt-(\d{6,})")
STAGING_PREFIX: Final = ".staging-"
"""In the store: ``.staging-<checkpoint_id>``, a snapshot being built (never listed)."""
PRUNING_PREFIX: Final = ".pruning-"
"""In the store: a snapshot renamed out of the ``ckpt-`` namespace before it is deleted."""
PIN_TMP_PREFIX: Final = ".pin-"
"""Beside the pinned copies: a copy being made (renamed into place once complete)."""
CHECKPOINT_SEQ_FILE: Final = ".checkpoint-seq"
"""In the store: the highest sequence number ever published (sequence numbers never repeat)."""

# -- versions ------------------------------------------------------------------------------

MANIFEST_VERSION: Final = 6
"""The ``version`` of ``gym_checkpoint.json`` this runtime writes. Version 2 gave every staged
model call its request digest and policy version (``StagedCall``); version 3 gave capture keys
NeMo Gym's shape (``"{attempt_key}:t{turn}-c{n}"``, was ``"{row}-{slot}/t{turn}/c{n}"``);
version 4 made the call id say which request it is (``"t{turn}-{request digest}-c{occurrence}"``,
was ``"t{turn}-c{n}"`` numbered in the order calls started, which concurrent calls do not
keep); version 5 snapshots keep their participant records in chunks, objects of the snapshot's
``objects/`` (``RECORDS_VERSION``), and the objects participants name; version 6 writes the
episodes as columns (``EpisodeColumns``: one list per field, on one line) instead of an
indented object per episode — at 1M in flight version 5's episodes were 118 MB, built and
written in seconds. Versions 4 and 5 are read as they were written (``READ_MANIFEST_VERSIONS``);
an older one is refused (``OLD_MANIFEST_HINTS``), a newer one too (``NEWER_MANIFEST_ADVICE``)."""
READ_MANIFEST_VERSIONS: Final = frozenset({4, 5, MANIFEST_VERSION})
"""The manifest versions this runtime reads (and restores): 4's records are inline, which the
records reader still takes (``load_records``); 4's and 5's episodes are objects
(``OBJECT_EPISODES_VERSIONS``)."""
OBJECT_EPISODES_VERSIONS: Final = frozenset({4, 5})
"""Manifest versions whose ``episodes`` are a list of objects, one per episode."""
OLD_MANIFEST_HINTS: Final[Mapping[int, str]] = {
    1: (
        "a version 1 snapshot's model calls carry no request digest or policy version, so a "
        "restore could not check a replayed call"
    ),
    2: (
        'a version 2 snapshot\'s capture keys have the old shape "{row}-{slot}/t{turn}/c{n}" '
        '(now "{attempt_key}:t{turn}-{request digest}-c{occurrence}"), so a restore would not '
        "find its staged calls and would ask the model again"
    ),
    3: (
        'a version 3 snapshot\'s call ids are "t{turn}-c{n}", numbered in the order calls '
        'started (now "t{turn}-{request digest}-c{occurrence}"), so a restore would not find '
        "its staged calls and would ask the model again"
    ),
}
"""Why a snapshot of an older manifest version cannot be restored, by version."""
OLD_MANIFEST_ADVICE: Final = (
    "finish that run with the gymckpt release that wrote it, or start this one fresh "
    "(restore=False, or another work directory)"
)
NEWER_MANIFEST_ADVICE: Final = (
    "it was written by a newer gymckpt release: restore it with that release (or a newer "
    "one), or start this run fresh (restore=False, or another work directory)"
)
MARKER_VERSION: Final = 1
"""The ``version`` of ``COMMITTED`` this runtime writes and reads."""


def _check_version(what: str, raw: object) -> None:
    """Refuse a manifest whose ``version`` is present and not one this runtime reads (before
    its structure: a manifest of another version may well have other fields), saying why and
    what to do for one it knows of."""
    if not isinstance(raw, dict) or "version" not in raw:
        return
    version = raw["version"]
    if type(version) is not int or version not in READ_MANIFEST_VERSIONS:
        hint = ""
        if type(version) is int and version in OLD_MANIFEST_HINTS:
            hint = f": {OLD_MANIFEST_HINTS[version]}; {OLD_MANIFEST_ADVICE}"
        elif type(version) is int and version > MANIFEST_VERSION:
            hint = f": {NEWER_MANIFEST_ADVICE}"
        raise ManifestError(
            f"{what}: version {version!r} is not supported "
            f"(this runtime reads versions {_versions(READ_MANIFEST_VERSIONS)}){hint}"
        )


def _versions(versions: frozenset[int]) -> str:
    """``{4, 5}`` as ``"4 and 5"``."""
    *first, last = sorted(versions)
    return f"{', '.join(map(str, first))} and {last}" if first else str(last)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    if not data.strip():
        raise ManifestError(f"{what}: file is empty")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{what}: not valid JSON, truncated? ({exc})") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


# -- the Gym manifest (gym_checkpoint.json) ------------------------------------------------

PARTICIPANT_KINDS: Final = frozenset({"simple_agent", "legacy_agent", "environment", "model_proxy"})
"""The built-in participant kinds. Kinds are open: a deployment may register more (the Gym host's
``register_participant_kind``), so a manifest's kind must only be a well-formed name; whether the
live deployment has it is the restore's topology check."""
PARTICIPANT_KIND_RE: Final = re.compile(r"[a-z][a-z0-9_.-]{0,63}")


@attrs.frozen
class ParticipantRecord:
    """One participant of one instance as committed: where its records are, and their digest."""

    server_name: str
    kind: str
    state_dir: str
    records_digest: str


@attrs.frozen
class InstanceRecord:
    """One Gym instance (replica) and its participants, in topology order."""

    name: str
    participants: tuple[ParticipantRecord, ...]


@attrs.frozen
class EpisodeRecord:
    """An episode Gym exported at commit: who owns it, where it runs, its staged model calls."""

    rollout_id: str
    owner: str
    replica: str
    capture_keys: tuple[str, ...] = ()


def _same_length(instance: EpisodeColumns, _attribute: object, value: Sequence[object]) -> None:
    if len(value) != len(instance.rollout_id):
        raise ValueError(
            f"episodes: {_attribute.name} has {len(value)} entries, "  # type: ignore[attr-defined]
            f"rollout_id {len(instance.rollout_id)}: every column has one per episode"
        )


def _str_tuple(value: Sequence[Any]) -> tuple[Any, ...]:
    return value if type(value) is tuple else tuple(value)


@attrs.frozen
class EpisodeColumns:
    """A manifest's episodes as columns: episode ``i`` is ``(rollout_id[i], owner[i],
    replica[i], capture_keys[i])``. Invariant: every column has one entry per episode.

    A sequence of ``EpisodeRecord`` (``len``, iteration and indexing build the records on
    demand); what is written is the columns (``MANIFEST_VERSION`` 6), so a checkpoint of 1M
    episodes builds no object per episode. ``of`` makes columns from records; equality is
    the columns'."""

    rollout_id: Sequence[str] = attrs.field(converter=_str_tuple)
    owner: Sequence[str] = attrs.field(converter=_str_tuple, validator=_same_length)
    replica: Sequence[str] = attrs.field(converter=_str_tuple, validator=_same_length)
    capture_keys: Sequence[Sequence[str]] = attrs.field(
        converter=_str_tuple, validator=_same_length
    )

    @classmethod
    def of(cls, episodes: Iterable[EpisodeRecord] | EpisodeColumns) -> EpisodeColumns:
        """``episodes`` as columns (the same object if they are columns already)."""
        if isinstance(episodes, EpisodeColumns):
            return episodes
        records = tuple(episodes)
        return cls(
            tuple(e.rollout_id for e in records),
            tuple(e.owner for e in records),
            tuple(e.replica for e in records),
            tuple(tuple(e.capture_keys) for e in records),
        )

    def __len__(self) -> int:
        return len(self.rollout_id)

    def __iter__(self) -> Iterator[EpisodeRecord]:
        for rid, owner, replica, keys in zip(
            self.rollout_id, self.owner, self.replica, self.capture_keys, strict=True
        ):
            yield EpisodeRecord(rid, owner, replica, tuple(keys))

    def __getitem__(self, i: int) -> EpisodeRecord:
        return EpisodeRecord(
            self.rollout_id[i], self.owner[i], self.replica[i], tuple(self.capture_keys[i])
        )

    def without(self, rollout_ids: Collection[str]) -> EpisodeColumns:
        """These columns less the episodes whose ID is in ``rollout_ids`` (self if none is)."""
        if not rollout_ids:
            return self
        keep = [i for i, rid in enumerate(self.rollout_id) if rid not in rollout_ids]
        if len(keep) == len(self):
            return self
        return EpisodeColumns(
            *([column[i] for i in keep] for column in attrs.astuple(self, recurse=False))
        )


@attrs.frozen
class GymManifest:
    """The whole manifest. ``version`` is one of ``READ_MANIFEST_VERSIONS``
    (``MANIFEST_VERSION`` for what this runtime writes); ``episodes`` are held as columns
    whatever the version read (records given are made columns: ``EpisodeColumns.of``)."""

    version: int
    checkpoint_id: str
    instances: tuple[InstanceRecord, ...]
    episodes: EpisodeColumns = attrs.field(converter=EpisodeColumns.of)


@attrs.frozen
class _ObjectEpisodesManifest:
    """The shape of a manifest of ``OBJECT_EPISODES_VERSIONS``: an object per episode."""

    version: int
    checkpoint_id: str
    instances: tuple[InstanceRecord, ...]
    episodes: tuple[EpisodeRecord, ...]


def _dumps_indented_chunked(obj: Mapping[str, Any], chunk: int = JSON_CHUNK) -> bytes:
    """``orjson.dumps(obj, option=OPT_INDENT_2)``, byte for byte, for a non-empty JSON object
    whose long list values are serialised ``chunk`` items per call (as ``dumps_chunked``).

    A value one level down is the value serialised alone with every line after its first
    indented two more spaces: in orjson's output a newline is only ever indentation (one
    inside a string is written ``\\n``). Keys in insertion order."""
    if not obj:
        return b"{}"
    parts = [b"{"]
    for i, (key, value) in enumerate(obj.items()):
        if not isinstance(key, str):
            raise TypeError(f"_dumps_indented_chunked: keys must be str, got {key!r}")
        parts.append(b",\n  " if i else b"\n  ")
        parts.append(orjson.dumps(key) + b": ")
        if isinstance(value, list | tuple) and len(value) > chunk:
            # each chunk alone is "[\n  a,\n  b\n]": its items, indented a level deeper
            pieces = [
                orjson.dumps(value[j : j + chunk], option=orjson.OPT_INDENT_2)[1:-2].replace(
                    b"\n", b"\n  "
                )
                for j in range(0, len(value), chunk)
            ]
            parts.append(b"[" + b",".join(pieces) + b"\n  ]")
        else:
            parts.append(orjson.dumps(value, option=orjson.OPT_INDENT_2).replace(b"\n", b"\n  "))
    parts.append(b"\n}")
    return b"".join(parts)


def _instances_plain(instances: Iterable[InstanceRecord]) -> list[dict[str, Any]]:
    return [
        {
            "name": i.name,
            "participants": [
                {
                    "server_name": p.server_name,
                    "kind": p.kind,
                    "state_dir": p.state_dir,
                    "records_digest": p.records_digest,
                }
                for p in i.participants
            ],
        }
        for i in instances
    ]


def _episodes_plain(m: GymManifest) -> dict[str, Any] | list[dict[str, Any]]:
    """The episodes as written: columns (version 6), or an object per episode for a manifest
    of ``OBJECT_EPISODES_VERSIONS``."""
    e = m.episodes
    if m.version not in OBJECT_EPISODES_VERSIONS:
        return {
            "rollout_id": e.rollout_id,
            "owner": e.owner,
            "replica": e.replica,
            "capture_keys": e.capture_keys,
        }
    return [
        {"rollout_id": r, "owner": o, "replica": p, "capture_keys": list(k)}
        for r, o, p, k in zip(e.rollout_id, e.owner, e.replica, e.capture_keys, strict=True)
    ]


def _manifest_plain(m: GymManifest) -> dict[str, Any]:
    # by hand: a manifest holds an episode per rollout in flight (1M), and the converter's
    # generic hooks cost a call per element and per field; ``tests/test_snapshot_format.py``
    # holds this equal to the converter's own unstructuring (tuples where it writes lists)
    return {
        "version": m.version,
        "checkpoint_id": m.checkpoint_id,
        "instances": _instances_plain(m.instances),
        "episodes": _episodes_plain(m),
    }


converter.register_unstructure_hook(GymManifest, _manifest_plain)


def dump_manifest(manifest: GymManifest) -> bytes:
    """The manifest's bytes on disk: JSON indented by two spaces, keys in field order (what
    ``orjson.dumps(..., option=OPT_INDENT_2)`` writes), except the episodes' columns (version
    6), each compact on one line; the long lists are serialised a chunk at a time
    (``dumps_chunked``), so a worker thread writing the manifest of 1M episodes never holds
    the GIL long."""
    plain = _manifest_plain(manifest)
    if manifest.version in OBJECT_EPISODES_VERSIONS:
        return _dumps_indented_chunked(plain)
    columns = plain.pop("episodes")
    head = orjson.dumps(plain, option=orjson.OPT_INDENT_2)
    return b"".join((head[:-2], b',\n  "episodes": ', dumps_chunked(columns), b"\n}"))


def load_manifest(data: bytes) -> GymManifest:
    """Parse ``gym_checkpoint.json`` strictly: a non-empty JSON object of a supported version
    with exactly the known keys, else a ``ManifestError`` naming the file and the field.

    Structure only: ``load_snapshot`` also checks names, kinds, digests and paths."""
    raw = _json_object(data, MANIFEST_NAME)
    _check_version(MANIFEST_NAME, raw)
    if raw.get("version") in OBJECT_EPISODES_VERSIONS:
        old = structure(raw, _ObjectEpisodesManifest, MANIFEST_NAME)
        return GymManifest(old.version, old.checkpoint_id, old.instances, old.episodes)
    return structure(raw, GymManifest, MANIFEST_NAME)


# -- the commit marker (COMMITTED) ---------------------------------------------------------


@attrs.frozen
class CommitMarker:
    """Contents of ``COMMITTED``: the checkpoint, its sequence number, and the sha256 (hex) of
    every top-level file of the snapshot, ``gym_checkpoint.json`` included; ``trees`` maps a
    top-level directory the trainer wrote (``trainer/``: weights, optimizer shards) to its
    ``records_digest``. ``version`` must equal ``MARKER_VERSION``."""

    version: int
    checkpoint_id: str
    seq: int
    files: dict[str, str]
    trees: dict[str, str] = attrs.field(factory=dict)


def dump_marker(marker: CommitMarker) -> bytes:
    """The marker's bytes on disk."""
    return dumps(marker)


def load_marker(data: bytes) -> CommitMarker:
    """Parse ``COMMITTED`` strictly; a bad one (or one of another version) is ``ManifestError``."""
    marker = loads(data, CommitMarker, COMMIT_MARKER)
    if marker.version != MARKER_VERSION:
        raise ManifestError(
            f"{COMMIT_MARKER}: marker version {marker.version} is not supported "
            f"(this runtime reads version {MARKER_VERSION})"
        )
    return marker


# -- the trainer's step (step.json) --------------------------------------------------------


def _non_negative(_record: object, _attribute: object, value: int) -> None:
    if value < 0:
        raise ValueError(f"step must be an integer >= 0, got {value!r}")


@attrs.frozen
class StepRecord:
    """``step.json``: the steps the trainer facade trained before this snapshot (>= 0), and
    the trainer's policy version at the cut (``Rollouts.set_policy_version``; >= 0). A
    ``step.json`` written before the policy version was kept has no ``policy_version``: it
    reads as 0, the version such a run's calls carried after a restore."""

    step: int = attrs.field(validator=_non_negative)
    policy_version: int = attrs.field(default=0, validator=_non_negative)


def dump_step(record: StepRecord) -> bytes:
    """``{"policy_version": V, "step": N}`` as bytes."""
    return orjson.dumps(converter.unstructure(record))


def load_step(data: bytes) -> StepRecord:
    """Parse ``step.json`` strictly; a bad one is ``ManifestError`` naming the file."""
    return loads(data, StepRecord, STEP_FILE)


# -- participant records (gym/<instance>/<participant>/records.json) -----------------------
#
# One file per participant of an instance, written at each commit by the Gym host. Three
# shapes, one per role: the agent's (every held episode's session, with its step boundary), any
# other participant's (environment, tool, custom kinds: its sessions by slot key, the episodes
# it exports, whether its sessions outlive their episode), and the model proxy's (the calls
# staged per episode). Keys are written sorted (``OPT_SORT_KEYS``); long lists are serialised a
# chunk at a time (``dumps_chunked``) so a commit of 200k episodes never holds the GIL long.


@attrs.frozen
class AgentSession:
    """One held episode's agent session. ``step_boundary`` is the turn it is parked at, None
    for a stranded session (it cannot be restored); ``state`` is the agent's exported state."""

    rollout_id: str
    row: int
    slot: int
    attempt: int
    step_boundary: int | None
    state: Any


@attrs.frozen
class AgentRecords:
    """The agent's records. ``exported`` is present only when the agent owns its episodes
    (no environment participant): the rollout IDs it exports."""

    participant: str
    kind: str
    checkpoint_id: str
    sessions: tuple[AgentSession, ...]
    exported: tuple[str, ...] | None = None


@attrs.frozen
class SessionRecord:
    """One session of a (non-agent) participant: its slot key, the episode attempt holding it,
    the participant's exported state."""

    key: str
    rollout_id: str
    attempt: int
    state: Any


@attrs.frozen
class SessionRecords:
    """A non-agent participant's records: its sessions (sorted by key when ``retained``: those
    of ended episodes' slots are kept too), and the episodes it exports (empty unless it owns
    them)."""

    participant: str
    kind: str
    checkpoint_id: str
    exported: tuple[str, ...]
    retained: bool
    sessions: tuple[SessionRecord, ...]


@attrs.frozen
class StagedCall:
    """A model call staged before the commit: answered again from here after a restore.
    ``request_digest`` is the sha256 (hex) of the request's canonical JSON (sorted keys): a
    restored call whose request differs is refused, not answered; ``policy_version`` is the
    trainer's policy version the instance knew when the call was made."""

    key: str
    response: Any
    request_digest: str
    policy_version: int


@attrs.frozen
class StagedEpisode:
    """One held episode's staged model calls, in the order they were made."""

    rollout_id: str
    calls: tuple[StagedCall, ...]


@attrs.frozen
class StagedRecords:
    """The model proxy's records: each held episode's staged calls."""

    participant: str
    kind: str
    checkpoint_id: str
    staged: tuple[StagedEpisode, ...]


CommittedRecords: TypeAlias = AgentRecords | SessionRecords | StagedRecords
"""One participant's ``records.json``, whichever role."""


# Unstructured by hand, one comprehension per list: a commit writes one session per held
# episode and participant (200k of them), and the converter's generic hooks cost a function call
# per element and per field. The user's states go as they are (finite plain data: the host
# checked), and ``exported`` is absent from the agent's records unless it owns the episodes.
# ``tests/test_snapshot_format.py`` holds these equal to the converter's own unstructuring.


def _agent_plain(r: AgentRecords) -> dict[str, Any]:
    plain: dict[str, Any] = {
        "participant": r.participant,
        "kind": r.kind,
        "checkpoint_id": r.checkpoint_id,
        "sessions": [
            {
                "rollout_id": s.rollout_id,
                "row": s.row,
                "slot": s.slot,
                "attempt": s.attempt,
                "step_boundary": s.step_boundary,
                "state": s.state,
            }
            for s in r.sessions
        ],
    }
    if r.exported is not None:
        plain["exported"] = list(r.exported)
    return plain


def _sessions_plain(r: SessionRecords) -> dict[str, Any]:
    return {
        "participant": r.participant,
        "kind": r.kind,
        "checkpoint_id": r.checkpoint_id,
        "exported": list(r.exported),
        "retained": r.retained,
        "sessions": [
            {"key": s.key, "rollout_id": s.rollout_id, "attempt": s.attempt, "state": s.state}
            for s in r.sessions
        ],
    }


def _staged_plain(r: StagedRecords) -> dict[str, Any]:
    return {
        "participant": r.participant,
        "kind": r.kind,
        "checkpoint_id": r.checkpoint_id,
        "staged": [
            {
                "rollout_id": e.rollout_id,
                "calls": [
                    {
                        "key": c.key,
                        "policy_version": c.policy_version,
                        "request_digest": c.request_digest,
                        "response": c.response,
                    }
                    for c in e.calls
                ],
            }
            for e in r.staged
        ],
    }


def agent_records_plain(
    participant: str,
    kind: str,
    checkpoint_id: str,
    columns: tuple[
        Sequence[str],
        Sequence[int],
        Sequence[int],
        Sequence[int],
        Sequence[int | None],
        Sequence[Any],
    ],
    exported: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``records_to_plain`` of the ``AgentRecords`` whose sessions are the rows of ``columns``
    (rollout IDs, rows, slots, attempts, step boundaries, states: equal lengths), built from
    the columns without a record object per session (what a commit of 200k episodes writes;
    the reader, ``load_records``, stays strict). The caller's values are of the fields' types
    and the states finite plain data, as for the records themselves."""
    plain: dict[str, Any] = {
        "participant": participant,
        "kind": kind,
        "checkpoint_id": checkpoint_id,
        "sessions": [
            {
                "rollout_id": rid,
                "row": row,
                "slot": slot,
                "attempt": attempt,
                "step_boundary": boundary,
                "state": state,
            }
            for rid, row, slot, attempt, boundary, state in zip(*columns, strict=True)
        ],
    }
    if exported is not None:
        plain["exported"] = list(exported)
    return plain


def session_records_plain(
    participant: str,
    kind: str,
    checkpoint_id: str,
    columns: tuple[Sequence[str], Sequence[str], Sequence[int], Sequence[Any]],
    *,
    exported: Sequence[str],
    retained: bool,
) -> dict[str, Any]:
    """``records_to_plain`` of the ``SessionRecords`` whose sessions are the rows of
    ``columns`` (keys, rollout IDs, attempts, states), in that order (a retained
    participant's: sorted by key, which the caller does), built as ``agent_records_plain``
    is."""
    return {
        "participant": participant,
        "kind": kind,
        "checkpoint_id": checkpoint_id,
        "exported": list(exported),
        "retained": retained,
        "sessions": [
            {"key": key, "rollout_id": rid, "attempt": attempt, "state": state}
            for key, rid, attempt, state in zip(*columns, strict=True)
        ],
    }


def staged_records_plain(
    participant: str,
    kind: str,
    checkpoint_id: str,
    staged: Iterable[tuple[str, Iterable[tuple[str, Any, str, int]]]],
) -> dict[str, Any]:
    """``records_to_plain`` of the ``StagedRecords`` of ``staged`` ((rollout ID, its calls as
    (capture key, response, request digest, policy version)) per episode), built as
    ``agent_records_plain`` is."""
    return {
        "participant": participant,
        "kind": kind,
        "checkpoint_id": checkpoint_id,
        "staged": [
            {
                "rollout_id": rid,
                "calls": [
                    {"key": k, "policy_version": v, "request_digest": d, "response": r}
                    for k, r, d, v in calls
                ],
            }
            for rid, calls in staged
        ],
    }


converter.register_unstructure_hook(AgentRecords, _agent_plain)
converter.register_unstructure_hook(SessionRecords, _sessions_plain)
converter.register_unstructure_hook(StagedRecords, _staged_plain)


def records_to_plain(records: CommittedRecords) -> dict[str, Any]:
    """The JSON object ``records`` is on disk (before serialisation)."""
    plain: dict[str, Any] = converter.unstructure(records)
    return plain


def dump_records(records: CommittedRecords | Mapping[str, Any]) -> bytes:
    """A participant's ``records.json`` bytes: compact, keys sorted, long lists a chunk at a
    time. Raises ``TypeError`` / ``orjson.JSONEncodeError`` for what is not JSON."""
    plain = records if isinstance(records, Mapping) else records_to_plain(records)
    return dumps_chunked(plain, orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def _role(raw: Mapping[str, Any]) -> type[CommittedRecords]:
    if "staged" in raw:
        return StagedRecords
    if "retained" in raw:
        return SessionRecords
    return AgentRecords


@overload
def load_records(
    data: bytes, what: str, *, objects: ObjectStore | None = None
) -> CommittedRecords: ...
@overload
def load_records(
    data: bytes, what: str, expect: type[R], *, objects: ObjectStore | None = None
) -> R: ...
def load_records(
    data: bytes,
    what: str,
    expect: type[Any] | None = None,
    *,
    objects: ObjectStore | None = None,
) -> CommittedRecords:
    """Parse one participant's ``records.json`` strictly, as ``expect`` or (without it) as the
    role its keys say: ``staged`` is the model proxy's, ``retained`` another participant's,
    else the agent's. An index of chunks (``RECORDS_VERSION``) is read whole first, each chunk
    from ``objects`` (the snapshot's ``objects/``) checked against its reference; records
    written before chunks (no ``version``) are read as they are. Anything else (not JSON, a
    missing, extra or wrongly typed key, a missing or changed chunk, a newer version) is a
    ``ManifestError`` starting with ``what`` (the file, as the caller names it)."""
    raw = _json_object(data, what)
    if "version" in raw or "chunks" in raw:
        raw = _inline_chunks(raw, what, objects)
    return structure(raw, expect if expect is not None else _role(raw), what)


# -- records in chunks (RECORDS_VERSION 2) -------------------------------------------------
#
# A participant's records.json is a small index: every key of the records but the long list
# (``sessions``, or the model proxy's ``staged``), a ``version``, and ``chunks``: for that list,
# and for ``objects`` (the sorted references of the objects the participant's states name), the
# references of the chunk objects holding it, in order. A chunk is a JSON array of consecutive
# entries. Boundaries are content-defined: a chunk ends after an entry whose key's hash has its
# low ``CHUNK_BITS`` bits zero (or at ``CHUNK_MAX`` entries), so a chunk is ~1,024 entries, and an
# entry added, changed or removed changes only its own chunk: the others keep their bytes, so
# their objects are already in the shared store and are only linked, never written again. The
# manifest's records digest covers records.json, whose references cover the chunks.

RECORDS_VERSION: Final = 2
"""The ``version`` of a participant's ``records.json`` index this runtime writes and reads.
Records without ``version`` (version 1, inline, what a version 4 manifest's snapshot holds)
are read as they are."""
CHUNK_BITS: Final = 10
"""A chunk ends after an entry whose key's blake2b hash has these low bits zero (~1,024 a
chunk). Each chunk is a file fsynced on its own: at ~256 a chunk, a commit of 200k sessions
spent more time in fsyncs than in building its records (commit 1.20 s against 0.68 s before
chunking at 50k in flight, ``gymckpt bench checkpoint``), and sessions that change between two
checkpoints are spread over the keys, so smaller chunks rarely share more."""
CHUNK_MAX: Final = 8192
"""No chunk holds more entries (a run of unlucky keys is still cut)."""
OBJECTS_KEY: Final = "objects"
"""In an index's ``chunks``: the references of the objects the participant's states name."""
_CHUNKED: Final = ("sessions", "staged")
_MASK: Final = (1 << CHUNK_BITS) - 1
_CHUNK_OPTS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _entry_key(entry: Any) -> bytes:
    if isinstance(entry, str):
        return entry.encode()
    key = entry.get("key", entry.get("rollout_id", ""))
    return str(key).encode()


def split_chunks(entries: Sequence[Any]) -> list[Sequence[Any]]:
    """``entries`` cut into chunks at content-defined boundaries (module section above)."""
    chunks: list[Sequence[Any]] = []
    start = 0
    for i, entry in enumerate(entries):
        digest = hashlib.blake2b(_entry_key(entry), digest_size=4).digest()
        if not (int.from_bytes(digest, "little") & _MASK) or i + 1 - start >= CHUNK_MAX:
            chunks.append(entries[start : i + 1])
            start = i + 1
    if start < len(entries):
        chunks.append(entries[start:])
    return chunks


@attrs.frozen
class ChunkedRecords:
    """One participant's records ready to write: ``head`` (the index but its references) and
    each chunked list's chunks as JSON bytes; ``object_refs``: the objects the participant's
    states name, sorted (chunked too, as ``objects``)."""

    head: dict[str, Any]
    chunks: dict[str, list[bytes]]
    object_refs: tuple[str, ...] = ()

    def with_objects(self, refs: Iterable[str]) -> ChunkedRecords:
        """These records naming the objects ``refs`` too."""
        ordered = tuple(sorted(set(refs)))
        chunks = {k: v for k, v in self.chunks.items() if k != OBJECTS_KEY}
        if ordered:
            chunks[OBJECTS_KEY] = [orjson.dumps(list(c)) for c in split_chunks(ordered)]
        return ChunkedRecords(self.head, chunks, ordered)

    def index(self, refs: Mapping[str, Sequence[str]]) -> bytes:
        """``records.json``: the head, ``version`` and ``refs`` (each list's chunk refs)."""
        return orjson.dumps(
            {
                **self.head,
                "version": RECORDS_VERSION,
                "chunks": {k: list(v) for k, v in refs.items()},
            },
            option=orjson.OPT_SORT_KEYS,
        )


def chunk_records(plain: Mapping[str, Any]) -> ChunkedRecords:
    """``plain`` (``records_to_plain``'s form) as chunks. Raises ``TypeError`` /
    ``orjson.JSONEncodeError`` for what is not JSON."""
    head = {k: v for k, v in plain.items() if k not in _CHUNKED}
    chunks = {
        k: [orjson.dumps(list(c), option=_CHUNK_OPTS) for c in split_chunks(plain[k])]
        for k in _CHUNKED
        if k in plain
    }
    return ChunkedRecords(head, chunks)


def records_chunk_refs(data: bytes, what: str) -> dict[str, list[str]]:
    """The chunk references of a ``records.json`` index by list (empty for inline records);
    ``ManifestError`` if the index is not one."""
    raw = _json_object(data, what)
    if "version" not in raw and "chunks" not in raw:
        return {}
    return _chunk_refs(raw, what)


def _chunk_refs(raw: Mapping[str, Any], what: str) -> dict[str, list[str]]:
    _check_records_version(raw, what)
    chunks = raw.get("chunks")
    if not isinstance(chunks, dict) or not set(chunks) <= {*_CHUNKED, OBJECTS_KEY}:
        raise ManifestError(
            f"{what}: chunks must map {', '.join((*_CHUNKED, OBJECTS_KEY))} to references"
        )
    out: dict[str, list[str]] = {}
    for key, refs in chunks.items():
        if not isinstance(refs, list) or not all(
            isinstance(r, str) and OBJECT_REF_RE.fullmatch(r) for r in refs
        ):
            raise ManifestError(f"{what}: chunks.{key} must be a list of object references")
        out[key] = refs
    return out


def read_chunk(objects: ObjectStore | None, ref: str, what: str) -> list[Any]:
    """The entries of chunk ``ref`` from ``objects``, checked (``ManifestError`` naming the
    object's path if it is missing, changed or not a JSON array)."""
    if objects is None:
        raise ManifestError(f"{what}: its chunks are objects, but no objects/ was given")
    path = objects.path(ref)
    try:
        data = objects.read(ref)
    except FileNotFoundError:
        raise ManifestError(f"{what}: chunk {ref} missing ({path})") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{what}: chunk {ref} at {path} unreadable: {exc}") from None
    try:
        entries = orjson.loads(data)
    except orjson.JSONDecodeError:
        entries = None
    if not isinstance(entries, list):
        raise ManifestError(f"{what}: chunk {ref} at {path} is not a JSON array")
    return entries


def _check_records_version(raw: Mapping[str, Any], what: str) -> None:
    version = raw.get("version")
    if version != RECORDS_VERSION:
        newer = type(version) is int and version > RECORDS_VERSION
        raise ManifestError(
            f"{what}: records version {version!r} is not supported (this runtime reads "
            f"version {RECORDS_VERSION})" + (f": {NEWER_MANIFEST_ADVICE}" if newer else "")
        )


def _inline_chunks(raw: dict[str, Any], what: str, objects: ObjectStore | None) -> dict[str, Any]:
    """The records ``raw`` (an index) names, with its chunked lists read back inline."""
    refs = _chunk_refs(raw, what)
    out = {k: v for k, v in raw.items() if k not in ("version", "chunks")}
    for key, chunk_refs in refs.items():
        if key == OBJECTS_KEY:
            continue
        entries: list[Any] = []
        for ref in chunk_refs:
            entries.extend(read_chunk(objects, ref, what))
        out[key] = entries
    return out


# -- the ledger (ledger.json) --------------------------------------------------------------
#
# The restore rules (what a DISPATCHED attempt becomes, which rows are ready) and the writer
# that reads the ledger's columns belong to the ledger (``_ledger_snapshot``); this section
# only says what the file is. A ledger holds up to a million attempts: version 2 writes them
# as columns (``LEDGER_COLUMNS``), version 1 wrote each as a JSON array (still read).

LEDGER_SNAPSHOT_VERSION: Final = 2
"""The ``version`` of ``ledger.json`` this runtime writes (checked by the restore,
``RecoveryLedger.from_snapshot``). Version 2 writes the attempts as columns: ``rows`` (one
per row in flight, in reservation order; attempt ``i`` is slot ``i % group_size`` of row
``rows[i // group_size]``), one list per field, and the sparse fields (``restored``,
``result``) as ``[i, value]`` pairs; version 1 wrote an array per attempt, 52 MB at 1M in flight
and a tuple per attempt to build."""
READ_LEDGER_VERSIONS: Final = frozenset({1, LEDGER_SNAPSHOT_VERSION})
"""The ``ledger.json`` versions this runtime reads (and restores)."""
LEDGER_COLUMNS: Final = (
    "rows",
    "attempt",
    "state",
    "replica",
    "gate_id",
    "unclaimed",
    "restored",
    "result",
)
"""The keys of version 2's ``attempts``: ``rows`` a row per block, five dense columns (an
entry per attempt), then two sparse ones (``[i, value]`` for the attempts that have one)."""
_DENSE_COLUMNS: Final = LEDGER_COLUMNS[1:6]


@attrs.frozen
class AttemptRow:
    """One attempt in the on-disk ledger (stored as a JSON array for compactness)."""

    row: int
    slot: int
    attempt: int
    state: str
    replica: str | None = None
    gate_id: int | None = None
    restored: RestoredGymState | None = None
    unclaimed: bool = False
    result: EpisodeResult | None = None


@attrs.frozen
class LedgerSnapshot:
    """The versioned on-disk form of a ledger (``ledger.json``).

    ``trained`` and ``failed`` are rows as inclusive ``[first, last]`` ranges; ``spent`` lists
    ``[row, slot, attempts_spent]``. ``retire`` is the retire queue at the cut: dropped
    attempts Gym may still hold in the state it committed with this snapshot (an attempt dropped
    between the checkpoint's retire stage and its cut). A restore retires them before it
    dispatches anything, so a dropped episode's environment mutations never stay next to its
    replacement's.
    """

    version: int
    group_size: int
    max_row_attempts: int
    data_failure_budget: int
    data_failures: int
    next_row: int
    trained: tuple[tuple[int, int], ...]
    failed: tuple[tuple[int, int], ...]
    spent: tuple[tuple[int, int, int], ...]
    attempts: tuple[AttemptRow, ...]
    retire: tuple[RetireItem, ...] = ()


_ATTEMPT_FIELDS = tuple(attrs.fields_dict(AttemptRow))


def _unstructure_attempt_row(a: AttemptRow) -> list[object]:
    return [
        a.row,
        a.slot,
        a.attempt,
        a.state,
        a.replica,
        a.gate_id,
        None if a.restored is None else converter.unstructure(a.restored),
        a.unclaimed,
        None if a.result is None else _unstructure_result(a.result, a),
    ]


def _unstructure_result(r: EpisodeResult, a: AttemptRow) -> list[object]:
    # a JSON writer turns nan into null, which the strict reader rejects: refuse, never write
    # a ledger.json that cannot be read back (what enters the ledger was checked already)
    if not math.isfinite(r.reward):
        raise NotPlainData(
            f"row {a.row} slot {a.slot} attempt {a.attempt}: reward "
            f"{r.reward!r} is not a finite number"
        )
    if r.payload is None:
        return [r.reward, r.turns]
    checked_json(r.payload, f"row {a.row} slot {a.slot} attempt {a.attempt}: payload")
    return [r.reward, r.turns, r.payload]


def _structure_attempt_row(value: object, _t: object) -> AttemptRow:
    if not isinstance(value, list) or len(value) != len(_ATTEMPT_FIELDS):
        raise ValueError(f"an attempt is an array of {len(_ATTEMPT_FIELDS)} {_ATTEMPT_FIELDS}")
    row, slot, attempt, state, replica, gate_id, restored, unclaimed, result = value
    res = None
    if result is not None:
        if not isinstance(result, list) or len(result) not in (2, 3):
            raise ValueError("an attempt's result is [reward, turns] or [reward, turns, payload]")
        res = EpisodeResult(
            converter.structure(result[0], float),
            converter.structure(result[1], int),
            result[2] if len(result) == 3 else None,
        )
    return AttemptRow(
        converter.structure(row, int),
        converter.structure(slot, int),
        converter.structure(attempt, int),
        converter.structure(state, str),
        converter.structure(replica, cast(Any, str | None)),
        converter.structure(gate_id, cast(Any, int | None)),
        converter.structure(restored, cast(Any, RestoredGymState | None)),
        converter.structure(unclaimed, bool),
        res,
    )


converter.register_unstructure_hook(AttemptRow, _unstructure_attempt_row)
converter.register_structure_hook(AttemptRow, _structure_attempt_row)


def ledger_bytes(header: Mapping[str, Any], columns: Mapping[str, Sequence[Any]]) -> bytes:
    """``ledger.json`` of version 2: ``header`` (every field of ``LedgerSnapshot`` but the
    attempts, in field order) then ``"attempts"``, the columns (``LEDGER_COLUMNS``), compact;
    long lists serialised a chunk at a time (``dumps_chunked``)."""
    head = dumps_chunked({k: v for k, v in header.items() if k != "attempts"})
    return b"".join((head[:-1], b',"attempts":', dumps_chunked(columns), b"}"))


def _attempt_columns(snap: LedgerSnapshot) -> dict[str, list[Any]]:
    """A snapshot's attempts as version 2's columns; ``ValueError`` if its rows do not each
    hold slots ``0..group_size-1`` in order (a ledger's never do otherwise)."""
    g, attempts = snap.group_size, snap.attempts
    rows = [a.row for a in attempts[::g]]
    if len(attempts) % g or any(
        a.slot != i % g or a.row != rows[i // g] for i, a in enumerate(attempts)
    ):
        raise ValueError(
            f"ledger snapshot: its attempts are not {g} slots in order per row; "
            "version 2 cannot write them"
        )
    return {
        "rows": rows,
        "attempt": [a.attempt for a in attempts],
        "state": [a.state for a in attempts],
        "replica": [a.replica for a in attempts],
        "gate_id": [a.gate_id for a in attempts],
        "unclaimed": [a.unclaimed for a in attempts],
        "restored": [
            [i, converter.unstructure(a.restored)]
            for i, a in enumerate(attempts)
            if a.restored is not None
        ],
        "result": [
            [i, *_unstructure_result(a.result, a)]
            for i, a in enumerate(attempts)
            if a.result is not None
        ],
    }


def dump_ledger_snapshot(snap: LedgerSnapshot) -> bytes:
    """``ledger.json`` bytes of version ``LEDGER_SNAPSHOT_VERSION`` (``ledger_bytes``)."""
    header = converter.unstructure(attrs.evolve(snap, version=LEDGER_SNAPSHOT_VERSION, attempts=()))
    return ledger_bytes(header, _attempt_columns(snap))


def _column_problem(raw: Mapping[str, Any]) -> str | None:
    """What keeps version 2's ``attempts`` from being columns of this ledger, or None."""
    columns, g = raw.get("attempts"), raw.get("group_size")
    if not isinstance(columns, dict):
        return "attempts: expected an object of columns"
    if set(columns) != set(LEDGER_COLUMNS):
        return f"attempts: columns {sorted(columns)}, expected {sorted(LEDGER_COLUMNS)}"
    if type(g) is not int or g < 1:
        return "group_size: expected an integer >= 1"
    for name in LEDGER_COLUMNS:
        if not isinstance(columns[name], list):
            return f"attempts.{name}: expected a list"
    n = len(columns["rows"]) * g
    for name in _DENSE_COLUMNS:
        if len(columns[name]) != n:
            return (
                f"attempts.{name}: {len(columns[name])} entries, expected {n} "
                f"({len(columns['rows'])} rows of {g} slots)"
            )
    for name, lengths, shape in (
        ("restored", (2,), "[i, restored]"),
        ("result", (3, 4), "[i, reward, turns] or [i, reward, turns, payload]"),
    ):
        seen: set[int] = set()
        for entry in columns[name]:
            if not (
                isinstance(entry, list)
                and len(entry) in lengths
                and type(entry[0]) is int
                and 0 <= entry[0] < n
                and entry[0] not in seen
            ):
                return f"attempts.{name}: {entry!r} is not {shape} of an attempt i < {n}, once"
            seen.add(entry[0])
    return None


def _attempt_arrays(raw: Mapping[str, Any]) -> list[list[Any]]:
    """Version 2's columns as version 1's arrays (one per attempt), for the strict reader."""
    problem = _column_problem(raw)
    if problem is not None:
        raise ManifestError(f"{LEDGER_FILE}: {problem}")
    columns, g = raw["attempts"], raw["group_size"]
    rows = columns["rows"]
    arrays = [
        [rows[i // g], i % g, attempt, state, replica, gate_id, None, unclaimed, None]
        for i, (attempt, state, replica, gate_id, unclaimed) in enumerate(
            zip(*(columns[c] for c in _DENSE_COLUMNS), strict=True)
        )
    ]
    for i, restored in columns["restored"]:
        arrays[i][6] = restored
    for i, *result in columns["result"]:
        arrays[i][8] = result
    return arrays


def load_ledger_snapshot(data: bytes) -> LedgerSnapshot:
    """Parse ``ledger.json`` strictly, version 2 (columns) or 1 (an array per attempt); a
    version not read or any problem is a ``ManifestError`` naming the field."""
    raw = _json_object(data, LEDGER_FILE)
    version = raw.get("version")
    if type(version) is not int or version not in READ_LEDGER_VERSIONS:
        raise ManifestError(
            f"{LEDGER_FILE}: version {version!r} found, {_versions(READ_LEDGER_VERSIONS)} supported"
        )
    if version == LEDGER_SNAPSHOT_VERSION:
        raw["attempts"] = _attempt_arrays(raw)
    return structure(raw, LedgerSnapshot, LEDGER_FILE)
