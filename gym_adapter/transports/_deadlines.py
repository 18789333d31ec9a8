"""Deadlines across a process boundary: the time left travels, never an absolute time.

A control call's ``deadline_ts`` is absolute on the caller's clock (``trio.current_time()``),
which means nothing in another process. The caller sends the time left and the wall-clock time
of sending (``WireDeadline.send``); the receiver re-anchors it on its own clock
(``WireDeadline.local``), counting the time the call spent in between (queues, a stuck loop,
the network) as spent. Clocks that disagree the other way (the receiver's wall clock behind the
sender's) count as no time spent; across hosts the result is as good as their clock sync.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["WireDeadline"]


@attrs.frozen
class WireDeadline:
    """A deadline as it crosses: ``remaining_s`` left when the caller sent the call at
    ``sent_wall`` (``time.time()`` on the caller's host). ``remaining_s`` may be negative or
    zero (the deadline passed before sending: the receiver fails the call as timed out)."""

    remaining_s: float = attrs.field(validator=lambda _s, _a, v: _finite(v, "remaining_s"))
    sent_wall: float = attrs.field(validator=lambda _s, _a, v: _finite(v, "sent_wall"))

    @classmethod
    def send(cls, deadline_ts: float, now: float, wall: float) -> WireDeadline:
        """``deadline_ts`` on the caller's clock, which reads ``now``; ``wall`` is
        ``time.time()`` at the same moment."""
        return cls(deadline_ts - now, wall)

    def local(self, now: float, wall: float) -> float:
        """The same deadline on the receiver's clock, which reads ``now`` while its wall clock
        reads ``wall``: what is left, less the time since sending (never negative time)."""
        spent = max(0.0, wall - self.sent_wall)
        return now + self.remaining_s - spent


def _finite(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
