"""Tests of ``gym_adapter.environments.openai_model`` against the real test server process on
loopback
(``gymckpt.testing.openai_server``): episodes calling it through ``ctx.model``, its capture,
retries, the infra/data split, the timeout, the concurrency limit, auth, and asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gymckpt.gym_adapter import (
    Completed,
    EmbeddedGym,
    Environment,
    Failed,
    GymHost,
    ModelUnavailable,
    RunRow,
)
from gymckpt.gym_adapter.environments.openai_model import (
    ModelRequestRejected,
    OpenAIModel,
    openai_model,
)
from gymckpt.runtime import CheckpointMode
from gymckpt.runtime._shared import StagedRecords, read_snapshot_records
from gymckpt.testing.openai_examples import ToolAgent, first_request
from gymckpt.testing.openai_server import (
    OpenAITestServer,
    chat_completion,
    open_openai_test_server,
)

KEY = "sk-test"


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAITestServer]:
    with open_openai_test_server(api_key=KEY) as s:
        yield s


def model(server: OpenAITestServer, **kw: Any) -> OpenAIModel:
    kw = {"timeout_s": 10.0, "backoff_s": 0.01, "max_backoff_s": 0.05, **kw}
    return openai_model(base_url=server.base_url, model=server.model, api_key=KEY, **kw)


async def one_episode(m: OpenAIModel, row: int) -> Any:
    """The one reply of an episode of row ``row`` calling ``m``."""
    async with EmbeddedGym.host(Environment(agent=ToolAgent(), model=m), instances=1) as gym:
        stream = await gym.run("gym-0", [RunRow(f"{row}-0", row, 0, 0)])
        [reply] = [reply async for batch in stream for reply in batch]
    return reply


def expected(request: dict[str, Any], server: OpenAITestServer) -> dict[str, Any]:
    return chat_completion({**request, "model": server.model}, server.model)


async def test_an_episode_gets_the_servers_whole_response_asked_once_per_call(
    server: OpenAITestServer,
) -> None:
    server.reset_stats()
    env = Environment(agent=ToolAgent(), model=model(server))
    async with EmbeddedGym.host(env, instances=1) as gym:
        stream = await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(3)])
        replies = [reply async for batch in stream for reply in batch]
    assert sorted(type(r).__name__ for r in replies) == ["Completed"] * 3, replies
    for reply in replies:
        assert isinstance(reply, Completed)
        row = int(reply.rollout_id.split("-")[0])
        tool_turn, repeat, final = reply.payload
        assert tool_turn == repeat == expected(first_request(row), server)
        assert tool_turn["choices"][0]["finish_reason"] == "tool_calls"
        assert tool_turn["prompt_token_ids"] and tool_turn["choices"][0]["token_ids"]
        assert tool_turn["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert final["choices"][0]["message"]["content"]
    stats = server.stats()
    assert stats["requests"] == 9
    assert sorted(stats["by_capture_key"].values()) == [1] * 9  # no call asked twice
    assert all(k.startswith(("0-0", "1-0", "2-0")) for k in stats["by_capture_key"])


async def test_the_capture_holds_the_response_with_token_ids_and_logprobs(
    server: OpenAITestServer, tmp_path: Path
) -> None:
    asked, gate = trio.Event(), trio.Event()
    env = Environment(agent=ToolAgent(asked, gate), model=model(server))
    async with GymHost("gym-0", env) as host:
        stream = await host.run([RunRow("5-0", 5, 0, 0)])
        with trio.fail_after(10):
            await asked.wait()
        await host.prepare("c1", trio.current_time() + 30.0, CheckpointMode.UNALIGNED)
        reply = await host.commit("c1", str(tmp_path), trio.current_time() + 30.0)
        gate.set()
        await stream.aclose()
    proxy = next(p for p in reply.participants if p.server_name == "model_proxy")
    staged = read_snapshot_records(tmp_path, proxy.state_dir, StagedRecords).staged
    responses = [c.response for e in staged for c in e.calls]
    want = expected(first_request(5), server)
    assert want in responses, responses
    assert all(r["prompt_token_ids"] for r in responses)


async def test_5xx_is_retried_until_the_server_answers(server: OpenAITestServer) -> None:
    m = model(server, max_retries=3, headers={"X-Test-Fail-First": "2"})
    request = first_request(7)
    assert await m("retry/c0", request) == expected(request, server)
    assert server.stats()["by_capture_key"]["retry/c0"] == 3
    s = m.statistics()
    assert (s.calls, s.attempts, s.retries, s.unavailable) == (1, 3, 2, 0)


async def test_retries_exhausted_fail_the_episode_as_infra(server: OpenAITestServer) -> None:
    m = model(server, max_retries=1, headers={"X-Test-Fail-First": "5"})
    failed = await one_episode(m, 11)
    assert isinstance(failed, Failed) and failed.failure_class == "infra", failed
    assert "2 attempts" in failed.message and "HTTP 500" in failed.message, failed.message
    by_key = server.stats()["by_capture_key"].items()
    [(key, asked)] = [(k, n) for k, n in by_key if k.startswith("11-0:")]
    assert key.startswith("11-0:t0-") and asked == 2


async def test_a_4xx_fails_the_episode_as_data_naming_the_status(
    server: OpenAITestServer,
) -> None:
    failed = await one_episode(model(server, headers={"X-Test-Status": "400"}), 12)
    assert isinstance(failed, Failed) and failed.failure_class == "data", failed
    assert "HTTP 400" in failed.message and "on purpose" in failed.message, failed.message
    by_key = server.stats()["by_capture_key"].items()
    [(key, asked)] = [(k, n) for k, n in by_key if k.startswith("12-0:")]
    assert key.startswith("12-0:t0-") and asked == 1  # never retried


async def test_an_unknown_model_is_a_rejected_request(server: OpenAITestServer) -> None:
    m = openai_model(base_url=server.base_url, model="no-such-model", api_key=KEY)
    with pytest.raises(ModelRequestRejected, match="HTTP 404") as info:
        await m("unknown/c0", first_request(1))
    assert info.value.status == 404 and "does not exist" in (info.value.server_message or "")


async def test_a_hanging_server_is_unavailable_within_the_timeout(
    server: OpenAITestServer,
) -> None:
    m = model(server, timeout_s=0.5, headers={"X-Test-Hang": "1"})
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match=r"within timeout_s=0.5s"):
        await m("hang/c0", first_request(1))
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 2.0, elapsed


async def test_the_concurrency_limit_bounds_what_the_server_sees(
    server: OpenAITestServer,
) -> None:
    server.reset_stats()
    m = model(server, max_concurrency=2, headers={"X-Test-Latency-S": "0.1"})
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(m, f"conc/c{i}", first_request(i))
    stats = server.stats()
    assert stats["requests"] == 6 and stats["max_concurrent"] == 2, stats


@pytest.mark.parametrize("api_key", [None, "wrong"])
async def test_without_the_right_key_the_server_refuses_with_401(
    server: OpenAITestServer, api_key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    m = openai_model(base_url=server.base_url, model=server.model, api_key=api_key)
    with pytest.raises(ModelRequestRejected, match="HTTP 401") as info:
        await m("auth/c0", first_request(1))
    assert info.value.status == 401


async def test_the_key_comes_from_the_environment_when_not_given(
    server: OpenAITestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    m = openai_model(base_url=server.base_url, model=server.model)
    assert (await m("envkey/c0", first_request(1)))["object"] == "chat.completion"


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (["not", "an", "object"], "JSON object"),
        ({"messages": [], "stream": True}, "'stream': true"),
        ({"messages": [], "model": "other"}, "asks for model 'other'"),
        ({"messages": [], "temperature": float("nan")}, "request.temperature"),
    ],
)
async def test_a_request_that_cannot_be_sent_is_refused_before_the_server(
    server: OpenAITestServer, request_: Any, match: str
) -> None:
    before = server.stats()["requests"]
    with pytest.raises(ModelRequestRejected, match=match) as info:
        await model(server)("refused/c0", request_)
    assert info.value.status is None
    assert server.stats()["requests"] == before


def test_the_participant_runs_under_plain_asyncio_and_closes_its_client(
    server: OpenAITestServer,
) -> None:
    m = model(server)
    request = first_request(3)

    async def main() -> tuple[Any, Any]:
        a = await m("aio/c0", request)
        b = await m("aio/c1", request)
        return a, b

    a, b = asyncio.run(main())
    assert a == b == expected(request, server)
    assert not m._asyncio_clients or all(c.client.is_closed for c in m._asyncio_clients.values())
    assert server.stats()["by_capture_key"]["aio/c1"] == 1


async def test_under_trio_the_client_is_reused_and_closed_by_aclose(
    server: OpenAITestServer,
) -> None:
    async with model(server) as m:
        await m("trio/c0", first_request(1))
        client = m._trio_clients.get()
        await m("trio/c1", first_request(1))
        assert client is not None and m._trio_clients.get() is client
    assert client.client.is_closed and m._trio_clients.get() is None


def test_an_asyncio_trainer_runs_episodes_that_call_the_server(
    server: OpenAITestServer, tmp_path: Path
) -> None:
    """Through ``gymckpt.aio`` (the trainer on trio-asyncio's loop): every row's episode gets
    the server's responses, each call asked once."""
    import gymckpt.aio

    server.reset_stats()
    env = Environment(agent=ToolAgent(), model=model(server))

    async def main() -> list[tuple[int, Any]]:
        asyncio.get_running_loop()
        async with (
            gymckpt.aio.open_gym(lambda: EmbeddedGym.host(env, instances=1)) as gym,
            gymckpt.aio.open_rollouts(
                gym, tmp_path / "w", rows=3, group_size=1, handle_signals=False
            ) as ro,
        ):
            return [
                (g.row, r.payload)
                async for batch in ro.batches(1)
                for g in batch
                for r in g.results
            ]

    results = gymckpt.aio.run(main)
    assert sorted(row for row, _ in results) == [0, 1, 2]
    for row, payload in results:
        assert payload[0] == expected(first_request(row), server)
    stats = server.stats()
    assert stats["requests"] == 9 and set(stats["by_capture_key"].values()) == {1}, stats


async def test_the_timeout_covers_every_retry(server: OpenAITestServer) -> None:
    """Retries left, but the call's time is up: unavailable at the bound, naming the last 500."""
    head = {"X-Test-Fail-First": "1000", "X-Test-Latency-S": "0.1"}
    m = model(server, timeout_s=0.5, max_retries=100, headers=head)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match=r"within timeout_s=0.5s \(last: HTTP 500"):
        await m("budget/c0", first_request(1))
    assert 0.5 <= time.monotonic() - started < 2.0
    assert 2 <= server.stats()["by_capture_key"]["budget/c0"] <= 6


async def test_the_responses_api_by_the_same_rules(server: OpenAITestServer) -> None:
    m = model(server, api="responses")
    r = await m("responses/c0", {"input": "hello", "instructions": "be brief"})
    chat = expected(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello"},
            ]
        },
        server,
    )
    assert (
        r["object"] == "response" and r["output_text"] == chat["choices"][0]["message"]["content"]
    )
    assert r["usage"]["total_tokens"] == chat["usage"]["total_tokens"]
    with pytest.raises(ModelRequestRejected, match="'stream': true"):
        await m("responses/c1", {"input": "hello", "stream": True})


async def test_a_fastapi_error_body_is_shown_by_its_detail(server: OpenAITestServer) -> None:
    """A FastAPI server (``transformers serve``) answers errors as ``{"detail": …}``: the
    message says the detail, not the raw JSON body (issue 31, finding 11)."""
    m = model(server, headers={"X-Test-Status": "404", "X-Test-Error-Shape": "fastapi"})
    with pytest.raises(ModelRequestRejected) as info:
        await m("k-fastapi", first_request(0), None)
    assert info.value.status == 404
    assert info.value.server_message == "status 404 on purpose", info.value.server_message
    assert str(info.value).endswith("HTTP 404: status 404 on purpose"), str(info.value)
    assert "detail" not in str(info.value)


def test_fastapi_validation_errors_are_joined_by_their_location() -> None:
    from gymckpt.gym_adapter.environments.openai_model import _server_message

    body = (
        b'{"detail": [{"type": "missing", "loc": ["body", "messages"], "msg": "Field required",'
        b' "input": {}}, {"loc": ["body", "n"], "msg": "Input should be a valid integer"}]}'
    )
    assert _server_message(body) == (
        "body.messages: Field required; body.n: Input should be a valid integer"
    )
    assert _server_message(b'{"detail": "Not Found"}') == "Not Found"
    assert _server_message(b'{"detail": {"message": "busy"}}') == "busy"
    # OpenAI's shape wins, and a detail of another shape leaves the body as it was
    assert _server_message(b'{"error": {"message": "m"}, "detail": "d"}') == "m"
    assert _server_message(b'{"detail": 3}') == '{"detail": 3}'
