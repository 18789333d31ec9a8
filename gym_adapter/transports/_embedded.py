"""EmbeddedGym: a Gym deployment in-process, as a ``GymBackend``.

``EmbeddedGym.host`` serves environments on Gym hosts (``GymHost``), one per instance,
and knows no environment in particular. K instances named ``gym-0`` … ``gym-{K-1}`` share one
task-group lifetime (the context) and one ``FaultPlan``, so ``@N`` in a fault spec counts calls
across the deployment. Every call is delegated to its instance; the adapter adds only what a
remote backend adds too:

- fault injection (C3) before the call reaches the instance (``hang``, ``delay``, ``error``,
  ``unpicklable``, ``dead``; ``refuse`` and ``drop`` shape a ``run``);
- dead instances: after a ``dead`` fault every call to that instance raises
  ``GymInstanceDead`` without reaching it (and without being counted by the plan);
- replacement (``replace``, the ``ReplaceableGym`` contract): a new instance of the same name,
  seed and config takes the dead one's place, opened with ``recover=True``: it replays the
  dead one's journal of retained sessions (``work_dir/<instance>/``), so state that outlives
  an episode (the calendar's sessions and events) survives the death. Every
  instance is served as a task of the deployment's task group, so a replacement lives exactly as
  long as the deployment, like the instances it started with;
- the trainer's term (``attach``, the ``TrainerAware`` contract): once attached, every call
  carries it, so an instance refuses the calls of a fenced term (``host/_tenancy``);
- the picklability rule (S6): every error raised by Gym passes through
  ``runtime.crossing_boundary``, which replaces one that cannot be pickled by
  ``GymCheckpointUnavailable`` naming the instance and operation.

Environment code may call trio, anyio or asyncio: the hosts serve in the trainer's trio run and
await user code through ``host/_user_calls`` (its asyncio on the trainer's trio-asyncio loop when it
has one, ``gymckpt.aio``, else on one trio-asyncio loop per trio run), as a Ray actor's host
does in its own trio run.

Deadlines (``deadline_ts``, on ``anyio.current_time()``) are enforced by the instance once the
call runs; a ``delay`` fault happens before that, so a delay past the deadline surfaces as Gym's
``GymCallTimeout`` naming the instance, while a ``hang`` is left to the caller's own bound (S5).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, final

import anyio
import anyio.abc
import anyio.lowlevel

from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    GymInstanceDead,
    InstanceRecord,
    TrainerTerm,
)
from gymckpt.runtime.lowlevel import crossing_boundary

from .._contract import (
    AttachReply,
    CommitReply,
    GymBackend,
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
from .._faults import FaultPlan, FaultSpec, inject_fault
from ..host._host import GymHost, HostConfig, SessionView
from ..host._load import EnvironmentSource, load_environment
from ..host._views import RetainedSession
from ._admission import RunShape
from ._deployment import Deployment, Replacement, instance_names, per_instance
from ._statistics import GymStatistics

__all__ = ["EmbeddedGym"]

T = TypeVar("T")


@final
class EmbeddedGym(Deployment):
    """The embedded Gym deployment. Build it with ``EmbeddedGym.host(...)``."""

    def __init__(
        self,
        sims: Sequence[GymHost],
        plan: FaultPlan,
        make: Callable[[str], GymHost] | None = None,
        tg: anyio.abc.TaskGroup | None = None,
    ) -> None:
        self._sims = {sim.name: sim for sim in sims}
        self._names = tuple(sim.name for sim in sims)
        self._plan = plan
        self._make = make
        self._tg = tg
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._replacements: list[Replacement] = []
        self._replaced_hosts: list[GymHost] = []
        self._trainer: TrainerTerm | None = None

    @classmethod
    @asynccontextmanager
    async def host(
        cls,
        environment: EnvironmentSource | Sequence[EnvironmentSource],
        instances: int = 1,
        seed: int = 0,
        work_dir: str | Path | None = None,
        config: HostConfig | None = None,
        faults: Sequence[str | FaultSpec] = (),
    ) -> AsyncIterator[EmbeddedGym]:
        """Serve ``environment`` (an ``Environment``, its import path ``package.module:name``,
        an ``EnvironmentRef`` or a factory; or a list or tuple of them, one per instance) on
        ``instances`` Gym hosts until the context exits. Each environment is checked first:
        ``EnvironmentSpecError`` names what cannot be hosted. A replacement (``replace``) hosts
        the same environment and continues its retained sessions from their journal in
        ``work_dir``."""
        names = instance_names(instances)
        envs = {
            name: load_environment(source)
            for name, source in zip(names, per_instance(environment, instances), strict=True)
        }
        for env in envs.values():
            env.check()
        plan = FaultPlan(faults)
        cfg = config if config is not None else HostConfig()
        wd = Path(work_dir) if work_dir is not None else None

        def make(name: str, *, recover: bool = True) -> GymHost:
            return GymHost(name, envs[name], seed, wd, cfg, recover=recover)

        hosts = [make(name, recover=False) for name in names]
        async with cls.serve_hosts(hosts, plan, make) as gym:
            yield gym

    @classmethod
    @asynccontextmanager
    async def serve_hosts(
        cls, sims: Sequence[GymHost], plan: FaultPlan, make: Callable[[str], GymHost]
    ) -> AsyncIterator[EmbeddedGym]:
        """Serve Gym hosts the caller built (``sims``, one per instance, in instance order)
        until the context exits, behind ``plan``'s faults; ``make(name)`` builds a
        replacement for ``replace`` (it must recover from the instance's journal). This is
        ``host`` without the environment loading: for a caller that builds its hosts itself
        (the simulation builds each with its own scenario)."""
        async with anyio.create_task_group() as tg:
            gym = cls(sims, plan, make, tg)
            try:
                for sim in sims:
                    await gym._start(sim)
                yield gym
            finally:
                tg.cancel_scope.cancel()

    async def _start(self, sim: GymHost) -> None:
        """Serve ``sim`` as a task of the deployment, in a cancel scope of its own."""
        assert self._tg is not None
        scope = self._scopes[sim.name] = anyio.CancelScope()

        async def serve(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with scope:
                await sim.serve(task_status=task_status)

        await self._tg.start(serve)

    async def replace(self, instance: str, deadline_ts: float) -> None:
        """Replace ``instance`` by a new one of the same name, seed and config (killing it
        first if it still lives); ``GymCallTimeout`` past ``deadline_ts``. The new instance
        holds no episodes, streams or unclaimed episodes; it continues the dead one's retained
        sessions from their journal (each retirable by its attempt), and serves the dead one's
        trainer (this deployment's when the dead one had none) before anyone reaches it
        (adopted, fencing nothing): another run cannot take the replacement over while this one
        holds the rest, and a newer term that replaces it before attaching there fences, at
        its attach, what the journal brought back of the older one."""
        old = self.sim(instance)
        if self._make is None or self._tg is None:
            raise GymInstanceDead(instance, "replace")
        with anyio.move_on_at(deadline_ts) as scope:
            t0 = anyio.current_time()
            old.kill()
            old_scope = self._scopes.get(instance)
            if old_scope is not None:
                old_scope.cancel()  # the old instance leaves its context (its tasks end)
            t1 = anyio.current_time()
            new = self._make(instance)
            await self._start(new)
            # it serves whom the dead one served, from the start: our run when it held it; an
            # older term when a newer one replaces it before attaching there, so that attach
            # fences the old term's sessions the journal brought back. A finished (released)
            # run's is served by nobody: whoever attaches next fences what it left.
            holder = old.trainer if old.trainer is not None else self._trainer
            if old.released:
                holder = None
            if holder is not None:
                new.check_trainer(holder, "replace")
            self._sims[instance] = new
            self._replaced_hosts.append(old)
            self._replacements.append(Replacement(instance, t1 - t0, anyio.current_time() - t1))
            return
        assert scope.cancelled_caught
        raise GymCallTimeout(
            f"instance {instance} replace: not serving before the deadline", instance, "replace"
        )

    # -- plumbing ----------------------------------------------------------------------------

    def sim(self, instance: str) -> Any:
        """The instance itself (tests and the demo only; bypasses faults)."""
        try:
            return self._sims[instance]
        except KeyError:
            raise ValueError(
                f"unknown instance {instance!r} (instances: {', '.join(self._names)})"
            ) from None

    def _live(self, instance: str, op: str) -> Any:
        sim = self.sim(instance)
        if sim.dead:
            raise GymInstanceDead(instance, op)
        return sim

    async def _inject(self, sim: GymHost, spec: FaultSpec, op: str) -> None:
        await inject_fault(spec, sim.name, op, sim.kill)

    async def _call(self, instance: str, op: str, call: Callable[[Any], Awaitable[T]]) -> T:
        sim = self._live(instance, op)
        spec = self._plan.check(op)
        with crossing_boundary(instance, op):
            if spec is not None:
                await self._inject(sim, spec, op)
            return await call(sim)

    # -- GymBackend ----------------------------------------------------------------------------

    async def topology(self) -> Topology:
        await anyio.lowlevel.checkpoint()
        return Topology(tuple(self._live(n, "topology").topology() for n in self._names))

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
        """Submit ``rows``; a ``refuse`` fault refuses them all (``admission_closed``), a ``drop``
        fault ends the stream after ``len(rows) // 2`` replies."""
        sim = self._live(instance, "run")
        shape = RunShape.of(self._plan.check("run"), rows)
        with crossing_boundary(instance, "run"):
            if shape.inject is not None:
                await self._inject(sim, shape.inject, "run")
            return await sim.run(
                rows,
                refuse_all=shape.refuse_all,
                drop_after=shape.drop_after,
                trainer=self._trainer,
            )

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        return await self._call(
            instance,
            "prepare",
            lambda sim: sim.prepare(
                checkpoint_id, deadline_ts, mode, alignment_timeout_s, trainer=self._trainer
            ),
        )

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        return await self._call(
            instance,
            "commit",
            lambda sim: sim.commit(checkpoint_id, state_root, deadline_ts, trainer=self._trainer),
        )

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None:
        await self._call(
            instance,
            "resume",
            lambda sim: sim.resume(checkpoint_id, deadline_ts, trainer=self._trainer),
        )

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        ids = tuple(rollout_ids)
        return await self._call(
            instance, "retire", lambda sim: sim.retire(ids, deadline_ts, trainer=self._trainer)
        )

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        eps = tuple(episodes)
        return await self._call(
            instance,
            "restore",
            lambda sim: sim.restore(state_root, record, eps, deadline_ts, trainer=self._trainer),
        )

    async def retire_restored(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        ids = tuple(rollout_ids)
        return await self._call(
            instance,
            "retire_restored",
            lambda sim: sim.retire_restored(ids, deadline_ts, trainer=self._trainer),
        )

    async def attach(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> AttachReply:
        """``trainer`` takes ``instance`` over (``GymHost.attach``); every later call of this
        deployment carries it. A refused attach (``GymInUse``) leaves the term the calls carry
        as it was."""
        sim = self._live(instance, "attach")
        with crossing_boundary(instance, "attach"):
            reply = await sim.attach(trainer, deadline_ts)
        self._trainer = trainer  # only once the instance took it: a refusal changes nothing
        return reply

    async def release(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> None:
        """``trainer``'s run is done with ``instance`` (``GymHost.release``)."""
        sim = self._live(instance, "release")
        with crossing_boundary(instance, "release"):
            await sim.release(trainer, deadline_ts)

    async def inventory(self, instance: str) -> InstanceInventory:
        await anyio.lowlevel.checkpoint()
        return self._live(instance, "inventory").inventory()

    # -- Deployment and extras (tests, demo) ------------------------------------------------

    async def session_states(self, instance: str, participant: str) -> dict[str, SessionView]:
        """``GymHost.session_states(participant)`` of ``instance``."""
        await anyio.lowlevel.checkpoint()
        return self._live(instance, "session_states").session_states(participant)

    async def retained_sessions(self, instance: str) -> dict[str, dict[str, RetainedSession]]:
        """``GymHost.retained_sessions()`` of ``instance``: every retained participant's
        session per slot, as plain data (what a snapshot of it now would record)."""
        await anyio.lowlevel.checkpoint()
        return self._live(instance, "retained_sessions").retained_sessions()

    async def statistics(self) -> GymStatistics:
        """Per-instance counts (dead instances included) and the faults that fired."""
        await anyio.lowlevel.checkpoint()
        return GymStatistics(
            instances=tuple(self._sims[n].statistics() for n in self._names),
            faults_fired=self._plan.fired,
            replaced=tuple(old.statistics() for old in self._replaced_hosts),
        )

    def __repr__(self) -> str:
        dead = sum(1 for s in self._sims.values() if s.dead)
        return f"<EmbeddedGym instances={len(self._names)} dead={dead} faults={self._plan!r}>"


if TYPE_CHECKING:  # mypy checks that EmbeddedGym implements the contract

    def _is_a_backend(gym: EmbeddedGym) -> GymBackend:
        return gym

    def _is_trainer_aware(gym: EmbeddedGym) -> TrainerAware:
        return gym

    def _can_replace(gym: EmbeddedGym) -> ReplaceableGym:
        return gym
