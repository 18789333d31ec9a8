"""``gymckpt serve`` as a real process on loopback, over real HTTP: readiness, health, the
control plane with real files (prepare, commit, resume, then restore into a second server),
``/run`` streaming to its end line with acknowledgements as on Ray, Gym errors as their class,
a client that disconnects mid-stream, SIGTERM, TLS."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import time
from contextlib import aclosing
from pathlib import Path

import httpx
import orjson
import pytest
import trio
from http_wire_client import RemoteError, control, control_raw, rows, run_to_end, state

from gymckpt.gym_adapter._contract import Completed, RunRow
from gymckpt.gym_adapter._faults import FaultSpec
from gymckpt.gym_adapter.host._host import HostConfig
from gymckpt.gym_adapter.transports._admission import RunShape
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports._wire import encode
from gymckpt.gym_adapter.transports.http._wire import (
    EXPECT_INCARNATION_HEADER,
    PROTOCOL,
    RunRequest,
    decode_health,
    decode_stream_line,
    encode_control_request,
    encode_run_request,
)
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymControlError,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
)
from gymckpt.testing._http_serve_process import (
    READINESS,
    open_raw_run,
    serve_process,
    tree_digest,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180)]

SLOW = "gymckpt.testing.examples:slow_task_reader"
CAL = "gymckpt.gym_adapter.environments.calendar:calendar_environment"


def _client(proc: object, **kw: object) -> httpx.AsyncClient:
    url = proc.url  # type: ignore[attr-defined]
    headers = proc.auth()  # type: ignore[attr-defined]
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=20.0, **kw)  # type: ignore[arg-type]


async def test_readiness_line_health_and_headers(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w", instance="gym-3") as proc:
        line = await proc.wait_for_line(READINESS)
        assert re.fullmatch(
            r"gymckpt serve: instance gym-3 serving at http://127\.0\.0\.1:\d+ "
            r"\(incarnation [0-9a-f]{32}\)",
            line,
        )
        assert int(proc.url.rsplit(":", 1)[1]) > 0  # --port 0: the real port
        assert sum(bool(READINESS.match(x)) for x in proc.lines) == 1
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as bare:
            resp = await bare.get("/health")  # no token
        assert resp.status_code == 200
        health = decode_health(resp.content)
        assert (health.protocol, health.instance, health.incarnation, health.serving) == (
            PROTOCOL,
            "gym-3",
            proc.incarnation,
            True,
        )
        assert health.topology.name == "gym-3"
        assert resp.headers["gymckpt-incarnation"] == proc.incarnation
        assert resp.headers["gymckpt-instance"] == "gym-3"
        async with _client(proc) as client:
            resp = await client.post("/control/v1/topology", content=b"{")
            assert resp.status_code == 400
            assert resp.headers["gymckpt-incarnation"] == proc.incarnation
            topo = await control(client, "topology")
        assert topo == health.topology
        assert await proc.stop() == 0


async def test_a_restarted_server_is_a_new_incarnation(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w") as first:
        seen = first.incarnation
    async with serve_process(tmp_path / "w") as second:
        assert second.incarnation != seen


async def test_run_streams_batches_then_the_end_line_and_acks_free_them(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w") as proc, _client(proc) as client:
        batch = rows(4)
        batches, ended, replies = await run_to_end(client, 1, batch)
        assert ended
        assert batches[0].is_header and batches[0].replies == ()
        assert [b.seq for b in batches] == list(range(len(batches)))
        assert sorted(r.rollout_id for r in replies) == sorted(r.rollout_id for r in batch)
        assert all(isinstance(r, Completed) for r in replies)
        # sent but not acknowledged: on the wire, as on Ray
        inv = await control(client, "inventory")
        assert sorted(inv.on_wire) == sorted(r.rollout_id for r in batch)
        # acknowledgements ride the next request
        inv = await control(client, "inventory", acks={1: batches[-1].seq})
        assert inv.on_wire == ()
        # one reply per line
        batches, ended, replies = await run_to_end(client, 2, rows(3, start=10), per_row=True)
        assert ended and all(len(b.replies) == 1 for b in batches[1:]) and len(replies) == 3
        await control(client, "ack", {"sid": 2, "upto": batches[-1].seq})
        assert (await control(client, "inventory")).on_wire == ()
        # tasks cross in the NeMo envelope and come back in the payload
        task_rows = (RunRow("20-0", 20, 0, 0, task={"prompt": "p", "n": [1]}),)
        assert proc.instance == "gym-0"
    async with serve_process(tmp_path / "t", "gymckpt.testing.examples:task_reader") as proc2:
        async with _client(proc2) as client:
            _, ended, replies = await run_to_end(client, 1, task_rows)
        assert ended and isinstance(replies[0], Completed)
        assert replies[0].payload["seen"] == [{"prompt": "p", "n": [1]}] * 3


async def test_control_round_trip_with_real_files_then_restore_elsewhere(tmp_path: Path) -> None:
    shared = tmp_path / "states"
    shared.mkdir()
    first = serve_process(tmp_path / "a", CAL, "--state-root", str(shared))
    async with first as proc, _client(proc) as client:
        await run_to_end(client, 1, rows(3))  # retained sessions exist
        req = RunRequest(2, {}, RunShape(), False, 64, rows(4, start=10))
        async with client.stream("POST", "/run", content=encode_run_request(req)) as resp:
            async with aclosing(resp.aiter_lines()) as lines:
                header = decode_stream_line((await lines.__anext__()).encode())
                assert header is not None and header.is_header  # admitted: prepare may overtake
                prep = await control(
                    client, "prepare", {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED}
                )
                assert prep.checkpoint_id == "c1"
                commit = await control(
                    client, "commit", {"checkpoint_id": "c1", "state_root": "snap/c1"}
                )
                await control(client, "resume", {"checkpoint_id": "c1"})
                rest = [line async for line in lines if line]
        assert decode_stream_line(rest[-1].encode()) is None  # the end line
        written = tree_digest(shared / "snap" / "c1")
        assert written, "the commit wrote no files"
        for part in commit.participants:
            assert (shared / "snap" / "c1" / part.state_dir).is_dir()
        exported = commit.exported
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in commit.participants
        ),
    )
    episodes = tuple(
        EpisodeRecord(e.rollout_id, e.owner, "gym-0", e.capture_keys) for e in exported
    )
    second = serve_process(tmp_path / "b", CAL, "--state-root", str(shared))
    async with second as proc, _client(proc) as client:
        reply = await control(
            client,
            "restore",
            {"state_root": str(shared / "snap" / "c1"), "record": record, "episodes": episodes},
        )
        assert sorted(reply.restored) == sorted(e.rollout_id for e in exported)
        inv = await control(client, "inventory")
        assert sorted(inv.unclaimed) == sorted(reply.restored)
        retired = await control(client, "retire_restored", {"rollout_ids": list(reply.restored)})
        assert sorted(retired.retired) == sorted(reply.restored)
        # a record that does not match the files: TopologyMismatch, as itself, 409
        bad = InstanceRecord("gym-0", (ParticipantRecord("calendar", "environment", "x", "00"),))
        with pytest.raises(RemoteError) as info:
            await control(
                client, "restore", {"state_root": "snap/c1", "record": bad, "episodes": ()}
            )
        assert info.value.status == 409 and isinstance(info.value.body, TopologyMismatch)
    assert tree_digest(shared / "snap" / "c1") == written  # restore read, never wrote


async def test_gym_errors_cross_as_their_class(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w") as proc, _client(proc) as client:
        before = await state(client)
        with pytest.raises(RemoteError) as info:
            await control(client, "commit", {"checkpoint_id": "never", "state_root": "s"})
        assert info.value.status == 503 and isinstance(info.value.body, GymControlError)
        assert "never" in str(info.value.body) or "prepare" in str(info.value.body)
        assert await state(client) == before
        assert any("commit on instance gym-0 failed: 503 GymControlError" in x for x in proc.lines)


async def _wait_admitted(client: httpx.AsyncClient, sid: int, batch: tuple[RunRow, ...]) -> None:
    """Waits (bounded) until a new ``/run`` is admitted: the slot of a finished handler is free."""
    with trio.fail_after(10):
        while True:
            req = RunRequest(sid, {}, RunShape(), False, 64, batch)
            async with client.stream("POST", "/run", content=encode_run_request(req)) as resp:
                if resp.status_code == 200:
                    return
                assert resp.status_code == 429
            await trio.sleep(0.05)


async def test_a_client_disconnect_mid_stream_leaks_no_handler(tmp_path: Path) -> None:
    server = serve_process(tmp_path / "w", SLOW, "--max-streams", "1")
    async with server as proc, _client(proc) as client:
        body = encode_run_request(RunRequest(1, {}, RunShape(), False, 64, rows(2)))
        raw = await open_raw_run(proc.url, proc.token, body)
        # a second stream is over the limit while this one is open
        second = RunRequest(2, {}, RunShape(), False, 64, rows(1, start=5))
        resp = await client.post("/run", content=encode_run_request(second))
        assert resp.status_code == 429
        await raw.aclose()  # the client goes away mid-stream
        # the handler ended (its stream slot is free again) ...
        await _wait_admitted(client, 3, rows(1, start=7))
        # ... and the rows run on
        inv = await control(client, "inventory")
        assert {"0-0", "1-0"} <= set(inv.running)
        await control(client, "close_stream", {"sid": 1, "upto": 0})
        assert await proc.stop() == 0


async def test_a_hung_call_is_cancelled_when_its_client_gives_up(tmp_path: Path) -> None:
    server = serve_process(tmp_path / "w", CAL, "--max-streams", "1", "--allow-faults")
    async with server as proc, _client(proc) as client:
        hang = RunShape(inject=FaultSpec("run", "hang"))
        body = encode_run_request(RunRequest(1, {}, hang, False, 64, rows(1)))
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/run", content=body, timeout=0.5)
        # the hung handler was cancelled when the client went away: its stream slot is free
        await _wait_admitted(client, 2, rows(1, start=3))
        faulty = encode_control_request(
            "resume",
            deadline=WireDeadline(60.0, time.time()),
            acks={},
            fault=FaultSpec("resume", "hang"),
            args={"checkpoint_id": "c"},
        )
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/control/v1/resume", content=faulty, timeout=0.5)
        assert (await control(client, "inventory")).admission_open
        assert await proc.stop() == 0


async def test_sigterm_ends_open_streams_without_the_end_line_and_exits_0(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w", SLOW) as proc, _client(proc) as client:
        req = RunRequest(1, {}, RunShape(), False, 64, rows(2))
        async with client.stream("POST", "/run", content=encode_run_request(req)) as resp:
            async with aclosing(resp.aiter_lines()) as lines:
                assert decode_stream_line((await lines.__anext__()).encode()) is not None
                proc.process.send_signal(15)
                with trio.fail_after(10):
                    rest = [line async for line in lines if line]
                assert rest == []  # no end line: an early end, which the client tells apart
        with trio.fail_after(15):
            assert await proc.process.wait() == 0
        assert any("signal 15, stopping" in x for x in proc.lines)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_tls_through_certfile_and_keyfile(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = _self_signed(tmp_path)
    async with serve_process(
        tmp_path / "w", CAL, "--certfile", str(cert), "--keyfile", str(key)
    ) as proc:
        assert proc.url.startswith("https://127.0.0.1:")
        async with _client(proc, verify=ssl.create_default_context(cafile=str(cert))) as client:
            health = decode_health((await client.get("/health")).content)
            assert health.serving
            _, ended, replies = await run_to_end(client, 1, rows(2))
            assert ended and len(replies) == 2
        async with httpx.AsyncClient(
            base_url=proc.url.replace("https", "http"), timeout=5
        ) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get("/health")


async def test_bad_flags_and_environments_exit_2(tmp_path: Path) -> None:
    import sys

    reader = "gymckpt.testing.examples:task_reader"
    for extra in (
        ["no.such.module:env"],
        [reader, "--port", "99999"],
        [reader, "--certfile", "c.pem"],
    ):
        res = await trio.run_process(
            [sys.executable, "-m", "gymckpt", "serve", *extra, "--work-dir", str(tmp_path / "w")],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert res.returncode == 2, res.stderr
        assert b"Traceback" not in res.stderr
        assert orjson.dumps(extra)  # the case, for the assertion message


async def test_the_config_file_serve_table(tmp_path: Path) -> None:
    import sys

    conf = tmp_path / "serve.toml"
    conf.write_text('[serve]\ninstance = "gym-7"\nmax_rows = 2\n')
    async with serve_process(tmp_path / "w", CAL, "--config", str(conf), instance="gym-7") as proc:
        async with _client(proc) as client:
            body = encode_run_request(RunRequest(1, {}, RunShape(), False, 8, rows(3)))
            assert (await client.post("/run", content=body)).status_code == 413
            _, ended, _ = await run_to_end(client, 2, rows(2))
            assert ended
    for text in ("[serve]\nmax_rowz = 2\n", '[serve]\nmax_rows = "2"\n', "max_rows = 2\n"):
        conf.write_text(text)
        res = await trio.run_process(
            [sys.executable, "-m", "gymckpt", "serve", CAL, "--config", str(conf),
             "--work-dir", str(tmp_path / "w")],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        assert res.returncode == 2, (text, res.stderr)
        assert b"Traceback" not in res.stderr


async def test_a_request_for_another_incarnation_is_refused_409_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """A client that has not seen the restart names the incarnation it means: the new process
    refuses the request before it acts (a prepare meant for the old one must not close the new
    one's admission)."""
    async with serve_process(tmp_path / "w", CAL) as proc:
        async with _client(proc) as client:
            before = await state(client)
            old = {EXPECT_INCARNATION_HEADER: "0" * 32}
            args = {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED}
            resp = await control_raw(client, "prepare", args, headers=old)
            assert resp.status_code == 409, resp.text
            assert orjson.loads(resp.content)["error"]["type"] == "IncarnationMismatch"
            assert proc.incarnation in resp.text
            assert await state(client) == before and before[0].admission_open
            mine = {EXPECT_INCARNATION_HEADER: proc.incarnation}
            await control(client, "prepare", args, headers=mine)
            assert not (await control(client, "inventory")).admission_open


async def test_the_host_config_file_sets_the_hosts_settings_and_a_bad_one_exits_2(
    tmp_path: Path,
) -> None:
    import sys

    conf = tmp_path / "host-config.json"
    conf.write_bytes(encode(HostConfig(lease_s=0.5)))
    async with serve_process(tmp_path / "w", CAL, "--host-config", str(conf)) as proc:
        async with _client(proc) as client:
            args = {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED}
            await control(client, "prepare", args)
            # nobody resumes: the 0.5 s lease (default 60 s) reopens admission by itself; the
            # state is another process's, so it is polled, under a deadline
            with trio.fail_after(20):
                while (await control(client, "inventory")).lease_reopened == 0:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert (await control(client, "inventory")).admission_open
    for text in (b'{"lease_s": 0.5, "leese": 1}', b'{"lease_s": "soon"}', b"{", b'{"lease_s": -1}'):
        conf.write_bytes(text)
        res = await trio.run_process(
            [sys.executable, "-m", "gymckpt", "serve", CAL, "--host-config", str(conf),
             "--work-dir", str(tmp_path / "w")],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        assert res.returncode == 2, (text, res.stderr)
        assert b"--host-config" in res.stderr and b"Traceback" not in res.stderr
