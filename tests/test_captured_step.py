"""Captured steps (``ctx.captured_step``): any side effect staged like a model call, under a
key of its place in the turn, replayed after a restore without running it, failing closed on
changed arguments; arguments and results that would not round-trip through JSON refused where
they enter."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest

from gymckpt.gym_adapter import CapturedStepChanged, EpisodeInfo, NotExactJSON
from gymckpt.gym_adapter.host._captured import arguments_digest, is_step, step_identity
from gymckpt.gym_adapter.host._episode import Model, parse_call_id, split_capture_key
from gymckpt.gym_adapter.host._episodes import (
    MOVING,
    Episode,
    ModelRequestChanged,
    StepContext,
    capture_key,
)


@attrs.define
class FakeHost:
    """A ``TurnHost`` with a model (the captures are the model proxy's records)."""

    model: Model | None = lambda key, request, info: "model answer"
    retained_names: frozenset[str] = frozenset()
    policy_version: int = 3
    model_calls: list[bool] = attrs.field(factory=list)

    def fenced(self, ep: Episode) -> bool:
        return False

    def add_count(self, name: str, n: int) -> int:
        return n

    def model_called(self, *, replayed: bool) -> None:
        self.model_calls.append(replayed)


def episode(rid: str, **kw: Any) -> Episode:
    return Episode(EpisodeInfo(rid, 1, 0, 0, 7, "gym-0"), {"agent": {}}, MOVING, **kw)


def step_key(rid: str, turn: int, name: str, occurrence: int = 0) -> str:
    return capture_key(EpisodeInfo(rid, 1, 0, 0, 7, "gym-0"), turn, step_identity(name), occurrence)


def args_digest(name: str, args: Any) -> str:
    return arguments_digest(name, orjson.dumps(args, option=orjson.OPT_SORT_KEYS))


async def test_a_step_runs_once_and_a_restored_attempt_replays_it_without_running_it() -> None:
    ran: list[Any] = []

    async def search(args: Any) -> Any:
        ran.append(args)
        return {"hits": [args["q"], len(ran)]}

    host, ep = FakeHost(), episode("1-0", turn=2)
    ctx = StepContext(host, ep)
    assert await ctx.captured_step("search", {"q": "trio"}, search) == {"hits": ["trio", 1]}
    assert await ctx.captured_step("search", {"q": "anyio"}, search) == {"hits": ["anyio", 2]}
    assert await ctx.model("hello") == "model answer"
    keys = ep.capture_keys
    assert keys[:2] == (step_key("1-0", 2, "search"), step_key("1-0", 2, "search", 1))
    assert ep.staged[0].request_digest == args_digest("search", {"q": "trio"})
    assert ep.staged[0].policy_version == 3
    assert [c.key for c in ctx.calls] == [keys[2]]  # ctx.calls lists model calls only
    assert [is_step(parse_call_id(split_capture_key(c.key)[1]).request, c.request_digest)
            for c in ep.staged] == [True, True, False]  # fmt: skip

    # a restore of that turn: the steps answer from the capture, fn is never run again
    restored = episode("1-0-a1", turn=2, staged=list(ep.staged), inherited=3)
    again = StepContext(host, restored)
    assert await again.model("hello") == "model answer"
    assert await again.captured_step("search", {"q": "trio"}, search) == {"hits": ["trio", 1]}
    assert await again.captured_step("search", {"q": "anyio"}, search) == {"hits": ["anyio", 2]}
    assert len(ran) == 2 and host.model_calls == [False, True]
    again.turn_calls().check_replayed(restored)
    # a third step of the name is new in this attempt: it runs, under the attempt's own key
    assert await again.captured_step("search", {"q": "x"}, search) == {"hits": ["x", 3]}
    assert restored.staged[-1].key == step_key("1-0-a1", 2, "search", 2)


async def test_changed_arguments_fail_closed_naming_the_key_and_both_digests() -> None:
    host = FakeHost()
    staged = episode("1-0", turn=0)
    await StepContext(host, staged).captured_step("tool", {"n": 1}, lambda a: "captured")
    restored = episode("1-0-a1", staged=list(staged.staged), inherited=1)
    ctx = StepContext(host, restored)
    key = step_key("1-0", 0, "tool")
    with pytest.raises(
        CapturedStepChanged,
        match=rf"capture key {key} was staged .* arguments digest "
        rf"{args_digest('tool', {'n': 1})}, and is asked now with {args_digest('tool', {'n': 2})}",
    ):
        await ctx.captured_step("tool", {"n": 2}, lambda a: pytest.fail("ran"))


async def test_a_restored_turn_that_skips_a_staged_step_fails_closed_naming_it() -> None:
    host = FakeHost()
    staged = episode("1-0", turn=0)
    await StepContext(host, staged).captured_step("tool", [1], lambda a: 5)
    restored = episode("1-0-a1", staged=list(staged.staged), inherited=1)
    with pytest.raises(ModelRequestChanged, match=step_key("1-0", 0, "tool")):
        StepContext(host, restored).turn_calls().check_replayed(restored)


@pytest.mark.parametrize(
    ("args", "place"),
    [
        ((1, 2), "args is a tuple"),
        ({"x": float("nan")}, r"args.x is nan"),
        ({1: "a"}, "has the key 1"),
        ([{1, 2}], r"args\[0\] is a set"),
        (1 << 70, "beyond 64 bits"),
    ],
)
async def test_arguments_that_would_not_round_trip_are_refused_before_the_step_runs(
    args: Any, place: str
) -> None:
    ep = episode("1-0")
    with pytest.raises(NotExactJSON, match=place):
        await StepContext(FakeHost(), ep).captured_step("s", args, lambda a: pytest.fail("ran"))
    assert ep.staged == []


async def test_a_result_that_would_not_round_trip_is_refused_and_not_staged() -> None:
    ep = episode("1-0")
    with pytest.raises(NotExactJSON, match=r"result under capture key .*\.when is a tuple"):
        await StepContext(FakeHost(), ep).captured_step("s", {}, lambda a: {"when": (1, 2)})
    assert ep.staged == []


async def test_the_step_gets_a_copy_and_its_caller_a_copy_of_the_result() -> None:
    ep = episode("1-0")
    args = {"l": [1]}
    result = {"r": [2]}

    def fn(a: Any) -> Any:
        a["l"].append("mutated by fn")
        return result

    got = await StepContext(FakeHost(), ep).captured_step("s", args, fn)
    got["r"].append("mutated by the agent")
    assert args == {"l": [1]} and ep.staged[0].response == {"r": [2]}


async def test_a_step_without_a_model_proxy_says_what_to_give() -> None:
    with pytest.raises(RuntimeError, match=r"give Environment\(model=\.\.\.\)"):
        await StepContext(FakeHost(model=None), episode("1-0")).captured_step("s", 1, lambda a: 1)
