"""What a Gym host reports about itself: its counts, its inventory, its sessions.

``HostCounts`` is the tally a host keeps (one writer per count: the path the event happens on);
``HostStatistics`` is that tally with the gauges of the moment, a frozen snapshot. ``HostViews``
reads the host's parts (it holds them, and writes none of them): every view is a snapshot, and
none changes the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, final

import attrs

from .._contract import GymInstanceDead, InstanceInventory, InstanceTopology
from ._environment import Roles
from ._episode import to_plain
from ._episodes import BOUNDARY, EpisodeTable
from ._parking import Parking
from ._slots import SlotTable
from ._streams import ReplyStreams

__all__ = ["HostCounts", "HostStatistics", "HostViews", "RetainedSession", "SessionView"]


@attrs.define(eq=False, slots=True)
class HostCounts:
    """What happened on one host instance, counted as it happens (each count only grows)."""

    episodes_started: int = 0
    episodes_claimed: int = 0
    completed: int = 0
    failed: int = 0
    refused_rows: int = 0
    retired: int = 0
    restored: int = 0
    turns: int = 0
    model_calls: int = 0
    model_replays: int = 0
    fenced_episodes: int = 0
    fenced_replies: int = 0
    stale_runs: int = 0
    commits: int = 0
    lease_reopened: int = 0
    fenced_terms: int = 0
    """Terms fenced here: takeovers by a newer term of the lineage that held the instance
    (``GymHost.attach``)."""


@attrs.frozen(kw_only=True)
class HostStatistics(HostCounts):
    """Counts of one host instance (a snapshot): its ``HostCounts`` and the gauges of the
    moment. ``counters``: the environment's own (``EpisodeContext.count``)."""

    instance: str
    dead: bool
    admission_open: bool
    prepared: bool
    running: int
    parked: int
    unclaimed: int
    on_wire: int
    streams: int
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


@final
@attrs.define(eq=False, slots=True, repr=False)
class HostViews:
    """The views of one host instance over its parts (read only). ``is_dead`` and
    ``user_counts`` are the host's liveness and the environment's own counters."""

    name: str
    participants: tuple[tuple[str, str], ...]
    roles: Roles
    table: EpisodeTable
    slots: SlotTable
    parking: Parking
    streams: ReplyStreams
    count: HostCounts
    user_counts: Mapping[str, int]
    is_dead: Callable[[], bool]

    def __repr__(self) -> str:
        return f"<HostViews {self.name}>"

    def _alive(self, op: str) -> None:
        if self.is_dead():
            raise GymInstanceDead(self.name, op)

    def topology(self) -> InstanceTopology:
        self._alive("topology")
        return InstanceTopology(self.name, self.participants)

    def session_states(self, participant: str) -> dict[str, SessionView]:
        """Every slot's live session of ``participant`` by session key, sorted: those of
        running, parked and unclaimed episodes, and retained ones of ended episodes."""
        if participant not in {name for name, _ in self.participants}:
            raise KeyError(f"no participant {participant!r} on instance {self.name}")
        out: dict[str, SessionView] = {}
        for key, (rid, attempt) in self.slots.owners():
            ep = self.table.get(rid)
            sessions = ep.sessions if ep is not None else self.slots.kept_states(key)
            if participant in sessions:
                out[key] = SessionView(key, rid, attempt, sessions[participant])
        return out

    def retained_sessions(self) -> dict[str, dict[str, RetainedSession]]:
        """Every retained participant's sessions, by participant name, then by slot key
        (sorted): of the episodes running, parked or unclaimed here and of the slots whose
        episode ended and which were kept. Plain data (the participant's ``export``); an export
        that raises is a ``ValueError`` naming the participant and the slot."""
        self._alive("retained_sessions")
        out: dict[str, dict[str, RetainedSession]] = {}
        for p in self.roles.retained:
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

    def inventory(self) -> InstanceInventory:
        self._alive("inventory")
        active = self.table.active
        prepared = self.parking.prepared
        parked = {r for r, ep in active.items() if ep.state == BOUNDARY} if prepared else set()
        return InstanceInventory(
            instance=self.name,
            admission_open=self.parking.admission_open,
            prepared=prepared,
            running=tuple(sorted(set(active) - parked)),
            parked=tuple(sorted(parked)),
            unclaimed=tuple(sorted(self.table.unclaimed)),
            on_wire=tuple(sorted(self.streams.on_wire)),
            lease_reopened=self.count.lease_reopened,
        )

    def statistics(self) -> HostStatistics:
        parking = self.parking
        active = len(self.table.active)
        # running episodes that do not move are parked (only while prepared)
        parked = active - parking.moving if parking.prepared else 0
        return HostStatistics(
            instance=self.name,
            dead=self.is_dead(),
            admission_open=parking.admission_open,
            prepared=parking.prepared,
            running=active - parked,
            parked=parked,
            unclaimed=len(self.table.unclaimed),
            on_wire=len(self.streams.on_wire),
            streams=len(self.streams.streams),
            batches=self.streams.batches,
            discarded_replies=self.streams.discarded,
            counters=dict(self.user_counts),
            **attrs.asdict(self.count),
        )
