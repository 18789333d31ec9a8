"""RayGym: the Gym deployment on a Ray cluster, reached from trio through trio-asyncio.

Why it looks like this
----------------------
Each instance is a Ray **async actor** (``_ray_actor.GymActor``) hosting the same ``GymHost``
the embedded Gym runs, under trio as embedded: in a trio run the actor hosts on its asyncio loop
(trio's guest mode), so a user's environment may call trio, anyio or asyncio on both
deployments (``_user_calls``). The control plane is actor
methods; the data plane is one Ray streaming generator per ``run``. The trainer is trio. This
module is the only place that touches trio-asyncio, and the only place the trio side touches Ray.

**trio → asyncio → Ray.** ``RayGym.open`` opens one trio-asyncio loop for the deployment's
lifetime. Submitting a call (``actor.method.remote(...)``) is a plain synchronous call; *waiting*
for it always happens in an asyncio task on that loop (``_Bridge``), never from trio directly: an
``ObjectRef`` awaited outside an asyncio loop has no loop to wrap its future in, and one awaited
on some other loop resolves there. The task returns an ``outcome`` (errors of the Ray task are
values), so the only thing that can interrupt the wait is the trio side.

**Cancellation is real.** The runtime bounds every control call by its deadline plus reply grace
in its own trio cancel scope (``nurseries._calls.bounded_call``, S5). When that scope fires,
``trio_asyncio.run_aio_future`` cancels the asyncio task and waits until it has *finished* — so
no asyncio task or future is left pending — and then ``_Bridge.resolve`` calls ``ray.cancel`` on
the Ray task before the ``Cancelled`` propagates: Ray drops it if it has not started (queued
behind a stuck loop, or never scheduled because its actor cannot be placed) and cancels its
coroutine at its next ``await`` if it has. ``BridgeStatistics`` and ``RayGym.calls`` let tests
prove that nothing was left behind, on either side.

**Deadlines** are absolute on the caller's trio clock. The driver sends the time left and the
wall-clock time of sending; the actor re-anchors on its own clock, counting time spent in Ray
(queues, a stuck loop) as spent (``_ray_actor.local_deadline``).

**Acknowledgement (data plane).** The generator's first object is an admission header, so
``run`` returns only once the rows were admitted or refused (as in-process; a checkpoint must
never overtake a submission the ledger counts, S1). Then each object is one batch of ready
replies (several timer-flushed batches of the instance coalesce into one object, because Ray
charges about 0.4 ms per streamed object). Replies stay "on the wire" in every commit reply from
the moment Gym produced them, while they travel in Ray, and until the consumer asks for the next
batch: ``RayReplyStream.__anext__`` then acknowledges the batch it returned last time. It
records the acknowledgement in the deployment, which hands every recorded acknowledgement of an
instance to that instance's next control or view call, and the actor applies them before
anything else; every ``ACK_INTERVAL_S`` a stream also sends its latest one on its own (an
``ack`` call, not awaited), so the actor frees what was delivered; no batch costs a round trip.
By the time a ``commit`` or ``inventory`` runs, every batch the consumer asked past is off the
wire, whatever order Ray delivered the calls in. An acknowledgement is never early (it is only
sent once the consumer asked for more) and may be late (the wire list is then a superset: the
drain waits for a reply the ledger already holds, harmless). ``aclose`` acknowledges what was
received, and Gym discards what was not.

**Errors crossing Ray** (S6): a dead actor (``ActorDiedError``) marks the instance dead and
raises ``GymInstanceDead`` (its streams end early; later calls fail without reaching Ray), an
unavailable actor, a cancelled task or any other Ray failure raises
``runtime.GymCheckpointUnavailable``; a Gym error crosses as itself (``GymControlError``,
``GymCallTimeout``, ``TopologyMismatch``…) when it pickles, else as ``GymCheckpointUnavailable``
(the actor replaces it before it crosses; if Ray itself cannot serialise an error, the same
replacement happens here). Every replacement is raised ``from None``: a Ray exception in the
cause chain would make the runtime classify a retryable failure as an invariant.

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

import asyncio
import functools
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import attrs
import outcome
import ray
import trio
import trio_asyncio
from ray.exceptions import (
    ActorUnavailableError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    TaskCancelledError,
)

from gymckpt.runtime import (
    EpisodeRecord,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    GymInstanceDead,
    InstanceRecord,
    crossable_error,
    unpicklable_error,
)

from ._contract import (
    CommitReply,
    GymBackend,
    InstanceInventory,
    PrepareReply,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
)
from ._embedded import GymStatistics
from ._faults import FaultPlan, FaultSpec
from ._host import HostConfig, HostStatistics, SessionView
from ._host_views import RetainedSession
from ._load import load_environment
from ._ray_actor import HEADER_SEQ, ActorCallStatistics, GymActor
from .calendar_env import AGENT_KINDS, CALENDAR, CalendarSession, SimConfig, calendar_sessions

__all__ = [
    "NO_SUCH_RESOURCE",
    "BridgeStatistics",
    "RayGym",
    "RayReplyStream",
    "Replacement",
    "local_cluster_options",
]

T = TypeVar("T")
logger = logging.getLogger("gymckpt")

NO_SUCH_RESOURCE: Final = "gymckpt_unplaceable"
"""A custom resource no node offers: an actor asking for it is never placed."""
CLOSE_TIMEOUT_S: Final = 2.0
"""How long ``aclose`` waits for the actor (it runs shielded in the dispatcher: keep it bounded)."""
STOP_TIMEOUT_S: Final = 5.0
"""How long closing the deployment waits for each instance to stop before killing its actor."""
GCS_PROBE_INTERVAL_S: Final = 1.0
"""How often a deployment checks that the cluster's GCS still accepts connections."""
GCS_PROBE_TIMEOUT_S: Final = 2.0
"""How long one such check waits for the connection."""
CLUSTER_LOSS_S: Final = 10.0
"""Default ``cluster_loss_s``: a GCS silent this long is the cluster lost (Ray's client itself
ends the process after 60 s by default)."""
SHUTDOWN_TIMEOUT_S: Final = 5.0
"""How long leaving a lost cluster may take (``ray.shutdown``)."""
REPLACE_POLL_S: Final = 0.05
"""How often ``replace`` asks again whether Ray has ended the old actor."""
VIEW_TIMEOUT_S: Final = 30.0
"""Bound on the calls that carry no deadline (topology, inventory, statistics…): past it they
raise ``GymCallTimeout`` naming the instance instead of waiting for ever on an actor Ray never
schedules."""
ACK_INTERVAL_S: Final = 0.05
"""A stream sends its latest acknowledgement on its own at most this often (they also travel
with every control and view call): it frees the actor's copies of delivered replies."""
BACKPRESSURE_OBJECTS: Final = 2
"""Streamed objects a generator may run ahead of its consumer; the rest coalesce in Gym (with
one object per reply there is nothing to coalesce: no backpressure then)."""
_END: Final = object()

_Result = outcome.Value[Any] | outcome.Error
"""A Ray result on the trio side: a value, or the error the Ray call raised."""


def local_cluster_options() -> dict[str, Any]:
    """``ray.init`` arguments of the local cluster started when no address is given: always a
    new cluster of our own (``address="local"``: never one that happens to run on this machine,
    which ``ray.init()`` would join and then refuse these options, nor one a ``ray start`` or a
    test cluster recorded in Ray's temp directory and that is gone — Ray's client then spends
    60 s failing to reach its GCS and ends the process), no dashboard, a small object store,
    worker output kept out of the driver's."""
    return {
        "address": "local",
        "include_dashboard": False,
        "object_store_memory": 100 * 2**20,
        "log_to_driver": False,
    }


# -- the cluster connection -----------------------------------------------------------------


@attrs.define(eq=False)
class _ClusterUse:
    """This process's use of Ray: connected by us (and disconnected by the last user)?"""

    users: int = 0
    ours: bool = False
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def connect(self, address: str | None) -> bool:
        with self.lock:
            if ray.is_initialized():
                return False
            if address is None:
                ray.init(**local_cluster_options())
                return True
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as exc:
                raise GymConnectionLost(
                    f"cannot join the Ray cluster at {address}: {_first_line(exc)}", address
                ) from None
            return True


_CLUSTER = _ClusterUse()


async def _acquire_cluster(address: str | None) -> None:
    _CLUSTER.users += 1
    try:
        if address is not None and not ray.is_initialized():
            await _check_reachable(address)
        if await trio.to_thread.run_sync(_CLUSTER.connect, address):
            _CLUSTER.ours = True
    except BaseException:
        _CLUSTER.users -= 1
        raise


async def _release_cluster(lost: bool) -> None:
    _CLUSTER.users -= 1
    if _CLUSTER.users == 0 and _CLUSTER.ours:
        _CLUSTER.ours = False
        # with the cluster gone, Ray's shutdown may wait on it: never longer than this
        with trio.move_on_after(SHUTDOWN_TIMEOUT_S if lost else math.inf):
            await trio.to_thread.run_sync(ray.shutdown, abandon_on_cancel=True)


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` GCS address; None for anything else (``auto``, a
    ``ray://`` client address), which is left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def _gcs_answers(host: str, port: int, timeout_s: float) -> bool:
    """Does the GCS at ``host:port`` accept a connection within ``timeout_s``?"""
    with trio.move_on_after(timeout_s):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


async def _check_reachable(address: str) -> None:
    """Before ``ray.init(address=...)``: a GCS that does not answer makes Ray's client retry for
    60 s and then end the process (exit 1, no word of ours); say so at once instead."""
    where = _host_port(address)
    if where is None:
        return
    if not await _gcs_answers(*where, GCS_PROBE_TIMEOUT_S * 2):
        raise GymConnectionLost(
            f"cannot reach the Ray cluster: nothing answers at {address} (its GCS); start it "
            "(ray start --head) or give the address of a running cluster",
            address,
        )


@contextmanager
def _as_if_no_nursery() -> Iterator[None]:
    """The watch's nursery wraps whatever leaves it in an exception group: an error of the
    ``async with RayGym.open()`` body (or the watch's own) comes out as it went in."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@attrs.define(eq=False)
class _GcsWatch:
    """The trainer's connection to the cluster, watched: ``run`` raises ``GymConnectionLost``
    once the GCS has not accepted a connection for ``loss_s`` (probed every
    ``GCS_PROBE_INTERVAL_S``).

    Why: a Ray client that cannot reach its GCS gives up after
    ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default) by ending the process — exit 1,
    no exception, nothing of ours. Until then every actor call fails as *unavailable*, which
    would read as Gym failing. ``loss_s`` must be well below Ray's limit: the run has to
    stop (its last snapshot intact) before Ray ends the process."""

    address: str
    loss_s: float
    lost: bool = False

    async def run(self) -> None:
        where = _host_port(self.address)
        if where is None:
            return
        last_ok = trio.current_time()
        while True:
            if await _gcs_answers(*where, GCS_PROBE_TIMEOUT_S):
                last_ok = trio.current_time()
            elif (silent := trio.current_time() - last_ok) >= self.loss_s:
                self.lost = True
                lost = GymConnectionLost(
                    f"lost the Ray cluster: its GCS at {self.address} has not answered for "
                    f"{silent:.0f}s; the last snapshot is intact: restart once the cluster is "
                    "back to resume from it",
                    self.address,
                )
                logger.error("the run stops: %s", lost)
                raise lost
            await trio.sleep(GCS_PROBE_INTERVAL_S)


# -- the bridge ------------------------------------------------------------------------------


@attrs.frozen
class BridgeStatistics:
    """The trio↔asyncio↔Ray bridge of one deployment."""

    waits: int
    """Ray results waited for (control calls, views, stream objects)."""
    cancelled: int
    """Ray calls cancelled with ``ray.cancel`` because the trio side gave up on them."""
    calls_pending: int
    """asyncio tasks waiting for a call's result (0 whenever no call is in progress)."""
    asyncio_pending: int
    """asyncio tasks not done on the deployment's loop: the calls, plus one per stream whose
    consumer is waiting for its next batch (0 whenever nobody waits)."""


async def _outcome_of(ref: Any) -> _Result:
    try:
        return outcome.Value(await ref)
    except Exception as exc:
        return outcome.Error(exc)


async def _advance(stream: RayReplyStream) -> _Result:
    """The stream's next object (value or error, ``_END`` at the end). Interrupted anywhere, it
    loses nothing: a ref taken from the generator is kept on the stream for the next call.

    An object already there is taken without a round trip through the event loop (``Ray``'s
    awaitables each hop from a Ray thread to the loop); otherwise it is awaited."""
    gen = stream._gen
    if stream._ref is None:
        try:
            if gen.next_ready():
                stream._ref = next(gen)
            else:
                stream._ref = await gen.__anext__()
        except (StopIteration, StopAsyncIteration):
            return outcome.Value(_END)
        except Exception as exc:
            return outcome.Error(exc)
    ref: Any = stream._ref
    try:
        # ready *here* (no fetch from another node on the loop's thread), or awaited
        ready, _ = ray.wait([ref], timeout=0, fetch_local=True)
        result: _Result = outcome.Value(ray.get(ref) if ready else await ref)
    except Exception as exc:
        result = outcome.Error(exc)
    stream._ref = None
    return result


@final
class _Bridge:
    """trio → asyncio → Ray: every wait on Ray is an asyncio task on the deployment's
    trio-asyncio loop, awaited from trio with ``trio_asyncio.run_aio_future``."""

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self._calls: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.waits = 0
        self.cancelled = 0
        self.cancelled_refs: deque[Any] = deque(maxlen=64)

    async def _run(self, coro: Coroutine[Any, Any, T], *, call: bool = False) -> T:
        task: asyncio.Task[T] = self._loop.create_task(coro)
        self._tasks.add(task)
        if call:
            self._calls.add(task)
        self.waits += 1
        # On trio cancellation this cancels the task and returns only once it has finished.
        result: T = await trio_asyncio.run_aio_future(task)
        return result

    async def resolve(self, ref: Any) -> _Result:
        """``ref``'s result. If the wait is interrupted (trio cancellation), the Ray call is
        cancelled before the interruption propagates."""
        try:
            return await self._run(_outcome_of(ref), call=True)
        except BaseException:
            self.cancel(ref)
            raise

    async def advance(self, stream: RayReplyStream) -> _Result:
        """The next object of ``stream`` (an interrupted wait leaves the stream usable)."""
        return await self._run(_advance(stream))

    def cancel(self, ref: Any) -> None:
        self.cancelled += 1
        self.cancelled_refs.append(ref)
        with suppress(Exception):  # finished meanwhile, or its actor is gone: nothing to cancel
            ray.cancel(ref)

    def statistics(self) -> BridgeStatistics:
        calls = sum(1 for t in self._calls if not t.done())
        pending = {t for t in self._tasks if not t.done()}
        pending |= asyncio.all_tasks(self._loop)
        return BridgeStatistics(self.waits, self.cancelled, calls, len(pending))


# -- the reply stream ------------------------------------------------------------------------


def _stream_ends(exc: BaseException) -> bool:
    """Ray failures that end a stream early (its rows are missing) rather than raise: the actor
    is gone or unreachable, the generator was cancelled, or a batch was lost with its node."""
    return isinstance(exc, (RayActorError, TaskCancelledError, NodeDiedError, ObjectLostError))


def _actor_gone(exc: BaseException) -> bool:
    """Ray says the actor is gone for good: it died (its process, or its node), or its node
    did. (``ActorUnavailableError`` is not: Ray may reach the actor again.)"""
    if isinstance(exc, ActorUnavailableError):
        return False
    return isinstance(exc, (RayActorError, NodeDiedError))


@final
class RayReplyStream:
    """The consumer's side of one ``run`` on Ray (``ReplyStream``).

    ``__anext__`` acknowledges the batch it returned last time, then returns the next batch;
    the stream ends when the instance has replied to every row, or early (drop fault,
    unreachable actor, cancelled generator, a batch lost with its node); it raises
    ``GymInstanceDead`` if its actor died (its process or its node). ``aclose`` is idempotent:
    it acknowledges what was received, has Gym discard the rest and end the stream (its rows
    keep running), and cancels the Ray generator; it waits at most ``CLOSE_TIMEOUT_S`` for the
    actor.
    """

    __slots__ = (
        "_ack_sent_at",
        "_ack_sent_seq",
        "_acked",
        "_actor",
        "_closed",
        "_delivered",
        "_ended",
        "_gen",
        "_generation",
        "_gym",
        "_instance",
        "_natural_end",
        "_ref",
        "_sid",
    )

    def __init__(
        self, gym: RayGym, instance: str, actor: Any, generation: int, sid: int, gen: Any
    ) -> None:
        self._gym = gym
        self._instance = instance
        self._actor = actor
        self._generation = generation  # the incarnation of the instance this stream runs on
        self._sid = sid
        self._gen = gen
        self._delivered = HEADER_SEQ  # seq of the last batch handed to the consumer
        self._acked = HEADER_SEQ
        self._ack_sent_at = time.monotonic()
        self._ack_sent_seq = HEADER_SEQ
        self._ref: Any = None  # taken from the generator, its value not read yet
        self._ended = False
        self._natural_end = False
        self._closed = False

    async def _admitted(self) -> None:
        """Wait for the admission header (errors of the ``run`` itself surface here)."""
        try:
            item = await self._gym._bridge.advance(self)
        except BaseException:
            self._ended = self._closed = True
            self._gym._cancel_quietly(self._gen)
            raise
        if isinstance(item, outcome.Error):
            self._ended = self._closed = True
            raise self._gym._translate(
                self._instance, "run", item.error, self._generation
            ) from None
        if item.value is _END or item.value[0] != HEADER_SEQ:
            self._ended = self._closed = True
            raise GymCheckpointUnavailable(
                f"instance {self._instance} run: the stream ended before admission",
                self._instance,
                "run",
            )

    def __aiter__(self) -> RayReplyStream:
        return self

    def _send_ack(self) -> None:
        if self._gym._serving(self._instance, self._generation):
            self._actor.ack.remote(self._sid, self._acked)  # not awaited
        self._ack_sent_at = time.monotonic()
        self._ack_sent_seq = self._acked

    async def __anext__(self) -> Sequence[RunReply]:
        if self._ended:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        if self._delivered > self._acked:
            self._gym._ack(self._instance, self._sid, self._delivered)
            self._acked = self._delivered
            if time.monotonic() - self._ack_sent_at >= ACK_INTERVAL_S:
                self._send_ack()
        item = await self._gym._bridge.advance(self)
        if isinstance(item, outcome.Error):
            self._ended = True
            self._gym._ack_done(self._instance, self._sid)
            exc = item.error
            if _actor_gone(exc):  # the runtime tells a death from an early end by this
                self._gym._mark_dead(self._instance, self._generation)
                raise GymInstanceDead(self._instance, "run") from None
            if _stream_ends(exc):
                raise StopAsyncIteration
            raise self._gym._translate(self._instance, "run", exc, self._generation) from None
        if item.value is _END:
            self._ended = self._natural_end = True
            self._gym._ack_done(self._instance, self._sid)
            if self._acked > self._ack_sent_seq:
                self._send_ack()  # the last one, so the actor lets go of the stream
            raise StopAsyncIteration
        seq, replies = item.value
        self._delivered = seq
        return replies

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = self._ended = True
        gym = self._gym
        gym._ack_done(self._instance, self._sid)
        if self._natural_end or not gym._serving(self._instance, self._generation):
            await trio.lowlevel.checkpoint()  # its actor is gone (dead, or replaced)
            return
        ref = self._actor.close_stream.remote(self._sid, self._delivered)
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                closed = await gym._bridge.resolve(ref)
                if isinstance(closed, outcome.Value):
                    gym._acks[self._instance].pop(self._sid, None)
        finally:
            gym._cancel_quietly(self._gen)  # a generator held by backpressure lets go too

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "open"
        return (
            f"<RayReplyStream of {self._instance} #{self._sid} {state} "
            f"delivered={self._delivered} acked={self._acked}>"
        )


# -- the deployment --------------------------------------------------------------------------


@attrs.frozen
class _Spawn:
    """What an instance's actor is built from (kept to build a replacement)."""

    name: str
    agent_kind: str
    seed: int
    work_dir: str
    config: SimConfig | HostConfig
    stuck_loop_s: float
    environment: str | None = None


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
    """The Gym deployment on Ray. Build it with ``RayGym.open(...)``.

    Each instance name has one live incarnation at a time: ``replace`` ends the dead one's
    actor and starts a new one under the same name (its *generation* goes up). Every call and
    stream remembers the generation it went to, so a late failure of the old incarnation never
    marks the new one dead, and nothing is sent to an actor that was replaced.
    """

    def __init__(
        self,
        bridge: _Bridge,
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
        self._dead: set[str] = set()
        self._generation: dict[str, int] = dict.fromkeys(actors, 0)
        self._replacements: list[Replacement] = []
        self._sids = itertools.count(1)
        self._batch_replies = batch_replies
        self._max_batch_replies = max_batch_replies
        self._last_stats: dict[str, HostStatistics] = {}
        # acknowledgements recorded per instance (sid -> seq), handed to its next call
        self._acks: dict[str, dict[int, int]] = {name: {} for name in actors}
        self._acks_ended: dict[str, set[int]] = {name: set() for name in actors}

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        instances: int = 1,
        agent_kinds: str | Sequence[str] = "simple_agent",
        seed: int = 0,
        work_dir: str | Path | None = None,
        config: SimConfig | None = None,
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
        """Serve ``instances`` simulated instances as Ray actors until the context exits.

        The arguments up to ``faults`` are ``EmbeddedGym.open``'s. ``address``: None starts a
        local cluster and stops it on exit; ``"auto"`` or an address joins that cluster and
        leaves it running; either way, a process already connected to Ray keeps its connection
        (and ``address`` is not used). ``num_cpus`` is each actor's CPU request (no GPU). A
        ``hang`` fault first blocks the actor's event loop for ``stuck_loop_s`` (0: a plain
        hang). ``batch_replies=False`` streams one object per reply (for comparison); a batch
        carries up to about ``max_batch_replies`` replies. ``work_dir`` (default: the current
        directory) is resolved here, since actors run elsewhere. Raises ``TimeoutError`` if an
        actor is not placed and started within ``startup_timeout_s``. The cluster's GCS is
        watched: ``GymConnectionLost`` if nothing answers at ``address``, or (raised out of
        the context, the body cancelled) once the GCS has not answered for
        ``cluster_loss_s``.
        """
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances!r}")
        kinds = (agent_kinds,) * instances if isinstance(agent_kinds, str) else tuple(agent_kinds)
        if len(kinds) != instances:
            raise ValueError(f"got {len(kinds)} agent kinds for {instances} instances")
        for kind in kinds:
            if kind not in AGENT_KINDS:
                raise ValueError(
                    f"agent kind must be one of {', '.join(AGENT_KINDS)}, got {kind!r}"
                )
        if not stuck_loop_s >= 0:
            raise ValueError(f"stuck_loop_s must be >= 0, got {stuck_loop_s!r}")
        cfg = config if config is not None else SimConfig()
        wd = _absolute(work_dir)
        spawns = {
            f"gym-{i}": _Spawn(f"gym-{i}", kinds[i], seed, wd, cfg, stuck_loop_s)
            for i in range(instances)
        }
        async with cls._deploy(
            spawns, faults, address, num_cpus=num_cpus, batch_replies=batch_replies,
            max_batch_replies=max_batch_replies, startup_timeout_s=startup_timeout_s,
            cluster_loss_s=cluster_loss_s,
        ) as gym:
            yield gym

    @classmethod
    @asynccontextmanager
    async def host(
        cls,
        environment: str,
        instances: int = 1,
        seed: int = 0,
        work_dir: str | Path | None = None,
        config: HostConfig | None = None,
        faults: Sequence[str | FaultSpec] = (),
        address: str | None = None,
        *,
        num_cpus: float = 0.1,
        batch_replies: bool = True,
        max_batch_replies: int = 1024,
        startup_timeout_s: float = 60.0,
        cluster_loss_s: float = CLUSTER_LOSS_S,
    ) -> AsyncIterator[RayGym]:
        """Serve the user environment ``environment`` — an import path
        (``package.module:name``, an ``Environment`` or a factory of one) or ``gymnasium:ID``
        — on ``instances`` Gym hosts, one Ray actor each, with the semantics of
        ``EmbeddedGym.host``. Each actor imports the path itself (user code is never pickled);
        it is loaded and checked here first, so a bad environment fails before any actor
        starts. Other arguments as ``open``."""
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances!r}")
        if not isinstance(environment, str):
            raise TypeError("RayGym.host takes the environment's import path, not an object")
        load_environment(environment).check()
        cfg = config if config is not None else HostConfig()
        wd = _absolute(work_dir)
        spawns = {
            f"gym-{i}": _Spawn(f"gym-{i}", "", seed, wd, cfg, 0.0, environment)
            for i in range(instances)
        }
        async with cls._deploy(
            spawns, faults, address, num_cpus=num_cpus, batch_replies=batch_replies,
            max_batch_replies=max_batch_replies, startup_timeout_s=startup_timeout_s,
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
        await _acquire_cluster(address)
        watch = _GcsWatch(ray.get_runtime_context().gcs_address, cluster_loss_s)
        try:
            with _as_if_no_nursery():
                async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
                    nursery.start_soon(watch.run)
                    bridge = _Bridge(loop)
                    actors: dict[str, Any] = {}
                    try:
                        for name, spawn in spawns.items():
                            actors[name] = _spawn(spawn, num_cpus=num_cpus)
                        placement = await _start_all(bridge, actors, startup_timeout_s)
                        yield cls(bridge, actors, spawns, placement, plan,
                                  batch_replies=batch_replies, max_batch_replies=max_batch_replies,
                                  num_cpus=num_cpus)
                        nursery.cancel_scope.cancel()  # the watch
                    finally:
                        if not watch.lost:  # else nothing answers: leave the actors to Ray
                            with trio.CancelScope(shield=True):
                                await _stop_all(bridge, actors)
        finally:
            with trio.CancelScope(shield=True):
                await _release_cluster(watch.lost)

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
        if instance in self._dead:
            raise GymInstanceDead(instance, op)
        return actor, self._generation[instance]

    def _serving(self, instance: str, generation: int) -> bool:
        """Is incarnation ``generation`` of ``instance`` the live one?"""
        return self._generation[instance] == generation and instance not in self._dead

    def _mark_dead(self, instance: str, generation: int) -> None:
        """Incarnation ``generation`` of ``instance`` is gone (a replaced one changes nothing)."""
        if self._generation[instance] == generation:
            self._dead.add(instance)

    def _cancel_quietly(self, ref: Any) -> None:
        with suppress(Exception):
            ray.cancel(ref)

    def _translate(
        self, instance: str, op: str, exc: BaseException, generation: int | None = None
    ) -> BaseException:
        """The error the runtime sees for ``exc`` raised by Ray for ``op`` on incarnation
        ``generation`` (default: the live one) of ``instance``. An actor or node that is gone
        marks the instance dead (``GymInstanceDead``): Ray will not bring it back (actors never
        restart by themselves here); ``replace`` does."""
        if _actor_gone(exc):
            self._mark_dead(
                instance, self._generation[instance] if generation is None else generation
            )
            return GymInstanceDead(instance, op)
        if isinstance(exc, ActorUnavailableError):
            return GymCheckpointUnavailable(
                f"instance {instance} {op}: actor unavailable ({_first_line(exc)})", instance, op
            )
        if isinstance(exc, TaskCancelledError):
            return GymCheckpointUnavailable(
                f"instance {instance} {op}: the Ray call was cancelled", instance, op
            )
        if isinstance(exc, RayTaskError):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception) and not isinstance(cause, RayError):
                return crossable_error(cause, instance, op)
            detail = _first_line(cause if cause is not None else exc)
            return unpicklable_error(detail, instance, op)
        if isinstance(exc, RayError):
            return GymCheckpointUnavailable(
                f"instance {instance} {op}: {type(exc).__name__}: {_first_line(exc)}",
                instance,
                op,
            )
        return exc

    def _ack(self, instance: str, sid: int, seq: int) -> None:
        """Stream ``sid`` asked past batch ``seq``: the instance's next call says so."""
        self._acks[instance][sid] = seq

    def _ack_done(self, instance: str, sid: int) -> None:
        """Stream ``sid`` will acknowledge nothing more: forget it once a call carried it."""
        self._acks_ended[instance].add(sid)

    def _carried(self, instance: str, acks: dict[int, int]) -> None:
        """A call that carried ``acks`` succeeded: the ended streams among them are settled."""
        pending, ended = self._acks[instance], self._acks_ended[instance]
        for sid in ended & acks.keys():
            if pending.get(sid) == acks[sid]:
                del pending[sid]
                ended.discard(sid)
        ended &= pending.keys()

    async def _wait(self, instance: str, op: str, ref: Any, generation: int) -> Any:
        result = await self._bridge.resolve(ref)
        if isinstance(result, outcome.Error):
            raise self._translate(instance, op, result.error, generation) from None
        return result.value

    async def _control(
        self, instance: str, op: str, args: tuple[Any, ...], deadline_ts: float
    ) -> Any:
        actor, generation = self._live(instance, op)
        spec = self._plan.check(op)
        acks = dict(self._acks[instance])
        remaining = deadline_ts - trio.current_time()
        ref = actor.control.remote(op, args, remaining, time.time(), spec, acks)
        reply = await self._wait(instance, op, ref, generation)
        if self._serving(instance, generation):
            self._carried(instance, acks)
        return reply

    async def _view(self, instance: str, what: str, *args: Any) -> Any:
        actor, generation = self._live(instance, what)
        acks = dict(self._acks[instance])
        with trio.move_on_after(VIEW_TIMEOUT_S):
            reply = await self._wait(
                instance, what, actor.view.remote(what, acks, *args), generation
            )
            if self._serving(instance, generation):
                self._carried(instance, acks)
            return reply
        raise GymCallTimeout(
            f"instance {instance} did not answer {what} within {VIEW_TIMEOUT_S:g}s", instance, what
        )

    # -- GymBackend ----------------------------------------------------------------------------

    async def topology(self) -> Topology:
        """Every instance's topology, asked of all actors at once (each within
        ``VIEW_TIMEOUT_S``): one busy actor no longer delays the question to the others."""
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
        spec = self._plan.check("run")
        refuse = spec is not None and spec.kind == "refuse"
        drop = len(rows) // 2 if spec is not None and spec.kind == "drop" else None
        inject = spec if spec is not None and not (refuse or drop is not None) else None
        sid = next(self._sids)
        backpressure = BACKPRESSURE_OBJECTS if self._batch_replies else -1
        gen = actor.run.options(
            num_returns="streaming", _generator_backpressure_num_objects=backpressure
        ).remote(sid, tuple(rows), refuse, drop, inject, not self._batch_replies,
                 self._max_batch_replies)
        stream = RayReplyStream(self, instance, actor, generation, sid, gen)
        await stream._admitted()
        return stream

    async def prepare(self, instance: str, checkpoint_id: str, deadline_ts: float) -> PrepareReply:
        reply: PrepareReply = await self._control(
            instance, "prepare", (checkpoint_id,), deadline_ts
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
        self._dead.add(instance)
        self._generation[instance] += 1
        generation = self._generation[instance]
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
            self._acks[instance].clear()
            self._acks_ended[instance].clear()
            self._dead.discard(instance)
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
            if isinstance(result, outcome.Error) and _actor_gone(result.error):
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
                if _actor_gone(exc):
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
            instance, "retained_sessions")
        return views

    async def calendar_state(self, instance: str) -> dict[str, CalendarSession]:
        """The calendar workplace's live sessions of ``instance`` (for sentinel checks)."""
        return calendar_sessions(await self.session_states(instance, CALENDAR))

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
            f"<RayGym instances={len(self._names)} dead={len(self._dead)} "
            f"faults={self._plan!r}>"
        )


# -- helpers ---------------------------------------------------------------------------------


def _absolute(work_dir: str | Path | None) -> str:
    return os.path.abspath(work_dir if work_dir is not None else os.curdir)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
    return _actor_class().options(**options).remote(
        spawn.name, spawn.agent_kind, spawn.seed, spawn.work_dir, spawn.config,
        spawn.stuck_loop_s, spawn.environment, recover,
    )


async def _start_all(bridge: _Bridge, actors: dict[str, Any], timeout_s: float) -> dict[str, str]:
    placement: dict[str, str] = {}
    errors: list[str] = []

    async def start(name: str, actor: Any) -> None:
        with trio.move_on_after(timeout_s):
            result = await bridge.resolve(actor.start.remote())
            if isinstance(result, outcome.Error):
                errors.append(f"{name}: {type(result.error).__name__}: "
                              f"{_first_line(result.error)}")
            else:
                placement[name] = result.value
            return
        errors.append(f"{name}: not placed and started within {timeout_s:g}s "
                      f"(cluster resources: {ray.available_resources()})")

    async with trio.open_nursery() as nursery:
        for name, actor in actors.items():
            nursery.start_soon(start, name, actor)
    if errors:
        raise TimeoutError("could not start the Ray Gym deployment: " + "; ".join(errors))
    return placement


async def _stop_all(bridge: _Bridge, actors: dict[str, Any]) -> None:
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
