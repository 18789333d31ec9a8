"""Incarnations: which life of an instance a call or a stream went to.

An *incarnation* is one life of an instance under its name: the actor, the server process or
the host that serves it until it dies. A remote deployment can replace a dead instance under
the same name, and the replacement is the name's next incarnation (numbered 0, 1, …). Every
call and stream remembers the incarnation it was sent to (``live``); a late failure of an old
incarnation then marks nothing (``mark_dead`` of a stale one is a no-op), and nothing is sent to
an incarnation that was replaced (``serving`` is false for it). Invariant: at most one
incarnation of a name is live, the newest; ``begin_replacement`` makes the name dead *and*
newer at once, so from that moment no call reaches either incarnation until ``installed``.
(An HTTP server also names its incarnation by a random id, ``Gymckpt-Incarnation``: that id
tells two lives apart on the wire; the number here orders them in the client.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import attrs

from gymckpt.runtime import GymInstanceDead

__all__ = ["IncarnationStatistics", "Incarnations"]


@attrs.frozen
class IncarnationStatistics:
    incarnations: tuple[tuple[str, int], ...]
    """Each instance's current incarnation (0: never replaced), in instance order."""
    dead: tuple[str, ...]
    """Instances whose current incarnation is dead, in instance order."""


@final
@attrs.define(eq=False)
class Incarnations:
    """The incarnations of a deployment's instances (its only writer)."""

    _names: tuple[str, ...]
    _current: dict[str, int] = attrs.field(init=False)
    _dead: set[str] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self._current = dict.fromkeys(self._names, 0)

    @classmethod
    def of(cls, names: Iterable[str]) -> Incarnations:
        return cls(tuple(names))

    def _check(self, instance: str) -> None:
        if instance not in self._current:
            raise ValueError(f"unknown instance {instance!r} (instances: {', '.join(self._names)})")

    def live(self, instance: str, op: str) -> int:
        """The incarnation a call ``op`` goes to; ``GymInstanceDead`` if the instance is dead."""
        self._check(instance)
        if instance in self._dead:
            raise GymInstanceDead(instance, op)
        return self._current[instance]

    def current(self, instance: str) -> int:
        self._check(instance)
        return self._current[instance]

    def serving(self, instance: str, incarnation: int) -> bool:
        """Is ``incarnation`` of ``instance`` the live one?"""
        return self._current[instance] == incarnation and instance not in self._dead

    def is_dead(self, instance: str) -> bool:
        self._check(instance)
        return instance in self._dead

    def mark_dead(self, instance: str, incarnation: int) -> None:
        """Incarnation ``incarnation`` of ``instance`` is gone (a replaced one changes nothing)."""
        if self._current[instance] == incarnation:
            self._dead.add(instance)

    def begin_replacement(self, instance: str) -> int:
        """``instance`` is dead from now on, under a new incarnation (returned), until
        ``installed``: a late error of the old incarnation marks nothing new."""
        self._check(instance)
        self._dead.add(instance)
        self._current[instance] += 1
        return self._current[instance]

    def installed(self, instance: str, incarnation: int) -> None:
        """The replacement, ``incarnation``, serves: the instance is live again."""
        if self._current[instance] != incarnation:
            raise RuntimeError(
                f"instance {instance}: replacement of incarnation {incarnation} installed, but "
                f"the current incarnation is {self._current[instance]}"
            )
        self._dead.discard(instance)

    @property
    def dead_count(self) -> int:
        return len(self._dead)

    def statistics(self) -> IncarnationStatistics:
        return IncarnationStatistics(
            tuple((n, self._current[n]) for n in self._names),
            tuple(n for n in self._names if n in self._dead),
        )

    def __repr__(self) -> str:
        return f"<Incarnations instances={len(self._names)} dead={len(self._dead)}>"
