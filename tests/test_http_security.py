"""``gymckpt serve``'s security rules, each against a real server process: the bearer token,
body and row limits, open streams, paths confined to the state root, faults only when allowed,
malformed requests, routes, loopback by default, the token file. Every refusal is a 4xx with a
JSON error body and one log line, and leaves the instance's state byte-identical: its inventory,
its retained sessions and every file of its work directory."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from http_wire_client import control, control_raw, rows, run_to_end, state

from gymckpt.gym_adapter._faults import FaultSpec
from gymckpt.gym_adapter.transports._admission import RunShape
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports.http._spawn import TOKEN_FILE, ServeSpec
from gymckpt.gym_adapter.transports.http._wire import (
    CONTROL_OPS,
    Refusal,
    RunRequest,
    decode_error_body,
    encode_control_request,
    encode_run_request,
)
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    TrainerTerm,
)
from gymckpt.testing._http_serve_process import (
    ServeProcess,
    open_raw_run,
    serve_process,
    tree_digest,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180)]

CAL = "gymckpt.gym_adapter.environments.calendar:calendar_environment"
DEADLINE = WireDeadline(10.0, 0.0)


async def _snapshot(client: httpx.AsyncClient, proc: ServeProcess) -> tuple[Any, ...]:
    inventory, retained = await state(client)
    return inventory, retained, tree_digest(proc.work_dir)


@asynccontextmanager
async def _served(
    tmp_path: Path, *args: str, env: str = CAL
) -> AsyncIterator[tuple[ServeProcess, httpx.AsyncClient]]:
    """A server with some history (episodes run, retained sessions journaled, replies on the
    wire)."""
    async with serve_process(tmp_path / "w", env, *args) as proc:
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=20) as client:
            _, ended, _ = await run_to_end(client, 1, rows(3))
            assert ended
            # stream 1 is left unacknowledged: its replies stay on the wire, so a refused
            # request that applied the acks it carries ({1: 99}) would change the inventory
            assert len((await control(client, "inventory")).on_wire) == 3
            yield proc, client


def _refusal(resp: httpx.Response, status: int, reason: str) -> Refusal:
    assert resp.status_code == status, (resp.status_code, resp.content)
    assert resp.headers["content-type"] == "application/json"
    body = decode_error_body(resp.content)
    assert isinstance(body, Refusal), body
    assert body.type == reason, body
    return body


def _body(op: str) -> bytes:
    args: dict[str, Any] = {
        "prepare": {"checkpoint_id": "c", "mode": CheckpointMode.ALIGNED},
        "commit": {"checkpoint_id": "c", "state_root": "s"},
        "resume": {"checkpoint_id": "c"},
        "retire": {"rollout_ids": ["0-0"]},
        "retire_restored": {"rollout_ids": ["0-0"]},
        "restore": {
            "state_root": "s",
            "record": InstanceRecord("gym-0", ()),
            "episodes": (),
        },
        "attach": {"trainer": TrainerTerm("0123456789abcdef0123456789abcdef", 1)},
        "release": {"trainer": TrainerTerm("0123456789abcdef0123456789abcdef", 1)},
        "ack": {"sid": 1, "upto": 1},
        "close_stream": {"sid": 1, "upto": 1},
    }.get(op, {})
    return encode_control_request(op, deadline=DEADLINE, acks={1: 99}, args=args)


RUN_BODY = encode_run_request(RunRequest(9, {1: 99}, RunShape(), False, 8, rows(2, start=50)))


async def _raw_exchange(host: str, port: str, request: bytes) -> bytes:
    """``request`` written on a fresh connection (the body may be cut short: the server must
    answer without the rest), the answer read until the server closes the connection."""
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(request)
    got = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            got += chunk
    await stream.aclose()
    return got


async def _refusal_lines(proc: ServeProcess, n: int) -> None:
    with trio.fail_after(5):
        while sum("gymckpt serve: refused" in x for x in proc.lines) < n:
            proc.line_added = trio.Event()
            await proc.line_added.wait()


async def test_every_route_but_health_needs_the_right_bearer_token(tmp_path: Path) -> None:
    async with _served(tmp_path) as (proc, client):
        before = await _snapshot(client, proc)
        bad_headers: list[dict[str, str]] = [
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Authorization": f"Bearer {proc.token[:-1]}"},  # a prefix of the right one
            {"Authorization": f"Basic {proc.token}"},
            {"Authorization": "Bearer"},
            {"Authorization": "token"},
        ]
        refused = 0
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as bare:
            assert (await bare.get("/health")).status_code == 200
            for headers in bad_headers:
                for op in CONTROL_OPS:
                    resp = await bare.post(f"/control/v1/{op}", content=_body(op), headers=headers)
                    _refusal(resp, 401, "Unauthorized")
                    refused += 1
                _refusal(
                    await bare.post("/run", content=RUN_BODY, headers=headers), 401, "Unauthorized"
                )
                refused += 1
            # unknown routes give nothing away without the token either
            _refusal(await bare.post("/control/v1/nope", content=b"{}"), 401, "Unauthorized")
            refused += 1
        await _refusal_lines(proc, refused)
        assert proc.token not in "\n".join(proc.lines)
        assert await _snapshot(client, proc) == before


async def test_an_oversized_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    async with _served(tmp_path, "--max-body-bytes", "4096") as (proc, client):
        before = await _snapshot(client, proc)
        host, port = proc.url.removeprefix("http://").rsplit(":", 1)
        auth = f"Host: {host}\r\nAuthorization: Bearer {proc.token}\r\n"
        # declared too large: refused on the headers, 1 KiB of the 500 MiB announced sent
        got = await _raw_exchange(
            host,
            port,
            f"POST /run HTTP/1.1\r\n{auth}Content-Length: {500 << 20}\r\n\r\n".encode()
            + b"x" * 1024,
        )
        assert got.startswith(b"HTTP/1.1 413"), got[:200]
        assert b'"BodyTooLarge"' in got
        # not declared (chunked): refused once the limit is passed while reading, without the
        # body's end ever sent
        chunks = b"".join(b"400\r\n" + b"y" * 1024 + b"\r\n" for _ in range(8))
        got = await _raw_exchange(
            host,
            port,
            b"POST /control/v1/restore HTTP/1.1\r\n"
            + f"{auth}Transfer-Encoding: chunked\r\n\r\n".encode()
            + chunks,
        )
        assert got.startswith(b"HTTP/1.1 413"), got[:200]
        # just under the limit is read (and refused for what it is, not its size)
        resp = await client.post("/control/v1/restore", content=b" " * 4000)
        _refusal(resp, 400, "BadRequest")
        await _refusal_lines(proc, 3)
        assert await _snapshot(client, proc) == before


async def test_too_many_rows_and_too_many_streams(tmp_path: Path) -> None:
    slow = "gymckpt.testing.examples:slow_task_reader"
    async with serve_process(tmp_path / "w", slow, "--max-rows", "3", "--max-streams", "1") as proc:
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=20) as client:
            body = encode_run_request(RunRequest(1, {}, RunShape(), False, 8, rows(3)))
            held = await open_raw_run(proc.url, proc.token, body)  # its rows run for an hour
            before = await _snapshot(client, proc)
            assert len(before[0].running) == 3
            more = encode_run_request(RunRequest(5, {}, RunShape(), False, 8, rows(4, start=10)))
            _refusal(await client.post("/run", content=more), 413, "TooManyRows")
            second = encode_run_request(RunRequest(6, {}, RunShape(), False, 8, rows(1, start=20)))
            _refusal(await client.post("/run", content=second), 429, "TooManyStreams")
            await _refusal_lines(proc, 2)
            assert await _snapshot(client, proc) == before
            await held.aclose()


async def test_paths_outside_the_state_root_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link-out").symlink_to(outside, target_is_directory=True)
    async with _served(tmp_path, "--state-root", str(root)) as (proc, client):
        await control(client, "prepare", {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED})
        before = await _snapshot(client, proc)
        bad_roots = [
            str(outside),  # absolute, elsewhere
            str(outside / "deeper"),
            "../outside",  # relative, leaving the root
            "a/../../outside",
            str(root / ".." / "outside"),
            "link-out",  # a symlink out
            "link-out/snap",
            "/",
            "",
        ]
        refused = 0
        for bad in bad_roots:
            resp = await control_raw(
                client, "commit", {"checkpoint_id": "c1", "state_root": bad}, acks={1: 99}
            )
            _refusal(resp, 403, "PathOutsideStateRoot")
            refused += 1
        record = InstanceRecord("gym-0", (ParticipantRecord("calendar", "environment", "x", "0"),))
        for bad in bad_roots[:4]:
            resp = await control_raw(
                client,
                "restore",
                {"state_root": bad, "record": record, "episodes": ()},
                acks={1: 99},
            )
            _refusal(resp, 403, "PathOutsideStateRoot")
            refused += 1
        # a participant's state_dir leaving the root through an allowed state_root
        escaping = InstanceRecord(
            "gym-0", (ParticipantRecord("calendar", "environment", "../../outside", "0"),)
        )
        resp = await control_raw(
            client,
            "restore",
            {
                "state_root": "snap",
                "record": escaping,
                "episodes": (EpisodeRecord("0-0", "calendar", "gym-0"),),
            },
        )
        _refusal(resp, 403, "PathOutsideStateRoot")
        refused += 1
        await _refusal_lines(proc, refused)
        assert await _snapshot(client, proc) == before
        assert list(outside.iterdir()) == []
        # inside the root is fine: the same commit, relative, writes there
        reply = await control(client, "commit", {"checkpoint_id": "c1", "state_root": "snap/c1"})
        assert reply.participants and (root / "snap" / "c1").is_dir()
        await control(client, "resume", {"checkpoint_id": "c1"})
        assert list(outside.iterdir()) == []


async def test_a_symlink_below_an_allowed_state_root_is_walked_and_refused(
    tmp_path: Path,
) -> None:
    """The state root a request names is inside, but a component the instance would write or
    read below it is a link out (``<root>/<dir>/gym-0`` linked elsewhere): 403, nothing
    written outside, nothing changed; a link that stays inside is followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "inst-out").mkdir()
    (root / "inst-out" / "gym-0").symlink_to(outside, target_is_directory=True)
    (root / "part-out" / "gym-0").mkdir(parents=True)
    (root / "part-out" / "gym-0" / "calendar").symlink_to(outside, target_is_directory=True)
    (root / "file-out" / "gym-0" / "agent").mkdir(parents=True)
    (root / "file-out" / "gym-0" / "agent" / "records.json").symlink_to(secret)
    (root / "dangling").mkdir()
    (root / "dangling" / "gym-0").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    (root / "loop").mkdir()
    (root / "loop" / "gym-0").symlink_to(root / "loop" / "gym-0")
    (root / "inside").mkdir()
    (root / "inside" / "gym-0").symlink_to(root / "real", target_is_directory=True)
    async with _served(tmp_path, "--state-root", str(root)) as (proc, client):
        await control(client, "prepare", {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED})
        before = await _snapshot(client, proc)
        root_before = tree_digest(root)
        refused = 0
        for bad in ("inst-out", "part-out", "file-out", "dangling", "loop", str(root / "inst-out")):
            resp = await control_raw(
                client, "commit", {"checkpoint_id": "c1", "state_root": bad}, acks={1: 99}
            )
            body = _refusal(resp, 403, "PathOutsideStateRoot")
            assert "symbolic link" in body.message, body
            refused += 1
        # a restore reading a participant's records through a link out
        record = InstanceRecord(
            "gym-0", (ParticipantRecord("agent", "simple_agent", "gym-0/agent", "0"),)
        )
        resp = await control_raw(
            client,
            "restore",
            {"state_root": "file-out", "record": record, "episodes": ()},
            acks={1: 99},
        )
        _refusal(resp, 403, "PathOutsideStateRoot")
        refused += 1
        await _refusal_lines(proc, refused)
        assert await _snapshot(client, proc) == before
        assert tree_digest(root) == root_before
        assert list(outside.iterdir()) == [] and secret.read_text() == "{}"
        # a link that stays inside the state root is followed: the records land inside
        reply = await control(client, "commit", {"checkpoint_id": "c1", "state_root": "inside"})
        assert reply.participants
        assert (root / "real" / "calendar" / "records.json").is_file()
        await control(client, "resume", {"checkpoint_id": "c1"})
        assert list(outside.iterdir()) == [] and secret.read_text() == "{}"


async def test_the_spawned_servers_token_is_never_written_through_a_planted_link(
    tmp_path: Path,
) -> None:
    """``HttpGym.spawn``'s token file: written through a fresh temporary file created
    ``O_EXCL | O_NOFOLLOW`` with mode 0600, so a link planted where a temporary file would be
    (the old fixed name ``http-token.tmp``) is neither followed nor renamed into place; a real
    server then serves with that token."""
    work = tmp_path / "w"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    planted = work / f"{TOKEN_FILE}.tmp"
    planted.symlink_to(victim)
    spec = ServeSpec.prepare(
        {"gym-0": CAL}, 0, work, None, "spawned-token-0123456789abcdef", None,
        allow_faults=False, extra_args=(), environ={},
    )  # fmt: skip
    assert victim.read_text() == "not yours\n"
    assert planted.is_symlink()
    token_file = spec.token_file
    assert not token_file.is_symlink() and token_file.is_file()
    assert stat.S_IMODE(os.lstat(token_file).st_mode) == 0o600
    assert token_file.read_text() == "spawned-token-0123456789abcdef"
    async with serve_process(work, CAL, "--token-file", str(token_file)) as proc:
        assert proc.token == "spawned-token-0123456789abcdef"
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=10) as client:
            assert (await control(client, "topology")).name == "gym-0"
    assert victim.read_text() == "not yours\n"


def test_a_secret_is_never_written_through_a_link_even_at_its_own_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the random temporary name guessed and a link planted there, the secret's
    temporary file is still created ``O_EXCL | O_NOFOLLOW``: the write fails, the link's
    target is untouched, no token file appears."""
    import gymckpt.runtime._store as store

    monkeypatch.setattr(store.secrets, "token_hex", lambda _n: "guessed")
    work = tmp_path / "w"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    (work / f".{TOKEN_FILE}.guessed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        ServeSpec.prepare(
            {"gym-0": CAL}, 0, work, None, "spawned-token-0123456789abcdef", None,
            allow_faults=False, extra_args=(), environ={},
        )  # fmt: skip
    assert victim.read_text() == "not yours\n"
    assert not (work / TOKEN_FILE).exists()


async def test_faults_are_refused_unless_the_server_allows_them(tmp_path: Path) -> None:
    async with _served(tmp_path) as (proc, client):
        before = await _snapshot(client, proc)
        faulty = encode_control_request(
            "resume",
            deadline=DEADLINE,
            acks={1: 99},
            fault=FaultSpec("resume", "error"),
            args={"checkpoint_id": "c"},
        )
        _refusal(await client.post("/control/v1/resume", content=faulty), 403, "FaultsNotAllowed")
        for shape in (
            RunShape(refuse_all=True),
            RunShape(drop_after=1),
            RunShape(inject=FaultSpec("run", "dead")),
        ):
            body = encode_run_request(RunRequest(7, {}, shape, False, 8, rows(2, start=30)))
            _refusal(await client.post("/run", content=body), 403, "FaultsNotAllowed")
        await _refusal_lines(proc, 4)
        assert await _snapshot(client, proc) == before
    async with serve_process(tmp_path / "f", CAL, "--allow-faults") as proc:
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=20) as client:
            resp = await client.post("/control/v1/resume", content=faulty)
            assert resp.status_code == 503  # the injected GymControlError, as itself
            assert type(decode_error_body(resp.content)).__name__ == "GymControlError"
            _, ended, replies = await run_to_end(
                client, 1, rows(2), shape=RunShape(refuse_all=True)
            )
            assert ended and {type(r).__name__ for r in replies} == {"Refused"}


def _bad_bodies(proc: ServeProcess) -> list[tuple[str, bytes]]:
    good = orjson.loads(_body("commit"))
    run = orjson.loads(RUN_BODY)
    return [
        ("/control/v1/commit", b"{not json"),
        ("/control/v1/commit", b""),
        ("/control/v1/commit", b"[]"),
        ("/control/v1/commit", orjson.dumps({**good, "extra": 1})),
        ("/control/v1/commit", orjson.dumps({**good, "args": {**good["args"], "rm": "-rf"}})),
        ("/control/v1/commit", orjson.dumps({**good, "args": {**good["args"], "checkpoint_id": 3}})),  # noqa: E501
        ("/control/v1/commit", orjson.dumps({**good, "deadline": None})),
        ("/control/v1/commit", orjson.dumps({**good, "acks": {"one": 1}})),
        ("/control/v1/prepare", orjson.dumps({**good, "args": {"checkpoint_id": "c", "mode": 1}})),
        ("/run", b"\xff\xfe"),
        ("/run", orjson.dumps({**run, "sid": "9"})),
        ("/run", orjson.dumps({**run, "rows": [{**run["rows"][0], "pickle": "gASV"}]})),
        ("/run", orjson.dumps({**run, "rows": [{**run["rows"][0], "episode_id": {"attempt": 0}}]})),
        ("/run", orjson.dumps({**run, "max_replies": 0})),
    ]  # fmt: skip


async def test_malformed_requests_unknown_routes_and_wrong_methods(tmp_path: Path) -> None:
    async with _served(tmp_path) as (proc, client):
        before = await _snapshot(client, proc)
        bodies = _bad_bodies(proc)
        for path, body in bodies:
            _refusal(await client.post(path, content=body), 400, "BadRequest")
        for path in ("/", "/control/v1/", "/control/v1/format_disk", "/control/v2/prepare",
                     "/run/", "/runs", "/health/x"):  # fmt: skip
            _refusal(await client.post(path, content=b"{}"), 404, "NotFound")
        for method, path in (("GET", "/run"), ("PUT", "/run"), ("GET", "/control/v1/prepare"),
                             ("DELETE", "/control/v1/retire"), ("POST", "/health")):  # fmt: skip
            _refusal(await client.request(method, path), 405, "MethodNotAllowed")
        await _refusal_lines(proc, len(bodies) + 12)
        assert await _snapshot(client, proc) == before


async def test_the_token_file_is_private_and_never_logged(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w", CAL) as proc:
        mode = stat.S_IMODE(os.stat(proc.token_file).st_mode)
        assert mode == 0o600, oct(mode)
        token = proc.token
        assert len(token) >= 43  # 32 random bytes, urlsafe base64
        assert token not in "\n".join(proc.lines)
        assert not [p for p in os.listdir(tmp_path / "w") if p.startswith(".token")]  # no temp
    # a token file the operator wrote is used as it is; a server restarted keeps its token
    given = tmp_path / "given-token"
    given.write_text("operator-chosen-token-1234567890\n")
    given.chmod(0o600)
    async with serve_process(tmp_path / "w2", CAL, "--token-file", str(given)) as proc:
        assert proc.token == "operator-chosen-token-1234567890"
        async with httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=10) as client:
            assert (await control(client, "topology")).name == "gym-0"
    async with serve_process(tmp_path / "w", CAL) as again:
        assert again.token == token


async def test_loopback_unless_asked_and_a_warning_when_asked(tmp_path: Path) -> None:
    async with serve_process(tmp_path / "w", CAL) as proc:
        assert proc.url.startswith("http://127.0.0.1:")
        assert not any("reachable from other machines" in x for x in proc.lines)
    async with serve_process(tmp_path / "w", CAL, "--host", "0.0.0.0") as proc:
        assert proc.url.startswith("http://0.0.0.0:")
        await proc.wait_for_line("binding 0.0.0.0, reachable from other machines")
        port = proc.url.rsplit(":", 1)[1]
        async with httpx.AsyncClient(timeout=10) as bare:
            assert (await bare.get(f"http://127.0.0.1:{port}/health")).status_code == 200
