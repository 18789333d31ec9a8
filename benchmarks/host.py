"""The Gym host's cost on a real environment (Gymnasium CartPole-v1, random policy).

1. **Per-step overhead against plain Gymnasium**, same environment and policy, same run. The
   baseline plays E episodes with plain Gymnasium: ``make``, ``reset(seed)``, then per step the
   policy (its per-call generator included, as the host does) and ``env.step``. The host plays
   the same E episodes as one ``run`` of E rows on an in-process ``GymHost`` (trio): per step a
   step boundary, the agent's ``step``, a model call through the model proxy (captured under its
   capture key), the environment's session lookup (fenced), and per episode the payload check
   and the reply stream. Both produce the same trajectories (checked). Reported: µs per step of
   each (medians over trials), the host's overhead per step and the ratio; and the same host
   with ``HostConfig(boundary_marks="on_demand")`` in the same trials (``host_on_demand_*``:
   what an aligned run that never cuts costs, no boundary marks), and the same environment
   opted out of unaligned cuts (``Environment(unaligned=False)``, no marks ever) in the same
   trials: ``marks_on_demand_us_per_step`` is what marks cost a step of the on-demand host in
   an aligned run (the issue's "marks in aligned mode": 0 when none is taken). The two do the
   same work a step (no mark function is called, counted by ``tests/test_host_step_path.py``),
   so what this difference shows is the noise of two medians.
2. **Episodes per second through the whole loop** (``open_rollouts``: dispatcher, ledger,
   streams, trainer batches; no checkpoints), embedded with 2 instances vs Ray with 2 actors,
   same rows. Ray's cluster and actor start-up are outside the timed part.
3. **The unaligned mode's per-step cost** (its boundary marks: at every step boundary one
   ``export`` per participant and one ``orjson.dumps``), in the same run: each environment
   hosted as it is (marks on) and with ``Environment(unaligned=False)`` (opted out), the two
   interleaved within each trial, on CartPole (the same episodes as 1.) and on the calendar
   workplace with long episodes (a multi-turn environment whose retained calendar grows by one
   event a turn, so a mark serialises a growing history; no turn time). Reported: µs per step
   of each (medians over trials) and the mode's overhead as a ratio of a step opted out (the
   median of the per-trial ratios); the target is <= 10 % on CartPole.
"""

from __future__ import annotations

import statistics
import time
from contextlib import aclosing
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import attrs
import trio

from gymckpt.gym_adapter import Completed, EmbeddedGym, GymHost, HostConfig, RunReply, RunRow
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig
from gymckpt.runtime._shared import converter

from ._common import Progress

__all__ = ["HostBenchConfig", "run_host"]

ENV_ID = "CartPole-v1"


@attrs.define
class HostBenchConfig:
    episodes: int = 256
    trials: int = 5
    loop_rows: int = 256
    group_size: int = 4
    ray: bool = True
    quick: bool = False
    calendar_episodes: int = 64
    calendar_turns: int = 50

    @classmethod
    def quick_defaults(cls) -> HostBenchConfig:
        return cls(
            episodes=32,
            trials=2,
            loop_rows=16,
            ray=False,
            quick=True,
            calendar_episodes=8,
            calendar_turns=10,
        )


def _plain(episodes: int, seed: int) -> tuple[float, int, list[Any]]:
    from gymckpt.gym_adapter.environments.gymnasium import reference_trajectory

    t0 = time.perf_counter()
    trajs = [reference_trajectory(ENV_ID, seed, row, 0) for row in range(episodes)]
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(t.actions) for t in trajs), trajs


async def _hosted(
    episodes: int, seed: int, work: Path, marks: bool = True, boundary_marks: str = "always"
) -> tuple[float, int, dict[int, Any], float]:
    """(wall seconds, steps, payload per row, CPU seconds) of one run of ``episodes`` rows
    (``boundary_marks`` as ``HostConfig``'s: ``"on_demand"`` is an aligned run's host)."""
    from gymckpt.gym_adapter.environments.gymnasium import gymnasium_environment

    env = attrs.evolve(gymnasium_environment(ENV_ID), unaligned=marks)
    got: dict[int, Any] = {}
    config = HostConfig(boundary_marks=boundary_marks)
    async with GymHost("bench-0", env, seed, work, config=config) as host:
        rows = [RunRow(f"{r}-0", r, 0, 0) for r in range(episodes)]
        t0, c0 = time.perf_counter(), time.process_time()
        replies: list[RunReply] = []
        async for batch in await host.run(rows):
            replies.extend(batch)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    for r in replies:
        assert isinstance(r, Completed), r
        got[int(r.rollout_id.split("-")[0])] = r.payload
    return elapsed, sum(len(p["actions"]) for p in got.values()), got, cpu


def _overhead(cfg: HostBenchConfig, progress: Progress) -> dict[str, Any]:
    plain_us: list[float] = []
    host_us: list[float] = []
    on_demand_us: list[float] = []
    opted_out_us: list[float] = []
    steps = 0
    _plain(4, 99)  # warm-up, not counted: imports, converter hooks built on first use
    with TemporaryDirectory() as tmp:
        trio.run(_hosted, 4, 99, Path(tmp))
    for trial in range(cfg.trials):
        seed = 100 + trial
        p_s, p_steps, trajs = _plain(cfg.episodes, seed)
        runs: dict[str, tuple[float, int, dict[int, Any], float]] = {}
        order = ("always", "on_demand", "opted_out")
        for marks in order if trial % 2 == 0 else order[::-1]:
            with TemporaryDirectory() as tmp:
                runs[marks] = trio.run(
                    _hosted,
                    cfg.episodes,
                    seed,
                    Path(tmp),
                    marks != "opted_out",
                    "on_demand" if marks == "opted_out" else marks,
                )
        for _wall, h_steps, got, _cpu in runs.values():
            if p_steps != h_steps or any(
                converter.unstructure(t) != got[row] for row, t in enumerate(trajs)
            ):
                raise AssertionError("hosted trajectories differ from plain Gymnasium's")
        steps = p_steps
        plain_us.append(p_s / p_steps * 1e6)
        host_us.append(runs["always"][0] / steps * 1e6)
        on_demand_us.append(runs["on_demand"][0] / steps * 1e6)
        opted_out_us.append(runs["opted_out"][0] / steps * 1e6)
        progress(
            f"host overhead trial {trial + 1}/{cfg.trials}: plain {plain_us[-1]:.1f} "
            f"µs/step, host {host_us[-1]:.1f} µs/step, host with marks on demand (an "
            f"aligned run) {on_demand_us[-1]:.1f} µs/step"
        )
    plain_med, host_med = statistics.median(plain_us), statistics.median(host_us)
    on_demand_med = statistics.median(on_demand_us)
    opted_med = statistics.median(opted_out_us)
    return {
        "env": ENV_ID,
        "episodes": cfg.episodes,
        "steps_per_trial": steps,
        "plain_us_per_step_median": round(plain_med, 2),
        "host_us_per_step_median": round(host_med, 2),
        "host_overhead_us_per_step": round(host_med - plain_med, 2),
        "host_over_plain_ratio": round(host_med / plain_med, 3),
        "host_on_demand_us_per_step_median": round(on_demand_med, 2),
        "host_on_demand_over_plain_ratio": round(on_demand_med / plain_med, 3),
        "marks_in_an_aligned_run_us_per_step": round(host_med - on_demand_med, 2),
        "opted_out_us_per_step_median": round(opted_med, 2),
        "marks_on_demand_us_per_step": round(on_demand_med - opted_med, 2),
    }


async def _loop(gym: Any, rows: int, group_size: int, work: Path) -> tuple[float, int]:
    config = RuntimeConfig(control_timeout_s=30.0, drain_timeout_s=30.0)
    episodes = 0
    async with open_rollouts(
        gym,
        work,
        rows=rows,
        group_size=group_size,
        config=config,
        max_rows_in_flight=64,
        restore=False,
    ) as ro:
        t0 = time.perf_counter()
        async with aclosing(ro.batches(8)) as batches:  # type: ignore[type-var]
            async for batch in batches:
                episodes += sum(len(g.results) for g in batch)
        elapsed = time.perf_counter() - t0
    return elapsed, episodes


async def _embedded_loop(rows: int, group_size: int, work: Path) -> tuple[float, int]:
    from gymckpt.gym_adapter.environments.gymnasium import gymnasium_environment

    async with EmbeddedGym.host(
        gymnasium_environment(ENV_ID), instances=2, work_dir=work / "live"
    ) as gym:
        return await _loop(gym, rows, group_size, work)


async def _ray_loop(rows: int, group_size: int, work: Path) -> tuple[float, int]:
    from gymckpt.gym_adapter import RayGym

    async with RayGym.host(f"gymnasium:{ENV_ID}", instances=2, work_dir=work / "live") as gym:
        return await _loop(gym, rows, group_size, work)


def _throughput(cfg: HostBenchConfig, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": cfg.loop_rows, "group_size": cfg.group_size}
    runs = [("embedded_2_instances", _embedded_loop)]
    if cfg.ray:
        runs.append(("ray_2_actors", _ray_loop))
    for name, fn in runs:
        with TemporaryDirectory() as tmp:
            elapsed, episodes = trio.run(fn, cfg.loop_rows, cfg.group_size, Path(tmp))
        out[f"{name}_episodes_per_s"] = round(episodes / elapsed, 1)
        out[f"{name}_episodes"] = episodes
        progress(f"{name}: {episodes} episodes in {elapsed:.2f}s")
    return out


async def _calendar(
    episodes: int, turns: int, seed: int, work: Path, marks: bool
) -> tuple[float, int, float]:
    """(wall seconds, steps, CPU seconds) of ``episodes`` calendar episodes of ``turns``
    turns, each creating an event, with no turn time."""
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment

    cfg = CalendarConfig(turns=(turns, turns), turn_s=(0.0, 0.0), mutation_p=1.0)
    env = attrs.evolve(calendar_environment(config=cfg), unaligned=marks)
    async with GymHost("bench-0", env, seed, work, cfg.host_config()) as host:
        rows = [RunRow(f"{r}-0", r, 0, 0) for r in range(episodes)]
        t0, c0 = time.perf_counter(), time.process_time()
        replies: list[RunReply] = []
        async for batch in await host.run(rows):
            replies.extend(batch)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    for r in replies:
        assert isinstance(r, Completed), r
    # every turn a step, and the call after the last turn that reports the end
    return elapsed, episodes * (turns + 1), cpu


def _trial_pair(run: Any, trial: int) -> dict[bool, tuple[float, float]]:
    """marks on / opted out: (wall µs, CPU µs) per step, the two runs of one trial in
    alternating order."""
    out: dict[bool, tuple[float, float]] = {}
    for marks in (True, False) if trial % 2 == 0 else (False, True):
        with TemporaryDirectory() as tmp:
            out[marks] = run(marks, Path(tmp))
    return out


def _marks_figures(on: list[tuple[float, float]], off: list[tuple[float, float]]) -> dict[str, Any]:
    """Medians of wall and CPU µs per step, and of the per-trial overhead ratios."""
    out: dict[str, Any] = {}
    for i, clock in enumerate(("", "cpu_")):
        a = [x[i] for x in on]
        b = [x[i] for x in off]
        on_med, off_med = statistics.median(a), statistics.median(b)
        out[f"marks_{clock}us_per_step_median"] = round(on_med, 2)
        out[f"opted_out_{clock}us_per_step_median"] = round(off_med, 2)
        out[f"marks_overhead_{clock}us_per_step"] = round(on_med - off_med, 2)
        out[f"marks_overhead_{clock}ratio"] = round(
            statistics.median((x - y) / y for x, y in zip(a, b, strict=True)), 4
        )
    return out


def _marks(cfg: HostBenchConfig, progress: Progress) -> dict[str, Any]:
    def cartpole(marks: bool, work: Path) -> tuple[float, float]:
        elapsed, steps, _, cpu = trio.run(_hosted, cfg.episodes, 200, work, marks)
        return elapsed / steps * 1e6, cpu / steps * 1e6

    def calendar(marks: bool, work: Path) -> tuple[float, float]:
        elapsed, steps, cpu = trio.run(
            _calendar, cfg.calendar_episodes, cfg.calendar_turns, 0, work, marks
        )
        return elapsed / steps * 1e6, cpu / steps * 1e6

    out: dict[str, Any] = {}
    for name, run in (("cartpole", cartpole), ("calendar", calendar)):
        with TemporaryDirectory() as tmp:  # warm-up, not counted
            run(True, Path(tmp))
        on: list[tuple[float, float]] = []
        off: list[tuple[float, float]] = []
        for trial in range(cfg.trials):
            pair = _trial_pair(run, trial)
            on.append(pair[True])
            off.append(pair[False])
            progress(
                f"marks {name} trial {trial + 1}/{cfg.trials}: {pair[True][0]:.1f} µs/step "
                f"({pair[True][1]:.1f} CPU) with marks, {pair[False][0]:.1f} "
                f"({pair[False][1]:.1f}) opted out"
            )
        out[name] = _marks_figures(on, off)
    out["cartpole"]["env"] = ENV_ID
    out["cartpole"]["episodes"] = cfg.episodes
    out["calendar"]["episodes"] = cfg.calendar_episodes
    out["calendar"]["turns"] = cfg.calendar_turns
    return out


def run_host(cfg: HostBenchConfig, progress: Progress) -> dict[str, Any]:
    """The three measurements; a dict of figures per measurement."""
    return {
        "per_step": _overhead(cfg, progress),
        "marks": _marks(cfg, progress),
        "loop": _throughput(cfg, progress),
    }
