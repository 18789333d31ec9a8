"""The scheduling priority of the Gym instance processes gymckpt starts on the trainer's machine
(the local Ray cluster's workers, ``HttpGym.spawn``'s ``gymckpt serve`` processes).

The trainer's event loop is the run's coordinator: every reply, ack and checkpoint stage goes
through it, so a few milliseconds of it waiting for a core are felt by every episode. On the
trainer's machine the instances compete with it for the cores, and during a checkpoint all of
them export at once: at equal priority the loop waits in the run queue (``gymckpt bench
checkpoint`` reports that wait, ``max_loop_stall_run_queue_ms``: at 50k in flight on Ray with 4
instances on 2 cores, 45 ms of a 46 ms stall). An instance started ``instance_niceness`` steps
below the trainer (relative to the trainer's own niceness, so a trainer the user niced keeps
its lead) yields a core to the loop whenever both want one (at 100k on Ray, 4 instances on 2
shared cores, interleaved runs: the trainer's longest loop stall 30-218 ms at 0, 9-16 ms at
5, 10-24 ms at 10, the commit no slower). The cost: the instances' episodes wait instead when
the trainer is busy, and they yield to any other process of the machine at niceness 0 too;
0 gives them the trainer's priority back.

Only processes gymckpt starts itself are niced: a Ray cluster that is joined (an address), or
that the process was already connected to, keeps its workers' priority, and servers started
elsewhere keep theirs.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["INSTANCE_NICENESS", "MAX_NICENESS", "check_instance_niceness", "lower_this_process"]

INSTANCE_NICENESS: Final = 5
"""Default ``instance_niceness``: how many niceness steps below the trainer the instance
processes gymckpt starts run (module docstring)."""
MAX_NICENESS: Final = 19
"""The largest niceness the OS knows (the lowest priority)."""


def check_instance_niceness(value: object) -> int:
    """``value`` as an ``instance_niceness``: an int from 0 to ``MAX_NICENESS`` (raising a
    priority needs privileges, so a negative one is refused too)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NICENESS:
        raise ValueError(
            f"instance_niceness must be an int from 0 (the trainer's priority) to {MAX_NICENESS} "
            f"(the lowest), got {value!r}"
        )
    return value


def lower_this_process(instance_niceness: int) -> None:
    """Lower the calling process's priority by ``instance_niceness`` steps (0: unchanged). Run
    in a new process before it starts threads: a thread inherits its creator's niceness."""
    if instance_niceness:
        os.nice(instance_niceness)
