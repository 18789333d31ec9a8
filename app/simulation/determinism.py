"""Deterministic task scheduling for the simulation: the one place that touches trio's privates.

trio shuffles each batch of runnable tasks with ``trio._core._run._r``, an unseeded
module-level ``random.Random``. Setting ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING``
(the switch trio's own Hypothesis plugin flips) makes the run loop first sort each batch by task
creation order and then shuffle it with that Random; seeding the Random per scenario then makes
the order independent of the order in which wakeups were issued (iterating a set of objects
hashed by ``id``, for example), so a seed replays exactly.

Neither name is public API. ``deterministic_scheduling`` therefore checks, before it touches
anything, that the installed trio is one the hook was written for (``TRIO_VERSIONS``: read
against ``trio/_core/_run.py`` of those releases) and that both names are there with the types
it expects. Otherwise it **refuses** with ``SchedulingHookUnavailable``, saying which trio it
found and what to do. It does not fall back to trio's ordinary scheduling: every seed would
still run and pass or fail, but its replay command could print a different run, and a
simulation whose failures cannot be replayed is worse than one that says it cannot run.

Inside the ``with`` block the switch is on and the Random seeded; on exit both are put back as
they were, so code run afterwards in the same process schedules as trio alone would.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import trio

__all__ = [
    "TRIO_VERSIONS",
    "SchedulingHookUnavailable",
    "check_scheduling_hook",
    "deterministic_scheduling",
]

TRIO_VERSIONS = ((0, 27), (0, 36))
"""The trio releases the hook was written for: from ``TRIO_VERSIONS[0]`` (included) to
``TRIO_VERSIONS[1]`` (excluded), as (major, minor). Widen it only after reading the new
release's scheduler loop (``batch.sort(key=lambda t: t._counter)`` then ``_r.shuffle(batch)``
under the switch)."""

RUN_MODULE = "trio._core._run"
SWITCH = "_ALLOW_DETERMINISTIC_SCHEDULING"
RANDOM = "_r"


class SchedulingHookUnavailable(RuntimeError):
    """The installed trio is not one the determinism hook was written for, or lacks its names:
    the simulation refuses to run rather than print replay commands that might not replay."""


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _range() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TRIO_VERSIONS
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def check_scheduling_hook(version: str | None = None) -> ModuleType:
    """trio's run module, once the hook is known to fit it; ``version`` defaults to the
    installed ``trio.__version__``. Raises ``SchedulingHookUnavailable`` otherwise."""
    version = trio.__version__ if version is None else version
    release = _release(version)
    if release is None or not TRIO_VERSIONS[0] <= release < TRIO_VERSIONS[1]:
        raise SchedulingHookUnavailable(
            f"trio {version} is installed, the simulation's deterministic scheduling was "
            f"written for trio {_range()}: install a trio in that range, or check "
            f"{RUN_MODULE}'s scheduler loop of trio {version} and widen TRIO_VERSIONS"
        )
    try:
        module = importlib.import_module(RUN_MODULE)
    except ImportError as exc:
        raise SchedulingHookUnavailable(
            f"trio {version} has no {RUN_MODULE} ({exc}): the simulation's deterministic "
            "scheduling cannot be switched on"
        ) from None
    switch = getattr(module, SWITCH, None)
    rng = getattr(module, RANDOM, None)
    if not isinstance(switch, bool) or not isinstance(rng, random.Random):
        raise SchedulingHookUnavailable(
            f"trio {version}'s {RUN_MODULE} has {SWITCH} {type(switch).__name__} and "
            f"{RANDOM} {type(rng).__name__}, the simulation expects a bool and a "
            "random.Random: its deterministic scheduling cannot be switched on"
        )
    return module


@contextmanager
def deterministic_scheduling(seed: int) -> Iterator[None]:
    """Within the block, trio runs started schedule their tasks as a function of ``seed``.

    Checks the hook first (``check_scheduling_hook``): nothing is changed when it refuses.
    """
    module = check_scheduling_hook()
    rng: random.Random = getattr(module, RANDOM)
    was_on: bool = getattr(module, SWITCH)
    state = rng.getstate()
    setattr(module, SWITCH, True)
    rng.seed(seed)
    try:
        yield
    finally:
        setattr(module, SWITCH, was_on)
        rng.setstate(state)
