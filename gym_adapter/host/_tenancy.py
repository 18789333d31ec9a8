"""Tenancy: which trainer an instance serves, and what a trainer of a newer term may take over.

An instance serves one *lineage* at a time (``runtime.TrainerTerm``: a training run, stable for
its work directory across restarts) and, of it, one *term* (one trainer process). The holder is
the term the instance serves now:

- ``attach(caller)`` (a trainer opening its rollouts): no holder, or an older term of the
  caller's lineage → the caller holds the instance from now on, and the host **fences**
  whatever is there (``ControlPlane.fence``: every episode ended without a reply, unclaimed
  restored episodes dropped, every session freed as a retire frees it, an open checkpoint
  aborted and admission reopened, every reply stream ended), so nothing the older term started
  replies, mutates or commits afterwards. The holder attaching again changes nothing. Another
  lineage, or an older term of the holder's, is refused (``GymInUse``).
- every other call carries its caller's term: the holder's passes; with no holder (a fresh
  server, or the replacement of a dead instance, which continues the journal of the one it
  replaces) the caller is adopted as the holder, fencing nothing; anything else is refused
  (``GymInUse``) before it acts. A call that carries no term (a tool, a test) is not checked.
- ``release(caller)``: the holder's run is done (its dataset trained); the holder stays, but a
  trainer of another lineage may now ``attach``, taking the instance over as a newer term
  would (fencing what is left there). Until then the server serves that one run.

``Tenancy`` is the only writer of the holder; it decides, the host acts.
"""

from __future__ import annotations

from typing import final

import attrs

from gymckpt.runtime import GymInUse, TrainerTerm

__all__ = ["Tenancy"]


@final
@attrs.define(eq=False, slots=True)
class Tenancy:
    """The holder of instance ``instance`` (module docstring). Invariant: ``holder``'s term
    never goes back for its lineage, and ``holder`` changes lineage only through ``attach``
    after the holder released the instance (or by a first caller, when there is none)."""

    instance: str
    holder: TrainerTerm | None = attrs.field(default=None, init=False)
    released: bool = attrs.field(default=False, init=False)
    """The holder's run is done: another lineage may attach."""
    takeovers: int = attrs.field(default=0, init=False)
    """``attach`` calls that took the instance over (each fenced what was there)."""

    def attach(self, caller: TrainerTerm) -> bool:
        """``caller`` takes the instance; True when the host must fence what is there first
        (every attach but the holder's own). ``GymInUse`` if it may not."""
        holder = self.holder
        if holder is not None:
            if holder.lineage != caller.lineage:
                if not self.released:
                    raise self._another(holder, caller, "attach")
            elif caller.term < holder.term:
                raise self._superseded(holder, caller, "attach")
            elif caller.term == holder.term:
                return False
        self.holder = caller
        self.released = False
        self.takeovers += 1
        return True

    def release(self, caller: TrainerTerm) -> bool:
        """The holder ``caller`` is done with the instance (its run finished): True; any other
        caller changes nothing (False)."""
        if self.holder is None or self.holder != caller:
            return False
        self.released = True
        return True

    def check(self, caller: TrainerTerm | None, op: str) -> None:
        """Let ``caller``'s ``op`` act, or raise ``GymInUse`` (nothing acted)."""
        if caller is None:
            return
        holder = self.holder
        if holder is None:
            self.holder = caller  # a fresh instance: it serves whoever reaches it first
            return
        if holder.lineage != caller.lineage:
            raise self._another(holder, caller, op)
        if caller.term < holder.term:
            raise self._superseded(holder, caller, op)
        if caller.term > holder.term:
            raise GymInUse(
                self.instance,
                op,
                f"{caller.describe()} has not attached here (the instance serves term "
                f"{holder.term}): a trainer attaches to every instance before anything else",
            )

    def _another(self, holder: TrainerTerm, caller: TrainerTerm, op: str) -> GymInUse:
        return GymInUse(
            self.instance,
            op,
            f"the instance serves another training run, {holder.describe()}; this trainer is "
            f"{caller.describe()}. A Gym server serves one run at a time, until that run "
            "finishes: resume that run from its own work directory, or stop it and restart "
            "this server (gymckpt serve), or give this run servers of its own",
        )

    def _superseded(self, holder: TrainerTerm, caller: TrainerTerm, op: str) -> GymInUse:
        return GymInUse(
            self.instance,
            op,
            f"{caller.describe()} was fenced: a newer trainer of the same run (term "
            f"{holder.term}) took the instance over; this trainer process must stop",
        )

    def __repr__(self) -> str:
        held = "none" if self.holder is None else self.holder.header()
        return f"<Tenancy {self.instance} holder={held} takeovers={self.takeovers}>"
