"""Checkpoint end to end on the embedded Gym, in three modes, and dispatch throughput through it.

Checkpoint at N in flight (default 200k): unaligned, aligned_timeout, aligned
---------------------------------------------------------------
The trainer facade ``nurseries.open_rollouts`` runs on ``gym_adapter.EmbeddedGym`` (K = 4
instances) with ``max_rows_in_flight = N / group_size``, so the dispatcher fills Gym with N
episodes of the heavy-tailed workplace (``benchmarks._heavy``: 40 to 60 turns, each turn's
length lognormal with sigma 2, capped at 21 times its median, so its p99 is 21 times the
median; the mean is ``max(20, N / 200)`` s, 1,000 s at 200k, so the turns that end in real time
stay well within what the embedded Gym keeps up with on the trainer's core: none finishes
during the measurement). Then, on the same episodes, ``--checkpoints`` (3) measured
``Rollouts.checkpoint()`` per mode (``EMBEDDED_MODES``: pure unaligned first, since it parks
nothing; then ``aligned_timeout``, the default configuration's control and alignment timeouts;
then ``aligned``, the reference protocol: no alignment timeout, within a one-hour bound), each
with its whole protocol (close, retire, prepare, commit, ownership, drain, snapshot, publish,
resume). A checkpoint that fails (the reference protocol when a turn in flight outlasts its
bound: ``gym_unavailable``) is a figure: each mode reports how many of its checkpoints
completed (``complete_pct``), the episodes they took mid-turn, the median completed one's
figures, and its cost against pure unaligned as ratios (``vs_unaligned``).

Time. 200k simulated episodes cannot tick in real time on one core, so the run starts on a
*warp clock*: virtual time that jumps to the next deadline whenever every task is blocked (what
``MockClock(autojump_threshold=0)`` does, driven here by a task waiting for quiescence). It is
deliberately not a ``MockClock``: ``nurseries`` runs its heavy work inline under a MockClock and
in a worker thread otherwise, and we want the worker threads. The aligned checkpoint switches
to real time at the coordinator's ``after_prepare`` hook (Gym parked, so no episode ticks any
more): its wait for the slowest turn in flight is simulated (``turn_time_simulated_s``), the
rest runs as in production. The unaligned one has no wait to simulate and runs in real time
from its start. Between the two the clock goes back to virtual. Consequences, stated in the
results:

* ``prepare``'s *simulated* duration (aligned) is the wait for every episode to reach its next
  step boundary; its *wall* duration is the embedded Gym's own work of moving 200k episodes to
  a boundary, on this loop.
* ``commit`` is the embedded Gym exporting 200k episodes' records to disk, on this loop (in
  production each instance is a Ray actor in its own process). The Gym proxy times every
  control call so each stage says how much of it was spent inside Gym.
* The remaining stages are the runtime's own and are measured exactly as they run: their heavy
  work goes through ``trio.to_thread``.

Until every episode moves. ``checkpoint()`` returning is not the end: the measurement goes on
until the last episode that reached a step boundary during the checkpoint has started its next
turn (``until_all_moving_s``; the episodes record it themselves, ``_heavy.PauseRecorder``),
with the loop thread's and the process's CPU time beside each wall figure. What each episode
felt: its boundary gaps and turn overruns over 0.5 ms in that window, summed, p50 / p99 / max
over all N (``pauses``), and the same over a window of no checkpoint a few seconds later
(``control_pauses``).

Per stage: wall duration, the longest loop stall (``benchmarks._common.LoopStallMonitor``, wall
and loop-thread CPU), GC pauses, time inside Gym calls, and ledger mutations that ran (replies
keep flowing); over the checkpoint, the longest scheduler batch in wall and CPU time
(``SchedulerBatchMonitor``) beside the longest task step. Also: snapshot size on disk, files,
``ledger.json`` size. The top level of the result is the aligned run's (the reference the
report's older rows read); ``modes`` holds both.

Because a process with 200k simulated episodes holds ~3 GB and takes half a minute to tear down,
the measurement runs in a fresh subprocess which exits without tearing down.

Dispatch throughput on the embedded Gym
---------------------------------------
``open_rollouts`` over short episodes under ``MockClock(autojump_threshold=0)``: every row goes
through gate, ledger, ``EmbeddedGym``'s admission, the episode, the streamed reply and the
completion mutation, and the trainer takes the groups. Two environments: ``one_step``, a user's
``Environment`` whose agent ends the episode in its first step (the issue's "one-step episode":
what the runtime and the Gym host cost per row), and ``calendar``, the calendar workplace with
one turn of 10 to 20 ms (virtual) and its retained calendar session (what a small real
environment adds: its plan, its journal writes, its turn's sleep). Rows (attempts) per wall
second, for dispatcher batch sizes 64 and 512. Gym's own work shares the core, so this is a lower
bound on what the runtime sustains against a remote Gym.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import trio
import trio.testing

from gymckpt.gym_adapter.environments.calendar import calendar_environment
from gymckpt.nurseries import ExitCode
from gymckpt.runtime._shared import LEDGER_FILE

from ._common import (
    GcMonitor,
    LoopStallMonitor,
    Progress,
    SchedulerBatchMonitor,
    ThreadSchedstat,
    label,
)
from ._heavy import PauseSource, TurnTimes, all_moving_at, heavy_refs, host_config, pauses_in

__all__ = ["CheckpointConfig", "WarpClock", "run_checkpoint"]

perf_ns = time.perf_counter_ns

MODES = ("unaligned", "aligned")
"""Both checkpoint modes, in the order one run measures them on the same episodes (unaligned
first: it parks nothing, so the aligned checkpoint after it finds the episodes as they were)."""

ALIGNED_TIMEOUT = "aligned_timeout"
"""The benchmark's third mode: the default configuration's aligned checkpoint, with its
alignment timeout (``RuntimeConfig().alignment_timeout_s``) inside its control timeout
(``RuntimeConfig().control_timeout_s``), where ``aligned`` is the reference protocol: no
alignment timeout (``_TimedGym.reference_protocol``), within a one-hour control bound, so it
waits for the slowest turn in flight and fails (``gym_unavailable``) if one outlasts the bound."""

BENCH_MODES = (*MODES, ALIGNED_TIMEOUT)
"""The modes ``--modes`` names for ``gymckpt bench checkpoint`` (every backend)."""

EMBEDDED_MODES = ("unaligned", ALIGNED_TIMEOUT, "aligned")
"""The embedded checkpoint's default modes, in the order it measures them on the same
episodes: pure unaligned first (parks nothing), the default configuration's aligned checkpoint
(parks for at most its alignment timeout), then the reference protocol."""

REPEATS = 3
"""Checkpoints per mode on the embedded Gym, so that "100 % complete" counts more than one."""

TURN_SIGMA, TURN_CAP = 2.0, 21.0
"""The turn lengths' shape: lognormal with sigma 2, capped at 21 times the median (6.4 % of the
turns at the cap), so the p99 is 21 times the median and an aligned checkpoint's wait — the
longest turn in flight, up to the cap — stays a few minutes on Ray in real time."""

TURN_ENDS_PER_S = 200
"""Turn ends a real second, over all embedded instances, that the default mean aims at: light
next to the 2,500 rows a second the embedded Gym fills at on a quiet core, so that on this
shared machine the episodes' own traffic while the clock is real does not swamp the loop."""


@attrs.define
class CheckpointConfig:
    in_flight: int = 200_000
    instances: int = 4
    group_size: int = 8
    dispatch_batch: int = 512
    turns: tuple[int, int] = (40, 60)
    turn_sigma: float = TURN_SIGMA
    turn_cap: float = TURN_CAP
    turn_mean_s: float | None = None  # None: in_flight / TURN_ENDS_PER_S
    modes: tuple[str, ...] = EMBEDDED_MODES
    repeats: int = REPEATS
    control_s: float = 3.0
    dispatch_rows: int = 16_384
    after_s: float = 2.0
    dispatch_batches: tuple[int, ...] = (64, 512)
    seed: int = 3
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> CheckpointConfig:
        return cls(
            in_flight=2_000, dispatch_rows=512, after_s=0.5, control_s=1.0, repeats=2, quick=True
        )

    def times(self) -> TurnTimes:
        """The turn lengths: lognormal, the mean such that the turn ends a real second stay
        under ``TURN_ENDS_PER_S`` (the embedded Gym shares the trainer's core)."""
        mean = self.turn_mean_s or max(20.0, self.in_flight / TURN_ENDS_PER_S)
        return TurnTimes.with_mean(mean, self.turn_sigma, self.turn_cap)


# -- the warp clock -------------------------------------------------------------------------------


class WarpClock(trio.abc.Clock):
    """Virtual time (jumped forward by ``warp_driver`` whenever the loop is idle) until
    ``go_realtime()``; real time (``perf_counter``) from then on, continuing from where the
    virtual time was."""

    def __init__(self) -> None:
        self._virtual_base = 0.0
        self._real_base = time.perf_counter()
        self._rate = 0.0

    @property
    def realtime(self) -> bool:
        return self._rate > 0

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._virtual_base + self._rate * (time.perf_counter() - self._real_base)

    def deadline_to_sleep_time(self, deadline: float) -> float:
        dt = deadline - self.current_time()
        if dt <= 0:
            return 0.0
        return dt / self._rate if self._rate > 0 else 999_999_999.0

    def jump(self, seconds: float) -> None:
        self._virtual_base += seconds

    def go_realtime(self) -> None:
        if self._rate > 0:
            return
        now = self.current_time()
        self._virtual_base, self._real_base, self._rate = now, time.perf_counter(), 1.0

    def go_virtual(self) -> None:
        """Back to virtual time (a ``warp_driver`` must be started again)."""
        now = self.current_time()
        self._virtual_base, self._real_base, self._rate = now, time.perf_counter(), 0.0


async def warp_driver(clock: WarpClock) -> None:
    """While the clock is virtual: whenever every other task is blocked, jump to the next
    deadline — but never while a worker thread runs.

    A task waiting for ``trio.to_thread`` counts as blocked, so jumping then would age every
    deadline by however long the thread takes to return (the checkpoint's first stage offloads
    its file work): the dispatcher's stream deadlines expired inside a few real milliseconds
    and the episodes in flight were abandoned before the checkpoint began. While a thread holds
    a token of trio's default limiter (what ``offload`` uses), the driver polls every 0.5 ms of
    real time instead.
    """
    threads = trio.to_thread.current_default_thread_limiter()
    while not clock.realtime:
        await trio.testing.wait_all_tasks_blocked()
        if clock.realtime:
            return
        if threads.borrowed_tokens:
            await trio.testing.wait_all_tasks_blocked(cushion=0.0005)
            continue
        ahead = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if 0 < ahead < math.inf:
            clock.jump(ahead)
        await trio.lowlevel.checkpoint()


# -- a timing proxy for Gym -----------------------------------------------------------------------


class _TimedGym:
    """Delegates to a Gym deployment (embedded, Ray or HTTP); records the wall time of each control
    call: ``spans`` (op, start, end) and ``calls`` (op, instance, start, end), where the
    instance is the call's first argument (every control call takes it first; none for
    ``topology``, which the coordinator asks once, at its first checkpoint, before closing
    admission).

    ``reference_protocol``: while set, every ``prepare`` goes without an alignment timeout
    (``alignment_timeout_s=None``: Gym waits for every episode to park until the call's
    deadline), the protocol as it was before the timeout, whatever the configuration says."""

    def __init__(self, gym: Any) -> None:
        self._gym = gym
        self.spans: list[tuple[str, int, int]] = []
        self.calls: list[tuple[str, str, int, int]] = []
        self.reference_protocol = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._gym, name)
        if name not in ("prepare", "commit", "resume", "retire", "retire_restored", "topology"):
            return attr

        async def timed(*args: Any, **kwargs: Any) -> Any:
            if name == "prepare" and self.reference_protocol:
                kwargs["alignment_timeout_s"] = None
            t0 = perf_ns()
            try:
                return await attr(*args, **kwargs)
            finally:
                t1 = perf_ns()
                self.spans.append((name, t0, t1))
                who = args[0] if args else kwargs.get("instance", "")
                self.calls.append((name, str(who), t0, t1))

        return timed


# -- the checkpoint measurement -------------------------------------------------------------------


class _AfterWindow:
    """Loop stalls and collector pauses in the seconds after the checkpoint returned (the
    collector is switched back on then, and pays for what the checkpoint allocated)."""

    def __init__(self, stall: Any, gcm: Any, t0: int) -> None:
        self._stall, self._gcm = stall, gcm
        self._t0 = t0
        self._t1 = 0

    def close(self) -> None:
        self._t1 = perf_ns()

    def report(self) -> dict[str, Any]:
        t0 = self._t0
        stalls = [b - a for a, b, _task, _cpu in self._stall.long if b > t0]
        pauses = [(b - a, gen) for a, b, gen in self._gcm.pauses if b > t0]
        worst = max(pauses, default=(0, -1))
        return {
            "after_checkpoint_s": round((self._t1 - t0) / 1e9, 3),
            "after_checkpoint_max_loop_stall_ms": round(max(stalls, default=0) / 1e6, 3),
            "after_checkpoint_gc_max_pause_ms": round(worst[0] / 1e6, 3),
            "after_checkpoint_gc_max_pause_generation": worst[1],
        }


def _ledger_bytes(ledger: Any) -> int:
    """What the ledger's storage occupies: its columns and tables (``sys.getsizeof``)."""
    names = (
        "_row_block",
        "_blk_row",
        "_blk_done",
        "_free_blocks",
        "_att",
        "_state",
        "_unclaimed_col",
        "_rep",
        "_gate",
        "_reward",
        "_turns",
        "_hlist",
        "_hnext",
        "_hprev",
        "_restored",
        "_spent",
        "_ready",
        "_retire",
    )
    cols = getattr(ledger, "_cols", ledger)  # the columns live in their own object
    return sum(sys.getsizeof(getattr(cols, n)) for n in names if hasattr(cols, n))


def _dir_size(path: Path) -> tuple[int, int]:
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(root, n)).st_size
            files += 1
    return total, files


def _union(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s0, s1 in sorted(spans):
        if out and s0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], s1))
        else:
            out.append((s0, s1))
    return out


def _overlap(a0: int, a1: int, spans: Sequence[tuple[int, int]]) -> int:
    return sum(max(0, min(a1, s1) - max(a0, s0)) for s0, s1 in spans)


def outcome_mode(ro: Any) -> str:
    """The checkpoint mode ``ro``'s coordinator is configured with."""
    return str(ro.coordinator.config.checkpoint_mode.value)


async def _until_all_moving(
    src: PauseSource, start_ns: int, timeout_s: float, say: Callable[[str], None]
) -> dict[str, Any]:
    """After ``checkpoint()`` returned: poll ``src`` until every episode moves again (no more
    episodes at a step boundary than ``src.limit`` in any process's fresh status), then the
    perf_counter time the last one that the checkpoint held started its next turn, and the
    per-episode pauses over the window from the checkpoint's start to then."""
    returned = time.perf_counter()
    deadline = returned + timeout_s
    waiting = -1
    while time.perf_counter() < deadline:
        waiting, fresh = await trio.to_thread.run_sync(src.waiting)
        if fresh > returned and waiting <= src.limit:
            break
        await trio.sleep(0.1)
    else:
        say(f"episodes still at a boundary after {timeout_s:.0f} s: {waiting}")
    records = await trio.to_thread.run_sync(src.records)
    w0 = start_ns / 1e9
    moving = all_moving_at(records, w0, time.perf_counter())
    w1 = max(moving, returned)
    out: dict[str, Any] = {
        "until_all_moving_s": round(w1 - w0, 3),
        "moving_after_return_s": round(max(0.0, moving - returned), 3),
        "waiting_at_end": waiting,
        "pauses": pauses_in(records, w0, w1, src.episodes),
    }
    return out


async def measure_checkpoint(
    ro: Any,
    spans: list[tuple[str, int, int]],
    stages: Collection[str],
    *,
    nursery: trio.Nursery,
    dispatched: int,
    pause_collector: bool,
    after_s: float,
    on_after_prepare: Callable[[], None] | None = None,
    on_return: Callable[[], None] | None = None,
    say: Callable[[str], None] = lambda _msg: None,
    pauses: PauseSource | None = None,
    moving_timeout_s: float = 300.0,
    control_s: float = 0.0,
) -> dict[str, Any]:
    """Run one ``ro.checkpoint()`` (``ro``: an open ``Rollouts``) under the loop-stall and GC
    monitors and report it (``_checkpoint_report``, the seconds after it, the snapshot on disk).

    ``spans``: the Gym proxy's list of control calls (read after the checkpoint).
    ``on_after_prepare``: called at the coordinator's ``after_prepare`` hook — the embedded run
    switches its warp clock to real time there; the 1 ms heartbeat starts there too, since
    lateness means nothing in virtual time. Without it (a run in real time throughout) the
    heartbeat covers the whole checkpoint and no stage reports a simulated wait.
    ``on_return``: called as ``checkpoint()`` returns (the embedded run goes real there too,
    for a checkpoint that failed before its ``after_prepare``).

    ``pauses``: where the episodes' pause records are read (``_heavy``); with it, the
    measurement goes on after ``checkpoint()`` returns until every episode moves again
    (``_until_all_moving``), and the scheduler batches and CPU times cover that too.
    """
    from gymckpt.runtime.lowlevel import collector_paused

    ledger = ro.ledger
    st = _StageHook(ledger, nursery, on_after_prepare)
    marks, mutations = st.marks, st.mutations
    ro.coordinator.on_stage = st.hook
    if on_after_prepare is None:
        nursery.start_soon(st.beat, name="heartbeat")
    moving: dict[str, Any] = {}
    with _monitors() as (stall, batches, gcm):
        marks["start"] = perf_ns()
        cpu0 = _cpu_now()
        mutations["start"] = ledger.barrier.statistics().mutations
        # nested in the coordinator's own pause, so that the collection the
        # collector owes once switched back on falls after the mark
        with collector_paused(pause_collector):
            outcome = await ro.checkpoint()
            marks["end"] = perf_ns()
            if on_return is not None:
                on_return()
        cpu1 = _cpu_now()
        after = _AfterWindow(stall, gcm, marks["end"])
        mutations["end"] = ledger.barrier.statistics().mutations
        if pauses is not None:
            moving = await _until_all_moving(pauses, marks["start"], moving_timeout_s, say)
        batches.active = False
        cpu2 = _cpu_now()
        # the collector is back on: watch what its first collections cost
        await trio.sleep(after_s)
        after.close()
        if pauses is not None and control_s > 0:
            moving.update(await _control_window(pauses, control_s))
        st.beating = False
    say(f"checkpoint ok={outcome.ok} in {(marks['end'] - marks['start']) / 1e9:.1f} s")
    cpu = _cpu_figures(cpu0, cpu1, cpu2 if moving else None)
    snapshot = await _snapshot_figures(outcome)
    out = _checkpoint_report(
        outcome, marks, mutations, st.virtual_at, stall, gcm, spans, stages, st.heartbeat
    )
    _add_heartbeat_run_queue(out, st, _stage_windows(marks, dict(outcome.stage_s)))
    out.update(after.report())
    out.update(cpu)
    out.update(batches.report())
    out.update(moving)
    if moving:
        out["until_all_moving_excluding_turn_s"] = _excluding_turn(ro, out)
    out["bytes_per_attempt"] = round(_ledger_bytes(ledger) / max(1, dispatched), 1)
    out.update(snapshot)
    return out


def _add_heartbeat_run_queue(
    out: dict[str, Any], st: _StageHook, windows: dict[str, tuple[int, int]]
) -> None:
    """Beside the latest heartbeat, overall and per stage: how much of it the loop thread was
    runnable but waiting for a CPU (the rest: asleep, e.g. waiting for the GIL)."""

    def latest(w0: int, w1: int) -> float | None:
        beats = [
            (late, wait)
            for (t, late), wait in zip(st.heartbeat, st.heartbeat_run_queue, strict=True)
            if w0 <= t < w1
        ]
        return round(max(beats)[1] / 1e6, 3) if beats else None

    out["heartbeat_max_late_run_queue_ms"] = latest(0, 2**63)
    for row in out["stages"]:
        row["heartbeat_max_late_run_queue_ms"] = latest(*windows[row["stage"]])


def _excluding_turn(ro: Any, out: dict[str, Any]) -> float:
    """The whole checkpoint as the episodes see it, from its start until every episode moves
    again; aligned, less the prepare stage's wall time (the Gym running the turns in flight to
    their ends, whose length is the environment's)."""
    turn = out["turn_time_wall_s"] if outcome_mode(ro) == "aligned" else 0.0
    return round(out["until_all_moving_s"] - turn, 3)


def _cpu_now() -> tuple[float, float]:
    """The loop thread's CPU time and the process's, now."""
    return time.thread_time(), time.process_time()


def _cpu_figures(
    start: tuple[float, float], end: tuple[float, float], moving: tuple[float, float] | None
) -> dict[str, float]:
    """Loop and process CPU from the checkpoint's start to its return, and (``moving``) until
    every episode moved again."""
    cpu = {
        "checkpoint_loop_cpu_s": round(end[0] - start[0], 3),
        "checkpoint_process_cpu_s": round(end[1] - start[1], 3),
    }
    if moving is not None:
        cpu["until_moving_loop_cpu_s"] = round(moving[0] - start[0], 3)
        cpu["until_moving_process_cpu_s"] = round(moving[1] - start[1], 3)
    return cpu


@contextlib.contextmanager
def _monitors() -> Iterator[tuple[LoopStallMonitor, SchedulerBatchMonitor, GcMonitor]]:
    """The loop-stall and scheduler-batch instruments and the GC monitor, active inside."""
    stall = LoopStallMonitor(cpu=True, keep_over_ns=100_000, keep_max=500_000)
    batches = SchedulerBatchMonitor()
    with GcMonitor() as gcm:
        trio.lowlevel.add_instrument(stall)
        trio.lowlevel.add_instrument(batches)
        stall.active = gcm.active = batches.active = True
        try:
            yield stall, batches, gcm
        finally:
            stall.active = gcm.active = False
            trio.lowlevel.remove_instrument(stall)
            trio.lowlevel.remove_instrument(batches)


async def _control_window(pauses: PauseSource, control_s: float) -> dict[str, Any]:
    """The same episodes for ``control_s`` with no checkpoint: what a step costs them anyway."""
    c0 = time.perf_counter()
    await trio.sleep(control_s)
    records = await trio.to_thread.run_sync(pauses.records)
    return {
        "control_window_s": control_s,
        "control_pauses": pauses_in(records, c0, time.perf_counter(), pauses.episodes),
    }


@attrs.define
class _StageHook:
    """The coordinator's stage hook during a measured checkpoint: when each stage point was
    reached (``perf_ns``), the ledger's mutations by then, the virtual time (a run on the warp
    clock), and the 1 ms heartbeat's lateness once it beats."""

    ledger: Any
    nursery: trio.Nursery
    on_after_prepare: Callable[[], None] | None
    marks: dict[str, int] = attrs.Factory(dict)
    mutations: dict[str, int] = attrs.Factory(dict)
    virtual_at: dict[str, float] = attrs.Factory(dict)
    heartbeat: list[tuple[int, int]] = attrs.Factory(list)
    heartbeat_run_queue: list[int] = attrs.Factory(list)
    """Beside each late beat: the loop thread's run-queue wait in it (schedstat)."""
    beating: bool = True

    async def beat(self) -> None:
        """Lateness of a 1 ms sleep: also catches the loop waiting for the GIL (a worker
        thread collecting garbage), which task steps cannot show; and, beside it, how much of
        the beat the loop thread was runnable but waiting for a CPU."""
        sched = ThreadSchedstat()
        while self.beating:
            t = perf_ns()
            wait0 = sched.read()[1]
            await trio.sleep(0.001)
            late = perf_ns() - t - 1_000_000
            if late > 1_000_000:
                self.heartbeat.append((t, late))
                self.heartbeat_run_queue.append(sched.read()[1] - wait0)

    def hook(self, _cid: str, point: str) -> None:
        """``Coordinator.on_stage``: the heartbeat starts at ``after_prepare`` when the run
        switches its warp clock to real time there."""
        self.marks[point] = perf_ns()
        self.mutations[point] = self.ledger.barrier.statistics().mutations
        if self.on_after_prepare is not None:
            self.virtual_at[point] = trio.current_time()
            if point == "after_prepare":
                self.on_after_prepare()
                self.nursery.start_soon(self.beat, name="heartbeat")


async def _snapshot_figures(outcome: Any) -> dict[str, Any]:
    """The snapshot on disk: bytes, files, the ledger's JSON, bytes per episode."""
    size = files = ledger_bytes = 0
    if outcome.snapshot is not None:
        snap = outcome.snapshot.path
        size, files = await trio.to_thread.run_sync(_dir_size, snap)
        lj = snap / LEDGER_FILE
        ledger_bytes = lj.stat().st_size if lj.exists() else 0
    return {
        "snapshot_bytes": size,
        "snapshot_mib": round(size / 2**20, 1),
        "snapshot_files": files,
        "ledger_json_bytes": ledger_bytes,
        "snapshot_bytes_per_episode": round(size / max(1, outcome.episodes), 1),
    }


async def _checkpoint_main(
    cfg: CheckpointConfig, clock: WarpClock, verbose: bool, finish: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Measure; ``finish(result)`` is called before anything is torn down (it may exit)."""
    from gymckpt.gym_adapter import EmbeddedGym
    from gymckpt.nurseries import open_rollouts

    def say(msg: str) -> None:
        if verbose:
            print(f"[checkpoint] {msg}", file=sys.stderr, flush=True)

    n, g = cfg.in_flight, cfg.group_size
    times = cfg.times()
    rc = measured_runtime_config()
    out: dict[str, Any] = {}
    async with trio.open_nursery() as top:
        top.start_soon(warp_driver, clock, name="warp-clock")
        with tempfile.TemporaryDirectory(prefix="gymckpt-bench-") as tmp:
            records = Path(tmp) / "pauses"
            records.mkdir()
            refs = heavy_refs(cfg.instances, cfg.turns, times, str(records))
            async with EmbeddedGym.host(
                refs,
                cfg.instances,
                cfg.seed,
                Path(tmp) / "gym",
                host_config(cfg.dispatch_batch, 0.05),
            ) as gym:
                timed = _TimedGym(gym)
                async with open_rollouts(
                    cast(Any, timed),
                    Path(tmp) / "run",
                    rows=2 * n // g + 1,
                    group_size=g,
                    config=rc,
                    max_rows_in_flight=n // g,
                    batch_size=cfg.dispatch_batch,
                    restore=False,
                    keep_snapshots=0,
                ) as ro:
                    dispatched, fill_s = await _fill(ro.ledger, n, say)
                    src = PauseSource(records, in_process=True, episodes=dispatched)
                    modes = await _measure_modes(
                        cfg, ro, timed, rc, clock, top, dispatched, src, say
                    )
                    ref = reference_mode(modes, cfg.modes)
                    out.update(modes[ref])  # the reference's figures, where the report has them
                    out.update(
                        {
                            "reference_mode": ref,
                            "modes": modes,
                            "turn_times": times.describe(),
                            "in_flight": dispatched,
                            "fill_wall_s": round(fill_s, 2),
                            "embedded_fill_rows_per_s": round(dispatched / fill_s),
                        }
                    )
                    finish(out)
                    return out
    return out  # pragma: no cover - the return above always runs


def reference_mode(modes: dict[str, Any], order: Sequence[str]) -> str:
    """The mode whose figures a result's top level holds (what the report's older rows read):
    ``aligned`` if it completed, else the first mode that completed, else the first mode."""
    if "aligned" in modes and modes["aligned"]["checkpoint_ok"]:
        return "aligned"
    return next((m for m in order if modes[m]["checkpoint_ok"]), order[0])


def measured_runtime_config() -> Any:
    """The runtime's configuration for a measured checkpoint (embedded, Ray, HTTP): the
    aligned row measures the reference protocol (every episode parked until the slowest turn
    in flight ends: its prepare goes without an alignment timeout, ``_TimedGym``), bounded by
    the one-hour control timeout; ``mode_config`` gives ``aligned_timeout`` the defaults'."""
    from gymckpt.runtime import RuntimeConfig

    return RuntimeConfig(
        max_consecutive_failures=1000,  # a failed checkpoint is a figure, not the end
        control_timeout_s=3600.0,
        alignment_timeout_s=3599.0,
        reply_grace_s=5.0,
        drain_timeout_s=900.0,
        lease_s=7200.0,
    )


async def _fill(ledger: Any, n: int, say: Callable[[str], None]) -> tuple[int, float]:
    """Wait until ``n`` attempts are dispatched: how many were, and how long it took."""
    t0 = time.perf_counter()
    last = 0.0
    while ledger.statistics().by_state["dispatched"] < n:
        await trio.sleep(1.0)
        if time.perf_counter() - last > 5:
            last = time.perf_counter()
            say(f"dispatched {ledger.statistics().by_state['dispatched']:,}/{n:,}")
    fill_s = time.perf_counter() - t0
    dispatched = ledger.statistics().by_state["dispatched"]
    say(f"{dispatched:,} in flight after {fill_s:.1f} s; checkpointing")
    return dispatched, fill_s


async def _measure_modes(
    cfg: CheckpointConfig,
    ro: Any,
    timed: _TimedGym,
    rc: Any,
    clock: WarpClock,
    top: trio.Nursery,
    dispatched: int,
    src: PauseSource,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """``cfg.repeats`` measured checkpoints per mode, in ``cfg.modes``' order, on the same
    episodes; each mode's figures are its median completed checkpoint's (``repeats_summary``),
    with every checkpoint's outcome beside them and the cost against pure unaligned."""
    from gymckpt.nurseries import STAGES

    modes: dict[str, Any] = {}
    for mode in cfg.modes:
        runs: list[dict[str, Any]] = []
        for k in range(cfg.repeats):
            if clock.realtime:  # every checkpoint but the run's first starts virtual again
                clock.go_virtual()
                top.start_soon(warp_driver, clock, name="warp-clock")
            config = mode_config(rc, mode)
            ro.coordinator.config = config
            timed.reference_protocol = mode == "aligned"
            # aligned: the wait for the turns to end is simulated (virtual until Gym is
            # prepared, or the checkpoint failed); unaligned: nothing waits, real throughout
            if config.checkpoint_mode.value != "aligned":
                clock.go_realtime()
            say(f"{mode} checkpoint {k + 1}/{cfg.repeats}")
            r = await measure_checkpoint(
                ro,
                timed.spans,
                STAGES,
                nursery=top,
                dispatched=dispatched,
                pause_collector=rc.pause_collector,
                after_s=cfg.after_s,
                on_after_prepare=clock.go_realtime,
                on_return=clock.go_realtime,
                say=say,
                pauses=src,
                control_s=cfg.control_s if k == 0 else 0.0,
            )
            r["checkpoint_mode"] = mode
            # what the episodes waited, the simulated wait of an aligned prepare included
            wait = (
                r.get("turn_time_simulated_s") if config.checkpoint_mode.value == "aligned" else 0
            )
            r["until_all_moving_with_wait_s"] = round(r["until_all_moving_s"] + (wait or 0.0), 3)
            runs.append(r)
            timed.spans.clear()
        modes[mode] = repeats_summary(runs, config)
    against_unaligned(modes)
    return modes


def mode_config(base: Any, mode: str) -> Any:
    """The runtime configuration a measured checkpoint in ``mode`` (``BENCH_MODES``) runs with:
    ``base`` in that checkpoint mode; ``aligned_timeout`` with the default configuration's
    control and alignment timeouts (every other bound ``base``'s)."""
    from gymckpt.runtime import RuntimeConfig

    if mode != ALIGNED_TIMEOUT:
        return attrs.evolve(base, checkpoint_mode=mode)
    default = RuntimeConfig()
    return attrs.evolve(
        base,
        checkpoint_mode="aligned",
        control_timeout_s=default.control_timeout_s,
        alignment_timeout_s=default.alignment_timeout_s,
    )


RUN_KEYS = (
    "checkpoint_ok",
    "checkpoint_error",
    "checkpoint_failure",
    "until_all_moving_s",
    "until_all_moving_with_wait_s",
    "checkpoint_wall_s",
    "e2e_s",
    "turn_time_simulated_s",
    "mid_turn",
    "episodes_exported",
    "max_loop_stall_ms",
)
"""What ``repeats`` keeps of each checkpoint of a mode (beside its pauses' p50 / p99)."""


def _median_by(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the (lower) median of ``runs``."""
    ranked = sorted(runs, key=lambda r: r.get(key) or 0.0)
    return ranked[(len(ranked) - 1) // 2]


def repeats_summary(runs: Sequence[dict[str, Any]], config: Any) -> dict[str, Any]:
    """One mode's figures from its checkpoints: the median completed checkpoint's (by time
    until every episode moves; the first checkpoint's when none completed), with how many
    completed (``complete_pct``: a failed checkpoint, e.g. ``gym_unavailable`` when a turn
    outlasts the control timeout, counts as not complete), the episodes each took mid-turn,
    and the median of each completed checkpoint's pause p50 / p99; the window of no
    checkpoint is the first checkpoint's (the only one measured). Invariant: ``checkpoints``
    is ``len(runs)`` and ``completed`` counts those with ``checkpoint_ok``."""
    done = [r for r in runs if r["checkpoint_ok"]]
    out = dict(_median_by(done, "until_all_moving_s") if done else runs[0])
    # the window of no checkpoint is measured once per mode, after its first checkpoint
    for key in ("control_window_s", "control_pauses"):
        out.setdefault(key, next((r[key] for r in runs if key in r), None))
    out["repeats"] = [
        {
            **{k: r.get(k) for k in RUN_KEYS},
            "pause_p50_ms": (r.get("pauses") or {}).get("pause_p50_ms"),
            "pause_p99_ms": (r.get("pauses") or {}).get("pause_p99_ms"),
        }
        for r in runs
    ]
    out["checkpoints"] = len(runs)
    out["completed"] = len(done)
    out["complete_pct"] = round(100.0 * len(done) / max(1, len(runs)), 1)
    out["mid_turn_median"] = (
        statistics.median(int(r.get("mid_turn") or 0) for r in done) if done else None
    )
    for q in ("p50", "p99"):
        vals = [r["pauses"][f"pause_{q}_ms"] for r in done if r.get("pauses")]
        out[f"pause_{q}_ms_median"] = round(statistics.median(vals), 3) if vals else None
    out["control_timeout_s"] = config.control_timeout_s
    out["alignment_timeout_s"] = config.alignment_timeout_s
    return out


RATIO_KEYS = (
    "until_all_moving_s",
    "until_all_moving_with_wait_s",
    "pause_p50_ms_median",
    "pause_p99_ms_median",
)
"""The figures ``against_unaligned`` divides by pure unaligned's, in the same run."""


def against_unaligned(modes: dict[str, Any]) -> None:
    """Each mode's cost against pure unaligned's in the same run (``vs_unaligned``: ratios of
    ``RATIO_KEYS``, None where either side is missing, failed or zero)."""
    u = modes.get("unaligned")
    if u is None or not u["checkpoint_ok"]:
        return
    for name, m in modes.items():
        if name == "unaligned":
            continue
        ratios: dict[str, float | None] = {}
        for key in RATIO_KEYS:
            a, b = m.get(key) if m["checkpoint_ok"] else None, u.get(key)
            ratios[key] = round(a / b, 3) if a is not None and b else None
        m["vs_unaligned"] = ratios


def _checkpoint_report(
    outcome: Any,
    marks: dict[str, int],
    mutations: dict[str, int],
    virtual_at: dict[str, float],
    stall: LoopStallMonitor,
    gcm: GcMonitor,
    spans: list[tuple[str, int, int]],
    stages: Collection[str],
    heartbeat: list[tuple[int, int]],
) -> dict[str, Any]:
    s = dict(outcome.stage_s)
    windows = _stage_windows(marks, s)
    mut_points = {
        "close+retire": ("start", "before_prepare"),
        "prepare": ("before_prepare", "after_prepare"),
        "commit": ("after_prepare", "after_commit"),
        "publish": ("before_publish", "after_publish"),
        "resume": ("before_resume", "end"),
    }
    gym_spans = _union([(a, b) for _op, a, b in spans])  # calls to K instances overlap
    rows: list[dict[str, Any]] = []
    for name, (w0, w1) in windows.items():
        row = _stage_row(name, w0, w1, stall, gcm, gym_spans, heartbeat)
        if name in mut_points:
            p0, p1 = mut_points[name]
            if p0 in mutations and p1 in mutations:
                row["ledger_mutations"] = mutations[p1] - mutations[p0]
        if name == "prepare" and "before_prepare" in virtual_at and "after_prepare" in virtual_at:
            row["simulated_wait_s"] = round(
                virtual_at["after_prepare"] - virtual_at["before_prepare"], 3
            )
        rows.append(row)

    def num(v: Any) -> float:
        return float(v) if isinstance(v, int | float) else 0.0

    worst_rt = max(rows, key=lambda r: num(r["max_runtime_stall_excluding_gc_ms"]))

    checkpoint_wall_s = (marks["end"] - marks["start"]) / 1e9
    prepare_row = next(r for r in rows if r["stage"] == "prepare")
    turn_wall_s = prepare_row["wall_ms"] / 1e3
    return {
        # close → resume, less the episodes' own time to reach their next step boundary (the
        # prepare stage: the embedded Gym running every episode's turn to its end on this loop)
        "e2e_s": round(checkpoint_wall_s - turn_wall_s, 3),
        "turn_time_wall_s": round(turn_wall_s, 3),
        "turn_time_simulated_s": prepare_row.get("simulated_wait_s"),
        "stage_s": {k: round(v, 4) for k, v in s.items() if k in stages},
        "gc_max_pause_ms": round(
            max((b - a for a, b, _g in gcm.pauses if b <= marks["end"]), default=0) / 1e6, 3
        ),
        "checkpoint_ok": bool(outcome.ok),
        "checkpoint_error": outcome.error,
        "episodes_exported": outcome.episodes,
        "mid_turn": outcome.mid_turn,
        "checkpoint_failure": None if outcome.reason is None else str(outcome.reason.value),
        "pending_drained": outcome.drained,
        "checkpoint_wall_s": round(checkpoint_wall_s, 3),
        "coordinator_stage_s": {k: round(v, 4) for k, v in s.items() if k in stages},
        "stages": rows,
        # the checkpoint's window only (the seconds after it are reported as after_checkpoint_*)
        "max_loop_stall_ms": _longest_step_ms(stall, marks["start"], marks["end"]),
        "max_loop_stall_task": stall.max_task,
        "max_loop_stall_run_queue_ms": _longest_step_run_queue_ms(
            stall, marks["start"], marks["end"]
        ),
        "max_runtime_stall_excluding_gc_ms": num(worst_rt["max_runtime_stall_excluding_gc_ms"]),
        "max_runtime_stall_cpu_ms": worst_rt["max_runtime_stall_cpu_ms"],
        "max_runtime_stall_stage": worst_rt["stage"],
        "max_runtime_stall_task": worst_rt["max_runtime_stall_task"],
        "max_gc_pause_ms": round(gcm.max_pause_ns / 1e6, 3),
        "gc_collections_by_generation": list(gcm.collections),
        "heartbeat_max_late_ms": round(max((d for _t, d in heartbeat), default=0) / 1e6, 3),
        "gym_calls": _gym_call_summary(spans),
    }


def _longest_step_ms(stall: LoopStallMonitor, start: int, end: int) -> float:
    """The longest task step that began in ``[start, end)``, cut at ``end``."""
    return round(
        max((min(b, end) - a for a, b, _t, _c in stall.long if start <= a < end), default=0) / 1e6,
        3,
    )


def _longest_step_run_queue_ms(stall: LoopStallMonitor, start: int, end: int) -> float:
    """The loop thread's run-queue wait (runnable, no CPU free) inside the longest task step
    that began in ``[start, end)``: a stall mostly made of it is the loop starved of a core."""
    best, wait = 0, 0
    for i, (a, b, _t, _c) in enumerate(stall.long):
        if start <= a < end and min(b, end) - a > best and i < len(stall.long_run_queue):
            best, wait = min(b, end) - a, stall.long_run_queue[i]
    return round(wait / 1e6, 3)


def _stage_windows(marks: dict[str, int], s: dict[str, float]) -> dict[str, tuple[int, int]]:
    """Each stage's window on the perf_counter timeline, from the hook points and (for the
    stages between after_commit and before_publish, timed by the coordinator in real time)
    the stage durations ``s``."""
    own0 = marks.get("after_commit", marks["end"])
    drain0 = own0 + int(s.get("ownership", 0.0) * 1e9)
    snap0 = drain0 + int(s.get("drain", 0.0) * 1e9)
    return {
        "close+retire": (marks["start"], marks.get("before_prepare", marks["end"])),
        "prepare": (
            marks.get("before_prepare", marks["end"]),
            marks.get("after_prepare", marks["end"]),
        ),
        "commit": (marks.get("after_prepare", marks["end"]), own0),
        "ownership": (own0, drain0),
        "drain": (drain0, snap0),
        "snapshot": (snap0, marks.get("before_publish", marks["end"])),
        "publish": (
            marks.get("before_publish", marks["end"]),
            marks.get("after_publish", marks["end"]),
        ),
        "resume": (marks.get("before_resume", marks["end"]), marks["end"]),
    }


def _stage_row(
    name: str,
    w0: int,
    w1: int,
    stall: LoopStallMonitor,
    gcm: GcMonitor,
    gym_spans: list[tuple[int, int]],
    heartbeat: list[tuple[int, int]],
) -> dict[str, Any]:
    """One stage's row: its wall time, its longest task step (and the runtime's own, outside
    the Gym's tasks and calls and the collector's pauses), GC, the heartbeat, Gym calls."""
    longest = longest_cpu = longest_wait = 0
    who = ""
    over = 0
    runtime_worst = runtime_cpu = 0
    runtime_who = ""
    gc_spans = [(g0, g1) for g0, g1, _ in gcm.pauses]
    waits = stall.long_run_queue
    for i, (a, b, task, cpu) in enumerate(stall.long):
        if w0 <= a < w1:
            if b - a > longest:
                longest, who = b - a, task
                longest_wait = waits[i] if i < len(waits) else 0
            longest_cpu = max(longest_cpu, cpu)
            over += (b - a) > 10_000_000
            # the runtime's own work: not a task of the embedded Gym, not inside a Gym
            # call, and with the collector's pauses taken out
            if task.startswith("gymckpt.gym_adapter.") or _overlap(a, b, gym_spans):
                continue
            gc_in = _overlap(a, b, gc_spans)
            if b - a - gc_in > runtime_worst:
                runtime_worst, runtime_who = b - a - gc_in, task
                runtime_cpu = max(0, cpu - gc_in)
    gc_ns = _overlap(w0, w1, gc_spans)
    late = [d for t, d in heartbeat if w0 <= t < w1]
    return {
        "stage": name,
        "wall_ms": round((w1 - w0) / 1e6, 3),
        # null: no interval over 0.1 ms in this stage
        "max_loop_stall_ms": round(longest / 1e6, 3) if longest else None,
        "max_loop_stall_cpu_ms": round(longest_cpu / 1e6, 3) if longest else None,
        # of the longest stall: the loop thread runnable but waiting for a CPU (schedstat)
        "max_loop_stall_run_queue_ms": round(longest_wait / 1e6, 3) if longest else None,
        "max_stall_task": who,
        "stalls_over_10ms": over,
        "max_runtime_stall_excluding_gc_ms": (
            round(runtime_worst / 1e6, 3) if runtime_worst else None
        ),
        "max_runtime_stall_cpu_ms": round(runtime_cpu / 1e6, 3) if runtime_worst else None,
        "max_runtime_stall_task": runtime_who,
        "gc_pause_ms": round(gc_ns / 1e6, 3),
        "heartbeat_max_late_ms": round(max(late) / 1e6, 3) if late else None,
        "in_gym_calls_ms": round(_overlap(w0, w1, gym_spans) / 1e6, 3),
    }


def _gym_call_summary(spans: list[tuple[str, int, int]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for op, a, b in spans:
        out[f"{op}_ms_max"] = max(out.get(f"{op}_ms_max", 0.0), round((b - a) / 1e6, 3))
    return out


def checkpoint_worker(
    cfg: CheckpointConfig, verbose: bool, finish: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    clock = WarpClock()
    result: dict[str, Any] = trio.run(_checkpoint_main, cfg, clock, verbose, finish, clock=clock)
    return result


# -- dispatch throughput on the embedded Gym ------------------------------------------------------


class OneStepAgent:
    """The smallest episode a user can write: its first step ends it (the dispatch benchmark's
    ``one_step`` environment)."""

    name, kind = "agent", "simple_agent"

    def open(self, info: Any) -> dict[str, Any]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Any:
        from gymckpt.gym_adapter import Done

        return Done(reward=1.0)


DISPATCH_ENVIRONMENTS = ("one_step", "calendar")


async def _dispatch_main(cfg: CheckpointConfig, batch: int, environment: str) -> dict[str, Any]:
    from gymckpt.gym_adapter import EmbeddedGym, Environment, HostConfig
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig
    from gymckpt.nurseries import open_rollouts

    g = cfg.group_size
    rows = cfg.dispatch_rows // g
    with tempfile.TemporaryDirectory(prefix="gymckpt-bench-") as tmp:
        if environment == "one_step":
            opened = EmbeddedGym.host(
                Environment(agent=OneStepAgent()),
                instances=cfg.instances,
                seed=cfg.seed,
                work_dir=Path(tmp) / "gym",
                config=HostConfig(max_batch=batch),
            )
        else:
            sim = CalendarConfig(turns=(1, 1), turn_s=(0.01, 0.02), mutation_p=0.5, max_batch=batch)
            opened = EmbeddedGym.host(
                calendar_environment(config=sim),
                instances=cfg.instances,
                seed=cfg.seed,
                work_dir=Path(tmp) / "gym",
                config=sim.host_config(),
            )
        async with opened as gym:
            t0 = perf_ns()
            trained = 0
            async with open_rollouts(
                gym,
                Path(tmp) / "run",
                rows=rows,
                group_size=g,
                max_rows_in_flight=max(64, 4 * batch // g),
                batch_size=batch,
                restore=False,
            ) as ro:
                async for got in ro.batches(groups_per_step=max(1, batch // g)):
                    trained += len(got)
            wall = (perf_ns() - t0) / 1e9
    return {
        "environment": environment,
        "batch": batch,
        "rows_trained": trained,
        "attempts": trained * g,
        "seconds": round(wall, 3),
        "rows_per_s": round(trained * g / wall),
        "groups_per_s": round(trained / wall, 1),
    }


def dispatch_worker(cfg: CheckpointConfig) -> list[dict[str, Any]]:
    return [
        trio.run(_dispatch_main, cfg, b, env, clock=trio.testing.MockClock(autojump_threshold=0))
        for env in DISPATCH_ENVIRONMENTS
        for b in cfg.dispatch_batches
    ]


# -- driver ---------------------------------------------------------------------------------------


def run_checkpoint(cfg: CheckpointConfig, progress: Progress) -> dict[str, Any]:
    """Run both measurements in a fresh subprocess (see the module docstring)."""
    progress(f"checkpoint N={cfg.in_flight:,} on the embedded Gym (fresh subprocess)")
    cmd = [
        sys.executable,
        "-m",
        "gymckpt.benchmarks.checkpoint",
        "--worker",
        json.dumps(attrs.asdict(cfg)),
    ]
    if progress.enabled:
        cmd.append("--verbose")
    done = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=None if progress.enabled else subprocess.PIPE,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"checkpoint worker failed:\n{(done.stderr or '').strip()[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["config"] = attrs.asdict(cfg)
    for r in result.get("embedded_dispatch", []):
        env = "" if r["environment"] == "calendar" else f"{r['environment']}_"
        result[f"embedded_{env}rows_per_s_batch{r['batch']}"] = r["rows_per_s"]
    progress(
        f"checkpoint N={cfg.in_flight:,}: {result['e2e_s']:.2f} s close to resume "
        f"(+ {result['turn_time_wall_s']:.1f} s turn time), longest stall "
        f"{result['max_loop_stall_ms']:.1f} ms"
    )
    result["label"] = label(cfg.in_flight)
    return result


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--worker":
        raw = json.loads(argv[1])
        raw["turns"] = tuple(raw["turns"])
        raw["modes"] = tuple(raw["modes"])
        raw["dispatch_batches"] = tuple(raw["dispatch_batches"])
        cfg = CheckpointConfig(**raw)
        verbose = "--verbose" in argv
        if verbose:
            print(
                "[checkpoint] dispatch throughput on the embedded Gym", file=sys.stderr, flush=True
            )
        embedded_dispatch = dispatch_worker(cfg)

        def finish(result: dict[str, Any]) -> None:
            result["embedded_dispatch"] = embedded_dispatch
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # skip tearing down 200k simulated episodes (tens of seconds)

        checkpoint_worker(cfg, verbose, finish)
        return 1  # finish() exits
    print(
        "usage: python -m gymckpt.benchmarks.checkpoint --worker CONFIG_JSON [--verbose]",
        file=sys.stderr,
    )
    return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
