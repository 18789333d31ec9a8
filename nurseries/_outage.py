"""OutageClock: how long one piece of infrastructure has been down, against ``outage_budget_s``.

Why it looks like this
----------------------
An outage of infrastructure — a model server restarting for a weight update, a Gym instance
whose disk is full for a moment — is not the rows' fault, and a row must never be given up for
it: the rows wait and are re-sent with backoff, spending no row attempt and no data budget. A
run cannot wait forever either (liveness: it makes progress or ends with its exit code). So
every such wait is measured by one clock per thing that can be down, and the run stops, with
one line naming what is down, once it has been down for longer than ``outage_budget_s``.

An outage *starts* at the first failure after the last success (``down``), and *ends* at the
next success (``up``): the clock is the time since that dependency last worked. What counts as
a failure and a success is the owner's call: for the episodes' infrastructure (the dispatcher)
a failure is an episode failing as infra (``ModelUnavailable`` raised by ``ctx.model``, a Gym
instance that could not admit or run it) and a success any episode that ends otherwise
(completed, or failed as data: the infrastructure answered); for one Gym instance (the
replacer) a failure is a death or a failed ``replace`` before the instance served an episode,
and a success an episode it ran to its end.

The budget is checked at each failure (``down`` raises ``InfraOutage``), and each failure is
followed by a bounded retry (a re-send after ``backoff_s``, a ``replace`` bounded by its
timeout), so a run whose infrastructure stays down stops within one retry of the budget.
"""

from __future__ import annotations

import attrs
import trio

from gymckpt.runtime import InfraOutage, RuntimeConfig

__all__ = ["OutageClock", "OutageStatistics"]


@attrs.frozen
class OutageStatistics:
    """A snapshot of one clock: ``down_s`` is how long the current outage has lasted (None:
    up), ``failures`` the failures in it, ``outages`` how many began, ``last`` its last
    failure."""

    down_s: float | None
    failures: int
    outages: int
    last: str


@attrs.define(eq=False, slots=True)
class OutageClock:
    """The outage of one piece of infrastructure, ``what`` (``"gym instance gym-1"``); see
    the module docstring. Synchronous and O(1): call it from anywhere in the trio run."""

    what: str
    config: RuntimeConfig
    _since: float | None = attrs.field(default=None, init=False)
    _failures: int = attrs.field(default=0, init=False)
    _outages: int = attrs.field(default=0, init=False)
    _last: str = attrs.field(default="", init=False)

    @property
    def is_down(self) -> bool:
        """A failure came after the last success."""
        return self._since is not None

    def up(self) -> None:
        """It worked: the outage, if any, is over."""
        self._since = None
        self._failures = 0

    def down(self, cause: str) -> float:
        """It failed (``cause`` says how): start the outage if it is up, and return the backoff
        before the retry (``backoff_s`` of the failures in this outage, so it grows while the
        outage lasts). Raises ``InfraOutage`` when the outage has lasted longer than
        ``outage_budget_s``."""
        now = trio.current_time()
        if self._since is None:
            self._since = now
            self._outages += 1
        self._failures += 1
        self._last = cause
        down_s = now - self._since
        if down_s > self.config.outage_budget_s:
            raise InfraOutage(self.what, down_s, self.config.outage_budget_s, cause)
        return self.config.backoff_s(self._failures)

    def statistics(self) -> OutageStatistics:
        down_s = None if self._since is None else trio.current_time() - self._since
        return OutageStatistics(down_s, self._failures, self._outages, self._last)

    def __repr__(self) -> str:
        s = self.statistics()
        state = "up" if s.down_s is None else f"down {s.down_s:.1f}s ({s.failures} failures)"
        return f"<OutageClock {self.what}: {state}>"
