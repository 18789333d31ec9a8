"""What every Gym deployment (embedded, Ray, HTTP) has beside the contract's verbs.

``Deployment`` is the small base every backend of ours stands on: its instance names, its
``FaultPlan`` (C3: one plan per deployment, so ``@N`` counts calls across it), the log of its
replacements (``Replacement``, one shape whatever the backend), and the two questions tests
and the demo ask of any deployment: ``statistics`` and ``retained_sessions``. How a backend
answers them is its own; that it answers them is written here once. The helpers below do
what every deployment does the same way with its arguments: instance names, and one
environment per instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import attrs

from .._faults import FaultPlan
from ..host._views import RetainedSession
from ._statistics import GymStatistics

__all__ = ["Deployment", "Replacement", "instance_names", "per_instance"]


def instance_names(instances: int) -> tuple[str, ...]:
    """``gym-0`` … ``gym-{instances-1}``; ``ValueError`` unless ``instances >= 1``."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances!r}")
    return tuple(f"gym-{i}" for i in range(instances))


def per_instance(environment: Any, instances: int) -> tuple[Any, ...]:
    """One environment per instance: ``environment`` for all of them, or a list or tuple of
    exactly ``instances`` environments (``ValueError`` naming the counts otherwise)."""
    if isinstance(environment, (list, tuple)):
        if len(environment) != instances:
            raise ValueError(f"got {len(environment)} environments for {instances} instances")
        return tuple(environment)
    return (environment,) * instances


@attrs.frozen
class Replacement:
    """One replacement of a dead instance (``ReplaceableGym.replace``), whatever the backend.

    The old incarnation is fenced first (``fence_s``: killed until it was seen gone, so nothing
    of it can act any more), then the new one starts (``start_s``: until it serves)."""

    instance: str
    fence_s: float
    """Killing the old incarnation until it was seen gone (0 for a server someone else runs)."""
    start_s: float
    """Starting the new incarnation until it serves (placed, started, its journal replayed)."""
    old_location: str = ""
    """Where the dead incarnation served: its Ray node ID, its server's URL ("" in-process)."""
    new_location: str = ""
    """Where the new incarnation serves, in the same terms."""
    old_incarnation: str = ""
    """The dead incarnation's id, where the transport names one (an HTTP server's
    ``Gymckpt-Incarnation``; "" otherwise)."""
    new_incarnation: str = ""
    """The new incarnation's id, in the same terms."""

    @property
    def total_s(self) -> float:
        return self.fence_s + self.start_s


class Deployment(ABC):
    """The part every deployment shares (see the module docstring). A subclass sets
    ``_names`` (instance names, in topology order), ``_plan`` and ``_replacements`` (appended
    to by its ``replace``, oldest first) in its constructor."""

    _names: tuple[str, ...]
    _plan: FaultPlan
    _replacements: list[Replacement]

    @property
    def instances(self) -> tuple[str, ...]:
        """Instance names, in topology order."""
        return self._names

    @property
    def faults(self) -> FaultPlan:
        """The deployment's fault plan (C3): the calls it counted and the faults that fired."""
        return self._plan

    @property
    def replacements(self) -> tuple[Replacement, ...]:
        """Every replacement so far, oldest first."""
        return tuple(self._replacements)

    def replacement_count(self, instance: str) -> int:
        """How often ``instance`` was replaced (``ValueError`` for an unknown instance)."""
        self._known(instance)
        return sum(1 for r in self._replacements if r.instance == instance)

    def _known(self, instance: str) -> None:
        if instance not in self._names:
            raise ValueError(f"unknown instance {instance!r} (instances: {', '.join(self._names)})")

    @abstractmethod
    async def statistics(self) -> GymStatistics:
        """Per-instance counts (dead instances included) and the faults that fired."""

    @abstractmethod
    async def retained_sessions(self, instance: str) -> dict[str, dict[str, RetainedSession]]:
        """``GymHost.retained_sessions()`` of ``instance``: every retained participant's
        session per slot, as plain data (what a snapshot of it now would record)."""
