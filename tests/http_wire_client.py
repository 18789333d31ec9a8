"""A bare client of ``gymckpt-http/2`` for the server's tests (not ``HttpGym``): one call per
function, the wire encoded and decoded with ``_http_wire``, no retries, no bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import trio

from gymckpt.gym_adapter._contract import RunReply, RunRow
from gymckpt.gym_adapter.transports._admission import ReplyBatch, RunShape
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports.http._wire import (
    RunRequest,
    decode_error_body,
    decode_result,
    decode_stream_line,
    encode_control_request,
    encode_run_request,
)
from gymckpt.runtime import rollout_id_for

__all__ = ["RemoteError", "control", "control_raw", "rows", "run_to_end", "state"]


class RemoteError(Exception):
    """A non-200 answer: its status and the decoded body (a Gym error or a ``Refusal``)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status, body)
        self.status, self.body = status, body


def rows(n: int, start: int = 0, task: Any = None) -> tuple[RunRow, ...]:
    return tuple(
        RunRow(rollout_id_for(r, 0, 0), r, 0, 0, task=task) for r in range(start, start + n)
    )


def deadline(seconds: float = 10.0) -> WireDeadline:
    return WireDeadline.send(trio.current_time() + seconds, trio.current_time(), time.time())


async def control_raw(
    client: httpx.AsyncClient,
    op: str,
    args: Mapping[str, Any] | None = None,
    *,
    acks: Mapping[int, int] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> httpx.Response:
    body = encode_control_request(op, deadline=deadline(timeout_s), acks=acks or {}, args=args)
    return await client.post(f"/control/v1/{op}", content=body, headers=headers)


async def control(
    client: httpx.AsyncClient,
    op: str,
    args: Mapping[str, Any] | None = None,
    *,
    acks: Mapping[int, int] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """The result of ``op``, or ``RemoteError``."""
    resp = await control_raw(client, op, args, acks=acks, headers=headers)
    if resp.status_code != 200:
        raise RemoteError(resp.status_code, decode_error_body(resp.content))
    return decode_result(op, resp.content)


async def state(client: httpx.AsyncClient) -> tuple[Any, Any]:
    """What the instance holds: its inventory and retained sessions."""
    return await control(client, "inventory"), await control(client, "retained_sessions")


async def run_to_end(
    client: httpx.AsyncClient,
    sid: int,
    batch: Sequence[RunRow],
    *,
    per_row: bool = False,
    max_replies: int = 64,
    shape: RunShape | None = None,
    acks: Mapping[int, int] | None = None,
) -> tuple[list[ReplyBatch], bool, list[RunReply]]:
    """``POST /run`` read to its end: the batches (header first), whether the end line came,
    and every reply."""
    req = RunRequest(sid, dict(acks or {}), shape or RunShape(), per_row, max_replies, tuple(batch))
    batches: list[ReplyBatch] = []
    ended = False
    async with client.stream("POST", "/run", content=encode_run_request(req)) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RemoteError(resp.status_code, decode_error_body(resp.content))
        assert resp.headers["content-type"] == "application/x-ndjson"
        async for line in resp.aiter_lines():
            if not line:
                continue
            assert not ended, "a line after the end line"
            got = decode_stream_line(line.encode())
            if got is None:
                ended = True
            else:
                batches.append(got)
    return batches, ended, [r for b in batches for r in b.replies]
