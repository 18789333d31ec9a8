"""RayGym: the Gym deployment on a Ray cluster, one transport of the Gym contract.

Each instance is a Ray **async actor** (``_actor.GymActor``) hosting the same ``GymHost``
the embedded Gym runs, under trio as embedded: in a trio run the actor hosts on its asyncio loop
(trio's guest mode), so a user's environment may call trio, anyio or asyncio on both
deployments (``host/_user_calls``). The control plane is actor methods; the data plane is one Ray
streaming generator per ``run``. The trainer is trio.

What crossing a process means is written once, beside the backends, and Ray uses it: the
contract's verbs over one call primitive (``RemoteGym``, ``transports/_remote.py``; the actor
runs them with ``_verbs.call_host``), acknowledgement on the next call (``_acks``), the
admission header (``_admission``), incarnations (``_incarnations``), deadlines sent as the time
left and re-anchored on the actor's clock (``_deadlines``), error translation (``_errors``), and
the JSON wire form of every record and error (``_wire``; Ray itself passes Python objects).
Ray's own parts are each a module of ``transports/ray/``: the cluster connection
(``_cluster``), the trio→asyncio→Ray bridge (``_bridge``), Ray's errors classified
(``_errors``), the reply stream (``_stream``), a commit's reply packed in JSON chunks
(``_commit_wire``), the actor (``_actor``) and this deployment.

**Errors crossing Ray** (S6): a dead actor marks the instance dead and raises
``GymInstanceDead`` (its streams end early; later calls fail without reaching Ray); every other
Ray failure is retryable (``ray/_errors``). Every replacement is raised ``from None``.

**Faults** (C3): one ``FaultPlan`` in the driver counts calls across the deployment, exactly as
the embedded Gym does; the actor executes the fault for real (see ``ray/_actor``).

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
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import outcome
import ray
import trio
import trio_asyncio

from gymckpt.runtime import GymCallTimeout, GymInstanceDead

from ..._contract import CommitReply, ReplaceableGym, RunRow, TrainerAware
from ..._faults import FaultPlan, FaultSpec
from ...host._host import HostConfig, SessionView
from ...host._load import EnvironmentRef, load_environment
from .._admission import RunShape
from .._deadlines import WireDeadline
from .._deployment import Replacement, instance_names, per_instance
from .._errors import first_line
from .._niceness import INSTANCE_NICENESS, check_instance_niceness
from .._remote import RemoteGym
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
from ._commit_wire import PackedCommit, unpack_commit
from ._errors import actor_gone, translate
from ._stream import RayReplyStream, StreamLink

__all__ = [
    "NO_SUCH_RESOURCE",
    "BridgeStatistics",
    "RayGym",
    "RayReplyStream",
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


@final
class RayGym(RemoteGym):
    """The Gym deployment on Ray. Build it with ``RayGym.host(...)``.

    Each instance name has one live incarnation at a time: ``replace`` ends the dead one's
    actor and starts a new one under the same name (its *incarnation* goes up,
    ``Incarnations``). Every call and stream remembers the incarnation it went to, so a late
    failure of the old incarnation never marks the new one dead, and nothing is sent to an
    actor that was replaced. The contract's verbs are ``RemoteGym``'s; this class is the
    primitive (``_call``: an actor method through the bridge), the stream, the actors and
    ``replace``.
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
        super().__init__(plan, tuple(actors))
        self._bridge = bridge
        self._actors = actors
        self._spawns = spawns
        self._placement = placement
        self._num_cpus = num_cpus
        self._sids = itertools.count(1)
        self._batch_replies = batch_replies
        self._max_batch_replies = max_batch_replies

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
        instance_niceness: int = INSTANCE_NICENESS,
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
        has not answered for ``cluster_loss_s``. A local cluster started here runs its actors
        ``instance_niceness`` steps below this process (``transports/_niceness``: the trainer's
        loop first when both want a core); a cluster joined or already connected keeps its own.
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
            instance_niceness=instance_niceness,
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
        instance_niceness: int = INSTANCE_NICENESS,
    ) -> AsyncIterator[RayGym]:
        if not num_cpus >= 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus!r}")
        if max_batch_replies < 1:
            raise ValueError(f"max_batch_replies must be >= 1, got {max_batch_replies!r}")
        plan = FaultPlan(faults)
        if not cluster_loss_s > 0:
            raise ValueError(f"cluster_loss_s must be > 0, got {cluster_loss_s!r}")
        check_instance_niceness(instance_niceness)
        await acquire_cluster(address, instance_niceness)
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

    def _live(self, instance: str, op: str) -> tuple[Any, int]:
        """``instance``'s actor and incarnation; ``GymInstanceDead`` if it is dead."""
        actor = self._actor(instance)
        return actor, self._incarnations.live(instance, op)

    def _translate(
        self, instance: str, op: str, exc: BaseException, incarnation: int | None = None
    ) -> BaseException:
        """The error the runtime sees for ``exc`` raised by Ray for ``op`` on incarnation
        ``incarnation`` (default: the live one) of ``instance`` (``ray/_errors.translate``)."""
        if incarnation is None:
            incarnation = self._incarnations.current(instance)
        return translate(self._incarnations, instance, op, exc, incarnation)

    async def _wait(self, instance: str, op: str, ref: Any, incarnation: int) -> Any:
        result = await self._bridge.resolve(ref)
        if isinstance(result, outcome.Error):
            raise self._translate(instance, op, result.error, incarnation) from None
        return result.value

    async def _call(
        self,
        instance: str,
        op: str,
        args: Mapping[str, Any],
        deadline_ts: float | None,
        fault: FaultSpec | None = None,
    ) -> Any:
        """The primitive (``RemoteGym``): actor method ``control`` (with the deadline as the
        time left and the trainer's term) or, without a deadline, ``view``, bounded here by
        ``VIEW_TIMEOUT_S``; either carries the instance's recorded acknowledgements."""
        actor, incarnation = self._live(instance, op)
        acks = self._acks.outgoing(instance)
        if deadline_ts is None:
            with trio.move_on_after(VIEW_TIMEOUT_S):
                ref = actor.view.remote(op, acks, dict(args))
                reply = await self._wait(instance, op, ref, incarnation)
                if self._incarnations.serving(instance, incarnation):
                    self._acks.carried(instance, acks)
                return reply
            raise GymCallTimeout(
                f"instance {instance} did not answer {op} within {VIEW_TIMEOUT_S:g}s", instance, op
            )
        deadline = WireDeadline.send(deadline_ts, trio.current_time(), time.time())
        trainer = None if self._trainer is None else self._trainer.header()
        ref = actor.control.remote(op, dict(args), deadline, fault, acks, trainer)
        reply = await self._wait(instance, op, ref, incarnation)
        if self._incarnations.serving(instance, incarnation):
            self._acks.carried(instance, acks)
        return reply

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        """``RemoteGym.commit``, its reply unpacked from the chunks the actor packed it in
        (``_commit_wire``), one chunk per scheduler step of the trainer's loop."""
        args = {"checkpoint_id": checkpoint_id, "state_root": str(state_root)}
        packed: PackedCommit = await self._control(instance, "commit", args, deadline_ts)
        return await unpack_commit(packed)

    # -- the data plane ----------------------------------------------------------------------

    async def run(self, instance: str, rows: Sequence[RunRow]) -> RayReplyStream:
        """Submit ``rows`` and wait for their admission; a ``refuse`` fault refuses them all
        (``admission_closed``), a ``drop`` fault ends the stream after ``len(rows) // 2``
        replies."""
        actor, incarnation = self._live(instance, "run")
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
        link = StreamLink(instance, incarnation, self._bridge, self._acks, self._incarnations)
        stream = RayReplyStream(link, actor, sid, gen)
        await stream.admitted()
        return stream

    # -- replacement ------------------------------------------------------------------------

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
        its incarnation is new (a late error of the old actor or its streams marks nothing).
        Raises ``GymCallTimeout`` if the old actor is not confirmed gone, or the new one does not
        serve, by ``deadline_ts``; ``GymInstanceDead`` if the new one dies while starting; the
        instance then stays dead and ``replace`` may be called again. Cancellation cancels the
        Ray calls and kills a replacement that did not start.
        """
        old = self._actor(instance)
        t0 = trio.current_time()
        incarnation = self._incarnations.begin_replacement(instance)
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
            node = await self._start_replacement(instance, new, incarnation, deadline_ts)
            self._actors[instance] = new
            self._placement[instance], old_node = node, self._placement.get(instance, "")
            self._acks.reset(instance)
            self._incarnations.installed(instance, incarnation)
            installed = True
        finally:
            if not installed:
                self._cancel_quietly_kill(new)
        t2 = trio.current_time()
        self._log_replacement(Replacement(instance, t1 - t0, t2 - t1, old_node, node))

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
        self, instance: str, actor: Any, incarnation: int, deadline_ts: float
    ) -> str:
        """Start the replacement ``actor``; the Ray node ID it serves on."""
        with trio.move_on_at(deadline_ts):
            result = await self._bridge.resolve(actor.start.remote())
            if isinstance(result, outcome.Error):
                exc = result.error
                if actor_gone(exc):
                    raise GymInstanceDead(instance, "replace") from None
                raise self._translate(instance, "replace", exc, incarnation) from None
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
        views: dict[str, SessionView] = await self._view(
            instance, "session_states", {"participant": participant}
        )
        return views

    async def calls(self, instance: str) -> ActorCallStatistics:
        """What ``instance``'s actor is running right now (proof that cancelled calls left
        nothing behind)."""
        actor, incarnation = self._live(instance, "calls")
        calls: ActorCallStatistics = await self._wait(
            instance, "calls", actor.calls.remote(), incarnation
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
            f"<RayGym instances={len(self._names)} dead={self._incarnations.dead_count} "
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


if TYPE_CHECKING:  # mypy checks that RayGym implements the contract

    def _can_replace(gym: RayGym) -> ReplaceableGym:
        return gym

    def _is_trainer_aware(gym: RayGym) -> TrainerAware:
        return gym
