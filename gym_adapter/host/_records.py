"""Committed participant records of the Gym host: building and writing them (off the loop), and
reading them back verified.

Each participant's records are one JSON file (``records.json``) in its own directory, written
atomically (temp, fsync, rename, fsync dir); its digest goes in the commit reply and the
manifest. The file is an index: the sessions are chunks, objects of the snapshot (``runtime.
_snapshot_format``: content-defined, so a chunk whose sessions did not change is the same
object as at the last checkpoint, only linked), and it lists the objects the participant's
states name (a participant with ``objects`` and ``object_refs``: the host puts each into the
snapshot at commit, and back into the participant's store before ``restore``). Every object
of an instance's commit is written and made durable before the first index that names one
(``write_all``). What the records hold is a typed record of the snapshot format
(``AgentRecords``, ``SessionRecords``, ``StagedRecords``), parsed strictly on the way back.

Two builders, the same bytes: ``build_records`` from episodes (an aligned commit's parked
ones, exported now; or stand-ins of a cut), and ``cut_records`` from an unaligned cut's
boundary marks, formatting each session's chunk entry as bytes around the mark's states, with no
record object per session (what a cut of 50k episodes an instance can afford).

Where the objects go: a commit's ``state_root`` is ``<snapshot>/gym`` (what the runtime
passes) or, when it is not named ``gym``, the snapshot directory itself (a restore's
``state_root`` always is); the snapshot's objects are its ``objects/``, and when the snapshot is
a staging directory of a snapshot store (``.staging-…``) they are linked from that store's
shared ``objects/`` (``SnapshotObjects``). Reading back first
checks what the runtime checks too (topology equal to the live instance's, state directory
inside the snapshot, digest as committed) and collects every difference, so a restore refuses
with the whole list and changes nothing.
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
import orjson
import sniffio

from gymckpt.runtime import InstanceRecord, ManifestError, NotPlainData
from gymckpt.runtime._shared import (
    GYM_STATE_DIR,
    RECORDS_FILE,
    STAGING_PREFIX,
    AgentRecords,
    ChunkedRecords,
    CommittedRecords,
    SessionRecords,
    StagedRecords,
    agent_records_plain,
    all_finite,
    chunk_records,
    load_records,
    participant_differences,
    participant_state_problem,
    session_records_plain,
    split_chunks,
    staged_records_plain,
)
from gymckpt.runtime.lowlevel import (
    ObjectStore,
    SnapshotObjects,
    parse_object_ref,
    plain_problem,
    write_atomic,
)

from ._cut import final_state_bytes
from ._episode import to_plain
from ._log import episode_label

if TYPE_CHECKING:
    from ._cut import CutEpisode
    from ._environment import Environment
    from ._episodes import Episode

__all__ = [
    "RECORDS_FILE",
    "Kept",
    "KeptExportError",
    "RecordsToWrite",
    "Refusal",
    "build_records",
    "commit_objects",
    "cut_records",
    "free_in_slices",
    "offload",
    "participant_objects",
    "read_committed",
    "restore_objects",
    "sorted_in_slices",
    "topology_differences",
    "write_all",
    "write_records",
]

T = TypeVar("T")
MODEL_PROXY: Final = "model_proxy"
Kept = tuple[str, str, int, dict[str, Any]]
"""A retained slot of an ended episode: (key, rollout ID, attempt, states by participant)."""


def snapshot_of(state_root: Path) -> Path:
    """The snapshot directory of a commit's or restore's ``state_root`` (module docstring)."""
    return state_root.parent if state_root.name == GYM_STATE_DIR else state_root


def commit_objects(state_root: Path) -> SnapshotObjects:
    """Where a commit under ``state_root`` puts its objects (module docstring)."""
    snapshot = snapshot_of(state_root)
    shared = (
        ObjectStore.of_snapshot_root(snapshot.parent)
        if snapshot.name.startswith(STAGING_PREFIX)
        else None
    )
    return SnapshotObjects.of_snapshot(snapshot, shared)


def participant_objects(participant: Any) -> ObjectStore | None:
    """The store of a participant that keeps objects (``objects: ObjectStore`` and an
    ``object_refs`` method), else None."""
    store = getattr(participant, "objects", None)
    if isinstance(store, ObjectStore) and callable(getattr(participant, "object_refs", None)):
        return store
    return None


@attrs.frozen
class RecordsToWrite:
    """One participant's records for ``write_all``: its ``records`` (``build_records``'
    chunks), where its ``records.json`` goes (``directory``), the store of the objects its
    states name (``store``; None for a participant that keeps none) and ``who`` it is (for
    errors)."""

    directory: Path
    records: ChunkedRecords
    store: ObjectStore | None
    who: str


def write_all(participants: Sequence[RecordsToWrite], objects: SnapshotObjects) -> None:
    """Write the records of every participant of a commit: first every object they name
    (each participant's states' objects, from its ``store``, and every chunk), placed together
    (``SnapshotObjects.put_all``: one pool of threads, fsyncs overlapping), then made durable
    with one ``sync``, then each ``records.json`` index (atomic). No index is written before
    every object of every participant is durable: a reference is published only after its
    object is (``ObjectStore``'s rule). An object the states name that is not in ``store``
    (or does not hold its bytes) is ``KeptExportError`` naming ``who`` and the reference:
    the commit fails, and no index is written."""
    for p in participants:
        _put_named_objects(p, objects)
    order = [(i, key) for i, p in enumerate(participants) for key in p.records.chunks]
    placed = iter(
        objects.put_all([c for i, key in order for c in participants[i].records.chunks[key]])
    )
    refs: list[dict[str, list[str]]] = [{} for _ in participants]
    for i, key in order:
        refs[i][key] = [next(placed) for _ in participants[i].records.chunks[key]]
    objects.sync()
    for p, its_refs in zip(participants, refs, strict=True):
        p.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(p.directory / RECORDS_FILE, p.records.index(its_refs))


def _put_named_objects(p: RecordsToWrite, objects: SnapshotObjects) -> None:
    """Put each object ``p``'s states name into ``objects``, from its store (``write_all``)."""
    for ref in p.records.object_refs:
        source = p.store.path(ref) if p.store is not None else None
        if source is None or not source.is_file():
            raise KeptExportError(
                f"{p.who}: a committed state names object {ref}, which is not in its object "
                f"store ({source}); a participant keeps every object its exported states "
                "name until no snapshot can need it"
            )
        try:
            objects.put_file(source, ref)
        except ValueError as exc:
            raise KeptExportError(f"{p.who}: object {ref} in its store: {exc}") from None


def write_records(
    directory: Path,
    records: ChunkedRecords,
    objects: SnapshotObjects,
    store: ObjectStore | None,
    who: str,
) -> None:
    """``write_all`` of one participant's records, as ``directory/records.json``."""
    write_all([RecordsToWrite(directory, records, store, who)], objects)


def restore_objects(
    participants: Sequence[Any],
    records: Mapping[str, CommittedRecords],
    state_root: Path,
    where: str,
) -> list[str]:
    """Put back into each object-keeping participant's store (``participant_objects``) every
    object its committed states name that it lacks, from the snapshot's ``objects/``, checked
    against its reference; every problem (an object missing from the snapshot or changed, a
    reference that is not one, ``object_refs`` raising), one line each. Runs before any
    ``restore`` is called: a restored state finds its objects. Adding an object changes no
    participant's state (objects are immutable, named by their content)."""
    snapshot = ObjectStore.of_snapshot_root(snapshot_of(state_root))
    problems: list[str] = []
    for p in participants:
        store = participant_objects(p)
        committed = records.get(p.name)
        if store is None or committed is None or isinstance(committed, StagedRecords):
            continue
        dirty: set[Path] = set()
        try:
            refs = {ref for s in committed.sessions for ref in p.object_refs(s.state)}
        except Exception as exc:
            problems.append(f"{where}: participant {p.name}: object_refs raised {exc!r}")
            continue
        for ref in sorted(refs):
            try:
                parse_object_ref(ref)
                if store.has(ref):
                    continue
                source = snapshot.path(ref)
                if not source.is_file():
                    problems.append(
                        f"{where}: participant {p.name}: object {ref} is missing from the "
                        f"snapshot ({source})"
                    )
                    continue
                store.put_file(source, ref, dirty)
            except ValueError as exc:
                problems.append(f"{where}: participant {p.name}: {exc}")
        ObjectStore.sync(dirty)
    return problems


def topology_differences(
    instance: str, live: Sequence[tuple[str, str]], record: InstanceRecord
) -> list[str]:
    """Every way the committed participants differ from the live ones (names, kinds, order)."""
    where = f"instance {instance}"
    diffs: list[str] = []
    if record.name != instance:
        diffs.append(f"{where}: manifest record is for instance {record.name}")
    diffs += participant_differences(where, record.participants, live)
    return diffs


def read_committed(
    instance: str, live: Sequence[tuple[str, str]], root: Path, record: InstanceRecord
) -> tuple[list[str], dict[str, CommittedRecords]]:
    """(every difference, each participant's typed records by server name) for a restore.

    Each participant's records are read only once its state passed the checks (inside the
    snapshot, digest as committed), and parsed strictly in the role its place in the live
    topology gives it: the first participant is the agent (``AgentRecords``), the model proxy
    has ``StagedRecords``, every other ``SessionRecords``. A file that does not parse is one
    difference naming it and what differs (a chunk missing from the snapshot's ``objects/``
    or changed too); it is left out of the records."""
    diffs = topology_differences(instance, live, record)
    objects = ObjectStore.of_snapshot_root(snapshot_of(root))
    loaded: dict[str, CommittedRecords] = {}
    for i, p in enumerate(record.participants):
        who = f"instance {instance}: participant {p.server_name}"
        problem = participant_state_problem(root, p, who)
        if problem is not None:
            diffs.append(problem)
            continue
        expect: type[CommittedRecords] = (
            AgentRecords
            if i == 0
            else StagedRecords
            if (p.server_name, p.kind) == (MODEL_PROXY, MODEL_PROXY)
            else SessionRecords
        )
        what = f"{p.state_dir}/{RECORDS_FILE}"
        try:
            loaded[p.server_name] = load_records(
                (root / p.state_dir / RECORDS_FILE).read_bytes(), what, expect, objects=objects
            )
        except (OSError, ManifestError) as exc:
            diffs.append(f"{who} records unreadable ({exc})")
    return diffs, loaded


@attrs.frozen
class Refusal:
    """A held episode whose session state a participant could not hand over at a commit
    (``export`` raised, or returned what is not finite plain data): not in the records; the
    host fails the episode (data) instead."""

    rollout_id: str
    message: str
    exc: BaseException | None = None


class KeptExportError(Exception):
    """A session the host must commit but cannot fail as an episode (a retained session of an
    ended episode, an unclaimed restored one) cannot be exported: the commit fails, retryably."""


def build_records(
    env: Environment,
    owner: str,
    retained_participants: Sequence[Any],
    checkpoint_id: str,
    held: Sequence[Episode],
    kept: Sequence[Kept],
    stranded: str | None,
    failable: Callable[[Episode], bool] = lambda ep: True,
    *,
    exported: bool = False,
) -> tuple[dict[str, ChunkedRecords], list[Refusal]]:
    """Every participant's records for a commit, as the JSON chunks to write, by server name,
    and the held episodes refused. The records hold: the agent's sessions (with their step
    boundary; None for ``stranded``), each participant's sessions of the held episodes (and,
    for a retained one, of ``kept`` slots), which episodes ``owner`` exports, the model
    proxy's staged calls. Calls the participants' ``export``.

    Every state in the records is finite plain data, so what is written reads back as it was
    committed: a held episode whose state is not (``failable(ep)``: the host can fail it) is
    left out and refused; any other state that is not raises ``KeptExportError``. The common
    case costs one ``orjson.dumps`` per participant and a search of its output for ``null``.

    ``exported``: the held episodes' ``sessions`` hold exported plain states already (an
    unaligned cut's stand-ins), so no ``export`` is called for them. An object-keeping
    participant's records name the objects its states name (``_with_objects``)."""
    every = (env.agent, *env.participants)
    refused: list[Refusal] = []
    columns = (
        {p.name: [ep.sessions[p.name] for ep in held] for p in every}
        if exported
        else _export_columns(every, held)
    )
    if columns is None:  # an export raised: find whose, per episode
        held, columns = _export_each(every, held, checkpoint_id, failable, refused)
    kept_states = _export_kept(kept, retained_participants)
    records = _records(
        env, owner, retained_participants, checkpoint_id, held, columns, kept_states, stranded
    )
    data = _dumps_all(records)
    if data is not None:
        return _with_objects(data, every, columns, kept_states), refused
    # something is not finite plain data: find each state that is not, refuse its episode
    held, columns = _without_unplain(held, columns, kept_states, checkpoint_id, failable, refused)
    records = _records(
        env, owner, retained_participants, checkpoint_id, held, columns, kept_states, stranded
    )
    data = _dumps_all(records)
    if data is None:
        problems = [
            f"{server}: {_state_problem(r, server)}"
            for server, r in records.items()
            if _state_problem(r, server) is not None
        ]
        raise KeptExportError(f"records are not finite plain data ({'; '.join(problems)})")
    return _with_objects(data, every, columns, kept_states), refused


def _with_objects(
    data: dict[str, ChunkedRecords],
    every: Sequence[Any],
    columns: Mapping[str, Sequence[Any]],
    kept: Sequence[Kept],
) -> dict[str, ChunkedRecords]:
    """``data`` with each object-keeping participant's records naming the objects its
    committed states name (``object_refs`` of each; one that raises, or names what is not a
    reference, is ``KeptExportError``: the commit fails)."""
    for p in every:
        if participant_objects(p) is None:
            continue
        states = [*columns[p.name], *(by_name[p.name] for *_, by_name in kept if p.name in by_name)]
        try:
            refs = {ref for state in states for ref in p.object_refs(state)}
            for ref in refs:
                parse_object_ref(ref)
        except Exception as exc:
            raise KeptExportError(f"participant {p.name}: object_refs: {exc!r}") from exc
        data[p.name] = data[p.name].with_objects(refs)
    return data


def _export_each(
    every: Sequence[Any],
    held: Sequence[Episode],
    checkpoint_id: str,
    failable: Callable[[Episode], bool],
    refused: list[Refusal],
) -> tuple[list[Episode], dict[str, list[Any]]]:
    """The held episodes whose every participant exported, and their states by participant,
    exported one episode at a time (an export raised for some): each of the others refused
    into ``refused`` (or ``KeptExportError`` if the host cannot fail it)."""
    states: dict[str, dict[str, Any]] = {}
    for ep in held:
        try:
            states[ep.rollout_id] = {p.name: to_plain(p.export(ep.sessions[p.name])) for p in every}
        except Exception as exc:
            _refuse(
                ep,
                f"{episode_label(ep.info)}: exporting its session state at "
                f"checkpoint {checkpoint_id} raised {exc!r}",
                exc,
                failable,
                refused,
            )
    exported = [ep for ep in held if ep.rollout_id in states]
    return exported, {p.name: [states[ep.rollout_id][p.name] for ep in exported] for p in every}


def _export_kept(kept: Sequence[Kept], retained_participants: Sequence[Any]) -> list[Kept]:
    """The retained slots with each retained participant's exported state; an export that
    raises fails the commit (``KeptExportError``): the host cannot fail an ended episode."""
    kept_states: list[Kept] = []
    for key, rid, attempt, sessions in kept:
        try:
            kept_states.append(
                (
                    key,
                    rid,
                    attempt,
                    {p.name: to_plain(p.export(sessions[p.name])) for p in retained_participants},
                )
            )
        except Exception as exc:
            raise KeptExportError(
                f"retained session {key} of {rid} attempt {attempt}: export raised {exc!r}"
            ) from exc
    return kept_states


def _without_unplain(
    held: Sequence[Episode],
    columns: Mapping[str, Sequence[Any]],
    kept_states: Sequence[Kept],
    checkpoint_id: str,
    failable: Callable[[Episode], bool],
    refused: list[Refusal],
) -> tuple[list[Episode], dict[str, list[Any]]]:
    """The held episodes and their states without each episode one of whose states is not
    finite plain data (refused into ``refused``); such a state of a retained slot raises
    ``KeptExportError``."""
    bad: set[int] = set()
    for i, ep in enumerate(held):
        for name, column in columns.items():
            problem = _state_problem(column[i], f"{name} session state")
            if problem is not None:
                bad.add(i)
                _refuse(
                    ep,
                    f"{episode_label(ep.info)}: at checkpoint {checkpoint_id}, {problem}",
                    None,
                    failable,
                    refused,
                )
                break
    for key, rid, attempt, by_name in kept_states:
        for name, state in by_name.items():
            problem = _state_problem(state, f"{name} session state")
            if problem is not None:
                raise KeptExportError(
                    f"retained session {key} of {rid} attempt {attempt}: {problem}"
                )
    return [ep for i, ep in enumerate(held) if i not in bad], {
        name: [x for i, x in enumerate(column) if i not in bad] for name, column in columns.items()
    }


def _export_columns(
    participants: Sequence[Any], held: Sequence[Episode]
) -> dict[str, list[Any]] | None:
    """Each participant's exported states of ``held``, in order (None if an export raised):
    one comprehension per participant, what a commit of 200k episodes can afford."""
    try:
        return {
            p.name: [to_plain(export(ep.sessions[name])) for ep in held]
            for p in participants
            for export, name in ((p.export, p.name),)
        }
    except Exception:
        return None


def _refuse(
    ep: Episode,
    message: str,
    exc: BaseException | None,
    failable: Callable[[Episode], bool],
    refused: list[Refusal],
) -> None:
    if not failable(ep):
        raise KeptExportError(message) from exc
    refused.append(Refusal(ep.rollout_id, message, exc))


def _state_problem(state: Any, where: str) -> str | None:
    """What keeps ``state`` out of the records (not finite plain data, or nested too deep for
    the place a chunk holds it: ``final_state_bytes``, as a mark checks it), or None."""
    try:
        final_state_bytes(state, where)
    except NotPlainData as exc:
        return str(exc)
    return None


def _dumps_all(records: Mapping[str, Mapping[str, Any]]) -> dict[str, ChunkedRecords] | None:
    """Each participant's records (as ``_records`` builds them) as JSON chunks, or None if one
    is not finite plain data (orjson refused it, or its output holds ``null``, which a
    non-finite float becomes, and one is found: see ``runtime._plain``)."""
    out: dict[str, ChunkedRecords] = {}
    for server, plain in records.items():
        try:
            data = chunk_records(plain)
        except (TypeError, orjson.JSONEncodeError):
            return None
        if (
            any(b"null" in c for chunks in data.chunks.values() for c in chunks)
            and all_finite(plain) is not True
            and (plain_problem(plain, server, types=False) is not None)
        ):
            return None
        out[server] = data
    return out


def _records(
    env: Environment,
    owner: str,
    retained_participants: Sequence[Any],
    checkpoint_id: str,
    held: Sequence[Episode],
    columns: Mapping[str, Sequence[Any]],
    kept: Sequence[tuple[str, str, int, Mapping[str, Any]]],
    stranded: str | None,
) -> dict[str, dict[str, Any]]:
    """Each participant's records, by server name, as the JSON objects they are on disk
    (``records_to_plain`` of ``AgentRecords`` / ``SessionRecords`` / ``StagedRecords``), built
    from per-episode columns: no record object per session (the reader stays strict)."""
    agent = env.agent
    name = agent.name
    rids = [ep.rollout_id for ep in held]
    infos = [ep.info for ep in held]
    attempts = [info.attempt for info in infos]
    boundaries: list[int | None] = [ep.turn for ep in held]
    if stranded is not None:
        boundaries = [
            None if rid == stranded else b for rid, b in zip(rids, boundaries, strict=True)
        ]
    records: dict[str, dict[str, Any]] = {
        name: agent_records_plain(
            name,
            agent.kind,
            checkpoint_id,
            (
                rids,
                [info.row for info in infos],
                [info.slot for info in infos],
                attempts,
                boundaries,
                columns[name],
            ),
            # no environment participant: the agent's sessions own the episodes
            exported=rids if owner == name else None,
        )
    }
    retained = {p.name for p in retained_participants}
    keys = [ep.key for ep in held]
    for p in env.participants:
        name = p.name
        cols: tuple[Sequence[Any], ...] = (keys, rids, attempts, columns[name])
        if name in retained:  # the kept slots too, every session by key (a stable sort)
            rows = sorted_in_slices(
                [
                    *zip(*cols, strict=True),
                    *((key, rid, attempt, by_name[name]) for key, rid, attempt, by_name in kept),
                ],
                key=itemgetter(0),
            )
            cols = tuple(zip(*rows, strict=True)) if rows else ((), (), (), ())
        records[name] = session_records_plain(
            name,
            p.kind,
            checkpoint_id,
            cols,  # type: ignore[arg-type]
            exported=rids if name == owner else (),
            retained=name in retained,
        )
    if env.model is not None:
        records[MODEL_PROXY] = staged_records_plain(
            MODEL_PROXY, MODEL_PROXY, checkpoint_id, [(ep.rollout_id, ep.staged) for ep in held]
        )
    return records


_AGENT_ENTRY: Final = (
    b'{"attempt":%d,"rollout_id":%s,"row":%d,"slot":%d,"state":%s,"step_boundary":%d}'
)
"""An agent session of ``agent_records_plain`` as its chunk holds it (keys sorted, compact)."""
_SESSION_ENTRY: Final = b'{"attempt":%d,"key":%s,"rollout_id":%s,"state":%s}'
"""A session of ``session_records_plain`` as its chunk holds it."""
_ENTRY_OPTS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
"""As a chunk is serialised (``runtime._snapshot_format``): a state's bytes inside it."""


def cut_records(
    env: Environment,
    owner: str,
    retained_participants: Sequence[Any],
    checkpoint_id: str,
    taken: Sequence[CutEpisode],
    kept: Sequence[Kept],
) -> dict[str, ChunkedRecords] | None:
    """Every participant's records for an unaligned cut, as ``build_records(...,
    exported=True)`` writes them, byte for byte, from what the cut's marks hold: ``taken``
    sorted by rollout ID, ``kept`` the retained slots of ended episodes (exported here). None
    where that is not the case to take here: a kept state that is not finite plain data, a
    staged response that is not (``build_records`` says which, and refuses or raises).

    Each session's entry is its chunk's bytes: the episode's fields formatted around the
    state's bytes as its mark holds them (``_AGENT_ENTRY``, ``_SESSION_ENTRY``), already in
    their final encoding and proven finite plain data that fits its chunk when the mark was
    made (``BoundaryMark``), so no state is parsed or serialised here; a chunk is
    its entries joined, at the boundaries ``split_chunks`` gives their keys. No record dict per
    session is built, no state is walked in Python: bytes, which the collector does not track.
    A legacy agent, unclaimed restored episodes and participants that keep objects are not
    taken here (the caller asks ``build_records``)."""
    kept_states = _export_kept(kept, retained_participants)
    rids = [c.ep.rollout_id for c in taken]
    by_rid = _chunk_lengths(rids)
    agent, *columns = _mark_entries(len(env.participants), taken)
    a = env.agent
    plain = agent_records_plain(
        a.name, a.kind, checkpoint_id, ((),) * 6, exported=rids if owner == a.name else None
    )
    records = {a.name: _joined(plain, "sessions", by_rid, agent)}
    retained = {p.name for p in retained_participants}
    keys = [c.ep.key for c in taken]
    by_key = by_rid if keys == rids else _chunk_lengths(keys)
    for p, column in zip(env.participants, columns, strict=True):
        lengths = by_key
        if p.name in retained:  # the kept slots too, every session by key (a stable sort)
            rows = _kept_entries(kept_states, p.name)
            if rows is None:
                return None
            if rows or not _ascending(keys):
                merged = sorted_in_slices(
                    [*zip(keys, column, strict=True), *rows], key=itemgetter(0)
                )
                lengths = _chunk_lengths([k for k, _ in merged])
                column = [e for _, e in merged]
        plain = session_records_plain(
            p.name,
            p.kind,
            checkpoint_id,
            ((), (), (), ()),
            exported=rids if p.name == owner else (),
            retained=p.name in retained,
        )
        records[p.name] = _joined(plain, "sessions", lengths, column)
    if env.model is not None:
        plain = staged_records_plain(
            MODEL_PROXY, MODEL_PROXY, checkpoint_id, [(c.ep.rollout_id, c.staged) for c in taken]
        )
        staged = _plain_chunks(plain, "staged", by_rid)
        free_in_slices(plain["staged"])
        if staged is None:
            return None
        records[MODEL_PROXY] = staged
    return records


FREE_SLICE: Final = 1024
"""The most items ``free_in_slices`` frees in one C call."""


def free_in_slices(items: list[Any]) -> None:
    """Empty ``items`` from its end, ``FREE_SLICE`` items at a time. Freeing a list of 200k
    records is one C call that holds the GIL until the last object is gone (tens of ms, the
    event loop's thread waiting); freed a slice at a time, the interpreter can hand the GIL
    over between two slices. What else still refers to an item keeps it."""
    while items:
        del items[-FREE_SLICE:]


SORT_SLICE: Final = 2048
"""The most items ``sorted_in_slices`` sorts from scratch in one C call."""


def sorted_in_slices(items: Sequence[T], key: Callable[[T], Any] | None = None) -> list[T]:
    """``sorted(items, key=key)`` (stable: the same list) in C calls of bounded work. Sorting 50k
    strings is one C call of about 10 ms that holds the GIL throughout (the event loop's thread
    waiting); here slices of ``SORT_SLICE`` items are sorted, then merged two runs at a time,
    each merge one ``sorted`` of two ascending runs, which Python's sort merges in one linear
    pass (about 1 ms for 50k strings, the last merge). About the work of one sort in all, and
    the GIL can go to another thread between two calls."""
    runs = [sorted(items[i : i + SORT_SLICE], key=key) for i in range(0, len(items), SORT_SLICE)]
    while len(runs) > 1:
        runs = [
            sorted(runs[i] + runs[i + 1], key=key) if i + 1 < len(runs) else runs[i]
            for i in range(0, len(runs), 2)
        ]
    return runs[0] if runs else []


def _ascending(keys: Sequence[str]) -> bool:
    """Whether ``keys`` are in order: one linear pass, no sort."""
    return not any(map(operator.gt, keys, itertools.islice(keys, 1, None)))


def _mark_entries(participants: int, taken: Sequence[CutEpisode]) -> list[list[bytes]]:
    """Each session's chunk entry, by participant (the agent first, then ``participants``
    others, in ``Roles.sessions`` order, as the marks hold them), in ``taken``'s order: the
    episode's fields formatted around the state's bytes as its mark holds them (already in
    their final encoding: ``BoundaryMark``), no state parsed or serialised here."""
    dumps = orjson.dumps
    agent: list[bytes] = []
    others: list[list[bytes]] = [[] for _ in range(participants)]
    for c in taken:
        ep, mark = c.ep, c.mark
        info = ep.info
        first, *states = mark.parts  # type: ignore[misc]
        rid = dumps(ep.rollout_id)
        agent.append(_AGENT_ENTRY % (info.attempt, rid, info.row, info.slot, first, mark.turn))
        key = dumps(ep.key)
        for column, state in zip(others, states, strict=True):
            column.append(_SESSION_ENTRY % (info.attempt, key, rid, state))
    return [agent, *others]


def _kept_entries(kept: Sequence[Kept], name: str) -> list[tuple[str, bytes]] | None:
    """(key, chunk entry) of participant ``name``'s session of each kept slot, or None if one
    is not finite plain data or nests too deep for its chunk (``cut_records``)."""
    rows: list[tuple[str, bytes]] = []
    for key, rid, attempt, by_name in kept:
        state = by_name[name]
        entry = {"attempt": attempt, "key": key, "rollout_id": rid, "state": state}
        try:  # in a list, as its chunk holds it: the same nesting limit as ``chunk_records``
            data = orjson.dumps([entry], option=_ENTRY_OPTS)[1:-1]
        except (TypeError, orjson.JSONEncodeError):
            return None
        if b"null" in data and _state_problem(state, name) is not None:
            return None
        rows.append((key, data))
    return rows


def _chunk_lengths(keys: Sequence[str]) -> list[int]:
    """How many entries each chunk of a list whose entries have these ``keys`` holds
    (``split_chunks``' boundaries)."""
    return [len(piece) for piece in split_chunks(keys)]


def _joined(
    plain: Mapping[str, Any], chunked: str, lengths: Sequence[int], entries: Sequence[bytes]
) -> ChunkedRecords:
    """The records whose head is ``plain`` (its ``chunked`` list empty) and whose ``chunked``
    list is ``entries`` (bytes), chunks of ``lengths`` entries (``_chunk_lengths``)."""
    head = {k: v for k, v in plain.items() if k != chunked}
    chunks: list[bytes] = []
    start = 0
    for n in lengths:
        chunks.append(b"[" + b",".join(entries[start : start + n]) + b"]")
        start += n
    return ChunkedRecords(head, {chunked: chunks})


def _plain_chunks(
    plain: Mapping[str, Any], chunked: str, lengths: Sequence[int]
) -> ChunkedRecords | None:
    """``plain``'s ``chunked`` list serialised in chunks of ``lengths`` entries, as
    ``chunk_records`` does, or None if it is not finite plain data (orjson refuses it, or a
    chunk holding ``null`` holds a non-finite number: only that chunk's entries are asked)."""
    entries = plain[chunked]
    chunks: list[bytes] = []
    start = 0
    for n in lengths:
        part = entries[start : start + n]
        start += n
        try:
            data = _dumps_in_slices(part)
        except (TypeError, orjson.JSONEncodeError):
            return None
        if (
            b"null" in data
            and all_finite(part) is not True
            and plain_problem(part, chunked, types=False) is not None
        ):
            return None
        chunks.append(data)
    return ChunkedRecords({k: v for k, v in plain.items() if k != chunked}, {chunked: chunks})


DUMP_SLICE: Final = 256
"""The most entries ``_dumps_in_slices`` serialises in one ``orjson.dumps`` call."""


def _dumps_in_slices(entries: Sequence[Any]) -> bytes:
    """``orjson.dumps(list(entries), option=_ENTRY_OPTS)``, the same bytes, serialised
    ``DUMP_SLICE`` entries a call: a chunk holds up to ``CHUNK_MAX`` entries, and one call for
    a chunk of a few thousand staged calls holds the GIL for several ms."""
    if len(entries) <= DUMP_SLICE:
        return orjson.dumps(list(entries), option=_ENTRY_OPTS)
    pieces = [
        orjson.dumps(list(entries[i : i + DUMP_SLICE]), option=_ENTRY_OPTS)[1:-1]
        for i in range(0, len(entries), DUMP_SLICE)
    ]
    return b"[" + b",".join(pieces) + b"]"


_EXPORT_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "gymckpt_host_export_threads"
)
_IO_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "gymckpt_host_io_threads"
)
IO_THREADS: Final = 4
"""The most ``offload(..., io=True)`` threads of one event loop at a time."""


async def offload(fn: Callable[[], T], *, io: bool = False) -> T:
    """``fn()`` in a worker thread; inline under trio's ``MockClock`` (virtual time would leap
    past every deadline while a real thread runs).

    One such thread per event loop at a time: instances hosted in one process share one GIL, so
    parallel exports are not faster, and every extra thread wanting the GIL makes the event
    loop wait longer for it. ``io``: ``fn`` waits on the disk (writes and fsyncs, which let the
    GIL go) more than it computes: up to ``IO_THREADS`` of those at a time, beside the export
    thread, so one instance's records reach the disk while the next one's are built."""
    if sniffio.current_async_library() == "trio":
        import trio

        # looked up, not imported: trio.testing imports pytest (objects every full collection
        # would walk), and a MockClock exists only once it was imported
        testing = sys.modules.get("trio.testing")
        if testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock):
            await anyio.lowlevel.checkpoint()
            return fn()
    threads = _IO_THREADS if io else _EXPORT_THREADS
    try:
        limiter = threads.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(IO_THREADS if io else 1)
        threads.set(limiter)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)
