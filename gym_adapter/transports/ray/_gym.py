"""RayGym: the Gym deployment on a Ray cluster, one transport of the Gym contract.

Each instance is a Ray **async actor** (``_ray_actor.GymActor``) hosting the same ``GymHost``
the embedded Gym runs, under trio as embedded: in a trio run the actor hosts on its asyncio loop
(trio's guest mode), so a user's environment may call trio, anyio or asyncio on both
deployments (``_user_calls``). The control plane is actor methods; the data plane is one Ray
streaming generator per ``run``. The trainer is trio.

What crossing a process means is written once, beside the backends, and Ray uses it:
acknowledgement on the next call (``_transport_acks``), the admission header
(``_transport_admission``), generations (``_transport_generations``), deadlines sent as the time
left and re-anchored on the actor's clock (``_transport_deadlines``), error translation
(``_transport_errors``), and the JSON wire form of every record and error (``_wire``; Ray itself
passes Python objects). Ray's own parts are each a module: the cluster connection
(``_ray_cluster``), the trio→asyncio→Ray bridge (``_ray_bridge``), Ray's errors classified
(``_ray_errors``), the reply stream (``_ray_stream``), the actor (``_ray_actor``) and this
deployment.

**Errors crossing Ray** (S6): a dead actor marks the instance dead and raises
``GymInstanceDead`` (its streams end early; later calls fail without reaching Ray); every other
Ray failure is retryable (``_ray_errors``). Every replacement is raised ``from None``.

**Faults** (C3): one ``FaultPlan`` in the driver counts calls across the deployment, exactly as
the embedded Gym does; the actor executes the fault for real (see ``_ray_actor``).

**Placement**: instances spread over the cluster's nodes (``SPREAD``), ask for no GPU and
``num_cpus`` (0.1 by default) so a 2-core machine runs several. A process already connected to
Ray keeps its connection; otherwise ``address=None`` starts a local cluster (no dashboard, small
object store) for the deployment's lifetime, and ``address="auto"`` or an address joins a
cluster and leaves it running. State directories (``work_dir``, commit ``state_root``) are
paths the actors open themselves: on a multi-node cluster they must be on shared storage.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import outcome
import ray
import trio
import trio_asyncio

from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymCallTimeout,
    GymInstanceDead,
    InstanceRecord,
    TrainerTerm,
)

from ..._contract import (
    AttachReply,
    CommitReply,
    GymBackend,
    InstanceInventory,
    PrepareReply,
    RestoreReply,
    RetireReply,
    RunRow,
    Topology,
)
from ..._faults import FaultPlan, FaultSpec
from ...host._host import HostConfig, HostStatistics, SessionView
from ...host._load import EnvironmentRef, load_environment
from ...host._views import RetainedSession
from .._acks import AckBook
from .._admission import RunShape
from .._deadlines import WireDeadline
from .._deployment import instance_names, per_instance
from .._errors import first_line
from .._generations import Generations
from .._statistics import GymStatistics
from ._actor import ActorCallStatistics, GymActor
from ._bridge import Bridge, BridgeStatistics
from ._cluster import (
    CLUSTER_LOSS_S,
    GcsWatch,
    acquire_cluster,
    as_if_no_nursery,
    local_cluster_options,
    release_cluster,
)
from ._errors import actor_gone, translate
from ._stream import RayReplyStream, StreamLink

__all__ = [
    "NO_SUCH_RESOURCE",
    "BridgeStatistics",
    "RayGym",
    "RayReplyStream",
    "Replacement",
    "local_cluster_options",
]

NO_SUCH_RESOURCE: Final = "gymckpt_unplaceable"
"""A custom resource no node offers: an actor asking for it is never placed."""
STOP_TIMEOUT_S: Final = 5.0
"""How long closing the deployment waits for each instance to stop before killing its actor."""
REPLACE_POLL_S: Final = 0.05
"""How often ``replace`` asks again whether Ray has ended the old actor."""
VIEW_TIMEOUT_S: Final = 30.0
"""Bound on the calls that carry no deadline (topology, inventory, statistics…): past it they
raise ``GymCallTimeout`` naming the instance instead of waiting for ever on an actor Ray never
schedules."""
BACKPRESSURE_OBJECTS: Final = 2
"""Streamed objects a generator may run ahead of its consumer; the rest coalesce in Gym (with
one object per reply there is nothing to coalesce: no backpressure then)."""


@attrs.frozen
class _Spawn:
    """What an instance's actor is built from (kept to build a replacement)."""

    name: str
    environment: str | EnvironmentRef
    seed: int
    work_dir: str
    config: HostConfig
    stuck_loop_s: float


@attrs.frozen
class Replacement:
    """One replacement of a dead instance by ``RayGym.replace``."""

    instance: str
    old_node: str
    """The Ray node ID the dead actor was placed on."""
    new_node: str
    """The Ray node ID the replacement was placed on."""
    fence_s: float
    """Killing the old actor until Ray confirmed it gone (nothing of it can act any more)."""
    start_s: float
    """Creating the replacement until it serves (placed, constructed, its state replayed)."""

    @property
    def total_s(self) -> float:
        return self.fence_s + self.start_s


@final
class RayGym:
    """The Gym deployment on Ray. Build it with ``RayGym.host(...)``.

    Each instance name has one live incarnation at a time: ``replace`` ends the dead one's
    actor and starts a new one under the same name (its *generation* goes up,
    ``Generations``). Every call and stream remembers the generation it went to, so a late
    failure of the old incarnation never marks the new one dead, and nothing is sent to an
    actor that was replaced.
    """

    def __init__(
        self,
        bridge: Bridge,
        actors: dict[str, Any],
        spawns: dict[str, _Spawn],
        placement: dict[str, str],
        plan: FaultPlan,
        *,
        batch_replies: bool,
        max_batch_replies: int,
        num_cpus: float = 0.1,
    ) -> None:
        self._bridge = bridge
        self._actors = actors
        self._spawns = spawns
        self._placement = placement
        self._names = tuple(actors)
        self._plan = plan
        self._num_cpus = num_cpus
        self._generations = Generations.of(self._names)
        self._replacements: list[Replacement] = []
        self._sids = itertools.count(1)
        self._batch_replies = batch_replies
        self._max_batch_replies = max_batch_replies
        self._last_stats: dict[str, HostStatistics] = {}
        self._acks = AckBook.of(self._names)
        """Acknowledgements recorded per instance, handed to its next call."""
        self._trainer: TrainerTerm | None = None
        """The trainer term every call carries once it attached (``attach``)."""

    @classmethod
    @asynccontextmanager
    async def host(
        cls,
        environment: str | EnvironmentRef | Sequence[str | EnvironmentRef],
        instances: int = 1,
        seed: int = 0,
        work_dir: str | Path | None = None,
        config: HostConfig | None = None,
        faults: Sequence[str | FaultSpec] = (),
        address: str | None = None,
        *,
        num_cpus: float = 0.1,
        stuck_loop_s: float = 0.0,
        batch_replies: bool = True,
        max_batch_replies: int = 1024,
        startup_timeout_s: float = 60.0,
        cluster_loss_s: float = CLUSTER_LOSS_S,
    ) -> AsyncIterator[RayGym]:
        """Serve ``environment`` — an import path (``package.module:name``, an ``Environment``
        or a factory of one), ``gymnasium:ID`` or an ``EnvironmentRef``; or a list or tuple of
        them, one per instance — on ``instances`` Gym hosts, one Ray actor each, with the
        semantics of ``EmbeddedGym.host``. Each actor builds its environment itself (user code
        is never pickled); each is loaded and checked here first, so a bad environment fails
        before any actor starts.

        ``address``: None starts a local cluster and stops it on exit; ``"auto"`` or an address
        joins that cluster and leaves it running; either way, a process already connected to
        Ray keeps its connection (and ``address`` is not used). ``num_cpus`` is each actor's CPU
        request (no GPU). A ``hang`` fault first blocks the actor's event loop for
        ``stuck_loop_s`` (0: a plain hang). ``batch_replies=False`` streams one object per reply
        (for comparison); a batch carries up to about ``max_batch_replies`` replies.
        ``work_dir`` (default: the current directory) is resolved here, since actors run
        elsewhere. Raises ``TimeoutError`` if an actor is not placed and started within
        ``startup_timeout_s``. The cluster's GCS is watched: ``GymConnectionLost`` if nothing
        answers at ``address``, or (raised out of the context, the body cancelled) once the GCS
        has not answered for ``cluster_loss_s``.
        """
        names = instance_names(instances)
        sources: tuple[str | EnvironmentRef, ...] = per_instance(environment, instances)
        for source in sources:
            if not isinstance(source, (str, EnvironmentRef)):
                raise TypeError(
                    "RayGym.host takes the environment's import path (or an EnvironmentRef), "
                    "not an object"
                )
        for source in dict.fromkeys(sources):
            load_environment(source).check()
        if not stuck_loop_s >= 0:
            raise ValueError(f"stuck_loop_s must be >= 0, got {stuck_loop_s!r}")
        cfg = config if config is not None else HostConfig()
        wd = _absolute(work_dir)
        spawns = {
            name: _Spawn(name, source, seed, wd, cfg, stuck_loop_s)
            for name, source in zip(names, sources, strict=True)
        }
        async with cls._deploy(
            spawns,
            faults,
            address,
            num_cpus=num_cpus,
            batch_replies=batch_replies,
            max_batch_replies=max_batch_replies,
            startup_timeout_s=startup_timeout_s,
            cluster_loss_s=cluster_loss_s,
        ) as gym:
            yield gym

    @classmethod
    @asynccontextmanager
    async def _deploy(
        cls,
        spawns: dict[str, _Spawn],
        faults: Sequence[str | FaultSpec],
        address: str | None,
        *,
        num_cpus: float,
        batch_replies: bool,
        max_batch_replies: int,
        startup_timeout_s: float,
        cluster_loss_s: float,
    ) -> AsyncIterator[RayGym]:
        if not num_cpus >= 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus!r}")
        if max_batch_replies < 1:
            raise ValueError(f"max_batch_replies must be >= 1, got {max_batch_replies!r}")
        plan = FaultPlan(faults)
        if not cluster_loss_s > 0:
            raise ValueError(f"cluster_loss_s must be > 0, got {cluster_loss_s!r}")
        await acquire_cluster(address)
        watch = GcsWatch(ray.get_runtime_context().gcs_address, cluster_loss_s)
        try:
            with as_if_no_nursery():
                async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
                    nursery.start_soon(watch.run)
                    bridge = Bridge(loop)
                    actors: dict[str, Any] = {}
                    try:
                        for name, spawn in spawns.items():
                            actors[name] = _spawn(spawn, num_cpus=num_cpus)
                        placement = await _start_all(bridge, actors, startup_timeout_s)
                        yield cls(
                            bridge,
                            actors,
                            spawns,
                            placement,
                            plan,
                            batch_replies=batch_replies,
                            max_batch_replies=max_batch_replies,
                            num_cpus=num_cpus,
                        )
                        nursery.cancel_scope.cancel()  # the watch
                    finally:
                        if not watch.lost:  # else nothing answers: leave the actors to Ray
                            with trio.CancelScope(shield=True):
                                await _stop_all(bridge, actors)
        finally:
            with trio.CancelScope(shield=True):
                await release_cluster(watch.lost)

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def instances(self) -> tuple[str, ...]:
        return self._names

    @property
    def faults(self) -> FaultPlan:
        return self._plan

    @property
    def placement(self) -> dict[str, str]:
        """The Ray node ID each instance's actor was placed on."""
        return dict(self._placement)

    def _actor(self, instance: str) -> Any:
        try:
            return self._actors[instance]
        except KeyError:
            raise ValueError(
                f"unknown instance {instance!r} (instances: {', '.join(self._names)})"
            ) from None

    @property
    def replacements(self) -> tuple[Replacement, ...]:
        """Every replacement so far, oldest first."""
        return tuple(self._replacements)

    def _live(self, instance: str, op: str) -> tuple[Any, int]:
        """``instance``'s actor and generation; ``GymInstanceDead`` if it is dead."""
        actor = self._actor(instance)
        return actor, self._generations.live(instance, op)

    def _translate(
        self, instance: str, op: str, exc: BaseException, generation: int | None = None
    ) -> BaseException:
        """The error the runtime sees for ``exc`` raised by Ray for ``op`` on incarnation
        ``generation`` (default: the live one) of ``instance`` (``_ray_errors.translate``)."""
        if generation is None:
            generation = self._generations.current(instance)
        return translate(self._generations, instance, op, exc, generation)

    async def _wait(self, instance: str, op: str, ref: Any, generation: int) -> Any:
        result = await self._bridge.resolve(ref)
        if isinstance(result, outcome.Error):
            raise self._translate(instance, op, result.error, generation) from None
        return result.value

    async def _control(
        self,
        instance: str,
        op: str,
        args: tuple[Any, ...],
        deadline_ts: float,
        options: dict[str, str] | None = None,
    ) -> Any:
        actor, generation = self._live(instance, op)
        spec = self._plan.check(op)
        acks = self._acks.outgoing(instance)
        deadline = WireDeadline.send(deadline_ts, trio.current_time(), time.time())
        options = dict(options or {})
        if self._trainer is not None:
            options["trainer"] = self._trainer.header()
        ref = actor.control.remote(op, args, deadline, spec, acks, options)
        reply = await self._wait(instance, op, ref, generation)
        if self._generations.serving(instance, generation):
            self._acks.carried(instance, acks)
        return reply

    async def _view(self, instance: str, what: str, *args: Any) -> Any:
        actor, generation = self._live(instance, what)
        acks = self._acks.outgoing(instance)
        with trio.move_on_after(VIEW_TIMEOUT_S):
            reply = await self._wait(
                instance, what, actor.view.remote(what, acks, *args), generation
            )
            if self._generations.serving(instance, generation):
                self._acks.carried(instance, acks)
            return reply
        raise GymCallTimeout(
            f"instance {instance} did not answer {what} within {VIEW_TIMEOUT_S:g}s", instance, what
        )

    # -- GymBackend ----------------------------------------------------------------------------

    async def topology(self) -> Topology:
        """Every instance's topology, asked of all actors at once (each within
        ``VIEW_TIMEOUT_S``), so one busy actor does not delay the question to the others."""
        for name in self._names:
            self._live(name, "topology")
        got: dict[str, Any] = {}

        async def one(name: str) -> None:
            got[name] = await self._view(name, "topology")

        async with trio.open_nursery() as nursery:
            for name in self._names:
                nursery.start_soon(one, name)
        return Topology(tuple(got[n] for n in self._names))

    async def run(self, instance: str, rows: Sequence[RunRow]) -> RayReplyStream:
        """Submit ``rows`` and wait for their admission; a ``refuse`` fault refuses them all
        (``admission_closed``), a ``drop`` fault ends the stream after ``len(rows) // 2``
        replies."""
        actor, generation = self._live(instance, "run")
        shape = RunShape.of(self._plan.check("run"), rows)
        sid = next(self._sids)
        backpressure = BACKPRESSURE_OBJECTS if self._batch_replies else -1
        gen = actor.run.options(
            num_returns="streaming", _generator_backpressure_num_objects=backpressure
        ).remote(
            sid,
            tuple(rows),
            shape,
            not self._batch_replies,
            self._max_batch_replies,
            None if self._trainer is None else self._trainer.header(),
        )
        link = StreamLink(instance, generation, self._bridge, self._acks, self._generations)
        stream = RayReplyStream(link, actor, sid, gen)
        await stream.admitted()
        return stream

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        options = {"mode": mode.value}
        if alignment_timeout_s is not None:
            options["alignment_timeout_s"] = repr(float(alignment_timeout_s))
        reply: PrepareReply = await self._control(
            instance, "prepare", (checkpoint_id,), deadline_ts, options
        )
        return reply

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        reply: CommitReply = await self._control(
            instance, "commit", (checkpoint_id, state_root), deadline_ts
        )
        return reply

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None:
        await self._control(instance, "resume", (checkpoint_id,), deadline_ts)

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        reply: RetireReply = await self._control(
            instance, "retire", (tuple(rollout_ids),), deadline_ts
        )
        return reply

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        reply: RestoreReply = await self._control(
            instance, "restore", (state_root, record, tuple(episodes)), deadline_ts
        )
        return reply

    async def retire_restored(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        reply: RetireReply = await self._control(
            instance, "retire_restored", (tuple(rollout_ids),), deadline_ts
        )
        return reply

    async def attach(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> AttachReply:
        """``trainer`` takes ``instance`` over (``GymHost.attach`` in the actor); every later
        call to every actor carries it."""
        self._trainer = trainer
        reply: AttachReply = await self._control(instance, "attach", (trainer,), deadline_ts)
        return reply

    async def release(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> None:
        """``trainer``'s run is done with ``instance`` (``GymHost.release`` in the actor)."""
        await self._control(instance, "release", (trainer,), deadline_ts)

    async def inventory(self, instance: str) -> InstanceInventory:
        inv: InstanceInventory = await self._view(instance, "inventory")
        return inv

    async def replace(self, instance: str, deadline_ts: float) -> None:
        """Bring up a fresh actor under ``instance``'s name, in place of its dead one.

        Fence first: the old actor is killed (``no_restart``) and Ray must confirm it gone
        before the new one opens the same ``work_dir`` (a partitioned actor that still ran
        could otherwise write the state the new one replays). Then a new actor is created with
        the same constructor arguments, placed ``SPREAD`` — Ray never places an actor on a
        dead node, so a lost node's instance lands on a live one — and started. It holds no
        episodes, streams or unclaimed episodes, and continues the dead one's retained sessions
        from their journal in ``work_dir`` (``GymHost(recover=True)``).

        From the first line on, the instance counts as dead (no call reaches either actor) and
        its generation is new (a late error of the old actor or its streams marks nothing).
        Raises ``GymCallTimeout`` if the old actor is not confirmed gone, or the new one does not
        serve, by ``deadline_ts``; ``GymInstanceDead`` if the new one dies while starting; the
        instance then stays dead and ``replace`` may be called again. Cancellation cancels the
        Ray calls and kills a replacement that did not start.
        """
        old = self._actor(instance)
        t0 = trio.current_time()
        generation = self._generations.begin_replacement(instance)
        self._cancel_quietly_kill(old)
        with trio.move_on_at(deadline_ts):
            await self._confirm_gone(old)
        if trio.current_time() >= deadline_ts:
            raise GymCallTimeout(
                f"instance {instance} replace: Ray did not confirm its old actor gone within "
                "the deadline; not replaced (it might still write its state)",
                instance,
                "replace",
            )
        t1 = trio.current_time()
        new = _spawn(self._spawns[instance], num_cpus=self._num_cpus, recover=True)
        installed = False
        try:
            node = await self._start_replacement(instance, new, generation, deadline_ts)
            self._actors[instance] = new
            self._placement[instance], old_node = node, self._placement.get(instance, "")
            self._acks.reset(instance)
            self._generations.installed(instance, generation)
            installed = True
        finally:
            if not installed:
                self._cancel_quietly_kill(new)
        t2 = trio.current_time()
        self._replacements.append(Replacement(instance, old_node, node, t1 - t0, t2 - t1))

    async def _confirm_gone(self, actor: Any) -> None:
        """Wait until a call to the killed ``actor`` fails the way a dead actor's calls do
        (the caller bounds the wait). A call it still answers, or one Ray cannot deliver for
        now (``ActorUnavailableError``: its node unreachable), is asked again shortly."""
        while True:
            result = await self._bridge.resolve(actor.calls.remote())
            if isinstance(result, outcome.Error) and actor_gone(result.error):
                return
            await trio.sleep(REPLACE_POLL_S)

    async def _start_replacement(
        self, instance: str, actor: Any, generation: int, deadline_ts: float
    ) -> str:
        """Start the replacement ``actor``; the Ray node ID it serves on."""
        with trio.move_on_at(deadline_ts):
            result = await self._bridge.resolve(actor.start.remote())
            if isinstance(result, outcome.Error):
                exc = result.error
                if actor_gone(exc):
                    raise GymInstanceDead(instance, "replace") from None
                raise self._translate(instance, "replace", exc, generation) from None
            node: str = result.value
            return node
        raise GymCallTimeout(
            f"instance {instance} replace: the new actor was not placed and serving within the "
            f"deadline (cluster resources: {ray.available_resources()})",
            instance,
            "replace",
        )

    # -- extras (tests, demo) ------------------------------------------------------------------

    async def session_states(self, instance: str, participant: str) -> dict[str, SessionView]:
        """``GymHost.session_states(participant)`` of ``instance``: every slot's live session
        of that participant (the states as the actor holds them, pickled across)."""
        views: dict[str, SessionView] = await self._view(instance, "session_states", participant)
        return views

    async def retained_sessions(self, instance: str) -> dict[str, dict[str, RetainedSession]]:
        """``GymHost.retained_sessions()`` of ``instance``: every retained participant's
        session per slot, as plain data (exported in the actor, so any state crosses)."""
        views: dict[str, dict[str, RetainedSession]] = await self._view(
            instance, "retained_sessions"
        )
        return views

    async def statistics(self) -> GymStatistics:
        """Per-instance counts and the faults that fired. A dead instance reports the counts
        last seen (zeros if none) with ``dead`` set: its actor is gone."""
        stats = []
        for name in self._names:
            try:
                st: HostStatistics = await self._view(name, "statistics")
                self._last_stats[name] = st
            except GymInstanceDead:
                st = _dead_statistics(name, self._last_stats.get(name))
            stats.append(st)
        return GymStatistics(instances=tuple(stats), faults_fired=self._plan.fired)

    async def calls(self, instance: str) -> ActorCallStatistics:
        """What ``instance``'s actor is running right now (proof that cancelled calls left
        nothing behind)."""
        actor, generation = self._live(instance, "calls")
        calls: ActorCallStatistics = await self._wait(
            instance, "calls", actor.calls.remote(), generation
        )
        return calls

    def bridge_statistics(self) -> BridgeStatistics:
        return self._bridge.statistics()

    @property
    def cancelled_refs(self) -> tuple[Any, ...]:
        """The Ray calls cancelled after the trio side gave up on them (latest 64)."""
        return tuple(self._bridge.cancelled_refs)

    @asynccontextmanager
    async def unschedulable(self, instance: str) -> AsyncIterator[None]:
        """Fault hook: inside, ``instance``'s calls go to an actor that asks for a resource no
        node has, so Ray never schedules them; they wait until the caller gives up and cancels
        them. Streams already open keep running on the real actor, which is back on exit. A
        ``run`` inside waits for its admission for ever: dispatch nothing there meanwhile."""
        real = self._actor(instance)
        ghost = _spawn(self._spawns[instance], num_cpus=0.0, resources={NO_SUCH_RESOURCE: 1.0})
        self._actors[instance] = ghost
        try:
            yield
        finally:
            self._actors[instance] = real
            self._cancel_quietly_kill(ghost)
            await trio.lowlevel.checkpoint()

    @staticmethod
    def _cancel_quietly_kill(actor: Any) -> None:
        with suppress(Exception):
            ray.kill(actor, no_restart=True)

    def __repr__(self) -> str:
        return (
            f"<RayGym instances={len(self._names)} dead={self._generations.dead_count} "
            f"faults={self._plan!r}>"
        )


# -- helpers ---------------------------------------------------------------------------------


def _absolute(work_dir: str | Path | None) -> str:
    return os.path.abspath(work_dir if work_dir is not None else os.curdir)


@functools.cache
def _actor_class() -> Any:
    return ray.remote(GymActor)


def _spawn(
    spawn: _Spawn,
    *,
    num_cpus: float,
    resources: dict[str, float] | None = None,
    recover: bool = False,
) -> Any:
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "num_gpus": 0,
        "scheduling_strategy": "SPREAD",
        "max_restarts": 0,
        "max_task_retries": 0,
    }
    if resources:
        options["resources"] = resources
    return (
        _actor_class()
        .options(**options)
        .remote(
            spawn.name,
            spawn.environment,
            spawn.seed,
            spawn.work_dir,
            spawn.config,
            spawn.stuck_loop_s,
            recover,
        )
    )


async def _start_all(bridge: Bridge, actors: dict[str, Any], timeout_s: float) -> dict[str, str]:
    placement: dict[str, str] = {}
    errors: list[str] = []

    async def start(name: str, actor: Any) -> None:
        with trio.move_on_after(timeout_s):
            result = await bridge.resolve(actor.start.remote())
            if isinstance(result, outcome.Error):
                errors.append(f"{name}: {type(result.error).__name__}: {first_line(result.error)}")
            else:
                placement[name] = result.value
            return
        errors.append(
            f"{name}: not placed and started within {timeout_s:g}s "
            f"(cluster resources: {ray.available_resources()})"
        )

    async with trio.open_nursery() as nursery:
        for name, actor in actors.items():
            nursery.start_soon(start, name, actor)
    if errors:
        raise TimeoutError("could not start the Ray Gym deployment: " + "; ".join(errors))
    return placement


async def _stop_all(bridge: Bridge, actors: dict[str, Any]) -> None:
    async def stop(actor: Any) -> None:
        with trio.move_on_after(STOP_TIMEOUT_S):
            await bridge.resolve(actor.stop.remote())
        RayGym._cancel_quietly_kill(actor)

    async with trio.open_nursery() as nursery:
        for actor in actors.values():
            nursery.start_soon(stop, actor)


def _dead_statistics(name: str, last: HostStatistics | None) -> HostStatistics:
    if last is not None:
        return attrs.evolve(last, dead=True, admission_open=False, prepared=False)
    zeros: dict[str, Any] = {f.name: 0 for f in attrs.fields(HostStatistics)}
    zeros["counters"] = {}
    zeros.update(instance=name, dead=True, admission_open=False, prepared=False)
    return HostStatistics(**zeros)


if TYPE_CHECKING:  # mypy checks that RayGym implements the contract

    def _is_a_backend(gym: RayGym) -> GymBackend:
        return gym
