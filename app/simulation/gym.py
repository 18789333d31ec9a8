"""The scenario's Gym: the embedded deployment a scenario's life runs on, the transport
latency it may add (stream ends delivered late), and how its instance generations are counted.

Every life opens a fresh embedded Gym in its own work directory; with hostile acts, the
same calendar workplace doing them. A Gym instance that dies is replaced under the same name;
``generations`` tells the hosts apart (name, how many of that name were replaced before), so
the simulation can count what each generation installed from a restore.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gymckpt.gym_adapter import (
    EmbeddedGym,
    EnvironmentRef,
    FaultPlan,
    GymHost,
    GymStatistics,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import calendar_environment
from gymckpt.testing.hostile import HostileActs, hostile_calendar_environment

from .scenario import Scenario
from .usage_env import UsageCounts, usage_environment

__all__ = ["LateEnds", "generations", "installs", "open_gym"]


@asynccontextmanager
async def open_gym(
    sc: Scenario,
    work_dir: Path,
    faults: tuple[str, ...],
    acts: HostileActs | None,
    usage: tuple[UsageCounts, float] | None = None,
) -> AsyncIterator[EmbeddedGym]:
    """The scenario's embedded Gym: the calendar workplace, or, with hostile acts, the same
    workplace doing them (same instances, agent kinds, seed, config and journal); with
    ``usage`` (where it counts, the scenario's start in trio's clock) and real-usage draws
    that change the environment, used as ``Scenario.usage`` says (``usage_environment``)."""
    wraps = sc.usage.calls is not None or sc.usage.long_turns or sc.usage.outage is not None
    cfg = sc.sim_config()
    if acts is None and (usage is None or not wraps):
        async with EmbeddedGym.host(
            [EnvironmentRef.to(calendar_environment, agent_kind=k, config=cfg) for k in sc.kinds()],
            sc.instances,
            sc.seed,
            work_dir,
            cfg.host_config(),
            faults,
        ) as gym:
            yield gym
        return
    envs = {
        kind: hostile_calendar_environment(kind, cfg, acts)
        if acts is not None
        else calendar_environment(kind, cfg)
        for kind in set(sc.kinds())
    }
    if usage is not None and wraps:
        counts, t0 = usage
        envs = {kind: usage_environment(env, sc.usage, counts, t0) for kind, env in envs.items()}
    kind_of = {f"gym-{i}": kind for i, kind in enumerate(sc.kinds())}

    def make(name: str, *, recover: bool = True) -> GymHost:
        return GymHost(
            name, envs[kind_of[name]], sc.seed, work_dir, cfg.host_config(), recover=recover
        )

    hosts = [make(name, recover=False) for name in kind_of]
    async with EmbeddedGym.serve_hosts(hosts, FaultPlan(faults), make) as gym:
        yield gym


class LateEnd:
    """A reply stream whose end reaches the consumer ``late_s`` after Gym ended it (transport
    latency: on Ray the shielded close of a stream can take seconds)."""

    def __init__(self, inner: ReplyStream, late_s: float) -> None:
        self._inner, self._late_s = inner, late_s

    def __aiter__(self) -> LateEnd:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            await trio.sleep(self._late_s)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class LateEnds:
    """The embedded Gym with every stream's end delivered late (``Scenario.late_end_s``)."""

    def __init__(self, gym: EmbeddedGym, late_s: float) -> None:
        self._gym, self._late_s = gym, late_s

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
        return LateEnd(await self._gym.run(instance, rows), self._late_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gym, name)


def generations(gs: GymStatistics) -> list[tuple[str, int]]:
    """``(instance, generation)`` of every host in ``gs``: the replaced ones in the order they
    were replaced, then the live ones (generation = how many of that name were replaced)."""
    seen: Counter[str] = Counter()
    keys = []
    for s in (*gs.replaced, *gs.instances):
        keys.append((s.instance, seen[s.instance]))
        seen[s.instance] += 1
    return keys


def installs(gs: GymStatistics) -> dict[tuple[str, int], int]:
    """Restored episodes each host generation in ``gs`` installed (``generations``' keys)."""
    return {
        g: s.restored for g, s in zip(generations(gs), (*gs.replaced, *gs.instances), strict=True)
    }
