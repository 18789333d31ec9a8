"""Dispatch throughput on Ray: batched replies against one Ray object per reply.

``python tests/test_ray_throughput.py [ROWS]`` prints rows/s (it starts a local cluster):

* ``stream``: one ``run`` of ROWS rows whose episodes cost nothing, drained by one consumer —
  the transport alone (the embedded Gym in-process is the baseline);
* ``dispatch``: the runtime end to end (``open_rollouts``: gate, ledger, dispatcher in runs of
  64 rows, trainer taking groups), 2 instances, ROWS // 4 prompt groups of 4.

The test runs a short version and checks that batching wins.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from gymckpt.gym_adapter import EmbeddedGym, EnvironmentRef, RunRow
from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig, rollout_id_for

FREE = CalendarConfig(turns=(1, 1), turn_s=(0.0, 0.0), mutation_p=0.0)


def _rows(n: int) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(n)]


def on_embedded(*, config: CalendarConfig, instances: int = 1, **kw: Any) -> Any:
    """The calendar workplace on ``EmbeddedGym.host``; ``kw`` are its."""
    env = calendar_environment(config=config)
    return EmbeddedGym.host(env, instances, config=config.host_config(), **kw)


def on_ray(*, config: CalendarConfig, instances: int = 1, **kw: Any) -> Any:
    """The calendar workplace on ``RayGym.host``; ``kw`` are its."""
    from gymckpt.gym_adapter import RayGym  # Ray only when a test asks for it

    env = EnvironmentRef.to(calendar_environment, config=config)
    return RayGym.host(env, instances, config=config.host_config(), **kw)


async def stream_rate(opener: Any, rows: int, work_dir: Path, **kwargs: Any) -> float:
    """Rows per second through one ``run`` of ``rows`` rows."""
    async with opener(work_dir=work_dir, config=FREE, **kwargs) as gym:
        warm = await gym.run("gym-0", _rows(64))  # actor warmed up, code paths loaded
        async for _ in warm:
            pass
        batch = _rows(rows)
        t0 = time.perf_counter()
        stream = await gym.run("gym-0", [RunRow(r.rollout_id + "-m", r.row, 1, 0) for r in batch])
        got = 0
        async for replies in stream:
            got += len(replies)
        elapsed = time.perf_counter() - t0
        await stream.aclose()
    assert got == rows
    return rows / elapsed


async def dispatch_rate(opener: Any, rows: int, work_dir: Path, **kwargs: Any) -> float:
    """Attempts per second through the whole runtime (no checkpoints)."""
    config = RuntimeConfig(control_timeout_s=5.0, reply_grace_s=1.0, lease_s=60.0)
    async with opener(instances=2, work_dir=work_dir / "gym", config=FREE, **kwargs) as gym:
        async with open_rollouts(
            gym,
            work_dir,
            rows=rows // 4,
            group_size=4,
            config=config,
            max_rows_in_flight=512,
            restore=False,
        ) as ro:
            t0 = time.perf_counter()
            trained = 0
            async for batch in ro.batches(64):
                trained += sum(len(g.results) for g in batch)
            elapsed = time.perf_counter() - t0
    assert trained == rows // 4 * 4
    return trained / elapsed


async def measure(rows: int, work_dir: Path) -> dict[str, float]:
    out = {
        "stream/embedded": await stream_rate(on_embedded, rows, work_dir / "e"),
        "stream/ray-batched": await stream_rate(on_ray, rows, work_dir / "b"),
        "stream/ray-per-row": await stream_rate(on_ray, rows, work_dir / "r", batch_replies=False),
        "dispatch/embedded": await dispatch_rate(on_embedded, rows, work_dir / "de"),
        "dispatch/ray-batched": await dispatch_rate(on_ray, rows, work_dir / "db"),
        "dispatch/ray-per-row": await dispatch_rate(
            on_ray, rows, work_dir / "dr", batch_replies=False
        ),
    }
    return out


@pytest.mark.ray
async def test_batching_beats_one_object_per_row(tmp_path: Path) -> None:
    batched = await stream_rate(on_ray, 3000, tmp_path / "b")
    per_row = await stream_rate(on_ray, 3000, tmp_path / "r", batch_replies=False)
    assert batched > 2 * per_row, (batched, per_row)


if __name__ == "__main__":
    import ray

    from gymckpt.gym_adapter.transports.ray._gym import local_cluster_options

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    ray.init(**local_cluster_options())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rates = trio.run(measure, n, Path(tmp))
    finally:
        ray.shutdown()
    for name, rate in rates.items():
        print(f"{name:24s} {rate:12,.0f} rows/s  ({n} rows)")
