"""A model behind an OpenAI-compatible server (vLLM, SGLang, ``transformers serve``) as the
``model`` of an ``Environment``, reached by the episode through ``ctx.model``:

    env = Environment(agent=MyAgent(), model=openai_model(base_url="http://127.0.0.1:8000/v1",
                                                          model="Qwen/Qwen3-0.6B"))
    ...
    response = await ctx.model({"messages": [...], "tools": [...], "logprobs": True})

The agent's request is a JSON object of chat-completions parameters; the participant adds
``model``, POSTs it to ``{base_url}/chat/completions`` and returns the server's whole response
(text, tool calls, logprobs, vLLM's ``prompt_token_ids`` / ``token_ids``: nothing is dropped),
which the host captures under the call's capture key before the episode sees it.

Rules (the invariants the host relies on):

- **Infra or data.** A transport error, a timeout, a 408, a 429 or a 5xx is retried with
  exponential backoff and jitter (at most ``max_retries`` retries, each wait at most
  ``max_backoff_s``); when none is left, or the call's ``timeout_s`` has passed, the call raises
  ``ModelUnavailable``, which fails the episode as **infra** (the trainer retries the row). Any
  other 4xx raises ``ModelRequestRejected`` (a ``ValueError``: the episode fails as **data**)
  with the status and the server's message; so does a request refused here before it is sent
  (not a JSON object, ``stream: true``, another ``model``, a value that is not finite plain
  data). A 2xx whose body is not a JSON object raises ``ModelResponseInvalid`` (data).
- **Bounded.** ``timeout_s`` covers one call from the moment it holds a concurrency slot:
  connect, send, read and every retry and backoff. At most ``max_concurrency`` calls are in
  flight per event loop; a call waiting for a slot waits for calls that are each bounded.
- **Identified.** Every request carries the capture key in ``X-Gymckpt-Capture-Key``, so a
  server can log which call it answers.
- **Configuration errors stop the run.** ``ModelServerIncompatible`` and
  ``ModelResponseIncomplete`` are ``EpisodeConfigError`` errors: the server is wrong for every
  row, not for this one (a server that refuses a field, or never returns one, does so for
  every request), so the trainer stops the run at the first one (exit code 2, no row failed)
  instead of failing every row as data.
- **Required fields.** ``require=("logprobs", "token_ids")`` makes a 2xx response without
  them raise ``ModelResponseIncomplete`` (config), naming the server, the model and the field:
  ``"logprobs"`` wants each choice's ``logprobs`` not null (``transformers serve`` ignores the
  request's ``logprobs``), ``"token_ids"`` each choice's ``token_ids`` and the response's
  ``prompt_token_ids`` (vLLM's, with ``return_token_ids: true``), any other name a top-level
  key. A 422 (the server does not know a field, as FastAPI-based servers answer vLLM's
  ``return_token_ids``) raises ``ModelServerIncompatible`` (a ``ModelRequestRejected``,
  config) whose message says which field and what to do.
- **Weight version.** With ``check_weight_version=True`` a response is accepted only when it
  was answered by the weight version equal to the trainer's policy version the call was asked
  under (the host's, ``policy_version_in_force()``), read from where ``weight_version_source``
  says: ``"response"`` (SGLang: each response reports ``metadata.weight_version``, or a
  top-level ``weight_version``) or ``"engine"`` (vLLM: the engine reports its version at
  ``GET {server root}/weight_info``, ``{"weight_version": V}``, a route vLLM serves with
  ``VLLM_SERVER_DEV_MODE=1``; ``weight_info_url`` overrides where): the version is read
  before and after the call and both must equal the version in force (a call that an update
  overlapped is a mismatch), and a response that reports none of its own gets the version in
  ``metadata.weight_version``, so each captured call records the version that answered it
  either way. A response answered by another version is never
  returned (so never captured): the call is asked again with backoff, at most ``max_retries``
  times within ``timeout_s`` (``statistics().version_mismatches`` counts them, each logged),
  while the trainer brings the server back in sync (the ``on_restore`` hook of
  ``open_rollouts``); then it raises ``ModelVersionMismatch``, a ``ModelUnavailable`` (infra:
  the row is retried). A response (or ``/weight_info``) reporting no version raises
  ``ModelResponseIncomplete``; a server without the ``/weight_info`` route (a 4xx there)
  raises ``ModelServerIncompatible``.

``api="responses"`` POSTs to ``{base_url}/responses`` (the Responses API) instead, by the
same rules; the request is then a JSON object of Responses parameters (``input``, ...).

Client lifetime: one ``httpx.AsyncClient`` (one connection pool) per event loop, made on the
loop's first call, because a pool's connections belong to the loop that opened them. Under trio
(the Gym host always runs episodes under trio, embedded or in a Ray actor's guest run) it is
closed by a system task of the run when the run ends; under plain asyncio by a task of the loop,
which ``asyncio.run`` cancels when it ends. ``await model.aclose()`` (or ``async with model``)
closes the current loop's client earlier; a later call opens a new one. So no client or task
outlives its loop, and the participant itself holds no open resource while unused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import weakref
from typing import Any, Final, final

import anyio
import attrs
import httpx
import orjson
import sniffio
import trio

from gymckpt.gym_adapter import (
    EpisodeConfigError,
    EpisodeInfo,
    ModelUnavailable,
    policy_version_in_force,
)
from gymckpt.runtime.lowlevel import checked_json

__all__ = [
    "CAPTURE_KEY_HEADER",
    "ModelRequestRejected",
    "ModelResponseIncomplete",
    "ModelResponseInvalid",
    "ModelServerIncompatible",
    "ModelVersionMismatch",
    "OpenAIModel",
    "OpenAIModelStatistics",
    "openai_model",
]

CAPTURE_KEY_HEADER: Final = "X-Gymckpt-Capture-Key"
"""The request header that carries the call's capture key."""

LOGGER: Final = logging.getLogger("gymckpt.model")
_RETRYABLE: Final = frozenset({408, 429})


class ModelRequestRejected(ValueError):
    """The server refused the request with a 4xx (``status``; ``server_message`` is its
    error message), or it was refused here before it was sent (``status`` None). The episode
    fails as data: the same request would be refused again."""

    def __init__(
        self, message: str, status: int | None = None, server_message: str | None = None
    ) -> None:
        super().__init__(message, status, server_message)
        self.status = status
        self.server_message = server_message

    def __str__(self) -> str:
        return str(self.args[0])


class ModelResponseInvalid(ValueError):
    """The server answered 2xx with a body that is not a JSON object (or is over
    ``max_response_bytes``). The episode fails as data."""


class ModelResponseIncomplete(ModelResponseInvalid, EpisodeConfigError):
    """A 2xx response lacks a field the participant was told to require (``require=``, or the
    weight version with ``check_weight_version``). A configuration error
    (``EpisodeConfigError``): a server that does not return the field returns it for no
    request, so the run stops at the first one; the message names the server and the field."""


class ModelServerIncompatible(ModelRequestRejected, EpisodeConfigError):
    """The server does not serve what this participant is configured to ask: it answered 422
    (a field it does not know, such as vLLM's ``return_token_ids`` on ``transformers
    serve``), or a 4xx at its ``/weight_info`` route (``weight_version_source="engine"``). A
    configuration error (``EpisodeConfigError``): every such request is refused, so the run
    stops at the first one, and the message says what to change."""


class ModelVersionMismatch(ModelUnavailable):
    """Every attempt was answered by another weight version than the policy version in force
    (the server was not brought back in sync); infra, so the row is retried."""


@attrs.frozen
class OpenAIModelStatistics:
    """Counts since the participant was made: ``calls`` asked, ``attempts`` sent (a retry is
    an attempt), ``retries``, ``unavailable`` (raised ``ModelUnavailable``), ``rejected``
    (``ModelRequestRejected`` or ``ModelResponseInvalid``), ``in_flight`` now,
    ``version_mismatches`` (responses refused for their weight version)."""

    calls: int
    attempts: int
    retries: int
    unavailable: int
    rejected: int
    in_flight: int
    version_mismatches: int = 0


@attrs.define(eq=False, slots=True)
class _LoopClient:
    """The client and the concurrency slots of one event loop; ``closer`` ends the task that
    closes them at the loop's end."""

    client: httpx.AsyncClient
    slots: anyio.Semaphore
    closer: Any = None


def _strip_slash(url: str) -> str:
    return str(url).rstrip("/")


def _positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"openai_model: {attribute.name} must be > 0, got {value!r}")


@final
@attrs.define(eq=False, slots=True, kw_only=True)
class OpenAIModel:
    """An OpenAI-compatible chat-completions model (see the module docstring); a ``Model``:
    ``await model(capture_key, request, info)`` returns the server's response JSON object."""

    base_url: str = attrs.field(converter=_strip_slash)
    model: str
    api_key: str | None = attrs.field(default=None, repr=False)
    timeout_s: float = attrs.field(default=120.0, validator=_positive)
    max_concurrency: int = attrs.field(default=64, validator=_positive)
    max_retries: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    backoff_s: float = attrs.field(default=0.5, validator=_positive)
    max_backoff_s: float = attrs.field(default=8.0, validator=_positive)
    max_response_bytes: int = attrs.field(default=64 << 20, validator=_positive)
    api: str = attrs.field(default="chat", validator=attrs.validators.in_(("chat", "responses")))
    headers: dict[str, str] = attrs.field(factory=dict, converter=dict)
    require: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    check_weight_version: bool = False
    weight_version_source: str = attrs.field(
        default="response", validator=attrs.validators.in_(("response", "engine"))
    )
    weight_info_url: str | None = None
    _trio_clients: trio.lowlevel.RunVar[_LoopClient | None] = attrs.field(init=False)
    _asyncio_clients: weakref.WeakKeyDictionary[Any, _LoopClient] = attrs.field(
        init=False, factory=weakref.WeakKeyDictionary
    )
    _random: random.Random = attrs.field(init=False, factory=random.Random)
    _counts: dict[str, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"openai_model: base_url must be http(s)://…, got {self.base_url!r}")
        for name in self.require:
            if not isinstance(name, str) or not name:
                raise ValueError(f"openai_model: require names fields, got {name!r}")
        if self.weight_info_url is not None and not str(self.weight_info_url).startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"openai_model: weight_info_url must be http(s)://…, got {self.weight_info_url!r}"
            )
        self._trio_clients = trio.lowlevel.RunVar(f"gymckpt_openai_{id(self)}", default=None)

    def statistics(self) -> OpenAIModelStatistics:
        c = self._counts
        names: tuple[str, ...] = ("calls", "attempts", "retries", "unavailable", "rejected")
        names += ("in_flight", "version_mismatches")
        return OpenAIModelStatistics(*(c.get(n, 0) for n in names))

    def _count(self, name: str, n: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + n

    # -- the call ---------------------------------------------------------------------------

    async def __call__(
        self, capture_key: str, request: Any, info: EpisodeInfo | None = None
    ) -> dict[str, Any]:
        self._count("calls")
        body = self._body(capture_key, request)
        loop = self._loop_client()
        async with loop.slots:
            self._count("in_flight")
            try:
                return await self._bounded(loop.client, capture_key, body)
            finally:
                self._count("in_flight", -1)

    def _body(self, key: str, request: Any) -> bytes:
        where = f"model request {key}"
        if not isinstance(request, dict):
            self._count("rejected")
            raise ModelRequestRejected(
                f"{where}: a request is a JSON object (a dict of {self.api} parameters), got "
                f"{type(request).__name__}"
            )
        if request.get("stream"):
            self._count("rejected")
            raise ModelRequestRejected(
                f"{where}: 'stream': true is not supported (a captured response is one JSON "
                "object); leave 'stream' out"
            )
        asked = request.get("model", self.model)
        if asked != self.model:
            self._count("rejected")
            raise ModelRequestRejected(
                f"{where}: asks for model {asked!r}, this participant serves {self.model!r}"
            )
        try:
            return checked_json({**request, "model": self.model}, "request")
        except ValueError as exc:
            self._count("rejected")
            raise ModelRequestRejected(f"{where}: {exc}") from None

    async def _bounded(self, client: httpx.AsyncClient, key: str, body: bytes) -> dict[str, Any]:
        last: list[str] = ["no attempt finished"]
        with anyio.move_on_after(self.timeout_s) as scope:
            if not self.check_weight_version:
                return self._required(key, await self._attempts(client, key, body, last))
            return await self._in_version(client, key, body, last)
        assert scope.cancelled_caught
        self._count("unavailable")
        if last[0].startswith("weight version"):
            raise ModelVersionMismatch(
                f"model {self.model!r} at {self.base_url}: call {key}: {last[0]} until "
                f"timeout_s={self.timeout_s:g}s: bring the server to the trainer's weights "
                "(open_rollouts(on_restore=...) after a restore)"
            )
        raise ModelUnavailable(
            f"model {self.model!r} at {self.base_url}: call {key} got no answer within "
            f"timeout_s={self.timeout_s:g}s (last: {last[0]})"
        )

    async def _in_version(
        self, client: httpx.AsyncClient, key: str, body: bytes, last: list[str]
    ) -> dict[str, Any]:
        """The response answered by the policy version in force; a response of another
        version is dropped (never returned, so never captured) and the call asked again."""
        expected = policy_version_in_force()
        for attempt in range(self.max_retries + 1):
            response, served = await self._versioned(client, key, body, last, expected)
            if response is not None and (expected is None or served == str(expected)):
                return response
            self._count("version_mismatches")
            last[0] = f"weight version {served} answered, policy version {expected} in force"
            LOGGER.warning("model call %s: %s, asking again", key, last[0])
            await anyio.sleep(self._backoff(attempt, None))
        self._count("unavailable")
        raise ModelVersionMismatch(
            f"model {self.model!r} at {self.base_url}: call {key}: {last[0]} in "
            f"{self.max_retries + 1} attempts: bring the server to the trainer's weights "
            "(open_rollouts(on_restore=...) after a restore)"
        )

    async def _versioned(
        self,
        client: httpx.AsyncClient,
        key: str,
        body: bytes,
        last: list[str],
        expected: int | None,
    ) -> tuple[dict[str, Any] | None, str]:
        """One try: the response (None: not asked, the engine holds another version) and the
        version that answered it, read where ``weight_version_source`` says."""
        if self.weight_version_source == "response":
            response = self._required(key, await self._attempts(client, key, body, last))
            served = _weight_version(response)
            if served is None:
                self._count("rejected")
                raise ModelResponseIncomplete(
                    f"model {self.model!r} at {self.base_url}: call {key}: the response reports "
                    "no weight version (metadata.weight_version), and check_weight_version is "
                    "on: serve with an engine that reports it, use "
                    'weight_version_source="engine" for vLLM, or turn the check off'
                )
            return response, served
        before = await self._engine_version(client, key, last)
        if expected is not None and before != str(expected):
            return None, before  # not asked: the engine holds other weights
        response = self._required(key, await self._attempts(client, key, body, last))
        after = await self._engine_version(client, key, last)
        if after != before:
            return response, f"{before} then {after} (an update during the call)"
        if _weight_version(response) is None:  # the captured call records who answered
            metadata = response.setdefault("metadata", {})
            if isinstance(metadata, dict):
                metadata["weight_version"] = after
        return response, after

    async def _engine_version(self, client: httpx.AsyncClient, key: str, last: list[str]) -> str:
        """The engine's weight version now (``GET weight_info_url``, retried as a call is)."""
        url = self.weight_info_url or f"{self.base_url.removesuffix('/v1')}/weight_info"
        info = await self._attempts(client, key, None, last, url=url)
        value = info.get("weight_version")
        if value is None:
            self._count("rejected")
            raise ModelResponseIncomplete(
                f"model {self.model!r}: GET {url} reports no weight_version ({info!r}), and "
                'check_weight_version is on with weight_version_source="engine": serve vLLM '
                "with VLLM_SERVER_DEV_MODE=1, or set weight_info_url to where the engine "
                "reports its version"
            )
        return str(value)

    def _required(self, key: str, response: dict[str, Any]) -> dict[str, Any]:
        """``response`` if it has every ``require``d field, else ``ModelResponseIncomplete``."""
        for name in self.require:
            if not _has_field(response, name):
                self._count("rejected")
                raise ModelResponseIncomplete(
                    f"model {self.model!r} at {self.base_url}: call {key}: the response has no "
                    f"{name!r} (required by require={self.require!r}); this server does not "
                    f"return it: ask for it in the request, or serve with an engine that does"
                )
        return response

    async def _attempts(
        self,
        client: httpx.AsyncClient,
        key: str,
        body: bytes | None,
        last: list[str],
        url: str | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` to the API (or GET ``url`` when ``body`` is None), retried by the
        rules of the module docstring; the response's JSON object."""
        if url is None:
            path = "responses" if self.api == "responses" else "chat/completions"
            url = f"{self.base_url}/{path}"
        headers = {**self.headers, "Content-Type": "application/json", CAPTURE_KEY_HEADER: key}
        token = self.api_key if self.api_key is not None else os.environ.get("OPENAI_API_KEY")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        wait = 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
                LOGGER.warning(
                    "model call %s: attempt %d failed (%s), retrying", key, attempt, last[0]
                )
                await anyio.sleep(wait)
            self._count("attempts")
            try:
                status, data, retry_after = await self._send(client, url, headers, body)
            except httpx.TransportError as exc:
                last[0] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                wait = self._backoff(attempt, None)
                continue
            if status >= 500 or status in _RETRYABLE:
                last[0] = f"HTTP {status}: {_server_message(data)}"
                wait = self._backoff(attempt, retry_after)
                continue
            if not 200 <= status < 300:
                self._count("rejected")
                message = _server_message(data)
                if body is None:
                    raise ModelServerIncompatible(
                        f"model {self.model!r}: GET {url} (call {key}) answered HTTP {status}: "
                        f"{message}: the server does not report its engine's weight version "
                        'there (weight_version_source="engine"): serve vLLM with '
                        "VLLM_SERVER_DEV_MODE=1, set weight_info_url, or use "
                        'weight_version_source="response" with an engine that reports it',
                        status,
                        message,
                    )
                if status == 422:
                    raise ModelServerIncompatible(
                        f"model {self.model!r} at {url} refused call {key}: HTTP 422: {message}: "
                        "the server does not accept this request's shape (a field it does not "
                        "know, such as vLLM's 'return_token_ids'): leave that field out for "
                        "this server, or serve with an engine that takes it",
                        status,
                        message,
                    )
                raise ModelRequestRejected(
                    f"model {self.model!r} at {url} refused call {key}: HTTP {status}: {message}",
                    status,
                    message,
                )
            return self._response(key, status, data)
        self._count("unavailable")
        raise ModelUnavailable(
            f"model {self.model!r} at {url}: call {key} failed {self.max_retries + 1} attempts "
            f"(last: {last[0]})"
        )

    async def _send(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes, float | None]:
        """One attempt (a POST of ``body``, a GET when it is None): the status, the body (at
        most ``max_response_bytes`` + 1 read) and the server's ``Retry-After`` in seconds."""
        method = "GET" if body is None else "POST"
        async with client.stream(method, url, content=body, headers=headers) as response:
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_response_bytes:
                    break
            try:
                retry_after = float(response.headers.get("retry-after", ""))
            except ValueError:
                retry_after = None
            return response.status_code, b"".join(chunks), retry_after

    def _response(self, key: str, status: int, data: bytes) -> dict[str, Any]:
        where = f"model {self.model!r} at {self.base_url}: call {key}: HTTP {status} body"
        if len(data) > self.max_response_bytes:
            self._count("rejected")
            raise ModelResponseInvalid(
                f"{where} is over max_response_bytes={self.max_response_bytes}"
            )
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            self._count("rejected")
            raise ModelResponseInvalid(f"{where} is not JSON ({exc}): {data[:200]!r}") from None
        if not isinstance(value, dict):
            self._count("rejected")
            raise ModelResponseInvalid(f"{where} is a JSON {type(value).__name__}, not an object")
        return value

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential from ``backoff_s`` with jitter (between half and all of it), at least
        the server's ``Retry-After``, at most ``max_backoff_s``."""
        base = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        wait = base * (0.5 + 0.5 * self._random.random())
        if retry_after is not None and retry_after > wait:
            wait = retry_after
        return min(wait, self.max_backoff_s)

    # -- the client's lifetime ----------------------------------------------------------------

    def _new_client(self) -> _LoopClient:
        limits = httpx.Limits(
            max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
        )
        client = httpx.AsyncClient(timeout=None, limits=limits, follow_redirects=False)
        return _LoopClient(client, anyio.Semaphore(self.max_concurrency))

    def _loop_client(self) -> _LoopClient:
        if sniffio.current_async_library() == "trio":
            have = self._trio_clients.get()
            if have is None:
                have = self._new_client()
                self._trio_clients.set(have)
                trio.lowlevel.spawn_system_task(
                    self._close_at_end, have, name="gymckpt: openai_model client"
                )
            return have
        loop = asyncio.get_running_loop()
        have = self._asyncio_clients.get(loop)
        if have is None:
            have = self._new_client()
            self._asyncio_clients[loop] = have
            have.closer = loop.create_task(self._close_at_end(have))
        return have

    async def _close_at_end(self, have: _LoopClient) -> None:
        """Sleep until the loop ends (or ``aclose``), then close ``have``'s client."""
        try:
            if sniffio.current_async_library() == "trio":
                with trio.CancelScope() as scope:
                    have.closer = scope
                    await trio.sleep_forever()
            else:
                await asyncio.Event().wait()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await have.client.aclose()
                except Exception as exc:  # a system task must not fail the run
                    LOGGER.warning("openai_model: closing the client failed: %r", exc)

    async def aclose(self) -> None:
        """Close the current event loop's client now (a later call opens a new one)."""
        if sniffio.current_async_library() == "trio":
            have = self._trio_clients.get()
            self._trio_clients.set(None)
        else:
            have = self._asyncio_clients.pop(asyncio.get_running_loop(), None)
        if have is not None:
            if have.closer is not None:
                have.closer.cancel()
            await have.client.aclose()

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _weight_version(response: dict[str, Any]) -> str | None:
    """The weight version a response reports (SGLang's ``metadata.weight_version``, else a
    top-level ``weight_version``) as a string; None when it reports none."""
    metadata = response.get("metadata")
    value = metadata.get("weight_version") if isinstance(metadata, dict) else None
    if value is None:
        value = response.get("weight_version")
    return None if value is None else str(value)


def _has_field(response: dict[str, Any], name: str) -> bool:
    """Whether ``response`` carries required field ``name`` (see the module docstring)."""
    choices = response.get("choices")
    if name in ("logprobs", "token_ids"):
        if not isinstance(choices, list) or not choices:
            return False
        if not all(isinstance(c, dict) and c.get(name) is not None for c in choices):
            return False
        return name != "token_ids" or response.get("prompt_token_ids") is not None
    return response.get(name) is not None


def _server_message(data: bytes) -> str:
    """The server's error message: OpenAI's ``{"error": {"message": …}}``, FastAPI's
    ``{"detail": "…"}`` or its validation errors ``{"detail": [{"loc": […], "msg": "…"}, …]}``
    (``body.messages: Field required``, joined by ``; ``), else the body (its first 300
    bytes)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:300].decode("utf-8", "replace") or "(empty body)"
    if isinstance(value, dict):
        if "error" not in value and "detail" in value:
            detail = _detail_message(value["detail"])
            if detail:
                return detail
        error = value.get("error", value)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return data[:300].decode("utf-8", "replace")


def _detail_message(detail: object) -> str | None:
    """FastAPI's ``detail``: a string, an object with a ``message`` or ``msg``, or a list of
    validation errors (each ``{"loc": [...], "msg": ...}``); None for another shape."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, dict):
        for key in ("message", "msg"):
            if isinstance(detail.get(key), str):
                return str(detail[key])
        return None
    if isinstance(detail, list) and detail:
        parts = []
        for item in detail:
            if not isinstance(item, dict) or not isinstance(item.get("msg"), str):
                return None
            loc = item.get("loc")
            where = ".".join(str(p) for p in loc) if isinstance(loc, list) and loc else ""
            parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
        return "; ".join(parts)[:300]
    return None


openai_model: Final = OpenAIModel
"""``openai_model(base_url=..., model=..., api_key=None, timeout_s=120, max_concurrency=64,
max_retries=4, backoff_s=0.5, max_backoff_s=8, max_response_bytes=64 MiB, headers={},
api="chat", require=(), check_weight_version=False, weight_version_source="response",
weight_info_url=None)``: the
``model`` of an ``Environment`` served by an OpenAI-compatible server at ``base_url``
(``http://127.0.0.1:8000/v1`` for ``vllm serve MODEL --port 8000``). ``api_key`` is sent as a
bearer token (default ``$OPENAI_API_KEY``; none when that is unset too, as local servers want);
``headers`` go with every request. The same class as ``OpenAIModel``."""
