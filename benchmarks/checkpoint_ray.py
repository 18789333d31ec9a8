"""Checkpoint end to end on Ray or over HTTP: one whole checkpoint per mode at N in flight over
K actors or K ``gymckpt serve`` processes.

The counterpart of ``benchmarks.checkpoint`` (the embedded Gym) with each Gym instance a Ray
actor in its own process: on a local Ray cluster of our own (``local_cluster_options``),
``RayGym.host`` starts K instances of the heavy-tailed workplace (``benchmarks._heavy``), and
the trainer facade ``nurseries.open_rollouts`` runs on them with ``max_rows_in_flight = N /
group_size``. Once the dispatcher has N episodes in flight, one ``Rollouts.checkpoint()`` per
mode (unaligned, then aligned, on the same episodes) runs its whole protocol, measured by the
same code as the embedded run (``checkpoint.measure_checkpoint``): per-stage wall time, the
trainer loop's longest stall (all causes, GC included), its longest scheduler batch, GC pauses,
a 1 ms heartbeat, CPU time, the snapshot on disk, and — from the episodes' own records, which
each actor appends to a file the trainer polls — the time until every episode moves again and
the pause each episode felt.

Time is real throughout (Ray actors cannot share a virtual clock), so the episodes tick while
Gym is filled. They are long — 40 to 60 turns — and their turns (lognormal, sigma 2, capped at
21 times the median) are long enough that nothing finishes before the checkpoints (reported:
``finished_before_checkpoint``) and that K actors sharing this machine's cores keep up with the
turns (about 2,500 turn ends a second in all): the mean turn is ``max(20, N / 2,500)`` seconds
unless ``turn_mean_s`` is given, 80 s at 200k. The aligned ``prepare`` waits for every episode
to reach its next step boundary: up to the longest turn in flight, the cap (7.6 min at 200k),
the environment's time, not the runtime's. ``e2e_s`` is the checkpoint's wall time (close to
resume) less ``prepare``'s (``turn_time_wall_s``); on Ray that also leaves out the actors' own
parking work, which ``in_gym_calls_ms`` of the prepare stage shows.

Over HTTP (``backend="http"``) the same, with ``HttpGym.spawn`` starting K ``gymckpt serve``
processes of the heavy workplace (``_heavy.heavy_from_environ``, its arguments in an environment
variable; each server's ``--max-streams`` and the client's stream pool sized for N in flight).
``run_remote_checkpoints`` runs Ray, then HTTP, each in its own fresh subprocess, and gives
Ray's result with HTTP's under ``http`` and HTTP's figures as ratios of Ray's
(``http_over_ray``): ``gymckpt bench checkpoint --backend both``.

Per stage, besides the embedded run's figures, the slowest and the median actor's time inside
Gym calls (``gym_calls_by_op``): a stage over K actors waits for its slowest one.

The run is in a fresh subprocess, in its own process group, which starts the cluster on its main
thread (as ``benchmarks.fanout`` does; see ``_worker`` for why) and shuts Ray down as soon as the
result is out (200k episodes are not torn down one by one); the parent then kills whatever of
that group is left, and a run that passes its deadline is killed the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import trio

from gymckpt.nurseries import ExitCode

from ._common import Progress, describe_error, label, open_sockets
from ._heavy import (
    HEAVY_FROM_ENVIRON,
    PauseSource,
    TurnTimes,
    heavy_environ,
    heavy_refs,
    host_config,
)
from .checkpoint import (
    MODES,
    TURN_CAP,
    TURN_SIGMA,
    _TimedGym,
    measure_checkpoint,
    measured_runtime_config,
    mode_config,
)

__all__ = [
    "GYM_OPS",
    "CheckpointRayConfig",
    "run_checkpoint_ray",
    "run_remote_checkpoints",
    "turn_mean",
]

GYM_OPS = {
    "topology": "close+retire",
    "retire": "close+retire",
    "prepare": "prepare",
    "commit": "commit",
    "resume": "resume",
}
"""Gym call -> the stage of the report it runs in (``topology``: asked once, at a run's first
checkpoint, before admission closes; one call covering every actor)."""

TURN_ENDS_PER_S = 2_500
"""Turn ends a second, over all actors, that the default turn length aims at."""


def turn_mean(in_flight: int) -> float:
    """The default mean turn length for ``in_flight`` episodes: ``max(20, N / 2,500)`` s."""
    return max(20.0, in_flight / TURN_ENDS_PER_S)


@attrs.define
class CheckpointRayConfig:
    in_flight: int = 200_000
    actors: int = 4
    group_size: int = 8
    dispatch_batch: int = 512
    turns: tuple[int, int] = (40, 60)
    turn_sigma: float = TURN_SIGMA
    turn_cap: float = TURN_CAP
    turn_mean_s: float | None = None  # None: turn_mean(in_flight)
    modes: tuple[str, ...] = MODES
    control_s: float = 3.0
    after_s: float = 2.0
    startup_timeout_s: float = 240.0
    fill_timeout_s: float = 1200.0
    seed: int = 3
    backend: str = "ray"
    """``ray`` (actors) or ``http`` (spawned ``gymckpt serve`` processes); ``actors`` counts
    either."""
    instance_niceness: int | None = None
    """How many steps below the trainer the instance processes run; None: the deployments'
    default."""
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> CheckpointRayConfig:
        # short turns: the aligned checkpoint waits up to the cap (21 times the median)
        return cls(in_flight=2_000, turn_mean_s=2.0, after_s=0.5, control_s=1.0, quick=True)

    def times(self) -> TurnTimes:
        mean = self.turn_mean_s or turn_mean(self.in_flight)
        return TurnTimes.with_mean(mean, self.turn_sigma, self.turn_cap)


def _per_actor(calls: list[tuple[str, str, int, int]]) -> dict[str, dict[str, Any]]:
    """Per Gym call (``GYM_OPS``): each actor's time inside it (summed over its calls), the
    slowest and the median actor, the number of calls and the stage it runs in."""
    out: dict[str, dict[str, Any]] = {}
    for op, stage in GYM_OPS.items():
        per: dict[str, int] = {}
        n = 0
        for o, who, t0, t1 in calls:
            if o == op:
                per[who] = per.get(who, 0) + (t1 - t0)
                n += 1
        if not per:
            continue
        slowest = max(per, key=lambda k: per[k])
        out[op] = {
            "stage": stage,
            "slowest_actor_ms": round(per[slowest] / 1e6, 3),
            "slowest_actor": slowest,
            "median_actor_ms": round(statistics.median(per.values()) / 1e6, 3),
            "calls": n,
        }
    return out


def _deployment(cfg: CheckpointRayConfig, tmp: Path, records: Path) -> Any:
    """The K instances of the heavy workplace on ``cfg.backend`` (an async context manager);
    journals under ``tmp/gym``, the trainer's paths inside ``tmp``."""
    times = cfg.times()
    config = host_config(cfg.dispatch_batch, 0.05)
    niceness = {} if cfg.instance_niceness is None else {"instance_niceness": cfg.instance_niceness}
    if cfg.backend == "ray":
        from gymckpt.gym_adapter import RayGym

        return RayGym.host(
            heavy_refs(cfg.actors, cfg.turns, times, str(records)),
            cfg.actors,
            cfg.seed,
            tmp / "gym",
            config,
            (),
            None,
            num_cpus=0.1,
            startup_timeout_s=cfg.startup_timeout_s,
            **niceness,
        )
    if cfg.backend == "http":
        from gymckpt.gym_adapter import HttpGym

        # the streams share each server's reply channels (http-wire.md section 7): the
        # client's default pools bound its sockets whatever the number in flight
        return HttpGym.spawn(
            HEAVY_FROM_ENVIRON,
            cfg.actors,
            work_dir=tmp / "gym",
            config=config,
            seed=cfg.seed,
            state_root=tmp,
            environ=heavy_environ(cfg.turns, times, str(records)),
            startup_timeout_s=cfg.startup_timeout_s,
            **niceness,
        )
    raise ValueError(f"unknown backend {cfg.backend!r} (ray or http)")


async def _remote_main(
    cfg: CheckpointRayConfig, verbose: bool, finish: Callable[[dict[str, Any]], None]
) -> None:
    """Measure; ``finish(result)`` is called before anything is torn down (it exits)."""
    from gymckpt.nurseries import open_rollouts

    def say(msg: str) -> None:
        if verbose:
            print(f"[checkpoint-{cfg.backend}] {msg}", file=sys.stderr, flush=True)

    n, g = cfg.in_flight, cfg.group_size
    times = cfg.times()
    rc = measured_runtime_config()
    say(
        f"starting {cfg.actors} {cfg.backend} instances (turns {cfg.turns[0]}-"
        f"{cfg.turns[1]}, lognormal median {times.median_s:g} s, cap {times.max_s:g} s)"
    )
    t_start = time.perf_counter()
    async with trio.open_nursery() as top:
        with tempfile.TemporaryDirectory(prefix="gymckpt-bench-ray-") as tmp:
            records = Path(tmp) / "pauses"
            records.mkdir()
            async with _deployment(cfg, Path(tmp), records) as gym:
                started_s = time.perf_counter() - t_start
                say(
                    f"{cfg.actors} {cfg.backend} instances up in {started_s:.1f} s; "
                    f"filling to {n:,}"
                )
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
                    handle_signals=False,
                ) as ro:
                    dispatched, finished, fill_s = await _fill(cfg, ro.ledger, say)
                    sockets = [await trio.to_thread.run_sync(open_sockets)]  # at the peak
                    src = PauseSource(records, in_process=False, episodes=dispatched)
                    modes = await _measure_modes(cfg, ro, timed, rc, top, dispatched, src, say)
                    sockets.append(await trio.to_thread.run_sync(open_sockets))
                    out = dict(modes.get("aligned") or modes[cfg.modes[0]])
                    out.update(
                        {
                            "modes": modes,
                            "backend": cfg.backend,
                            "actors": cfg.actors,
                            "instance_niceness": cfg.instance_niceness,
                            "in_flight": dispatched,
                            "finished_before_checkpoint": finished,
                            "turn_times": times.describe(),
                            "actors_start_s": round(started_s, 2),
                            "fill_wall_s": round(fill_s, 2),
                            "fill_rows_per_s": round(dispatched / fill_s),
                            "client_sockets_max": max(
                                (c for c in sockets if c is not None), default=None
                            ),
                        }
                    )
                    finish(out)


async def _fill(
    cfg: CheckpointRayConfig, ledger: Any, say: Callable[[str], None]
) -> tuple[int, int, float]:
    """Wait (at most ``cfg.fill_timeout_s``) until ``cfg.in_flight`` attempts are dispatched:
    how many are, how many finished meanwhile, and how long it took."""
    n = cfg.in_flight
    t0 = time.perf_counter()
    last = t0
    with trio.fail_after(cfg.fill_timeout_s):
        while ledger.statistics().by_state["dispatched"] < n:
            await trio.sleep(0.2)
            if time.perf_counter() - last > 5:
                last = time.perf_counter()
                say(f"dispatched {ledger.statistics().by_state['dispatched']:,}/{n:,}")
    fill_s = time.perf_counter() - t0
    stats = ledger.statistics()
    dispatched = stats.by_state["dispatched"]
    finished = stats.by_state.get("completed", 0) + stats.failed_total + stats.abandoned_total
    say(
        f"{dispatched:,} in flight after {fill_s:.1f} s "
        f"({dispatched / fill_s:,.0f} rows/s); checkpointing"
    )
    return dispatched, finished, fill_s


async def _measure_modes(
    cfg: CheckpointRayConfig,
    ro: Any,
    timed: _TimedGym,
    rc: Any,
    top: trio.Nursery,
    dispatched: int,
    src: PauseSource,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """One measured checkpoint per mode, in ``cfg.modes``' order, with each mode's Gym calls
    per instance."""
    from gymckpt.nurseries import STAGES

    modes: dict[str, Any] = {}
    for mode in cfg.modes:
        ro.coordinator.config = mode_config(rc, mode)
        timed.reference_protocol = mode == "aligned"
        say(f"{mode} checkpoint")
        calls0 = len(timed.calls)
        r = await measure_checkpoint(
            ro,
            timed.spans,
            STAGES,
            nursery=top,
            dispatched=dispatched,
            pause_collector=rc.pause_collector,
            after_s=cfg.after_s,
            say=say,
            pauses=src,
            control_s=cfg.control_s,
        )
        r["checkpoint_mode"] = mode
        r["gym_calls_by_op"] = _per_actor(timed.calls[calls0:])
        modes[mode] = r
        timed.spans.clear()
    return modes


def _shutdown_and_exit(ray_started: bool) -> None:
    """Stop the Ray cluster this process started (its actors with their 200k episodes are
    killed, not torn down), then exit at once; never wait more than 60 s for Ray. Spawned
    ``gymckpt serve`` processes die with this process (their parent-death signal)."""
    threading.Timer(60.0, os._exit, (0,)).start()
    try:
        if ray_started:
            import ray

            ray.shutdown()
    finally:
        os._exit(0)


def _worker(cfg: CheckpointRayConfig, verbose: bool) -> None:
    """Start the local cluster on this (the main) thread, as ``benchmarks.fanout`` does (its
    start-up is then timed on its own), then measure; ``RayGym.host`` uses the connection it
    finds.

    Left to ``RayGym.host``, ``ray.init`` runs on a trio worker thread, and Ray binds the GCS
    and raylet it starts to the starting thread (``PR_SET_PDEATHSIG``), which trio's thread
    cache retires after 10 s idle. Three 200k fills started that way lost their GCS and raylet
    (SIGKILL, nothing in their logs) 25 to 40 s in. But in a direct test that thread's
    retirement did not kill the cluster, so the likelier cause was outside this process (the
    machine is shared): starting the cluster here is a precaution, not a fix. Over HTTP no
    cluster is started.
    """
    ray_started = cfg.backend == "ray"
    cluster_s = None
    if ray_started:
        import ray

        from gymckpt.gym_adapter import local_cluster_options

        t0 = time.perf_counter()
        niceness = (
            {} if cfg.instance_niceness is None else {"instance_niceness": cfg.instance_niceness}
        )
        ray.init(**local_cluster_options(**niceness))
        cluster_s = round(time.perf_counter() - t0, 2)

    def finish(result: dict[str, Any]) -> None:
        result["cluster_start_s"] = cluster_s
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
        _shutdown_and_exit(ray_started)

    try:
        trio.run(_remote_main, cfg, verbose, finish)
    except Exception as exc:  # the parent's error names the cause, stderr shown or not
        sys.stdout.write(json.dumps({"worker_error": describe_error(exc)[:4000]}) + "\n")
        sys.stdout.flush()
        raise
    finally:
        if ray_started:
            import ray

            ray.shutdown()


def run_checkpoint_ray(cfg: CheckpointRayConfig, progress: Progress) -> dict[str, Any]:
    """The measurement in a fresh subprocess (see the module docstring); raises
    ``RuntimeError`` with the worker's last output if it fails or passes its deadline."""
    progress(
        f"checkpoint N={cfg.in_flight:,} on {cfg.backend} with {cfg.actors} instances "
        "(fresh subprocess)"
    )
    cmd = [
        sys.executable,
        "-m",
        "gymckpt.benchmarks.checkpoint_ray",
        "--worker",
        json.dumps(attrs.asdict(cfg)),
    ]
    if progress.enabled:
        cmd.append("--verbose")
    deadline = cfg.startup_timeout_s + cfg.fill_timeout_s + 1200.0
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        stderr=None if progress.enabled else subprocess.PIPE,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    with contextlib.suppress(ProcessLookupError):  # Ray's processes the worker left behind
        os.killpg(proc.pid, signal.SIGKILL)
    line = next((s for s in (stdout or "").splitlines() if s.startswith("{")), None)
    if line is None:
        why = (
            f"passed its {deadline:.0f} s deadline"
            if timed_out
            else f"exited with code {proc.returncode}"
        )
        raise RuntimeError(
            f"checkpoint on {cfg.backend}: the worker {why}:\n{(stderr or '').strip()[-4000:]}"
        )
    result: dict[str, Any] = json.loads(line)
    if "worker_error" in result:
        raise RuntimeError(f"checkpoint on {cfg.backend}: {result['worker_error']}")
    result["config"] = {**attrs.asdict(cfg), "turn_times": cfg.times().describe()}
    result["label"] = label(cfg.in_flight)
    progress(
        f"checkpoint N={cfg.in_flight:,} on {cfg.backend}, {cfg.actors} instances: "
        f"{result['e2e_s']:.2f} s close to resume (+ {result['turn_time_wall_s']:.1f} s "
        f"turn time), longest stall {result['max_loop_stall_ms']:.1f} ms"
    )
    return result


def failed_result(cfg: CheckpointRayConfig, exc: BaseException) -> dict[str, Any]:
    """The result of a run that could not measure (the worker died or passed its deadline)."""
    return {
        "checkpoint_ok": False,
        "error": str(exc)[-2000:],
        "in_flight": cfg.in_flight,
        "actors": cfg.actors,
        "backend": cfg.backend,
        "config": {**attrs.asdict(cfg), "turn_times": cfg.times().describe()},
    }


RATIO_KEYS = ("e2e_s", "checkpoint_wall_s", "max_loop_stall_ms", "fill_rows_per_s")
"""The figures ``http_over_ray`` divides (HTTP's by Ray's)."""


def run_remote_checkpoints(
    cfg: CheckpointRayConfig, backends: tuple[str, ...], progress: Progress
) -> dict[str, Any]:
    """The checkpoint on each of ``backends`` (``ray``, ``http``), one after the other, each in
    its own fresh subprocess at the same size; with two, a backend that fails is a result (its
    error), not the end of the run; with one, its ``RuntimeError``. With both: Ray's result,
    HTTP's under ``http`` and ``RATIO_KEYS`` (overall and per mode's ``until_all_moving_s``)
    as HTTP/Ray under ``http_over_ray``."""
    if len(backends) == 1:  # on its own, a failure is the command's (RuntimeError)
        return run_checkpoint_ray(attrs.evolve(cfg, backend=backends[0]), progress)
    got: dict[str, dict[str, Any]] = {}
    for backend in backends:
        one = attrs.evolve(cfg, backend=backend)
        try:
            got[backend] = run_checkpoint_ray(one, progress)
        except RuntimeError as exc:
            progress(f"checkpoint on {backend} FAILED: {exc}")
            got[backend] = failed_result(one, exc)
    ray, http = got["ray"], got["http"]

    def ratio(h: Any, r: Any) -> float | None:
        ok = isinstance(h, int | float) and isinstance(r, int | float) and r > 0
        return round(h / r, 3) if ok else None

    ratios = {k: ratio(http.get(k), ray.get(k)) for k in RATIO_KEYS}
    for mode in cfg.modes:
        hm, rm = (http.get("modes") or {}).get(mode), (ray.get("modes") or {}).get(mode)
        if hm and rm:
            ratios[f"{mode}_until_all_moving_s"] = ratio(
                hm.get("until_all_moving_s"), rm.get("until_all_moving_s")
            )
    return {**ray, "http": http, "http_over_ray": ratios}


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--worker":
        raw = json.loads(argv[1])
        raw["turns"] = tuple(raw["turns"])
        raw["modes"] = tuple(raw["modes"])
        _worker(CheckpointRayConfig(**raw), "--verbose" in argv)
        return 1  # finish() exits
    print(
        "usage: python -m gymckpt.benchmarks.checkpoint_ray --worker CONFIG_JSON [--verbose]",
        file=sys.stderr,
    )
    return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
