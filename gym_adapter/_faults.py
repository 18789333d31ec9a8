"""Fault injection for the Gym (C3): ``OP:KIND[@N][:ARG]``, one grammar for every backend.

A ``FaultSpec`` names one fault; a ``FaultPlan`` decides, call by call, whether a fault fires.
The plan counts calls per operation across the whole deployment (not per instance), so ``@N``
means "the N-th such call the deployment receives", deterministically. ``retire_restored``
counts as ``retire``: the two share one counter.

Both classes are plain data (attrs, no locks, no callables), so a plan pickles and can be
shipped to a Ray actor; each process then counts its own calls.

Kinds and what a backend does:

- ``hang``: the call never answers (the caller's own bound has to give up, S5);
- ``delay``: the call starts ``ARG`` seconds late (``ARG`` required), then runs normally;
- ``error``: Gym's control plane fails the call (``GymControlError``);
- ``unpicklable``: Gym raises an error that cannot be pickled; the adapter replaces it with
  ``runtime.GymCheckpointUnavailable``;
- ``dead``: the instance dies at this call; its streams end early and every later call raises
  ``GymInstanceDead``;
- ``refuse`` (``run`` only): every row of the run is refused with ``admission_closed``;
- ``drop`` (``run`` only): the reply stream ends early, after about half its rows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Final, final

import anyio
import attrs

from gymckpt.runtime import GymControlError, GymInstanceDead

__all__ = [
    "FAULT_GRAMMAR",
    "FAULT_KINDS",
    "FAULT_OPS",
    "CoordinationError",
    "FaultPlan",
    "FaultSpec",
    "inject_fault",
]

FAULT_OPS: Final = ("prepare", "commit", "resume", "retire", "restore", "run")
FAULT_KINDS: Final = ("hang", "delay", "error", "unpicklable", "dead", "refuse", "drop")
FAULT_GRAMMAR: Final = (
    f"OP:KIND[@N][:ARG] with OP in {{{', '.join(FAULT_OPS)}}}, "
    f"KIND in {{{', '.join(FAULT_KINDS)}}}; refuse and drop need OP run, "
    "delay needs ARG seconds, @N is the N-th call (1-based)"
)
_RUN_ONLY: Final = frozenset({"refuse", "drop"})
# Operations a backend may report to ``FaultPlan.check`` under another op's name.
_OP_ALIASES: Final = {"retire_restored": "retire"}


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"bad fault spec {spec!r}: {why}; expected {FAULT_GRAMMAR}")


@attrs.frozen
class FaultSpec:
    """One fault: ``kind`` on ``op``, at its ``nth`` call (1-based) or every call (None)."""

    op: str
    kind: str
    nth: int | None = None
    arg: float | None = None

    def __attrs_post_init__(self) -> None:
        why = _problem(self.op, self.kind, self.nth, self.arg)
        if why:
            raise _bad(str(self), why)

    @classmethod
    def parse(cls, spec: str) -> FaultSpec:
        """Parse ``OP:KIND[@N][:ARG]``; a bad spec raises ``ValueError`` saying what is wrong."""
        if not isinstance(spec, str):
            raise TypeError(f"fault spec must be a string, got {type(spec).__name__}")
        text = spec.strip()
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise _bad(spec, f"expected 2 or 3 ':'-separated fields, got {len(parts)}")
        op, kind_part = parts[0].strip(), parts[1].strip()
        kind, at, nth_text = kind_part.partition("@")
        kind = kind.strip()
        nth: int | None = None
        if at:
            nth_text = nth_text.strip()
            if not nth_text.isdigit():
                raise _bad(spec, f"@N must be a positive integer, got {nth_text!r}")
            nth = int(nth_text)
        arg: float | None = None
        if len(parts) == 3:
            arg_text = parts[2].strip()
            try:
                arg = float(arg_text)
            except ValueError:
                raise _bad(spec, f"ARG must be a number of seconds, got {arg_text!r}") from None
        why = _problem(op, kind, nth, arg)
        if why:
            raise _bad(spec, why)
        return cls(op=op, kind=kind, nth=nth, arg=arg)

    def matches(self, op: str, count: int) -> bool:
        """Whether this fault fires on the ``count``-th call (1-based) of ``op``."""
        return self.op == _OP_ALIASES.get(op, op) and (self.nth is None or self.nth == count)

    def __str__(self) -> str:
        at = f"@{self.nth}" if self.nth is not None else ""
        arg = f":{self.arg:g}" if self.arg is not None else ""
        return f"{self.op}:{self.kind}{at}{arg}"


def _problem(op: str, kind: str, nth: int | None, arg: float | None) -> str | None:
    """Why ``(op, kind, nth, arg)`` is not a valid fault, or None."""
    if op not in FAULT_OPS:
        return f"unknown OP {op!r}"
    if kind not in FAULT_KINDS:
        return f"unknown KIND {kind!r}"
    if kind in _RUN_ONLY and op != "run":
        return f"KIND {kind} applies to OP run only, not {op}"
    if nth is not None and (isinstance(nth, bool) or not isinstance(nth, int) or nth < 1):
        return f"@N must be a positive integer, got {nth!r}"
    if kind == "delay":
        if arg is None:
            return "KIND delay needs ARG seconds (e.g. prepare:delay:0.5)"
        if not math.isfinite(arg) or arg < 0:
            return f"delay ARG must be a finite number of seconds >= 0, got {arg!r}"
    elif arg is not None:
        return f"KIND {kind} takes no ARG (only delay does)"
    return None


def _to_specs(specs: Iterable[FaultSpec | str]) -> tuple[FaultSpec, ...]:
    if isinstance(specs, (str, FaultSpec)):
        specs = (specs,)
    return tuple(s if isinstance(s, FaultSpec) else FaultSpec.parse(s) for s in specs)


@final
@attrs.define(eq=False, slots=True)
class FaultPlan:
    """Which fault fires on which call. ``check(op)`` counts the call and returns the first spec
    that matches it (in the order given), or None. Deterministic, picklable."""

    specs: tuple[FaultSpec, ...] = attrs.field(converter=_to_specs, factory=tuple)
    _counts: dict[str, int] = attrs.field(factory=dict, init=False)
    _fired: list[tuple[str, int]] = attrs.field(factory=list, init=False)

    def check(self, op: str) -> FaultSpec | None:
        """Count one call of ``op`` (``retire_restored`` counts as ``retire``); the fault to
        apply to it, if any. Unknown ops are counted and never fault."""
        key = _OP_ALIASES.get(op, op)
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        for spec in self.specs:
            if spec.matches(key, count):
                self._fired.append((str(spec), count))
                return spec
        return None

    def calls(self, op: str) -> int:
        """How many calls of ``op`` were counted so far."""
        return self._counts.get(_OP_ALIASES.get(op, op), 0)

    @property
    def fired(self) -> tuple[tuple[str, int], ...]:
        """Every fault that fired, as ``(spec, call number)``, in order."""
        return tuple(self._fired)

    def __repr__(self) -> str:
        specs = ", ".join(str(s) for s in self.specs)
        return f"<FaultPlan [{specs}] calls={sum(self._counts.values())} fired={len(self._fired)}>"


class CoordinationError(RuntimeError):
    """Gym's own coordination error. It carries its live context, so it cannot be pickled:
    a backend must replace it with ``runtime.GymCheckpointUnavailable`` before it crosses."""

    def __init__(self, instance: str, operation: str, message: str) -> None:
        super().__init__(f"{instance} {operation}: {message}")
        self.instance = instance
        self.operation = operation
        self.context = lambda: (instance, operation)  # a closure: pickle refuses it


async def inject_fault(
    spec: FaultSpec, instance: str, op: str, die: Callable[[], None], stuck_loop_s: float = 0.0
) -> None:
    """Carry out the control-plane part of a C3 fault before the call reaches the instance.

    Shared by the embedded backend and the Ray actor, so a spec means the same on both:
    ``hang`` never answers (after blocking the event loop ``stuck_loop_s`` seconds, the Ray
    "stuck loop" case); ``delay`` sleeps ARG; ``error`` raises ``GymControlError``;
    ``unpicklable`` raises Gym's own unpicklable ``CoordinationError``; ``dead`` calls ``die``
    (which kills the instance) and raises ``GymInstanceDead``. ``refuse`` and ``drop`` act on the
    data plane and are handled by the caller.
    """
    if spec.kind == "hang":
        if stuck_loop_s > 0:
            time.sleep(stuck_loop_s)  # noqa: ASYNC251 - the fault: a stuck event loop
        await anyio.sleep_forever()
    elif spec.kind == "delay":
        assert spec.arg is not None
        await anyio.sleep(spec.arg)
    elif spec.kind == "error":
        raise GymControlError(instance, op, f"injected fault {spec}")
    elif spec.kind == "unpicklable":
        raise CoordinationError(instance, op, f"injected fault {spec}")
    elif spec.kind == "dead":
        die()
        raise GymInstanceDead(instance, op)
