"""Episodes on the host (``gym_adapter.host._episodes``): the episode table's rules, and a turn's
``StepContext`` working over the narrow ``TurnHost`` protocol (here a fake host that records
what the context asked of it), plus the participants' roles a host decides once
(``_environment.Roles``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import orjson
import pytest
from plain_state import PlainState

from gymckpt.gym_adapter import Environment, register_participant_kind
from gymckpt.gym_adapter.host._environment import Roles
from gymckpt.gym_adapter.host._episode import (
    CallId,
    EpisodeFenced,
    EpisodeInfo,
    Model,
    ModelCall,
    call_id,
    parse_call_id,
    split_capture_key,
)
from gymckpt.gym_adapter.host._episodes import (
    DONE,
    MOVING,
    UNCLAIMED,
    Episode,
    EpisodeTable,
    ModelRequestChanged,
    StagedModelCall,
    StepContext,
    TurnHost,
    capture_key,
    request_digest,
)
from gymckpt.runtime import rollout_id_for


def S(key: str, response: object) -> StagedModelCall:
    """A staged call of a request with digest 0...0 at policy version 0."""
    return StagedModelCall(key, response, "0" * 64, 0)


def episode(rid: str, state: str = MOVING, **kw: Any) -> Episode:
    info = EpisodeInfo(rid, 1, 0, 0, 7, "gym-0")
    return Episode(info, {"agent": {"n": 0}, "cal": {"events": []}}, state, **kw)


# -- the episode table ----------------------------------------------------------------------


def test_an_active_episode_leaves_the_table_only_as_itself() -> None:
    table = EpisodeTable()
    first = episode("r1")
    table.add(first)
    assert "r1" in table and table.get("r1") is first
    second = episode("r1")  # the same ID again (a restart of the ID): the newer one stays
    table.add(second)
    table.remove(first)
    assert table.active == {"r1": second}
    assert repr(table) == "<EpisodeTable active=1 unclaimed=0>"
    table.remove(second)
    assert "r1" not in table and table.get("r1") is None


def test_an_unclaimed_episode_taken_out_is_done_and_a_restore_replaces_them_all() -> None:
    table = EpisodeTable()
    a, b = episode("a", UNCLAIMED), episode("b", UNCLAIMED)
    table.install_unclaimed({"a": a, "b": b})
    assert "a" in table and table.get("b") is b and table.active == {}
    assert table.take_unclaimed("a") is a and a.state == DONE
    assert table.take_unclaimed("a") is None and table.take_unclaimed(None) is None
    assert b.state == UNCLAIMED
    c = episode("c", UNCLAIMED)
    table.install_unclaimed({"c": c})
    assert dict(table.unclaimed) == {"c": c}
    table.clear_unclaimed()
    assert table.unclaimed == {}


# -- StepContext over TurnHost ----------------------------------------------------------------


@attrs.define
class FakeHost:
    """A ``TurnHost`` that records what a context asks of it."""

    model: Model | None = None
    retained_names: frozenset[str] = frozenset({"cal"})
    fence: bool = False
    counts: dict[str, int] = attrs.field(factory=dict)
    model_calls: list[bool] = attrs.field(factory=list)
    policy_version: int = 0

    def fenced(self, ep: Episode) -> bool:
        return self.fence

    def add_count(self, name: str, n: int) -> int:
        self.counts[name] = self.counts.get(name, 0) + n
        return self.counts[name]

    def model_called(self, *, replayed: bool) -> None:
        self.model_calls.append(replayed)


def context(host: FakeHost, ep: Episode) -> StepContext:
    turn_host: TurnHost = host  # the protocol is all a context needs
    return StepContext(turn_host, ep)


def test_a_context_marks_the_retained_sessions_it_fetched_only() -> None:
    host, ep = FakeHost(), episode("r1")
    ctx = context(host, ep)
    assert ctx.session("agent") == {"n": 0} and ctx.touched is None
    ctx.session("cal")
    assert ctx.touched == {"cal"}
    ctx.replace_session("agent", {"n": 5})
    assert ep.sessions["agent"] == {"n": 5} and ctx.touched == {"cal"}
    with pytest.raises(KeyError, match="no participant 'nope'"):
        ctx.session("nope")


def test_a_fenced_context_gets_no_session_but_still_counts() -> None:
    host, ep = FakeHost(fence=True), episode("r1")
    ctx = context(host, ep)
    with pytest.raises(EpisodeFenced, match="no longer owns session 1-0"):
        ctx.session("cal")
    with pytest.raises(EpisodeFenced):
        ctx.replace_session("agent", {})
    assert ctx.count("seen", 2) == 2 and host.counts == {"seen": 2}


def digest_of(request: Any) -> str:
    return request_digest(orjson.dumps(request, option=orjson.OPT_SORT_KEYS))


def key(rid: str, turn: int, request: Any, occurrence: int = 0) -> str:
    """The capture key of attempt ``rid``'s call of ``request`` in ``turn``."""
    info = EpisodeInfo(rid, 1, 0, 0, 7, "gym-0")
    return capture_key(info, turn, digest_of(request), occurrence)


async def test_model_calls_are_staged_under_capture_keys_and_replayed_once_restored() -> None:
    asked: list[tuple[str, Any]] = []

    def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        asked.append((key, request))
        return {"answer": len(asked)}

    host = FakeHost(model=model)
    ep = episode("1-0", turn=3)
    ctx = context(host, ep)
    assert await ctx.model("q0") == {"answer": 1}
    assert await ctx.model("q1") == {"answer": 2}
    assert ep.capture_keys == (key("1-0", 3, "q0"), key("1-0", 3, "q1"))  # attempt : call id
    assert host.model_calls == [False, False]
    staged = [StagedModelCall(key("1-0", 3, "q0"), {"answer": 1}, digest_of("q0"), 0)]
    restored = episode("1-0-a1", turn=3, staged=staged, inherited=1)
    ctx = context(host, restored)
    assert await ctx.model("q0") == {"answer": 1}  # staged before the checkpoint: not asked
    assert await ctx.model("q1") == {"answer": 3}  # asked again, under the new attempt's key
    assert asked[-1] == (key("1-0-a1", 3, "q1"), "q1") and len(asked) == 3
    # the replayed call keeps the key of the attempt that asked it
    assert [c.key for c in ctx.calls] == [key("1-0", 3, "q0"), key("1-0-a1", 3, "q1")]
    assert host.model_calls == [False, False, True, False]
    ctx.turn_calls().check_replayed(restored)  # every staged call of the turn was asked again


async def test_each_call_records_its_request_digest_and_the_policy_version_it_was_asked() -> None:
    host = FakeHost(model=lambda key, request, info: {"r": request})
    ep = episode("1-0", turn=2)
    ctx = context(host, ep)
    await ctx.model({"b": 1, "a": [1.5]})
    host.policy_version = 4  # the trainer updated its weights; the instance was told
    await ctx.model("q")
    digest = hashlib.sha256(b'{"a":[1.5],"b":1}').hexdigest()  # canonical: keys sorted
    assert ctx.calls == (
        ModelCall(f"1-0:t2-{digest[:16]}-c0", digest, 0, False),
        ModelCall(key("1-0", 2, "q"), hashlib.sha256(b'"q"').hexdigest(), 4, False),
    )
    # a restored continuation: the calls of earlier attempts are replayed with their versions
    restored = episode("1-0-a1", turn=2, staged=list(ep.staged), inherited=2)
    again = context(host, restored)
    host.policy_version = 9
    assert await again.model("q") == {"r": "q"}
    assert await again.model({"a": [1.5], "b": 1}) == {"r": {"b": 1, "a": [1.5]}}
    assert [c.policy_version for c in again.calls] == [0, 4]
    assert all(c.replayed for c in again.calls)


async def test_a_call_id_says_which_request_it_is_whatever_order_calls_start_in() -> None:
    """Concurrent calls of a turn get the same ids in any order: (turn, request, occurrence of
    that request in the turn); identical requests take occurrences 0, 1, ... as they start."""
    orders = [["a", "b", "a"], ["b", "a", "a"], ["a", "a", "b"]]
    seen = set()
    for order in orders:
        host = FakeHost(model=lambda key, request, info: request)
        ep = episode("1-0", turn=1)
        ctx = context(host, ep)
        for request in order:
            await ctx.model(request)
        seen.add(frozenset(ep.capture_keys))
    assert seen == {frozenset({key("1-0", 1, "a"), key("1-0", 1, "a", 1), key("1-0", 1, "b")})}
    assert split_capture_key(key("1-0", 1, "a", 1))[1] == call_id(1, digest_of("a"), 1)


async def test_a_restored_turn_replays_by_request_in_any_order_asking_what_was_in_flight() -> None:
    """The cut took turn 2 with ``a`` (occurrence 1) and ``b`` done, ``a`` (occurrence 0) still
    in flight: the restored turn, whatever order it asks in, gets ``a`` and ``b`` from the
    capture and asks one ``a``, under the occurrence the capture does not hold."""
    staged = [
        StagedModelCall(key("1-0", 1, "x"), "x1", digest_of("x"), 0),  # an earlier turn's
        StagedModelCall(key("1-0", 2, "a", 1), "a1", digest_of("a"), 0),
        StagedModelCall(key("1-0", 2, "b"), "b0", digest_of("b"), 0),
    ]
    for order in (["a", "b", "a"], ["b", "a", "a"], ["a", "a", "b"]):
        asked: list[str] = []
        host = FakeHost(model=lambda key, request, info, a=asked: a.append(key) or "fresh")
        ep = episode("1-0-a1", turn=2, staged=list(staged), inherited=3)
        ctx = context(host, ep)
        got = [await ctx.model(r) for r in order]
        assert sorted(got) == ["a1", "b0", "fresh"]
        assert asked == [key("1-0-a1", 2, "a", 0)]  # the one in flight at the cut, once
        assert host.model_calls.count(True) == 2
        ctx.turn_calls().check_replayed(ep)
    # a later turn of the restored attempt replays nothing: "x" is asked, as occurrence 0
    asked = []
    host = FakeHost(model=lambda key, request, info: asked.append(key) or "fresh")
    later = episode("1-0-a1", turn=3, staged=list(staged), inherited=3)
    assert await context(host, later).model("x") == "fresh"
    assert asked == [key("1-0-a1", 3, "x")]


async def test_a_restored_turn_that_leaves_a_staged_call_unasked_fails_closed_naming_it() -> None:
    """A request no capture answers is asked (it may be the call in flight at the cut); a turn
    that ends with a call staged for it not asked again did not replay as it ran: the captured
    response is never used, and ``ModelRequestChanged`` names the call and both requests."""
    asked: list[Any] = []
    host = FakeHost(model=lambda key, request, info: asked.append(request) or "fresh")
    before = {"prompt": "add 2 and 3"}
    staged = [StagedModelCall(key("1-0", 0, before), "captured", digest_of(before), 1)]
    ep = episode("1-0-a1", staged=staged, inherited=1)
    ctx = context(host, ep)
    after = {"prompt": "add 2 and 4"}
    assert await ctx.model(after) == "fresh"  # never the capture of another request
    assert asked == [after] and host.model_calls == [False]
    with pytest.raises(
        ModelRequestChanged,
        match=rf"restored turn 0 ended without asking again 1 model call.*{key('1-0', 0, before)}"
        rf" for request digest {digest_of(before)}.*asked \['{digest_of(after)}'\]",
    ):
        ctx.turn_calls().check_replayed(ep)
    # a turn that asks nothing at all fails the same way
    quiet = context(host, episode("1-0-a1", staged=list(staged), inherited=1))
    with pytest.raises(ModelRequestChanged, match="without asking again 1 model call"):
        quiet.turn_calls().check_replayed(ep)


async def test_a_model_request_that_is_not_plain_data_is_refused_and_not_asked() -> None:
    host = FakeHost(model=lambda key, request, info: pytest.fail("asked"))
    with pytest.raises(ValueError, match=r"model request of turn 0 is refused: .*nan"):
        await context(host, episode("1-0")).model({"t": float("nan")})


async def test_a_model_response_that_is_not_plain_data_is_refused_and_not_staged() -> None:
    host = FakeHost(model=lambda key, request, info: {"x": float("nan")})
    ep = episode("1-0")
    with pytest.raises(ValueError, match=f"capture key {key('1-0', 0, 'q')} is refused"):
        await context(host, ep).model("q")
    assert ep.staged == [] and host.model_calls == []


async def test_a_context_without_a_model_says_how_to_give_one() -> None:
    with pytest.raises(RuntimeError, match=r"give Environment\(model=\.\.\.\)"):
        await context(FakeHost(), episode("r1")).model("q")


# -- roles ----------------------------------------------------------------------------------


class Part(PlainState):
    def __init__(self, name: str, kind: str, *, retained: bool = False) -> None:
        self.name, self.kind, self.retained = name, kind, retained


class Agent(Part):
    async def step(self, ctx: Any, state: Any) -> None:
        return None


def test_roles_name_the_exporting_owner_and_the_retained_participants() -> None:
    register_participant_kind("test_notes", "passive")
    env = Environment(
        agent=Agent("agent", "simple_agent"),
        participants=(
            Part("log", "test_notes"),
            Part("cal", "environment", retained=True),
            Part("fs", "environment"),
        ),
    )
    env.check()
    roles = Roles.of(env)
    assert roles.owner == "cal"  # the first environment participant
    assert not roles.legacy
    assert [p.name for p in roles.sessions] == ["agent", "log", "cal", "fs"]
    assert [p.name for p in roles.retained] == ["cal"] and roles.retained_names == {"cal"}


def test_a_legacy_agent_owns_its_episodes() -> None:
    env = Environment(
        agent=Agent("old", "legacy_agent"), participants=(Part("cal", "environment"),)
    )
    roles = Roles.of(env)
    assert roles.legacy and roles.owner == "old" and roles.retained == ()
    alone = Roles.of(Environment(agent=Agent("a", "simple_agent")))
    assert not alone.legacy and alone.owner == "a"


def test_a_capture_key_is_the_attempt_key_and_the_call_id_with_no_slash() -> None:
    first = EpisodeInfo("3-1", 3, 1, 0, 7, "gym-0")
    retry = EpisodeInfo(rollout_id_for(3, 1, 2), 3, 1, 2, 7, "gym-0")
    d = "5d41402abc4b2a76b9719d911017c592ae1dd3b2f6b3d8d0eda7cfd6f1b4c4d2"
    assert capture_key(first, 4, d, 0) == "3-1:t4-5d41402abc4b2a76-c0"
    assert capture_key(retry, 4, d, 1) == "3-1-a2:t4-5d41402abc4b2a76-c1"
    assert split_capture_key(capture_key(retry, 4, d, 1)) == ("3-1-a2", call_id(4, d, 1))
    assert parse_call_id(call_id(4, d, 1)) == CallId(4, d[:16], 1)
    for old in ("3-1/t4/c0", "t4-c0", "3-1:", ":t4-c0"):
        with pytest.raises(ValueError, match="is not"):
            split_capture_key(old)
    for old in ("t4-c0", "t4-5d41402abc4b2a7-c0", "t4-5D41402ABC4B2A76-c0"):  # version 3's
        with pytest.raises(ValueError, match="is not"):
            parse_call_id(old)
