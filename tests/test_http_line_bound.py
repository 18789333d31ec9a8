"""The trainer's bound on one line of a streamed answer (``NdjsonBody``, ``MAX_LINE_BYTES``):
a server that sends a line without its end is refused once the line passes the bound, with the
buffer emptied, never grown further; a ``/run`` stream or a reply channel whose line is refused
makes the instance unavailable for that stream (``GymCheckpointUnavailable`` naming the bound),
and the same server serves the next rows.

A real socket server in the test sends the endless line; real ``gymckpt serve`` processes on
loopback serve the streams and a commit's parts. Every wait is under ``trio.fail_after``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from test_http_backend import deadline, drain, http_gym, rows

from gymckpt.gym_adapter import Completed
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.gym_adapter.transports.http import _stream as http_stream
from gymckpt.gym_adapter.transports.http._stream import MAX_LINE_BYTES, LineTooLong, NdjsonBody
from gymckpt.runtime import CheckpointMode, GymCheckpointUnavailable

pytestmark = [pytest.mark.http, pytest.mark.timeout(120)]

CHUNK = 16 * 1024
"""What the endless server writes at a time (the client may join several into one read)."""
STILL = CalendarConfig(turns=(2, 2), turn_s=(120.0, 120.0), mutation_p=1.0)
"""Episodes whose turns outlast the test: a commit finds them all in flight."""


LINE_SENT = 4 << 20
"""What the endless server writes before it waits, the line still open (so a client without
a bound waits forever with 4 MiB buffered, rather than filling the machine's memory)."""


async def endless_line(stream: trio.SocketStream, sent: list[int]) -> None:
    """Answer one request with a 200 NDJSON body that is one line without an end: ``LINE_SENT``
    bytes, then nothing, the connection held open until the client goes away; ``sent[0]``: the
    bytes of the line written so far."""
    request = b""
    while b"\r\n\r\n" not in request:
        data = await stream.receive_some()
        if not data:
            return
        request += data
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n"
    )
    with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
        while sent[0] < LINE_SENT:
            await stream.send_all(b"x" * CHUNK)
            sent[0] += CHUNK
        while await stream.receive_some():  # until the client closes the connection
            pass
        raise trio.BrokenResourceError


async def test_an_endless_line_is_refused_at_the_bound_and_the_buffer_emptied() -> None:
    bound = 256 * 1024
    sent = [0]
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, lambda s: endless_line(s, sent), 0)
        port = listeners[0].socket.getsockname()[1]
        url = f"http://127.0.0.1:{port}/run"
        with trio.fail_after(10):
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", url, content=b"{}") as response:
                    body = NdjsonBody(response, max_line_bytes=bound)
                    with pytest.raises(LineTooLong) as refused:
                        await body.next_line()
                    assert body.buffered == 0  # what was read is let go at once
                    with pytest.raises(LineTooLong):  # and the body is not read further
                        await body.next_line()
                    await body.aclose()
        nursery.cancel_scope.cancel()
    exc = refused.value
    assert exc.bound == bound
    # refused at the first chunk past the bound: the client read at most one read's worth more
    assert bound < exc.size <= bound + 64 * 1024, exc.size
    message = str(exc)
    assert f"bound of {bound} bytes per line" in message
    assert url in message, message
    assert sent[0] > bound


async def test_a_line_that_ends_over_the_bound_is_refused_and_one_at_it_is_read() -> None:
    async def two_lines(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-length: 19\r\nconnection: close\r\n\r\n"
            b"12345678\n123456789\n"
        )

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, two_lines, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(30):
            async with httpx.AsyncClient() as client:
                async with client.stream("GET", f"http://127.0.0.1:{port}/") as response:
                    body = NdjsonBody(response, max_line_bytes=8)
                    assert await body.next_line() == b"12345678"
                    with pytest.raises(LineTooLong) as refused:
                        await body.next_line()
                    await body.aclose()
        nursery.cancel_scope.cancel()
    assert refused.value.size == 9


def test_the_default_bound_holds_a_full_batch_of_the_largest_default_payloads() -> None:
    """1,024 replies (``max_batch_replies``) of 1 MiB payloads (``max_payload_bytes``) fit."""
    assert MAX_LINE_BYTES >= 1024 * (1 << 20) * 2
    with pytest.raises(ValueError, match="max_line_bytes must be >= 1"):
        NdjsonBody(httpx.Response(200), max_line_bytes=0)


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "run"])
async def test_a_reply_line_over_the_bound_makes_the_stream_unavailable_and_the_server_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, multiplex: bool
) -> None:
    """A bound under the size of a reply batch (but over the admission header and the channel
    line): the stream raises ``GymCheckpointUnavailable`` naming the bound, as for any bad
    line; with the bound back, the same server completes new rows (nothing was corrupted)."""
    async with http_gym(tmp_path, multiplex=multiplex) as gym:
        with trio.fail_after(60):
            monkeypatch.setattr(http_stream, "MAX_LINE_BYTES", 100)
            stream = await gym.run("gym-0", rows(3))
            with pytest.raises(GymCheckpointUnavailable) as refused:
                await drain(stream)
            await stream.aclose()
            assert "over the trainer's bound of 100 bytes per line" in str(refused.value)
            assert refused.value.args[1:] == ("gym-0", "run")
            monkeypatch.undo()
            replies = await drain(await gym.run("gym-0", rows(3, start=10)))
            assert sorted(r.rollout_id for r in replies) == sorted(
                r.rollout_id for r in rows(3, start=10)
            )
            assert all(isinstance(r, Completed) for r in replies)


async def test_a_commit_part_over_the_bound_fails_the_commit_retryably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit answered in parts whose line passes the bound is ``GymCheckpointUnavailable``
    naming it (a checkpoint failure that changed nothing); with the bound back, the same cut
    commits."""
    async with http_gym(tmp_path, config=STILL) as gym:
        with trio.fail_after(60):
            stream = await gym.run("gym-0", rows(4))
            await gym.prepare("gym-0", "c1", deadline(30), CheckpointMode.UNALIGNED)
            assert gym._endpoints["gym-0"].parts
            monkeypatch.setattr(http_stream, "MAX_LINE_BYTES", 100)
            with pytest.raises(GymCheckpointUnavailable, match="bound of 100 bytes per line"):
                await gym.commit("gym-0", "c1", str(tmp_path / "s1"), deadline(30))
            monkeypatch.undo()
            reply = await gym.commit("gym-0", "c1", str(tmp_path / "s2"), deadline(30))
            assert len(reply.exported) == 4
            del stream
