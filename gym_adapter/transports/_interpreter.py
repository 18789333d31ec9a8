"""The interpreter of a process that hosts a Gym instance (a Ray actor, a ``gymckpt serve``
process): how soon its event loop gets the GIL back from a worker thread.

An instance's loop steps its episodes while its commit exports records in a worker thread
(``host/_records.offload``). Every time the loop releases the GIL (to wait for I/O or a timer)
and wants it back, it waits for the thread to hand it over, which CPython forces only after the
*switch interval* (``sys.getswitchinterval()``, 5 ms by default); a loop that releases it a few
times per batch then runs a batch every 10-20 ms at best, and its episodes' turns overrun. At
``SWITCH_INTERVAL_S`` the thread hands it over ten times sooner (one host of 12.5k episodes of
the heavy workplace in one process: the loop's 1 ms heartbeat during the commit late by
7-8 ms at p99 against 23-80 ms at the default, the commit itself no slower).

Only a process that is an instance's own sets it (``GymActor``, ``gymckpt serve``): the
embedded Gym shares the trainer's process, whose interpreter is the user's.
"""

from __future__ import annotations

import sys
from typing import Final

__all__ = ["SWITCH_INTERVAL_S", "instance_switch_interval"]

SWITCH_INTERVAL_S: Final = 0.0005
"""The switch interval of a process that hosts a Gym instance (module docstring)."""


def instance_switch_interval() -> None:
    """Set this process's switch interval to ``SWITCH_INTERVAL_S`` unless it is already that
    short or shorter (a user's own choice is kept)."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
