"""``cartpole``: an MLP policy on Gymnasium's CartPole-v1, trained with GRPO.

Each row of the run is one CartPole start (reset seeded by the deployment seed and the row,
the same for every slot of the row: the group's rollouts differ only in the policy's draws),
played ``GROUP_SIZE`` times; the return is the episode's length (up to 500). The policy is a
4-64-64-2 tanh MLP whose action the Gym's model samples from its softmax with the decision's
own generator. An update is GRPO over the batch's groups (``grpo``), Adam.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
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
from gymckpt.runtime import CompletedGroup

from .grpo import clipped_update, group_advantages
from .loop import generator_state, mean_return, set_generator_state

__all__ = ["CartPoleLearner", "RowStart"]

ENV_ID = "CartPole-v1"
GROUP_SIZE = 8
GROUPS_PER_STEP = 8
HIDDEN = 64
LEARNING_RATE = 1e-2
EPOCHS = 2
MINIBATCHES = 4
WEIGHTS_FILE = "policy.pt"
OPTIMIZER_FILE = "optimizer.pt"


@attrs.frozen
class RowStart(GymnasiumParticipant):
    """CartPole reset from the row's seed alone: a group's rollouts share their start, as the
    completions of one prompt do."""

    def open(self, info: EpisodeInfo) -> Any:
        return super().open(attrs.evolve(info, slot=0))  # reset seeded by (seed, row, 0)


def _policy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 2)
    )


@attrs.define(eq=False, slots=True)
class CartPoleLearner:
    """The policy, its Adam optimizer and the learner's generator (minibatch shuffles), with
    ``version`` updates made. Weights and optimizer are the snapshot's files; the rest is
    ``state``."""

    seed: int
    policy: nn.Module = attrs.field(init=False)
    optimizer: torch.optim.Optimizer = attrs.field(init=False)
    generator: torch.Generator = attrs.field(init=False)
    version: int = attrs.field(default=0, init=False)
    group_size: int = GROUP_SIZE
    groups_per_step: int = GROUPS_PER_STEP

    def __attrs_post_init__(self) -> None:
        self.policy = _policy(self.seed)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=LEARNING_RATE)
        self.generator = torch.Generator().manual_seed(self.seed + 1)

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

    def update(self, batch: Sequence[CompletedGroup]) -> float:
        obs: list[list[float]] = []
        actions: list[int] = []
        credit: list[float] = []
        advantages = group_advantages([[r.reward for r in g.results] for g in batch])
        for group, group_adv in zip(batch, advantages, strict=True):
            for result, adv in zip(group.results, group_adv, strict=True):
                payload = result.payload
                steps = len(payload["actions"])
                obs.extend(payload["observations"][:steps])
                actions.extend(payload["actions"])
                credit.extend([adv] * steps)
        x = torch.tensor(obs, dtype=torch.float32)
        a = torch.tensor(actions, dtype=torch.int64)

        def log_probs(index: torch.Tensor) -> torch.Tensor:
            logp = torch.log_softmax(self.policy(x[index]), dim=-1)
            return logp.gather(1, a[index].unsqueeze(1)).squeeze(1)

        clipped_update(
            log_probs,
            torch.tensor(credit, dtype=torch.float32),
            self.optimizer,
            self.generator,
            epochs=EPOCHS,
            minibatches=MINIBATCHES,
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
