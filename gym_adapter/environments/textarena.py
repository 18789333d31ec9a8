"""TextArena games on the Gym host (needs the ``textarena`` extra).

    from gymckpt.gym_adapter.environments.textarena import textarena_environment
    env = textarena_environment("TicTacToe-v0")
    async with EmbeddedGym.host(env, instances=2) as gym: ...

Each episode of (row, slot) is ``textarena.make(env_id)`` reset with a seed drawn from the
deployment seed, the row and the slot, with as many players as the game seats; the agent plays
every seat in turn (self-play). Each turn it asks the model (``ctx.model``, so every move is
captured under a capture key) for a move of the current player given its observation, a
``TurnRequest``-shaped dict ``{"turn", "player", "observation", "legal_moves"}``, and steps the
game with the answer until the game is done or ``max_turns`` moves were made (truncated). The
episode's payload is its ``Trajectory``: per turn the player, its observation (text) and its
move; at the end each seat's reward, the winners and TextArena's reason.

**Randomness.** TextArena's games draw from Python's process-global ``random`` (a reset calls
``random.seed``, a deal calls ``random.shuffle``). Each session keeps its own ``random`` state
and swaps it into the global generator around every make, reset, observation and step, and the
process's state back after (under one lock: no other session runs in between). So sessions
interleaved on one host, and the host process's own use of ``random``, never disturb one
another: an episode draws exactly what it would draw alone.

**The state codec: the seed and the move log, restored by replay.** A session exports as
``{"seed", "actions", "digest"}``: the reset seed, every move made so far (strings, as the model
answered them) and a sha256 over what the next turn depends on (the session's ``random`` state,
the current player and its pending observation, whether the game is done). A restore makes a
fresh game, resets it with the seed and replays the moves through the same swap, asking for
observations where the original run did (a TextArena observation is consumed when read, and
its wrappers accumulate the history), then checks the digest: a game whose state is not a
function of its seed and moves (randomness outside ``random``, the clock) fails the restore
closed, naming both digests. Why replay rather than a per-game codec: a TextArena game's state
is spread over the game object, its ``State`` and its wrappers (``LLMObservationWrapper``'s
history), none of it declared plain, while the seed and the moves are plain strings and
integers that TextArena itself treats as the whole input of a game. The cost is the game's
moves once per restore, bounded by ``max_turns``; the export is the move list and one digest.

**Supported games** (``supported_games()``): those that run offline and end in a bounded number
of moves, each with a function that lists the current player's legal moves
(``register_game`` adds one). TextArena's word games download NLTK data when their module is
imported, which needs the network; an id that is unknown, unsupported or such a game fails at
start with one line (``EnvironmentSpecError``) naming the supported ids.

The policy is ``policy(observation, legal_moves, rng) -> move``: ``rng`` is a ``random.Random``
seeded by the deployment seed, the row, the slot and the turn (not the attempt), so a
stochastic policy is reproducible, and a move asked again after a restore is the same move.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import anyio
import attrs
import textarena

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
    "GameSpec",
    "LegalMoves",
    "Policy",
    "TextArenaAgent",
    "TextArenaParticipant",
    "TextArenaSession",
    "Trajectory",
    "episode_seed",
    "random_legal_policy",
    "reference_trajectory",
    "register_game",
    "supported_games",
    "textarena_environment",
]

ENV_PARTICIPANT: Final = "env"
LegalMoves = Callable[[Any], list[str]]
"""``legal_moves(env)``: the current player's legal moves in the (wrapped) TextArena ``env``."""
Policy = Callable[[str, Sequence[str], random.Random], str]


def episode_seed(seed: int, row: int, slot: int) -> int:
    """The ``reset`` seed of the episode of (row, slot) under deployment ``seed``."""
    return derive_seed("gymckpt-textarena", seed, row, slot) % (2**31)


def random_legal_policy(observation: str, legal_moves: Sequence[str], rng: random.Random) -> str:
    """A uniformly random legal move."""
    return rng.choice(list(legal_moves))


def _policy_rng(seed: int, row: int, slot: int, turn: int) -> random.Random:
    return random.Random(derive_seed("gymckpt-textarena-policy", seed, row, slot, turn))


# -- the supported games: how many seats, which moves are legal ---------------------------------


@attrs.frozen
class GameSpec:
    """A supported game: its seats (the agent plays them all) and its legal moves."""

    players: int
    legal_moves: LegalMoves


def _tictactoe(env: Any) -> list[str]:
    board = env.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connect_four(env: Any) -> list[str]:
    top = env.state.game_state["board"][0]
    return [f"[col {c}]" for c, cell in enumerate(top) if cell == "."]


def _nim(env: Any) -> list[str]:
    piles = env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


def _kuhn_poker(env: Any) -> list[str]:
    return [f"[{move}]" for move in env.state.game_state["current_legal_action_tree"]]


def _guess_the_number(env: Any) -> list[str]:
    guessed = env.guessed_numbers
    return [f"[{n}]" for n in range(env.min_number, env.max_number + 1) if n not in guessed]


_GAMES: dict[str, GameSpec] = {
    "TicTacToe-v0": GameSpec(2, _tictactoe),
    "ConnectFour-v0": GameSpec(2, _connect_four),
    "Nim-v0": GameSpec(2, _nim),
    "KuhnPoker-v0": GameSpec(2, _kuhn_poker),
    "GuessTheNumber-v0": GameSpec(1, _guess_the_number),
}


def supported_games() -> tuple[str, ...]:
    """The TextArena ids this module can host (built in and registered)."""
    return tuple(_GAMES)


def register_game(env_id: str, players: int, legal_moves: LegalMoves) -> None:
    """Support TextArena ``env_id`` with ``players`` seats and ``legal_moves(env)``. The game
    must be a function of its seed and moves (the restore checks it, see the module)."""
    if not callable(legal_moves):
        raise TypeError("legal_moves is a function of the TextArena env")
    if players < 1:
        raise ValueError(f"a game has at least one player, got {players}")
    _GAMES[env_id] = GameSpec(players, legal_moves)


def _needs_network(env_id: str) -> bool:
    """Whether the id's module downloads NLTK data when imported (read, not imported)."""
    spec = textarena.envs.registration.ENV_REGISTRY[env_id]
    entry = spec.entry_point
    if not isinstance(entry, str):
        return False
    try:
        found = importlib.util.find_spec(entry.split(":")[0])
    except ImportError:
        return False
    if found is None or found.origin is None:
        return False
    with open(found.origin, encoding="utf-8", errors="replace") as f:
        return "nltk" in f.read()


def _game_spec(env_id: str) -> GameSpec:
    supported = ", ".join(_GAMES)
    if env_id not in textarena.envs.registration.ENV_REGISTRY:
        raise EnvironmentSpecError(f"no such TextArena game {env_id!r} (supported: {supported})")
    if env_id in _GAMES:
        return _GAMES[env_id]
    if _needs_network(env_id):
        raise EnvironmentSpecError(
            f"TextArena game {env_id!r} downloads NLTK data when imported, which needs the "
            f"network, so it cannot run here (supported: {supported})"
        )
    raise EnvironmentSpecError(
        f"TextArena game {env_id!r} has no legal-move function, so the demo's policy cannot "
        "play it; register one with gymckpt.gym_adapter.environments.textarena.register_game(id, "
        f"players, legal_moves) (supported: {supported})"
    )


# -- one game with its own random state ---------------------------------------------------------

_RANDOM_LOCK: Final = threading.Lock()


@contextmanager
def _own_random(state: tuple[Any, ...]) -> Iterator[list[tuple[Any, ...]]]:
    """Run the block with ``state`` as the global ``random``'s state; yields a one-item list
    holding the state the block left (read it after the block). The process's state is back
    in place after, whatever the block raised."""
    out = [state]
    with _RANDOM_LOCK:
        saved = random.getstate()
        random.setstate(state)
        try:
            yield out
        finally:
            out[0] = random.getstate()
            random.setstate(saved)


@attrs.define(slots=True, eq=False)
class TextArenaSession:
    """The environment participant's session: one live game, its own ``random`` state, its
    reset seed and the moves made. Invariant: ``player`` and ``observation`` are the pending
    turn's (unread by anyone else) unless ``done``; then ``rewards`` and ``reasons`` are the
    game's outcome (one entry per seat)."""

    env_id: str
    env: Any
    seed: int
    rng: tuple[Any, ...]
    actions: list[str] = attrs.field(factory=list)
    player: int = 0
    observation: str = ""
    done: bool = False
    rewards: list[float] = attrs.field(factory=list)
    reasons: list[str] = attrs.field(factory=list)

    @classmethod
    def start(cls, env_id: str, seed: int) -> TextArenaSession:
        """A fresh game reset with ``seed``, its first turn pending."""
        spec = _game_spec(env_id)
        with _own_random(random.Random(seed).getstate()) as rng:
            env = textarena.make(env_id)
            env.reset(num_players=spec.players, seed=seed)
            player, observation = env.get_observation()
        return cls(env_id, env, seed, rng[0], player=int(player), observation=str(observation))

    def legal_moves(self) -> list[str]:
        return list(_GAMES[self.env_id].legal_moves(self.env))

    def step(self, action: str) -> None:
        """Make the pending player's move ``action``; then the next turn is pending, or the
        game is done."""
        with _own_random(self.rng) as rng:
            done, _ = self.env.step(action)
            if done:
                rewards, info = self.env.close()
            else:
                player, observation = self.env.get_observation()
        self.rng = rng[0]
        self.actions.append(action)
        if done:
            self.done = True
            seats = range(_GAMES[self.env_id].players)
            self.rewards = [float(rewards[p]) for p in seats]
            self.reasons = [str(info[p].get("reason", "")) for p in seats]
            self.observation = ""
        else:
            self.player, self.observation = int(player), str(observation)

    def digest(self) -> str:
        """sha256 of what the next turn depends on (see the module docstring)."""
        parts = (repr(self.rng), self.player, self.observation, self.done, self.rewards)
        return hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).hexdigest()


@attrs.frozen
class TextArenaParticipant:
    """The ``env`` participant: one game per session, exported as its seed and moves and
    restored by replaying them (see the module docstring)."""

    env_id: str
    name: str = ENV_PARTICIPANT
    kind: str = "environment"

    def open(self, info: EpisodeInfo) -> TextArenaSession:
        return TextArenaSession.start(self.env_id, episode_seed(info.seed, info.row, info.slot))

    def export(self, state: TextArenaSession) -> Any:
        return {"seed": state.seed, "actions": list(state.actions), "digest": state.digest()}

    def restore(self, data: Any) -> TextArenaSession:
        session = TextArenaSession.start(self.env_id, int(data["seed"]))
        for action in data["actions"]:
            if session.done:
                raise ValueError(
                    f"TextArena {self.env_id}: the game ended before the last of the "
                    f"{len(data['actions'])} exported moves was replayed"
                )
            session.step(str(action))
        if session.digest() != data["digest"]:
            raise ValueError(
                f"TextArena {self.env_id}: replaying {len(data['actions'])} moves from seed "
                f"{data['seed']} reached state {session.digest()[:16]}…, the export recorded "
                f"{str(data['digest'])[:16]}…; the game is not a function of its seed and "
                "moves (randomness outside Python's random module?)"
            )
        return session


# -- the agent ------------------------------------------------------------------------------------


@attrs.define(slots=True)
class Trajectory:
    """An episode: per turn, the player to move, its observation (text) and the move made
    (``players``, ``observations`` and ``actions`` have one entry per turn); at the end each
    seat's ``rewards``, ``winners`` (the seats TextArena rewarded 1 or more: a win), the game's
    ``reason`` and ``truncated`` (``max_turns`` reached first; no rewards then). Plain data:
    the episode's payload."""

    players: list[int] = attrs.field(factory=list)
    observations: list[str] = attrs.field(factory=list)
    actions: list[str] = attrs.field(factory=list)
    rewards: list[float] = attrs.field(factory=list)
    winners: list[int] = attrs.field(factory=list)
    reason: str = ""
    truncated: bool = False

    def finish(self, rewards: Sequence[float], reasons: Sequence[str]) -> Done:
        """Record the game's outcome; the episode's reward is seat 0's."""
        self.rewards = list(rewards)
        self.winners = [p for p, r in enumerate(self.rewards) if r >= 1.0]
        self.reason = reasons[0] if reasons else ""
        return Done(self.rewards[0], payload=self)

    def cut(self) -> Done:
        self.truncated = True
        return Done(0.0, payload=self)


def _checked_move(answer: Any, where: str) -> str:
    if not isinstance(answer, str):
        raise TypeError(f"{where}: a move is a str, got {type(answer).__name__} {answer!r:.80}")
    try:
        answer.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where}: the move is not valid UTF-8 text ({exc})") from None
    return answer


@attrs.frozen
class TextArenaAgent:
    """The agent: per turn, ask the model for the pending player's move and make it.
    ``pace_s`` waits that long per turn after the answer (a tool's latency, for demos);
    ``max_turns`` truncates a game that has not ended by then."""

    max_turns: int = 200
    pace_s: float = 0.0
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Trajectory:
        return Trajectory()

    def export(self, state: Trajectory) -> Any:
        # copies of the lists: their entries are strings and numbers, never changed in place
        return {
            "players": list(state.players),
            "observations": list(state.observations),
            "actions": list(state.actions),
            "rewards": list(state.rewards),
            "winners": list(state.winners),
            "reason": state.reason,
            "truncated": state.truncated,
        }

    def restore(self, data: Any) -> Trajectory:
        return Trajectory(**data)

    async def step(self, ctx: EpisodeContext, state: Trajectory) -> Done | None:
        session: TextArenaSession = ctx.session(ENV_PARTICIPANT)
        turn = len(state.actions)
        player, observation = session.player, session.observation
        request = {
            "turn": turn,
            "player": player,
            "observation": observation,
            "legal_moves": session.legal_moves(),
        }
        answer = await ctx.model(request)
        move = _checked_move(answer, f"TextArena {session.env_id} turn {turn}: the model's answer")
        if self.pace_s > 0:
            await anyio.sleep(self.pace_s)
        session = ctx.session(ENV_PARTICIPANT)  # still the owner after the wait
        session.step(move)
        state.players.append(player)
        state.observations.append(observation)
        state.actions.append(move)
        if session.done:
            return state.finish(session.rewards, session.reasons)
        if len(state.actions) >= self.max_turns:
            return state.cut()
        return None


def _model(policy: Policy) -> Callable[[str, Any, EpisodeInfo], Any]:
    def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        rng = _policy_rng(info.seed, info.row, info.slot, request["turn"])
        return policy(request["observation"], request["legal_moves"], rng)

    return model


def textarena_environment(
    env_id: str,
    policy: Policy = random_legal_policy,
    *,
    pace_s: float = 0.0,
    max_turns: int = 200,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Environment:
    """An ``Environment`` playing TextArena ``env_id`` (every seat) with ``policy``.

    An id that is not a supported game raises ``EnvironmentSpecError`` in one line naming the
    supported ids (``supported_games``)."""
    _game_spec(env_id)
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    return Environment(
        agent=TextArenaAgent(max_turns=max_turns, pace_s=pace_s),
        participants=(TextArenaParticipant(env_id),),
        model=_model(policy),
        max_payload_bytes=max_payload_bytes,
    )


def reference_trajectory(
    env_id: str,
    seed: int,
    row: int,
    slot: int,
    policy: Policy = random_legal_policy,
    max_turns: int = 200,
) -> Trajectory:
    """The uninterrupted run of episode (row, slot) with plain TextArena (make, reset, then
    observation and step until done, on the global ``random``, the process's state put back
    after): the trajectory a hosted episode must reproduce exactly, crash and restore or not."""
    spec = _game_spec(env_id)
    reset_seed = episode_seed(seed, row, slot)
    traj = Trajectory()
    saved = random.getstate()
    try:
        random.seed(reset_seed)
        env = textarena.make(env_id)
        env.reset(num_players=spec.players, seed=reset_seed)
        while True:
            player, observation = env.get_observation()
            turn = len(traj.actions)
            legal = spec.legal_moves(env)
            move = policy(observation, legal, _policy_rng(seed, row, slot, turn))
            done, _ = env.step(move)
            traj.players.append(int(player))
            traj.observations.append(str(observation))
            traj.actions.append(move)
            if done:
                rewards, info = env.close()
                seats = range(spec.players)
                traj.finish(
                    [float(rewards[p]) for p in seats], [info[p].get("reason", "") for p in seats]
                )
                return traj
            if len(traj.actions) >= max_turns:
                traj.cut()
                return traj
    finally:
        random.setstate(saved)
