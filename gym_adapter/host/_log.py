"""What a user's environment did wrong, logged where the user sees it, without flooding the log.

Every failure of user code on a Gym host (``step`` raising, a bad ``Done``, a refused value,
``open`` or ``export`` raising) is a WARNING under the ``gymckpt.gym`` logger naming the
episode (rollout ID, row, slot, attempt, instance), with the user's traceback when there is
one. Per instance the first ``burst`` are logged; after that one every ``every_s`` seconds of
the host's clock, saying how many were left out since the last one, so an environment failing
every episode costs a line per interval, not a line per episode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import attrs

from ._episode import EpisodeInfo

__all__ = ["BURST", "EVERY_S", "LOGGER", "FailureLog", "episode_label"]

LOGGER: Final = logging.getLogger("gymckpt.gym")
BURST: Final = 10
EVERY_S: Final = 30.0


def episode_label(info: EpisodeInfo) -> str:
    """``episode 3-1 (row 3 slot 1 attempt 0) on gym-0``."""
    return (
        f"episode {info.rollout_id} (row {info.row} slot {info.slot} attempt {info.attempt}) "
        f"on {info.instance}"
    )


@attrs.define(eq=False, slots=True)
class FailureLog:
    """The rate-limited failure log of one host instance. ``clock`` is the host's
    (``anyio.current_time``, virtual under a mock clock); ``warn`` is called on the event loop
    only (the clock is the loop's)."""

    clock: Callable[[], float]
    burst: int = BURST
    every_s: float = EVERY_S
    logged: int = 0
    suppressed: int = 0
    """Failures left out of the log since the last line."""
    total: int = 0
    _next_at: float = attrs.field(default=float("-inf"), init=False)

    def warn(self, what: str, exc: BaseException | None = None) -> None:
        """Log ``what`` (one line naming the episode and the failure), with ``exc``'s
        traceback, unless the limit says to count it only."""
        self.total += 1
        if self.logged >= self.burst:
            now = self.clock()
            if now < self._next_at:
                self.suppressed += 1
                return
            self._next_at = now + self.every_s
        elif self.logged + 1 == self.burst:
            self._next_at = self.clock() + self.every_s
        self.logged += 1
        note = ""
        if self.suppressed:
            note = f" ({self.suppressed} more failures not logged since the last line)"
            self.suppressed = 0
        elif self.logged == self.burst:
            note = (
                f" (further failures on this instance: one line every {self.every_s:g}s, "
                "with a count of those left out)"
            )
        LOGGER.warning("%s%s", what, note, exc_info=exc)
