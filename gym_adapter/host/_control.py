"""The Gym host's control plane: prepare, commit, resume, the lease, retire, restore, and the
fence of an older trainer term (``fence``: what a newer term's attach does first).

Two modes of checkpoint (``CheckpointMode``). Aligned: ``prepare`` parks every episode at its
next step boundary and returns once none moves; ``commit`` exports them as they are parked.
Unaligned: ``prepare`` closes admission and returns at once; ``commit`` is the instance's cut
(``_host_cut``): on the loop, in one go, every active episode is taken at its boundary mark with
the model calls it completed so far, the replies on the wire are listed, and from then on every
reply is held (``ReplyStreams.hold``) until ``resume`` (or the lease, or a later commit of the
same checkpoint, which first puts what it held on the wire). Nothing waits for a turn.
Aligned with an alignment timeout (Flink's aligned-checkpoint timeout): ``prepare`` waits that
long for the episodes to park, then returns with the rest still moving, and the commit is a cut
as above (a parked episode taken at the boundary it waits at, the others at their last one): no
turn, however long, fails a checkpoint. A prepare whose commit cuts arms the boundary marks
(``Parking.arm_marks``) where they are taken on demand; that first cut retries the episodes
inside a turn that started before (``_retry_unmarked``). An environment that opts out of
unaligned cuts has no marks to cut at: its prepare waits for every episode until the call's
deadline. An attempt fenced inside its turn (a newer attempt owns its slot) is not taken, as an
aligned commit never holds one. In either mode, a checkpoint that reopens while its commit
writes the records (the lease ran out) fails that commit: what it wrote is no cut of the
instance.

``ControlPlane`` drives the host's parts through a checkpoint: ``Parking`` (admission, parking,
the lease), the ``SlotTable`` (ownership and retained sessions), the ``EpisodeTable`` and the
reply streams; it owns no state of its own. It reaches the host itself only through
``ControlHost`` (its liveness, and ``end_episode``, the one exit of an active episode). The
host checks each call (alive, serving, ``deadline_ts`` not passed) before it gets here.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, final

import anyio
import anyio.lowlevel
import attrs

from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    InstanceRecord,
    TopologyMismatch,
    records_digest,
)
from gymckpt.runtime._shared import (
    AgentRecords,
    ChunkedRecords,
    CommittedRecords,
    SessionRecords,
    StagedRecords,
)
from gymckpt.runtime.lowlevel import collector_paused, promote_survivors, records_promoted

from .._contract import (
    AgentSession,
    CommitReply,
    ExportedEpisode,
    Failed,
    GymControlError,
    GymInstanceDead,
    ParticipantInfo,
    PrepareReply,
    RestoreReply,
    RetireReply,
    RunReply,
)
from ._cut import CUT_SLICE, CutEpisode, mark_boundary, stand_ins, take_cut
from ._environment import Environment, Roles
from ._episode import EpisodeInfo
from ._episodes import BOUNDARY, DONE, UNCLAIMED, Episode, EpisodeTable, StagedModelCall
from ._log import FailureLog
from ._parking import Parking
from ._records import (
    Kept,
    KeptExportError,
    RecordsToWrite,
    Refusal,
    build_records,
    commit_objects,
    cut_records,
    free_in_slices,
    offload,
    participant_objects,
    read_committed,
    restore_objects,
    sorted_in_slices,
    write_all,
)
from ._slots import JournalSlot, KeptCopy, SlotTable
from ._streams import ReplyStreams
from ._views import HostCounts

__all__ = ["ControlHost", "ControlPlane"]

MODEL_PROXY = "model_proxy"


@attrs.define(slots=True, eq=False)
class _Cut:
    """What a cut took on the loop, for the worker thread that writes its records: the
    episodes taken, the replies listed on the wire, the unclaimed restored episodes and the
    slots at the instant. The thread sorts the list (``on_wire_sorted``), counts ``mid_turn``
    and frees ``taken`` there, not on the loop."""

    taken: list[CutEpisode]
    on_wire: list[str]
    unclaimed: list[Episode]
    kept: KeptCopy
    on_wire_sorted: tuple[str, ...] = attrs.field(default=(), init=False)
    mid_turn: int = attrs.field(default=0, init=False)


_Exported = tuple[
    tuple[ExportedEpisode, ...],
    tuple[AgentSession, ...],
    tuple[ParticipantInfo, ...],
    list[Refusal],
    Exception | None,
]
"""What an export returns to ``commit``: the episodes, the agent sessions, the participants'
records, the episodes refused, and the problem that failed it (None if it did not)."""


@attrs.frozen
class _Built:
    """A cut's records built from its marks, still to write (``ControlPlane._write_built``):
    under ``root``, with the reply's episodes and agent sessions."""

    root: Path
    records: Mapping[str, ChunkedRecords]
    episodes: tuple[ExportedEpisode, ...]
    sessions: tuple[AgentSession, ...]


_rollout_id: Final = operator.attrgetter("ep.rollout_id")
"""A cut entry's rollout ID (a C-level key: a sort's keys cost no Python call)."""


@attrs.frozen
class _Tables:
    """Copies of the host's tables that a commit exports from (taken on the loop)."""

    episodes: list[Episode]
    unclaimed: list[Episode]
    slots: KeptCopy


class ControlHost(Protocol):
    """What the control plane reaches of its host."""

    @property
    def dead(self) -> bool: ...

    def end_episode(self, ep: Episode, reply: RunReply | None) -> None:
        """The one exit of an active episode (its reply, if any, goes on its stream)."""
        ...


@final
@attrs.define(eq=False, slots=True, repr=False)
class ControlPlane:
    """The control calls of one instance over its parts (module docstring)."""

    host: ControlHost
    name: str
    seed: int
    work_dir: Path | None
    environment: Environment
    roles: Roles
    participants: tuple[tuple[str, str], ...]
    strand_legacy_session: bool
    freeze_survivors: bool
    table: EpisodeTable
    slots: SlotTable
    parking: Parking
    streams: ReplyStreams
    count: HostCounts
    failure_log: FailureLog

    def __repr__(self) -> str:
        return f"<ControlPlane {self.name} commits={self.count.commits}>"

    # -- prepare / commit / resume -------------------------------------------------------------

    async def prepare(
        self,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        """Close admission and park every episode at its next step boundary; returns once
        nothing moves. Past ``deadline_ts``: ``GymCallTimeout`` (admission stays closed until a
        resume or the lease). Reopened meanwhile: ``GymControlError``. ``UNALIGNED`` (and an
        environment that does not opt out): nothing parks, it returns at once.

        ``alignment_timeout_s`` (and an environment that does not opt out): after that long,
        it returns with the episodes that have not parked still moving, for the commit's cut
        (``Parking.alignment_timed_out``); ``parked`` then counts fewer than run.

        Either way a prepare whose commit will cut arms the boundary marks
        (``Parking.arm_marks``; a no-op where they are armed from the start)."""
        parking = self.parking
        park = mode is CheckpointMode.ALIGNED or not self.environment.unaligned
        gen = parking.prepare(checkpoint_id, park=park)
        parking.arm_lease(self._lease_expired)
        if not parking.parks:
            parking.arm_marks()
            await anyio.lowlevel.checkpoint()
            if self.host.dead:
                raise GymInstanceDead(self.name, "prepare")
            return PrepareReply(self.name, checkpoint_id, 0, len(self.streams.on_wire))
        aligned_by = deadline_ts
        if alignment_timeout_s is not None and self.environment.unaligned:
            aligned_by = min(deadline_ts, anyio.current_time() + alignment_timeout_s)
        in_time = await parking.wait_parked(gen, aligned_by)
        await anyio.lowlevel.checkpoint()
        if self.host.dead:
            raise GymInstanceDead(self.name, "prepare")
        if not parking.prepared or parking.generation != gen:
            raise GymControlError(
                self.name, "prepare", f"checkpoint {checkpoint_id} reopened before it parked"
            )
        if (not in_time or parking.moving) and aligned_by < deadline_ts:
            # the alignment timeout ran out, not the call: the rest are the commit's to cut
            parking.arm_marks()
            parking.time_out_alignment(gen)
            parked = len(self.table.active) - parking.moving
            return PrepareReply(self.name, checkpoint_id, parked, len(self.streams.on_wire))
        if not in_time or parking.moving:
            raise GymCallTimeout(
                f"instance {self.name} prepare: {parking.moving} episodes did not reach a step "
                "boundary before the deadline",
                self.name,
                "prepare",
            )
        if self.freeze_survivors:  # all parked: what the process holds stays a while
            promote_survivors()
        parked = len(self.table.active)  # nothing moves: every running episode is parked
        return PrepareReply(self.name, checkpoint_id, parked, len(self.streams.on_wire))

    async def commit(self, checkpoint_id: str, state_root: str) -> CommitReply:
        """Write every participant's records under ``state_root/<instance>/<server_name>/`` and
        report them; needs a finished prepare of the same checkpoint.

        A commit that returns is restorable: every state in its records is finite plain data.
        A parked episode whose state cannot be exported fails (data) here, its reply listed
        ``on_wire`` for the checkpoint to drain; a retained or unclaimed session that cannot
        be is ``GymControlError`` (the checkpoint fails and is retried). See ``_export``."""
        parking = self.parking
        if not parking.prepared or parking.checkpoint_id != checkpoint_id:
            now = (
                f"checkpoint {parking.checkpoint_id} is open"
                if parking.prepared
                else "none is open"
            )
            raise GymControlError(
                self.name, "commit", f"checkpoint {checkpoint_id} is not prepared ({now})"
            )
        if not parking.parks or parking.alignment_timed_out:
            return await self._commit_cut(checkpoint_id, state_root)
        if parking.moving:
            raise GymControlError(
                self.name, "commit", f"{parking.moving} episodes have not parked yet"
            )
        # Export off the loop: every episode is parked and retire is refused while prepared, so
        # what the export reads stays put while it runs; the loop only takes C-level copies of
        # the tables (selecting, sorting and building records at 200k belongs in the thread).
        tables = _Tables(
            list(self.table.active.values()),
            list(self.table.unclaimed.values()),
            self.slots.copy(),
        )
        on_wire = set(self.streams.on_wire)
        generation = parking.generation
        exported, sessions, participants, refused, problem = await offload(
            functools.partial(self._export, checkpoint_id, self._root(state_root), tables)
        )
        self._check_exported(checkpoint_id, generation, problem)
        for refusal in refused:  # not in the records: failed, the reply goes on the wire
            self.failure_log.warn(refusal.message, refusal.exc)
            ep = self.table.active.get(refusal.rollout_id)
            if ep is not None and ep.state == BOUNDARY:
                self.host.end_episode(ep, Failed(refusal.rollout_id, "data", refusal.message))
                if refusal.rollout_id in self.streams.on_wire:
                    on_wire.add(refusal.rollout_id)
        self.count.commits += 1
        self.parking.arm_lease(self._lease_expired)
        return CommitReply(
            self.name,
            checkpoint_id,
            participants,
            exported,
            tuple(sorted(on_wire)),
            sessions,
        )

    async def _commit_cut(self, checkpoint_id: str, state_root: str) -> CommitReply:
        """An unaligned commit, or an aligned one whose alignment timed out: the cut on the
        loop (in slices of ``CUT_SLICE`` episodes, ``_cut``), the records off it (module
        docstring). A parked episode is taken at the boundary it waits at (its mark's), one
        still moving at its last one.

        An episode whose boundary mark holds a problem fails (data) with its reply listed on
        the wire, so the checkpoint drains it. An attempt fenced inside its turn at the
        instant (a newer attempt owns its slot; it ends at its next context call or boundary,
        its reply dropped) is not taken: an aligned commit never holds one either (it ends at
        the boundary where it would park), and its slot is the newer attempt's in the
        records."""
        generation = self.parking.generation
        # no full collection of what the process holds inside the cut (``collector_paused``)
        with collector_paused(self.freeze_survivors):
            if self.parking.unmarked_turns:
                cut = self._cut_whole(checkpoint_id)
                self.parking.unmarked_turns = False
            else:
                cut = await self._cut_in_slices(checkpoint_id, generation)
            done = await offload(
                functools.partial(self._export_cut, checkpoint_id, self._root(state_root), cut)
            )
            if isinstance(done, _Built):  # its writes wait on the disk, not on the GIL
                done = await offload(functools.partial(self._write_built, done), io=True)
        exported, sessions, participants, _refused, problem = done
        self._check_exported(checkpoint_id, generation, problem)
        self.count.commits += 1
        self.parking.arm_lease(self._lease_expired)
        return CommitReply(
            self.name,
            checkpoint_id,
            participants,
            exported,
            cut.on_wire_sorted,
            sessions,
            mid_turn=cut.mid_turn,
        )

    def _cut_whole(self, checkpoint_id: str) -> _Cut:
        """The first cut after marks were armed on demand, in one step: an episode inside a
        turn that started before the arming has no mark and is retried, its reply listed on
        the wire before the hold (``_retry_unmarked``)."""
        live = [
            ep
            for ep in self.table.active.values()
            if ep.state != DONE and not self.slots.fenced(ep)
        ]
        unmarked: list[Episode] = []
        for ep in live:
            if ep.mark is None or ep.mark.turn != ep.turn:
                if ep.stepping:  # its turn started before the marks were armed
                    unmarked.append(ep)
                else:  # at a boundary (parked, or not stepping yet): marked where it is
                    ep.mark = mark_boundary(self.roles.sessions, ep, self.roles.versions)
        if unmarked:
            retried = {ep.rollout_id for ep in unmarked}
            live = [ep for ep in live if ep.rollout_id not in retried]
            self._retry_unmarked(checkpoint_id, unmarked)
        with records_promoted():
            taken, bad = take_cut(live)
        for ep in bad:
            self._fail_marked(ep)
        self.streams.release()  # held since an earlier cut of this checkpoint: before this one
        on_wire = list(self.streams.on_wire)
        self.streams.hold()
        return _Cut(taken, on_wire, list(self.table.unclaimed.values()), self.slots.copy())

    async def _cut_in_slices(self, checkpoint_id: str, generation: int) -> _Cut:
        """The cut in slices of at most ``CUT_SLICE`` episodes, one scheduler step each
        (``_cut``): the instant lists the replies on the wire, holds the rest and copies the
        tables (C-level copies); each slice then takes its episodes as they are now. Raises
        as a commit does if the instance dies or the checkpoint reopens between two slices."""
        streams = self.streams
        streams.release()  # held since an earlier cut of this checkpoint: before this one
        on_wire = list(streams.on_wire)
        streams.hold()
        episodes = list(self.table.active.values())
        cut = _Cut([], on_wire, list(self.table.unclaimed.values()), self.slots.copy())
        bound = CUT_SLICE
        for start in range(0, len(episodes), bound):
            if start:
                await anyio.lowlevel.checkpoint()
                if self.host.dead:
                    raise GymInstanceDead(self.name, "commit")
                self._check_still_prepared(checkpoint_id, generation)
            self._take_slice(checkpoint_id, episodes[start : start + bound], cut)
        return cut

    def _take_slice(self, checkpoint_id: str, episodes: Sequence[Episode], cut: _Cut) -> None:
        """Take one slice's episodes into ``cut`` (``_cut_in_slices``). An episode that ended
        since the instant is taken at its last mark (its final reply is held), with the calls
        it completed up to now (a cut of it here: nothing it did since reached the trainer);
        one fenced at
        the instant is not taken; one whose mark holds a problem fails, or, ended since, has
        its held reply put on the wire: either way listed for the checkpoint to drain."""
        owners = cut.kept.owners  # the slots' owners at the instant
        live: list[Episode] = []
        for ep in episodes:
            if owners.get(ep.key, ("",))[0] != ep.rollout_id:
                continue  # fenced at the instant
            if ep.mark is None or (ep.mark.turn != ep.turn and ep.state != DONE):
                if ep.state != DONE and not ep.stepping:  # at a boundary: marked where it is
                    ep.mark = mark_boundary(self.roles.sessions, ep, self.roles.versions)
                elif ep.state != DONE:  # inside a turn with no mark: not after a whole cut
                    retried = self._retried(checkpoint_id, ep)
                    self.failure_log.warn(retried.message)
                    self._end_on_wire(ep, retried, cut.on_wire)
                    continue
                else:
                    self._put_through(ep, cut.on_wire)
                    continue
            live.append(ep)
        with records_promoted():  # a slice's CutEpisodes, walked by no young collection
            taken, bad = take_cut(live)
        cut.taken.extend(taken)
        for ep in bad:
            if ep.state == DONE:
                self._put_through(ep, cut.on_wire)
            else:
                self._fail_marked(ep, cut.on_wire)

    def _fail_marked(self, ep: Episode, on_wire: list[str] | None = None) -> None:
        """Fail ``ep``, whose boundary mark holds a problem (data); ``on_wire``: the hold is on,
        its reply goes on the wire past it and is listed there."""
        mark = ep.mark
        assert mark is not None and mark.problem is not None
        self.failure_log.warn(mark.problem, mark.exc)
        reply = Failed(ep.rollout_id, "data", mark.problem)
        if on_wire is None:
            ep.stop()
            self.host.end_episode(ep, reply)
        else:
            self._end_on_wire(ep, reply, on_wire)

    def _end_on_wire(self, ep: Episode, reply: Failed, on_wire: list[str]) -> None:
        """End ``ep`` with ``reply`` on the wire though the cut holds replies, listed in
        ``on_wire`` (the checkpoint drains it: the episode ended before its cut)."""
        ep.stop()
        streams = self.streams
        streams.holding = False
        try:
            self.host.end_episode(ep, reply)
        finally:
            streams.holding = True
        if ep.rollout_id in streams.on_wire:
            on_wire.append(ep.rollout_id)

    def _put_through(self, ep: Episode, on_wire: list[str]) -> None:
        """``ep`` ended since the instant and cannot be taken: its held final reply (if any)
        goes on the wire, listed in ``on_wire``, as if it had ended before the cut."""
        st = ep.stream
        if st is None:
            return
        for i, reply in enumerate(st.held):
            if reply.rollout_id == ep.rollout_id:
                del st.held[i]
                streams = self.streams
                streams.holding = False
                try:
                    streams.push(st, reply)
                finally:
                    streams.holding = True
                on_wire.append(ep.rollout_id)
                return

    def _retried(self, checkpoint_id: str, ep: Episode) -> Failed:
        """The reply of ``ep``, cut inside a turn that started before marks were armed."""
        return Failed(
            ep.rollout_id,
            "infra",
            f"{self.name}: checkpoint {checkpoint_id} cut the episode inside turn "
            f"{ep.turn}, which started before the instance took boundary marks: "
            "retried from its start",
        )

    def _retry_unmarked(self, checkpoint_id: str, unmarked: Sequence[Episode]) -> None:
        """The episodes inside a turn that started before the boundary marks were armed
        (``HostConfig.boundary_marks="on_demand"``: this is the instance's first cut): no
        state of their last boundary exists, so the cut cannot take them. Each ends now,
        failed as infrastructure (its row loses nothing: the trainer starts the slot's next
        attempt from the row's start once the checkpoint resumes), before the cut lists the
        replies on the wire, so the checkpoint drains its reply; what it mutated in a retained
        session is freed with it, as for any failed attempt."""
        self.failure_log.warn(
            f"instance {self.name} checkpoint {checkpoint_id}: {len(unmarked)} episodes inside "
            "a turn that started before this instance took boundary marks (boundary_marks="
            "'on_demand'; its first cut) are retried from their start"
        )
        for ep in unmarked:
            ep.stop()
            self.host.end_episode(ep, self._retried(checkpoint_id, ep))

    def _check_exported(
        self, checkpoint_id: str, generation: int, problem: Exception | None
    ) -> None:
        """After a commit's export: raise if the instance died meanwhile (what it committed died
        with it), if the checkpoint reopened (``_check_still_prepared``), or if the export met a
        ``problem`` (logged; the commit fails retryably)."""
        if self.host.dead:
            raise GymInstanceDead(self.name, "commit")
        self._check_still_prepared(checkpoint_id, generation)
        if problem is not None:
            self.failure_log.warn(
                f"instance {self.name} commit of {checkpoint_id}: {problem}", problem.__cause__
            )
            raise GymControlError(self.name, "commit", f"exporting session state failed: {problem}")

    def _check_still_prepared(self, checkpoint_id: str, generation: int) -> None:
        """``GymControlError`` if the checkpoint reopened while its records were being written
        (the lease ran out, or a resume came): aligned, the episodes moved again while the
        thread read them; unaligned, the replies held since the cut went out. Either way the
        records are not the instance's cut, and the checkpoint must fail (and be retried)."""
        parking = self.parking
        if not parking.prepared or parking.generation != generation:
            raise GymControlError(
                self.name,
                "commit",
                f"checkpoint {checkpoint_id} reopened while it was committing (its lease of "
                f"{parking.lease_s} s ran out, or a resume came); retry the checkpoint",
            )

    def _export_cut(self, checkpoint_id: str, root: Path, cut: _Cut) -> _Exported | _Built:
        """The records of a cut (in a worker thread): what the cut copied, and the unclaimed
        restored episodes and kept sessions, which nothing moves meanwhile (admission is closed
        and retire refused while prepared). Sorts the cut's list of replies on the wire, counts
        its mid-turn episodes and frees what it took, all here: none of it is the loop's work,
        and no C call in it holds the GIL (which the loop's thread waits for) long at 50k
        episodes: the sorts in slices (``sorted_in_slices``), the frees too. Records built from
        the marks come back ``_Built``, for ``_write_built`` to write in a thread of its own
        (``offload(..., io=True)``)."""
        # no collection while the records are made from the marks, then all promoted at once
        # (``records_promoted``): a young collection here walks the cut's lists and columns of
        # 50k items and whatever the loop's thread put back in the young generations
        with records_promoted():
            cut.on_wire_sorted = tuple(sorted_in_slices(list(set(cut.on_wire))))
            cut.mid_turn = sum(1 for c in cut.taken if c.mid_turn)
            taken, cut.taken = cut.taken, []
            taken = sorted_in_slices(taken, key=_rollout_id)
            done = self._export_marks(checkpoint_id, root, taken, cut.kept, cut.unclaimed)
        if done is not None:
            free_in_slices(taken)
            return done
        try:
            held = stand_ins(self.roles.sessions, taken, cut.unclaimed)
        except Exception as exc:  # an unclaimed episode's export raised
            problem = KeptExportError(f"exporting an unclaimed restored episode raised {exc!r}")
            problem.__cause__ = exc
            return (), (), (), [], problem
        free_in_slices(taken)
        return self._export(
            checkpoint_id,
            root,
            _Tables(held, [], cut.kept),
            exported=True,
        )

    def _export_marks(
        self,
        checkpoint_id: str,
        root: Path,
        taken: Sequence[CutEpisode],
        kept: KeptCopy,
        unclaimed: Sequence[Episode],
    ) -> _Exported | _Built | None:
        """The records of a cut straight from its marks (``cut_records``; ``taken`` sorted by
        rollout ID), to write (``_write_built``), or the problem that failed them; None where
        the cut is not one to take so (a legacy agent, unclaimed restored episodes, a
        participant that keeps objects, a state ``cut_records`` leaves to ``build_records``):
        the caller exports through stand-ins then."""
        roles = self.roles
        if roles.legacy or unclaimed or any(participant_objects(p) for p in roles.sessions):
            return None
        try:
            records = cut_records(
                self.environment,
                roles.owner,
                roles.retained,
                checkpoint_id,
                taken,
                kept.sessions(),
            )
        except KeptExportError as exc:
            return (), (), (), [], exc
        except Exception as exc:  # a bug of ours, not the user's: still only this commit
            problem = KeptExportError(f"building the records raised {exc!r}")
            problem.__cause__ = exc
            return (), (), (), [], problem
        if records is None:
            return None
        owner, agent = roles.owner, self.environment.agent
        keys = [tuple([s.key for s in c.staged]) for c in taken]
        episodes = tuple(
            ExportedEpisode(c.ep.rollout_id, owner, k) for c, k in zip(taken, keys, strict=True)
        )
        sessions = tuple(
            AgentSession(c.ep.rollout_id, agent.name, agent.kind, c.mark.turn, k)
            for c, k in zip(taken, keys, strict=True)
        )
        return _Built(root, records, episodes, sessions)

    def _write_built(self, built: _Built) -> _Exported:
        """Write records ``_export_marks`` built (in a worker thread): ``_write``."""
        try:
            participants = self._write(built.root, built.records)
        except KeptExportError as exc:  # a state names an object its participant lacks
            return (), (), (), [], exc
        return built.episodes, built.sessions, tuple(participants), [], None

    def _export(
        self, checkpoint_id: str, root: Path, tables: _Tables, *, exported: bool = False
    ) -> tuple[
        tuple[ExportedEpisode, ...],
        tuple[AgentSession, ...],
        tuple[ParticipantInfo, ...],
        list[Refusal],
        Exception | None,
    ]:
        """Build and write every participant's records (in a worker thread; see ``commit``).

        What a participant cannot hand over never aborts the run and never reaches the
        records (so a commit that succeeds is restorable): a parked episode whose session
        state cannot be exported (``export`` raises, or returns what is not finite plain data)
        is left out and returned refused, for ``commit`` to fail as data, its reply on the
        wire, drained by the checkpoint like any reply on the wire; a session the host cannot
        fail as an episode (a retained one of an ended episode, an unclaimed restored one)
        makes the commit fail retryably (``GymControlError``), returned here as the problem."""
        held = sorted(
            [*(ep for ep in tables.episodes if ep.state == BOUNDARY), *tables.unclaimed],
            key=lambda ep: ep.rollout_id,
        )
        kept: list[Kept] = tables.slots.sessions()
        legacy = self.roles.legacy
        stranded = held[0].rollout_id if held and legacy and self.strand_legacy_session else None
        try:
            records, refused = build_records(
                self.environment,
                self.roles.owner,
                self.roles.retained,
                checkpoint_id,
                held,
                kept,
                stranded,
                failable=(lambda ep: False) if exported else (lambda ep: ep.state == BOUNDARY),
                exported=exported,
            )
        except KeptExportError as exc:
            return (), (), (), [], exc
        except Exception as exc:  # a bug of ours, not the user's: still only this commit
            problem = KeptExportError(f"building the records raised {exc!r}")
            problem.__cause__ = exc
            return (), (), (), [], problem
        if refused:
            gone = {r.rollout_id for r in refused}
            held = [ep for ep in held if ep.rollout_id not in gone]
            if stranded in gone:
                stranded = None
        try:
            participants = self._write(root, records)
        except KeptExportError as exc:  # a state names an object its participant lacks
            return (), (), (), [], exc
        owner = self.roles.owner
        agent_name, agent_kind = self.environment.agent.name, self.environment.agent.kind
        keys = [ep.capture_keys for ep in held]
        episodes = (
            ()
            if legacy
            else tuple(
                ExportedEpisode(ep.rollout_id, owner, k) for ep, k in zip(held, keys, strict=True)
            )
        )
        sessions = tuple(
            AgentSession(
                ep.rollout_id,
                agent_name,
                agent_kind,
                None if ep.rollout_id == stranded else ep.turn,
                k,
            )
            for ep, k in zip(held, keys, strict=True)
        )
        return episodes, sessions, tuple(participants), refused, None

    def _write(self, root: Path, records: Mapping[str, ChunkedRecords]) -> list[ParticipantInfo]:
        """Write every participant's records under ``root/<instance>/`` (every object first,
        made durable together, then the indexes: ``write_all``) and report them;
        ``KeptExportError`` if a committed state names an object its participant does not
        have."""
        stores = {p.name: participant_objects(p) for p in self.roles.sessions}
        write_all(
            [
                RecordsToWrite(
                    root / self.name / server,
                    records[server],
                    stores.get(server),
                    f"instance {self.name}: participant {server}",
                )
                for server, _kind in self.participants
            ],
            commit_objects(root),
        )
        return [
            ParticipantInfo(
                server, kind, f"{self.name}/{server}", records_digest(root / self.name / server)
            )
            for server, kind in self.participants
        ]

    def resume(self, checkpoint_id: str) -> None:
        """Reopen admission, unpark, and put the replies held since a cut on the wire; a no-op
        when nothing is prepared."""
        parking = self.parking
        if not parking.prepared:
            return
        if parking.checkpoint_id != checkpoint_id:
            raise GymControlError(
                self.name,
                "resume",
                f"checkpoint {parking.checkpoint_id} is open, not {checkpoint_id}",
            )
        self._reopen()

    def _lease_expired(self) -> None:
        self.count.lease_reopened += 1
        self._reopen()

    def _reopen(self) -> None:
        self.parking.reopen()
        self.streams.release()

    # -- retire ----------------------------------------------------------------------------------

    def retire(self, op: str, rollout_ids: Sequence[str], *, restored_only: bool) -> RetireReply:
        """Stop these attempts and free their sessions (``restored_only``: drop unclaimed
        restored episodes, any other ID is unknown); refused while a checkpoint is open."""
        if self.parking.prepared:
            raise GymControlError(
                self.name,
                op,
                f"checkpoint {self.parking.checkpoint_id} is open; retire after it resumes",
            )
        retired: list[str] = []
        unknown: list[str] = []
        for rid in dict.fromkeys(rollout_ids):
            ep = self.table.take_unclaimed(rid)
            if ep is None and not restored_only and (ep := self.table.active.get(rid)) is not None:
                ep.stop()
                self.host.end_episode(ep, None)
            key = ep.key if ep is not None else None
            if key is None and not restored_only:
                key = self.slots.finished_slot(rid)
            if key is None:
                unknown.append(rid)
                continue
            self.slots.retire(rid, key)
            retired.append(rid)
            self.count.retired += 1
        if self.host.dead:
            # died inside the call (its journal tore a record, or failed): a dead instance
            # answers nothing. Its frees died with it, and what the kill dropped from memory
            # would read as unknown, while the replacement replays the journal and holds it.
            raise GymInstanceDead(self.name, op)
        return RetireReply(self.name, tuple(retired), tuple(unknown))

    # -- fencing a trainer term ------------------------------------------------------------------

    def fence(self) -> tuple[int, int, str | None]:
        """A trainer of a newer term took the instance over (``_host_tenancy``): nothing the
        older one started may reply, mutate or commit from now on. Every active episode ends
        without a reply (as a retire ends it), unclaimed restored episodes are dropped, every
        slot's sessions are freed as a retire frees them (the journal rewritten empty), every
        reply stream ends with what it had not delivered, and an open checkpoint is aborted:
        admission reopens, and a prepare or commit of it still running fails (the generation
        check of ``_check_still_prepared``). Synchronous: no call of the older term acts in
        between. Returns (episodes ended or dropped, slots freed, the aborted checkpoint)."""
        parking = self.parking
        aborted = parking.checkpoint_id if parking.prepared else None
        active = list(self.table.active.values())
        for ep in active:
            ep.stop()
            self.host.end_episode(ep, None)
        dropped = len(self.table.unclaimed)
        self.table.clear_unclaimed()
        freed = sum(1 for _ in self.slots.owners())
        self.streams.end_all()
        if aborted is not None:
            self._reopen()
        self.slots.install((), {}, ())
        if self.host.dead:  # the journal could not be rewritten: the instance stopped
            raise GymInstanceDead(self.name, "attach")
        return len(active) + dropped, freed, aborted

    # -- restore ---------------------------------------------------------------------------------

    def _root(self, state_root: str | Path) -> Path:
        root = Path(state_root)
        if not root.is_absolute() and self.work_dir is not None:
            root = self.work_dir / root
        return root

    def restore(
        self, state_root: str, record: InstanceRecord, episodes: Sequence[EpisodeRecord]
    ) -> RestoreReply:
        """Verify, then install committed sessions; restored episodes wait unclaimed.

        Any difference (topology, digests, an episode the records do not hold, a session state
        the participant cannot restore) raises ``TopologyMismatch`` listing all of them, with
        nothing changed. The instance must be idle and not prepared (``GymControlError``).
        """
        diffs, records = read_committed(
            self.name, self.participants, self._root(state_root), record
        )
        loaded = _Committed(records)
        if not diffs:  # the objects the states name, back in their stores before any restore
            diffs += restore_objects(
                self.roles.sessions, records, self._root(state_root), f"instance {self.name}"
            )
        restored: dict[str, Episode] = {}
        kept: dict[str, tuple[str, int, dict[str, Any]]] = {}
        if not diffs:
            restored = self._rebuild(loaded, episodes, diffs)
        if not diffs:
            kept = self._rebuild_kept(loaded, restored, diffs)
        journal: list[JournalSlot] = []
        if not diffs and self.slots.journaling:
            journal = self._journal_slots(loaded, kept, restored, diffs)
        if diffs:
            raise TopologyMismatch(diffs)
        if self.parking.prepared:
            raise GymControlError(
                self.name, "restore", f"checkpoint {self.parking.checkpoint_id} is open"
            )
        active, unclaimed = self.table.active, self.table.unclaimed
        if active or unclaimed:
            raise GymControlError(
                self.name,
                "restore",
                f"restore needs an idle instance; {len(active)} running and "
                f"{len(unclaimed)} unclaimed episodes here",
            )
        self.table.install_unclaimed(restored)
        self.slots.install(restored.values(), kept, journal)
        self.count.restored += len(restored)
        return RestoreReply(self.name, tuple(restored))

    def _journal_slots(
        self,
        loaded: _Committed,
        kept: Mapping[str, tuple[str, int, dict[str, Any]]],
        restored: Mapping[str, Episode],
        diffs: list[str],
    ) -> list[JournalSlot]:
        """The retained sessions a restore journals: the committed data itself, as the
        digest-checked records hold it (plain JSON read from disk), never a second ``export``
        of what was just restored. The user's export is not asked again, so a participant
        whose export fails now and then cannot make a snapshot it committed unrestorable, and
        the journal holds exactly the bytes the snapshot holds. A session the records do not
        hold for a retained participant is a difference (``TopologyMismatch``, nothing
        changed)."""
        committed = {
            p.name: {s.rollout_id: s.state for s in loaded.sessions(p.name).sessions}
            for p in self.roles.retained
        }
        every = [
            *((key, rid, attempt) for key, (rid, attempt, _) in kept.items()),
            *((ep.key, ep.rollout_id, ep.info.attempt) for ep in restored.values()),
        ]
        slots: list[JournalSlot] = []
        for key, rid, attempt in every:
            states: dict[str, Any] = {}
            for p in self.roles.retained:
                if rid not in committed[p.name]:
                    diffs.append(
                        f"instance {self.name}: session {key} of {rid} has no "
                        f"{p.name} state in the committed records"
                    )
                    break
                states[p.name] = committed[p.name][rid]
            else:
                slots.append((key, rid, attempt, states))
        return slots

    def _rebuild_kept(
        self,
        loaded: _Committed,
        restored: Mapping[str, Episode],
        diffs: list[str],
    ) -> dict[str, tuple[str, int, dict[str, Any]]]:
        """The retained sessions of ended episodes the records hold, by key; problems into
        diffs."""
        kept: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for p in self.roles.retained:
            records = loaded.sessions(p.name)
            try:
                for s in records.sessions:
                    if s.rollout_id in restored:
                        continue
                    have = kept.setdefault(s.key, (s.rollout_id, s.attempt, {}))
                    if have[:2] != (s.rollout_id, s.attempt):
                        diffs.append(
                            f"instance {self.name}: participant {p.name} holds session {s.key} "
                            f"of {s.rollout_id} attempt {s.attempt}, another participant of "
                            f"{have[0]} attempt {have[1]}"
                        )
                        continue
                    have[2][p.name] = p.restore(s.state)
            except Exception as exc:  # the participant's restore raised
                diffs.append(
                    f"instance {self.name}: retained sessions of {p.name} cannot be restored "
                    f"({exc!r})"
                )
        for key, (rid, _, states) in kept.items():
            missing = [p.name for p in self.roles.retained if p.name not in states]
            if missing:
                diffs.append(
                    f"instance {self.name}: session {key} of {rid} has no "
                    f"{', '.join(missing)} state in the committed records"
                )
        return kept

    def _exported(
        self, loaded: _Committed, agent_records: AgentRecords, diffs: list[str]
    ) -> frozenset[str] | None:
        """The episodes the owner's committed records list as exported (empty for a legacy
        environment, which exports none); None, and the problem into diffs, when they list
        none."""
        if self.roles.legacy:
            return frozenset()
        owner = self.roles.owner
        owned = (
            agent_records.exported
            if owner == self.environment.agent.name
            else loaded.sessions(owner).exported
        )
        if owned is None:
            diffs.append(
                f"instance {self.name}: committed records of {owner} list no exported episodes"
            )
            return None
        return frozenset(owned)

    def _rebuild(
        self,
        loaded: _Committed,
        episodes: Sequence[EpisodeRecord],
        diffs: list[str],
    ) -> dict[str, Episode]:
        """The unclaimed episodes ``episodes`` as the records hold them; problems into diffs."""
        env = self.environment
        agent = env.agent
        owner = self.roles.owner
        out: dict[str, Episode] = {}
        agent_records = loaded.agent(agent.name)
        agent_sessions = {s.rollout_id: s for s in agent_records.sessions}
        by_participant = {
            p.name: {s.rollout_id: s for s in loaded.sessions(p.name).sessions}
            for p in env.participants
        }
        exported = self._exported(loaded, agent_records, diffs)
        if exported is None:
            return out
        staged = (
            {e.rollout_id: e.calls for e in loaded.staged(MODEL_PROXY).staged}
            if env.model is not None
            else {}
        )
        for rec in episodes:
            which = f"instance {self.name}: episode {rec.rollout_id}"
            if rec.rollout_id in out:
                diffs.append(f"{which} listed twice")
                continue
            if rec.replica != self.name:
                diffs.append(f"{which} belongs to replica {rec.replica}")
            if rec.owner != owner:
                diffs.append(f"{which} owner {rec.owner} recorded, {owner} exports it here")
            s = agent_sessions.get(rec.rollout_id)
            if s is None:
                diffs.append(f"{which} has no agent session in the committed records")
                continue
            if s.step_boundary is None:
                diffs.append(f"{which} agent session has no step boundary (stranded)")
                continue
            if not self.roles.legacy and rec.rollout_id not in exported:
                diffs.append(f"{which} not exported by {owner} in the committed records")
            missing = [
                p.name for p in env.participants if rec.rollout_id not in by_participant[p.name]
            ]
            if missing:
                diffs.append(
                    f"{which} has no {', '.join(missing)} session in the committed records"
                )
                continue
            info = EpisodeInfo(rec.rollout_id, s.row, s.slot, s.attempt, self.seed, self.name)
            try:
                sessions = {agent.name: agent.restore(s.state)}
                for p in env.participants:
                    sessions[p.name] = p.restore(by_participant[p.name][rec.rollout_id].state)
            except Exception as exc:  # a participant's restore raised
                diffs.append(f"{which}: committed session state cannot be restored ({exc!r})")
                continue
            calls = [
                StagedModelCall(c.key, c.response, c.request_digest, c.policy_version)
                for c in staged.get(rec.rollout_id, ())
            ]
            out[rec.rollout_id] = Episode(
                info,
                sessions,
                UNCLAIMED,
                turn=s.step_boundary,
                staged=calls,
                inherited=len(calls),
                replay=tuple(rec.capture_keys),
            )
        return out


@final
@attrs.frozen
class _Committed:
    """Each participant's typed records of one restore, by server name, as ``read_committed``
    parsed them: every participant of the live topology is there (the readers run only when
    it reported no difference), in the role its place gives it."""

    records: Mapping[str, CommittedRecords]

    def agent(self, name: str) -> AgentRecords:
        records = self.records[name]
        assert isinstance(records, AgentRecords), name
        return records

    def sessions(self, name: str) -> SessionRecords:
        records = self.records[name]
        assert isinstance(records, SessionRecords), name
        return records

    def staged(self, name: str) -> StagedRecords:
        records = self.records[name]
        assert isinstance(records, StagedRecords), name
        return records
