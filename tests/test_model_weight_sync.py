"""The model server across a trainer crash: a server left at a newer weight version by a
SIGKILLed trainer is brought back to the snapshot's version by the trainer's
``open_rollouts(on_restore=...)`` hook before any episode calls it, and no captured call is
recorded under another version than the one that answered it (``check_weight_version``), with
the version read from each response (SGLang) or from the engine's ``GET /weight_info``
(vLLM). Also the client's ``require=`` and its 422 configuration error, against the test
server: a run whose requests the server refuses stops after one model call, with exit code 2,
on the embedded host and over HTTP, and a rerun without the refused field resumes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import trio

from gymckpt.gym_adapter import EpisodeConfigError
from gymckpt.gym_adapter.environments.openai_model import (
    ModelResponseIncomplete,
    ModelServerIncompatible,
    ModelVersionMismatch,
    openai_model,
)
from gymckpt.gym_adapter.host._episode import POLICY_VERSION
from gymckpt.testing.openai_server import open_openai_test_server

KEY = "sk-test"


def _trainer(workdir: Path, base_url: str, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "gymckpt.testing.llm_agent", "--workdir", str(workdir)]
    return [*args, "--base-url", base_url, "--api-key", KEY, "--rows", "8", *extra]


@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["response", "engine"])
def test_server_left_at_newer_weights_by_a_killed_trainer_is_resynced(
    tmp_path: Path, source: str
) -> None:
    """``source`` ``engine``: the server reports its version only at ``GET /weight_info``
    (as vLLM does), never in a response; the client reads it before and after each call."""
    server_args = ("--engine-version-only",) if source == "engine" else ()
    trainer_args = ("--weight-sync", "--weight-version-source", source)
    with open_openai_test_server(api_key=KEY, latency_s=0.05, extra_args=server_args) as server:
        work = tmp_path / "work"
        proc = subprocess.Popen(
            _trainer(work, server.base_url, *trainer_args),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the first checkpoint, at policy version v = 1
            assert line.startswith("checkpoint") and line.split()[2] == "True", line
            # the trainer had pushed newer weights to the server when it died
            server.update_weights(99)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(60)
            assert proc.stdout is not None
            proc.stdout.close()
        server.wait_idle(30.0)  # the killed trainer's calls end (a long poll, not a sleep)
        server.reset_stats()
        done = subprocess.run(
            _trainer(work, server.base_url, *trainer_args),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        journal = [orjson.loads(x) for x in (work / "journal.jsonl").read_bytes().splitlines()]
        calls = [c for step in journal for p in step["payloads"] for c in p["calls"]]
        assert calls
        wrong = [c for c in calls if c["served_version"] != str(c["policy_version"])]
        assert not wrong, f"calls recorded under another version than answered them: {wrong}"
        assert all(c["served_version"] != "99" for c in calls)
        # the restore pushed the snapshot's weights before any episode asked the server
        assert "99" not in server.stats()["weight_versions"]


async def _ask(model, request, version=None):  # type: ignore[no-untyped-def]
    token = POLICY_VERSION.set(version)
    try:
        return await model("0-0:t0-0000000000000000-c0", request, None)
    finally:
        POLICY_VERSION.reset(token)


HELLO = {"messages": [{"role": "user", "content": "hi"}]}


async def test_a_response_of_another_weight_version_is_never_returned() -> None:
    async with open_openai_test_server(extra_args=("--weight-version", "3")) as server:
        model = openai_model(
            base_url=server.base_url,
            model=server.model,
            check_weight_version=True,
            backoff_s=0.01,
            max_backoff_s=0.02,
            max_retries=2,
        )
        got = await _ask(model, HELLO, 3)
        assert got["metadata"] == {"weight_version": "3"}
        with pytest.raises(ModelVersionMismatch, match="weight version 3 answered, policy"):
            await _ask(model, HELLO, 4)
        assert model.statistics().version_mismatches == 3
        await trio.to_thread.run_sync(server.update_weights, 4)
        assert (await _ask(model, HELLO, 4))["metadata"] == {"weight_version": "4"}
        await model.aclose()


async def test_require_names_the_server_and_the_missing_field() -> None:
    async with open_openai_test_server() as server:
        model = openai_model(
            base_url=server.base_url, model=server.model, require=("logprobs", "token_ids")
        )
        with pytest.raises(ModelResponseIncomplete, match=r"at http://127.*'logprobs'"):
            await _ask(model, HELLO)
        with pytest.raises(ModelResponseIncomplete, match="'token_ids'"):
            await _ask(model, {**HELLO, "logprobs": True})
        got = await _ask(model, {**HELLO, "logprobs": True, "return_token_ids": True})
        assert got["choices"][0]["token_ids"] and got["prompt_token_ids"]
        await model.aclose()


async def test_a_422_for_an_unknown_field_is_a_configuration_error() -> None:
    args = ("--reject-field", "return_token_ids")
    async with open_openai_test_server(extra_args=args) as server:
        model = openai_model(base_url=server.base_url, model=server.model)
        with pytest.raises(ModelServerIncompatible) as caught:
            await _ask(model, {**HELLO, "return_token_ids": True})
        text = str(caught.value)
        assert "HTTP 422: body.return_token_ids: Extra inputs are not permitted" in text
        assert "leave that field out" in text
        assert caught.value.status == 422
        await model.aclose()


@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["embedded", pytest.param("http", marks=pytest.mark.http)])
def test_a_server_refusing_a_field_stops_the_run_after_one_model_call(
    tmp_path: Path, backend: str
) -> None:
    """The server answers 422 to vLLM's ``return_token_ids`` (as ``transformers serve``
    does): the run stops at the first call with exit code 2 and a line naming the server and
    the field, rather than failing every row as data until exit 7; no row is failed, so a
    rerun without the field trains every row once."""
    http = ("--http",) if backend == "http" else ()
    sizing = ("--group-size", "1", "--rows-in-flight", "1", *http)
    args = ("--reject-field", "return_token_ids")
    with open_openai_test_server(api_key=KEY, extra_args=args) as server:
        work = tmp_path / "work"
        refused = subprocess.run(
            _trainer(work, server.base_url, "--return-token-ids", *sizing),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2, refused.stderr[-3000:]
        line = refused.stderr.strip().splitlines()[-1]
        assert line.startswith("gymckpt: error: episode "), line
        assert f"at {server.base_url}/chat/completions" in line
        assert "HTTP 422: body.return_token_ids: Extra inputs are not permitted" in line
        assert "leave that field out" in line and "no row was failed" in line
        assert server.stats()["requests"] == 1  # ONE model call, not one per row
        done = subprocess.run(
            _trainer(work, server.base_url, *sizing),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    journal = [orjson.loads(x) for x in (work / "journal.jsonl").read_bytes().splitlines()]
    rows = sorted(p["rollout_id"].split("-")[0] for step in journal for p in step["payloads"])
    assert rows == sorted(str(r) for r in range(8))  # every row trained once


async def test_the_engine_weight_version_is_read_before_and_after_the_call() -> None:
    """``weight_version_source="engine"`` (vLLM): the server reports no version in its
    responses, the client reads ``GET /weight_info``. An engine at another version is not
    asked at all; an update landing during the call makes its response a mismatch (dropped);
    a response answered in version gets the version in ``metadata.weight_version``."""
    args = ("--weight-version", "3", "--engine-version-only")
    async with open_openai_test_server(extra_args=args) as server:
        model = openai_model(
            base_url=server.base_url,
            model=server.model,
            check_weight_version=True,
            weight_version_source="engine",
            backoff_s=0.01,
            max_backoff_s=0.02,
            max_retries=2,
        )
        got = await _ask(model, HELLO, 3)
        assert got["metadata"] == {"weight_version": "3"}
        with pytest.raises(ModelVersionMismatch, match="weight version 3 answered, policy"):
            await _ask(model, HELLO, 4)
        assert model.statistics().version_mismatches == 3
        stats = await trio.to_thread.run_sync(server.stats)
        assert stats["requests"] == 1  # the engine at version 3 was never asked for 4
        during = openai_model(
            base_url=server.base_url,
            model=server.model,
            check_weight_version=True,
            weight_version_source="engine",
            headers={"X-Test-Set-Version-During": "5"},
            backoff_s=0.01,
            max_backoff_s=0.02,
            max_retries=0,
        )
        with pytest.raises(ModelVersionMismatch, match=r"3 then 5 \(an update during the call\)"):
            await _ask(during, HELLO, 3)
        await trio.to_thread.run_sync(server.update_weights, 4)
        assert (await _ask(model, HELLO, 4))["metadata"] == {"weight_version": "4"}
        await model.aclose()
        await during.aclose()


async def test_an_engine_without_weight_info_is_a_configuration_error() -> None:
    async with open_openai_test_server() as server:
        nowhere = server.base_url.removesuffix("/v1") + "/no_weight_info"
        model = openai_model(
            base_url=server.base_url,
            model=server.model,
            check_weight_version=True,
            weight_version_source="engine",
            weight_info_url=nowhere,
        )
        with pytest.raises(ModelServerIncompatible, match="VLLM_SERVER_DEV_MODE=1") as caught:
            await _ask(model, HELLO, 0)
        assert isinstance(caught.value, EpisodeConfigError)
        assert f"GET {nowhere}" in str(caught.value) and "HTTP 404" in str(caught.value)
        plain = openai_model(
            base_url=server.base_url,
            model=server.model,
            check_weight_version=True,
            weight_version_source="engine",
        )
        with pytest.raises(ModelResponseIncomplete, match="reports no weight_version"):
            await _ask(plain, HELLO, 0)  # a server holding no version reports null
        await model.aclose()
        await plain.aclose()
