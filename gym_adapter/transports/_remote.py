"""``RemoteGym``: the contract's verbs written once for every deployment across a process.

A remote transport (Ray, HTTP) is one primitive under this class, as httpx's transports are
one method under its client: ``_call(instance, op, args, deadline_ts, fault)`` sends control
call or view ``op`` with its named ``args`` to the live incarnation of ``instance`` and returns
its decoded reply. The names of ``args`` are the contract's (``checkpoint_id``,
``state_root``, ``rollout_ids``, ``record``, ``episodes``, ``trainer``, ``mode``,
``alignment_timeout_s``, ``participant``): the HTTP wire sends them as they are, the Ray actor
receives them pickled; ``_verbs.call_host`` runs them on the instance's ``GymHost``.

Written here, for every remote transport alike:

- a call to a dead instance raises ``GymInstanceDead`` before anything else, and is not counted
  by the ``FaultPlan``; a control call (one with a deadline) then draws its fault from the plan,
  which the primitive carries to the instance; a view (no deadline: topology, inventory,
  statistics, retained sessions) draws none;
- the trainer's term: ``attach`` records it before the call (every later call to every
  instance carries it, the primitive's business), so the takeover itself carries the new term;
- ``topology`` asks every instance at once (one busy instance does not delay the others),
  after checking that none is dead;
- ``statistics`` reports a dead instance by the counts last seen (``dead_statistics``).

What a transport writes itself is what is truly its own: the primitive (how a call crosses,
how its failure is classified, how it is bounded), ``run`` (its reply stream), ``replace``
(process supervision, placement) and how it opens and closes.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymInstanceDead,
    InstanceRecord,
    TrainerTerm,
)

from .._contract import (
    AttachReply,
    CommitReply,
    InstanceInventory,
    PrepareReply,
    ReplaceableGym,
    ReplyStream,
    RestoreReply,
    RetireReply,
    RunRow,
    Topology,
    TrainerAware,
)
from .._faults import FaultPlan, FaultSpec
from ..host._host import HostStatistics
from ..host._views import RetainedSession
from ._acks import AckBook
from ._deployment import Deployment, Replacement
from ._incarnations import Incarnations
from ._statistics import GymStatistics, dead_statistics

__all__ = ["RemoteGym"]


class RemoteGym(Deployment):
    """A Gym deployment whose instances live in other processes (see the module docstring).

    Each instance name has one live incarnation at a time (``Incarnations``): a call or a
    stream remembers the incarnation it went to, so a late failure of an old incarnation marks
    the new one nothing, and nothing is sent to an incarnation known to be gone. A subclass
    calls ``_open_instances`` once it knows its instance names."""

    def __init__(self, plan: FaultPlan, names: Sequence[str] = ()) -> None:
        self._plan = plan
        self._trainer: TrainerTerm | None = None
        """The trainer term every call carries once it attached (``attach``)."""
        self._replacements: list[Replacement] = []
        self._last_stats: dict[str, HostStatistics] = {}
        self._open_instances(names)

    def _open_instances(self, names: Sequence[str]) -> None:
        """Serve ``names`` (in topology order), each in its first incarnation."""
        self._names = tuple(names)
        self._incarnations = Incarnations.of(self._names)
        self._acks = AckBook.of(self._names)
        """Acknowledgements recorded per instance, handed to its next call."""

    # -- the primitive ---------------------------------------------------------------------------

    @abstractmethod
    async def _call(
        self,
        instance: str,
        op: str,
        args: Mapping[str, Any],
        deadline_ts: float | None,
        fault: FaultSpec | None = None,
    ) -> Any:
        """Send ``op`` with ``args`` to the live incarnation of ``instance`` and return its
        reply. ``deadline_ts`` (caller's clock): a control call's deadline, sent as the time
        left; None for a view, which the transport bounds itself. ``fault``: the fault the
        plan drew for this call, executed by the instance. Carries the instance's recorded
        acknowledgements and the trainer's term. Raises ``GymInstanceDead`` for a dead
        instance (marking the incarnation it went to dead when the failure shows it gone) and
        another ``GymUnavailable`` for a failure the runtime may retry."""

    async def _control(
        self, instance: str, op: str, args: Mapping[str, Any], deadline_ts: float
    ) -> Any:
        self._incarnations.live(instance, op)  # a dead instance counts no call
        return await self._call(instance, op, args, deadline_ts, self._plan.check(op))

    async def _view(self, instance: str, op: str, args: Mapping[str, Any] | None = None) -> Any:
        return await self._call(instance, op, args or {}, None)

    # -- what a transport writes itself ----------------------------------------------------------

    @abstractmethod
    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream: ...

    @abstractmethod
    async def replace(self, instance: str, deadline_ts: float) -> None: ...

    # -- GymBackend ------------------------------------------------------------------------------

    async def topology(self) -> Topology:
        """Every instance's topology, asked of all instances at once (each within the
        transport's bound on views), so one busy instance does not delay the others."""
        for name in self._names:
            self._incarnations.live(name, "topology")
        got: dict[str, Any] = {}

        async def one(name: str) -> None:
            got[name] = await self._view(name, "topology")

        async with trio.open_nursery() as nursery:
            for name in self._names:
                nursery.start_soon(one, name)
        return Topology(tuple(got[n] for n in self._names))

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        args: dict[str, Any] = {"checkpoint_id": checkpoint_id, "mode": mode}
        if alignment_timeout_s is not None:
            args["alignment_timeout_s"] = float(alignment_timeout_s)
        reply: PrepareReply = await self._control(instance, "prepare", args, deadline_ts)
        return reply

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        args = {"checkpoint_id": checkpoint_id, "state_root": str(state_root)}
        reply: CommitReply = await self._control(instance, "commit", args, deadline_ts)
        return reply

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None:
        await self._control(instance, "resume", {"checkpoint_id": checkpoint_id}, deadline_ts)

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        args = {"rollout_ids": tuple(rollout_ids)}
        reply: RetireReply = await self._control(instance, "retire", args, deadline_ts)
        return reply

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        args = {"state_root": str(state_root), "record": record, "episodes": tuple(episodes)}
        reply: RestoreReply = await self._control(instance, "restore", args, deadline_ts)
        return reply

    async def retire_restored(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        args = {"rollout_ids": tuple(rollout_ids)}
        reply: RetireReply = await self._control(instance, "retire_restored", args, deadline_ts)
        return reply

    async def attach(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> AttachReply:
        """``trainer`` takes ``instance`` over (``GymHost.attach`` on the instance); every
        later call to every instance carries it. ``GymInUse`` if the instance serves another
        run."""
        self._trainer = trainer
        reply: AttachReply = await self._control(
            instance, "attach", {"trainer": trainer}, deadline_ts
        )
        return reply

    async def release(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> None:
        """``trainer``'s run is done with ``instance`` (``GymHost.release`` on the instance)."""
        await self._control(instance, "release", {"trainer": trainer}, deadline_ts)

    async def inventory(self, instance: str) -> InstanceInventory:
        inv: InstanceInventory = await self._view(instance, "inventory")
        return inv

    # -- Deployment ------------------------------------------------------------------------------

    async def retained_sessions(self, instance: str) -> dict[str, dict[str, RetainedSession]]:
        """``GymHost.retained_sessions()`` of ``instance``: every retained participant's
        session per slot, as plain data (exported by the instance, so any state crosses)."""
        views: dict[str, dict[str, RetainedSession]] = await self._view(
            instance, "retained_sessions"
        )
        return views

    async def statistics(self) -> GymStatistics:
        """Per-instance counts and the faults that fired. A dead instance reports the counts
        last seen (zeros if none) with ``dead`` set: its process is gone."""
        stats = []
        for name in self._names:
            try:
                st: HostStatistics = await self._view(name, "statistics")
                self._last_stats[name] = st
            except GymInstanceDead:
                st = dead_statistics(name, self._last_stats.get(name))
            stats.append(st)
        return GymStatistics(instances=tuple(stats), faults_fired=self._plan.fired)

    def _log_replacement(self, record: Replacement) -> None:
        """``record``'s replacement serves: log it (``replacements``)."""
        self._replacements.append(record)


if TYPE_CHECKING:  # mypy checks that a remote deployment implements the contract

    def _can_replace(gym: RemoteGym) -> ReplaceableGym:
        return gym

    def _is_trainer_aware(gym: RemoteGym) -> TrainerAware:
        return gym
