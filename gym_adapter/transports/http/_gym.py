"""HttpGym: the Gym deployment over HTTP, one ``gymckpt serve`` process per instance.

The client twin of ``RayGym``, on the same transport layer: the contract's verbs written once
over one call primitive (``RemoteGym``; here one ``POST /control/v1/<op>``, which the server
runs with ``_verbs.call_host``), acknowledgement on the next call (``_acks``), the admission
header (``_admission``), incarnations (``_incarnations``), deadlines sent as the time left
(``_deadlines``), errors by class (``_errors``), and every body through the strict wire
(``http/_wire`` over ``_wire``: nothing pickled, nothing trusted unchecked). The trainer is
trio; the HTTP client is httpx, which runs on trio through anyio.

Two ways to open it:

- ``async with HttpGym(urls, token=...) as gym``: servers someone else runs (on other
  machines, in containers). Each URL's ``GET /health`` names its instance and incarnation; a
  URL that does not answer raises ``GymConnectionLost``.
- ``async with HttpGym.spawn("pkg.module:env", instances=K, work_dir=...) as gym``: K local
  ``gymckpt serve`` processes on loopback ports, started and supervised here (``http/_spawn``,
  ``http/_process``), stopped on exit, never left behind (they die with the trainer's process).

HTTP's own parts are each a module, as Ray's are: the wire (``http/_wire``), one exchange and
the error an answer carries (``http/_calls``), the reply stream (``http/_stream``), the spawned
servers (``http/_spawn``, ``http/_process``) and this deployment.

**Connections.** ``httpx.AsyncClient``s with bounded pools: one for the control plane, so a
control call never waits behind streams for a connection (``max_control_connections``), one for
submissions (``max_streams``), and one for reply channels. A call that finds its pool exhausted
waits at most ``pool_timeout_s`` for a connection, then fails as ``GymCallTimeout`` naming the
limit.

**Reply channels** (``http/_mux``, ``docs/http-wire.md`` section 7). A server whose ``GET
/health`` advertises ``MUX_FEATURE`` (the ``Gymckpt-Features`` header) is sent each ``run`` as a
short ``POST /mux/v1/run`` (answered once the rows are admitted) whose replies come on one of at
most ``channels_per_instance`` long-lived reply channels of that instance (``POST
/mux/v1/open``, opened when first needed, again after one ends), each line tagged with its
stream. Sockets are then bounded whatever the number of streams in flight: at most
``max_control_connections + max_streams + 2 * channels_per_instance * instances`` (a channel
that ended may still be closing while its successor opens). A server that does not advertise it
(an older gymckpt) is sent ``POST /run`` as before, one connection per open stream
(``multiplex=False`` asks for that everywhere).

**Deadlines** (S5): every control call sends its ``deadline_ts`` as the time left
(``WireDeadline``; the server re-anchors it on its clock and fails a call past it with
``GymCallTimeout``) and is bounded here too, by the deadline plus ``CONTROL_GRACE_S``, in its
own cancel scope: a server that stops answering is ``GymCallTimeout`` naming the instance. The
calls without a deadline (topology, inventory, statistics...) are bounded by ``view_timeout_s``.

**Errors crossing HTTP** (S6). A Gym error arrives as its class (409/503 with the wire error,
``_wire.decode_error``); a refusal (4xx: unauthenticated, malformed, too large...) changed
nothing and is ``GymControlError`` saying why. A transport failure is classified like Ray's:
the instance is *gone* (``GymInstanceDead``, its incarnation marked dead) when the server
process was seen to exit (a spawned one) or a response comes from another incarnation; a
connection that cannot be made or breaks is otherwise a retryable ``GymCheckpointUnavailable``.

**Incarnations.** Every response carries ``Gymckpt-Incarnation``, the id of the server's
incarnation (random per server start; ``Incarnations`` numbers them in the client).
Each request goes to the incarnation the client knows; a response from another one means the
server was restarted under the same name (its episodes and streams are gone): never the same
instance. That incarnation is marked dead and the call raises ``GymInstanceDead``; the
trainer's replacement path then calls ``replace``, which adopts the new incarnation (a server
someone else restarted, who must start it with ``--recover`` so it continues its journal) or,
for a spawned server, kills the process and starts a new one under the same name with
``--recover``.

**Trainer terms.** ``attach`` (the ``TrainerAware`` contract) sends the trainer's term to an
instance, which takes it over for that term (fencing an older term's episodes, checkpoint and
streams) or refuses it (409 ``GymInUse``: another run holds the server); from then on every
request carries the term (``Gymckpt-Trainer``), so a fenced trainer's late requests are refused
before they act.

**Faults** (C3): one ``FaultPlan`` in the client counts calls across the deployment, as the
embedded Gym does, and sends the fault it drew in the request (``fault``, or the run's
``shape``); the server executes it for real. Only servers started with ``--allow-faults``
(spawned ones with faults) honour one.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import httpx
import trio

from gymckpt.runtime import (
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    GymControlError,
    GymInstanceDead,
    GymInUse,
    GymUnavailable,
)

from ..._contract import ReplaceableGym, RunRow, TrainerAware
from ..._faults import FaultPlan, FaultSpec
from ...host._host import HostConfig
from .._acks import AckBook
from .._admission import RunShape
from .._deadlines import WireDeadline
from .._deployment import Replacement, instance_names, per_instance
from .._errors import TransportFailure, as_if_no_nursery, transport_error
from .._niceness import INSTANCE_NICENESS
from .._remote import RemoteGym
from ._calls import answer_error, post_request
from ._mux import HttpMuxStream, MuxChannel
from ._parts import NDJSON, PARTS_FEATURE, CommitParts, decode_in_steps
from ._process import Ready, ServerExited
from ._spawn import ServeSpec, Supervisor
from ._stream import HttpReplyStream, NdjsonBody
from ._wire import (
    FEATURES_HEADER,
    INCARNATION_HEADER,
    MUX_FEATURE,
    MUX_OPEN,
    MUX_RUN,
    PROTOCOL,
    MuxOpenRequest,
    MuxRunRequest,
    RunRequest,
    WireFormatError,
    decode_health,
    decode_result,
    decode_stream_line,
    encode_control_request,
    encode_mux_open,
    encode_mux_run_request,
    encode_run_request,
)

__all__ = ["ChannelStatistics", "HttpGym", "HttpMuxStream", "HttpReplyStream"]

CONTROL_GRACE_S: Final = 1.0
"""A control call is given up this long after its deadline if the server has not answered (the
server's own ``GymCallTimeout`` comes first when it can still answer)."""
POOL_TIMEOUT_S: Final = 30.0
"""Default bound on waiting for a free connection of the client's pool (``max_streams`` for
``/run``, ``max_control_connections`` for the rest): a run past it is ``GymCallTimeout`` saying
which limit is exhausted, never a wait without end."""
VIEW_TIMEOUT_S: Final = 30.0
"""Default bound on the calls that carry no deadline (topology, inventory, statistics...)."""
DEATH_CONFIRM_S: Final = 2.0
"""How long a broken connection to a spawned server waits for the process to exit before it
counts as a broken connection rather than a death."""
HEALTH_PROBE_S: Final = 2.0
"""Bound on the ``/health`` probe that tells an external server's death from an early end."""
ACK_TIMEOUT_S: Final = 2.0
"""Bound on an acknowledgement sent on its own (it is repeated by the next call anyway)."""
REPLACE_POLL_S: Final = 0.1
"""How often ``replace`` asks an external server again whether it serves a new incarnation."""
KEEPALIVE_EXPIRY_S: Final = 2.0
"""An idle pooled connection is closed by the client after this long, well before a server
closes it (``gymckpt serve`` after 30 s, hypercorn by default after 5 s): a request is never
sent on a connection the server is closing (it would fail as "Server disconnected without
sending a response", not knowing whether the server acted)."""
THREAD_DECODE_BYTES: Final = 256 * 1024
"""A control answer at least this large (a commit of thousands of episodes) is decoded in a
worker thread, so the trainer's loop runs meanwhile (the GIL is handed over every few ms)."""
STARTUP_TIMEOUT_S: Final = 60.0
"""Default bound on starting spawned servers (each must log its readiness line by then)."""


@attrs.define
class _Endpoint:
    """Where an instance is served now and by which incarnation."""

    url: str
    incarnation_id: str
    seen: str | None = None
    """Another incarnation seen answering at ``url`` (the server was restarted)."""
    mux: bool = False
    """The server advertised ``MUX_FEATURE`` (reply channels) in its ``GET /health``."""
    parts: bool = False
    """The server advertised ``PARTS_FEATURE`` (a commit answered in parts)."""


def _not_wire_form(instance: str, op: str, exc: WireFormatError) -> GymCheckpointUnavailable:
    return GymCheckpointUnavailable(
        f"instance {instance} {op}: the server's answer is not the wire form ({exc})",
        instance,
        op,
    )


async def _decode_result(op: str, content: bytes) -> Any:
    """``decode_result``; a large answer in a worker thread (``THREAD_DECODE_BYTES``)."""
    if len(content) < THREAD_DECODE_BYTES:
        return decode_result(op, content)
    return await trio.to_thread.run_sync(decode_result, op, content)


@attrs.frozen
class ChannelStatistics:
    """An ``HttpGym``'s reply channels (``channel_statistics``)."""

    opened: int
    """Channels opened since the deployment opened."""
    alive: int
    """Channels open now (at most ``channels_per_instance`` per live incarnation)."""
    largest_step: int
    """The most replies converted in one step of the loop (at most ``DECODE_SLICE``)."""


# -- the deployment -------------------------------------------------------------------------


@final
class HttpGym(RemoteGym):
    """The Gym deployment over HTTP (see the module docstring). ``async with`` it.

    Each instance name has one live incarnation at a time: a restart (seen, or done by
    ``replace``) starts a new incarnation (``Incarnations``); every call and stream remembers
    the incarnation it went to, so a late failure of an old incarnation marks the new one
    nothing, and nothing is sent to an incarnation known to be gone. The contract's verbs are
    ``RemoteGym``'s; this class is the primitive (``_call``: one ``POST /control/v1/<op>``),
    the stream, the connections and ``replace``. It has no ``session_states`` (RayGym and
    EmbeddedGym do): a ``SessionView`` holds a participant's live object, which has no wire form
    and stays in its process.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str,
        faults: Sequence[str | FaultSpec] = (),
        batch_replies: bool = True,
        max_batch_replies: int = 1024,
        connect_timeout_s: float = 10.0,
        view_timeout_s: float = VIEW_TIMEOUT_S,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        max_streams: int = 256,
        max_control_connections: int = 64,
        multiplex: bool = True,
        channels_per_instance: int = 2,
        verify: bool | str = True,
        _supervisor: Supervisor | None = None,
    ) -> None:
        if isinstance(urls, str):
            raise TypeError("HttpGym takes a list of URLs, not one string")
        if not urls:
            raise ValueError("HttpGym needs at least one server URL")
        if not token:
            raise ValueError("HttpGym needs the servers' bearer token (token=...)")
        if max_batch_replies < 1:
            raise ValueError(f"max_batch_replies must be >= 1, got {max_batch_replies!r}")
        if channels_per_instance < 1:
            raise ValueError(f"channels_per_instance must be >= 1, got {channels_per_instance!r}")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("view_timeout_s", view_timeout_s),
            ("pool_timeout_s", pool_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        super().__init__(FaultPlan(faults))
        self._urls = tuple(u.rstrip("/") for u in urls)
        self._token = token
        self._batch_replies = batch_replies
        self._max_batch_replies = max_batch_replies
        self._connect_timeout_s = connect_timeout_s
        self._view_timeout_s = view_timeout_s
        self._pool_timeout_s = pool_timeout_s
        self._limits = (max_streams, max_control_connections)
        self._multiplex = multiplex
        self._largest_commit_step = 0
        self._channels_per_instance = channels_per_instance
        self._channels: dict[str, list[MuxChannel]] = {}
        """Each instance's reply channels, alive or ended but not yet let go."""
        self._channel_locks: dict[str, trio.Lock] = {}
        self._cids = itertools.count(1)
        self._channels_opened = 0
        self._acking: dict[str, tuple[int, int, int] | None] = {}
        """Instances with an ``ack`` on its way, and the one to send after it (if any)."""
        self._channel_client: httpx.AsyncClient | None = None
        self._verify = verify
        self._supervisor = _supervisor
        self._endpoints: dict[str, _Endpoint] = {}
        self._sids = itertools.count(1)
        self._session: AbstractAsyncContextManager[HttpGym] | None = None
        self._streams: set[HttpReplyStream] = set()
        """Streams whose response is open (held, so none is collected half-read)."""
        self._nursery: trio.Nursery | None = None
        self._control_client: httpx.AsyncClient | None = None
        self._run_client: httpx.AsyncClient | None = None

    # -- opening and closing ---------------------------------------------------------------------

    def _client(self, max_connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers={"Authorization": f"Bearer {self._token}"},
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=min(max_connections, 32),
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            timeout=httpx.Timeout(None, connect=self._connect_timeout_s, pool=self._pool_timeout_s),
            verify=self._verify,
            trust_env=False,
        )

    async def __aenter__(self) -> HttpGym:
        if self._session is not None:
            raise RuntimeError("HttpGym is already open")
        session = self._open()
        gym = await session.__aenter__()
        self._session = session
        return gym

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        session, self._session = self._session, None
        if session is None:
            return None
        return await session.__aexit__(t, e, tb)

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[HttpGym]:
        max_streams, max_control = self._limits
        max_channels = 2 * self._channels_per_instance * len(self._urls)
        async with (
            self._client(max_streams) as data,
            self._client(max_control) as control,
            self._client(max_channels) as channels,
        ):
            self._run_client, self._control_client = data, control
            self._channel_client = channels
            try:
                await self._connect()
                with as_if_no_nursery():
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        try:
                            yield self
                        finally:
                            self._nursery = None
                            nursery.cancel_scope.cancel()  # acknowledgements on their way
            finally:
                with trio.CancelScope(shield=True):
                    await self._close_streams()

    async def _connect(self) -> None:
        """Ask every URL's ``/health`` (concurrently, each within ``connect_timeout_s``), then
        its topology (which needs the token)."""
        healths: dict[str, tuple[Any, frozenset[str]]] = {}

        async def one(url: str) -> None:
            healths[url] = await self._health_features(url, self._connect_timeout_s)

        async with trio.open_nursery() as nursery:
            for url in self._urls:
                nursery.start_soon(one, url)
        names: list[str] = []
        for url in self._urls:
            health, features = healths[url]
            if health is None:
                raise GymConnectionLost(
                    f"no gymckpt server answers GET {url}/health within "
                    f"{self._connect_timeout_s:g}s: start it (gymckpt serve) or fix the URL",
                    url,
                )
            if health.protocol != PROTOCOL:
                raise ValueError(
                    f"the server at {url} speaks {health.protocol!r}, this client {PROTOCOL!r}: "
                    "run the same gymckpt version on both sides"
                )
            if not health.serving:
                raise GymConnectionLost(f"the server at {url} does not serve yet", url)
            names.append(health.instance)
            self._endpoints[health.instance] = _Endpoint(
                url,
                health.incarnation,
                mux=MUX_FEATURE in features,
                parts=PARTS_FEATURE in features,
            )
        if len(set(names)) != len(names):
            served = dict(zip(self._urls, names, strict=True))
            raise ValueError(
                f"two servers serve the same instance name: {served}; give each its own --instance"
            )
        self._open_instances(names)
        if self._supervisor is not None:
            self._supervisor.on_exit = self._server_exited
        for name in self._names:  # needs the token: a wrong one fails here, naming the server
            try:
                await self._call(name, "topology", {}, None)
            except GymControlError as exc:
                raise ValueError(
                    f"the server at {self._endpoints[name].url} refuses this client: {exc}"
                ) from None

    async def _health(self, url: str, timeout_s: float) -> Any:
        """``GET url/health``, or None if nothing answers it within ``timeout_s``."""
        health, _ = await self._health_features(url, timeout_s)
        return health

    async def _health_features(self, url: str, timeout_s: float) -> tuple[Any, frozenset[str]]:
        """``GET url/health`` and the features it advertises (``MUX_FEATURE``,
        ``PARTS_FEATURE``), or ``(None, frozenset())`` if nothing answers it within
        ``timeout_s``."""
        none: frozenset[str] = frozenset()
        assert self._control_client is not None
        with trio.move_on_after(timeout_s):
            try:
                resp = await self._control_client.get(url + "/health")
            except httpx.HTTPError:
                return None, none
            if resp.status_code != 200:
                return None, none
            try:
                health = decode_health(resp.content)
            except WireFormatError:
                return None, none
            features = resp.headers.get(FEATURES_HEADER, "")
            return health, frozenset(f.strip() for f in features.split(","))
        return None, none

    async def _close_streams(self) -> None:
        """Close the response of every stream its consumer left open (the deployment ends)."""
        while self._streams:
            await self._streams.pop().close_response()

    def opened(self, stream: HttpReplyStream) -> None:
        self._streams.add(stream)

    def released(self, stream: HttpReplyStream) -> None:
        self._streams.discard(stream)

    def _server_exited(self, name: str, incarnation: int) -> None:
        """A spawned server's process exited: that incarnation is dead."""
        if name in self._endpoints:
            self._incarnations.mark_dead(name, incarnation)

    # -- spawning --------------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def spawn(
        cls,
        environment: str | Sequence[str],
        instances: int = 1,
        *,
        work_dir: str | Path,
        config: HostConfig | None = None,
        faults: Sequence[str | FaultSpec] = (),
        seed: int = 0,
        state_root: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        extra_args: Sequence[str] = (),
        instance_niceness: int = INSTANCE_NICENESS,
        **options: Any,
    ) -> AsyncIterator[HttpGym]:
        """Start ``instances`` local ``gymckpt serve ENVIRONMENT`` processes (instances
        ``gym-0`` …), on loopback ports the kernel picks, and serve the deployment on them until
        the context exits, when they are stopped (SIGTERM, then SIGKILL). They die with this
        process too, however it ends (``http/_process``).

        ``environment`` is an import path (``package.module:factory``) each server loads
        itself (or a list of them, one per instance); ``environ`` adds environment variables
        for the servers (a factory's settings).
        Each instance journals in ``work_dir/<instance>/`` (as embedded and on Ray), logs to
        ``work_dir/<instance>.serve.log``, and accepts commit and restore paths inside
        ``state_root`` (default ``work_dir``; it must contain the trainer's snapshot
        directory). One bearer token for all of them is generated into ``work_dir/http-token``
        (mode 0600). ``config`` is every host's ``HostConfig``; ``faults`` are C3 specs (the
        servers then run with ``--allow-faults``). ``options`` go to ``HttpGym``. Raises
        ``TimeoutError`` if a server does not serve within ``startup_timeout_s``; nothing is
        left running then. Each server runs ``instance_niceness`` steps below this process
        (``transports/_niceness``: the trainer's loop first when both want a core).
        """
        names = instance_names(instances)
        sources = per_instance(environment, instances)
        for source in sources:
            if not isinstance(source, str):
                raise TypeError(
                    "HttpGym.spawn takes the environment's import path ('package.module:name'), "
                    f"which each server loads itself, not a {type(source).__name__}"
                )
        FaultPlan(faults)  # a bad spec fails before anything starts
        token = secrets.token_urlsafe(32)
        spec = ServeSpec.prepare(
            dict(zip(names, sources, strict=True)),
            seed,
            work_dir,
            state_root,
            token,
            config,
            allow_faults=bool(faults),
            extra_args=tuple(extra_args),
            environ=environ or {},
            instance_niceness=instance_niceness,
        )
        with as_if_no_nursery():
            async with trio.open_nursery() as nursery:
                supervisor = Supervisor(nursery, spec)
                try:
                    deadline = trio.current_time() + startup_timeout_s
                    readies = await supervisor.start_all(names, deadline)
                    gym = cls(
                        [readies[n].url for n in names],
                        token=token,
                        faults=faults,
                        _supervisor=supervisor,
                        **options,
                    )
                    async with gym:
                        yield gym
                finally:
                    with trio.CancelScope(shield=True):
                        await supervisor.stop_all()
                    nursery.cancel_scope.cancel()

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def acks(self) -> AckBook:
        return self._acks

    @property
    def spawned(self) -> bool:
        """Whether this deployment started (and supervises) its servers."""
        return self._supervisor is not None

    def url(self, instance: str) -> str:
        """The URL ``instance`` is served at now."""
        return self._endpoint(instance).url

    def incarnation(self, instance: str) -> str:
        """The incarnation of ``instance`` this client talks to."""
        return self._endpoint(instance).incarnation_id

    def pid(self, instance: str) -> int | None:
        """The process id of a spawned instance's server (None for one someone else runs)."""
        self._endpoint(instance)
        proc = self._supervisor.process(instance) if self._supervisor is not None else None
        return proc.pid if proc is not None else None

    def _endpoint(self, instance: str) -> _Endpoint:
        try:
            return self._endpoints[instance]
        except KeyError:
            raise ValueError(
                f"unknown instance {instance!r} (instances: {', '.join(self._names)})"
            ) from None

    def serving(self, instance: str, incarnation: int) -> bool:
        return self._incarnations.serving(instance, incarnation)

    def _check_incarnation(
        self,
        instance: str,
        op: str,
        endpoint: _Endpoint,
        response: httpx.Response,
        incarnation: int,
    ) -> None:
        """A response from another incarnation than the one asked: that one is gone."""
        seen = response.headers.get(INCARNATION_HEADER)
        if seen is None:
            raise GymCheckpointUnavailable(
                f"instance {instance} {op}: the answer from {endpoint.url} has no "
                f"{INCARNATION_HEADER} header (HTTP {response.status_code}): is it a gymckpt "
                "server?",
                instance,
                op,
            )
        if seen != endpoint.incarnation_id:
            endpoint.seen = seen
            self._incarnations.mark_dead(instance, incarnation)
            raise GymInstanceDead(instance, op)

    async def _transport_failure(
        self, instance: str, op: str, exc: BaseException, incarnation: int
    ) -> BaseException:
        """The runtime's error for httpx's ``exc`` on ``op`` of incarnation ``incarnation``."""
        if isinstance(exc, httpx.PoolTimeout):
            streams, control = self._limits
            pool = f"max_streams={streams}" if op == "run" else f"max_control_connections={control}"
            return GymCallTimeout(
                f"instance {instance} {op}: no free connection within {self._pool_timeout_s} s: "
                f"every one of HttpGym's {pool} is held (each open /run stream holds one until "
                "its episodes end); give HttpGym a larger limit, and the servers --max-streams "
                "to match, or dispatch larger batches",
                instance,
                op,
            )
        if isinstance(exc, httpx.TimeoutException):
            return GymCallTimeout(
                f"instance {instance} {op}: no answer from {self._endpoint(instance).url} in "
                f"time ({type(exc).__name__})",
                instance,
                op,
            )
        failure = (
            TransportFailure.UNREACHABLE
            if isinstance(exc, httpx.ConnectError)
            else TransportFailure.BROKEN
        )
        if self._supervisor is not None and await self._supervisor.exited(
            instance, incarnation, DEATH_CONFIRM_S
        ):
            failure = TransportFailure.GONE
            self._incarnations.mark_dead(instance, incarnation)
        return transport_error(failure, instance, op, exc, transport="HTTP", peer="server")

    def _error_response(
        self, instance: str, op: str, response: httpx.Response, incarnation: int
    ) -> Exception:
        """The runtime's error for a non-200 answer to ``op`` from incarnation ``incarnation``
        (a ``GymInstanceDead`` it reports marks that incarnation dead)."""
        error = answer_error(instance, op, response)
        if isinstance(error, GymInstanceDead):
            self._incarnations.mark_dead(instance, incarnation)
        return error

    async def _call(
        self,
        instance: str,
        op: str,
        args: Mapping[str, Any],
        deadline_ts: float | None,
        fault: FaultSpec | None = None,
    ) -> Any:
        """``POST /control/v1/<op>`` to the live incarnation of ``instance``, carrying its
        recorded acknowledgements; bounded by ``deadline_ts`` plus ``CONTROL_GRACE_S`` (or
        ``view_timeout_s`` without a deadline)."""
        incarnation = self._incarnations.live(instance, op)
        endpoint = self._endpoint(instance)
        acks = self._acks.outgoing(instance)
        now = trio.current_time()
        deadline = None
        if deadline_ts is not None:
            deadline = WireDeadline.send(deadline_ts, now, time.time())
            bound = deadline_ts + CONTROL_GRACE_S
        else:
            bound = now + self._view_timeout_s
        body = encode_control_request(op, deadline=deadline, acks=acks, fault=fault, args=args)
        assert self._control_client is not None, "HttpGym is not open (use async with)"
        response: httpx.Response | None = None
        in_parts = op == "commit" and endpoint.parts
        parts: CommitParts | None = None
        answered: httpx.Response | None = None
        # the response once read whole (its parts too) within the bound: else a timeout
        with trio.move_on_at(bound):
            try:
                request = post_request(
                    self._control_client,
                    f"{endpoint.url}/control/v1/{op}",
                    body,
                    endpoint.incarnation_id,
                    self._trainer,
                )
                if in_parts:
                    request.headers["Accept"] = NDJSON
                response = await self._control_client.send(request, stream=in_parts)
                if in_parts:
                    parts = await self._read_in_parts(response)
                answered = response
            except httpx.HTTPError as exc:
                raise await self._transport_failure(instance, op, exc, incarnation) from None
            except WireFormatError as exc:
                raise _not_wire_form(instance, op, exc) from None
        response = answered
        if response is None:
            raise GymCallTimeout(
                f"instance {instance} did not answer {op} in time (server {endpoint.url})",
                instance,
                op,
            )
        self._check_incarnation(instance, op, endpoint, response, incarnation)
        if response.status_code != 200:
            raise self._error_response(instance, op, response, incarnation)
        try:
            if parts is not None:
                result = parts.reply()
            else:
                result = await _decode_result(op, response.content)
                if op == "commit":
                    whole = len(result.exported) + len(result.sessions)
                    self._largest_commit_step = max(self._largest_commit_step, whole)
        except WireFormatError as exc:
            raise _not_wire_form(instance, op, exc) from None
        if self._incarnations.serving(instance, incarnation):
            self._acks.carried(instance, acks)
        return result

    async def _read_in_parts(self, response: httpx.Response) -> CommitParts | None:
        """A commit's answer in parts (``http/_parts``) read from the streamed ``response``,
        one line decoded per scheduler step of the trainer's loop; None (the body read whole,
        for the one-piece path) for any other answer: an error, or a server that answered
        in one piece. Closes the response."""
        body = NdjsonBody(response)
        try:
            if response.status_code != 200 or not response.headers.get(
                "content-type", ""
            ).startswith(NDJSON):
                await response.aread()
                return None
            parts = await decode_in_steps(body.next_line)
            self._largest_commit_step = max(self._largest_commit_step, parts.largest_part)
            return parts
        finally:
            await body.aclose()

    @property
    def largest_commit_step(self) -> int:
        """The most records of a commit's answer decoded in one step of the trainer's loop so
        far: at most ``PART_RECORDS`` when every server answers in parts (``PARTS_FEATURE``),
        the whole answer's records when one answered in one piece; 0 before any commit."""
        return self._largest_commit_step

    # -- StreamPeer (for HttpReplyStream) ----------------------------------------------------------

    def send_ack(self, instance: str, incarnation: int, sid: int, upto: int) -> None:
        """Send ``ack(sid, upto)`` in the background. At most one is on its way per instance:
        one asked for meanwhile is sent once it is back, and carries (in its ``acks``) every
        acknowledgement recorded by then, so thousands of streams cost a few calls, not one
        connection each."""
        if self._nursery is None:
            return
        if instance in self._acking:
            self._acking[instance] = (incarnation, sid, upto)
            return
        self._acking[instance] = None
        self._nursery.start_soon(self._acks_out, instance, incarnation, sid, upto)

    async def _acks_out(self, instance: str, incarnation: int, sid: int, upto: int) -> None:
        try:
            while True:
                await self._ack(instance, incarnation, sid, upto)
                again = self._acking.get(instance)
                if again is None:
                    return
                self._acking[instance] = None
                incarnation, sid, upto = again
        finally:
            self._acking.pop(instance, None)

    async def _ack(self, instance: str, incarnation: int, sid: int, upto: int) -> None:
        if not self._incarnations.serving(instance, incarnation):
            return
        # an ack is advisory (a lost one is carried by the next request): one refused because
        # the instance now serves another term or run than this facade's (GymInUse: it acted
        # on nothing) is dropped too, not raised into the facade's nursery
        with trio.move_on_after(ACK_TIMEOUT_S), suppress(GymUnavailable, GymInUse):
            await self._call(instance, "ack", {"sid": sid, "upto": upto}, None)

    async def close_stream(self, instance: str, incarnation: int, sid: int, upto: int) -> bool:
        if not self._incarnations.serving(instance, incarnation):
            await trio.lowlevel.checkpoint()
            return False
        try:
            await self._call(instance, "close_stream", {"sid": sid, "upto": upto}, None)
        except GymUnavailable:
            return False
        return True

    async def broken(
        self, instance: str, incarnation: int, exc: BaseException | None
    ) -> BaseException | None:
        if not self._incarnations.serving(instance, incarnation):
            return GymInstanceDead(instance, "run")
        if self._supervisor is not None:
            if await self._supervisor.exited(instance, incarnation, DEATH_CONFIRM_S):
                self._incarnations.mark_dead(instance, incarnation)
                return GymInstanceDead(instance, "run")
            return None
        endpoint = self._endpoint(instance)
        health = await self._health(endpoint.url, HEALTH_PROBE_S)
        if health is not None and health.incarnation != endpoint.incarnation_id:
            endpoint.seen = health.incarnation
            self._incarnations.mark_dead(instance, incarnation)
            return GymInstanceDead(instance, "run")
        return None

    # -- GymBackend ------------------------------------------------------------------------------

    async def run(self, instance: str, rows: Sequence[RunRow]) -> HttpReplyStream | HttpMuxStream:
        """Submit ``rows`` and wait until they are admitted: on a reply channel (``POST
        /mux/v1/run``) if the server offers them and ``multiplex``, else ``POST /run``; a
        ``refuse`` fault refuses them all, a ``drop`` fault ends the stream after
        ``len(rows) // 2`` replies (``RunShape``)."""
        incarnation = self._incarnations.live(instance, "run")
        endpoint = self._endpoint(instance)
        shape = RunShape.of(self._plan.check("run"), rows)
        if self._multiplex and endpoint.mux:
            return await self._mux_run(instance, incarnation, endpoint, shape, rows)
        sid = next(self._sids)
        acks = self._acks.outgoing(instance)
        body = encode_run_request(
            RunRequest(
                sid, acks, shape, not self._batch_replies, self._max_batch_replies, tuple(rows)
            )
        )
        assert self._run_client is not None, "HttpGym is not open (use async with)"
        request = post_request(
            self._run_client, f"{endpoint.url}/run", body, endpoint.incarnation_id, self._trainer
        )
        try:
            response = await self._run_client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise await self._transport_failure(instance, "run", exc, incarnation) from None
        try:
            self._check_incarnation(instance, "run", endpoint, response, incarnation)
            if response.status_code != 200:
                await response.aread()
                raise self._error_response(instance, "run", response, incarnation)
            stream = HttpReplyStream(self, instance, incarnation, sid, response)
            await stream.admitted()
        except BaseException:
            with trio.CancelScope(shield=True), suppress(httpx.HTTPError):
                await response.aclose()
            raise
        if self._incarnations.serving(instance, incarnation):
            self._acks.carried(instance, acks)
        return stream

    async def _mux_run(
        self,
        instance: str,
        incarnation: int,
        endpoint: _Endpoint,
        shape: RunShape,
        rows: Sequence[RunRow],
    ) -> HttpMuxStream:
        """``POST /mux/v1/run``: the stream is registered on a reply channel first, then the
        rows are submitted; returns once the server answered that they are admitted."""
        channel = await self._channel(instance, incarnation, endpoint)
        sid = next(self._sids)
        stream = HttpMuxStream(self, instance, incarnation, sid, channel)
        channel.register(stream)
        acks = self._acks.outgoing(instance)
        run = RunRequest(
            sid, acks, shape, not self._batch_replies, self._max_batch_replies, tuple(rows)
        )
        body = encode_mux_run_request(MuxRunRequest(channel.cid, run))
        assert self._run_client is not None, "HttpGym is not open (use async with)"
        request = post_request(
            self._run_client,
            f"{endpoint.url}{MUX_RUN}",
            body,
            endpoint.incarnation_id,
            self._trainer,
        )
        try:
            try:
                response = await self._run_client.send(request)
            except httpx.HTTPError as exc:
                raise await self._transport_failure(instance, "run", exc, incarnation) from None
            self._check_incarnation(instance, "run", endpoint, response, incarnation)
            if response.status_code == 409 and b"UnknownChannel" in response.content:
                channel.alive = False  # it ended on the server: a later run opens another
                raise GymCheckpointUnavailable(
                    f"instance {instance} run: reply channel {channel.cid} ended before the "
                    "rows reached it (nothing was admitted); retry",
                    instance,
                    "run",
                )
            if response.status_code != 200:
                raise self._error_response(instance, "run", response, incarnation)
            self._admitted(instance, response.content)
        except BaseException:
            channel.forget(sid)
            raise
        if self._incarnations.serving(instance, incarnation):
            self._acks.carried(instance, acks)
        return stream

    @staticmethod
    def _admitted(instance: str, content: bytes) -> None:
        """The answer of a ``/mux/v1/run`` is the admission header line."""
        try:
            item = decode_stream_line(content)
        except WireFormatError as exc:
            item, problem = None, str(exc)
        else:
            problem = "not the admission header"
        if item is None or not item.is_header:
            raise GymCheckpointUnavailable(
                f"instance {instance} run: the answer to {MUX_RUN} is {problem}", instance, "run"
            )

    async def _channel(self, instance: str, incarnation: int, endpoint: _Endpoint) -> MuxChannel:
        """The least loaded alive reply channel of ``instance``'s incarnation, opening one
        first while it has fewer than ``channels_per_instance``."""
        lock = self._channel_locks.setdefault(instance, trio.Lock())
        async with lock:
            channels = self._channels.setdefault(instance, [])
            channels[:] = [c for c in channels if c.alive and c.incarnation == incarnation]
            if len(channels) < self._channels_per_instance:
                with trio.move_on_after(self._view_timeout_s) as opening:
                    channels.append(await self._open_channel(instance, incarnation, endpoint))
                if opening.cancelled_caught:
                    raise GymCallTimeout(
                        f"instance {instance} run: no reply channel opened at {endpoint.url} "
                        f"within {self._view_timeout_s:g} s",
                        instance,
                        "run",
                    )
            return min(channels, key=lambda c: c.load)

    async def _open_channel(
        self, instance: str, incarnation: int, endpoint: _Endpoint
    ) -> MuxChannel:
        """``POST /mux/v1/open`` and read its channel line; its reader runs in the deployment's
        nursery until the body ends or the deployment closes."""
        client, nursery = self._channel_client, self._nursery
        assert client is not None and nursery is not None, "HttpGym is not open (use async with)"
        cid = next(self._cids)
        request = post_request(
            client,
            f"{endpoint.url}{MUX_OPEN}",
            encode_mux_open(MuxOpenRequest(cid)),
            endpoint.incarnation_id,
            self._trainer,
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise await self._transport_failure(instance, "run", exc, incarnation) from None
        channel = MuxChannel(instance, incarnation, cid, response)
        try:
            self._check_incarnation(instance, "run", endpoint, response, incarnation)
            if response.status_code != 200:
                await response.aread()
                raise self._error_response(instance, "run", response, incarnation)
            await channel.opened()
        except BaseException:
            with trio.CancelScope(shield=True):
                await channel.close()
            raise
        nursery.start_soon(channel.read)
        self._channels_opened += 1
        return channel

    def channel_statistics(self) -> ChannelStatistics:
        """What the reply channels did so far (for tests and benchmarks)."""
        channels = [c for cs in self._channels.values() for c in cs]
        return ChannelStatistics(
            self._channels_opened,
            sum(c.alive for c in channels),
            max((c.largest_step for c in channels), default=0),
        )

    # -- replacement -----------------------------------------------------------------------------

    async def replace(self, instance: str, deadline_ts: float) -> None:
        """Bring up a fresh incarnation under ``instance``'s name, in place of its dead one.

        From the first line on, the instance counts as dead (no call reaches either
        incarnation) and its incarnation is new (a late error of the old one marks nothing).
        A spawned server: the old process is killed and must be seen to exit (fenced: it can
        write nothing more), then a new ``gymckpt serve --recover`` starts under the same name
        and continues the dead one's retained sessions from its journal. A server someone else
        runs: ``replace`` waits until its URL answers with an incarnation other than the dead
        one (someone restarted it, with ``--recover``) and adopts it. Raises
        ``GymCallTimeout`` if that did not happen by ``deadline_ts``, ``GymInstanceDead`` if the
        new server exits while starting; the instance then stays dead and ``replace`` may be
        called again.
        """
        old = self._endpoint(instance)
        t0 = trio.current_time()
        incarnation = self._incarnations.begin_replacement(instance)
        supervisor = self._supervisor
        if supervisor is None:
            ready = await self._adopt(instance, old, deadline_ts)
            t1 = t0
        else:
            with trio.move_on_at(deadline_ts):
                await supervisor.kill(instance)
            proc = supervisor.process(instance)
            if proc is not None and not proc.exited():
                raise GymCallTimeout(
                    f"instance {instance} replace: its old server (pid {proc.pid}) did not exit "
                    "by the deadline; not replaced",
                    instance,
                    "replace",
                )
            t1 = trio.current_time()
            try:
                ready = await supervisor.start(instance, incarnation, deadline_ts, recover=True)
            except TimeoutError as exc:
                raise GymCallTimeout(
                    f"instance {instance} replace: {exc}", instance, "replace"
                ) from None
            except ServerExited:
                raise GymInstanceDead(instance, "replace") from None
        self._endpoints[instance] = _Endpoint(
            ready.url, ready.incarnation, mux=old.mux, parts=old.parts
        )
        self._acks.reset(instance)
        self._incarnations.installed(instance, incarnation)
        self._log_replacement(
            Replacement(
                instance,
                t1 - t0,
                trio.current_time() - t1,
                old.url,
                ready.url,
                old.incarnation_id,
                ready.incarnation,
            )
        )

    async def _adopt(self, instance: str, old: _Endpoint, deadline_ts: float) -> Ready:
        """Wait until the server at ``old.url`` serves ``instance`` in another incarnation."""
        last = "no answer"
        with trio.move_on_at(deadline_ts):
            while True:
                health = await self._health(old.url, max(0.1, deadline_ts - trio.current_time()))
                if health is not None:
                    if health.instance != instance:
                        last = f"it serves instance {health.instance!r}"
                    elif health.incarnation != old.incarnation_id and health.serving:
                        return Ready(instance, old.url, health.incarnation)
                    else:
                        last = f"it still serves incarnation {health.incarnation}"
                await trio.sleep(REPLACE_POLL_S)
        raise GymCallTimeout(
            f"instance {instance} replace: the server at {old.url} did not come back as a new "
            f"incarnation by the deadline ({last}); restart it with gymckpt serve --recover",
            instance,
            "replace",
        )

    def __repr__(self) -> str:
        kind = "spawned" if self._supervisor is not None else "external"
        return (
            f"<HttpGym {kind} instances={len(self._names)} "
            f"dead={self._incarnations.dead_count} faults={self._plan!r}>"
        )


if TYPE_CHECKING:  # mypy checks that HttpGym implements the contract

    def _can_replace(gym: HttpGym) -> ReplaceableGym:
        return gym

    def _is_trainer_aware(gym: HttpGym) -> TrainerAware:
        return gym
