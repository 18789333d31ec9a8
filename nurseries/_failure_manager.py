"""CheckpointFailureManager: how many retryable checkpoint failures in a row a run tolerates.

A retryable failure (``gym_unavailable``, ``snapshot_io``, ``trainer_files``: the checkpoint
changed nothing the trainer holds) is counted; a completed checkpoint resets the count. The run
goes on while the count is at most ``max_consecutive_failures``; the failure after that raises
``CheckpointsFailed`` (exit code 4), naming the last failure. An invariant failure is not the
budget's business: it aborts the run at once, whatever the count.
"""

from __future__ import annotations

import logging

import attrs

from gymckpt.runtime import CheckpointsFailed, FailureKind

__all__ = ["CheckpointFailureManager"]

logger = logging.getLogger("gymckpt")


@attrs.define(eq=False, slots=True)
class CheckpointFailureManager:
    """The consecutive-failure budget of one coordinator.

    Invariant: ``consecutive`` never exceeds ``max_consecutive_failures`` once ``failed``
    returned; the failure that would exceed it raises ``CheckpointsFailed`` instead.
    """

    max_consecutive_failures: int = attrs.field(validator=attrs.validators.ge(0))
    _consecutive: int = attrs.field(default=0, init=False)

    @property
    def consecutive(self) -> int:
        """Retryable failures since the last completed checkpoint."""
        return self._consecutive

    def succeeded(self) -> None:
        """A checkpoint completed: the count starts again."""
        self._consecutive = 0

    def count(self) -> int:
        """Count one more retryable failure; the count so far (``check`` enforces the budget)."""
        self._consecutive += 1
        return self._consecutive

    def check(self, kind: FailureKind, detail: str, cause: BaseException) -> None:
        """Raise ``CheckpointsFailed`` (from ``cause``) if the failures counted so far exceed the
        budget; ``kind`` and ``detail`` describe the last one."""
        if self._consecutive <= self.max_consecutive_failures:
            return
        logger.error("checkpoints failed %d times in a row: the run stops", self._consecutive)
        raise CheckpointsFailed(
            f"{self._consecutive} checkpoints failed in a row "
            f"(max_consecutive_failures={self.max_consecutive_failures}); "
            f"last ({kind}): {detail}"
        ) from cause
