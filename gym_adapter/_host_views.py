"""What a Gym host reports about itself: counts, its inventory, its sessions.

A mixin of ``GymHost`` (kept apart so each module stays one concept): it only reads the host's
fields declared below. The views are snapshots; none changes the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ._contract import GymInstanceDead, InstanceInventory, InstanceTopology
from ._episode import to_plain
from ._host_episodes import BOUNDARY, Episode

if TYPE_CHECKING:
    from ._host import _Counters
    from ._host_streams import ReplyStreams

__all__ = ["HostStatistics", "HostViews", "RetainedSession", "SessionView"]


@attrs.frozen
class HostStatistics:
    """Counts of one host instance (a snapshot). ``counters``: the environment's own
    (``EpisodeContext.count``)."""

    instance: str
    dead: bool
    admission_open: bool
    prepared: bool
    running: int
    parked: int
    unclaimed: int
    on_wire: int
    streams: int
    episodes_started: int
    episodes_claimed: int
    completed: int
    failed: int
    refused_rows: int
    retired: int
    restored: int
    turns: int
    model_calls: int
    model_replays: int
    fenced_episodes: int
    fenced_replies: int
    stale_runs: int
    commits: int
    lease_reopened: int
    batches: int
    discarded_replies: int
    counters: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class SessionView:
    """One slot's session of one participant, as the host holds it now."""

    key: str
    rollout_id: str
    attempt: int
    state: Any


@attrs.frozen
class RetainedSession:
    """One slot's session of a retained participant (``retained = True``), as plain data.

    ``key`` is the slot (``"{row}-{slot}"``), ``rollout_id`` and ``attempt`` the attempt that
    owns it now (the one whose episode runs, is parked, or ended and was kept), ``state`` what
    the participant's ``export`` returns for it: the JSON value a snapshot records and a
    replacement or restore hands back to ``restore``."""

    key: str
    rollout_id: str
    attempt: int
    state: Any


class HostViews:
    """The views of ``GymHost`` (a mixin: the fields are the host's)."""

    if not TYPE_CHECKING:
        __slots__ = ()
    else:
        name: str
        count: _Counters
        _dead: bool
        _admission_open: bool
        _prepared: bool
        _episodes: dict[str, Episode]
        _n_moving: int
        _unclaimed: dict[str, Episode]
        _owners: dict[str, tuple[str, int]]
        _kept: dict[str, dict[str, Any]]
        _streams: ReplyStreams
        _user_counts: dict[str, int]
        _retained: tuple[Any, ...]

        @property
        def participants(self) -> tuple[tuple[str, str], ...]:
            raise NotImplementedError

    def topology(self) -> InstanceTopology:
        if self._dead:
            raise GymInstanceDead(self.name, "topology")
        return InstanceTopology(self.name, self.participants)

    def session_states(self, participant: str) -> dict[str, SessionView]:
        """Every slot's live session of ``participant`` by session key, sorted: those of
        running, parked and unclaimed episodes, and retained ones of ended episodes."""
        if participant not in {name for name, _ in self.participants}:
            raise KeyError(f"no participant {participant!r} on instance {self.name}")
        out: dict[str, SessionView] = {}
        for key in sorted(self._owners):
            rid, attempt = self._owners[key]
            ep = self._episodes.get(rid) or self._unclaimed.get(rid)
            sessions = ep.sessions if ep is not None else self._kept.get(key, {})
            if participant in sessions:
                out[key] = SessionView(key, rid, attempt, sessions[participant])
        return out

    def retained_sessions(self) -> dict[str, dict[str, RetainedSession]]:
        """Every retained participant's sessions, by participant name, then by slot key
        (sorted): of the episodes running, parked or unclaimed here and of the slots whose
        episode ended and which were kept. Plain data (the participant's ``export``); an export
        that raises is a ``ValueError`` naming the participant and the slot."""
        if self._dead:
            raise GymInstanceDead(self.name, "retained_sessions")
        out: dict[str, dict[str, RetainedSession]] = {}
        for p in self._retained:
            slots = out[p.name] = {}
            for key, view in self.session_states(p.name).items():
                try:
                    data = to_plain(p.export(view.state))
                except Exception as exc:
                    raise ValueError(
                        f"instance {self.name}: participant {p.name} could not export the "
                        f"session of slot {key} ({exc!r})"
                    ) from exc
                slots[key] = RetainedSession(key, view.rollout_id, view.attempt, data)
        return out

    def _n_parked(self) -> int:
        if not self._prepared:
            return 0
        return len(self._episodes) - self._n_moving  # running episodes that do not move

    def inventory(self) -> InstanceInventory:
        if self._dead:
            raise GymInstanceDead(self.name, "inventory")
        parked = (
            {r for r, ep in self._episodes.items() if ep.state == BOUNDARY}
            if self._prepared else set()
        )
        return InstanceInventory(
            instance=self.name,
            admission_open=self._admission_open,
            prepared=self._prepared,
            running=tuple(sorted(set(self._episodes) - parked)),
            parked=tuple(sorted(parked)),
            unclaimed=tuple(sorted(self._unclaimed)),
            on_wire=tuple(sorted(self._streams.on_wire)),
            lease_reopened=self.count.lease_reopened,
        )

    def statistics(self) -> HostStatistics:
        parked = self._n_parked()
        return HostStatistics(
            instance=self.name,
            dead=self._dead,
            admission_open=self._admission_open,
            prepared=self._prepared,
            running=len(self._episodes) - parked,
            parked=parked,
            unclaimed=len(self._unclaimed),
            on_wire=len(self._streams.on_wire),
            streams=len(self._streams.streams),
            batches=self._streams.batches,
            discarded_replies=self._streams.discarded,
            counters=dict(self._user_counts),
            **attrs.asdict(self.count),
        )
