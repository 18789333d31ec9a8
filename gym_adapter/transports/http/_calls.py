"""One HTTP exchange with a ``gymckpt serve`` process, as ``HttpGym`` makes it: the request body,
and what an answer that is not a result means.

A request body goes through a plain iterator (``post_request``): httpx's own body streams are
async generators, and a connection that breaks while sending would leave one half-iterated for
the garbage collector (a ``ResourceWarning`` under trio, an error under the tests' warning
filter). A non-200 answer (``answer_error``) is a Gym error crossing as its class (409/503 with
the wire error: ``_wire.decode_error``), or a refusal of the request (4xx, the server changed
nothing): ``GymControlError`` saying why, retryable like every control-plane refusal; a body
that is neither is ``GymCheckpointUnavailable``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import final

import httpx

from gymckpt.runtime import GymCheckpointUnavailable, GymControlError, TrainerTerm

from .._errors import first_line, remote_error
from ._wire import (
    EXPECT_INCARNATION_HEADER,
    TRAINER_HEADER,
    Refusal,
    WireFormatError,
    decode_error_body,
)

__all__ = ["answer_error", "post_request"]


@final
class _Body(httpx.AsyncByteStream):
    """A request body of ``data``, sent in one piece through a plain iterator. (httpx's own
    body streams are async generators, and a connection that breaks while sending leaves one
    half-iterated for the garbage collector: a ``ResourceWarning`` under trio.)"""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self._data)


@final
class _Once:
    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        return data


def post_request(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    incarnation: str,
    trainer: TrainerTerm | None = None,
) -> httpx.Request:
    """A ``POST url`` of the JSON ``body``, meant for server incarnation ``incarnation``, from
    ``trainer`` (its term, once it attached)."""
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        EXPECT_INCARNATION_HEADER: incarnation,
    }
    if trainer is not None:
        headers[TRAINER_HEADER] = trainer.header()
    request = client.build_request("POST", url, headers=headers)
    request.stream = _Body(body)
    return request


def answer_error(instance: str, op: str, response: httpx.Response) -> Exception:
    """The runtime's error for ``response``, a non-200 answer to ``op`` on ``instance``."""
    status = response.status_code
    try:
        decoded = decode_error_body(response.content)
    except WireFormatError as exc:
        return GymCheckpointUnavailable(
            f"instance {instance} {op}: HTTP {status} with a body that is not a gymckpt error "
            f"({exc})",
            instance,
            op,
        )
    if isinstance(decoded, Refusal):
        return GymControlError(
            instance,
            op,
            f"the server refused the request (HTTP {status} {decoded.type}): {decoded.message}",
        )
    return remote_error(decoded, first_line(decoded), instance, op)
