"""``GymStatistics``: the counts of a whole deployment, whatever its backend.

Its own module so that every backend (embedded, Ray, HTTP) reports the same record without
importing another backend.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..host._host import HostStatistics

__all__ = ["GymStatistics", "dead_statistics"]


@attrs.frozen
class GymStatistics:
    """Counts of the whole deployment: per instance, and the faults that fired."""

    instances: tuple[HostStatistics, ...]
    faults_fired: tuple[tuple[str, int], ...]
    replaced: tuple[HostStatistics, ...] = ()
    """The last counts of every instance that was replaced, in the order they were."""


def dead_statistics(name: str, last: HostStatistics | None) -> HostStatistics:
    """What a dead instance ``name`` reports: the counts last seen (zeros if none), ``dead``
    set, admission closed (a remote backend cannot ask a process that is gone)."""
    if last is not None:
        return attrs.evolve(last, dead=True, admission_open=False, prepared=False)
    zeros: dict[str, Any] = {f.name: 0 for f in attrs.fields(HostStatistics)}
    zeros["counters"] = {}
    zeros.update(instance=name, dead=True, admission_open=False, prepared=False)
    return HostStatistics(**zeros)
