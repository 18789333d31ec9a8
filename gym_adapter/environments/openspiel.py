"""OpenSpiel games on the Gym host (needs the ``openspiel`` extra; imports ``pyspiel``).

    from gymckpt.gym_adapter.environments.openspiel import openspiel_environment
    env = openspiel_environment("connect_four", policy=my_policy)
    async with EmbeddedGym.host(env, instances=2) as gym: ...

Each episode of (row, slot) loads the game and starts a state; the agent plays every seat
(self-play). A turn is one decision node: the agent asks the policy, through the model proxy (so
every answer is captured under a capture key), for a legal action of the player to move given
that player's observation string (the information state string when the game has no
observation string), checks the answer is one of the legal actions, and applies it. At a
simultaneous node it asks once per player and applies the joint action. Chance nodes are the
environment's: it samples them with the session's own RNG (PCG64, seeded from the deployment
seed, the row and the slot) until a player is to move again, so between two turns the state is
always at a decision node or terminal.

The environment participant's session is exported as plain JSON: the game's string (name and
parameters), ``state.serialize()`` and the RNG's state; it is restored with
``game.deserialize_state``. So a restored episode draws the same chance outcomes and asks the
same questions as an uninterrupted run: its trajectory (``GameTrajectory``) equals the one
``reference_trajectory`` plays with plain pyspiel, bit for bit.

``openspiel_environment`` checks at start that the game exists and that its states round-trip
(serialize → deserialize → serialize equal, and the restored state continues as the original
does over a probe game); a game that fails either raises ``EnvironmentSpecError`` with one line.

The policy is ``policy(observation, legal_actions, rng) -> action``: ``rng`` is a
``numpy.random.Generator`` seeded by the deployment seed, the row, the slot, the turn and the
player, so a stochastic policy answers the same question the same way after a restore.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import anyio
import attrs
import numpy as np
import pyspiel

from gymckpt.gym_adapter import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Done,
    Environment,
    EnvironmentSpecError,
    EpisodeContext,
    EpisodeInfo,
)

from ._seeding import derive_seed

__all__ = [
    "ENV_PARTICIPANT",
    "GameTrajectory",
    "OpenSpielAgent",
    "OpenSpielParticipant",
    "Policy",
    "SpielSession",
    "check_game",
    "episode_rng",
    "openspiel_environment",
    "random_legal_policy",
    "reference_trajectory",
]

ENV_PARTICIPANT: Final = "env"
Policy = Callable[[str, list[int], np.random.Generator], int]
PROBE_DECISIONS: Final = 40
"""How many decisions the start check plays (from the initial state, chance sampled)."""


def episode_rng(seed: int, row: int, slot: int) -> np.random.Generator:
    """The chance RNG of episode (row, slot) under deployment ``seed``, as it starts."""
    return np.random.Generator(np.random.PCG64(derive_seed("gymckpt-openspiel", seed, row, slot)))


def _policy_rng(seed: int, row: int, slot: int, turn: int, player: int) -> np.random.Generator:
    return np.random.default_rng(
        derive_seed("gymckpt-openspiel-policy", seed, row, slot, turn, player)
    )


def random_legal_policy(
    observation: str, legal_actions: list[int], rng: np.random.Generator
) -> int:
    """A uniformly random legal action."""
    return legal_actions[int(rng.integers(len(legal_actions)))]


# -- the game: loading, observations, chance -------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """pyspiel's C++ side prints every error it raises (``OpenSpiel exception: …``, the whole
    list of games for an unknown one) to file descriptor 2 besides raising it; the start check
    reports one line of its own, so it runs with descriptor 2 pointed at /dev/null. Process
    wide while it lasts (a few milliseconds, once per environment)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _load(game_name: str) -> pyspiel.Game:
    short = game_name.split("(", 1)[0]
    if short not in pyspiel.registered_names():
        raise EnvironmentSpecError(
            f"no such OpenSpiel game {game_name!r} (pyspiel.registered_names() lists the "
            f"{len(pyspiel.registered_names())} there are)"
        )
    try:
        with _native_stderr_silenced():
            return pyspiel.load_game(game_name)
    except Exception as exc:  # pyspiel.SpielError, or a parameter the game refuses
        raise EnvironmentSpecError(
            f"OpenSpiel game {game_name!r} does not load: {_first_line(exc)}"
        ) from None


def _observe(game: pyspiel.Game) -> Callable[[pyspiel.State, int], str]:
    """The text a player sees: its observation string, or its information state string when
    the game has no observation string."""
    kind = game.get_type()
    if kind.provides_observation_string:
        return lambda state, player: state.observation_string(player)
    if kind.provides_information_state_string:
        return lambda state, player: state.information_state_string(player)
    raise EnvironmentSpecError(
        f"OpenSpiel game {str(game)!r} provides neither observation nor information state "
        "strings, so a policy has no text to read"
    )


def _resolve_chance(state: pyspiel.State, rng: np.random.Generator) -> None:
    """Sample chance nodes with ``rng`` (one uniform draw each, outcomes in the game's order)
    until a player is to move or the game is over."""
    while state.is_chance_node():
        outcomes = state.chance_outcomes()
        u = rng.random()
        acc = 0.0
        choice = outcomes[-1][0]
        for action, prob in outcomes:
            acc += prob
            if u < acc:
                choice = action
                break
        state.apply_action(choice)


def _movers(state: pyspiel.State) -> list[int]:
    """The players who act at this decision node (every one at a simultaneous node)."""
    if state.is_simultaneous_node():
        return list(range(state.num_players()))
    return [state.current_player()]


def _legal(state: pyspiel.State, player: int) -> list[int]:
    return [int(a) for a in state.legal_actions(player)]


def _apply(state: pyspiel.State, actions: list[int]) -> None:
    if state.is_simultaneous_node():
        state.apply_actions(actions)
    else:
        state.apply_action(actions[0])


def _checked_action(answer: Any, legal: list[int], where: str) -> int:
    """The policy's answer (untrusted) as a legal action, or ValueError naming the place."""
    if type(answer) is not int:
        raise ValueError(f"{where}: the policy answered {answer!r}, not an action (an int)")
    if answer not in legal:
        raise ValueError(
            f"{where}: the policy answered {answer}, not a legal action "
            f"({len(legal)} legal: {legal[:20]}{' …' if len(legal) > 20 else ''})"
        )
    return answer


# -- the RNG's state as JSON -----------------------------------------------------------------


def _rng_export(rng: np.random.Generator) -> dict[str, Any]:
    st = rng.bit_generator.state
    return {  # the 128-bit words as decimal strings (JSON numbers stop at 64 bits here)
        "state": str(st["state"]["state"]),
        "inc": str(st["state"]["inc"]),
        "has_uint32": int(st["has_uint32"]),
        "uinteger": int(st["uinteger"]),
    }


def _rng_restore(data: Any) -> np.random.Generator:
    if not isinstance(data, dict) or set(data) != {"state", "inc", "has_uint32", "uinteger"}:
        raise ValueError(f"openspiel session rng: not a PCG64 state: {data!r}")
    bits = np.random.PCG64()
    bits.state = {
        "bit_generator": "PCG64",
        "state": {"state": int(data["state"]), "inc": int(data["inc"])},
        "has_uint32": int(data["has_uint32"]),
        "uinteger": int(data["uinteger"]),
    }
    return np.random.Generator(bits)


# -- the start check ---------------------------------------------------------------------------


def _probe_round_trip(game: pyspiel.Game, decisions: int) -> str | None:
    """Play ``decisions`` decisions (random legal actions, chance sampled); at each one check
    that serialize → deserialize → serialize is equal and that the restored state continues
    as the original does. What differs first, or None."""
    rng = np.random.Generator(np.random.PCG64(0))
    twin_rng = np.random.Generator(np.random.PCG64(0))
    policy_rng = np.random.Generator(np.random.PCG64(1))
    state = game.new_initial_state()
    _resolve_chance(state, rng)
    for n in range(decisions):
        if state.is_terminal():
            return None
        blob = state.serialize()
        twin = game.deserialize_state(blob)
        if twin.serialize() != blob:
            return f"after {n} decisions serialize → deserialize_state → serialize differs"
        if str(twin) != str(state):
            return f"after {n} decisions the restored state prints differently"
        twin_rng.bit_generator.state = rng.bit_generator.state
        actions = [random_legal_policy("", _legal(state, p), policy_rng) for p in _movers(state)]
        for s, r in ((state, rng), (twin, twin_rng)):
            _apply(s, actions)
            _resolve_chance(s, r)
        if twin.serialize() != state.serialize() or str(twin) != str(state):
            return f"after {n} decisions a restored state continues differently"
    return None


def check_game(game_name: str) -> pyspiel.Game:
    """The loaded game, or ``EnvironmentSpecError`` (one line) when it does not exist or does
    not load, is a mean-field game, samples chance inside the game (its draws would not be the
    session's), has no text for a policy, or its states do not round-trip. (A game whose
    ``deserialize_state`` crashes the process, as tarok's did, is one of the sampled ones.)"""
    game = _load(game_name)
    dynamics = game.get_type().dynamics
    if dynamics not in (
        pyspiel.GameType.Dynamics.SEQUENTIAL,
        pyspiel.GameType.Dynamics.SIMULTANEOUS,
    ):
        raise EnvironmentSpecError(
            f"OpenSpiel game {game_name!r} has {dynamics.name.lower()} dynamics; only sequential "
            "and simultaneous games are hosted"
        )
    if game.get_type().chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        raise EnvironmentSpecError(
            f"OpenSpiel game {game_name!r} samples its chance events itself (sampled stochastic), "
            "outside the session's RNG; only deterministic games and games with explicit "
            "chance nodes are hosted"
        )
    _observe(game)
    try:
        with _native_stderr_silenced():
            problem = _probe_round_trip(game, PROBE_DECISIONS)
    except Exception as exc:  # a game whose serialize or deserialize_state fails
        problem = f"{type(exc).__name__}: {_first_line(exc)}"
    if problem is not None:
        raise EnvironmentSpecError(
            f"OpenSpiel game {game_name!r} cannot be checkpointed: a probe game with every "
            f"state round-tripped through serialize/deserialize_state failed ({problem})"
        )
    return game


# -- the participants --------------------------------------------------------------------------


@attrs.define(slots=True)
class SpielSession:
    """The environment participant's session: the live game state (at a decision node or
    terminal) and the chance RNG."""

    state: pyspiel.State
    rng: np.random.Generator


@attrs.frozen
class OpenSpielParticipant:
    """The ``env`` participant: one state of ``game`` per session, exported as
    ``{"game", "state", "rng"}`` (the game's string, ``state.serialize()``, the PCG64 state)."""

    game: pyspiel.Game
    name: str = ENV_PARTICIPANT
    kind: str = "environment"

    def open(self, info: EpisodeInfo) -> SpielSession:
        state = self.game.new_initial_state()
        rng = episode_rng(info.seed, info.row, info.slot)
        _resolve_chance(state, rng)
        return SpielSession(state, rng)

    def export(self, state: SpielSession) -> Any:
        return {
            "game": str(self.game),
            "state": state.state.serialize(),
            "rng": _rng_export(state.rng),
        }

    def restore(self, data: Any) -> SpielSession:
        if data.get("game") != str(self.game):
            raise ValueError(
                f"openspiel session: exported from game {data.get('game')!r}, this host plays "
                f"{str(self.game)!r}"
            )
        if not isinstance(data.get("state"), str):
            raise ValueError("openspiel session: state is not a serialized state string")
        return SpielSession(self.game.deserialize_state(data["state"]), _rng_restore(data["rng"]))


@attrs.define(slots=True)
class GameTrajectory:
    """An episode's trajectory: one entry of ``players``, ``observations`` and ``actions`` per
    decision (a simultaneous node gives one per player, in player order); at the end
    ``returns`` (one per player), ``history`` (every action of the game, chance outcomes
    included), and whether the game ended (``terminal``) or ``max_turns`` cut it. Plain data:
    the episode's payload."""

    players: list[int] = attrs.field(factory=list)
    observations: list[str] = attrs.field(factory=list)
    actions: list[int] = attrs.field(factory=list)
    returns: list[float] = attrs.field(factory=list)
    history: list[int] = attrs.field(factory=list)
    turns: int = 0
    terminal: bool = False
    truncated: bool = False


def _request(turn: int, player: int, observation: str, legal: list[int]) -> dict[str, Any]:
    return {"turn": turn, "player": player, "observation": observation, "legal_actions": legal}


def _finish(traj: GameTrajectory, state: pyspiel.State) -> None:
    traj.returns = [float(r) for r in state.returns()]
    traj.history = [int(a) for a in state.history()]
    traj.terminal = bool(state.is_terminal())
    traj.truncated = not traj.terminal


@attrs.frozen
class OpenSpielAgent:
    """The agent: per turn, ask the policy for each mover's action and apply them; sample the
    chance nodes after. ``pace_s`` waits that long per turn (a tool's latency, for demos);
    ``max_turns`` ends an episode (truncated) after that many turns. The episode's reward is
    seat 0's return (every seat's is in the payload)."""

    observe: Callable[[pyspiel.State, int], str]
    pace_s: float = 0.0
    max_turns: int | None = None
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> GameTrajectory:
        return GameTrajectory()

    def export(self, state: GameTrajectory) -> Any:
        # copies of the lists, not of their entries (str and int, never changed in place)
        return {
            "players": list(state.players),
            "observations": list(state.observations),
            "actions": list(state.actions),
            "returns": list(state.returns),
            "history": list(state.history),
            "turns": state.turns,
            "terminal": state.terminal,
            "truncated": state.truncated,
        }

    def restore(self, data: Any) -> GameTrajectory:
        return GameTrajectory(**data)

    def _done(self, traj: GameTrajectory, state: pyspiel.State) -> Done | None:
        if state.is_terminal() or (self.max_turns is not None and traj.turns >= self.max_turns):
            _finish(traj, state)
            return Done(traj.returns[0], payload=traj)
        return None

    async def step(self, ctx: EpisodeContext, traj: GameTrajectory) -> Done | None:
        session: SpielSession = ctx.session(ENV_PARTICIPANT)
        state = session.state
        done = self._done(traj, state)  # a game over before any move (or max_turns=0)
        if done is not None:
            return done
        # the turn's questions are asked before anything changes: a cut at this turn's
        # boundary exports the state as it was, and the turn runs again whole after a restore
        movers = _movers(state)
        actions: list[int] = []
        observations: list[str] = []
        for player in movers:
            legal = _legal(state, player)
            observation = self.observe(state, player)
            answer = await ctx.model(_request(traj.turns, player, observation, legal))
            where = f"turn {traj.turns}, player {player}"
            actions.append(_checked_action(answer, legal, where))
            observations.append(observation)
        if self.pace_s > 0:
            await anyio.sleep(self.pace_s)
        session = ctx.session(ENV_PARTICIPANT)  # still the owner after the waits
        state = session.state
        _apply(state, actions)
        _resolve_chance(state, session.rng)
        traj.players.extend(movers)
        traj.observations.extend(observations)
        traj.actions.extend(actions)
        traj.turns += 1
        return self._done(traj, state)


def _model(policy: Policy) -> Callable[[str, Any, EpisodeInfo], Any]:
    def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        rng = _policy_rng(info.seed, info.row, info.slot, request["turn"], request["player"])
        answer = policy(request["observation"], list(request["legal_actions"]), rng)
        return answer.item() if isinstance(answer, np.integer) else answer

    return model


def openspiel_environment(
    game_name: str,
    policy: Policy | None = None,
    *,
    pace_s: float = 0.0,
    max_turns: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Environment:
    """An ``Environment`` playing OpenSpiel ``game_name`` (a registered name, with parameters
    as pyspiel reads them: ``"nim(pile_sizes=1;3;5)"``) in self-play with ``policy``
    (default ``random_legal_policy``).

    Checks the game first (``check_game``): ``EnvironmentSpecError`` in one line for a game
    that does not exist or whose states do not round-trip."""
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
    game = check_game(game_name)
    return Environment(
        agent=OpenSpielAgent(_observe(game), pace_s=pace_s, max_turns=max_turns),
        participants=(OpenSpielParticipant(game),),
        model=_model(policy or random_legal_policy),
        max_payload_bytes=max_payload_bytes,
    )


def reference_trajectory(
    game_name: str,
    seed: int,
    row: int,
    slot: int,
    policy: Policy | None = None,
    max_turns: int | None = None,
) -> GameTrajectory:
    """The uninterrupted run of episode (row, slot) with plain pyspiel: the trajectory a hosted
    episode must reproduce exactly, crash and restore or not."""
    game = pyspiel.load_game(game_name)
    observe = _observe(game)
    model = _model(policy or random_legal_policy)
    info = EpisodeInfo(f"{row}-{slot}", row, slot, 0, seed, "")
    state = game.new_initial_state()
    rng = episode_rng(seed, row, slot)
    _resolve_chance(state, rng)
    traj = GameTrajectory()
    while not state.is_terminal() and (max_turns is None or traj.turns < max_turns):
        movers = _movers(state)
        actions = []
        for player in movers:
            legal = _legal(state, player)
            observation = observe(state, player)
            answer = model("", _request(traj.turns, player, observation, legal), info)
            actions.append(_checked_action(answer, legal, f"turn {traj.turns}, player {player}"))
            traj.observations.append(observation)
        _apply(state, actions)
        _resolve_chance(state, rng)
        traj.players.extend(movers)
        traj.actions.extend(actions)
        traj.turns += 1
    _finish(traj, state)
    return traj
