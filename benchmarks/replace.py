"""What replacing a dead Gym instance costs on Ray: from its death to the replacement serving.

    python -m gymckpt.benchmarks.replace [--reps N] [--json]

On a multi-node cluster on this machine (``gymckpt.testing.ray_nodes``: a head and three worker
nodes, GCS health checks every 0.5 s, a node dead after 3 missed), ``--reps`` times each:

* **actor death**: the ``dead`` fault ends an instance's process during a ``prepare``;
* **node loss**: every process of the node hosting an instance is killed with SIGKILL (a new
  worker node joins after each, so every repetition starts from three).

Each repetition opens a fresh ``RayGym`` of 3 instances and measures, from the death:

* ``detect_s``: until the instance's calls fail with ``GymInstanceDead`` (an actor death is
  seen at once; a lost node only once Ray's health checks declare it dead — until then its
  actors are *unavailable*);
* ``fence_s``: ``replace`` killing the old actor until Ray confirms it gone;
* ``start_s``: the new actor placed, constructed and serving (a new worker process);
* ``serving_s``: the death until the replacement's first reply to a ``run`` (the figure quoted).

Medians (and the slowest) over the repetitions. The machine is shared (2 cores): every
actor start is a Python process competing with the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from statistics import median
from tempfile import TemporaryDirectory
from typing import Any

import trio

from gymckpt.gym_adapter import EnvironmentRef, GymInstanceDead, RunRow
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.runtime import GymUnavailable, rollout_id_for

__all__ = ["main", "measure"]

SIM = CalendarConfig(turns=(1, 1), turn_s=(0.01, 0.02), mutation_p=0.0, lease_s=10.0)
DETECT_TIMEOUT_S = 60.0


async def _seen_dead(gym: Any, instance: str) -> None:
    with trio.fail_after(DETECT_TIMEOUT_S):
        while True:
            try:
                await gym.prepare(instance, "probe", trio.current_time() + 5)
            except GymInstanceDead:
                return
            except GymUnavailable:
                pass
            else:
                raise RuntimeError(f"{instance} answered after its death")
            await trio.sleep(0.02)


async def _serving(gym: Any, instance: str) -> None:
    stream = await gym.run(instance, [RunRow(rollout_id_for(10_000, 0, 0), 10_000, 0, 0)])
    async for batch in stream:
        if batch:
            break
    await stream.aclose()


async def _once(nodes: Any, work_dir: Path, kind: str) -> dict[str, float]:
    faults = ["prepare:dead@1"] if kind == "actor_death" else []
    from gymckpt.gym_adapter import RayGym

    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=SIM),
        instances=3,
        work_dir=work_dir,
        config=SIM.host_config(),
        faults=faults,
    ) as gym:
        victim = "gym-0"
        t0 = trio.current_time()
        if kind == "actor_death":
            with suppress(GymInstanceDead):  # the fault ends its process during this call
                await gym.prepare(victim, "c", trio.current_time() + 10)
        else:
            nodes.remove(gym.placement[victim])
        await _seen_dead(gym, victim)
        t1 = trio.current_time()
        await gym.replace(victim, trio.current_time() + 60)
        await _serving(gym, victim)
        t2 = trio.current_time()
        record = gym.replacements[-1]
    if kind == "node_loss":
        nodes.add()
    return {
        "detect_s": t1 - t0,
        "fence_s": record.fence_s,
        "start_s": record.start_s,
        "serving_s": t2 - t0,
    }


def measure(reps: int) -> dict[str, Any]:
    """Both kinds of death, ``reps`` times each, on a fresh multi-node cluster."""
    from gymckpt.testing.ray_nodes import HEALTH_CHECKS, WORKER_NODES, NodeCluster

    out: dict[str, Any] = {
        "reps": reps,
        "worker_nodes": WORKER_NODES,
        "health_checks": HEALTH_CHECKS,
    }
    t0 = time.monotonic()
    with NodeCluster.running() as nodes, TemporaryDirectory(prefix="gymckpt-replace-") as tmp:
        out["cluster_start_s"] = round(time.monotonic() - t0, 3)
        for kind in ("actor_death", "node_loss"):
            runs = [trio.run(_once, nodes, Path(tmp) / f"{kind}-{i}", kind) for i in range(reps)]
            out[kind] = {
                fig: {
                    "median": round(median(r[fig] for r in runs), 3),
                    "max": round(max(r[fig] for r in runs), 3),
                }
                for fig in runs[0]
            }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gymckpt.benchmarks.replace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    result = measure(args.reps)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for kind in ("actor_death", "node_loss"):
            figs = ", ".join(
                f"{k} {v['median']:.3f}s (max {v['max']:.3f}s)" for k, v in result[kind].items()
            )
            print(f"{kind:12s} {figs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
