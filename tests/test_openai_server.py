"""Tests of ``gymckpt.testing.openai_server``, spoken to over HTTP as a client would (stdlib
``urllib``), the process started once for the module by ``open_openai_test_server``."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gymckpt.testing.openai_server import OpenAITestServer, open_openai_test_server

KEY = "sk-server"


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAITestServer]:
    with open_openai_test_server(api_key=KEY) as s:
        yield s


def call(
    server: OpenAITestServer,
    path: str,
    body: Any = None,
    *,
    key: str | None = KEY,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(server.base_url + path, data=data, headers=headers or {})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "gymckpt-test", "messages": [{"role": "user", "content": "hello"}], **kw}


def test_the_same_request_gets_the_same_answer_and_another_seed_another(
    server: OpenAITestServer,
) -> None:
    s1, a = call(server, "/chat/completions", chat(seed=1))
    s2, b = call(server, "/chat/completions", chat(seed=1))
    s3, c = call(server, "/chat/completions", chat(seed=2))
    assert s1 == s2 == s3 == 200
    assert a == b and a["choices"] != c["choices"]
    assert a["choices"][0]["message"]["content"] and a["choices"][0]["finish_reason"] == "stop"
    assert (
        a["usage"]["total_tokens"] == a["usage"]["prompt_tokens"] + a["usage"]["completion_tokens"]
    )
    assert "prompt_token_ids" not in a  # vLLM's fields only when asked


def test_token_ids_and_logprobs_come_when_asked(server: OpenAITestServer) -> None:
    status, r = call(
        server, "/chat/completions", chat(logprobs=True, top_logprobs=3, return_token_ids=True)
    )
    assert status == 200
    choice = r["choices"][0]
    assert len(r["prompt_token_ids"]) == r["usage"]["prompt_tokens"]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"])
    assert all(
        len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in choice["logprobs"]["content"]
    )


def test_tools_are_called_from_their_schema_then_a_tool_result_gets_text(
    server: OpenAITestServer,
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "guess",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer", "minimum": 1, "maximum": 3},
                        "word": {"type": "string"},
                    },
                },
            },
        }
    ]
    _, r = call(server, "/chat/completions", chat(tools=tools))
    [tool_call] = r["choices"][0]["message"]["tool_calls"]
    args = json.loads(tool_call["function"]["arguments"])
    assert tool_call["function"]["name"] == "guess" and 1 <= args["n"] <= 3
    assert isinstance(args["word"], str) and r["choices"][0]["finish_reason"] == "tool_calls"
    messages = [
        *chat()["messages"],
        r["choices"][0]["message"],
        {"role": "tool", "tool_call_id": tool_call["id"], "content": "too low"},
    ]
    _, final = call(server, "/chat/completions", chat(tools=tools, messages=messages))
    assert (
        final["choices"][0]["message"]["content"]
        and "tool_calls" not in final["choices"][0]["message"]
    )
    _, none = call(server, "/chat/completions", chat(tools=tools, tool_choice="none"))
    assert "tool_calls" not in none["choices"][0]["message"]


def test_auth_is_required_and_errors_have_openais_shape(server: OpenAITestServer) -> None:
    for key in (None, "wrong"):
        status, r = call(server, "/chat/completions", chat(), key=key)
        assert status == 401 and r["error"]["code"] == "invalid_api_key", r
    status, r = call(server, "/models")
    assert status == 200 and r["data"][0]["id"] == "gymckpt-test"
    status, r = call(server, "/chat/completions", chat(model="other"))
    assert status == 404 and r["error"]["code"] == "model_not_found"
    status, r = call(server, "/chat/completions", raw=b"{not json")
    assert status == 400 and "not JSON" in r["error"]["message"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.putheader("Content-Length", str(5 << 20))  # over the 4 MiB bound: answered unread
    conn.endheaders()
    response = conn.getresponse()
    r = json.loads(response.read())
    conn.close()
    assert response.status == 413 and set(r["error"]) == {"message", "type", "param", "code"}


def test_stats_count_per_capture_key_and_fault_headers_apply(server: OpenAITestServer) -> None:
    server.reset_stats()
    head = {"X-Gymckpt-Capture-Key": "k1", "X-Test-Fail-First": "1"}
    assert call(server, "/chat/completions", chat(), headers=head)[0] == 500
    assert call(server, "/chat/completions", chat(), headers=head)[0] == 200
    forced = {"X-Gymckpt-Capture-Key": "k2", "X-Test-Status": "422"}
    assert call(server, "/chat/completions", chat(), headers=forced)[0] == 422
    stats = server.stats()
    assert stats["by_capture_key"] == {"k1": 2, "k2": 1}
    assert stats["requests"] == 3 and stats["statuses"] == {"500": 1, "200": 1, "422": 1}
    status, _ = call(server, "/chat/completions", chat(stream=True))
    assert status == 400


def test_the_process_ends_at_exit_and_a_bad_flag_fails_the_start() -> None:
    with open_openai_test_server() as s:
        pid = s.pid
        assert pid is not None and call(s, "/models", key=None)[0] == 200
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with (
        pytest.raises(RuntimeError, match="did not start"),
        open_openai_test_server(extra_args=["--no-such-flag"]),
    ):
        pass


async def test_it_starts_under_trio_too() -> None:
    async with open_openai_test_server() as s:
        assert call(s, "/models", key=None)[0] == 200


def test_a_server_whose_parent_is_killed_exits(tmp_path: Path) -> None:
    """No orphan: the parent (a script holding the server) is SIGKILLed, the server follows."""
    script = (
        "import sys\n"
        "from gymckpt.testing.openai_server import open_openai_test_server\n"
        "with open_openai_test_server() as s:\n"
        "    print(s.pid, flush=True)\n"
        "    sys.stdin.read()  # until it is killed\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        server = os.pidfd_open(pid)  # readable once the server has exited
    finally:
        parent.kill()
        parent.wait(10)
        for pipe in (parent.stdin, parent.stdout):
            if pipe is not None:
                pipe.close()
    try:
        exited, _, _ = select.select([server], [], [], 10)
    finally:
        os.close(server)
    if not exited and not _zombie(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"server {pid} outlived its killed parent by 10 s")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


def test_a_burst_of_connections_is_queued_not_reset(server: OpenAITestServer) -> None:
    """A host opens up to ``max_concurrency`` connections at once (64 by default): the listen
    backlog holds them all, so none is reset (a reset costs a retry and a backoff)."""
    import threading

    burst = 64
    start = threading.Barrier(burst)
    statuses: list[int | str] = []

    def one() -> None:
        start.wait(10)
        try:
            statuses.append(call(server, "/chat/completions", chat())[0])
        except OSError as exc:  # a reset connection
            statuses.append(type(exc).__name__)

    threads = [threading.Thread(target=one) for _ in range(burst)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [200] * burst
