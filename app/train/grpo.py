"""GRPO: group-relative advantages and the clipped policy-gradient update.

Each prompt group (a row of the dataset, ``group_size`` rollouts of it: the groups gymckpt
forms) is its own baseline: a rollout's advantage is its return minus the group's mean,
divided by the group's standard deviation (population; a group whose returns are all equal
teaches nothing and gets zeros). Every decision of a rollout (an action, a token) is credited
with its rollout's advantage. The update is PPO's clipped objective over every decision of the
batch, ``epochs`` passes in ``minibatches`` shuffled by the learner's own generator (whose
state travels in the trainer state, so a restored run shuffles as an uninterrupted one does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

__all__ = ["clipped_update", "group_advantages"]

ADVANTAGE_EPS = 1e-6


def group_advantages(returns: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per group (one sequence of returns each, in slot order), each rollout's normalised
    advantage ``(r - mean) / (std + 1e-6)``; all zeros for a group of equal returns."""
    out: list[list[float]] = []
    for group in returns:
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / len(group))
        if std == 0.0:
            out.append([0.0] * len(group))
        else:
            out.append([(r - mean) / (std + ADVANTAGE_EPS) for r in group])
    return out


def clipped_update(
    log_probs: Callable[[torch.Tensor], torch.Tensor],
    advantages: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    *,
    epochs: int,
    minibatches: int,
    clip: float = 0.2,
) -> float:
    """Train on ``len(advantages)`` decisions: ``log_probs(index)`` is the policy's log
    probability of the decisions ``index`` (a 1-D index tensor) under its current weights,
    differentiable. The behaviour log probabilities are taken once, before the first pass (the
    batch is on-policy in deterministic mode: one version produced all of it). Returns the last
    minibatch's loss."""
    n = int(advantages.shape[0])
    with torch.no_grad():
        old = log_probs(torch.arange(n))
    loss = torch.zeros(())
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for index in order.chunk(minibatches):
            ratio = torch.exp(log_probs(index) - old[index])
            adv = advantages[index]
            loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss.detach())
