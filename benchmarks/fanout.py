"""Control fan-out on Ray and over HTTP: what one checkpoint's control calls cost as the
instances grow, on both transports in the same run.

For K = 1, 2, 4, 8, 16 instances (``--quick``: 1 and 2) and each backend (``--backend
ray|http|both``, default both; both alternate per size, Ray first): on Ray, on one local Ray
cluster started for the sweep (``address="local"``: never another process's cluster),
``RayGym.host`` starts K simulated Gym instances as Ray actors; over HTTP, ``HttpGym.spawn``
spawns K ``gymckpt serve`` processes on loopback (stopped when the size is done). Then
``open_rollouts`` runs the trainer facade on them. A few short
rows go through first (so every instance holds sessions and records to export), then the
trainer takes ``--checkpoints`` whole checkpoints (after one warm-up checkpoint that is not
counted). A proxy around the Gym times every control call per instance, as the trainer's loop
sees it (the Ray or HTTP round trip included).

Per K and per stage (prepare, commit, resume), medians over the checkpoints of:

* ``stage_ms``: the coordinator's stage wall time — the per-call cost the trainer pays;
* ``slowest_ms``: the slowest instance's call in that stage (what the stage must wait for);
* ``median_instance_ms``: the median instance's call;
* ``fanout_overhead_ms``: ``stage_ms - slowest_ms``, the trainer's own cost of fanning out.

The instances hold **no episode in flight** during the measured checkpoints, so ``prepare``
does not wait for a step boundary (that wait is the environment's turn time, which the
checkpoint benchmark reports): these are control-plane costs.

A model for 64 and more actors: each figure is fitted by least squares to ``a + b * K`` over
the measured K (R² reported), and evaluated at 64, 128 and 256. On this machine every actor is a
process sharing the same 2 cores, so the slope includes the actors' own work serialised on
those cores; the slope of ``fanout_overhead_ms`` is the part that stays on the trainer with a
core per actor.

Dispatch through the whole loop with 2 instances on each backend (``_dispatch``: one-turn
episodes of 10-20 ms, real time) runs ``dispatch_runs`` times per backend, alternating; the
medians are ``ray_dispatch`` and ``http.dispatch``, and ``http_over_ray`` gives every HTTP figure
as a ratio of Ray's (above 1: HTTP slower for a time, faster for rows/s).

Ray on 2 shared cores is slow and can fail to start (actors not placed, the GCS not
reachable): the sweep runs in a fresh subprocess with a deadline per size, and a size that fails
or times out is a result (``ok: false`` with the error), not a crash. The result's top level is
Ray's (as before HTTP was measured); HTTP's figures are under ``http``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractAsyncContextManager, aclosing
from pathlib import Path
from typing import Any, cast

import attrs
import trio

from gymckpt.gym_adapter import EnvironmentRef, HttpGym
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_from_environ_path,
)
from gymckpt.nurseries import ExitCode

from ._common import Progress, describe_error, median

__all__ = ["BACKENDS", "OPS", "FanoutConfig", "fit_linear", "http_over_ray", "run_fanout"]

BACKENDS = ("ray", "http")
"""The remote backends measured side by side: Ray actors, ``gymckpt serve`` processes."""

OPS = ("prepare", "commit", "resume")
MODEL_AT = (64, 128, 256)

perf = time.perf_counter


@attrs.define
class FanoutConfig:
    actors: tuple[int, ...] = (1, 2, 4, 8, 16)
    checkpoints: int = 5
    warmup: int = 1
    rows_per_actor: int = 2
    group_size: int = 2
    startup_timeout_s: float = 240.0
    size_timeout_s: float = 420.0
    gap_s: float = 0.3
    dispatch_attempts: int = 16_384
    dispatch_batch: int = 512
    dispatch_runs: int = 3
    backends: tuple[str, ...] = BACKENDS
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> FanoutConfig:
        return cls(
            actors=(1, 2),
            checkpoints=2,
            size_timeout_s=240.0,
            dispatch_attempts=1_024,
            dispatch_runs=1,
            quick=True,
        )


# -- the model -----------------------------------------------------------------------------


def fit_linear(xs: list[float], ys: list[float]) -> dict[str, Any] | None:
    """Least squares ``y = a + b x``: intercept, slope, R² and the fit at ``MODEL_AT``;
    None with fewer than two points."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for _, y in pts)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {
        "model": "a + b*K",
        "a_ms": round(a, 3),
        "b_ms_per_actor": round(b, 3),
        "r2": round(r2, 3),
        "points": n,
        "at": {str(k): round(a + b * k, 1) for k in MODEL_AT},
    }


# -- the measurement (in the worker subprocess) ---------------------------------------------


class _CallTimer:
    """Delegates to the Gym; records (op, instance, seconds) of every control call."""

    def __init__(self, gym: Any) -> None:
        self._gym = gym
        self.calls: list[tuple[str, str, float]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._gym, name)
        if name not in OPS:
            return attr

        async def timed(instance: str, *args: Any, **kwargs: Any) -> Any:
            t0 = perf()
            try:
                return await attr(instance, *args, **kwargs)
            finally:
                self.calls.append((name, instance, perf() - t0))

        return timed


def _deployment(
    backend: str, k: int, sim: CalendarConfig, work: Path, cfg: FanoutConfig
) -> AbstractAsyncContextManager[Any]:
    """K calendar instances on ``backend``: Ray actors on the cluster this process started, or
    spawned ``gymckpt serve`` processes (journals under ``work/gym``, every path the trainer
    names inside ``work``)."""
    if backend == "ray":
        from gymckpt.gym_adapter import RayGym

        return RayGym.host(
            EnvironmentRef.to(calendar_environment, config=sim),
            instances=k,
            work_dir=work / "gym",
            config=sim.host_config(),
            startup_timeout_s=cfg.startup_timeout_s,
        )
    if backend == "http":
        return HttpGym.spawn(
            calendar_from_environ_path(),
            k,
            work_dir=work / "gym",
            config=sim.host_config(),
            state_root=work,
            environ=sim.environ(),
            startup_timeout_s=cfg.startup_timeout_s,
        )
    raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")


async def _measure(
    k: int, cfg: FanoutConfig, work: Path, say: Any, backend: str = "ray"
) -> dict[str, Any]:
    from gymckpt.nurseries import open_rollouts
    from gymckpt.runtime import RuntimeConfig

    sim = CalendarConfig(turns=(1, 2), turn_s=(0.001, 0.005))
    rc = RuntimeConfig(control_timeout_s=45.0, drain_timeout_s=45.0)
    t0 = perf()
    async with _deployment(backend, k, sim, work, cfg) as gym:
        started_s = perf() - t0
        say(f"{k} {backend} instances started in {started_s:.1f} s")
        timer = _CallTimer(gym)
        rows = cfg.rows_per_actor * k
        per_ckpt: list[dict[str, Any]] = []
        async with open_rollouts(
            cast(Any, timer),
            work / "run",
            rows=rows,
            group_size=cfg.group_size,
            config=rc,
            max_rows_in_flight=rows,
            restore=False,
            handle_signals=False,
            keep_snapshots=1,
        ) as ro:
            trained = 0
            async with aclosing(ro.batches(rows)) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    trained += len(batch)
            for i in range(cfg.warmup + cfg.checkpoints):
                timer.calls.clear()
                c0 = perf()
                outcome = await ro.checkpoint()
                wall = perf() - c0
                if not outcome.ok:
                    raise RuntimeError(
                        f"checkpoint {i} with {k} {backend} instances failed: "
                        f"{outcome.reason}: {outcome.error}"
                    )
                if i >= cfg.warmup:
                    rec: dict[str, Any] = {"wall_ms": wall * 1e3}
                    for op in OPS:
                        calls = [s * 1e3 for o, _i, s in timer.calls if o == op]
                        rec[op] = {
                            "stage_ms": outcome.stage_s.get(op, math.nan) * 1e3,
                            "slowest_ms": max(calls, default=math.nan),
                            "median_instance_ms": median(calls),
                            "calls": len(calls),
                        }
                    per_ckpt.append(rec)
                await trio.sleep(cfg.gap_s)
    out: dict[str, Any] = {
        "actors": k,
        "backend": backend,
        "ok": True,
        "actor_start_s": round(started_s, 2),
        "rows_trained": trained,
        "checkpoints": len(per_ckpt),
        "checkpoint_wall_ms": round(median([r["wall_ms"] for r in per_ckpt]), 2),
    }
    for op in OPS:
        recs = [r[op] for r in per_ckpt]
        stage = median([r["stage_ms"] for r in recs])
        slow = median([r["slowest_ms"] for r in recs])
        out[op] = {
            "stage_ms": round(stage, 2),
            "slowest_ms": round(slow, 2),
            "median_instance_ms": round(median([r["median_instance_ms"] for r in recs]), 2),
            "fanout_overhead_ms": round(median([r["stage_ms"] - r["slowest_ms"] for r in recs]), 2),
            "calls_per_checkpoint": recs[0]["calls"] if recs else 0,
        }
    return out


async def _dispatch(cfg: FanoutConfig, work: Path, backend: str = "ray") -> dict[str, Any]:
    """Rows/s through the whole loop on ``backend`` with 2 instances: one-turn episodes
    (10-20 ms), dispatcher batches of ``dispatch_batch``, the trainer taking every group; real
    time (the instances' start-up is not counted)."""
    from gymckpt.nurseries import open_rollouts

    g, batch = 8, cfg.dispatch_batch
    sim = CalendarConfig(turns=(1, 1), turn_s=(0.01, 0.02), max_batch=batch)
    async with _deployment(backend, 2, sim, work, cfg) as gym:
        trained = 0
        t0 = perf()
        async with open_rollouts(
            gym,
            work / "run",
            rows=max(1, cfg.dispatch_attempts // g),
            group_size=g,
            max_rows_in_flight=max(64, 4 * batch // g),
            batch_size=batch,
            restore=False,
            handle_signals=False,
        ) as ro:
            steps = ro.batches(groups_per_step=max(1, batch // g))
            async with aclosing(steps) as batches:  # type: ignore[type-var]
                async for got in batches:
                    trained += len(got)
        wall = perf() - t0
    return {
        "ok": True,
        "backend": backend,
        "actors": 2,
        "attempts": trained * g,
        "batch": batch,
        "seconds": round(wall, 3),
        "rows_per_s": round(trained * g / wall),
    }


def _worker(cfg: FanoutConfig, verbose: bool) -> None:
    """One JSON line per size and backend on stdout, as each finishes (the parent keeps what
    arrived); then one per dispatch run. The Ray cluster is started only if Ray is measured."""

    def say(msg: str) -> None:
        if verbose:
            print(f"[fanout] {msg}", file=sys.stderr, flush=True)

    def emit(rec: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()

    backends = list(cfg.backends)
    if "ray" in backends:
        try:
            import ray

            t0 = perf()
            ray.init(
                address="local",
                include_dashboard=False,
                object_store_memory=100 * 2**20,
                log_to_driver=False,
            )
            emit({"cluster_start_s": round(perf() - t0, 2)})
            say(f"local Ray cluster up in {perf() - t0:.1f} s")
        except Exception as exc:
            emit({"cluster_error": describe_error(exc)[:2000]})
            backends.remove("ray")
    for k in cfg.actors:
        for backend in backends:
            say(f"{k} {backend} instances: starting")
            try:
                with tempfile.TemporaryDirectory(prefix="gymckpt-fanout-") as tmp:
                    rec = trio.run(_measure, k, cfg, Path(tmp), say, backend)
            except Exception as exc:
                rec = {
                    "actors": k,
                    "backend": backend,
                    "ok": False,
                    "error": describe_error(exc)[:2000],
                }
            say(
                f"{k} {backend} instances: "
                + (
                    f"prepare {rec['prepare']['stage_ms']:.1f} ms, commit "
                    f"{rec['commit']['stage_ms']:.1f} ms, resume "
                    f"{rec['resume']['stage_ms']:.1f} ms (medians)"
                    if rec["ok"]
                    else f"FAILED: {rec['error']}"
                )
            )
            emit(rec)
    for i in range(cfg.dispatch_runs if cfg.dispatch_attempts > 0 else 0):
        for backend in backends:
            say(
                f"dispatch on {backend}, 2 instances, run {i + 1}: "
                f"{cfg.dispatch_attempts:,} episodes"
            )
            try:
                with tempfile.TemporaryDirectory(prefix="gymckpt-fanout-") as tmp:
                    disp = trio.run(_dispatch, cfg, Path(tmp), backend)
                say(f"dispatch on {backend}: {disp['rows_per_s']:,} rows/s")
            except Exception as exc:
                disp = {"ok": False, "backend": backend, "error": describe_error(exc)[:2000]}
            emit({"dispatch": disp})
    if "ray" in backends:
        import ray

        ray.shutdown()


# -- the driver -----------------------------------------------------------------------------


def _dispatch_median(runs: list[dict[str, Any]], why: str) -> dict[str, Any]:
    """The dispatch runs of one backend: the median run's figures and every run's rows/s; a
    backend with no run that finished is ``ok: false`` with the (first) error."""
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return {"ok": False, "error": runs[0]["error"] if runs else f"not measured: {why}"}
    mid = sorted(ok, key=lambda r: r["rows_per_s"])[(len(ok) - 1) // 2]
    return {
        **mid,
        "rows_per_s": round(median([r["rows_per_s"] for r in ok])),
        "runs_rows_per_s": [r["rows_per_s"] for r in ok],
        "runs_failed": len(runs) - len(ok),
    }


def _sweep(
    cfg: FanoutConfig, sizes: dict[int, dict[str, Any]], why: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One backend's sizes in ``cfg.actors`` order (a missing one failed, saying ``why``) and
    the linear models of its figures."""
    results = [
        sizes.get(k) or {"actors": k, "ok": False, "error": f"not measured: {why}"}
        for k in cfg.actors
    ]
    ok = [r for r in results if r["ok"]]
    xs = [float(r["actors"]) for r in ok]
    models = {
        f"{op}_{fig}": fit_linear(xs, [r[op][fig] for r in ok])
        for op in OPS
        for fig in ("stage_ms", "slowest_ms", "fanout_overhead_ms")
    }
    return results, models


def http_over_ray(ray: dict[str, Any], http: dict[str, Any]) -> dict[str, Any]:
    """Every HTTP figure as a ratio of Ray's, same size (None where either failed): per size
    and stage the coordinator's stage time and the slowest instance's call, and the dispatch
    rows/s; above 1 the HTTP time is longer (and its rows/s higher)."""

    def ratio(h: float | None, r: float | None) -> float | None:
        return None if h is None or r is None or r <= 0 else round(h / r, 3)

    rs = {r["actors"]: r for r in ray["results"] if r["ok"]}
    sizes: dict[str, Any] = {}
    for h in http["results"]:
        r = rs.get(h["actors"])
        if not h["ok"] or r is None:
            continue
        sizes[str(h["actors"])] = {
            "checkpoint_wall": ratio(h["checkpoint_wall_ms"], r["checkpoint_wall_ms"]),
            **{
                op: {
                    "stage": ratio(h[op]["stage_ms"], r[op]["stage_ms"]),
                    "slowest": ratio(h[op]["slowest_ms"], r[op]["slowest_ms"]),
                }
                for op in OPS
            },
        }
    rd, hd = ray["dispatch"], http["dispatch"]
    return {
        "sizes": sizes,
        "dispatch_rows_per_s": ratio(
            hd.get("rows_per_s") if hd.get("ok") else None,
            rd.get("rows_per_s") if rd.get("ok") else None,
        ),
    }


def run_fanout(cfg: FanoutConfig, progress: Progress) -> dict[str, Any]:
    """The sweep in a fresh subprocess; sizes that did not finish are reported as failed.
    Ray's figures at the top level, HTTP's under ``http``, ratios under ``http_over_ray``."""
    progress(
        f"fan-out on {' and '.join(cfg.backends)}: {', '.join(map(str, cfg.actors))} "
        "instances (fresh subprocess)"
    )
    lines, cluster, why = _run_worker(cfg, progress)
    per = _per_backend(cfg, lines, cluster, why)
    ray, http = per["ray"], per["http"]
    out: dict[str, Any] = {
        "actors": list(cfg.actors),
        "backends": list(cfg.backends),
        "ray_dispatch": ray["dispatch"],
        "ray_2_actors_rows_per_s": ray["dispatch"].get("rows_per_s"),
        "http_2_servers_rows_per_s": http["dispatch"].get("rows_per_s"),
        "sizes_ok": ray["sizes_ok"],
        "sizes_failed": ray["sizes_failed"],
        "cluster_start_s": cluster.get("cluster_start_s"),
        "results": ray["results"],
        "models": ray["models"],
        "http": http,
        "http_over_ray": http_over_ray(ray, http),
        "config": attrs.asdict(cfg),
    }
    out.update(_flat_figures(per))
    for backend in cfg.backends:
        for r in per[backend]["results"]:
            progress(
                f"fan-out {r['actors']} {backend} instances: "
                + (
                    f"prepare {r['prepare']['stage_ms']} ms, commit {r['commit']['stage_ms']} ms, "
                    f"resume {r['resume']['stage_ms']} ms"
                    if r["ok"]
                    else f"FAILED ({r['error']})"
                )
            )
    return out


def _run_worker(
    cfg: FanoutConfig, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Run the worker under its deadline: its JSON lines, the cluster's line, and why a size
    that has no line did not finish."""
    cmd = [
        sys.executable,
        "-m",
        "gymckpt.benchmarks.fanout",
        "--worker",
        json.dumps(attrs.asdict(cfg)),
    ]
    if progress.enabled:
        cmd.append("--verbose")
    deadline = 120.0 + cfg.size_timeout_s * len(cfg.actors) * len(cfg.backends)
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
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and the Ray processes it started
        stdout, stderr = proc.communicate()
    lines = [json.loads(line) for line in (stdout or "").splitlines() if line.startswith("{")]
    cluster: dict[str, Any] = next(
        (r for r in lines if "cluster_start_s" in r or "cluster_error" in r), {}
    )
    why = (
        f"the sweep passed its {deadline:.0f} s deadline" if timed_out else None
    ) or f"the worker exited with code {proc.returncode}: {(stderr or '').strip()[-1500:]}"
    return lines, cluster, why


def _per_backend(
    cfg: FanoutConfig, lines: list[dict[str, Any]], cluster: dict[str, Any], why: str
) -> dict[str, dict[str, Any]]:
    """Each backend's sizes, models and dispatch from the worker's lines."""
    per: dict[str, dict[str, Any]] = {}
    for backend in BACKENDS:
        b_why = (cluster.get("cluster_error") if backend == "ray" else None) or why
        if backend not in cfg.backends:
            b_why = "not asked for (--backend)"
        sizes = {
            r["actors"]: r for r in lines if "actors" in r and r.get("backend", "ray") == backend
        }
        results, models = _sweep(cfg, sizes, b_why)
        runs = [r["dispatch"] for r in lines if r.get("dispatch", {}).get("backend") == backend]
        per[backend] = {
            "results": results,
            "models": models,
            "dispatch": _dispatch_median(runs, b_why),
            "sizes_ok": sum(r["ok"] for r in results),
            "sizes_failed": [r["actors"] for r in results if not r["ok"]],
        }
    return per


def _flat_figures(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each size's stage and slowest instance, and the model at 64, as top-level keys."""
    out: dict[str, Any] = {}
    for backend, prefix in (("ray", ""), ("http", "http_")):
        for r in per[backend]["results"]:
            if not r["ok"]:
                continue
            unit = "actors" if backend == "ray" else "servers"
            for op in OPS:
                out[f"{prefix}{op}_ms_{r['actors']}_{unit}"] = r[op]["stage_ms"]
                out[f"{prefix}{op}_slowest_ms_{r['actors']}_{unit}"] = r[op]["slowest_ms"]
        for op in OPS:
            m = per[backend]["models"][f"{op}_stage_ms"]
            unit = "actors" if backend == "ray" else "servers"
            out[f"{prefix}{op}_ms_model_64_{unit}"] = None if m is None else m["at"]["64"]
    return out


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--worker":
        raw = json.loads(argv[1])
        raw["actors"] = tuple(raw["actors"])
        raw["backends"] = tuple(raw["backends"])
        _worker(FanoutConfig(**raw), "--verbose" in argv)
        return 0
    print(
        "usage: python -m gymckpt.benchmarks.fanout --worker CONFIG_JSON [--verbose]",
        file=sys.stderr,
    )
    return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
