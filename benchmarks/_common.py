"""Shared pieces of the benchmarks: progress lines, statistics, loop-stall and GC monitors,
machine description.

Timing conventions
------------------
* Wall-clock intervals use ``time.perf_counter_ns`` (vDSO, ~50 ns a call). Everything we time is
  either synchronous (a predicate, a scan, a mutation) or measured between two points on the one
  trio thread, so wall time is the CPU time the loop spent, except when the OS preempts us — the
  machine is shared, which is why we quote medians and p99, never means or minima.
* The **loop stall** is the longest single trio task step (``before_task_step`` →
  ``after_task_step`` of a ``trio.abc.Instrument``): while one step runs, no other task can. A
  garbage-collector pause inside a step is part of that step; the GC monitor says how much of the
  worst stall was the collector.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import trio

__all__ = [
    "GcMonitor",
    "LoadProbe",
    "LoopStallMonitor",
    "Progress",
    "SchedulerBatchMonitor",
    "ThreadSchedstat",
    "describe_error",
    "finite",
    "ints",
    "label",
    "machine_info",
    "median",
    "open_sockets",
    "p99",
    "source_info",
    "stall_breakdown",
    "summarize_ns",
]


class Progress:
    """Progress lines on stderr, shown only when stderr is a terminal (or when forced)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self._t0
            print(f"[bench {elapsed:7.1f}s] {message}", file=sys.stderr, flush=True)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of the exception, or of each leaf of an exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def p99(values: Sequence[float]) -> float:
    """The 99th percentile: ``statistics.quantiles``, inclusive (linear between closest ranks)."""
    if len(values) < 2:
        return float(values[0]) if values else math.nan
    return float(statistics.quantiles(values, n=100, method="inclusive")[98])


def summarize_ns(samples_ns: Sequence[int], unit: str = "us") -> dict[str, float | int]:
    """Median, p99 and max of nanosecond samples, converted to ``unit`` (us or ms)."""
    div = {"us": 1e3, "ms": 1e6}[unit]
    vals = [s / div for s in samples_ns]
    return {
        f"median_{unit}": round(median(vals), 3),
        f"p99_{unit}": round(p99(vals), 3),
        f"max_{unit}": round(max(vals), 3) if vals else math.nan,
        "samples": len(vals),
    }


class ThreadSchedstat:
    """The calling thread's CPU time and run-queue wait, in ns, from the scheduler's own
    accounting (``/proc/thread-self/schedstat``: time on a CPU, time runnable but waiting for
    one). One ``pread`` (~1.5 µs) gives both. Opened lazily by the thread that first reads, and
    only ever read by it; where the file is missing (not Linux, schedstats off) the CPU time
    comes from ``time.thread_time_ns`` and the wait reads 0."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._missing = False

    def read(self) -> tuple[int, int]:
        if self._fd is None and not self._missing:
            try:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                self._missing = True
        if self._fd is None:
            return time.thread_time_ns(), 0
        fields = os.pread(self._fd, 96, 0).split()
        return int(fields[0]), int(fields[1])


class LoopStallMonitor(trio.abc.Instrument):
    """The longest time the trio loop could not start another task, while ``active``.

    The loop's life is cut at every ``before_task_step`` (a task starts running) and every
    ``before_io_wait`` (the loop has nothing to run and waits for I/O or a timer); time inside
    the I/O wait is idle, not stalled. Each interval between two cuts is one task step plus the
    scheduler's own work after it (including a garbage collection the scheduler triggers), so
    the longest interval is the longest time no other task could run.

    Wall time (``perf_counter_ns``, ~50 ns a cut) always. With ``cpu=True`` each interval is
    also measured in this thread's CPU time (``thread_time_ns``, a system call of ~0.5 µs a
    cut, so it is off while latencies are measured): on a shared machine the OS may preempt the
    loop mid-step, which shows in wall time but not in CPU time. Intervals over ``keep_over_ns``
    (1 ms) are kept, with their start and end, so that ``stall_breakdown`` can subtract the
    garbage collector's pauses from them and callers can attribute them to stages.
    """

    def __init__(
        self, *, cpu: bool = False, keep_over_ns: int = 1_000_000, keep_max: int = 10_000
    ) -> None:
        self.active = False
        self.cpu = cpu
        self._sched = ThreadSchedstat() if cpu else None
        self._wait0 = 0
        self.keep_over_ns = keep_over_ns
        self.keep_max = keep_max
        self._wall0 = 0
        self._cpu0 = 0
        self._who = ""
        self._open = False
        self.reset()

    def reset(self) -> None:
        self.max_ns = 0
        self.max_task = ""
        self.max_cpu_ns = 0
        self.max_cpu_task = ""
        self.intervals = 0
        self.over_10ms = 0
        self.max_short_ns = 0
        self.max_short_task = ""
        self.long: list[tuple[int, int, str, int]] = []
        self.long_run_queue: list[int] = []
        """Beside each of ``long`` (``cpu=True``): the loop thread's run-queue wait in it."""
        self.max_run_queue_ns = 0
        """The loop thread's run-queue wait inside the longest interval (``cpu=True``)."""

    def _cut(self, who: str | None) -> None:
        wall = time.perf_counter_ns()
        cpu, wait = self._sched.read() if self._sched is not None else (0, 0)
        if self._open and self.active:
            dt = wall - self._wall0
            self.intervals += 1
            if dt > 10_000_000:
                self.over_10ms += 1
            if dt > self.keep_over_ns:
                if len(self.long) < self.keep_max:
                    self.long.append((self._wall0, wall, self._who, cpu - self._cpu0))
                    self.long_run_queue.append(wait - self._wait0)
            elif dt > self.max_short_ns:
                self.max_short_ns, self.max_short_task = dt, self._who
            if dt > self.max_ns:
                self.max_ns, self.max_task = dt, self._who
                self.max_run_queue_ns = wait - self._wait0
            if self.cpu and cpu - self._cpu0 > self.max_cpu_ns:
                self.max_cpu_ns, self.max_cpu_task = cpu - self._cpu0, self._who
        self._open = who is not None
        self._wall0, self._cpu0, self._wait0, self._who = wall, cpu, wait, who or ""

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._cut(task.name)

    def before_io_wait(self, timeout: float) -> None:
        self._cut(None)

    def after_io_wait(self, timeout: float) -> None:
        self._cut("<scheduler>")

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_loop_stall_ms": round(self.max_ns / 1e6, 3),
            "max_stall_task": self.max_task,
            "loop_intervals": self.intervals,
            "stalls_over_10ms": self.over_10ms,
        }
        if self.cpu:
            out["max_loop_stall_cpu_ms"] = round(self.max_cpu_ns / 1e6, 3)
            out["max_stall_cpu_task"] = self.max_cpu_task
            out["max_loop_stall_run_queue_ms"] = round(self.max_run_queue_ns / 1e6, 3)
        return out


class SchedulerBatchMonitor(trio.abc.Instrument):
    """Trio's scheduler batches while ``active``: from the end of one I/O wait to the start of
    the next, the loop runs every task that was runnable at the batch's start and nothing that
    a timer or I/O would wake (a sleeper due inside a batch wakes after it). Each batch in wall
    time and in the loop thread's CPU time (``thread_time_ns``): a batch long in wall time but
    short in CPU was the loop waiting for the GIL or the OS, not working.

    Invariant: ``count`` batches were closed while active; ``longest`` is the one of most wall
    time, with its CPU time and its number of task steps."""

    def __init__(self) -> None:
        self.active = False
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.longest = (0, 0, 0)  # wall ns, cpu ns, task steps
        self.max_cpu_ns = 0
        self.walls: list[int] = []
        self._open = False
        self._w0 = self._c0 = self._steps = 0

    def after_io_wait(self, timeout: float) -> None:
        self._open = True
        self._w0, self._c0, self._steps = time.perf_counter_ns(), time.thread_time_ns(), 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1

    def before_io_wait(self, timeout: float) -> None:
        if not (self._open and self.active):
            self._open = False
            return
        self._open = False
        wall = time.perf_counter_ns() - self._w0
        cpu = time.thread_time_ns() - self._c0
        self.count += 1
        if len(self.walls) < 2_000_000:
            self.walls.append(wall)
        if wall > self.longest[0]:
            self.longest = (wall, cpu, self._steps)
        self.max_cpu_ns = max(self.max_cpu_ns, cpu)

    def report(self) -> dict[str, Any]:
        walls = sorted(self.walls)
        p99_ns = walls[min(len(walls) - 1, int(0.99 * len(walls)))] if walls else 0
        return {
            "scheduler_batches": self.count,
            "scheduler_batch_p99_ms": round(p99_ns / 1e6, 3),
            "scheduler_batch_max_ms": round(self.longest[0] / 1e6, 3),
            "scheduler_batch_max_cpu_ms": round(self.longest[1] / 1e6, 3),
            "scheduler_batch_max_steps": self.longest[2],
            "scheduler_batch_max_of_cpu_ms": round(self.max_cpu_ns / 1e6, 3),
        }


class GcMonitor:
    """Cyclic-GC collections and pauses while ``active`` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.active = False
        self._t0 = 0
        self.reset()

    def reset(self) -> None:
        self.collections = [0, 0, 0]
        self.max_pause_ns = 0
        self.max_pause_gen = -1
        self.pauses: list[tuple[int, int, int]] = []

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
            return
        if not self.active:
            return
        t1 = time.perf_counter_ns()
        dt = t1 - self._t0
        gen = int(info.get("generation", 0))
        self.collections[gen] += 1
        if dt > 200_000 and len(self.pauses) < 10_000:
            self.pauses.append((self._t0, t1, gen))
        if dt > self.max_pause_ns:
            self.max_pause_ns = dt
            self.max_pause_gen = gen

    def __enter__(self) -> GcMonitor:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self) -> dict[str, Any]:
        return {
            "gc_collections_by_generation": list(self.collections),
            "max_gc_pause_ms": round(self.max_pause_ns / 1e6, 3),
            "max_gc_pause_generation": self.max_pause_gen,
        }


def stall_breakdown(stall: LoopStallMonitor, gcm: GcMonitor) -> dict[str, Any]:
    """The longest loop stall once the garbage collector's pauses inside it are subtracted, in
    wall time and (with ``cpu=True``) in the loop thread's CPU time."""
    worst, worst_who = stall.max_short_ns, stall.max_short_task  # intervals under 1 ms
    worst_cpu = min(stall.max_short_ns, stall.max_cpu_ns) if stall.cpu else 0
    for start, end, who, cpu in stall.long:
        gc_ns = sum(max(0, min(end, g1) - max(start, g0)) for g0, g1, _ in gcm.pauses)
        if end - start - gc_ns > worst:
            worst, worst_who = end - start - gc_ns, who
        worst_cpu = max(worst_cpu, cpu - gc_ns)
    out: dict[str, Any] = {
        "max_loop_stall_excluding_gc_ms": round(worst / 1e6, 3),
        "max_stall_excluding_gc_task": worst_who,
    }
    if stall.cpu:
        out["max_loop_stall_cpu_excluding_gc_ms"] = round(worst_cpu / 1e6, 3)
    return out


class LoadProbe:
    """How busy the rest of the machine was during a measurement (it is shared).

    From ``/proc/stat`` and this process's CPU times: the share of all CPUs' time that *other*
    processes used, the hypervisor's steal share, and the 1-minute load average at the end.
    """

    def __init__(self) -> None:
        self._t0 = self._read()

    @staticmethod
    def _read() -> tuple[list[int], float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        t = os.times()
        return fields, t.user + t.system

    def report(self) -> dict[str, Any]:
        t1 = self._read()
        load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
        if self._t0 is None or t1 is None:
            return {"loadavg_1m": load}
        (a, ours0), (b, ours1) = self._t0, t1
        d = [y - x for x, y in zip(a, b, strict=False)]
        total = sum(d[:8]) or 1
        idle = d[3] + d[4]  # idle + iowait
        steal = d[7] if len(d) > 7 else 0
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        ours = (ours1 - ours0) * hz
        busy_others = max(0.0, total - idle - steal - ours)
        return {
            "loadavg_1m": load,
            "other_processes_cpu_pct": round(100 * busy_others / total, 1),
            "steal_pct": round(100 * steal / total, 1),
        }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_info() -> dict[str, Any]:
    """Which code was measured: the git commit (short and full) and the files of the tree
    with uncommitted changes (untracked ones included), except the benchmark results the run
    itself writes (read-only git calls). ``clean`` is None outside a git checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        full = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--untracked-files=normal",
                "--",
                ".",
                ":(exclude)docs/benchmarks/results",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "commit_full": None, "uncommitted_changes": None, "clean": None}
    changes = sorted(line[3:] for line in dirty.splitlines() if line.strip())
    return {
        "commit": full.strip()[:7],
        "commit_full": full.strip(),
        "uncommitted_changes": changes,
        "clean": not changes,
    }


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    try:
        import psutil

        mem_gib: float | None = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover - psutil is in the bench extra
        mem_gib = None
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "trio": trio.__version__,
        "platform": platform.platform(),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def open_sockets() -> int | None:
    """How many of this process's file descriptors are sockets (``/proc/self/fd`` links to
    ``socket:[...]``); None where there is no ``/proc``. A descriptor closed while it is read
    is skipped. Call it off the measured windows: it reads one link per descriptor."""
    fds = "/proc/self/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return None
    count = 0
    for name in names:
        try:
            count += os.readlink(f"{fds}/{name}").startswith("socket:")
        except OSError:
            continue
    return count


def ints(text: str) -> tuple[int, ...]:
    """Parse ``"2000,20000,200k,1M"`` into integers (k and M suffixes allowed)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        mult = 1
        if part.endswith("k"):
            mult, part = 1000, part[:-1]
        elif part.endswith("m"):
            mult, part = 1_000_000, part[:-1]
        value = int(float(part) * mult)
        if value <= 0:
            raise ValueError(f"sizes must be positive, got {value}")
        out.append(value)
    if not out:
        raise ValueError("no sizes given")
    return tuple(out)


def label(n: int) -> str:
    """2000 → '2k', 200000 → '200k', 1000000 → '1m' (for JSON keys)."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (JSON has none) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
