"""The calendar workplace used the way agents really are (``usage_environment``), and what the
real-usage dimension did in a scenario (``UsageCounts``).

The wrapper goes through the public episode API only, like ``gymckpt.testing.hostile``:

* concurrent calls (``ConcurrentCalls``): before a turn's own call, the agent starts
  ``fanout`` ``ctx.model`` calls in one trio nursery and checks that each got the answer to its
  own request (the workplace's model echoes it): a call identity that follows the order trio
  starts the tasks in answers a restored call with another call's response, or fails it as a
  changed request (data), and the budgets check sees the data failure;
* long turns (``LongTurn``): the turn sleeps its extra seconds before it plays as planned, in
  every attempt (the plan, its mutations and sentinels are unchanged);
* the model server's outage (``Outage``): every model call asked inside the window (virtual
  time since the scenario started) raises ``ModelUnavailable``, as the OpenAI client does
  once its retries are spent; a replayed (captured) call never reaches the model.

Everything it counts goes to one ``UsageCounts`` per scenario (across lives and
instances): what the report says each sub-dimension exercised.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs
import trio

from gymckpt.gym_adapter import (
    AgentWrapper,
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    ModelUnavailable,
)

from .usage import RealUsage

__all__ = ["UsageCounts", "usage_environment"]


@attrs.define(eq=False, slots=True)
class UsageCounts:
    """What the real-usage dimension exercised in one scenario (every life)."""

    concurrent_turns: int = 0
    """Turns (of any attempt) that made concurrent model calls."""
    concurrent_episodes: set[str] = attrs.field(factory=set)
    """Attempts (rollout ids) with at least one such turn."""
    long_turns: int = 0
    """Turns that ran a ``LongTurn``'s extra seconds (a restored attempt runs it again)."""
    outage_refused: int = 0
    """Model calls refused because the model server was down."""
    outage_attempts: defaultdict[tuple[int, int], set[int]] = attrs.field(
        factory=lambda: defaultdict(set)
    )
    """(position, slot) -> the attempts the outage refused a call of (a position is the
    ledger's row: the dataset row once per epoch, ``EpisodeInfo.session_key``)."""
    live_restarts: int = 0
    """Lives that restored into the previous one's still running Gym."""
    second_refused: int = 0
    """Second trainers refused (the expected outcome)."""
    second_let_in: int = 0
    """Second trainers let in (a violation)."""
    second_unreachable: int = 0
    """Second trainers still waiting for instances that faults kept killing at the end of
    their window (neither refused nor let in)."""

    def summary(self, usage: RealUsage) -> tuple[tuple[str, float], ...]:
        """The counts as report items (name, value), in a fixed order."""
        return (
            ("shuffled_runs", float(usage.order is not None)),
            ("concurrent_turns", float(self.concurrent_turns)),
            ("episodes_with_concurrent_calls", float(len(self.concurrent_episodes))),
            ("long_turns", float(self.long_turns)),
            ("outage_s", usage.outage.length_s if usage.outage is not None else 0.0),
            ("outage_refused_calls", float(self.outage_refused)),
            ("live_restarts", float(self.live_restarts)),
            ("second_trainers_refused", float(self.second_refused)),
            ("second_trainers_let_in", float(self.second_let_in)),
            ("second_trainers_unreachable", float(self.second_unreachable)),
        )


@attrs.frozen
class _UsageAgent(AgentWrapper):
    usage: RealUsage = attrs.field(kw_only=True)
    counts: UsageCounts = attrs.field(kw_only=True)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        info, turn = ctx.info, ctx.turn
        calls = self.usage.calls
        if calls is not None and calls.fans_out(info.seed, info.row, info.slot, turn):
            self.counts.concurrent_turns += 1
            self.counts.concurrent_episodes.add(info.rollout_id)
            async with trio.open_nursery() as nursery:
                for k in range(calls.fanout):
                    tag = "same" if calls.identical else f"c{k}"
                    nursery.start_soon(_ask, ctx, f"{info.session_key}/t{turn}/{tag}")
        for long in self.usage.long_turns:
            if (long.row, long.slot, long.turn) == (info.row, info.slot, turn):
                self.counts.long_turns += 1
                await trio.sleep(long.seconds)
        return await self.inner.step(ctx, state)


async def _ask(ctx: EpisodeContext, request: str) -> None:
    answer = await ctx.model(request)
    if answer != request:  # the workplace's model echoes: another call's answer
        raise RuntimeError(f"concurrent call {request!r} was answered {answer!r}")


@attrs.frozen
class _OutageModel:
    inner: Any
    start_ts: float
    end_ts: float
    counts: UsageCounts

    def __call__(self, key: str, request: Any, info: EpisodeInfo) -> Any:
        now = trio.current_time()
        if self.start_ts <= now < self.end_ts:
            self.counts.outage_refused += 1
            position = int(info.session_key.split("-")[0])  # the ledger's row, per epoch
            self.counts.outage_attempts[(position, info.slot)].add(info.attempt)
            raise ModelUnavailable(
                f"model server unreachable (simulated outage, back in {self.end_ts - now:.3g}s)"
            )
        return self.inner(key, request, info)


def usage_environment(
    env: Environment, usage: RealUsage, counts: UsageCounts, t0: float
) -> Environment:
    """``env`` (the calendar workplace, hostile or not) used as ``usage`` says: concurrent
    calls and long turns in its agent, the outage in its model (``t0``: the scenario's start,
    in trio's clock). The sessions, plans and sentinels are ``env``'s: the judge applies
    unchanged."""
    model = env.model
    if usage.outage is not None and model is not None:
        start = t0 + usage.outage.start_s
        model = _OutageModel(model, start, start + usage.outage.length_s, counts)
    agent = env.agent
    if usage.calls is not None or usage.long_turns:
        agent = _UsageAgent(agent, usage=usage, counts=counts)
    return attrs.evolve(env, agent=agent, model=model)
