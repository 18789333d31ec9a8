"""Dispatch throughput through the gate and the ledger (DESIGN S1, §5), without Gym.

With a ledger already holding N attempts in flight (200k; 1M with ``--million``), one dispatcher
task pushes ``--rows`` attempts (default 65 536, one step of a large run) through the runtime's
data-plane path, in batches of B attempts (one ``/run`` call each; B = 1, 64, 512):

1. reserve rows as needed (``await barrier.mutate(ledger.reserve_row)``);
2. ``async with gate.admit() as gate_id:`` then, in ONE mutation, ``ledger.mark_dispatched(batch,
   instance, gate_id)`` and the submission (a no-op here: no Gym yet), exactly as S1 requires;
3. one completion mutation per attempt (``ledger.complete``, one streamed reply each);
4. hand finished groups to the trainer (``take_ready``).

Reported: end-to-end rows/s (a *row* is one attempt = one ``/run`` row), and rows/s of the
admit+dispatch part and of the completion part alone (time spent in each, summed). One task on
one core, so this is the runtime's CPU ceiling per trainer, not Gym's.
"""

from __future__ import annotations

import functools
import gc
import time
from collections import deque
from typing import Any

import attrs
import trio

from gymckpt.runtime import DispatchGate, RecoveryLedger

from ._common import Progress, label
from ._fixture import RESULT, InFlightFixture

__all__ = ["DispatchConfig", "run_dispatch"]

perf_ns = time.perf_counter_ns


@attrs.define
class DispatchConfig:
    in_flight: tuple[int, ...] = (200_000,)
    batch_sizes: tuple[int, ...] = (1, 64, 512)
    rows: int = 65_536
    group_size: int = 8
    instances: int = 16
    seed: int = 2
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> DispatchConfig:
        return cls(in_flight=(2_000,), rows=2_048, quick=True)


def _submit_noop(rollout_ids: list[str], instance: str) -> None:
    """Stands in for the ``/run`` submission (phase 2 measures the embedded Gym)."""


def _reserve(ledger: RecoveryLedger, rows: int, out: list[str]) -> None:
    for _ in range(rows):
        out.extend(a.rollout_id for a in ledger.reserve_row(ledger.next_row))


def _dispatch(ledger: RecoveryLedger, ids: list[str], instance: str, gate_id: int) -> None:
    ledger.mark_dispatched(ids, instance, gate_id)
    _submit_noop(ids, instance)


async def _pipeline(fx: InFlightFixture, batch: int, rows: int) -> dict[str, Any]:
    ledger = fx.ledger
    barrier = ledger.barrier
    gate = DispatchGate()
    reserved: deque[str] = deque()
    names = fx.instances
    admit_ns = complete_ns = 0
    done = batches = 0
    mutations0 = barrier.statistics().mutations
    t_start = perf_ns()
    while done < rows:
        size = min(batch, rows - done)
        if len(reserved) < size:
            new: list[str] = []
            need = -(-(size - len(reserved)) // ledger.group_size)
            await barrier.mutate(functools.partial(_reserve, ledger, need, new), touched=new)
            reserved.extend(new)
        ids = [reserved.popleft() for _ in range(size)]
        instance = names[batches % len(names)]
        t0 = perf_ns()
        async with gate.admit() as gate_id:
            await barrier.mutate(
                functools.partial(_dispatch, ledger, ids, instance, gate_id), touched=ids
            )
        t1 = perf_ns()
        for rid in ids:
            await barrier.mutate(
                functools.partial(ledger.complete, rid, gate_id, RESULT), touched=(rid,)
            )
        t2 = perf_ns()
        if ledger.ready_groups:
            await barrier.mutate(functools.partial(ledger.take_ready, 1 << 30))
        admit_ns += t1 - t0
        complete_ns += t2 - t1
        done += size
        batches += 1
    total_ns = perf_ns() - t_start
    return {
        "batch": batch,
        "rows": done,
        "batches": batches,
        "seconds": round(total_ns / 1e9, 3),
        "rows_per_s": round(done / (total_ns / 1e9)),
        "admit_dispatch_rows_per_s": round(done / (admit_ns / 1e9)),
        "completion_rows_per_s": round(done / (complete_ns / 1e9)),
        "us_per_row": round(total_ns / done / 1e3, 3),
        "mutations": barrier.statistics().mutations - mutations0,
    }


def run_dispatch(cfg: DispatchConfig, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"rows_per_config": cfg.rows, "batch_sizes": list(cfg.batch_sizes)}
    results: list[dict[str, Any]] = []
    for n in cfg.in_flight:
        progress(f"dispatch N={n:,}: building ledger")
        fx = InFlightFixture.build(
            n, group_size=cfg.group_size, instances=cfg.instances, seed=cfg.seed,
            progress=progress,
        )
        gc.collect()
        for batch in cfg.batch_sizes:
            r = trio.run(_pipeline, fx, batch, cfg.rows)
            results.append({"in_flight": n, **r})
            out[f"rows_per_s_batch{batch}_{label(n)}"] = r["rows_per_s"]
            progress(f"dispatch N={n:,} batch {batch}: {r['rows_per_s']:,} rows/s "
                     f"({r['us_per_row']:.1f} us/row)")
        del fx
        gc.collect()
    out["results"] = results
    out["config"] = attrs.asdict(cfg)
    return out
