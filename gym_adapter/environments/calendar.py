"""The calendar workplace: the reference multi-participant environment, on the public API.

Every instance hosts the same ``Environment`` a user would write:

- ``agent`` (kind ``simple_agent`` or ``legacy_agent``): the episode loop. Turn ``t`` asks the
  model for the turn's plan payload (a model call, captured under a capture key), works for the
  turn's duration, and, on a mutating turn, creates a calendar event carrying the sentinel
  ``sentinel:{position}-{slot}:t{t}`` (the slot's session key: a row trained in two epochs
  is two positions, each with sentinels of its own); one more call after the last turn
  reports the end (so an episode that did all its turns still passes a step boundary before
  it replies);
- ``calendar`` (kind ``environment``, ``retained``): the calendar itself. A slot's calendar
  session outlives its episode until the attempt is retired, is in every checkpoint, and is
  journaled, so the replacement of a dead instance holds the same events;
- ``model_proxy``: the host's, in front of ``calendar_model``.

What an episode does is a function of (seed, row, slot) only (``plan_episode``), so a run can
be checked against its plans: every sentinel a plan calls for must be in the final calendar
exactly once (the exactly-once verdict).

It is served like any other environment, by each deployment's own constructor (which knows
nothing of it); ``CalendarConfig.host_config()`` is every deployment's ``config``::

    EmbeddedGym.host(calendar_environment(config=cfg), instances=2, config=cfg.host_config())
    RayGym.host(EnvironmentRef.to(calendar_environment, config=cfg), instances=2,
                config=cfg.host_config())
    HttpGym.spawn(calendar_from_environ_path(), instances=2, work_dir=".",
                  config=cfg.host_config(), environ=cfg.environ())

(one agent kind per instance: a list of environments, ``EnvironmentRef.to(calendar_environment,
agent_kind=kind, config=cfg)`` or ``calendar_from_environ_path(kind)`` each). Nothing here is
private to gymckpt: this module uses only what ``gymckpt.gym_adapter`` and ``gymckpt.runtime``
export.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import anyio
import attrs
import sniffio
import trio

from gymckpt.gym_adapter import (
    Done,
    Environment,
    EpisodeContext,
    EpisodeFenced,
    EpisodeInfo,
    GymHost,
    HostConfig,
    RetainedSession,
    SessionView,
)

__all__ = [
    "AGENT_KINDS",
    "CALENDAR",
    "CONFIG_ENV",
    "CalendarAgent",
    "CalendarConfig",
    "CalendarEvent",
    "CalendarServer",
    "CalendarSession",
    "CalendarState",
    "EpisodePlan",
    "calendar_environment",
    "calendar_from_environ",
    "calendar_from_environ_path",
    "calendar_host",
    "calendar_model",
    "calendar_sessions",
    "calendar_sessions_of",
    "calendar_state",
    "plan_episode",
    "sentinel",
    "session_key",
]

AGENT_KINDS: Final = ("simple_agent", "legacy_agent")
CONFIG_ENV: Final = "GYMCKPT_CALENDAR_CONFIG"
"""The environment variable a spawned ``gymckpt serve`` reads the workplace's ``CalendarConfig``
from (JSON of its fields, ``CalendarConfig.environ``; read by ``calendar_from_environ``)."""

AGENT: Final = "agent"
CALENDAR: Final = "calendar"


def session_key(row: int, slot: int) -> str:
    """The environment session of a generation slot: ``"{row}-{slot}"``."""
    return f"{row}-{slot}"


def sentinel(position: int, slot: int, turn: int) -> str:
    """The sentinel carried by the calendar event turn ``turn`` of slot ``slot`` of the run's
    position ``position`` creates (``EpisodeInfo.session_key``: ``"{position}-{slot}"``; the
    position is the dataset row in the default order). Unique per position, slot and turn: the
    same row trained in another epoch leaves other sentinels."""
    return f"sentinel:{position}-{slot}:t{turn}"


# -- configuration and plans ---------------------------------------------------------------


def _range_of(kind: type) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        ok = (
            isinstance(value, tuple)
            and len(value) == 2
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] <= value[1]
        )
        if not ok:
            raise ValueError(f"{attr.name} must be a (low, high) pair with 0 <= low <= high")

    return check


_probability = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0))


@attrs.frozen(kw_only=True)
class CalendarConfig:
    """Knobs of the calendar workplace (picklable; the same config goes to every instance).

    ``turns`` and ``turn_s`` are inclusive (low, high) ranges; ``mutation_p`` is the chance a
    turn creates a calendar event. ``lease_s``, ``flush_interval_s`` and ``max_batch`` are the
    host's (``HostConfig``). Test hooks: ``hold_after_first_mutation`` holds the episode that
    performs an instance's first event (since it started serving) at its next step boundary
    until a prepare parks it (``EpisodeContext.hold``); ``strand_legacy_session`` is
    ``HostConfig.strand_legacy_session`` (S10).
    """

    turns: tuple[int, int] = attrs.field(default=(2, 5), validator=_range_of(int))
    turn_s: tuple[float, float] = attrs.field(default=(0.01, 0.05), validator=_range_of(float))
    mutation_p: float = attrs.field(default=0.5, validator=_probability)
    lease_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))
    flush_interval_s: float = attrs.field(default=0.005, validator=attrs.validators.gt(0.0))
    max_batch: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    hold_after_first_mutation: bool = False
    strand_legacy_session: bool = False

    def __attrs_post_init__(self) -> None:
        if self.turns[0] < 1:
            raise ValueError(f"turns must be at least 1, got {self.turns!r}")

    def environ(self) -> dict[str, str]:
        """This config as the environment of a ``gymckpt serve`` process (``HttpGym.spawn``'s
        ``environ``): its fields as JSON in ``CONFIG_ENV``, which ``calendar_from_environ``
        reads back to an equal config."""
        return {CONFIG_ENV: json.dumps(attrs.asdict(self))}

    def host_config(self) -> HostConfig:
        """The host's part of this config (every deployment's ``config``)."""
        return HostConfig(
            lease_s=self.lease_s,
            flush_interval_s=self.flush_interval_s,
            max_batch=self.max_batch,
            strand_legacy_session=self.strand_legacy_session,
        )


@attrs.frozen
class EpisodePlan:
    """What an episode of (seed, row, slot) does, turn by turn."""

    turns: int
    durations: tuple[float, ...]
    mutates: tuple[bool, ...]
    payloads: tuple[str, ...]
    reward: float


def plan_episode(seed: int, row: int, slot: int, config: CalendarConfig) -> EpisodePlan:
    """The plan of slot ``slot`` of row ``row``: a function of (seed, row, slot) only."""
    rng = random.Random(f"gymckpt-sim:{seed}:{row}:{slot}")
    turns = rng.randint(*config.turns)
    lo, span, p = config.turn_s[0], config.turn_s[1] - config.turn_s[0], config.mutation_p
    draw, bits = rng.random, rng.getrandbits
    durations: list[float] = []
    mutates: list[bool] = []
    payloads: list[str] = []
    for t in range(turns):
        durations.append(round(lo + span * draw(), 6))
        mutates.append(draw() < p)
        payloads.append(f"{row}-{slot}/t{t}:{bits(32):08x}")
    reward = round(draw(), 6)
    return EpisodePlan(turns, tuple(durations), tuple(mutates), tuple(payloads), reward)


# -- the participants ------------------------------------------------------------------------


@attrs.frozen
class CalendarEvent:
    turn: int
    title: str
    sentinel: str


@attrs.define(eq=False, slots=True)
class CalendarState:
    """One calendar session's state: the events its attempt created, in order."""

    events: list[CalendarEvent] = attrs.field(factory=list)


@attrs.frozen
class CalendarSession:
    """A calendar session as ``calendar_state`` reports it: its events and its owner."""

    key: str
    rollout_id: str
    attempt: int
    events: tuple[CalendarEvent, ...]

    @property
    def sentinels(self) -> tuple[str, ...]:
        return tuple(e.sentinel for e in self.events)


@attrs.frozen
class CalendarServer:
    """The ``calendar`` environment server: one retained ``CalendarState`` per slot."""

    name: str = CALENDAR
    kind: str = "environment"
    retained: bool = True

    def open(self, info: EpisodeInfo) -> CalendarState:
        return CalendarState()

    def export(self, state: CalendarState) -> dict[str, Any]:
        return {
            "events": [
                {"turn": e.turn, "title": e.title, "sentinel": e.sentinel} for e in state.events
            ]
        }

    def restore(self, data: Mapping[str, Any]) -> CalendarState:
        return CalendarState(
            [
                CalendarEvent(int(e["turn"]), str(e["title"]), str(e["sentinel"]))
                for e in data["events"]
            ]
        )


@attrs.define(eq=False, slots=True)
class _AgentState:
    plan: EpisodePlan | None = None
    """A function of (seed, row, slot): not exported, made again after a restore."""


def calendar_model(key: str, request: Any, info: EpisodeInfo) -> Any:
    """The workplace's model: answers a turn's request with the turn's plan payload."""
    return request


@attrs.frozen
class CalendarAgent:
    """The agent (``simple_agent`` or ``legacy_agent``) playing each episode's plan."""

    config: CalendarConfig
    kind: str = "simple_agent"
    name: str = AGENT

    def open(self, info: EpisodeInfo) -> _AgentState:
        return _AgentState(plan_episode(info.seed, info.row, info.slot, self.config))

    def export(self, state: _AgentState) -> dict[str, Any]:
        return {}

    def restore(self, data: Any) -> _AgentState:
        return _AgentState()

    async def step(self, ctx: EpisodeContext, state: _AgentState) -> Done | None:
        info = ctx.info
        plan = state.plan
        if plan is None:
            plan = state.plan = plan_episode(info.seed, info.row, info.slot, self.config)
        turn = ctx.turn
        if turn >= plan.turns:
            return Done(plan.reward, turns=plan.turns)
        await ctx.model(plan.payloads[turn])
        await _sleep(plan.durations[turn])
        if plan.mutates[turn]:
            try:
                calendar: CalendarState = ctx.session(CALENDAR)
            except EpisodeFenced:
                ctx.count("fenced_mutations")
                raise
            key = info.session_key
            calendar.events.append(
                CalendarEvent(turn, f"meeting {key} t{turn}", f"sentinel:{key}:t{turn}")
            )
            if ctx.count("mutations") == 1 and self.config.hold_after_first_mutation:
                ctx.hold()
        return None


async def _sleep(seconds: float) -> None:
    """``anyio.sleep(seconds)``, by trio's own ``sleep`` where the episode runs under trio (every
    deployment hosts episodes under trio): the same sleep, without anyio's backend lookup at
    every turn; under asyncio, anyio's."""
    if sniffio.current_async_library() == "trio":
        await trio.sleep(seconds)
    else:
        await anyio.sleep(seconds)


def calendar_environment(
    agent_kind: str = "simple_agent", config: CalendarConfig | None = None
) -> Environment:
    """The calendar workplace as an ``Environment``: agent, calendar, model proxy."""
    if agent_kind not in AGENT_KINDS:
        raise ValueError(f"agent kind must be one of {', '.join(AGENT_KINDS)}, got {agent_kind!r}")
    cfg = config if config is not None else CalendarConfig()
    return Environment(
        agent=CalendarAgent(cfg, agent_kind),
        participants=(CalendarServer(),),
        model=calendar_model,
    )


def calendar_from_environ(agent_kind: str = "simple_agent") -> Environment:
    """The calendar workplace with the ``CalendarConfig`` in ``CONFIG_ENV`` (JSON of its fields;
    the defaults without it): how a ``gymckpt serve`` process started by ``HttpGym.spawn`` with
    ``CalendarConfig.environ()`` builds its environment. ``ValueError`` names a malformed config."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        return calendar_environment(agent_kind)
    try:
        raw = json.loads(text)
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        config = CalendarConfig(**fields)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{CONFIG_ENV} is not a CalendarConfig: {exc}") from None
    return calendar_environment(agent_kind, config)


def calendar_from_environ_path(agent_kind: str = "simple_agent") -> str:
    """The import path a ``gymckpt serve`` process (``HttpGym.spawn``) loads the workplace with
    ``agent_kind`` from, its config from ``CONFIG_ENV`` (``CalendarConfig.environ``)."""
    if agent_kind not in AGENT_KINDS:
        raise ValueError(f"agent kind must be one of {', '.join(AGENT_KINDS)}, got {agent_kind!r}")
    return f"{__name__}:calendar_from_environ_{agent_kind}"


def calendar_from_environ_simple_agent() -> Environment:
    """``calendar_from_environ`` with the simple agent (an import path for ``gymckpt serve``)."""
    return calendar_from_environ("simple_agent")


def calendar_from_environ_legacy_agent() -> Environment:
    """``calendar_from_environ`` with the legacy agent (an import path for ``gymckpt serve``)."""
    return calendar_from_environ("legacy_agent")


def calendar_host(
    name: str,
    agent_kind: str = "simple_agent",
    seed: int = 0,
    work_dir: str | Path | None = None,
    config: CalendarConfig | None = None,
    *,
    recover: bool = False,
) -> GymHost:
    """One calendar workplace instance: a ``GymHost`` serving ``calendar_environment``."""
    cfg = config if config is not None else CalendarConfig()
    return GymHost(
        name,
        calendar_environment(agent_kind, cfg),
        seed,
        Path(work_dir) if work_dir is not None else None,
        cfg.host_config(),
        recover=recover,
    )


def calendar_sessions(views: Mapping[str, SessionView]) -> dict[str, CalendarSession]:
    """``session_states(CALENDAR)`` (of a host or a deployment) as ``CalendarSession`` records."""
    return {
        key: CalendarSession(key, view.rollout_id, view.attempt, tuple(view.state.events))
        for key, view in views.items()
    }


class SessionStates(Protocol):
    """A deployment that shows its live sessions (``EmbeddedGym``, ``RayGym``)."""

    async def session_states(
        self, instance: str, participant: str
    ) -> Mapping[str, SessionView]: ...


class RetainedSessions(Protocol):
    """A deployment that shows its retained sessions as plain data (``HttpGym``: a live
    session has no wire form)."""

    async def retained_sessions(
        self, instance: str
    ) -> Mapping[str, Mapping[str, RetainedSession]]: ...


async def calendar_sessions_of(
    gym: SessionStates | RetainedSessions, instance: str
) -> dict[str, CalendarSession]:
    """The calendar sessions ``instance`` of deployment ``gym`` holds now, by session key (for
    sentinel checks): ``calendar_sessions`` of its ``session_states(instance, CALENDAR)``, or,
    on a deployment that has none (``HttpGym``), its retained calendar sessions (the calendar
    is retained: the same sessions, exported)."""
    if hasattr(gym, "session_states"):
        return calendar_sessions(await gym.session_states(instance, CALENDAR))
    retained = await gym.retained_sessions(instance)
    server = CalendarServer()
    return {
        key: CalendarSession(
            key, view.rollout_id, view.attempt, tuple(server.restore(view.state).events)
        )
        for key, view in sorted(retained.get(CALENDAR, {}).items())
    }


def calendar_state(host: GymHost) -> dict[str, CalendarSession]:
    """The calendar sessions ``host`` holds now, by session key (for sentinel checks)."""
    return calendar_sessions(host.session_states(CALENDAR))
