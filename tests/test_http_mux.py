"""Reply channels (``/mux/v1``) against real ``gymckpt serve`` processes on loopback: many
streams in flight over a bounded number of connections, each reply routed to its own stream and
acknowledged, a checkpoint in both modes exactly once, a SIGKILLed server with channels open,
the fallback to ``/run`` for a server that does not offer them, the server's refusals, and the
client's decoding in slices (no step of the loop converts more than ``DECODE_SLICE`` replies).

Real time for the servers (other processes); every wait is on a condition under
``trio.fail_after``.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import psutil
import pytest
import trio
from test_http_backend import deadline, drain, http_gym, rows

from gymckpt.gym_adapter import Completed, GymInstanceDead, RunRow
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.gym_adapter.transports._admission import ReplyBatch, RunShape
from gymckpt.gym_adapter.transports.http import _gym as http_gym_module
from gymckpt.gym_adapter.transports.http import _mux as http_mux
from gymckpt.gym_adapter.transports.http._mux import DECODE_SLICE, HttpMuxStream, MuxChannel
from gymckpt.gym_adapter.transports.http._stream import HttpReplyStream
from gymckpt.gym_adapter.transports.http._wire import (
    FEATURES_HEADER,
    MUX_FEATURE,
    MuxOpenRequest,
    MuxRunRequest,
    RunRequest,
    decode_mux_line,
    encode_mux_batch_line,
    encode_mux_channel_line,
    encode_mux_end_line,
    encode_mux_open,
    encode_mux_run_request,
)
from gymckpt.runtime import rollout_id_for
from gymckpt.testing import check_backend
from gymckpt.testing._http_serve_process import serve_process

pytestmark = [pytest.mark.http, pytest.mark.timeout(240)]

LONG = CalendarConfig(turns=(6, 6), turn_s=(0.25, 0.25), mutation_p=0.0)  # 1.5 s per episode
UNEVEN = CalendarConfig(turns=(2, 10), turn_s=(0.1, 0.3), mutation_p=0.0)
"""Episodes of 0.2-3 s: groups finish in another order than they were submitted, so replies of
many groups are on a channel at once."""


def group(g: int, size: int) -> list[RunRow]:
    """Group ``g`` of ``size`` rows (slots), as a GRPO trainer dispatches them."""
    return [RunRow(rollout_id_for(g, s, 0), g, s, 0) for s in range(size)]


def sockets_to(port: int) -> int:
    """This process's TCP connections to ``port`` (every state but listening)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status != psutil.CONN_LISTEN
    )


# -- bounded connections, routing, acknowledgement ------------------------------------------


async def test_many_groups_in_flight_over_one_server_use_a_bounded_number_of_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """48 groups of 4 in flight on one server, with at most 2 submission and 2 control
    connections and 2 reply channels: the client never holds more than 2 + 2 + 2 * 2 sockets
    to the server (a ``/run`` per group held 48), every stream gets exactly its own group's
    replies, and once drained every reply is acknowledged (nothing on the wire), with at most
    one ``ack`` call on its way at a time (it carries every acknowledgement recorded)."""
    groups, size = 48, 4
    bound = 2 + 2 + 2 * 2
    async with http_gym(
        tmp_path,
        config=UNEVEN,
        max_streams=2,
        max_control_connections=2,
        channels_per_instance=2,
    ) as gym:
        port = int(gym.url("gym-0").rsplit(":", 1)[1])
        acks_on_their_way = most_acks = sent_acks = 0
        real_ack = gym._ack

        async def ack(*args: Any) -> None:
            nonlocal acks_on_their_way, most_acks, sent_acks
            acks_on_their_way += 1
            sent_acks += 1
            most_acks = max(most_acks, acks_on_their_way)
            try:
                await real_ack(*args)
            finally:
                acks_on_their_way -= 1

        monkeypatch.setattr(gym, "_ack", ack)
        streams: list[Any] = []
        most = 0
        with trio.fail_after(60):
            for g in range(groups):
                streams.append(await gym.run("gym-0", group(g, size)))
                most = max(most, sockets_to(port))
        assert all(isinstance(s, HttpMuxStream) for s in streams)
        inv = await gym.inventory("gym-0")
        # every stream is open (none read yet): each would hold a connection over /run
        assert len(inv.running) + len(inv.on_wire) == groups * size
        got: dict[int, list[str]] = {}

        async def consume(g: int, stream: Any) -> None:
            nonlocal most
            got[g] = [r.rollout_id for r in await drain(stream)]
            most = max(most, sockets_to(port))

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for g, stream in enumerate(streams):
                    nursery.start_soon(consume, g, stream)
        assert most <= bound, f"{most} sockets to the server, bound {bound}"
        assert sent_acks >= 1 and most_acks == 1  # one ack on its way at a time, carrying all
        channels = gym.channel_statistics()
        assert channels.opened == 2 and channels.alive == 2
        assert 0 < channels.largest_step <= DECODE_SLICE
        for g in range(groups):  # each group's replies, and only those, on its stream
            assert sorted(got[g]) == sorted(r.rollout_id for r in group(g, size)), g
        with trio.fail_after(20):
            inv = await gym.inventory("gym-0")  # carries the last acknowledgements
        assert inv.on_wire == () and inv.running == ()
        assert gym.acks.pending("gym-0") == 0


async def test_replies_on_the_wire_until_acknowledged_and_aclose_settles_them(
    tmp_path: Path,
) -> None:
    """A reply delivered on a channel stays on the wire (listed by inventory, as commit lists
    it) until its consumer asks past its batch; ``aclose`` says how far it got and the rest is
    discarded."""
    config = attrs.evolve(LONG, turns=(1, 1), turn_s=(0.05, 0.05))
    async with http_gym(tmp_path, config=config) as gym:
        stream: Any = await gym.run("gym-0", rows(3))
        first = await stream.__anext__()
        with trio.fail_after(20):
            while True:  # every reply has left the instance by now, the first batch unacked
                inv = await gym.inventory("gym-0")
                if not inv.running:
                    break
                await trio.sleep(0.05)
        assert {r.rollout_id for r in first} <= set(inv.on_wire)
        await stream.aclose()
        inv = await gym.inventory("gym-0")
        assert inv.on_wire == ()


# -- checkpoints and crashes ------------------------------------------------------------------


async def test_a_checkpoint_in_both_modes_on_reply_channels_is_exactly_once(
    tmp_path: Path,
) -> None:
    """The conformance kit (aligned and unaligned commits, the unaligned cut, exactly-once
    restore) with every stream on one reply channel per instance."""
    async with http_gym(tmp_path, instances=2, channels_per_instance=1) as gym:
        report = await check_backend(gym, tmp_path / "kit", rows=6)  # raises on any failure
        assert gym.channel_statistics().opened >= 2  # the streams went over reply channels
    assert {"commit[aligned]", "commit[unaligned]", "cut[unaligned]"} <= set(report.checks)


async def test_a_sigkilled_server_with_channels_open_ends_every_stream_and_is_replaced(
    tmp_path: Path,
) -> None:
    async with http_gym(tmp_path, instances=2, config=LONG, channels_per_instance=1) as gym:
        in_flight = [await gym.run("gym-0", group(g, 2)) for g in range(6)]
        other = await gym.run("gym-1", group(50, 2))
        pid = gym.pid("gym-0")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(30):
            for stream in in_flight:  # every stream on the dead server's channel
                with pytest.raises(GymInstanceDead):
                    await drain(stream)
            assert len(await drain(other)) == 2  # the other instance is untouched
        await gym.replace("gym-0", deadline(30))
        with trio.fail_after(30):
            replies = await drain(await gym.run("gym-0", group(60, 2)))  # a new channel
        assert sorted(r.rollout_id for r in replies) == ["60-0", "60-1"]
        assert all(isinstance(r, Completed) for r in replies)
        for stream in in_flight:
            await stream.aclose()  # sends nothing to the new server


# -- the fallback, the server's rules -----------------------------------------------------------


async def test_a_server_that_does_not_advertise_channels_is_sent_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that does not find its feature in ``Gymckpt-Features`` (an older server's
    health has no such header) uses ``POST /run``, one connection per stream, as before."""
    monkeypatch.setattr(http_gym_module, "MUX_FEATURE", "mux/99")  # not what this server says
    async with http_gym(tmp_path) as gym:
        stream = await gym.run("gym-0", rows(3))
        assert isinstance(stream, HttpReplyStream)
        assert len(await drain(stream)) == 3
        assert gym.channel_statistics().opened == 0


async def test_the_server_advertises_channels_and_refuses_a_run_to_a_channel_it_lacks(
    tmp_path: Path,
) -> None:
    async with serve_process(tmp_path / "w") as proc:
        async with httpx.AsyncClient(base_url=proc.url, timeout=20) as bare:
            health = await bare.get("/health")
            assert MUX_FEATURE in health.headers[FEATURES_HEADER].split(",")
            opened = await bare.post("/mux/v1/open", content=encode_mux_open(MuxOpenRequest(1)))
            assert opened.status_code == 401  # a channel needs the token too
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=20) as c:
            run = RunRequest(1, {}, RunShape(), False, 64, tuple(rows(2)))
            body = encode_mux_run_request(MuxRunRequest(7, run))
            resp = await c.post("/mux/v1/run", content=body)
            assert resp.status_code == 409 and b"UnknownChannel" in resp.content
            inv = await c.post(
                "/control/v1/inventory",
                content=b'{"deadline":null,"acks":{},"fault":null,"args":{}}',
            )
            assert b'"running":[]' in inv.content  # the refused run admitted nothing
            opening = c.build_request(
                "POST", "/mux/v1/open", content=encode_mux_open(MuxOpenRequest(7))
            )
            channel = MuxChannel("gym-0", 1, 7, await c.send(opening, stream=True))
            try:
                await channel.opened()  # its first line: {"channel": 7}
                resp = await c.post("/mux/v1/run", content=body)
                assert resp.status_code == 200 and resp.content == b'{"seq":0,"replies":[]}\n'
                seen: list[str] = []
                with trio.fail_after(30):
                    while True:
                        line = await channel._body.next_line()
                        assert line is not None
                        item = decode_mux_line(line)
                        assert item.sid == 1
                        if item.end:
                            break
                        seen += [r["episode_id"]["rollout_id"] for r in item.raw]
            finally:
                await channel.close()
                assert sorted(seen) == ["0-0", "1-0"]


# -- decoding in slices ----------------------------------------------------------------------


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


async def test_no_loop_step_converts_more_than_a_slice_of_a_large_batch() -> None:
    """One line of 1000 replies is converted ``DECODE_SLICE`` at a time: a task that runs at
    every scheduler batch never sees more than ``DECODE_SLICE`` conversions between two of its
    steps (structure, not timing)."""
    n = 1000
    replies = tuple(Completed(rollout_id_for(i, 0, 0), 1.0, 1, None) for i in range(n))
    rows_of = {r.rollout_id: i for i, r in enumerate(replies)}
    body = (
        encode_mux_channel_line(1)
        + encode_mux_batch_line(5, ReplyBatch(1, replies), rows_of)
        + encode_mux_end_line(5)
    )
    response = httpx.Response(200, stream=_Body([body]))
    channel = MuxChannel("gym-0", 1, 1, response)
    await channel.opened()
    converted = 0
    real = http_mux.decode_reply

    def counting(raw: Any) -> Any:
        nonlocal converted
        converted += 1
        return real(raw)

    sink: list[Any] = []

    class _Stream:
        sid = 5

        def put(self, item: Any) -> None:
            sink.append(item)

    channel.register(_Stream())  # type: ignore[arg-type]
    steps: list[int] = []  # conversions done at each point the loop may run other tasks

    async def checkpoint() -> None:
        steps.append(converted)
        await trio.lowlevel.checkpoint()

    mp = pytest.MonkeyPatch()
    mp.setattr(http_mux, "decode_reply", counting)
    mp.setattr(http_mux, "_between_slices", checkpoint)
    try:
        await channel.read()
    finally:
        mp.undo()
    steps.append(converted)
    assert converted == n
    assert len(sink[0][1]) == n and sink[1].__class__.__name__ == "_End"
    deltas = [b - a for a, b in itertools.pairwise([0, *steps])]
    assert max(deltas) <= DECODE_SLICE, max(deltas)
    assert channel.largest_step == DECODE_SLICE


async def test_a_large_control_answer_is_decoded_in_a_worker_thread_to_the_same_value() -> None:
    """A commit's answer for thousands of episodes is decoded off the loop: the same value
    as decoded inline."""
    from gymckpt.gym_adapter import InstanceInventory
    from gymckpt.gym_adapter.transports.http._wire import decode_result, encode_result

    ids = tuple(rollout_id_for(i, 0, 0) for i in range(40_000))
    inv = InstanceInventory("gym-0", True, False, (), (), (), ids, 0)
    data = encode_result("inventory", inv)
    assert len(data) >= http_gym_module.THREAD_DECODE_BYTES
    threads: list[Any] = []
    real = trio.to_thread.run_sync

    async def spy(fn: Any, *args: Any) -> Any:
        threads.append(fn)
        return await real(fn, *args)

    mp = pytest.MonkeyPatch()
    mp.setattr(trio.to_thread, "run_sync", spy)
    try:
        got = await http_gym_module._decode_result("inventory", data)
    finally:
        mp.undo()
    assert threads and got == decode_result("inventory", data) == inv


def test_the_client_lets_go_of_an_idle_connection_well_before_the_server_does() -> None:
    """A request sent on a pooled connection the server is closing fails as "Server
    disconnected without sending a response" (one such failure of a ``/mux/v1/run`` ended a 50k
    benchmark run as an infra outage): the client's expiry is well under the server's
    keep-alive timeout (both were 5 s, httpx's and hypercorn's defaults)."""
    from gymckpt.gym_adapter.transports.http import _serve

    cfg = _serve._hypercorn_config("127.0.0.1", 0, None, None, 1.0)
    assert cfg.keep_alive_timeout == _serve.KEEP_ALIVE_TIMEOUT_S
    assert http_gym_module.KEEPALIVE_EXPIRY_S * 5 <= _serve.KEEP_ALIVE_TIMEOUT_S
    gym = http_gym_module.HttpGym(["http://127.0.0.1:1"], token="t")
    client = gym._client(4)
    pool = client._transport._pool  # type: ignore[attr-defined]
    assert pool._keepalive_expiry == http_gym_module.KEEPALIVE_EXPIRY_S
