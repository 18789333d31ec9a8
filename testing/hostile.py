"""Hostile environments: user code that is wrong in the ways a real environment is, for the
simulation (``gymckpt simulate --hostile``) and for tests.

A user's environment is untrusted input. Each hostile *act* below is one way it goes wrong;
whatever it does, nothing may be lost or repeated: the episode fails (and is retried), or the
checkpoint fails and is retried — never an "ok" snapshot that cannot be restored, never a run
aborted as an invariant violation.

Acts of one episode (``row``/``slot``, first attempt only, at turn ``turn``):

* ``raise_after_mutation``: the turn mutates the retained calendar as planned, then raises;
* ``nan_reward``, ``inf_reward``: the episode ends with a non-finite reward;
* ``set_payload``: the episode ends with a payload that is not JSON (a ``set``);
* ``nan_payload``: the episode ends with a payload holding a non-finite number;
* ``hang``: the turn never returns (what bounds it is the protocol's business: the prepare
  deadline fails the checkpoint, the reply stream's deadline abandons the attempt).

Acts of an export (the ``n``-th call, counted across the deployment, of the calendar's
``export``: for the journal after a turn, for a commit, for a view):

* ``export_set``: returns a ``set`` inside the state;
* ``export_nan``: returns a non-finite number inside the state (the calendar's ``restore``
  refuses a state whose number came back as anything else: it would have been lost);
* ``export_raises``: raises.

Faults of the retained sessions' journal (``n``-th write to any instance's journal):

* ``short_write``: ``os.write`` writes half the record and returns the count, as a write to a
  full pipe or a signal-interrupted write may;
* ``torn_record``: the record is written without its last byte and the instance dies right
  there (a process killed inside its append: ``kill`` closes its journal, so nothing more of
  it reaches the file);
* ``full_disk``: ``os.write`` raises ``ENOSPC`` for ``count`` writes in a row.

``hostile_calendar_environment`` wraps the calendar workplace with a ``HostileActs`` plan;
``journal_faults`` injects the journal faults by replacing ``os.write`` (writes to any other file
pass through). ``hostile_guess_the_number`` is the README's game with
one act, for the conformance kit.
"""

from __future__ import annotations

import errno
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

import anyio
import attrs

from gymckpt.gym_adapter import AgentWrapper, Done, Environment, EpisodeContext, EpisodeInfo
from gymckpt.gym_adapter._shared import JOURNAL_FILE
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    plan_episode,
)

from .examples import Game, Player, _bisect

__all__ = [
    "EPISODE_ACTS",
    "EXPORT_ACTS",
    "HOSTILE_ACTS",
    "JOURNAL_FAULTS",
    "HostileAct",
    "HostileActs",
    "acts_summary",
    "draw_hostile",
    "hostile_calendar_environment",
    "hostile_guess_the_number",
    "journal_faults",
]

EPISODE_ACTS: Final = (
    "raise_after_mutation",
    "nan_reward",
    "inf_reward",
    "set_payload",
    "nan_payload",
    "hang",
)
EXPORT_ACTS: Final = ("export_set", "export_nan", "export_raises")
JOURNAL_FAULTS: Final = ("short_write", "torn_record", "full_disk")
HOSTILE_ACTS: Final = (*EPISODE_ACTS, *EXPORT_ACTS, *JOURNAL_FAULTS)
DATA_ACTS: Final = frozenset((*EPISODE_ACTS, *EXPORT_ACTS)) - {"hang"}
"""Acts that may cost the episode they hit a data failure (a hang is abandoned instead)."""


class HostileError(RuntimeError):
    """What a hostile participant raises (a user's own bug)."""


@attrs.frozen(kw_only=True)
class HostileAct:
    """One act: ``kind`` (see the module docstring), where it strikes."""

    kind: str = attrs.field(validator=attrs.validators.in_(HOSTILE_ACTS))
    row: int = 0
    slot: int = 0
    turn: int = 0
    n: int = 1
    """The export call or journal write it strikes (1-based, across the deployment)."""
    count: int = 1
    """``full_disk``: how many writes in a row fail."""

    def __str__(self) -> str:
        if self.kind in EPISODE_ACTS:
            return f"{self.kind}@{self.row}-{self.slot}:t{self.turn}"
        extra = f"x{self.count}" if self.count > 1 else ""
        return f"{self.kind}@{self.n}{extra}"


@attrs.define(eq=False)
class HostileActs:
    """A deployment's plan of acts and what fired (``fired``: act kind → times). ``active``
    False: a well-behaved environment (the simulation's last incarnation)."""

    acts: tuple[HostileAct, ...] = ()
    active: bool = True
    fired: Counter[str] = attrs.field(factory=Counter)
    exports: int = 0
    writes: int = 0

    def episode_act(self, info: EpisodeInfo, turn: int) -> str | None:
        if not self.active or info.attempt != 0:
            return None
        for act in self.acts:
            if act.kind in EPISODE_ACTS and (act.row, act.slot, act.turn) == (
                info.row,
                info.slot,
                turn,
            ):
                return act.kind
        return None

    def export_act(self) -> str | None:
        if not self.active:
            return None
        self.exports += 1
        for act in self.acts:
            if act.kind in EXPORT_ACTS and act.n == self.exports:
                self.fired[act.kind] += 1
                return act.kind
        return None

    def journal_act(self) -> str | None:
        if not self.active:
            return None
        self.writes += 1
        for act in self.acts:
            if act.kind in JOURNAL_FAULTS and act.n <= self.writes < act.n + act.count:
                self.fired[act.kind] += 1
                return act.kind
        return None

    @property
    def data_failures_allowed(self) -> int:
        """At most this many data failures may come of the acts that fired."""
        return sum(n for kind, n in self.fired.items() if kind in DATA_ACTS)


def draw_hostile(
    seed: int, rows: int, group_size: int, config: CalendarConfig
) -> tuple[HostileAct, ...]:
    """The acts of ``seed`` (its own generator: a pure function of these arguments). About
    two seeds in three get one to three acts."""
    rng = random.Random(f"hostile:{seed}")
    if rng.random() >= 0.65:
        return ()
    acts: list[HostileAct] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(HOSTILE_ACTS)
        if kind in EPISODE_ACTS:
            row, slot = rng.randrange(rows), rng.randrange(group_size)
            plan = plan_episode(seed, row, slot, config)
            mutating = [t for t, m in enumerate(plan.mutates) if m]
            if kind == "raise_after_mutation" and mutating:
                turn = rng.choice(mutating)
            elif kind.endswith(("_reward", "_payload")):
                turn = plan.turns  # the call that ends the episode
            else:
                turn = rng.randrange(plan.turns)
            acts.append(HostileAct(kind=kind, row=row, slot=slot, turn=turn))
        else:
            acts.append(
                HostileAct(
                    kind=kind,
                    n=rng.randint(1, 40),
                    count=rng.randint(1, 3) if kind == "full_disk" else 1,
                )
            )
    return tuple(acts)


# -- the calendar workplace, hostile ----------------------------------------------------------


@attrs.frozen
class _HostileAgent(AgentWrapper):
    acts: HostileActs = attrs.field(kw_only=True)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        act = self.acts.episode_act(ctx.info, ctx.turn)
        if act is not None:
            self.acts.fired[act] += 1
        if act == "hang":
            await anyio.sleep_forever()
        done = await self.inner.step(ctx, state)
        if act == "raise_after_mutation":
            raise HostileError(f"hostile: turn {ctx.turn} raises after its mutation")
        if done is None or act is None:
            return done
        if act == "nan_reward":
            return attrs.evolve(done, reward=math.nan)
        if act == "inf_reward":
            return attrs.evolve(done, reward=math.inf)
        if act == "set_payload":
            return attrs.evolve(done, payload={"tags": {1, 2}})
        if act == "nan_payload":
            return attrs.evolve(done, payload=[1.0, math.nan])
        return done


@attrs.frozen
class _HostileServer:
    inner: Any
    acts: HostileActs
    name: str = attrs.field(
        init=False, default=attrs.Factory(lambda s: s.inner.name, takes_self=True)
    )
    kind: str = attrs.field(
        init=False, default=attrs.Factory(lambda s: s.inner.kind, takes_self=True)
    )
    retained: bool = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda s: getattr(s.inner, "retained", False) is True, takes_self=True
        ),
    )

    def open(self, info: EpisodeInfo) -> Any:
        return self.inner.open(info)

    def export(self, state: Any) -> Any:
        data = self.inner.export(state)
        act = self.acts.export_act()
        if act == "export_raises":
            raise HostileError("hostile: export raises")
        if act == "export_set":
            return {**data, "tags": {"a", "b"}}
        if act == "export_nan":
            return {**data, "score": math.nan}
        return data

    def restore(self, data: Any) -> Any:
        if isinstance(data, Mapping) and "score" in data:
            score = data["score"]
            if not (isinstance(score, float) and math.isnan(score)):
                raise ValueError(
                    f"hostile: the exported score came back as {score!r}: a value "
                    "was lost between export and restore"
                )
            data = {k: v for k, v in data.items() if k != "score"}
        if isinstance(data, Mapping) and "tags" in data:
            raise ValueError(f"hostile: exported tags came back as {data['tags']!r}")
        return self.inner.restore(data)


def hostile_calendar_environment(
    agent_kind: str, config: CalendarConfig, acts: HostileActs
) -> Environment:
    """The calendar workplace (``calendar_environment``) doing ``acts``: the same sessions,
    plans and sentinels, so the simulation's judge applies unchanged."""
    env = calendar_environment(agent_kind, config)
    return Environment(
        agent=_HostileAgent(env.agent, acts=acts),
        participants=tuple(_HostileServer(p, acts) for p in env.participants),
        model=env.model,
    )


# -- journal faults ---------------------------------------------------------------------------


def _path_of(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


@contextmanager
def journal_faults(acts: HostileActs, kill: Callable[[str], None]) -> Iterator[None]:
    """Inject ``acts``' journal faults into every host's journal while the context is open.
    ``kill(instance)`` kills an instance (a ``torn_record`` kills the one it tears).

    ``os.write`` is replaced for the process; a write to any file but a journal
    (``JOURNAL_FILE``) goes through untouched."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        path = _path_of(fd)
        if path is None or os.path.basename(path) != JOURNAL_FILE:
            return real_write(fd, data)
        act = acts.journal_act()
        if act == "short_write" and len(data) > 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        if act == "full_disk":
            raise OSError(errno.ENOSPC, "No space left on device (hostile journal fault)")
        if act == "torn_record":  # the process dies inside its append: nothing after it runs
            real_write(fd, bytes(data)[:-1])
            kill(os.path.basename(os.path.dirname(path)))  # closes the journal: no more writes
            return len(data)
        return real_write(fd, data)

    os.write = write
    try:
        yield
    finally:
        os.write = real_write


# -- the README's game, hostile (for the conformance kit) -----------------------------------


class _HostilePlayer(Player):
    def __init__(self, act: str) -> None:
        self.act = act

    def export(self, state: dict[str, Any]) -> Any:
        if self.act == "export_less":  # forgets its last guess
            return {**state, "guesses": state["guesses"][:-1]}
        if self.act == "export_set":
            return {**state, "seen": set(state["guesses"])}
        if self.act == "export_nan":
            return {**state, "score": math.nan}
        return state

    def restore(self, data: Any) -> dict[str, Any]:
        state = dict(data)
        state.pop("seen", None)
        state.pop("score", None)
        return state

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        if self.act == "hang" and ctx.turn == 1:
            await anyio.sleep_forever()
        done = await super().step(ctx, state)
        if self.act == "raise_after_mutation" and ctx.turn == 1:
            raise HostileError("hostile: the second guess raises")
        if done is None:
            return None
        if self.act == "nan_reward":
            return Done(reward=math.nan, payload=done.payload)
        if self.act == "set_payload":
            return Done(reward=done.reward, payload=set(done.payload))
        return done


KIT_ACTS: Final = (
    "raise_after_mutation",
    "nan_reward",
    "set_payload",
    "export_less",
    "export_set",
    "export_nan",
    "hang",
)


def hostile_guess_the_number(act: str) -> Environment:
    """The README's guess-the-number game whose player does ``act`` (one of ``KIT_ACTS``)."""
    if act not in KIT_ACTS:
        raise ValueError(f"act must be one of {', '.join(KIT_ACTS)}, got {act!r}")
    return Environment(agent=_HostilePlayer(act), participants=(Game(),), model=_bisect)


def acts_summary(acts: Sequence[HostileAct]) -> str:
    return ", ".join(str(a) for a in acts) or "none"
