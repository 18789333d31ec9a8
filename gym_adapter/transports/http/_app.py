"""One Gym instance as an ASGI application (``gymckpt-http/2``): the Ray actor's twin over HTTP.

``GymHttpApp`` serves one ``GymHost`` running in the same trio run as the ASGI server
(``http/_serve``: hypercorn's trio worker and the host share one nursery), so every request
handler calls the host directly, with no thread and no hop. Routes (``docs/http-wire.md``):

- ``GET /health`` (no token): protocol, instance, incarnation, serving, topology;
- ``POST /control/v1/<op>``: one control call or view (``http/_wire.CONTROL_OPS``);
- ``POST /run``: rows in, an NDJSON body out — the admission header line once every row's fate
  is decided (S1: the response status is sent only then, so an error of the ``run`` itself is
  an error response, never a half stream), then one ``ReplyBatch`` per line, then the end line.

Every request passes the security rules of ``http/_guard`` first; a refused one changed
nothing (the acknowledgements it carries are applied only after every check). Every response
carries ``Gymckpt-Incarnation`` (random per process start: a restarted server is a new
incarnation, never the same instance) and ``Gymckpt-Instance``.

Acknowledgement is exactly the Ray actor's (``_outbox``): a reply sent on a ``/run``
body stays on the wire (listed by ``commit``) until the client acknowledges its batch, on the
``acks`` of any later request or with ``ack``/``close_stream``. A client that disconnects
mid-body ends the handler (a watcher of ``http.disconnect`` cancels it: no task is left behind);
the rows keep running, and what was sent but not acknowledged stays on the wire until the
client's next ``acks`` or ``close_stream`` settles it. A stream whose instance died ends without
the end line: the body stops, as a dead server's would.

A request that carries ``Gymckpt-Trainer`` (the trainer's term, ``host/_tenancy``) is checked
against the term the instance serves before it acts, acknowledgements included: a fenced
term's, or another lineage's, is refused 409 ``GymInUse``. ``attach`` takes the instance over
for a newer term; when it fenced what was there, the streams of the older term are forgotten
here too, so the newer trainer's stream ids (which start again at 1) never meet them.

Gym errors cross as their class (``_wire.encode_error``): 409 for a refusal (``TopologyMismatch``,
``StrandedSessionError``, ``ManifestError``, ``GymAdmissionClosed``, ``EnvironmentSpecError``),
503 for the ``GymUnavailable`` family and anything else (which crosses as
``GymCheckpointUnavailable``). Deadlines are re-anchored on this process's clock
(``WireDeadline.local``). Faults are executed for real (``inject_fault``; ``dead`` ends the
process, as a dead Ray actor's does) when the server allows them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any, Final, final

import attrs
import trio

from gymckpt.runtime import GymInUse, GymUnavailable, TrainerTerm
from gymckpt.runtime._shared import RECORDS_FILE

from ..._faults import FaultSpec, inject_fault
from ...host._host import GymHost
from ...host._records import commit_objects
from ...host._streams import HostReplyStream
from .._admission import ReplyBatch, RunShape, admission_header
from .._outbox import Outbox, Outboxes
from .._verbs import call_host
from .._wire import WIRE_ERRORS, encode_error
from ._channels import ReplyChannel
from ._guard import (
    LOG,
    Limits,
    RefusedRequest,
    check_bearer,
    confine,
    confine_below,
    content_length,
    read_body,
)
from ._parts import NDJSON, PARTS_FEATURE, encode_commit_parts
from ._wire import (
    CONTROL_OPS,
    DEADLINE_OPS,
    END_LINE,
    EXPECT_INCARNATION_HEADER,
    FEATURES_HEADER,
    INCARNATION_HEADER,
    INSTANCE_HEADER,
    MUX_FEATURE,
    MUX_OPEN,
    MUX_RUN,
    PROTOCOL,
    TRAINER_HEADER,
    ControlRequest,
    Health,
    MuxOpenRequest,
    MuxRunRequest,
    RunRequest,
    WireFormatError,
    decode_control_request,
    decode_mux_open,
    decode_mux_run_request,
    decode_run_request,
    encode_batch_line,
    encode_health,
    encode_mux_channel_line,
    encode_refusal,
    encode_result,
)

__all__ = ["CONTROL_PREFIX", "GymHttpApp", "HttpAppStatistics"]

CONTROL_PREFIX: Final = "/control/v1/"

_JSON: Final = (b"content-type", b"application/json")
_NDJSON: Final = (b"content-type", b"application/x-ndjson")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@attrs.frozen
class HttpAppStatistics:
    """What the server has on its hands (for tests: a disconnect must leave no handler)."""

    open_streams: int
    """``/run`` response bodies being written right now."""
    outboxes: int
    """Streams still registered (not yet fully acknowledged or closed)."""
    refused: int
    """Requests refused by a security rule since the start."""
    channels: int = 0
    """Reply channels open (``/mux/v1/open`` bodies being written)."""


def _resolved(path: str | Path) -> Path:
    return Path(path).resolve()


def _die() -> None:
    """The ``dead`` fault: the process ends for real, as a dead Ray actor's does."""
    LOG.error("gymckpt serve: the dead fault ends the process")
    sys.stderr.flush()
    os._exit(1)


@final
@attrs.define(eq=False, slots=True)
class GymHttpApp:
    """The ASGI application serving ``host`` (already entered: ``async with host``).

    ``token``: the bearer token every route but health needs; ``state_root``: the directory
    every path a request names must stay inside (resolved here); ``allow_faults``: honour the
    faults requests carry (spawned test servers), else refuse them 403."""

    host: GymHost
    token: bytes = attrs.field(repr=False)
    state_root: Path = attrs.field(converter=_resolved)
    incarnation: str
    limits: Limits = attrs.field(factory=Limits)
    allow_faults: bool = False
    _outboxes: Outboxes = attrs.field(factory=Outboxes, init=False)
    _open_streams: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _stopping: trio.Event = attrs.field(factory=trio.Event, init=False)
    _channels: dict[int, ReplyChannel] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        if not self.token:
            raise ValueError("the bearer token must not be empty")

    @property
    def name(self) -> str:
        return self.host.name

    def stop(self) -> None:
        """The server stops: every open ``/run`` body ends now, without the end line (the
        client tells it from a completed stream), so the ASGI server's graceful shutdown does
        not wait on them."""
        self._stopping.set()

    def statistics(self) -> HttpAppStatistics:
        return HttpAppStatistics(
            self._open_streams, len(self._outboxes), self._refused, len(self._channels)
        )

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # websocket: not served (hypercorn closes it when the app returns without accepting)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _headers(self, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        return [
            (INCARNATION_HEADER.lower().encode(), self.incarnation.encode()),
            (INSTANCE_HEADER.lower().encode(), self.name.encode()),
            *extra,
        ]

    def _check_incarnation(self, headers: dict[bytes, bytes]) -> None:
        """Refuse a request meant for another incarnation of this instance (a client that has
        not yet seen the restart): 409, and nothing acts."""
        expected = headers.get(EXPECT_INCARNATION_HEADER.lower().encode())
        if expected is not None and expected != self.incarnation.encode():
            raise RefusedRequest(
                409,
                "IncarnationMismatch",
                f"instance {self.name} is incarnation {self.incarnation}, the request is for "
                f"{expected.decode(errors='replace')[:64]}: the server restarted; treat the "
                "instance as replaced",
            )

    async def _respond(
        self, send: Send, status: int, body: bytes, *, close: bool = False, features: bool = False
    ) -> None:
        headers = self._headers(_JSON, (b"content-length", str(len(body)).encode()))
        if features:  # what this server adds to the protocol (GET /health)
            features_served = f"{MUX_FEATURE},{PARTS_FEATURE}"
            headers.append((FEATURES_HEADER.lower().encode(), features_served.encode()))
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        body_read = False
        try:
            if path == "/health":
                if method != "GET":
                    raise RefusedRequest(405, "MethodNotAllowed", f"{path} takes GET only")
                await self._respond(send, 200, self._health(), features=True)
                return
            headers = {k.lower(): v for k, v in scope["headers"]}
            check_bearer(headers, self.token)
            op = self._route(method, path)
            self._check_incarnation(headers)
            trainer = _trainer_of(headers)
            content_length(headers, self.limits.max_body_bytes)
            body = await read_body(receive, self.limits.max_body_bytes)
            body_read = True
            if op == "/run":
                run = self._admit_run(body)
                act = partial(self._run, run, trainer, send)
            elif op == MUX_OPEN:
                opening = self._admit_mux_open(body)
                act = partial(self._mux_open, opening, trainer, send)
            elif op == MUX_RUN:
                mux = self._admit_mux_run(body)
                act = partial(self._mux_run, mux, trainer, send)
            else:
                req, args = self._admit_control(op, body)
                in_parts = op == "commit" and headers.get(b"accept") == NDJSON.encode()
                act = partial(self._control, op, req, args, trainer, send, in_parts)
            # every check passed: from here on the request acts, until it is done or the client
            # goes away (a hung call, a stream nobody reads: cancelled, as a cancelled Ray call)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, _disconnected(receive), nursery.cancel_scope)
                await act()
                nursery.cancel_scope.cancel()
        except RefusedRequest as refused:
            self._refused += 1
            client = scope.get("client") or ("?", 0)
            LOG.warning(
                "gymckpt serve: refused %s %s from %s: %d %s: %s",
                method,
                path,
                client[0],
                refused.status,
                refused.refusal.type,
                refused.refusal.message,
            )
            # a body left unread (refused before or while reading it) is never read: the
            # connection cannot be kept alive past it, so it is closed
            await self._respond(
                send, refused.status, encode_refusal(refused.refusal), close=not body_read
            )

    def _route(self, method: str, path: str) -> str:
        if path in ("/run", MUX_OPEN, MUX_RUN):
            op = path
        elif path.startswith(CONTROL_PREFIX) and path[len(CONTROL_PREFIX) :] in CONTROL_OPS:
            op = path[len(CONTROL_PREFIX) :]
        else:
            raise RefusedRequest(
                404,
                "NotFound",
                f"no route {path}: the routes are GET /health, POST /run, POST {MUX_OPEN}, "
                f"POST {MUX_RUN} and "
                f"POST {CONTROL_PREFIX}<op> with <op> in {', '.join(CONTROL_OPS)}",
            )
        if method != "POST":
            raise RefusedRequest(405, "MethodNotAllowed", f"{path} takes POST only")
        return op

    def _health(self) -> bytes:
        host = self.host
        return encode_health(
            Health(PROTOCOL, self.name, self.incarnation, not host.dead, host.topology())
        )

    # -- control plane -----------------------------------------------------------------------------

    def _check_fault(self, fault: FaultSpec | str | None, what: str) -> None:
        if fault is not None and not self.allow_faults:
            raise RefusedRequest(
                403,
                "FaultsNotAllowed",
                f"{what} carries fault {fault}: this server was not started with --allow-faults",
            )

    def _confine_args(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """The request's paths resolved inside the state root, and every path the instance
        will touch below them walked (``http/_guard`` rule 7), or ``RefusedRequest`` 403."""
        if "state_root" not in args:
            return args
        root = confine(args["state_root"], self.state_root, f"{op} state_root")
        if op == "restore":
            for p in args["record"].participants:
                what = f"restore state_dir of {p.server_name}"
                confine(str(root / p.state_dir), self.state_root, what)
                confine_below(root, f"{p.state_dir}/{RECORDS_FILE}", self.state_root, what)
        else:  # commit: <state_root>/<instance>/<participant>/records.json
            for server, _kind in self.host.participants:
                rel = f"{self.host.name}/{server}/{RECORDS_FILE}"
                confine_below(root, rel, self.state_root, f"{op} records of {server}")
        objects = commit_objects(root)  # the snapshot's objects/ (and the shared store's)
        for store in (objects.own, objects.shared):
            if store is not None:
                where = confine(str(store.root), self.state_root, f"{op} objects")
                confine_below(where, "sha256", self.state_root, f"{op} objects")
        return {**args, "state_root": str(root)}

    def _admit_control(self, op: str, body: bytes) -> tuple[ControlRequest, dict[str, Any]]:
        try:
            req = decode_control_request(op, body)
        except WireFormatError as exc:
            raise RefusedRequest(400, "BadRequest", str(exc)) from None
        self._check_fault(req.fault, f"control {op}")
        return req, self._confine_args(op, req.args)

    async def _control(
        self,
        op: str,
        req: ControlRequest,
        args: dict[str, Any],
        trainer: TrainerTerm | None,
        send: Send,
        in_parts: bool = False,
    ) -> None:
        """Answer control call ``op``; ``in_parts``: a commit the client asked to have in
        parts (``http/_parts``), encoded and sent one part per scheduler step."""
        if op != "attach":  # an attach is the takeover itself (``GymHost.attach``)
            try:
                self.host.check_trainer(trainer, op)
            except GymInUse as exc:  # nothing acted, acknowledgements included
                await self._gym_error(send, exc, op)
                return
            self._outboxes.apply_acks(req.acks)
        try:
            result = await self._call(op, req, args, trainer)
            if in_parts:
                parts = encode_commit_parts(result)
                first = next(parts)  # the head: a reply that cannot be encoded fails here
            else:
                data = encode_result(op, result)
        except Exception as exc:
            await self._gym_error(send, exc, op)
            return
        if in_parts:
            del result
            await self._respond_in_parts(send, first, parts)
        else:
            await self._respond(send, 200, data)

    async def _respond_in_parts(self, send: Send, first: bytes, parts: Iterator[bytes]) -> None:
        """A 200 answer whose body is ``first`` and then each of ``parts``, each encoded and
        sent in a scheduler step of its own, so the instance's episodes step between two. A
        part that cannot be encoded ends the body short (the client fails the commit)."""
        await send(
            {"type": "http.response.start", "status": 200, "headers": self._headers(_NDJSON)}
        )
        await send({"type": "http.response.body", "body": first, "more_body": True})
        try:
            while True:
                await trio.lowlevel.checkpoint()
                part = next(parts, None)
                if part is None:
                    break
                await send({"type": "http.response.body", "body": part, "more_body": True})
        except WireFormatError as exc:
            LOG.warning("gymckpt serve: commit on instance %s: %s", self.name, exc)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _gym_error(self, send: Send, exc: Exception, op: str) -> None:
        refusal = not isinstance(exc, GymUnavailable) and type(exc).__name__ in WIRE_ERRORS
        status = 409 if refusal else 503
        LOG.warning(
            "gymckpt serve: %s on instance %s failed: %d %s: %s",
            op,
            self.name,
            status,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        await self._respond(send, status, b'{"error":' + encode_error(exc, self.name, op) + b"}")

    async def _call(
        self, op: str, req: ControlRequest, args: Mapping[str, Any], trainer: TrainerTerm | None
    ) -> Any:
        host = self.host
        if op == "ack":
            self._outboxes.apply_acks({args["sid"]: args["upto"]})
            return None
        if op == "close_stream":
            self._outboxes.close(args["sid"], args["upto"])
            return None
        if req.fault is not None:
            await inject_fault(req.fault, self.name, op, _die)
        if op not in DEADLINE_OPS:
            await trio.lowlevel.checkpoint()
            return getattr(host, op)()
        assert req.deadline is not None  # decode_control_request requires it
        deadline_ts = req.deadline.local(trio.current_time(), time.time())
        result = await call_host(host, op, args, deadline_ts, trainer)
        if op == "attach" and result.took_over:  # the older term's streams are gone with them
            self._outboxes.forget_all()
            for channel in list(self._channels.values()):
                if channel.trainer != trainer:
                    channel.end()
        return result

    # -- data plane ------------------------------------------------------------------------------

    def _admit_run(self, body: bytes) -> RunRequest:
        try:
            req = decode_run_request(body)
        except WireFormatError as exc:
            raise RefusedRequest(400, "BadRequest", str(exc)) from None
        self._check_run(req)
        self._check_bodies()
        return req

    def _check_bodies(self) -> None:
        """Rule 11: at most ``max_streams`` long-lived bodies (``/run`` and reply channels)."""
        if self._open_streams + len(self._channels) >= self.limits.max_streams:
            raise RefusedRequest(
                429,
                "TooManyStreams",
                f"{self._open_streams} /run bodies and {len(self._channels)} reply channels "
                "open, the server's limit (--max-streams): close a stream or retry later",
            )

    def _check_run(self, req: RunRequest) -> None:
        if len(req.rows) > self.limits.max_rows:
            raise RefusedRequest(
                413,
                "TooManyRows",
                f"{len(req.rows)} rows in one /run, over the server's limit of "
                f"{self.limits.max_rows} (--max-rows): split them over several requests",
            )
        if req.shape != RunShape():
            shape = req.shape
            label = shape.inject or ("run:refuse" if shape.refuse_all else "run:drop")
            self._check_fault(label, "/run shape")
        if req.sid in self._outboxes:
            raise RefusedRequest(
                400, "BadRequest", f"stream id {req.sid} is still open here: use a fresh sid"
            )

    def _admit_mux_open(self, body: bytes) -> MuxOpenRequest:
        try:
            req = decode_mux_open(body)
        except WireFormatError as exc:
            raise RefusedRequest(400, "BadRequest", str(exc)) from None
        if req.channel in self._channels:
            raise RefusedRequest(
                400,
                "BadRequest",
                f"reply channel {req.channel} is still open here: use a fresh channel id",
            )
        self._check_bodies()
        return req

    def _admit_mux_run(self, body: bytes) -> MuxRunRequest:
        try:
            req = decode_mux_run_request(body)
        except WireFormatError as exc:
            raise RefusedRequest(400, "BadRequest", str(exc)) from None
        self._check_run(req.run)
        channel = self._channels.get(req.channel)
        if channel is None or not channel.open:
            raise RefusedRequest(
                409,
                "UnknownChannel",
                f"reply channel {req.channel} is not open here: open one with POST {MUX_OPEN} "
                "(a channel ends with its connection, a server stop or a newer trainer's attach)",
            )
        return req

    async def _mux_open(self, req: MuxOpenRequest, trainer: TrainerTerm | None, send: Send) -> None:
        try:
            self.host.check_trainer(trainer, "mux open")
        except GymInUse as exc:
            await self._gym_error(send, exc, "mux open")
            return
        channel = ReplyChannel(req.channel, trainer, self.host, self._outboxes)
        self._channels[req.channel] = channel
        try:
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(_NDJSON),
            }
            await send(start)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, self._stopping.wait, nursery.cancel_scope)
                await channel.serve(encode_mux_channel_line(req.channel), send)
                nursery.cancel_scope.cancel()
        finally:
            channel.end()
            del self._channels[req.channel]
        # ended (a newer term, the instance died, the server stops): no end line
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _admit(self, req: RunRequest, trainer: TrainerTerm | None) -> HostReplyStream:
        """A run's rows admitted on the host (``/run`` and ``/mux/v1/run`` alike): the trainer's
        term checked before its acknowledgements act, then the run's fault shape, then the
        rows; its reply stream."""
        self.host.check_trainer(trainer, "run")
        self._outboxes.apply_acks(req.acks)
        if req.shape.inject is not None:
            await inject_fault(req.shape.inject, self.name, "run", _die)
        return await self.host.run(
            req.rows,
            refuse_all=req.shape.refuse_all,
            drop_after=req.shape.drop_after,
            trainer=trainer,
        )

    async def _mux_run(self, req: MuxRunRequest, trainer: TrainerTerm | None, send: Send) -> None:
        run = req.run
        try:
            stream = await self._admit(run, trainer)
        except Exception as exc:
            await self._gym_error(send, exc, "run")
            return
        box = self._outboxes.open(run.sid, self.host, stream)
        channel = self._channels.get(req.channel)
        if channel is not None and channel.open:
            channel.start(run, box)
        else:  # the channel ended meanwhile: its client sees it end and settles the stream
            self._outboxes.finish(run.sid, box, completed=False, discard=False)
        await self._respond(send, 200, encode_batch_line(admission_header(), {}))

    async def _run(self, req: RunRequest, trainer: TrainerTerm | None, send: Send) -> None:
        self._open_streams += 1
        try:
            try:
                stream = await self._admit(req, trainer)
            except Exception as exc:
                await self._gym_error(send, exc, "run")
                return
            box = self._outboxes.open(req.sid, self.host, stream)
            await self._stream(req, box, send)
        finally:
            self._open_streams -= 1

    async def _stream(self, req: RunRequest, box: Outbox, send: Send) -> None:
        completed = False
        try:
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(_NDJSON),
            }
            await send(start)
            await send(_chunk(encode_batch_line(admission_header(), {})))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, self._stopping.wait, nursery.cancel_scope)
                completed = await self._pump(req, box, send)
                nursery.cancel_scope.cancel()
        finally:
            # not completed: the client went away (the request's scope is cancelled) or the
            # server stops; the rows run on and what was sent stays on the wire until the next
            # acks or close_stream settle it (``Outboxes.finish``)
            self._outboxes.finish(req.sid, box, completed, discard=False)
        if completed and not self.host.dead and not self._stopping.is_set():
            await send({"type": "http.response.body", "body": END_LINE, "more_body": False})
        else:  # the instance died or the server stops: the body ends without the end line
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, req: RunRequest, box: Outbox, send: Send) -> bool:
        cap = 1 if req.per_row else req.max_replies
        rows = {r.rollout_id: r.row for r in req.rows}  # a reply names its row's task
        while True:
            replies = await box.take(cap)
            if replies is None:
                return True
            if req.per_row:
                lines = [
                    encode_batch_line(ReplyBatch(box.register((r,)), (r,)), rows) for r in replies
                ]
                await send(_chunk(b"".join(lines)))
            else:
                seq = box.register(replies)
                await send(_chunk(encode_batch_line(ReplyBatch(seq, tuple(replies)), rows)))


def _trainer_of(headers: Mapping[bytes, bytes]) -> TrainerTerm | None:
    """The trainer term a request carries (``TRAINER_HEADER``), or None; 400 if malformed."""
    raw = headers.get(TRAINER_HEADER.lower().encode())
    if raw is None:
        return None
    try:
        return TrainerTerm.parse(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RefusedRequest(400, "BadRequest", f"{TRAINER_HEADER}: {exc}") from None


def _chunk(data: bytes) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": True}


def _disconnected(receive: Receive) -> Callable[[], Awaitable[None]]:
    """Returns once the client disconnected (the request body was read already)."""

    async def wait() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    return wait


async def _cancel_when(event: Callable[[], Awaitable[Any]], scope: trio.CancelScope) -> None:
    await event()
    scope.cancel()
