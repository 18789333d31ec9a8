"""A small deterministic OpenAI-compatible HTTP server, run as its own process, for tests and
for running the LLM examples offline:

    python -m gymckpt.testing.openai_server --port 0 --port-file port.txt [--api-key K]

    with open_openai_test_server(api_key="k") as server:      # or: async with (trio, asyncio)
        model = openai_model(base_url=server.base_url, model=server.model, api_key="k")
        ...
        server.stats()["by_capture_key"]                       # how often each call was asked

``POST /v1/chat/completions`` answers from the request alone: the same request always gets the
same response (``POST /v1/responses`` too: a Responses request, ``input`` and ``instructions``,
gets the same text in that API's shape, text only). With ``tools`` (and ``tool_choice`` not
``"none"``) and a last message that is not a tool result, it calls the first (or the named) tool
with arguments built from its JSON schema; otherwise it answers text drawn from a sha256 of the
model, the messages and the seed. Each response has ``usage``, ``logprobs`` when asked
(``top_logprobs`` too), and with ``return_token_ids: true`` vLLM's ``prompt_token_ids`` and
per-choice ``token_ids``. ``GET /v1/models`` lists the model. ``GET /stats`` (authenticated):
``requests``, ``max_concurrent``, ``in_flight``, ``by_capture_key`` (from
``X-Gymckpt-Capture-Key``), ``statuses``, ``weight_versions`` (completions answered per
reported weight version); ``POST /stats/reset`` zeroes them.

Faults, per server flag or per request header: ``--latency-s`` / ``X-Test-Latency-S``;
``--fail-first N`` / ``X-Test-Fail-First: N`` (the first N requests of each capture key answer
500); ``X-Test-Status: 400`` (answer that status); ``X-Test-Hang: 1`` (answer nothing until the
client hangs up, at most ``--max-hang-s``). An outage: ``POST /test/outage`` with
``{"seconds": S}`` (authenticated; ``OpenAITestServer.outage(S)``) answers every completion 503
for the next S seconds, as a server restarting for a weight update does; and
``OpenAITestServer.restart(down_s)`` stops the process and starts it again on the same port
(nothing listens meanwhile). It binds loopback by default, wants the bearer token when
``--api-key`` is given (401 otherwise), refuses bodies over ``--max-body-bytes`` (413), and
answers every error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``),
or in FastAPI's (``{"detail": "…"}``) to a request with ``X-Test-Error-Shape: fastapi``.
The process exits when its parent dies, so a killed test leaves no server behind.

Weights, as an engine holds them: ``--weight-version V`` (or ``POST /update_weights`` with
``{"version": V}``, authenticated; ``OpenAITestServer.update_weights(V)``) makes every
completion report ``metadata.weight_version`` (SGLang's field) as ``str(V)``; without either,
responses carry no ``metadata`` (byte for byte as before). The engine reports its version as
vLLM does, at ``GET /weight_info`` (``{"weight_version": V}``, null when none; ``POST
/update_weight_version`` with ``{"new_version": V}`` sets it, as vLLM's dev-mode route does);
``--engine-version-only`` leaves ``metadata`` out of responses (vLLM reports no version per
response), and ``X-Test-Set-Version-During: V`` sets the version to V while that completion
is answered (an update landing during the call). ``--reject-field NAME`` answers a
request carrying field NAME with 422 in FastAPI's validation shape (``{"detail": [{"loc":
["body", NAME], "msg": ...}]}``), as ``transformers serve`` answers vLLM's
``return_token_ids``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

import attrs

__all__ = [
    "DEFAULT_MODEL",
    "OpenAITestServer",
    "chat_completion",
    "main",
    "open_openai_test_server",
]

DEFAULT_MODEL: Final = "gymckpt-test"
_CAPTURE_KEY: Final = "X-Gymckpt-Capture-Key"
_WORDS: Final = [
    "the",
    "a",
    "model",
    "answers",
    "plan",
    "move",
    "left",
    "right",
    "up",
    "down",
    "wait",
    "look",
    "take",
    "give",
    "open",
    "close",
    "north",
    "south",
    "east",
    "west",
    "yes",
    "no",
    "maybe",
    "guess",
    "letter",
    "word",
    "number",
    "tool",
    "call",
    "done",
    "next",
    "again",
]
_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]")


# -- deterministic answers ------------------------------------------------------------------


def _digest(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def _token_ids(text: str) -> list[int]:
    """A stand-in tokenizer: each word or punctuation mark an id below 32000."""
    return [int.from_bytes(_digest(t)[:4], "big") % 32000 for t in _TOKEN_RE.findall(text)]


def _prompt_text(messages: Any) -> str:
    out = []
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
            out.append(f"<|{m.get('role')}|>{text}")
    return "\n".join(out)


def _schema_value(schema: Any, seed: bytes, name: str) -> Any:
    """A value of JSON schema ``schema``, a function of ``seed`` and ``name``."""
    h = int.from_bytes(hashlib.sha256(seed + name.encode()).digest()[:8], "big")
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][h % len(schema["enum"])]
    kind = schema.get("type")
    if kind == "integer":
        lo, hi = int(schema.get("minimum", 0)), int(schema.get("maximum", 9))
        return lo + h % max(1, hi - lo + 1)
    if kind == "number":
        return round((h % 10000) / 100, 2)
    if kind == "boolean":
        return bool(h & 1)
    if kind == "array":
        return [_schema_value(schema.get("items", {}), seed, f"{name}[0]")]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _schema_value(v, seed, f"{name}.{k}") for k, v in sorted(props.items())}
    return _WORDS[h % len(_WORDS)]


def _logprobs(tokens: list[str], seed: bytes, top: int) -> dict[str, Any]:
    content = []
    for i, tok in enumerate(tokens):
        h = _digest(seed.hex(), i)
        lp = -round(h[0] / 64, 4)
        alts = [_WORDS[(h[1] + j) % len(_WORDS)] for j in range(top)]
        entry: dict[str, Any] = {"token": tok, "logprob": lp, "bytes": list(tok.encode())}
        entry["top_logprobs"] = [
            {"token": a, "logprob": lp - j - 1, "bytes": list(a.encode())}
            for j, a in enumerate(alts)
        ]
        content.append(entry)
    return {"content": content}


def chat_completion(request: dict[str, Any], model: str) -> dict[str, Any]:
    """The deterministic response to ``request`` (a chat-completions request)."""
    messages = request.get("messages", [])
    seed = _digest(model, messages, request.get("seed"), request.get("tools"))
    n = int(request.get("n") or 1)
    limit = int(request.get("max_completion_tokens") or request.get("max_tokens") or 12)
    tools = request.get("tools") or []
    choice_rule = request.get("tool_choice", "auto")
    last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    prompt = _prompt_text(messages)
    choices, completion_tokens = [], 0
    for index in range(n):
        cseed = _digest(seed.hex(), index)
        message: dict[str, Any]
        if tools and choice_rule != "none" and last_role != "tool":
            fn = tools[0].get("function", {})
            if isinstance(choice_rule, dict):
                name = choice_rule.get("function", {}).get("name")
                fn = next((t["function"] for t in tools if t["function"]["name"] == name), fn)
            args = _schema_value(fn.get("parameters", {"type": "object"}), cseed, fn.get("name"))
            arguments = json.dumps(args, sort_keys=True)
            call: dict[str, Any] = {"id": f"call_{cseed.hex()[:24]}", "type": "function"}
            call["function"] = {"name": fn.get("name"), "arguments": arguments}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            text, finish = arguments, "tool_calls"
        else:
            count = 3 + cseed[0] % 10
            words = [_WORDS[b % len(_WORDS)] for b in cseed[1 : 1 + min(count, limit)]]
            text = " ".join(words)
            message = {"role": "assistant", "content": text}
            finish = "length" if count > limit else "stop"
        tokens = _TOKEN_RE.findall(text)
        completion_tokens += len(tokens)
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        choice["logprobs"] = None
        if request.get("logprobs"):
            choice["logprobs"] = _logprobs(tokens, cseed, int(request.get("top_logprobs") or 0))
        if request.get("return_token_ids"):
            choice["token_ids"] = _token_ids(text)
        choices.append(choice)
    prompt_ids = _token_ids(prompt)
    response: dict[str, Any] = {
        "id": f"chatcmpl-{seed.hex()[:24]}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
    }
    if request.get("return_token_ids"):
        response["prompt_token_ids"] = prompt_ids
    return response


def _as_chat(request: dict[str, Any]) -> dict[str, Any]:
    """A Responses request (``input``: a string or messages; ``instructions``) as a chat one."""
    given = request.get("input")
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if isinstance(messages, list) and isinstance(request.get("instructions"), str):
        messages = [{"role": "system", "content": request["instructions"]}, *messages]
    keep = {k: v for k, v in request.items() if k not in ("input", "instructions", "tools")}
    return {**keep, "messages": messages}


def _as_response(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's first choice in the Responses API's shape (text output only)."""
    text = chat["choices"][0]["message"].get("content") or ""
    usage = chat["usage"]
    return {
        "id": "resp_" + chat["id"].removeprefix("chatcmpl-"),
        "object": "response",
        "created_at": chat["created"],
        "model": chat["model"],
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_" + chat["id"].removeprefix("chatcmpl-"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "output_text": text,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    }


# -- the server ------------------------------------------------------------------------------


@attrs.define(eq=False, slots=True)
class _Stats:
    lock: threading.Condition = attrs.field(factory=threading.Condition)
    """Guards every count; notified when ``in_flight`` drops (``wait_idle``)."""
    requests: int = 0
    in_flight: int = 0
    max_concurrent: int = 0
    by_key: dict[str, int] = attrs.field(factory=dict)
    statuses: dict[str, int] = attrs.field(factory=dict)
    weight_versions: dict[str, int] = attrs.field(factory=dict)
    """Completions answered per reported weight version."""
    down_until: float = 0.0
    """``time.monotonic()`` until which completions answer 503 (``POST /test/outage``)."""
    weight_version: str | None = None
    """The weight version the server reports (``POST /update_weights``); None: none."""

    def view(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests,
                "in_flight": self.in_flight,
                "max_concurrent": self.max_concurrent,
                "by_capture_key": dict(self.by_key),
                "statuses": dict(self.statuses),
                "weight_versions": dict(self.weight_versions),
            }

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no completion is in flight; False if ``timeout_s`` passed first."""
        with self.lock:
            return self.lock.wait_for(lambda: self.in_flight == 0, timeout_s)

    def reset(self) -> None:
        with self.lock:
            self.requests = self.max_concurrent = 0
            self.by_key.clear()
            self.statuses.clear()
            self.weight_versions.clear()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a host's burst of connections waits in the backlog, not reset
    options: argparse.Namespace
    stats: _Stats


def _error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read /stats
        pass

    def _send(self, status: int, value: Any, close: bool = False) -> None:
        if status >= 400 and self.headers.get("X-Test-Error-Shape") == "fastapi":
            value = {"detail": value["error"]["message"]}  # FastAPI's HTTPException body
        self._send_json(status, value, close)

    def _send_json(self, status: int, value: Any, close: bool = False) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        key = self.server.options.api_key
        if not key:
            return True
        got = self.headers.get("Authorization", "")
        if hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
            return True
        self._send(
            401,
            _error(401, "invalid or missing API key (Authorization: Bearer …)", "invalid_api_key"),
        )
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path in ("/v1/models", "/models"):
            model = {"id": self.server.options.model, "object": "model", "owned_by": "gymckpt"}
            self._send(200, {"object": "list", "data": [model]})
        elif self.path == "/stats":
            self._send(200, self.server.stats.view())
        elif self.path == "/weight_info":  # vLLM's dev-mode route
            with self.server.stats.lock:
                version = self.server.stats.weight_version
            self._send(200, {"weight_version": version})
        elif self.path.startswith("/stats/idle?timeout="):  # a long poll: no sleeping client
            try:
                timeout_s = min(float(self.path.partition("=")[2]), 60.0)
            except ValueError as exc:
                self._send(400, _error(400, f"/stats/idle?timeout=SECONDS: {exc}"))
                return
            self._send(200, {"idle": self.server.stats.wait_idle(timeout_s)})
        else:
            self._send(404, _error(404, f"no route GET {self.path}"))

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path == "/stats/reset":
            self.server.stats.reset()
            self._send(200, {"ok": True})
            return
        if self.path in ("/update_weights", "/update_weight_version"):
            field = "version" if self.path == "/update_weights" else "new_version"
            try:
                length = int(self.headers.get("Content-Length", "0") or 0)
                version = json.loads(self.rfile.read(length))[field]
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, _error(400, f'{self.path} takes {{"{field}": V}}: {exc}'))
                return
            with self.server.stats.lock:
                self.server.stats.weight_version = str(version)
            self._send(200, {"ok": True, "weight_version": str(version)})
            return
        if self.path == "/test/outage":
            try:
                length = int(self.headers.get("Content-Length", "0") or 0)
                seconds = float(json.loads(self.rfile.read(length))["seconds"])
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, _error(400, f'/test/outage takes {{"seconds": S}}: {exc}'))
                return
            with self.server.stats.lock:
                self.server.stats.down_until = time.monotonic() + seconds
            self._send(200, {"ok": True, "seconds": seconds})
            return
        if self.path not in ("/v1/chat/completions", "/v1/responses"):
            self._send(404, _error(404, f"no route POST {self.path}"), close=True)
            return
        stats = self.server.stats
        key = self.headers.get(_CAPTURE_KEY, "")
        with stats.lock:
            stats.requests += 1
            stats.in_flight += 1
            stats.max_concurrent = max(stats.max_concurrent, stats.in_flight)
            stats.by_key[key] = asked = stats.by_key.get(key, 0) + 1
        status = 0
        try:
            status = self._complete(asked)
        finally:
            with stats.lock:
                stats.in_flight -= 1
                stats.lock.notify_all()
                stats.statuses[str(status)] = stats.statuses.get(str(status), 0) + 1

    def _complete(self, asked: int) -> int:
        """Answer one chat-completions request; the status it answered (0: none)."""
        opts = self.server.options
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, _error(411, "Content-Length is required"), close=True)
            return 411
        if length > opts.max_body_bytes:
            self._send(413, _error(413, f"body over {opts.max_body_bytes} bytes"), close=True)
            return 413
        raw = self.rfile.read(length)
        if time.monotonic() < self.server.stats.down_until:
            self._send(503, _error(503, "the model server is restarting (an outage on purpose)"))
            return 503
        latency = float(self.headers.get("X-Test-Latency-S", opts.latency_s))
        if latency > 0:
            time.sleep(latency)
        if self.headers.get("X-Test-Hang"):
            self._hang(opts.max_hang_s)
            return 0
        if asked <= int(self.headers.get("X-Test-Fail-First", opts.fail_first)):
            self._send(500, _error(500, f"failing attempt {asked} on purpose"))
            return 500
        forced = int(self.headers.get("X-Test-Status", "0") or 0)
        if forced:
            self._send(forced, _error(forced, f"status {forced} on purpose"))
            return forced
        try:
            request = json.loads(raw)
        except ValueError as exc:
            self._send(400, _error(400, f"body is not JSON: {exc}"))
            return 400
        responses = self.path == "/v1/responses"
        if isinstance(request, dict) and responses:
            request = _as_chat(request)
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            self._send(400, _error(400, "a request is an object with a 'messages' list"))
            return 400
        if request.get("model") != opts.model:
            message = f"the model {request.get('model')!r} does not exist"
            self._send(404, _error(404, message, "model_not_found"))
            return 404
        if request.get("stream"):
            self._send(400, _error(400, "streaming is not supported by this test server"))
            return 400
        for name in opts.reject_field:
            if name in request:
                item = {"type": "extra_forbidden", "loc": ["body", name]}
                item |= {"msg": "Extra inputs are not permitted", "input": request[name]}
                self._send_json(422, {"detail": [item]})
                return 422
        try:
            response = chat_completion(request, opts.model)
            if responses:
                response = _as_response(response)
            during = self.headers.get("X-Test-Set-Version-During")
            with self.server.stats.lock:
                answered_by = self.server.stats.weight_version
                if during is not None:  # an update lands while this call is answered
                    self.server.stats.weight_version = during
            version = answered_by
            if version is not None and not opts.engine_version_only:
                response["metadata"] = {"weight_version": version}
            if version is not None:
                with self.server.stats.lock:
                    counts = self.server.stats.weight_versions
                    counts[version] = counts.get(version, 0) + 1
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            self._send(400, _error(400, f"bad request: {exc}"))
            return 400
        self._send(200, response)
        return 200

    def _hang(self, limit: float) -> None:
        """Answer nothing until the client closes the connection (or ``limit`` passes)."""
        sock = self.connection
        end = time.monotonic() + limit
        while time.monotonic() < end:
            ready, _, _ = select.select([sock], [], [], 0.05)
            if ready and not sock.recv(1, socket.MSG_PEEK):
                break
        self.close_connection = True


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until killed (see the module docstring for the flags)."""
    p = argparse.ArgumentParser(prog="python -m gymckpt.testing.openai_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--latency-s", type=float, default=0.0)
    p.add_argument("--fail-first", type=int, default=0, help="500 for each key's first N")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--max-hang-s", type=float, default=60.0)
    p.add_argument("--exit-with-parent", action="store_true")
    p.add_argument("--weight-version", default=None, help="report this weight version")
    p.add_argument("--reject-field", action="append", default=[], help="422 a request with it")
    p.add_argument(
        "--engine-version-only",
        action="store_true",
        help="report the weight version at GET /weight_info only, not in responses (vLLM)",
    )
    opts = p.parse_args(argv)
    server = _Server((opts.host, opts.port), _Handler)
    server.options, server.stats = opts, _Stats(weight_version=opts.weight_version)
    if opts.exit_with_parent:
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    if opts.port_file is not None:
        tmp = opts.port_file.with_name(opts.port_file.name + ".tmp")
        tmp.write_text(str(server.server_address[1]))
        tmp.replace(opts.port_file)
    server.serve_forever()


# -- starting it from a test or a script -----------------------------------------------------


@final
@attrs.define(eq=False, slots=True, kw_only=True)
class OpenAITestServer:
    """The server as a child process: ``with`` (or ``async with``) starts it and waits for its
    port (at most ``startup_timeout_s``), exit terminates it (then kills it after 5 s).
    ``base_url`` is ``http://127.0.0.1:PORT/v1`` while it runs."""

    api_key: str | None = None
    model: str = DEFAULT_MODEL
    latency_s: float = 0.0
    fail_first: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 30.0
    port: int = attrs.field(init=False, default=0)
    _proc: subprocess.Popen[bytes] | None = attrs.field(init=False, default=None)
    _dir: tempfile.TemporaryDirectory[str] | None = attrs.field(init=False, default=None)

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RuntimeError("the test server is not running (use 'with')")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, port: int = 0) -> None:
        """Start the process on ``port`` (0: one the OS picks) and wait for it to listen."""
        self._dir = tempfile.TemporaryDirectory(prefix="gymckpt-openai-")
        port_file = Path(self._dir.name) / "port"
        log = open(Path(self._dir.name) / "stderr", "wb")  # noqa: SIM115 (the child owns it)
        args = [sys.executable, "-m", "gymckpt.testing.openai_server", "--port", str(port)]
        args += ["--port-file", str(port_file), "--model", self.model, "--exit-with-parent"]
        args += ["--latency-s", str(self.latency_s), "--fail-first", str(self.fail_first)]
        if self.api_key is not None:
            args += ["--api-key", self.api_key]
        with log:
            self._proc = subprocess.Popen(
                [*args, *self.extra_args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        end = time.monotonic() + self.startup_timeout_s
        while not port_file.exists():
            if self._proc.poll() is not None or time.monotonic() > end:
                err = (Path(self._dir.name) / "stderr").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"the OpenAI test server did not start: {err.strip()}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def stop(self) -> None:
        proc, self._proc, self.port = self._proc, None, 0
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the process, wait ``down_s`` (nothing listens on the port: connections are
        refused), and start it again on the same port; its stats start from zero."""
        port = self.port
        self.stop()
        time.sleep(down_s)
        self.start(port)

    def outage(self, seconds: float) -> None:
        """Answer every completion 503 for the next ``seconds`` (the process keeps running)."""
        self._request("POST", "/test/outage", {"seconds": seconds})

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        url = self.base_url.removesuffix("/v1") + path
        data = json.dumps(body).encode() if body is not None else b"" if method == "POST" else None
        req = urllib.request.Request(url, method=method, data=data)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def update_weights(self, version: int | str) -> None:
        """``POST /update_weights``: report weight version ``version`` from now on."""
        self._request("POST", "/update_weights", {"version": version})

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: requests, max_concurrent, in_flight, by_capture_key, statuses."""
        return dict(self._request("GET", "/stats"))

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Return once the server has no completion in flight (``GET /stats/idle``, a long
        poll); ``TimeoutError`` if one is still in flight after ``timeout_s``."""
        answer = self._request("GET", f"/stats/idle?timeout={timeout_s}", timeout=timeout_s + 10)
        if not answer["idle"]:
            raise TimeoutError(f"the test server still had calls in flight after {timeout_s} s")

    def reset_stats(self) -> None:
        self._request("POST", "/stats/reset")

    def __enter__(self) -> OpenAITestServer:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> OpenAITestServer:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        import anyio.to_thread

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)


def open_openai_test_server(
    *,
    api_key: str | None = None,
    model: str = DEFAULT_MODEL,
    latency_s: float = 0.0,
    fail_first: int = 0,
    extra_args: Sequence[str] = (),
) -> OpenAITestServer:
    """A test server to use as ``with open_openai_test_server() as server:`` (or ``async
    with``, under trio or asyncio): ``server.base_url``, ``server.model``, ``server.stats()``."""
    return OpenAITestServer(
        api_key=api_key,
        model=model,
        latency_s=latency_s,
        fail_first=fail_first,
        extra_args=tuple(extra_args),
    )


if __name__ == "__main__":
    main()
