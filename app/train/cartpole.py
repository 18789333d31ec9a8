"""``cartpole``: an MLP policy on Gymnasium's CartPole-v1, trained with GRPO.

Each row of the run is one CartPole start (reset seeded by the deployment seed and the row,
the same for every slot of the row: the group's rollouts differ only in the policy's draws),
played ``GROUP_SIZE`` times; the return is the episode's length (up to 500). The policy is a
4-64-64-2 tanh MLP whose action the Gym's model samples from its softmax with the decision's
own generator. An update is GRPO over the batch's groups (``grpo``), Adam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn

from gymckpt.gym_adapter import Environment, EpisodeInfo
from gymckpt.gym_adapter.environments.gymnasium import (
    GymnasiumAgent,
    GymnasiumParticipant,
    gymnasium_environment,
)

from .learner import LogProbs, TorchLearner

__all__ = ["CartPoleLearner", "RowStart"]

ENV_ID = "CartPole-v1"
GROUP_SIZE = 8
GROUPS_PER_STEP = 8
HIDDEN = 64


@attrs.frozen
class RowStart(GymnasiumParticipant):
    """CartPole reset from the row's seed alone: a group's rollouts share their start, as the
    completions of one prompt do."""

    def open(self, info: EpisodeInfo) -> Any:
        return super().open(attrs.evolve(info, slot=0))  # reset seeded by (seed, row, 0)


@attrs.define(eq=False, slots=True)
class CartPoleLearner(TorchLearner):
    """The 4-64-64-2 tanh MLP; a decision is one (observation, action) of a rollout."""

    group_size: int = GROUP_SIZE
    groups_per_step: int = GROUPS_PER_STEP

    def build_policy(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(4, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, 2),
        )

    def environment(self, model: Callable[[str, Any, EpisodeInfo], Any]) -> Environment:
        codec = gymnasium_environment(ENV_ID).participants[0].codec  # the built-in one
        return Environment(
            agent=GymnasiumAgent(), participants=(RowStart(ENV_ID, codec),), model=model
        )

    def act(self, request: Any, rng: np.random.Generator) -> int:
        with torch.inference_mode():
            logits = self.policy(torch.tensor(request, dtype=torch.float32))
            probs = torch.softmax(logits.double(), dim=-1).numpy()
        return int(min(np.searchsorted(np.cumsum(probs), rng.random(), side="right"), 1))

    def decisions(self, payload: Any) -> list[Any]:
        steps = len(payload["actions"])
        return list(zip(payload["observations"][:steps], payload["actions"], strict=True))

    def log_probs(self, decisions: Sequence[Any]) -> LogProbs:
        x = torch.tensor([obs for obs, _ in decisions], dtype=torch.float32)
        a = torch.tensor([action for _, action in decisions], dtype=torch.int64)

        def log_probs(index: torch.Tensor) -> torch.Tensor:
            logp = torch.log_softmax(self.policy(x[index]), dim=-1)
            return logp.gather(1, a[index].unsqueeze(1)).squeeze(1)

        return log_probs
