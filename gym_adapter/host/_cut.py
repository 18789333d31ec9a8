"""An unaligned checkpoint's cut on a Gym host: episodes taken at their last step boundary.

As an episode passes a step boundary (before its next turn starts), the host keeps a
``BoundaryMark``: every session state of the episode (agent, participants, retained ones of its
slot), exported and serialised there and then, each in its final encoding (the bytes a chunk
entry of the records holds: keys sorted), so nothing a later turn does to a live state can
reach it and a commit formats its entries around those bytes, parsing and serialising nothing
again (``_records.cut_records``). An unaligned commit is the instance's *cut*: each active
episode is taken as its mark holds it, with every model call it completed up to the cut
(``ep.staged`` is append-only: a copy of it at the cut is exactly those calls); a call in
progress at the cut is not among them, so a restore asks it again. The worker thread that
writes the records reads only what the cut copied.

The cut runs on the loop in slices of at most ``CUT_SLICE`` episodes, yielding to the loop
between two (``ControlPlane._commit_cut``), so 200k episodes never hold the loop in one step.
Its *instant* is the first step: the replies on the wire are listed, and every reply pushed
from then on is held (``ReplyStreams.hold``). An episode is taken when its slice comes, at the
mark it has then: whatever it did since the instant produced nothing the trainer saw (its
replies are held), so each episode's own cut is consistent with the list, and an episode that
ended since the instant is taken at its last mark as well (its final reply is held: after its
cut). Only the first cut after marks were armed on demand runs in one step
(``Parking.unmarked_turns``): the episodes inside a turn that started before the arming fail
there, and their replies must be listed before the hold.

Marks are taken once armed (``Parking.marks``: from the start, or from the first prepare that
may cut, ``HostConfig.boundary_marks``). Invariant, while armed: an episode that has a mark has
one of its current boundary (``ep.mark.turn == ep.turn``: the turn counter moves on only where
the next mark is made, with no scheduling point between), and an episode inside a turn
(``ep.stepping``) that started after the arming always has one; one whose turn started before
has none, and the cut retries it (``ControlPlane._retry_unmarked``). A mark whose states could
not be exported, are not finite plain data or nest too deep for the records (``CHUNK_DEPTH``)
carries the problem instead (``problem``); the cut fails that episode (data), as an aligned
commit fails a parked episode whose export fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, final

import attrs
import orjson

from gymckpt.runtime import NotPlainData
from gymckpt.runtime.lowlevel import checked_json

from ._episode import EpisodeInfo, to_plain
from ._episodes import BOUNDARY, DONE, Episode, StagedModelCall
from ._log import episode_label

__all__ = [
    "CUT_SLICE",
    "BoundaryMark",
    "CutEpisode",
    "StandIn",
    "mark_boundary",
    "stand_ins",
    "take_cut",
]


@final
@attrs.define(slots=True, eq=False)
class BoundaryMark:
    """An episode's session states as it passed step boundary ``turn``: each state's bytes in
    their final encoding (``parts``, one per participant in ``Roles.sessions`` order, agent
    first), or the ``problem`` that kept them from being taken (and the exception, if one was
    raised).

    Invariant: each part is exactly the bytes a chunk entry of the records holds for that state
    (keys sorted, ``final_state_bytes``), proven finite plain data at the depth a chunk holds
    it (``CHUNK_DEPTH``), so a commit formats its entries around them and never parses or
    serialises a state again."""

    turn: int
    parts: tuple[bytes, ...] | None
    problem: str | None = None
    exc: BaseException | None = None
    versions: tuple[Any, ...] | None = None
    """Each participant's ``state_version`` of its state here (None where it declares none);
    None when no participant declares ``state_version``."""
    objects: tuple[Any, ...] | None = None
    """The session state objects ``versions`` are of: a state replaced since
    (``ctx.replace_session``) is exported again whatever its version says."""

    @property
    def states(self) -> bytes | None:
        """The states as one JSON array (``parts`` joined), or None with a ``problem``."""
        return None if self.parts is None else b"[" + b",".join(self.parts) + b"]"


_FINAL: Final = (
    orjson.OPT_SORT_KEYS  # as a chunk is serialised (runtime._snapshot_format)
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
"""Plain data only: anything else (a subclass, a dataclass, a datetime, a numpy value) raises
and takes ``final_state_bytes``' read-back path. A numpy float32 is written in its own
shortest form (``8.7001214e+15``), which differs from the float64 it reads back as
(``8700121400000000.0``): the records hold the latter, as read back."""
_ENTRY: Final = orjson.OPT_SORT_KEYS

CHUNK_DEPTH: Final = 2
"""How many containers a chunk of the records puts around a session state (its list, then the
state's entry: ``[{..., "state": S}]``). A state is serialised that deep at its mark
(``final_state_bytes``) and checked that deep where records are built (``_records.
_state_problem``): orjson's nesting limit is met where the state enters, the same for both
builders, never in the middle of a commit."""

JSON_DEPTH: Final = 254
"""The deepest nesting orjson serialises (its limit: 255 levels raise)."""

CUT_SLICE: Final = 1024
"""The most episodes one step of a sliced cut takes (``ControlPlane._commit_cut``), and the most
records a chunk of a commit's reply packs (``transports/ray``): bounded loop steps at any scale.
Taking an episode costs about 1 µs, so a slice about 1 ms; fewer, larger slices would hold the
loop longer, more, smaller ones would make the cut wait for more scheduler batches of a busy
loop."""


def _proven(state: Any) -> bytes | None:
    """``state``'s final bytes when it is finite plain data that fits ``CHUNK_DEPTH`` down and
    that is cheap to prove, else None (``final_state_bytes`` asks ``checked_json``).

    orjson writes ``nan`` and ``inf`` as ``null``: output without ``null`` is finite. Else the
    state must equal its bytes read back (a non-finite float is unequal to the ``None`` read in
    its place). That equality is the builtin one: under these options orjson raises on
    subclasses of ``dict``, ``list``, ``str`` and ``int``, on dataclasses, datetimes (whose
    ``__eq__`` could say anything) and numpy values (``_FINAL``). No walk in Python, unlike the
    standard library's encoder that ``checked_json`` asks."""
    try:
        part = orjson.dumps([[state]], option=_FINAL)[CHUNK_DEPTH:-CHUNK_DEPTH]
    except (TypeError, orjson.JSONEncodeError):
        return None
    if b"null" in part:
        try:
            same = orjson.loads(part) == state
        except Exception:  # e.g. an array's truth value, asked inside a comparison
            return None
        if same is not True:
            return None
    return part


def final_state_bytes(state: Any, where: str) -> bytes:
    """``state``'s bytes as a chunk entry of the records holds them: ``checked_json``'s bytes
    read back and serialised with keys sorted, compact (for plain data, ``orjson.dumps(state,
    option=OPT_SORT_KEYS)``). ``NotPlainData`` naming ``where`` if ``state`` is not finite
    plain data, or nests too deep for a chunk to hold it (``CHUNK_DEPTH``)."""
    part = _proven(state)
    if part is not None:
        return part
    data = checked_json(state, where)  # what is wrong, and where; or a value orjson refused
    try:  # read back: what the passthrough options refused (a subclass) becomes plain
        return orjson.dumps([[orjson.loads(data)]], option=_ENTRY)[CHUNK_DEPTH:-CHUNK_DEPTH]
    except orjson.JSONEncodeError:
        raise NotPlainData(too_deep(where)) from None


def too_deep(where: str) -> str:
    """The problem of a state that is plain data but nests too deep for the records."""
    return (
        f"{where} nests too deep: a snapshot's records hold it {CHUNK_DEPTH} levels down, where "
        f"JSON may nest {JSON_DEPTH} levels; keep its own nesting to at most "
        f"{JSON_DEPTH - CHUNK_DEPTH} levels"
    )


def mark_boundary(
    participants: Sequence[Any], ep: Episode, versions: Sequence[Any] | None = None
) -> BoundaryMark:
    """``ep``'s mark at its current step boundary (``participants``: ``Roles.sessions``).

    One ``export`` and one ``orjson.dumps`` per participant, in the state's final encoding
    (``final_state_bytes``); a failure is kept in the mark, naming the participant whose state
    it is, never raised (the episode runs on; only a cut that needs the mark fails it).

    ``versions`` (``Roles.versions``): a participant that declares ``state_version(state)``
    and gives the same value, not None, for the same state object as at ``ep``'s previous
    mark is not exported again: that mark's bytes of its state are reused."""
    turn = ep.turn
    prev = ep.mark
    reuse = (
        versions is not None
        and prev is not None
        and prev.parts is not None
        and prev.versions is not None
    )
    parts: list[bytes] = []
    now: list[Any] = []
    objects: list[Any] = []
    for i, p in enumerate(participants):
        state = ep.sessions[p.name]
        try:
            version = None
            if versions is not None:
                objects.append(state)
                version_of = versions[i]
                version = version_of(state) if version_of is not None else None
                now.append(version)
                if (
                    version is not None
                    and reuse
                    and prev.objects[i] is state  # type: ignore[union-attr,index]
                    and prev.versions[i] == version  # type: ignore[union-attr,index]
                ):
                    parts.append(prev.parts[i])  # type: ignore[union-attr,index]
                    continue
            plain = to_plain(p.export(state))
        except Exception as exc:
            return _export_failed(ep, p.name, turn, exc)
        part = _proven(plain)
        if part is None:
            try:
                part = final_state_bytes(plain, f"{p.name} session state")
            except NotPlainData as bad:
                return BoundaryMark(
                    turn, None, f"{episode_label(ep.info)}: at step boundary {turn}, {bad}"
                )
        parts.append(part)
    if versions is None:
        return BoundaryMark(turn, tuple(parts))
    return BoundaryMark(turn, tuple(parts), versions=tuple(now), objects=tuple(objects))


def _export_failed(ep: Episode, name: str, turn: int, exc: Exception) -> BoundaryMark:
    """The mark of a boundary where participant ``name``'s ``export`` raised ``exc``."""
    return BoundaryMark(
        turn,
        None,
        f"{episode_label(ep.info)}: exporting its {name} session state at step boundary "
        f"{turn} raised {exc!r}",
        exc,
    )


@final
@attrs.define(slots=True, eq=False)
class CutEpisode:
    """One active episode as the cut took it: its mark, the model calls it had completed
    (a copy), and whether it was inside a turn."""

    ep: Episode
    mark: BoundaryMark
    staged: tuple[StagedModelCall, ...]
    mid_turn: bool


def take_cut(episodes: Iterable[Episode]) -> tuple[list[CutEpisode], list[Episode]]:
    """(the episodes taken, those whose mark holds a problem): on the loop, at the cut.

    Every episode must have a mark of its current boundary (``Turns`` makes one at each
    boundary once armed; the caller marks an episode at a boundary that has none, and leaves
    out one inside a turn that has none), or have ended (``DONE``) since its last mark (a
    sliced cut takes it there: its final turn moved ``turn`` on and made no mark);
    ``staged`` is copied here, so a capture made after the cut is not in it."""
    taken: list[CutEpisode] = []
    refused: list[Episode] = []
    for ep in episodes:
        mark = ep.mark
        assert mark is not None and (mark.turn == ep.turn or ep.state == DONE), ep.rollout_id
        if mark.problem is not None:
            refused.append(ep)
            continue
        taken.append(CutEpisode(ep, mark, tuple(ep.staged), ep.stepping))
    return taken, refused


@final
@attrs.define(slots=True, eq=False)
class StandIn:
    """An episode as a cut holds it, for the records (built in the worker thread): what
    ``build_records`` reads of an ``Episode`` and nothing else, so a cut of 200k episodes builds
    no ``Episode`` (no slot key parsed again, no live state touched). ``state`` is always
    ``BOUNDARY``: the records take it where its mark was made."""

    info: EpisodeInfo
    rollout_id: str
    key: str
    sessions: dict[str, Any]
    turn: int
    staged: Sequence[StagedModelCall]
    state: str = BOUNDARY

    @property
    def capture_keys(self) -> tuple[str, ...]:
        return tuple([c.key for c in self.staged])


def stand_ins(
    participants: Sequence[Any], cut: Sequence[CutEpisode], unclaimed: Sequence[Episode]
) -> list[StandIn]:
    """In the worker thread: a ``StandIn`` per cut entry as the cut holds it (the turn of its
    mark, its copied calls, its exported states as ``sessions``) and per unclaimed restored
    episode (exported now: no task runs it), for ``build_records(..., exported=True)``.

    An unclaimed episode whose export raises raises (the caller makes it ``KeptExportError``:
    the host cannot fail it as an episode)."""
    names = [p.name for p in participants]
    loads = orjson.loads
    out = [
        StandIn(
            c.ep.info,
            c.ep.rollout_id,
            c.ep.key,
            dict(zip(names, map(loads, c.mark.parts), strict=True)),  # type: ignore[arg-type]
            c.mark.turn,
            c.staged,
        )
        for c in cut
    ]
    for ep in unclaimed:
        sessions = {p.name: to_plain(p.export(ep.sessions[p.name])) for p in participants}
        out.append(StandIn(ep.info, ep.rollout_id, ep.key, sessions, ep.turn, ep.staged))
    return out
