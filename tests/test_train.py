"""The built-in learners' parts, in process: the weights digest's definition, GRPO's group
advantages, the deterministic batch order and version gate, and ``gymckpt train``'s refusals
(exit 2 before anything runs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import trio

from gymckpt.app.cli import main
from gymckpt.app.train.grpo import group_advantages
from gymckpt.app.train.loop import (
    EMPTY_JOURNAL,
    VersionGate,
    chain_journal,
    journal_entry,
    ordered_batch,
    sampling_rng,
)
from gymckpt.app.train.weights import weights_sha256
from gymckpt.runtime import CompletedGroup, EpisodeResult


def test_weights_digest_is_the_tensors_raw_bytes_in_key_order() -> None:
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    b = torch.tensor([1.5], dtype=torch.float32)
    expected = hashlib.sha256(a.contiguous().numpy().tobytes() + b.numpy().tobytes())
    assert weights_sha256({"a": a, "b": b}) == expected.hexdigest()
    assert weights_sha256({"b": b, "a": a}) != expected.hexdigest()  # order is part of it
    flipped = b.clone()
    flipped.view(torch.int32)[0] ^= 1  # one bit
    assert weights_sha256({"a": a, "b": flipped}) != expected.hexdigest()


def test_group_advantages_are_relative_to_each_group() -> None:
    adv = group_advantages([[1.0, 3.0], [5.0, 5.0, 5.0]])
    assert adv[0] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert adv[1] == [0.0, 0.0, 0.0]  # a group of equal returns teaches nothing


def _group(position: int) -> CompletedGroup:
    result = EpisodeResult(float(position), 1)
    return CompletedGroup(position, (result,), (f"{position}-0",), position)


def test_a_deterministic_batch_is_in_dataset_order_whatever_completed_first() -> None:
    completed = [_group(5), _group(3), _group(4)]
    assert [g.position for g in ordered_batch(completed)] == [3, 4, 5]


def test_sampling_depends_on_the_calls_place_not_on_the_attempt() -> None:
    # the rollout ID of attempt 1 of slot 3-0 is "3-0-a1"; its session key stays "3-0"
    first = sampling_rng(7, "3-0", 2, 0).random()
    assert sampling_rng(7, "3-0", 2, 0).random() == first
    assert sampling_rng(7, "3-0", 2, 1).random() != first
    assert sampling_rng(7, "3-1", 2, 0).random() != first


async def test_the_gate_holds_a_later_steps_decision_until_the_update() -> None:
    gate = VersionGate()
    passed: list[int] = []

    async def decide(step: int) -> None:
        await gate.reach(step)
        passed.append(step)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(decide, 1)
        nursery.start_soon(decide, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert passed == [0]
        gate.advance(1)
    assert passed == [0, 1]
    with pytest.raises(RuntimeError, match="step 0 asked after update 1"):
        await gate.reach(0)


def test_an_unknown_learner_is_exit_2_listing_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "nosuch", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "cartpole" in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [(["--steps", "0"], "--steps must be >= 1"), (["--seed", "-1"], "--seed must be an int")],
)
def test_bad_numbers_are_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    assert main(["train", "cartpole", str(tmp_path / "w"), *flags]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # refused before anything ran


def test_the_journal_digest_changes_with_any_lost_duplicated_reordered_or_altered_rollout() -> None:
    def digest(*steps: list[CompletedGroup]) -> str:
        out = EMPTY_JOURNAL
        for k, batch in enumerate(steps, start=1):
            out = chain_journal(out, journal_entry(k, batch, k))
        return out

    a, b, c = _group(0), _group(1), _group(2)
    base = digest([a, b], [c])
    assert digest([a, b], [c]) == base  # a function of what was trained alone
    assert digest([a], [c]) != base  # lost
    assert digest([a, b], [c, c]) != base  # duplicated
    assert digest([b, a], [c]) != base  # reordered inside a step
    assert digest([a], [b, c]) != base  # trained in another step
    altered = CompletedGroup(1, (EpisodeResult(1.0 + 2**-40, 1),), ("1-0",), 1)
    assert digest([a, altered], [c]) != base  # a result altered in its last bit
    more_turns = CompletedGroup(1, (EpisodeResult(1.0, 2),), ("1-0",), 1)
    assert digest([a, more_turns], [c]) != base
