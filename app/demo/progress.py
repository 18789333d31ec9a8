"""The demo's progress lines on stderr, and whether its phase processes show theirs."""

from __future__ import annotations

import math
import sys
import time

import attrs

__all__ = ["PROGRESS_ENV", "Progress"]


PROGRESS_ENV = "GYMCKPT_DEMO_PROGRESS"
"""Set by the demo for its phase processes: "1" to show progress lines, "0" not to."""


@attrs.define(eq=False, slots=True)
class Progress:
    """Progress lines on stderr: every one on a terminal; elsewhere (a log file, a CI job) the
    frequent ones (steps, checkpoints) at most every ``every_s``, so a long run still shows it
    is alive without flooding the log."""

    enabled: bool
    tty: bool = attrs.field(factory=lambda: sys.stderr.isatty())
    every_s: float = 10.0
    _last: float = attrs.field(default=-math.inf, init=False)

    def __call__(self, text: str, *, frequent: bool = False) -> None:
        if not self.enabled:
            return
        if frequent and not self.tty:
            now = time.monotonic()
            if now - self._last < self.every_s:
                return
            self._last = now
        print(text, file=sys.stderr, flush=True)
