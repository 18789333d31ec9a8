"""The toy trainer (``toy_trainer``): a step observable after a restore."""

from __future__ import annotations

from gymckpt.app.toy_trainer import ToyTrainer


def test_a_step_counts_rows_and_moves_the_reward_estimate() -> None:
    t = ToyTrainer().train([1.0, 0.0], 2).train([], 1)
    assert (t.step, t.rows_trained) == (2, 3)
    assert t.reward_ema == 0.9 * (0.1 * 0.5)


def test_its_state_round_trips_through_bytes() -> None:
    t = ToyTrainer().train([0.25], 4)
    assert ToyTrainer.from_bytes(t.to_bytes()) == t
