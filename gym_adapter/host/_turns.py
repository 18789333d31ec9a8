"""One episode's turns on the Gym host: from its step boundary until it ends or parks.

A turn is one call of the agent's ``step`` between two step boundaries (``Parking.boundary``
parks the episode there while a checkpoint is prepared). After a turn the retained sessions it
fetched are journaled (``SlotTable.journal_turn``); a turn of an attempt that lost its slot
meanwhile raises ``EpisodeFenced`` (its caller drops the episode and its reply). A failure of
the user's code (``step`` raising, a bad ``Done``, a journaled state that cannot export, a
restored turn that did not ask again every model call staged for it: ``ModelRequestChanged``,
``TurnCalls``) ends
the episode ``Failed`` (data), logged rate-limited; it never ends the instance. A step that
raised ``ModelUnavailable`` fails it as infra, one that raised ``EpisodeConfigError`` as config
(``failure_class_of``).

``Turns`` is also what each turn's ``StepContext`` reaches (the ``TurnHost`` protocol), and
the only writer of the environment's own counters (``EpisodeContext.count``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, final

import attrs

from .._contract import Failed, RunReply
from ._cut import mark_boundary
from ._environment import Environment
from ._episode import EpisodeConfigError, EpisodeFenced, Model, ModelUnavailable
from ._episodes import Episode, ModelRequestChanged, StepContext, completed_reply
from ._log import FailureLog, episode_label
from ._parking import Parking
from ._slots import SlotTable
from ._user_calls import UserCalls
from ._views import HostCounts

__all__ = ["Turns", "failure_class_of", "model_unavailable"]


@final
@attrs.define(eq=False, slots=True, repr=False)
class Turns:
    """The turn loop of one instance (``name``) and what its contexts reach (``TurnHost``):
    fencing by the slot table, the model, the counts, the environment's own counters."""

    name: str
    environment: Environment
    retained_names: frozenset[str]
    slots: SlotTable
    parking: Parking
    count: HostCounts
    user_calls: UserCalls
    """Awaits each ``agent.step`` (and all it awaits): trio, anyio or asyncio code."""
    failure_log: FailureLog
    sessions: tuple[Any, ...] = ()
    """Every participant that opens a session per episode, the agent first (``Roles``): what a
    boundary mark holds."""
    versions: tuple[Any, ...] | None = None
    """``Roles.versions``: the participants' ``state_version`` (what a mark may skip)."""
    user_counts: dict[str, int] = attrs.field(factory=dict)
    policy_version: int = 0
    """The newest trainer policy version the instance has been told (``learn_policy_version``):
    recorded with every model call asked from now on."""
    fenced: Callable[[Episode], bool] = attrs.field(init=False)
    """``TurnHost.fenced``: the slot table's own (no call of ours around it, a few times a
    step)."""

    def __attrs_post_init__(self) -> None:
        self.fenced = self.slots.fenced

    def learn_policy_version(self, version: int) -> None:
        """The trainer is at ``version`` (or later): versions only move forward."""
        if version > self.policy_version:
            self.policy_version = version

    def __repr__(self) -> str:
        return f"<Turns {self.name} turns={self.count.turns} counters={len(self.user_counts)}>"

    # -- TurnHost --------------------------------------------------------------------------------

    @property
    def model(self) -> Model | None:
        return self.environment.model

    def add_count(self, name: str, n: int) -> int:
        value = self.user_counts[name] = self.user_counts.get(name, 0) + n
        return value

    def model_called(self, *, replayed: bool) -> None:
        if replayed:
            self.count.model_replays += 1
        else:
            self.count.model_calls += 1

    # -- the loop --------------------------------------------------------------------------------

    async def play(self, ep: Episode) -> RunReply | None:
        """Turns of ``ep`` until it ends (its reply) or parks (None); ``EpisodeFenced`` if it
        lost its slot (see the module docstring)."""
        rid = ep.rollout_id
        if ep.replay is not None:  # a restored continuation, checked once, before its first turn
            replay, ep.replay = ep.replay, None
            if replay != ep.capture_keys:
                return self._user_failed(
                    ep,
                    Failed(
                        rid,
                        "data",
                        f"{self.name}: restored episode of {rid} has capture keys "
                        f"{list(replay)} in the manifest, {list(ep.capture_keys)} staged by "
                        "the model proxy",
                    ),
                )
        agent = self.environment.agent
        parking, fenced = self.parking, self.fenced
        scheduled = True  # this task's first boundary: the scheduler just ran it
        while True:
            armed = parking.marks  # a prepare that may cut armed them (``Parking.marks``)
            if armed and (ep.mark is None or ep.mark.turn != ep.turn):
                ep.mark = mark_boundary(
                    self.sessions, ep, self.versions
                )  # before any scheduling point
            if not await parking.boundary(ep, fenced, scheduled):
                return None
            ctx = StepContext(self, ep)
            if not armed and parking.marks:  # armed while it waited at the boundary
                ep.mark = mark_boundary(self.sessions, ep, self.versions)
            ep.stepping = True
            try:
                step = agent.step(ctx, ep.sessions[agent.name])
                done, scheduled = await self.user_calls.wait_waited(step)
                if ep.inherited:  # a restored turn asked again every call staged for it
                    ctx.turn_calls().check_replayed(ep)
            except EpisodeFenced:
                raise
            except Exception as exc:
                if fenced_in(exc):  # the agent's own nursery or task group wrapped the fence
                    raise EpisodeFenced(rid) from exc
                # the model's infrastructure failing is not the episode's data: retried as
                # infra; a configuration wrong for every row stops the run (config)
                failure_class, cause = failure_class_of(exc)
                what = (
                    f"model unavailable: {cause}"
                    if failure_class == "infra"
                    else f"configuration error: {cause}"
                    if failure_class == "config"
                    else str(exc)
                    if isinstance(exc, ModelRequestChanged)
                    else f"step raised {exc!r}"
                )
                failed = f"{episode_label(ep.info)} turn {ep.turn}: {what}"
                self.failure_log.warn(failed, exc)
                problem = self.slots.journal_turn(ep, ctx.touched)
                if problem is not None:
                    self.failure_log.warn(problem)
                    failure_class = "data"
                return Failed(rid, failure_class, problem or failed)
            finally:
                ep.stepping = False
            if fenced(ep):
                raise EpisodeFenced(rid)
            if ctx.touched:  # the retained sessions this turn fetched are journaled
                problem = self.slots.journal_turn(ep, ctx.touched)
                if problem is not None:
                    return self._user_failed(ep, Failed(rid, "data", problem))
            ep.turn += 1
            self.count.turns += 1
            if done is not None:
                reply = completed_reply(self.name, ep, done, self.environment.max_payload_bytes)
                if isinstance(reply, Failed):
                    self._user_failed(ep, reply)
                return reply

    def _user_failed(self, ep: Episode, reply: Failed) -> Failed:
        """Log ``reply`` (a failure of ``ep`` the user's code caused, no traceback to give)."""
        message = reply.message
        if ep.rollout_id not in message:
            message = f"{episode_label(ep.info)}: {message}"
        self.failure_log.warn(message)
        return reply


def fenced_in(exc: BaseException) -> bool:
    """Whether ``exc`` is an exception group holding an ``EpisodeFenced``: a session fetched
    inside the agent's own nursery (tool calls run at once) after a newer attempt took the slot.
    The fence wins over whatever else the group holds: the attempt owns nothing any more, so
    neither a reply nor a journal record of it may follow."""
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(EpisodeFenced) is not None


FailureClass = Literal["infra", "data", "config"]


def failure_class_of(exc: BaseException) -> tuple[FailureClass, BaseException]:
    """How an episode that raised ``exc`` failed, with the error that decides it: ``"config"``
    when ``exc`` is, or an exception group holds, an ``EpisodeConfigError`` (wrong for every
    row, whatever failed beside it); ``"infra"`` for a ``ModelUnavailable``
    (``model_unavailable``); else ``"data"`` (``exc`` itself)."""
    config = _leaves(exc, EpisodeConfigError)
    if config:
        return "config", config[0]
    unavailable = model_unavailable(exc)
    if unavailable is not None:
        return "infra", unavailable
    return "data", exc


def _leaves(exc: BaseException, cls: type[BaseException]) -> list[BaseException]:
    """The errors of type ``cls`` in ``exc`` or its (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e, cls)]
    return [exc] if isinstance(exc, cls) else []


def model_unavailable(exc: BaseException) -> ModelUnavailable | None:
    """The ``ModelUnavailable`` a step failed with, or None: ``exc`` itself, or the first of
    an exception group every error of which is one — concurrent calls in a trio nursery or an
    anyio task group all failing because the server is down fail the step with such a group.
    A group with any other error in it is the episode's own failure (data)."""
    if isinstance(exc, ModelUnavailable):
        return exc
    if not isinstance(exc, BaseExceptionGroup):
        return None
    leaves: list[BaseException] = []
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(reversed(e.exceptions))
        else:
            leaves.append(e)
    if leaves and all(isinstance(e, ModelUnavailable) for e in leaves):
        return leaves[0]  # type: ignore[return-value]
    return None
