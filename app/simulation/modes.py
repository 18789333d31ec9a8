"""The checkpoint mode of a scenario, watched: what each checkpoint took mid-turn, and that an
unaligned checkpoint never parks an episode.

``ModeWatch`` is the scenario's Gym as the runtime sees it (it forwards everything else): each
``prepare`` must carry the scenario's mode (the coordinator passes the configured one), an
unaligned prepare must report nothing parked (``PrepareReply.parked`` is 0) and leave nothing
parked on its instance, and an aligned checkpoint takes episodes mid-turn only past its
alignment timeout: an aligned prepare that returns with episodes still running (not parked)
must have waited ``alignment_timeout_s`` for them, on an environment that takes unaligned cuts
(one that opts out is waited for until the call's deadline), and its commit takes at most
those mid-turn (``CommitReply.mid_turn``). ``at_stage`` checks, at every coordinator hook
point of an unaligned checkpoint, that no live instance holds an episode parked (its inventory's
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
import trio

from gymckpt.gym_adapter import CommitReply, EmbeddedGym, PrepareReply
from gymckpt.runtime import CheckpointMode

__all__ = ["ModeWatch"]


@attrs.define(eq=False, slots=True)
class ModeWatch:
    """``inner`` (the backend the runtime uses) watched for the scenario's ``mode``; ``gym`` is
    the embedded Gym under it (its hosts' inventories); ``violation`` records what it finds.

    Invariants checked: every prepare asks for ``mode``; unaligned, every prepare reply and
    every hook point finds no episode parked on a live instance whose environment takes
    unaligned cuts; aligned, a prepare leaves episodes running only after waiting its
    ``alignment_timeout_s`` on an instance whose environment takes cuts, and a commit takes
    at most those mid-turn."""

    inner: Any
    gym: EmbeddedGym
    mode: CheckpointMode
    violation: Callable[[str], None]
    prepares: int = attrs.field(default=0, init=False)
    commits_mid_turn: int = attrs.field(default=0, init=False)
    """Episodes the instances' commit replies took mid-turn (failed checkpoints included)."""
    _unparked: dict[str, int] = attrs.field(factory=dict, init=False)
    """Per instance: the episodes its last aligned prepare left running (not parked)."""

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        if mode is not self.mode:
            self.violation(
                f"{checkpoint_id}: prepare of {instance} asked for a {mode.value} checkpoint, "
                f"the runtime is configured {self.mode.value}"
            )
        started = trio.current_time()
        reply: PrepareReply = await self.inner.prepare(
            instance, checkpoint_id, deadline_ts, mode, alignment_timeout_s=alignment_timeout_s
        )
        self.prepares += 1
        if mode is CheckpointMode.ALIGNED:
            self._aligned_prepare(
                instance, checkpoint_id, trio.current_time() - started, alignment_timeout_s
            )
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
        unparked = self._unparked.get(instance, 0)
        if self.mode is CheckpointMode.ALIGNED and reply.mid_turn > unparked:
            self.violation(
                f"{checkpoint_id}: aligned commit of {instance} took {reply.mid_turn} episodes "
                f"mid-turn, its prepare left {unparked} running (an aligned checkpoint takes "
                "mid-turn only the episodes that had not parked within the alignment timeout)"
            )
        return reply

    def _aligned_prepare(
        self, instance: str, checkpoint_id: str, waited_s: float, timeout_s: float | None
    ) -> None:
        """After an aligned prepare returned (``waited_s`` after it was asked): the episodes
        it left running are the alignment timeout's, on an environment that takes cuts."""
        sim = self.gym.sim(instance)
        if sim.dead:
            return
        unparked = self._unparked[instance] = len(sim.inventory().running)
        if not unparked:
            return
        if not self._takes_cuts(instance):
            self.violation(
                f"{checkpoint_id}: aligned prepare of {instance} left {unparked} episodes "
                "running on an environment that opts out of unaligned cuts (it must wait)"
            )
        elif timeout_s is None or waited_s < timeout_s - 1e-6:  # clock arithmetic rounds
            self.violation(
                f"{checkpoint_id}: aligned prepare of {instance} left {unparked} episodes "
                f"running after {waited_s:g}s, before its alignment timeout ({timeout_s}s)"
            )

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
