"""The checkpoint mode of a scenario, watched: what each checkpoint took mid-turn, and that an
unaligned checkpoint never parks an episode.

``ModeWatch`` is the scenario's Gym as the runtime sees it (it forwards everything else): each
``prepare`` must carry the scenario's mode (the coordinator passes the configured one), an
unaligned prepare must report nothing parked (``PrepareReply.parked`` is 0) and leave nothing
parked on its instance, and an aligned commit takes no episode mid-turn
(``CommitReply.mid_turn`` is 0). ``at_stage`` checks, at every coordinator hook point of an
unaligned checkpoint, that no live instance holds an episode parked (its inventory's
``parked`` is empty): the episodes keep running through the whole checkpoint. An environment
that opts out of unaligned checkpoints (``Environment(unaligned=False)``) parks as aligned
does and is not held to it.

What the watch sees comes from the backend's public replies and the embedded hosts' own
inventories (``GymHost.inventory``, synchronous: no scheduling point is added, so a seed's run
is the same run with or without the watch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from gymckpt.gym_adapter import CommitReply, EmbeddedGym, PrepareReply
from gymckpt.runtime import CheckpointMode

__all__ = ["ModeWatch"]


@attrs.define(eq=False, slots=True)
class ModeWatch:
    """``inner`` (the backend the runtime uses) watched for the scenario's ``mode``; ``gym`` is
    the embedded Gym under it (its hosts' inventories); ``violation`` records what it finds.

    Invariants checked: every prepare asks for ``mode``; unaligned, every prepare reply and
    every hook point finds no episode parked on a live instance whose environment takes
    unaligned cuts; aligned, no commit reports an episode mid-turn."""

    inner: Any
    gym: EmbeddedGym
    mode: CheckpointMode
    violation: Callable[[str], None]
    prepares: int = attrs.field(default=0, init=False)
    commits_mid_turn: int = attrs.field(default=0, init=False)
    """Episodes the instances' commit replies took mid-turn (failed checkpoints included)."""

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
    ) -> PrepareReply:
        if mode is not self.mode:
            self.violation(
                f"{checkpoint_id}: prepare of {instance} asked for a {mode.value} checkpoint, "
                f"the runtime is configured {self.mode.value}"
            )
        reply: PrepareReply = await self.inner.prepare(instance, checkpoint_id, deadline_ts, mode)
        self.prepares += 1
        if mode is CheckpointMode.UNALIGNED and self._takes_cuts(instance):
            if reply.parked:
                self.violation(
                    f"{checkpoint_id}: unaligned prepare of {instance} parked {reply.parked} "
                    "episodes (an unaligned checkpoint parks none)"
                )
            self._nothing_parked(instance, f"{checkpoint_id} after its prepare")
        return reply

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        reply: CommitReply = await self.inner.commit(
            instance, checkpoint_id, state_root, deadline_ts
        )
        self.commits_mid_turn += reply.mid_turn
        if self.mode is CheckpointMode.ALIGNED and reply.mid_turn:
            self.violation(
                f"{checkpoint_id}: aligned commit of {instance} took {reply.mid_turn} episodes "
                "mid-turn (an aligned checkpoint takes every episode parked at a boundary)"
            )
        return reply

    def at_stage(self, checkpoint_id: str, point: str) -> None:
        """The coordinator's hook point ``point``: unaligned, nothing is parked anywhere."""
        if self.mode is not CheckpointMode.UNALIGNED:
            return
        for name in self.gym.instances:
            if self._takes_cuts(name):
                self._nothing_parked(name, f"{checkpoint_id} at {point}")

    def _takes_cuts(self, instance: str) -> bool:
        sim = self.gym.sim(instance)
        return not sim.dead and bool(sim.environment.unaligned)

    def _nothing_parked(self, instance: str, where: str) -> None:
        sim = self.gym.sim(instance)
        if sim.dead:
            return
        parked = sim.inventory().parked
        if parked:
            self.violation(
                f"{where}: unaligned checkpoint left {len(parked)} episodes parked on "
                f"{instance} ({', '.join(parked[:3])})"
            )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
