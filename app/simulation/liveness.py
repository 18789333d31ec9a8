"""Liveness: a run makes progress or ends with its exit code (``Liveness``).

Exactly once is a safety property: a run that hangs forever never violates it. So the
simulation checks liveness too. A life *moves* when a row is trained (the trainer gets
a step), a checkpoint ends (either way), an attempt is resolved (Gym replies with a completed
or failed episode), or the restore is done. Nothing moving for ``bound_s`` virtual seconds is
a violation, ``liveness``, with the seed's replay command like every other: the life is
cut there (``LifeEnd.NO_PROGRESS``) and the next one restores, as after a crash.

The bound is derived from the scenario (``liveness_bound_s``): ``LIVENESS_S`` (far above the
longest gap a healthy seed shows: a hung attempt abandoned at the dispatcher's request
timeout, the lease the simulation waits out after a run) plus what the workload may
legitimately take with nothing moving: the longest drawn long turn and the drawn model-server
outage.

Before this check existed, a run that hung (rows failed for good with nothing left in flight,
issue 31 finding 6) was only cut by the life's total-time cap (``STALL_S``, 5000
virtual seconds); that cap stays, for a run that moves but never ends.

The watch adds no task and no scheduling point: moving pushes the deadline of a cancel scope
(``scope``) the life runs in, so a seed's run is the same run with or without it until
the bound is hit. ``Moving`` is the Gym as the runtime sees it, with every reply batch
counted as a move.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio

from gymckpt.gym_adapter import ReplyStream, RunReply, RunRow

__all__ = ["LIVENESS_S", "Liveness", "Moving", "liveness_bound_s"]

LIVENESS_S = 600.0
"""Virtual seconds with nothing moving that no healthy seed comes near: twice the dispatcher's
request timeout (300 s; an attempt that hangs is abandoned after it, the longest a seed may
legitimately wait: 300.03 s over 500 hostile seeds, 45 s over 1,000 others). The workload's
own waits are added to it (``liveness_bound_s``)."""


def liveness_bound_s(longest_wait_s: float) -> float:
    """The liveness bound of a scenario whose workload may keep everything still for
    ``longest_wait_s`` (``RealUsage.longest_wait_s``)."""
    return LIVENESS_S + longest_wait_s


@attrs.define(eq=False, slots=True)
class Liveness:
    """The liveness watch of one life: ``arm`` once inside the trio run, ``moved`` on
    every move; ``stalled`` once the scope was cut by the bound."""

    bound_s: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    started_at: float = attrs.field(default=0.0, init=False)
    last_at: float = attrs.field(default=0.0, init=False)
    last_move: str = attrs.field(default="the incarnation's start", init=False)
    moves: int = attrs.field(default=0, init=False)
    longest_still_s: float = attrs.field(default=0.0, init=False)
    """The longest stretch of virtual time with nothing moving so far (``still``)."""

    def arm(self) -> None:
        self.started_at = self.last_at = trio.current_time()
        self.scope.deadline = self.last_at + self.bound_s

    def moved(self, what: str) -> None:
        """Something moved (``what``: for the violation's line)."""
        self.moves += 1
        self.still()
        self.last_at = trio.current_time()
        self.last_move = what
        self.scope.deadline = self.last_at + self.bound_s

    def still(self) -> float:
        """How long nothing has moved now; kept in ``longest_still_s`` (call it at the end
        too: the stretch before the life ended counts)."""
        gap = trio.current_time() - self.last_at
        self.longest_still_s = max(self.longest_still_s, gap)
        return gap

    @property
    def stalled(self) -> bool:
        return self.scope.cancelled_caught

    def violation(self) -> str:
        """The violation's line: how long nothing moved, since what."""
        return (
            f"liveness: nothing moved for {self.bound_s:g} virtual s (no row trained, no "
            f"checkpoint, no attempt resolved) since {self.last_move} at "
            f"{self.last_at - self.started_at:.3f}s, and the run did not end"
        )


class MovingStream:
    """A reply stream whose every batch of replies is a move."""

    def __init__(self, inner: ReplyStream, liveness: Liveness) -> None:
        self._inner, self._liveness = inner, liveness

    def __aiter__(self) -> MovingStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        replies = await self._inner.__anext__()
        if replies:
            self._liveness.moved(f"{len(replies)} attempt(s) resolved")
        return replies

    async def aclose(self) -> None:
        await self._inner.aclose()


class Moving:
    """The Gym backend ``inner`` with every reply batch counted as a move of ``liveness``."""

    def __init__(self, inner: Any, liveness: Liveness) -> None:
        self._inner, self._liveness = inner, liveness

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
        return MovingStream(await self._inner.run(instance, rows), self._liveness)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
