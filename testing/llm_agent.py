"""A multi-turn, tool-using LLM agent on an OpenAI-compatible server, and a trainer process
that runs it, for the crash tests (and as a fuller version of the README's LLM example):

    python -m gymckpt.testing.llm_agent --workdir W --base-url URL [--api-key K] [--rows N]
                                        [--changed-request] [--parallel] [--weight-sync]
                                        [--weight-version-source response|engine]
                                        [--return-token-ids] [--group-size G]
                                        [--rows-in-flight R] [--http]

Each row of the dataset is a question (``{"q": ..., "a": ..., "b": ...}``); the agent asks the
model with an ``add`` tool, runs every tool call the model makes against the ``calculator``
participant (whose session counts its uses; the tool takes ``TOOL_LATENCY_S`` times 1 to 4),
and ends when the model answers in text (or after ``MAX_TURNS`` turns). Its payload records
every model call of the episode as the agent saw it: the capture's identity (``ctx.calls``:
capture key, request digest, policy version, replayed) beside a sha256 of the response the
agent got, so a test can hold the trajectory against the server's log and the snapshot's
capture.

The trainer runs unaligned checkpoints (episodes are taken mid-turn), tells Gym a new policy
version before every checkpoint (as a trainer does after it updates the weights), journals
every trained step to ``W/journal.jsonl`` (one fsync'd line per step) and prints one line per
checkpoint: ``checkpoint ID OK MID_TURN`` (flushed). ``--changed-request`` makes the agent add
a system message to every request: a restored episode's staged calls then no longer match
their requests and fail closed. ``--parallel`` makes each turn ask three calls at once in a trio
nursery (parallel tool calls, as agents make them): the turn's request twice (identical
requests) and a ``judge`` request; the first answer drives the conversation.
``--weight-sync`` runs the model server as an engine holding the policy's weights: the trainer
pushes each new policy version to it (``POST /update_weights``), brings it back to the
snapshot's version on restore (``open_rollouts(on_restore=...)``), and the client checks the
version each response reports (``check_weight_version``); each payload call records the
version the server reported (``served_version``). ``--weight-version-source engine`` reads
the version from the engine instead, as vLLM reports it (``GET /weight_info``).
``--return-token-ids`` adds vLLM's ``return_token_ids: true`` to every request (a server
that does not know it answers 422: the run stops with exit code 2). ``--group-size`` and
``--rows-in-flight`` size the run (default 2 and 4). ``--http`` serves Gym from ``gymckpt
serve`` processes (``HttpGym.spawn`` of ``environment_from_environ``) instead of embedded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import orjson
import trio

from gymckpt.gym_adapter import (
    Done,
    EmbeddedGym,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    HttpGym,
)
from gymckpt.gym_adapter.environments.openai_model import openai_model

__all__ = [
    "MAX_TURNS",
    "TOOLS",
    "Calculator",
    "ToolAgent",
    "dataset",
    "environment_from_environ",
    "main",
    "tool_environment",
]

MAX_TURNS: Final = 4
TOOL_LATENCY_S: Final = 0.1
"""How long the calculator takes (a tool's latency), times 1 to 4 by the row, so episodes fall
out of step: a checkpoint finds some here, inside a turn whose model call completed; restored,
the turn runs again and its call is answered from the capture."""
TOOLS: Final = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def dataset(rows: int) -> list[dict[str, Any]]:
    """``rows`` questions, each a task of the trainer's dataset."""
    return [{"q": f"What is {n} + {3 * n + 1}?", "a": n, "b": 3 * n + 1} for n in range(rows)]


def response_digest(response: Any) -> str:
    """sha256 of a response's canonical JSON (sorted keys)."""
    return hashlib.sha256(orjson.dumps(response, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Calculator:
    """The tool environment: a session per slot, counting the tool's uses."""

    name, kind = "calculator", "environment"

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {"uses": 0}

    def export(self, state: dict[str, int]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, int]:
        return dict(data)


class ToolAgent:
    """The agent: one model call per turn (three at once with ``parallel``), then the tool
    calls it asked for."""

    name, kind = "agent", "simple_agent"

    def __init__(
        self, changed_request: bool = False, parallel: bool = False, token_ids: bool = False
    ) -> None:
        self.changed_request = changed_request
        self.parallel = parallel
        self.token_ids = token_ids

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": info.task["q"]}], "seen": []}

    def export(self, state: dict[str, Any]) -> Any:
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        messages = state["messages"]
        if self.changed_request:
            messages = [{"role": "system", "content": "be brief"}, *messages]
        request = {"messages": messages, "tools": TOOLS, "logprobs": True}
        if self.token_ids:
            request["return_token_ids"] = True
        if self.parallel:
            judge = {"messages": [*messages, {"role": "user", "content": "judge"}]}
            replies: list[Any] = [None] * 3
            async with trio.open_nursery() as nursery:
                for i, r in enumerate((request, request, judge)):
                    nursery.start_soon(self._ask, ctx, state, r, replies, i)
            reply = replies[0]
        else:
            reply = await self._ask(ctx, state, request)
        message = reply["choices"][0]["message"]
        state["messages"].append(message)
        for call in message.get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            await anyio.sleep(TOOL_LATENCY_S * (1 + ctx.info.row % 4))
            ctx.session("calculator")["uses"] += 1
            content = str(int(args.get("a", 0)) + int(args.get("b", 0)))
            state["messages"].append(
                {"role": "tool", "tool_call_id": call["id"], "content": content}
            )
        if message.get("tool_calls") and ctx.turn + 1 < MAX_TURNS:
            return None
        seen: dict[str, list[str]] = {}
        for request_digest, *got in state["seen"]:
            seen.setdefault(request_digest, []).append(got)
        calls = [
            {
                "key": c.key,
                "request_digest": c.request_digest,
                "policy_version": c.policy_version,
                "replayed": c.replayed,
                "response_digest": got[0],
                "served_version": got[1] if len(got) > 1 else None,
            }
            for c in ctx.calls
            for got in [seen[c.request_digest].pop(0)]
        ]
        return Done(reward=1.0, payload={"rollout_id": ctx.info.rollout_id, "calls": calls})

    @staticmethod
    async def _ask(
        ctx: EpisodeContext,
        state: dict[str, Any],
        request: Any,
        into: list[Any] | None = None,
        i: int = 0,
    ) -> Any:
        """Ask ``request``; record (its digest, the response's) in ``seen``, which the payload
        pairs with ``ctx.calls`` by request (calls made at once complete in any order)."""
        reply = await ctx.model(request)
        metadata = reply.get("metadata") or {}
        served = metadata.get("weight_version")
        state["seen"].append([response_digest(request), response_digest(reply), served])
        if into is not None:
            into[i] = reply
        return reply


def tool_environment(
    base_url: str,
    model: str,
    api_key: str | None = None,
    *,
    changed_request: bool = False,
    parallel: bool = False,
    weight_sync: bool = False,
    weight_version_source: str = "response",
    token_ids: bool = False,
) -> Environment:
    """The agent and its calculator, calling ``model`` at ``base_url`` (checking the weight
    version that answers each call with ``weight_sync``, read where
    ``weight_version_source`` says; asking vLLM's token ids with ``token_ids``)."""
    client = openai_model(
        base_url=base_url,
        model=model,
        api_key=api_key,
        timeout_s=30.0,
        backoff_s=0.05,
        max_backoff_s=0.5,
        max_retries=8,
        check_weight_version=weight_sync,
        weight_version_source=weight_version_source,
    )
    return Environment(
        agent=ToolAgent(changed_request, parallel, token_ids),
        participants=(Calculator(),),
        model=client,
    )


ENVIRON_OPTIONS: Final = "GYMCKPT_LLM_AGENT"
"""The environment variable ``environment_from_environ`` reads: ``tool_environment``'s
arguments as a JSON object."""


def environment_from_environ() -> Environment:
    """``tool_environment(**json($GYMCKPT_LLM_AGENT))``: the environment a ``gymckpt serve``
    process loads (``--http``)."""
    return tool_environment(**orjson.loads(os.environ[ENVIRON_OPTIONS]))


def push_weights(base_url: str, api_key: str | None, version: int) -> None:
    """Load policy version ``version`` into the test server (``POST /update_weights``), as a
    trainer pushes its weights to vLLM or SGLang."""
    req = urllib.request.Request(
        base_url.removesuffix("/v1") + "/update_weights",
        method="POST",
        data=orjson.dumps({"version": version}),
        headers={"Content-Type": "application/json"},
    )
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def _journal(path: Path, record: dict[str, Any]) -> None:
    with open(path, "ab") as f:
        f.write(orjson.dumps(record) + b"\n")
        f.flush()
        os.fsync(f.fileno())


async def _train(opts: argparse.Namespace) -> None:
    import gymckpt

    workdir = Path(opts.workdir)
    options = {
        "base_url": opts.base_url,
        "model": opts.model,
        "api_key": opts.api_key,
        "changed_request": opts.changed_request,
        "parallel": opts.parallel,
        "weight_sync": opts.weight_sync,
        "weight_version_source": opts.weight_version_source,
        "token_ids": opts.return_token_ids,
    }

    async def push(version: int) -> None:
        if opts.weight_sync:
            await trio.to_thread.run_sync(push_weights, opts.base_url, opts.api_key, version)

    async def on_restore(version: int, _files: Path | None) -> None:
        await push(version)  # the server back at the snapshot's weights

    config = gymckpt.RuntimeConfig(checkpoint_mode="unaligned")
    await push(0)  # a fresh start's weights (a restore pushes the snapshot's: on_restore)
    gym_at = (
        HttpGym.spawn(
            "gymckpt.testing.llm_agent:environment_from_environ",
            2,
            work_dir=workdir / "gym-live",
            state_root=workdir,
            environ={ENVIRON_OPTIONS: orjson.dumps(options).decode()},
        )
        if opts.http
        else EmbeddedGym.host(
            tool_environment(**options), instances=2, seed=0, work_dir=workdir / "gym-live"
        )
    )
    async with gym_at as gym:
        async with gymckpt.open_rollouts(
            gym,
            workdir,
            dataset=dataset(opts.rows),
            group_size=opts.group_size,
            config=config,
            max_rows_in_flight=opts.rows_in_flight,
            on_restore=on_restore,
        ) as rollouts:
            async for batch in rollouts.batches(groups_per_step=2):
                payloads = [r.payload for g in batch for r in g.results]
                _journal(workdir / "journal.jsonl", {"step": rollouts.step, "payloads": payloads})
                rollouts.set_policy_version(rollouts.step + 1)
                await push(rollouts.step + 1)
                outcome = await rollouts.checkpoint()
                print("checkpoint", outcome.checkpoint_id, outcome.ok, outcome.mid_turn, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """The trainer process (see the module docstring)."""
    import gymckpt

    parser = argparse.ArgumentParser(
        prog="python -m gymckpt.testing.llm_agent", description=__doc__
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default="gymckpt-test")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--changed-request", action="store_true")
    parser.add_argument("--parallel", action="store_true")
    parser.add_argument("--weight-sync", action="store_true")
    parser.add_argument(
        "--weight-version-source", choices=("response", "engine"), default="response"
    )
    parser.add_argument("--return-token-ids", action="store_true")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--rows-in-flight", type=int, default=4)
    parser.add_argument("--http", action="store_true")
    opts = parser.parse_args(argv)
    gymckpt.run(lambda: _train(opts))


if __name__ == "__main__":
    main(sys.argv[1:])
