"""The toy trainer of the demo and the simulation: a running reward estimate, enough state to
make a restored step observable (its step number and the rows it has trained travel in the
snapshot's trainer state)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import orjson

__all__ = ["ToyTrainer"]


@attrs.frozen
class ToyTrainer:
    """A running reward estimate: enough state to make a restored step observable."""

    step: int = 0
    reward_ema: float = 0.0
    rows_trained: int = 0

    def train(self, rewards: Sequence[float], rows: int) -> ToyTrainer:
        """The trainer one step later, having trained ``rows`` groups with ``rewards``."""
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return ToyTrainer(
            self.step + 1, 0.9 * self.reward_ema + 0.1 * mean, self.rows_trained + rows
        )

    def to_bytes(self) -> bytes:
        return orjson.dumps(attrs.asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> ToyTrainer:
        raw = orjson.loads(data)
        return cls(int(raw["step"]), float(raw["reward_ema"]), int(raw["rows_trained"]))
