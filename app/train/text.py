"""``text``: a character-level transformer, trained from scratch, playing TextArena's
GuessTheNumber-v0 by writing its guesses as text, trained with token-level GRPO.

The game: a number from 1 to 20 is drawn; each turn the player writes a guess and is told
"higher" or "lower"; ten valid guesses at most. TextArena's own rules judge the text: its
``ActionFormattingWrapper`` brackets a move written without brackets (``7`` is ``[7]``), and a
move that is not a bracketed number in range, or repeats a guess, is invalid: the first is
answered with a warning and another try, a second in a row ends the game. The reward is 1 for
the number found, else TextArena's ``1 - distance / 19`` of the last valid guess (0 without
one). Each row of the run is one game (reset seeded by the deployment seed and the row, the
same number for every slot of the row), played ``GROUP_SIZE`` times.

The policy (``charlm.CharTransformer``: 2 layers, d_model 64, 4 heads) reads the last
``CONTEXT`` bytes of the observation (TextArena's running transcript: the rules, the guesses,
the hints) and writes its move one character at a time from the digits, up to ``MAX_CHARS``
characters or until it writes the terminator, each drawn with the call's own generator. Its
vocabulary is bytes in and digits out: what it learns is the move's length (where to write
the terminator: ``0``, ``734`` or an empty move are invalid) and which number to write; a
from-scratch policy writing any byte would almost never write a number at all, and would learn
nothing in minutes (an untrained one writes a valid guess about one move in ten). The update
is GRPO over the batch's groups, a move (all its tokens) being one decision: its log
probability is the sum of its tokens' (``charlm.MoveBatch``), credited with its rollout's
advantage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from torch import nn

from gymckpt.gym_adapter import Environment, EpisodeInfo
from gymckpt.gym_adapter.environments.textarena import TextArenaAgent, TextArenaParticipant

from .charlm import CharTransformer, MoveBatch, prompt_tokens, sample_move
from .learner import LogProbs, TorchLearner

__all__ = ["RowGame", "TextLearner"]

ENV_ID = "GuessTheNumber-v0"
ALPHABET = "0123456789"
MAX_CHARS = 3
CONTEXT = 64
GROUP_SIZE = 8
GROUPS_PER_STEP = 8
MAX_TURNS = 40
"""A bound the game never reaches (ten valid guesses, two invalid moves in a row end it)."""


@attrs.frozen
class RowGame(TextArenaParticipant):
    """The game reset from the row's seed alone: a group's rollouts guess the same number, as
    the completions of one prompt answer it."""

    def open(self, info: EpisodeInfo) -> Any:
        return super().open(attrs.evolve(info, slot=0))  # reset seeded by (seed, row, 0)


@attrs.define(eq=False, slots=True)
class TextLearner(TorchLearner):
    """The character transformer; a decision is one move: (the observation it read, the text
    it wrote)."""

    learning_rate: ClassVar[float] = 3e-3
    epochs: ClassVar[int] = 2
    minibatches: ClassVar[int] = 2

    group_size: int = GROUP_SIZE
    groups_per_step: int = GROUPS_PER_STEP

    def build_policy(self) -> nn.Module:
        return CharTransformer(len(ALPHABET) + 1, CONTEXT + MAX_CHARS)

    def environment(self, model: Callable[[str, Any, EpisodeInfo], Any]) -> Environment:
        return Environment(
            agent=TextArenaAgent(max_turns=MAX_TURNS), participants=(RowGame(ENV_ID),), model=model
        )

    def act(self, request: Any, rng: np.random.Generator) -> str:
        prompt = prompt_tokens(request["observation"], CONTEXT)
        return sample_move(self.policy, prompt, ALPHABET, MAX_CHARS, rng)

    def decisions(self, payload: Any) -> list[Any]:
        return list(zip(payload["observations"], payload["actions"], strict=True))

    def log_probs(self, decisions: Sequence[Any]) -> LogProbs:
        moves = MoveBatch.of(
            [prompt_tokens(observation, CONTEXT) for observation, _ in decisions],
            [move for _, move in decisions],
            ALPHABET,
            MAX_CHARS,
        )
        return lambda index: moves.log_probs(self.policy, index)
