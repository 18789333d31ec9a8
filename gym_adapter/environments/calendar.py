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
exactly once (the exactly-once verdict). ``calendar_embedded`` and ``calendar_ray`` serve it on
either deployment (which know nothing of it). Nothing here is private to gymckpt: this module uses
only what ``gymckpt.gym_adapter`` exports.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
import attrs
import orjson

from gymckpt.runtime import rollout_id_for

from .._faults import FaultSpec
from ..host._environment import Environment
from ..host._episode import Done, EpisodeContext, EpisodeFenced, EpisodeInfo
from ..host._episodes import capture_key as host_capture_key
from ..host._episodes import request_digest
from ..host._host import GymHost, HostConfig, SessionView
from ..host._load import EnvironmentRef
from ..host._views import RetainedSession
from ..transports._embedded import EmbeddedGym

if TYPE_CHECKING:
    from ..transports.http._gym import HttpGym
    from ..transports.ray._gym import RayGym

__all__ = [
    "AGENT_KINDS",
    "CALENDAR",
    "CalendarAgent",
    "CalendarEvent",
    "CalendarServer",
    "CalendarSession",
    "CalendarState",
    "CalendarWorkplace",
    "EpisodePlan",
    "SimConfig",
    "calendar_embedded",
    "calendar_environment",
    "calendar_from_environ",
    "calendar_host",
    "calendar_http",
    "calendar_model",
    "calendar_ray",
    "calendar_sessions",
    "calendar_sessions_of",
    "calendar_state",
    "calendar_workplace",
    "capture_key",
    "plan_episode",
    "sentinel",
    "session_key",
]

AGENT_KINDS: Final = ("simple_agent", "legacy_agent")
CONFIG_ENV: Final = "GYMCKPT_CALENDAR_CONFIG"
"""The environment variable a spawned ``gymckpt serve`` reads the workplace's ``SimConfig`` from
(JSON, ``calendar_from_environ``)."""
AGENT: Final = "agent"
CALENDAR: Final = "calendar"


def session_key(row: int, slot: int) -> str:
    """The environment session of a generation slot: ``"{row}-{slot}"``."""
    return f"{row}-{slot}"


def capture_key(row: int, slot: int, turn: int, request: str, attempt: int = 0) -> str:
    """The key turn ``turn``'s model call, of ``request`` (the plan's payload of the turn), is
    staged under by attempt ``attempt`` of the slot (one call per turn)."""
    info = EpisodeInfo(rollout_id_for(row, slot, attempt), row, slot, attempt, 0, "")
    return host_capture_key(info, turn, request_digest(orjson.dumps(request)), 0)


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
class SimConfig:
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

    def host_config(self) -> HostConfig:
        """The host's part of this config."""
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


def plan_episode(seed: int, row: int, slot: int, config: SimConfig) -> EpisodePlan:
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

    config: SimConfig
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
        await anyio.sleep(plan.durations[turn])
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


def calendar_environment(
    agent_kind: str = "simple_agent", config: SimConfig | None = None
) -> Environment:
    """The calendar workplace as an ``Environment``: agent, calendar, model proxy."""
    if agent_kind not in AGENT_KINDS:
        raise ValueError(f"agent kind must be one of {', '.join(AGENT_KINDS)}, got {agent_kind!r}")
    cfg = config if config is not None else SimConfig()
    return Environment(
        agent=CalendarAgent(cfg, agent_kind),
        participants=(CalendarServer(),),
        model=calendar_model,
    )


@attrs.frozen
class CalendarWorkplace:
    """A deployment of the calendar workplace as any deployment's ``host`` takes it: one
    environment per instance (by reference, so an instance in another process builds its own)
    and the host's part of the config."""

    environments: tuple[EnvironmentRef, ...]
    host_config: HostConfig


def calendar_workplace(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    config: SimConfig | None = None,
) -> CalendarWorkplace:
    """The calendar workplace on ``instances`` instances: ``agent_kinds`` is one kind for all
    of them or one per instance. Raises ``ValueError`` naming a bad count or kind."""
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances!r}")
    kinds = (agent_kinds,) * instances if isinstance(agent_kinds, str) else tuple(agent_kinds)
    if len(kinds) != instances:
        raise ValueError(f"got {len(kinds)} agent kinds for {instances} instances")
    for kind in kinds:
        if kind not in AGENT_KINDS:
            raise ValueError(f"agent kind must be one of {', '.join(AGENT_KINDS)}, got {kind!r}")
    cfg = config if config is not None else SimConfig()
    return CalendarWorkplace(
        tuple(
            EnvironmentRef.to(calendar_environment, agent_kind=kind, config=cfg) for kind in kinds
        ),
        cfg.host_config(),
    )


@asynccontextmanager
async def calendar_embedded(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    seed: int = 0,
    work_dir: str | Path | None = None,
    config: SimConfig | None = None,
    faults: Sequence[str | FaultSpec] = (),
) -> AsyncIterator[EmbeddedGym]:
    """The calendar workplace (``calendar_workplace``: ``agent_kinds`` one kind for all
    instances or one per instance, ``config`` its knobs) served on ``instances`` embedded
    instances until the context exits: ``EmbeddedGym.host`` with its environments.

    ``faults`` are C3 specs (strings or ``FaultSpec``); a bad spec raises ``ValueError``
    before anything runs. With ``work_dir``, each instance keeps its calendar sessions in a
    durable log there, which a replacement (``replace``) continues.
    """
    workplace = calendar_workplace(instances, agent_kinds, config)
    async with EmbeddedGym.host(
        workplace.environments, instances, seed, work_dir, workplace.host_config, faults
    ) as gym:
        yield gym


@asynccontextmanager
async def calendar_ray(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    seed: int = 0,
    work_dir: str | Path | None = None,
    config: SimConfig | None = None,
    faults: Sequence[str | FaultSpec] = (),
    address: str | None = None,
    *,
    num_cpus: float = 0.1,
    stuck_loop_s: float = 0.0,
    batch_replies: bool = True,
    max_batch_replies: int = 1024,
    startup_timeout_s: float = 60.0,
    cluster_loss_s: float | None = None,
) -> AsyncIterator[RayGym]:
    """The calendar workplace served on ``instances`` Ray actors until the context exits:
    ``RayGym.host`` with its environments. The arguments up to ``faults`` are
    ``calendar_embedded``'s, the rest ``RayGym.host``'s (``cluster_loss_s=None``: its default).

    Ray is imported only here, when called: Ray is an optional extra, and this module is
    imported with ``gym_adapter``.
    """
    from ..transports.ray._gym import RayGym

    workplace = calendar_workplace(instances, agent_kinds, config)
    loss = {} if cluster_loss_s is None else {"cluster_loss_s": cluster_loss_s}
    async with RayGym.host(
        workplace.environments,
        instances,
        seed,
        work_dir,
        workplace.host_config,
        faults,
        address,
        num_cpus=num_cpus,
        stuck_loop_s=stuck_loop_s,
        batch_replies=batch_replies,
        max_batch_replies=max_batch_replies,
        startup_timeout_s=startup_timeout_s,
        **loss,
    ) as gym:
        yield gym


@asynccontextmanager
async def calendar_http(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    seed: int = 0,
    work_dir: str | Path | None = None,
    config: SimConfig | None = None,
    faults: Sequence[str | FaultSpec] = (),
    *,
    state_root: str | Path | None = None,
    **options: Any,
) -> AsyncIterator[HttpGym]:
    """The calendar workplace served by ``instances`` spawned ``gymckpt serve`` processes until
    the context exits: ``HttpGym.spawn`` of ``calendar_from_environ`` (one agent kind per
    instance), the config handed over in ``CONFIG_ENV``. The arguments up to ``faults`` are
    ``calendar_embedded``'s (``work_dir`` default: the current directory), the rest
    ``HttpGym.spawn``'s."""
    from ..transports.http._gym import HttpGym

    workplace = calendar_workplace(instances, agent_kinds, config)
    cfg = config if config is not None else SimConfig()
    kinds = [dict(ref.kwargs)["agent_kind"] for ref in workplace.environments]
    environments = [f"{__name__}:calendar_from_environ_{kind}" for kind in kinds]
    async with HttpGym.spawn(
        environments,
        instances,
        work_dir=work_dir if work_dir is not None else os.curdir,
        config=workplace.host_config,
        faults=faults,
        seed=seed,
        state_root=state_root,
        environ={CONFIG_ENV: json.dumps(attrs.asdict(cfg))},
        **options,
    ) as gym:
        yield gym


def calendar_from_environ(agent_kind: str = "simple_agent") -> Environment:
    """The calendar workplace with the ``SimConfig`` in ``CONFIG_ENV`` (JSON of its fields;
    the defaults without it): how a ``gymckpt serve`` process started by ``calendar_http``
    builds its environment. ``ValueError`` names a malformed config."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        return calendar_environment(agent_kind)
    try:
        raw = json.loads(text)
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        config = SimConfig(**fields)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{CONFIG_ENV} is not a calendar SimConfig: {exc}") from None
    return calendar_environment(agent_kind, config)


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
    config: SimConfig | None = None,
    *,
    recover: bool = False,
) -> GymHost:
    """One calendar workplace instance: a ``GymHost`` serving ``calendar_environment``."""
    cfg = config if config is not None else SimConfig()
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
