"""A heavy-tailed workplace for the checkpoint benchmarks, and the pauses its episodes feel.

The calendar workplace (``gym_adapter.environments.calendar``) with one change: each turn's
length is
drawn from a **lognormal** distribution (``TurnTimes``: median, sigma, truncated at ``cap`` times
the median so that an aligned checkpoint's wait stays bounded), whose p99 is at least 20 times
its median — the long agentic turns (a generation, a tool call) that aligned checkpoints wait for.
A turn is the calendar agent's: one model call, a sleep of the turn's length, a calendar event
with probability ``mutation_p``. Plans are a function of (seed, row, slot) only (``heavy_plan``),
so a benchmark can recompute any episode's timeline.

What an episode feels (``PauseRecorder``)
----------------------------------------
The agent records, per episode, where the checkpoint reaches it: the **boundary gap** — from
its step returning (a step boundary) to its next step starting (the next turn) — and the
**turn overrun** — how much later than asked its turn's sleep ended (the event loop busy or
waiting for the GIL). Both on the Gym's clock (``anyio.current_time()``: virtual under a mock
or warp clock, real otherwise) and stamped with ``perf_counter`` (one clock for every process
of the machine, so a trainer's checkpoint window can select them). An aligned checkpoint parks
every episode at its next boundary, which shows as a boundary gap as long as the wait; an
unaligned one parks nothing, so its episodes' gaps stay what any step costs.

Only gaps and overruns over ``threshold_s`` (0.5 ms) are kept one by one; every gap is summed
(``gap_s``), with the turn time done (``turn_s``), for the parked-time fraction. Each process
keeps one recorder per record directory and appends what it kept to
``<dir>/<pid>.jsonl`` at most every ``flush_every_s`` (and on ``flush_all``), with a status line
(how many episodes are at a boundary and not yet in their next turn): the Ray actors' records
reach the trainer that way (``PauseSource`` reads them).

Invariant: a gap is recorded once per boundary, when the next turn starts; an episode that
never starts its next turn (parked until the end) shows in the status's ``waiting``, not as a
gap.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import attrs

from gymckpt.gym_adapter import Done, Environment, EnvironmentRef, HostConfig
from gymckpt.gym_adapter.environments.calendar import (
    CALENDAR,
    CalendarEvent,
    CalendarServer,
    CalendarState,
    EpisodePlan,
    calendar_model,
    sentinel,
)

__all__ = [
    "HEAVY_ENV",
    "HEAVY_FROM_ENVIRON",
    "HeavyAgent",
    "PauseRecorder",
    "PauseSource",
    "Records",
    "TurnTimes",
    "all_moving_at",
    "flush_all",
    "heavy_environ",
    "heavy_environment",
    "heavy_from_environ",
    "heavy_plan",
    "heavy_refs",
    "pauses_in",
]

AGENT: Final = "agent"


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _phi_inv(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


@attrs.frozen(kw_only=True)
class TurnTimes:
    """Lognormal turn lengths: ``median_s * exp(sigma * Z)``, truncated at ``cap * median_s``
    (a draw above it is the cap). Invariant: ``p99_over_median() >= 20`` for the defaults."""

    median_s: float = attrs.field(default=2.0, validator=attrs.validators.gt(0.0))
    sigma: float = attrs.field(default=1.5, validator=attrs.validators.gt(0.0))
    cap: float = attrs.field(default=30.0, validator=attrs.validators.gt(1.0))

    def draw(self, rng: random.Random) -> float:
        return round(min(self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0)), self.max_s), 6)

    @property
    def max_s(self) -> float:
        return self.cap * self.median_s

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the capped distribution (the cap holds ``1 - Phi(ln cap /
        sigma)`` of the mass)."""
        if q >= _phi(math.log(self.cap) / self.sigma):
            return self.max_s
        return self.median_s * math.exp(self.sigma * _phi_inv(q))

    def p99_over_median(self) -> float:
        return self.quantile(0.99) / self.median_s

    def mean_s(self) -> float:
        """The capped distribution's mean (the lognormal's partial mean below the cap plus the
        cap times the mass above it)."""
        s, c = self.sigma, math.log(self.cap)
        below = math.exp(s * s / 2) * _phi((c - s * s) / s)
        return self.median_s * (below + self.cap * (1.0 - _phi(c / s)))

    @classmethod
    def with_mean(cls, mean_s: float, sigma: float = 1.5, cap: float = 30.0) -> TurnTimes:
        """The distribution of this shape whose mean is ``mean_s``."""
        unit = cls(median_s=1.0, sigma=sigma, cap=cap)
        return cls(median_s=round(mean_s / unit.mean_s(), 6), sigma=sigma, cap=cap)

    def describe(self) -> dict[str, float]:
        return {
            "distribution": "lognormal, capped",  # type: ignore[dict-item]
            "median_s": self.median_s,
            "sigma": self.sigma,
            "cap_s": round(self.max_s, 3),
            "mean_s": round(self.mean_s(), 3),
            "p99_s": round(self.quantile(0.99), 3),
            "p99_over_median": round(self.p99_over_median(), 2),
        }


def heavy_plan(
    seed: int, row: int, slot: int, turns: tuple[int, int], times: TurnTimes, mutation_p: float
) -> EpisodePlan:
    """The plan of slot ``slot`` of row ``row``: a function of its arguments only."""
    rng = random.Random(f"gymckpt-heavy:{seed}:{row}:{slot}")
    n = rng.randint(*turns)
    durations = tuple(times.draw(rng) for _ in range(n))
    mutates = tuple(rng.random() < mutation_p for _ in range(n))
    payloads = tuple(f"{row}-{slot}/t{t}:{rng.getrandbits(32):08x}" for t in range(n))
    return EpisodePlan(n, durations, mutates, payloads, round(rng.random(), 6))


# -- the recorder ---------------------------------------------------------------------------


@attrs.define(eq=False)
class PauseRecorder:
    """One process's record of its episodes' boundary gaps and turn overruns (module docstring).

    ``gaps``: (episode, boundary perf_counter, gap on the Gym's clock, next turn's start
    perf_counter) for gaps over
    ``threshold_s``; ``overruns``: (episode, turn end perf_counter, overrun); ``gap_s`` /
    ``turn_s`` / ``gap_count``: every gap and every completed turn, summed."""

    path: Path | None
    threshold_s: float = 0.0005
    flush_every_s: float = 0.25
    last: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    gaps: list[tuple[str, float, float, float]] = attrs.field(factory=list)
    overruns: list[tuple[str, float, float]] = attrs.field(factory=list)
    gap_s: float = 0.0
    gap_count: int = 0
    turn_s: float = 0.0
    turns: int = 0
    _flushed_gaps: int = 0
    _flushed_overruns: int = 0
    _last_flush: float = 0.0

    def turn_start(self, key: str, clock: float, perf: float) -> None:
        prev = self.last.pop(key, None)
        if prev is not None:
            gap = clock - prev[0]
            self.gap_s += gap
            self.gap_count += 1
            if gap > self.threshold_s:
                self.gaps.append((key, prev[1], gap, perf))
        self._maybe_flush(perf)

    def turn_end(self, key: str, asked_s: float, took_s: float, clock: float, perf: float) -> None:
        self.turn_s += asked_s
        self.turns += 1
        over = took_s - asked_s
        if over > self.threshold_s:
            self.overruns.append((key, perf, over))
        self.last[key] = (clock, perf)

    def forget(self, key: str) -> None:
        """The episode ended (its last step): no boundary waits for a next turn."""
        self.last.pop(key, None)

    def _maybe_flush(self, perf: float) -> None:
        if self.path is not None and perf - self._last_flush >= self.flush_every_s:
            self.flush(perf)

    def flush(self, perf: float | None = None) -> None:
        if self.path is None:
            return
        perf = time.perf_counter() if perf is None else perf
        self._last_flush = perf
        lines = [json.dumps({"g": g}) for g in self.gaps[self._flushed_gaps :]] + [
            json.dumps({"o": o}) for o in self.overruns[self._flushed_overruns :]
        ]
        self._flushed_gaps, self._flushed_overruns = len(self.gaps), len(self.overruns)
        status = {
            "t": perf,
            "waiting": len(self.last),
            "gap_s": self.gap_s,
            "gap_count": self.gap_count,
            "turn_s": self.turn_s,
            "turns": self.turns,
        }
        lines.append(json.dumps({"s": status}))
        with self.path.open("a") as f:
            f.write("\n".join(lines) + "\n")


_RECORDERS: dict[str, PauseRecorder] = {}


def recorder(record_dir: str | None) -> PauseRecorder:
    """This process's recorder for ``record_dir`` (None: in memory only)."""
    key = record_dir or ""
    rec = _RECORDERS.get(key)
    if rec is None:
        path = None if record_dir is None else Path(record_dir) / f"{os.getpid()}.jsonl"
        rec = _RECORDERS[key] = PauseRecorder(path)
    return rec


def flush_all() -> None:
    """Flush every recorder of this process (the embedded Gym's, before reading them)."""
    for rec in _RECORDERS.values():
        rec.flush()


@attrs.define
class Records:
    """Every kept gap and overrun, and each process's last status (``PauseSource``)."""

    gaps: list[tuple[str, float, float, float]]
    overruns: list[tuple[str, float, float]]
    status: dict[str, dict[str, Any]]

    def waiting(self) -> int:
        return sum(int(s["waiting"]) for s in self.status.values())

    def oldest_status(self) -> float:
        return min((float(s["t"]) for s in self.status.values()), default=0.0)

    def total(self, name: str) -> float:
        return sum(float(s[name]) for s in self.status.values())


# -- the environment ------------------------------------------------------------------------


@attrs.define(eq=False, slots=True)
class _AgentState:
    plan: EpisodePlan | None = None
    """A function of (seed, row, slot): not exported, made again after a restore."""


@attrs.frozen
class HeavyAgent:
    """The calendar agent with lognormal turns, recording its episodes' pauses."""

    turns: tuple[int, int]
    times: TurnTimes
    mutation_p: float = 0.5
    record_dir: str | None = None
    kind: str = "simple_agent"
    name: str = AGENT

    def _plan(self, info: Any) -> EpisodePlan:
        return heavy_plan(info.seed, info.row, info.slot, self.turns, self.times, self.mutation_p)

    def open(self, info: Any) -> _AgentState:
        return _AgentState(self._plan(info))

    def export(self, state: _AgentState) -> dict[str, Any]:
        return {}

    def restore(self, data: Any) -> _AgentState:
        return _AgentState()

    async def step(self, ctx: Any, state: _AgentState) -> Done | None:
        info = ctx.info
        plan = state.plan
        if plan is None:
            plan = state.plan = self._plan(info)
        rec = recorder(self.record_dir)
        key = info.rollout_id
        turn = ctx.turn
        if turn >= plan.turns:
            rec.forget(key)
            return Done(plan.reward, turns=plan.turns)
        rec.turn_start(key, anyio.current_time(), time.perf_counter())
        await ctx.model(plan.payloads[turn])
        d = plan.durations[turn]
        t0 = anyio.current_time()
        await anyio.sleep(d)
        t1 = anyio.current_time()
        if plan.mutates[turn]:
            calendar: CalendarState = ctx.session(CALENDAR)
            calendar.events.append(
                CalendarEvent(
                    turn, f"meeting {info.session_key} t{turn}", sentinel(info.row, info.slot, turn)
                )
            )
        rec.turn_end(key, d, t1 - t0, t1, time.perf_counter())
        return None


def heavy_environment(
    turns_min: int,
    turns_max: int,
    median_s: float,
    sigma: float,
    cap: float,
    mutation_p: float = 0.5,
    record_dir: str | None = None,
) -> Environment:
    """The heavy-tailed workplace as an ``Environment`` (arguments plain, for a reference)."""
    times = TurnTimes(median_s=median_s, sigma=sigma, cap=cap)
    return Environment(
        agent=HeavyAgent((turns_min, turns_max), times, mutation_p, record_dir),
        participants=(CalendarServer(),),
        model=calendar_model,
    )


HEAVY_ENV: Final = "GYMCKPT_HEAVY_CONFIG"
"""The environment variable a ``gymckpt serve`` process reads ``heavy_environment``'s
arguments from (JSON), in ``heavy_from_environ``."""


def _heavy_kwargs(
    turns: tuple[int, int], times: TurnTimes, record_dir: str | None, mutation_p: float
) -> dict[str, Any]:
    return {
        "turns_min": turns[0],
        "turns_max": turns[1],
        "median_s": times.median_s,
        "sigma": times.sigma,
        "cap": times.cap,
        "mutation_p": mutation_p,
        "record_dir": record_dir,
    }


def heavy_refs(
    instances: int,
    turns: tuple[int, int],
    times: TurnTimes,
    record_dir: str | None,
    mutation_p: float = 0.5,
) -> list[EnvironmentRef]:
    """One reference per instance (an instance in another process builds its own)."""
    ref = EnvironmentRef.to(
        heavy_environment, **_heavy_kwargs(turns, times, record_dir, mutation_p)
    )
    return [ref] * instances


HEAVY_FROM_ENVIRON: Final = "gymckpt.benchmarks._heavy:heavy_from_environ"
"""The import path a ``gymckpt serve`` process builds the heavy workplace from."""


def heavy_environ(
    turns: tuple[int, int], times: TurnTimes, record_dir: str | None, mutation_p: float = 0.5
) -> dict[str, str]:
    """The environment variables that make ``heavy_from_environ`` build this workplace in a
    spawned server (``HttpGym.spawn(HEAVY_FROM_ENVIRON, environ=...)``)."""
    return {HEAVY_ENV: json.dumps(_heavy_kwargs(turns, times, record_dir, mutation_p))}


def heavy_from_environ() -> Environment:
    """``heavy_environment`` with the arguments in ``HEAVY_ENV`` (``heavy_environ``): a
    zero-argument factory for ``gymckpt serve``. ``ValueError`` names a missing or malformed
    variable."""
    text = os.environ.get(HEAVY_ENV)
    if not text:
        raise ValueError(f"{HEAVY_ENV} is not set: start the server with heavy_environ(...)")
    try:
        return heavy_environment(**json.loads(text))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{HEAVY_ENV} is not heavy_environment's arguments: {exc}") from None


def host_config(max_batch: int = 64, flush_interval_s: float = 0.005) -> HostConfig:
    return HostConfig(lease_s=3600.0, flush_interval_s=flush_interval_s, max_batch=max_batch)


# -- what a checkpoint window did to the episodes ---------------------------------------------


def _pct(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def pauses_in(
    records: Records, w0: float, w1: float, episodes: int, ms: bool = True
) -> dict[str, Any]:
    """Per-episode pause in the perf_counter window [w0, w1): each episode's boundary gaps at
    boundaries in the window plus its turn overruns ending in it, summed; ``episodes`` in
    flight (those with nothing recorded paused under the threshold: 0). p50 / p99 / max."""
    per: dict[str, float] = {}
    gap_max = over_max = 0.0
    for key, t, gap, _next in records.gaps:
        if w0 <= t < w1:
            per[key] = per.get(key, 0.0) + gap
            gap_max = max(gap_max, gap)
    for key, t, over in records.overruns:
        if w0 <= t < w1:
            per[key] = per.get(key, 0.0) + over
            over_max = max(over_max, over)
    values = sorted(per.values())
    zeros = max(0, episodes - len(values))
    full = [0.0] * zeros + values
    k = 1e3 if ms else 1.0
    unit = "ms" if ms else "s"
    return {
        f"pause_p50_{unit}": round(_pct(full, 0.5) * k, 3),
        f"pause_p99_{unit}": round(_pct(full, 0.99) * k, 3),
        f"pause_max_{unit}": round((full[-1] if full else 0.0) * k, 3),
        f"boundary_gap_max_{unit}": round(gap_max * k, 3),
        f"turn_overrun_max_{unit}": round(over_max * k, 3),
        "episodes_paused_over_threshold": len(values),
        "episodes": episodes,
    }


def all_moving_at(records: Records, w0: float, w1: float) -> float:
    """The perf_counter time at which the last episode that reached a boundary in [w0, w1)
    started its next turn (``w0`` if none waited over the threshold)."""
    end = w0
    for _key, t, _gap, nxt in records.gaps:
        if w0 <= t < w1:
            end = max(end, nxt)
    return end


# -- reading the records while a benchmark runs ---------------------------------------------


class PauseSource:
    """Where a trainer reads its episodes' pause records: ``waiting()`` (episodes at a boundary
    not yet in their next turn, and the oldest process status's perf_counter time) is cheap
    enough to poll; ``records()`` is everything kept so far."""

    def __init__(
        self, record_dir: str | Path, in_process: bool, episodes: int, limit: int = 0
    ) -> None:
        self.record_dir = str(record_dir)
        self.in_process = in_process
        self.episodes = episodes
        self.limit = limit if limit else max(16, episodes // 1000)
        self._offsets: dict[Path, int] = {}
        self._acc = Records([], [], {})

    def waiting(self) -> tuple[int, float]:
        if self.in_process:
            rec = recorder(self.record_dir)
            return len(rec.last), time.perf_counter()
        acc = self.poll()
        return acc.waiting(), acc.oldest_status()

    def records(self) -> Records:
        if self.in_process:
            rec = recorder(self.record_dir)
            status = {
                "self": {
                    "t": time.perf_counter(),
                    "waiting": len(rec.last),
                    "gap_s": rec.gap_s,
                    "gap_count": rec.gap_count,
                    "turn_s": rec.turn_s,
                    "turns": rec.turns,
                }
            }
            return Records(list(rec.gaps), list(rec.overruns), status)
        return self.poll()

    def poll(self) -> Records:
        """Read what the files gained since the last poll (complete lines only)."""
        acc = self._acc
        for path in sorted(Path(self.record_dir).glob("*.jsonl")):
            off = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(off)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self._offsets[path] = off + end
            for line in chunk[:end].splitlines():
                d = json.loads(line)
                if "g" in d:
                    acc.gaps.append(tuple(d["g"]))  # type: ignore[arg-type]
                elif "o" in d:
                    acc.overruns.append(tuple(d["o"]))  # type: ignore[arg-type]
                else:
                    acc.status[path.stem] = d["s"]
        return acc
