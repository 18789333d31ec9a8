"""The Gym host's control plane: prepare, commit, resume, the lease, retire, restore.

A mixin of ``GymHost`` (kept apart so each module stays one concept): it reads and changes the
host's episode table only through the fields declared below. Every call checks the instance is
alive and serving and enforces its ``deadline_ts`` once it runs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs

from gymckpt.runtime import (
    EpisodeRecord,
    GymCallTimeout,
    InstanceRecord,
    TopologyMismatch,
    promote_survivors,
    records_digest,
)

from ._contract import (
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
)
from ._episode import EpisodeInfo
from ._host_episodes import BOUNDARY, DONE, UNCLAIMED, Episode
from ._host_records import (
    Kept,
    KeptExportError,
    Refusal,
    build_records,
    offload,
    read_verified,
    write_records,
)

if TYPE_CHECKING:
    from ._environment import Environment
    from ._host import HostConfig, _Counters
    from ._host_journal import SessionJournal
    from ._host_log import FailureLog
    from ._host_streams import ReplyStreams

__all__ = ["HostControl"]

MODEL_PROXY = "model_proxy"


@attrs.frozen
class _Tables:
    """Copies of the host's tables that a commit exports from (taken on the loop)."""

    episodes: list[Episode]
    unclaimed: list[Episode]
    kept: list[tuple[str, dict[str, Any]]]
    owners: dict[str, tuple[str, int]]
    finished: dict[str, str]


class HostControl:
    """The control plane of ``GymHost`` (a mixin: the fields are the host's)."""

    if not TYPE_CHECKING:
        __slots__ = ()
    else:
        name: str
        environment: Environment
        seed: int
        work_dir: Path | None
        config: HostConfig
        count: _Counters
        _tg: anyio.abc.TaskGroup | None
        _closing: bool
        _dead: bool
        _admission_open: bool
        _prepared: bool
        _checkpoint_id: str | None
        _gen: int
        _prepared_evt: anyio.Event | None
        _all_parked: anyio.Event | None
        _lease_scope: anyio.CancelScope | None
        _episodes: dict[str, Episode]
        _unclaimed: dict[str, Episode]
        _owners: dict[str, tuple[str, int]]
        _kept: dict[str, dict[str, Any]]
        _finished: dict[str, str]
        _n_moving: int
        _streams: ReplyStreams
        _journal: SessionJournal | None
        _retained: tuple[Any, ...]
        failure_log: FailureLog

        @property
        def _legacy(self) -> bool:
            raise NotImplementedError

        @property
        def _owner_name(self) -> str:
            raise NotImplementedError

        @property
        def participants(self) -> tuple[tuple[str, str], ...]:
            raise NotImplementedError

        def _check_call(self, op: str, deadline_ts: float | None = None) -> Any: ...
        def end_episode(self, ep: Episode, reply: Any) -> None: ...
        def _unpark_all(self) -> None: ...

    # -- prepare / commit / resume -------------------------------------------------------------

    async def prepare(self, checkpoint_id: str, deadline_ts: float) -> PrepareReply:
        """Close admission and park every episode at its next step boundary; returns once
        nothing moves. Past ``deadline_ts``: ``GymCallTimeout`` (admission stays closed until a
        resume or the lease). Reopened meanwhile: ``GymControlError``."""
        self._check_call("prepare", deadline_ts)
        self._admission_open = False
        self._checkpoint_id = checkpoint_id
        if not self._prepared:
            assert self._prepared_evt is not None
            self._prepared = True
            self._gen += 1
            self._all_parked = anyio.Event()
            self._prepared_evt.set()
        gen = self._gen
        assert self._all_parked is not None
        if self._n_moving and self._all_parked.is_set():
            self._all_parked = anyio.Event()
        self._arm_lease()
        with anyio.move_on_at(deadline_ts) as scope:
            while self._n_moving and self._prepared and self._gen == gen and not self._dead:
                assert self._all_parked is not None
                await self._all_parked.wait()
        await anyio.lowlevel.checkpoint()
        if self._dead:
            raise GymInstanceDead(self.name, "prepare")
        if not self._prepared or self._gen != gen:
            raise GymControlError(
                self.name, "prepare", f"checkpoint {checkpoint_id} reopened before it parked"
            )
        if scope.cancelled_caught or self._n_moving:
            raise GymCallTimeout(
                f"instance {self.name} prepare: {self._n_moving} episodes did not reach a step "
                "boundary before the deadline",
                self.name,
                "prepare",
            )
        if self.config.freeze_survivors:  # all parked: what the process holds stays a while
            promote_survivors()
        parked = len(self._episodes)  # nothing moves: every running episode is parked
        return PrepareReply(self.name, checkpoint_id, parked, len(self._streams.on_wire))

    async def commit(self, checkpoint_id: str, state_root: str, deadline_ts: float) -> CommitReply:
        """Write every participant's records under ``state_root/<instance>/<server_name>/`` and
        report them; needs a finished prepare of the same checkpoint.

        A commit that returns is restorable: every state in its records is finite plain data.
        A parked episode whose state cannot be exported fails (data) here, its reply listed
        ``on_wire`` for the checkpoint to drain; a retained or unclaimed session that cannot
        be is ``GymControlError`` (the checkpoint fails and is retried). See ``_export``."""
        self._check_call("commit", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("commit", deadline_ts)
        if not self._prepared or self._checkpoint_id != checkpoint_id:
            now = f"checkpoint {self._checkpoint_id} is open" if self._prepared else "none is open"
            raise GymControlError(
                self.name, "commit", f"checkpoint {checkpoint_id} is not prepared ({now})"
            )
        if self._n_moving:
            raise GymControlError(
                self.name, "commit", f"{self._n_moving} episodes have not parked yet"
            )
        # Export off the loop: every episode is parked and retire is refused while prepared, so
        # what the export reads stays put while it runs; the loop only takes C-level copies of
        # the tables (selecting, sorting and building records at 200k belongs in the thread).
        tables = _Tables(list(self._episodes.values()), list(self._unclaimed.values()),
                         list(self._kept.items()), dict(self._owners), dict(self._finished))
        on_wire = set(self._streams.on_wire)
        exported, sessions, participants, refused, problem = await offload(
            functools.partial(self._export, checkpoint_id, self._root(state_root), tables)
        )
        if self._dead:  # died while exporting: what it committed died with it
            raise GymInstanceDead(self.name, "commit")
        if problem is not None:
            self.failure_log.warn(f"instance {self.name} commit of {checkpoint_id}: "
                                  f"{problem}", problem.__cause__)
            raise GymControlError(
                self.name, "commit", f"exporting session state failed: {problem}"
            )
        for refusal in refused:  # not in the records: failed, the reply goes on the wire
            self.failure_log.warn(refusal.message, refusal.exc)
            ep = self._episodes.get(refusal.rollout_id)
            if ep is not None and ep.state == BOUNDARY:
                self.end_episode(ep, Failed(refusal.rollout_id, "data", refusal.message))
                if refusal.rollout_id in self._streams.on_wire:
                    on_wire.add(refusal.rollout_id)
        self.count.commits += 1
        self._arm_lease()
        return CommitReply(
            self.name, checkpoint_id, participants, exported, tuple(sorted(on_wire)), sessions,
        )

    def _export(
        self, checkpoint_id: str, root: Path, tables: _Tables
    ) -> tuple[
        tuple[ExportedEpisode, ...], tuple[AgentSession, ...], tuple[ParticipantInfo, ...],
        list[Refusal], Exception | None,
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
        kept: list[Kept] = [
            (key, rid, tables.owners[key][1], states)
            for key, states in tables.kept
            if (rid := tables.owners.get(key, ("",))[0]) in tables.finished
        ]
        stranded = (
            held[0].rollout_id
            if held and self._legacy and self.config.strand_legacy_session else None
        )
        try:
            records, refused = build_records(
                self.environment, self._owner_name, self._retained, checkpoint_id, held, kept,
                stranded, failable=lambda ep: ep.state == BOUNDARY,
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
        participants = []
        for server, kind in self.participants:
            directory = root / self.name / server
            write_records(directory, records[server])
            participants.append(
                ParticipantInfo(server, kind, f"{self.name}/{server}", records_digest(directory))
            )
        owner = self._owner_name
        agent_name, agent_kind = self.environment.agent.name, self.environment.agent.kind
        keys = [ep.capture_keys for ep in held]
        exported = () if self._legacy else tuple(
            ExportedEpisode(ep.rollout_id, owner, k) for ep, k in zip(held, keys, strict=True)
        )
        sessions = tuple(
            AgentSession(
                ep.rollout_id, agent_name, agent_kind,
                None if ep.rollout_id == stranded else ep.turn, k,
            )
            for ep, k in zip(held, keys, strict=True)
        )
        return exported, sessions, tuple(participants), refused, None

    async def resume(self, checkpoint_id: str, deadline_ts: float) -> None:
        """Reopen admission and unpark; a no-op when nothing is prepared."""
        self._check_call("resume", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("resume", deadline_ts)
        if not self._prepared:
            return
        if self._checkpoint_id != checkpoint_id:
            raise GymControlError(
                self.name,
                "resume",
                f"checkpoint {self._checkpoint_id} is open, not {checkpoint_id}",
            )
        self._reopen()

    def _reopen(self) -> None:
        assert self._all_parked is not None
        self._cancel_lease()
        self._prepared = False
        self._checkpoint_id = None
        self._admission_open = True
        self._prepared_evt = anyio.Event()
        self._unpark_all()
        self._all_parked.set()

    def _arm_lease(self) -> None:
        assert self._tg is not None
        self._cancel_lease()
        if self._closing:  # shutting down (or dead): the task group takes no new task
            return
        scope = self._lease_scope = anyio.CancelScope()
        self._tg.start_soon(self._lease_watch, scope, self._gen)

    def _cancel_lease(self) -> None:
        if self._lease_scope is not None:
            self._lease_scope.cancel()
            self._lease_scope = None

    async def _lease_watch(self, scope: anyio.CancelScope, gen: int) -> None:
        with scope:
            await anyio.sleep(self.config.lease_s)
            if self._prepared and self._gen == gen and not self._dead:
                self.count.lease_reopened += 1
                self._reopen()

    # -- retire ----------------------------------------------------------------------------------

    async def retire(self, rollout_ids: Sequence[str], deadline_ts: float) -> RetireReply:
        """Stop these attempts and free their sessions; refused while a checkpoint is open."""
        return await self._retire("retire", rollout_ids, deadline_ts, restored_only=False)

    async def retire_restored(self, rollout_ids: Sequence[str], deadline_ts: float) -> RetireReply:
        """Drop unclaimed restored episodes; any other ID is reported unknown."""
        return await self._retire("retire_restored", rollout_ids, deadline_ts, restored_only=True)

    async def _retire(
        self, op: str, rollout_ids: Sequence[str], deadline_ts: float, *, restored_only: bool
    ) -> RetireReply:
        self._check_call(op, deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call(op, deadline_ts)
        if self._prepared:
            raise GymControlError(
                self.name, op, f"checkpoint {self._checkpoint_id} is open; retire after it resumes"
            )
        retired: list[str] = []
        unknown: list[str] = []
        for rid in dict.fromkeys(rollout_ids):
            ep = self._unclaimed.pop(rid, None)
            if ep is not None:
                ep.state = DONE
            elif not restored_only and (ep := self._episodes.get(rid)) is not None:
                ep.stop()
                self.end_episode(ep, None)
            key = ep.key if ep is not None else None
            if key is None and not restored_only and rid in self._finished:
                key = self._finished[rid]
            if key is None:
                unknown.append(rid)
                continue
            self._finished.pop(rid, None)
            if self._owners.get(key, ("",))[0] == rid:
                del self._owners[key]
                self._kept.pop(key, None)
                if self._journal is not None:
                    self._journal.freed(key)
            retired.append(rid)
            self.count.retired += 1
        if self._dead:
            # died inside the call (its journal tore a record, or failed): a dead instance
            # answers nothing. Its frees died with it, and what the kill dropped from memory
            # would read as unknown, while the replacement replays the journal and holds it.
            raise GymInstanceDead(self.name, op)
        return RetireReply(self.name, tuple(retired), tuple(unknown))

    # -- restore ---------------------------------------------------------------------------------

    def _root(self, state_root: str | Path) -> Path:
        root = Path(state_root)
        if not root.is_absolute() and self.work_dir is not None:
            root = self.work_dir / root
        return root

    async def restore(
        self,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        """Verify, then install committed sessions; restored episodes wait unclaimed.

        Any difference (topology, digests, an episode the records do not hold, a session state
        the participant cannot restore) raises ``TopologyMismatch`` listing all of them, with
        nothing changed. The instance must be idle and not prepared (``GymControlError``).
        """
        self._check_call("restore", deadline_ts)
        await anyio.lowlevel.checkpoint()
        self._check_call("restore", deadline_ts)
        diffs, loaded = read_verified(self.name, self.participants, self._root(state_root), record)
        restored: dict[str, Episode] = {}
        kept: dict[str, tuple[str, int, dict[str, Any]]] = {}
        if not diffs:
            restored = self._rebuild(loaded, episodes, diffs)
        if not diffs:
            kept = self._rebuild_kept(loaded, restored, diffs)
        slots: list[tuple[str, str, int, dict[str, Any]]] = []
        if not diffs and self._journal is not None:
            slots = self._journal_slots(loaded, kept, restored, diffs)
        if diffs:
            raise TopologyMismatch(diffs)
        if self._prepared:
            raise GymControlError(self.name, "restore", f"checkpoint {self._checkpoint_id} is open")
        if self._episodes or self._unclaimed:
            raise GymControlError(
                self.name, "restore",
                f"restore needs an idle instance; {len(self._episodes)} running and "
                f"{len(self._unclaimed)} unclaimed episodes here",
            )
        self._unclaimed = restored
        self._owners = {ep.key: (ep.rollout_id, ep.info.attempt) for ep in restored.values()}
        self._owners.update((key, (rid, attempt)) for key, (rid, attempt, _) in kept.items())
        self._kept = {key: states for key, (_, _, states) in kept.items()}
        self._finished = {rid: key for key, (rid, _, _) in kept.items()}
        if self._journal is not None:
            self._journal.rewrite(slots)
        self.count.restored += len(restored)
        return RestoreReply(self.name, tuple(restored))

    def _journal_slots(
        self,
        loaded: Mapping[str, Mapping[str, Any]],
        kept: Mapping[str, tuple[str, int, dict[str, Any]]],
        restored: Mapping[str, Episode],
        diffs: list[str],
    ) -> list[tuple[str, str, int, dict[str, Any]]]:
        """The retained sessions a restore journals: the committed data itself, as the
        digest-checked records hold it (plain JSON read from disk), never a second ``export``
        of what was just restored. The user's export is not asked again, so a participant
        whose export fails now and then cannot make a snapshot it committed unrestorable, and
        the journal holds exactly the bytes the snapshot holds. A session the records do not
        hold for a retained participant is a difference (``TopologyMismatch``, nothing
        changed)."""
        committed: dict[str, dict[str, Any]] = {}
        for p in self._retained:
            try:
                committed[p.name] = {
                    str(s["rollout_id"]): s["state"] for s in loaded[p.name]["sessions"]
                }
            except (KeyError, TypeError) as exc:
                diffs.append(f"instance {self.name}: committed records of {p.name} malformed "
                             f"({exc!r})")
                return []
        every = [
            *((key, rid, attempt) for key, (rid, attempt, _) in kept.items()),
            *((ep.key, ep.rollout_id, ep.info.attempt) for ep in restored.values()),
        ]
        slots: list[tuple[str, str, int, dict[str, Any]]] = []
        for key, rid, attempt in every:
            states: dict[str, Any] = {}
            for p in self._retained:
                if rid not in committed[p.name]:
                    diffs.append(f"instance {self.name}: session {key} of {rid} has no "
                                 f"{p.name} state in the committed records")
                    break
                states[p.name] = committed[p.name][rid]
            else:
                slots.append((key, rid, attempt, states))
        return slots

    def _rebuild_kept(
        self,
        loaded: Mapping[str, Mapping[str, Any]],
        restored: Mapping[str, Episode],
        diffs: list[str],
    ) -> dict[str, tuple[str, int, dict[str, Any]]]:
        """The retained sessions of ended episodes the records hold, by key; problems into
        diffs."""
        kept: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for p in self._retained:
            try:
                sessions = [s for s in loaded[p.name]["sessions"]
                            if s["rollout_id"] not in restored]
                for s in sessions:
                    key, rid, attempt = str(s["key"]), str(s["rollout_id"]), int(s["attempt"])
                    have = kept.setdefault(key, (rid, attempt, {}))
                    if have[:2] != (rid, attempt):
                        diffs.append(
                            f"instance {self.name}: participant {p.name} holds session {key} of "
                            f"{rid} attempt {attempt}, another participant of {have[0]} "
                            f"attempt {have[1]}"
                        )
                        continue
                    have[2][p.name] = p.restore(s["state"])
            except Exception as exc:
                diffs.append(
                    f"instance {self.name}: retained sessions of {p.name} cannot be restored "
                    f"({exc!r})"
                )
        for key, (rid, _, states) in kept.items():
            missing = [p.name for p in self._retained if p.name not in states]
            if missing:
                diffs.append(f"instance {self.name}: session {key} of {rid} has no "
                             f"{', '.join(missing)} state in the committed records")
        return kept

    def _rebuild(
        self,
        loaded: Mapping[str, Mapping[str, Any]],
        episodes: Sequence[EpisodeRecord],
        diffs: list[str],
    ) -> dict[str, Episode]:
        """The unclaimed episodes ``episodes`` as the records hold them; problems into diffs."""
        env = self.environment
        agent = env.agent
        owner = self._owner_name
        out: dict[str, Episode] = {}
        try:
            agent_sessions = {s["rollout_id"]: s for s in loaded[agent.name]["sessions"]}
            by_participant = {
                p.name: {s["rollout_id"]: s for s in loaded[p.name]["sessions"]}
                for p in env.participants
            }
            exported = set(loaded[owner]["exported"]) if not self._legacy else set()
            staged = (
                {s["rollout_id"]: s["calls"] for s in loaded[MODEL_PROXY]["staged"]}
                if env.model is not None else {}
            )
        except (KeyError, TypeError) as exc:
            diffs.append(f"instance {self.name}: committed records malformed ({exc!r})")
            return out
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
            if s.get("step_boundary") is None:
                diffs.append(f"{which} agent session has no step boundary (stranded)")
                continue
            if not self._legacy and rec.rollout_id not in exported:
                diffs.append(f"{which} not exported by {owner} in the committed records")
            try:
                info = EpisodeInfo(rec.rollout_id, int(s["row"]), int(s["slot"]),
                                   int(s["attempt"]), self.seed, self.name)
                sessions = {agent.name: agent.restore(s["state"])}
                for p in env.participants:
                    ps = by_participant[p.name].get(rec.rollout_id)
                    if ps is None:
                        raise KeyError(f"no {p.name} session")
                    sessions[p.name] = p.restore(ps["state"])
                calls = [(c["key"], c["response"]) for c in staged.get(rec.rollout_id, ())]
            except Exception as exc:
                diffs.append(f"{which}: committed session state cannot be restored ({exc!r})")
                continue
            out[rec.rollout_id] = Episode(
                info, sessions, UNCLAIMED, turn=int(s["step_boundary"]),
                staged=calls, replay=tuple(rec.capture_keys),
            )
        return out

