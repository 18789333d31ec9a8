"""The text learner's parts, in process: the log probability the update trains is the one the
sampler drew from (every written token, the terminator included, read at the position that
predicted it), the moves it reads back are its own, and a row's rollouts play the same game."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gymckpt.app.train.charlm import (
    MoveBatch,
    prompt_tokens,
    sample_move,
    written_tokens,
)
from gymckpt.app.train.text import ALPHABET, CONTEXT, ENV_ID, MAX_CHARS, RowGame, TextLearner
from gymckpt.gym_adapter import EpisodeInfo

OBSERVATION = (
    "[GAME] You are playing Guess The Number.\n[Player] [12]\n[GAME] The target number is lower."
)


def _stepwise_log_prob(learner: TextLearner, observation: str, move: str) -> float:
    """The sampler's view: one forward pass per token drawn, on what was written before it:
    each character, then the terminator unless the move is ``MAX_CHARS`` long."""
    tokens = prompt_tokens(observation, CONTEXT)
    drawn = [ALPHABET.index(c) for c in move]
    if len(move) < MAX_CHARS:
        drawn.append(len(ALPHABET))  # the terminator
    total = 0.0
    with torch.inference_mode():
        for written in drawn:
            logits = learner.policy(torch.tensor([tokens]))[0, -1]
            total += float(torch.log_softmax(logits.double(), dim=-1)[written])
            if written < len(ALPHABET):
                tokens.append(ord(ALPHABET[written]))
    return total


def test_a_moves_log_probability_is_the_sum_over_every_token_the_sampler_drew() -> None:
    learner = TextLearner(0)
    moves = ["", "7", "12", "123"]  # the terminator alone, after 1 and 2 characters, none at 3
    observations = [OBSERVATION, OBSERVATION[-40:], "x" * (CONTEXT + 50), OBSERVATION]
    batch = learner.log_probs(list(zip(observations, moves, strict=True)))
    got = batch(torch.arange(len(moves)))
    assert got.requires_grad  # the update differentiates it
    for i, (observation, move) in enumerate(zip(observations, moves, strict=True)):
        assert float(got[i].detach()) == pytest.approx(
            _stepwise_log_prob(learner, observation, move), abs=1e-4
        ), move


def test_the_sampler_writes_from_its_alphabet_and_draws_only_from_its_generator() -> None:
    learner = TextLearner(0)
    prompt = prompt_tokens(OBSERVATION, CONTEXT)
    moves = [
        sample_move(learner.policy, prompt, ALPHABET, MAX_CHARS, np.random.default_rng(s))
        for s in range(20)
    ]
    again = [
        sample_move(learner.policy, prompt, ALPHABET, MAX_CHARS, np.random.default_rng(s))
        for s in range(20)
    ]
    assert moves == again
    assert all(len(m) <= MAX_CHARS and set(m) <= set(ALPHABET) for m in moves)
    assert len(set(moves)) > 1  # an untrained policy writes many things


def test_a_prompt_is_the_observations_tail_at_fixed_positions() -> None:
    short = prompt_tokens("ab", 4)
    assert len(short) == 5 and short[-2:] == [ord("a"), ord("b")]
    assert prompt_tokens("0123456789", 4)[1:] == list(b"6789")


def test_a_move_the_policy_could_not_write_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'1a' was not written by this policy"):
        written_tokens("1a", ALPHABET, MAX_CHARS)
    with pytest.raises(ValueError, match="at most 3 characters"):
        MoveBatch.of([[0]], ["1234"], ALPHABET, MAX_CHARS)


def test_a_rows_rollouts_guess_the_same_number() -> None:
    game = RowGame(ENV_ID)
    numbers = {
        slot: game.open(EpisodeInfo("", 3, slot, 0, 7, "")).env.game_number for slot in range(8)
    }
    assert len(set(numbers.values())) == 1
    other_rows = {game.open(EpisodeInfo("", row, 0, 0, 7, "")).env.game_number for row in range(12)}
    assert len(other_rows) > 1
