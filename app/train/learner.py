"""What every built-in learner is made of: a torch policy, its Adam optimizer, the learner's
own generator and the count of updates made, and the GRPO update over a batch of groups.

A learner subclasses ``TorchLearner`` and says what is its own: ``build_policy`` (the module,
built from the seed alone), ``environment`` (the Gym environment whose model is the loop's),
``act`` (one decision from one model call's request, its randomness from the given generator
only), ``decisions`` (a rollout's decisions, read back from its payload) and ``log_probs``
(the policy's log probability of decisions, differentiable). The rest is shared: the update
(``update``: advantages per group, every decision of a rollout credited with its rollout's
advantage, ``grpo.clipped_update``), the trainer state (``state``/``load``: the version and the
generator, bit for bit) and the files (``save_files``: weights and optimizer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import torch
from torch import nn

from gymckpt.gym_adapter import Environment, EpisodeInfo
from gymckpt.runtime import CompletedGroup

from .grpo import clipped_update, group_advantages
from .loop import generator_state, mean_return, set_generator_state

__all__ = ["LogProbs", "TorchLearner"]

WEIGHTS_FILE = "policy.pt"
OPTIMIZER_FILE = "optimizer.pt"

LogProbs = Callable[[torch.Tensor], torch.Tensor]
"""``log_probs(index)``: the policy's log probabilities of the decisions ``index``."""


@attrs.define(eq=False, slots=True)
class TorchLearner:
    """The policy (``build_policy(seed)``), its Adam optimizer and the learner's generator
    (minibatch shuffles, seeded ``seed + 1``), with ``version`` updates made. Weights and
    optimizer are the snapshot's files; the version and the generator are ``state``.
    Invariant: the learner is a function of ``seed`` and the batches it was given, in order."""

    learning_rate: ClassVar[float] = 1e-2
    epochs: ClassVar[int] = 2
    minibatches: ClassVar[int] = 4

    seed: int
    policy: nn.Module = attrs.field(init=False)
    optimizer: torch.optim.Optimizer = attrs.field(init=False)
    generator: torch.Generator = attrs.field(init=False)
    version: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        torch.manual_seed(self.seed)
        self.policy = self.build_policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.learning_rate)
        self.generator = torch.Generator().manual_seed(self.seed + 1)

    # -- what a learner is made of -----------------------------------------------------------

    def build_policy(self) -> nn.Module:
        """The untrained policy (torch's global generator was just seeded with ``seed``)."""
        raise NotImplementedError

    def environment(self, model: Callable[[str, Any, EpisodeInfo], Any]) -> Environment:
        raise NotImplementedError

    def act(self, request: Any, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def decisions(self, payload: Any) -> list[Any]:
        """The decisions a rollout made, in order, from its episode payload."""
        raise NotImplementedError

    def log_probs(self, decisions: Sequence[Any]) -> LogProbs:
        """The policy's log probability of ``decisions[i]`` for each ``i`` of an index."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------

    def update(self, batch: Sequence[CompletedGroup]) -> float:
        """One GRPO update on ``batch`` (groups in the order given, results in slot order);
        adds one to ``version``; returns the batch's mean return."""
        decisions: list[Any] = []
        credit: list[float] = []
        advantages = group_advantages([[r.reward for r in g.results] for g in batch])
        for group, group_adv in zip(batch, advantages, strict=True):
            for result, adv in zip(group.results, group_adv, strict=True):
                made = self.decisions(result.payload)
                decisions.extend(made)
                credit.extend([adv] * len(made))
        clipped_update(
            self.log_probs(decisions),
            torch.tensor(credit, dtype=torch.float32),
            self.optimizer,
            self.generator,
            epochs=self.epochs,
            minibatches=self.minibatches,
        )
        self.version += 1
        return mean_return(batch)

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "generator": generator_state(self.generator)}

    def load(self, state: Mapping[str, Any], files: Path) -> None:
        self.version = int(state["version"])
        set_generator_state(self.generator, state["generator"])
        self.policy.load_state_dict(torch.load(files / WEIGHTS_FILE, weights_only=True))
        self.optimizer.load_state_dict(torch.load(files / OPTIMIZER_FILE, weights_only=True))

    def save_files(self, directory: Path) -> None:
        torch.save(self.policy.state_dict(), directory / WEIGHTS_FILE)
        torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)

    def weights(self) -> Mapping[str, torch.Tensor]:
        return self.policy.state_dict()
