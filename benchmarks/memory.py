"""Ledger memory per attempt, at 200k and 1M attempts, in a realistic mix of states.

Each measurement runs in a fresh Python subprocess (``python -m gymckpt.benchmarks.memory --worker N
MODE``) so that memory freed by earlier work cannot be reused and hide the cost. Two modes, both
reported, because they answer different questions:

* ``tracemalloc``: bytes the Python allocator holds for the ledger after it is built (current
  traced memory after minus before, after ``gc.collect()``): objects, strings, dicts, sets.
  Exact and repeatable; excludes allocator slack.
* ``rss``: growth of the process's resident set (psutil) over the same build, without tracing.
  What the operating system actually charges, including pymalloc arenas and dict over-allocation.

Also, in the ``rss`` worker: the cost of one full collection (``gc.collect()``, median of 7)
before the ledger is built and with it held, and the number of objects the collector tracks in
both states: what a generation-2 collection pauses the event loop for because of the ledger.
Both include the process's own baseline (the modules gymckpt, trio, attrs and cattrs import:
~35k tracked objects). So a third figure isolates the ledger: everything that exists before
the build is frozen (``gc.collect(); gc.freeze()``), the ledger is built, and one full
collection then walks only what the build left behind (``gc_full_ms_ledger_only``, with
``gc_tracked_objects_added`` the objects it walks); the process is unfrozen before the
with-ledger figure is taken. The ledger-only figure is also what a trainer process pays:
``open_rollouts`` freezes what lives at its start (``runtime.freeze_startup_objects``), so the
summary's target row reports it, with the unfrozen figure beside it.

The mix (``benchmarks._fixture.build_mixed_ledger``): 15 % of rows reserved; of the dispatched
slots, 25 % completed with a result, 2 % failed and re-sent, 1 % refused, 1 % abandoned (in the
retire queue), the rest DISPATCHED.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from typing import Any

from ._common import Progress, label

__all__ = ["METHOD", "run_memory", "worker"]

METHOD = (
    "fresh subprocess per measurement; tracemalloc = Python-allocator bytes held by the ledger "
    "after build (gc.collect before and after); rss = psutil resident-set growth over the same "
    "build without tracing; realistic mix of states (see build_mixed_ledger)"
)


def _full_collection_ms(runs: int = 7) -> tuple[float, float]:
    """Medians of ``runs`` full collections: wall time and this thread's CPU time (ms). On a
    shared machine the wall time includes preemption; the CPU time does not."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        gc.collect()
        cpu.append(time.thread_time_ns() - c0)
        wall.append(time.perf_counter_ns() - t0)
    return round(sorted(wall)[runs // 2] / 1e6, 3), round(sorted(cpu)[runs // 2] / 1e6, 3)


def worker(attempts: int, mode: str) -> dict[str, Any]:
    """Build one mixed ledger in this process and measure it (``mode``: tracemalloc or rss)."""
    import psutil

    from ._fixture import build_mixed_ledger

    gc.collect()
    gc_before = _full_collection_ms() if mode == "rss" else (None, None)
    tracked_before = len(gc.get_objects())
    proc = psutil.Process()
    if mode == "rss":
        gc.freeze()  # only what the build leaves is walked by the ledger-only collection
    if mode == "tracemalloc":
        import tracemalloc

        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    elif mode == "rss":
        before = proc.memory_info().rss
    else:
        raise ValueError(f"unknown mode {mode!r}")
    t0 = time.perf_counter()
    ledger = build_mixed_ledger(attempts)
    build_s = time.perf_counter() - t0
    gc.collect()
    if mode == "tracemalloc":
        import tracemalloc

        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    else:
        after = proc.memory_info().rss
    stats = ledger.statistics()
    extra: dict[str, Any] = {}
    if mode == "rss":
        ledger_only = _full_collection_ms()
        added = len(gc.get_objects())  # the frozen (permanent) generation is not listed
        gc.unfreeze()
        with_ledger = _full_collection_ms()
        extra = {
            "gc_full_ms_without_ledger": gc_before[0],
            "gc_full_ms_with_ledger": with_ledger[0],
            "gc_full_ms_ledger_only": ledger_only[0],
            "gc_full_cpu_ms_without_ledger": gc_before[1],
            "gc_full_cpu_ms_with_ledger": with_ledger[1],
            "gc_full_cpu_ms_ledger_only": ledger_only[1],
            "gc_tracked_objects_added": added,
            "gc_tracked_objects_without_ledger": tracked_before,
            "gc_tracked_objects_with_ledger": len(gc.get_objects()),
        }
    return {
        "mode": mode,
        "attempts": stats.attempts,
        "by_state": stats.by_state,
        "retire_queue": stats.retire_queue,
        "bytes": after - before,
        "bytes_per_attempt": round((after - before) / stats.attempts, 1),
        "build_s": round(build_s, 2),
        "build_attempts_per_s": round(stats.attempts / build_s),
        **extra,
    }


def _spawn(attempts: int, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gymckpt.benchmarks.memory", "--worker", str(attempts), mode]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"memory worker {attempts} {mode} failed:\n{done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_memory(sizes: tuple[int, ...], progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": list(sizes), "method": METHOD}
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for mode in ("tracemalloc", "rss"):
            progress(f"memory N={n:,}: {mode} (fresh subprocess)")
            r = _spawn(n, mode)
            rows.append({"target_attempts": n, **r})
            out[f"{mode}_bytes_per_attempt_{label(n)}"] = r["bytes_per_attempt"]
            progress(f"memory N={n:,}: {mode} {r['bytes_per_attempt']:.0f} B/attempt")
            if mode == "rss":
                out[f"gc_full_ms_{label(n)}"] = r["gc_full_ms_with_ledger"]
                out[f"gc_full_ms_empty_{label(n)}"] = r["gc_full_ms_without_ledger"]
                out[f"gc_full_ms_ledger_only_{label(n)}"] = r["gc_full_ms_ledger_only"]
    out["results"] = rows
    return out


if __name__ == "__main__":
    from gymckpt.nurseries import ExitCode

    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(worker(int(sys.argv[2]), sys.argv[3])))
        sys.exit(0)
    print(
        "usage: python -m gymckpt.benchmarks.memory --worker ATTEMPTS tracemalloc|rss",
        file=sys.stderr,
    )
    sys.exit(ExitCode.BAD_INPUT)
