"""Crash control of one life: where it is abandoned, and what Gym does between two
checkpoint stages.

A crash abandons the whole runtime and its embedded Gym: ``scope`` is the life's cancel
scope, cancelled ``Crash.at_s`` virtual seconds after ``arm`` or at a coordinator hook point of
one of its checkpoints. At the hook points, the scenario's races strike too (every life
but the last): Gym ends one open reply stream (``Scenario.stage_drops``), or one live instance
dies (``Scenario.stage_deaths``) and is replaced. Checkpoints are counted per life, in
the order their hook points are first reached (their ids go on across lives).

Which instance is struck, and where in its streams, is drawn from the scenario's own
``random.Random``, in the order the hook points are reached: deterministic under the
simulation's scheduling.
"""

from __future__ import annotations

import random

import attrs
import trio

from gymckpt.gym_adapter import EmbeddedGym

from .scenario import Crash, Scenario

__all__ = ["CrashControl"]


@attrs.define(eq=False, slots=True)
class CrashControl:
    """The crash and the stage races of one life; ``gym`` is set once it is open."""

    scenario: Scenario
    rng: random.Random
    crash: Crash | None
    races: bool
    """Whether the scenario's stage drops and deaths strike (every life but the last)."""
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    gym: EmbeddedGym | None = attrs.field(default=None, init=False)
    checkpoint_ids: list[str] = attrs.field(factory=list, init=False)
    """This life's checkpoints, in the order their first hook point was reached."""

    def arm(self) -> None:
        """Start the crash's clock (a crash ``at_s`` after now), if it has one."""
        if self.crash is not None and self.crash.at_s is not None:
            self.scope.deadline = trio.current_time() + self.crash.at_s

    def on_stage(self, checkpoint_id: str, point: str) -> None:
        """The coordinator's hook (``Coordinator.on_stage``)."""
        if checkpoint_id not in self.checkpoint_ids:
            self.checkpoint_ids.append(checkpoint_id)
        n = len(self.checkpoint_ids)
        sc = self.scenario
        if self.races and (n, point) in sc.stage_drops and self.gym is not None:
            live = self._live(self.gym)
            if live:  # a stream ends between two checkpoint stages
                self.gym.sim(live[self.rng.randrange(len(live))]).drop_stream(self.rng.randrange)
        if self.races and (n, point) in sc.stage_deaths and self.gym is not None:
            live = self._live(self.gym)
            if live:  # an instance dies between two checkpoint stages
                self.gym.sim(live[self.rng.randrange(len(live))]).kill()
        if self.crash is not None and self.crash.checkpoint == n and point == self.crash.point:
            self.scope.cancel()

    def kill(self, instance: str) -> None:
        """Kill ``instance`` of the open Gym (a journal fault that stops the instance)."""
        if self.gym is not None:
            self.gym.sim(instance).kill()

    @staticmethod
    def _live(gym: EmbeddedGym) -> list[str]:
        return [name for name in gym.instances if not gym.sim(name).dead]
