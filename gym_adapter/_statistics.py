"""``GymStatistics``: the counts of a whole deployment, whatever its backend.

Its own module so that every backend (embedded, Ray, a transport still to come) reports the same
record without importing another backend.
"""

from __future__ import annotations

import attrs

from ._host import HostStatistics

__all__ = ["GymStatistics"]


@attrs.frozen
class GymStatistics:
    """Counts of the whole deployment: per instance, and the faults that fired."""

    instances: tuple[HostStatistics, ...]
    faults_fired: tuple[tuple[str, int], ...]
    replaced: tuple[HostStatistics, ...] = ()
    """The last counts of every instance that was replaced, in the order they were."""
