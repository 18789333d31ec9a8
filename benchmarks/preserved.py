"""Work preserved across a crash: gymckpt against a step-boundary baseline.

The workload
------------
``open_rollouts`` on the embedded simulated Gym (``--instances`` instances), rows kept in
flight all the time (``max_rows_in_flight``), multi-turn episodes of random length (``turns``
turns, each of a heavy-tailed length in simulated seconds: lognormal, sigma 2, capped at 21
times its median, mean ``turn_mean_s``; drawn per episode by ``_heavy.heavy_plan``). The
trainer takes ``groups_per_step`` complete groups, trains for ``train_s`` and checkpoints: a
checkpoint at **every training-step boundary**, the same boundaries for both systems. Time is
``MockClock(autojump_threshold=0)``: minutes of rollouts run in seconds, and every snapshot and
restore is the runtime's real one (real files, the real protocol).

The crash
---------
``kills`` kill times are drawn uniformly (seeded) in ``kill_window_s``. For each one the same
workload runs from scratch to the kill time and is then torn down without a further checkpoint
(its cancel scope is cancelled: no final checkpoint, nothing flushed — whatever is on disk is
what a SIGKILL would leave, including a checkpoint cut short). Then a fresh embedded Gym and a
fresh trainer open the same work directory with ``restore=True``: the real restore of the latest
complete snapshot. A proxy records the episodes the restore hands to Gym (each is continued at
its step boundary: its staged model calls, one per turn done, are its ``capture_keys``).

What is counted
---------------
*At risk* at a kill: every episode started before the kill that no training step had consumed
at the restored checkpoint — its rollout-seconds done before the kill (moving time, not time
parked during a checkpoint) are the *in-flight rollout-seconds*.

* **gymckpt** keeps, per at-risk episode: all of it if its result was in the snapshot
  (completed, not yet trained); the turns before its step boundary if the restore handed it
  back; nothing if it started after that checkpoint. Redone = done before the kill - kept.
* **Step-boundary baseline** — how verl, OpenRLHF and TRL resume today: the same checkpoint at
  the same training-step boundary saves the trainer (weights, optimizer, data position) and
  nothing of the rollouts; after the restore every at-risk prompt is generated again from the
  start. It is not run: its redone work is computed from the same run's timeline, and is 100 %
  of the in-flight rollout-seconds by construction. What varies is how many rollout-seconds
  that is. (In their synchronous mode nothing is in flight at a step boundary and there is
  nothing for either system to keep from before it; this workload is asynchronous — rows stay
  in flight across steps — which is where the difference lies.)

Per episode, the rollout-seconds done by a time are computed from its plan, its start (the
dispatch callback) and the checkpoint windows (an episode parks at the first step boundary it
reaches while Gym is prepared). The same model predicts each restored episode's step boundary,
and the benchmark reports how many predictions differ from the boundary the restore handed
back (``boundary_mismatches``: 0 means the accounting agrees with the snapshot, episode by
episode).

What gymckpt's checkpoints cost is reported beside it: ``parked_fraction_of_rollout_time``,
the time episodes spent parked at a step boundary while Gym was prepared (each checkpoint
waits for the slowest episode's turn to end) over the time they moved, by the model; and
``measured_parked_fraction``, what the episodes themselves recorded (every gap between a step
boundary and their next turn on the virtual clock, over their turn time done), with the
pauses of the episodes each checkpoint held (``held_*``). The step-boundary baseline does not
stop rollouts for its checkpoints.

Both modes
----------
Every kill time is run once per checkpoint mode (``modes``), the same kill times for both.
Unaligned, nothing parks, so the timeline has no windows; the restored checkpoint took each
episode at its last step boundary before its instance's cut (the start of that instance's
``commit``, recorded by a proxy), with the model call of the turn in progress (one call per
turn, made at its start): the model predicts that boundary, and the restore must hand back that
many capture keys or one more. The top level of the result is the aligned run's; ``modes``
holds both.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import attrs
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.gym_adapter.environments.calendar import EpisodePlan

from ._common import Progress, median
from ._heavy import TurnTimes, heavy_plan, heavy_refs, host_config, recorder
from .checkpoint import MODES, TURN_CAP, TURN_SIGMA

__all__ = ["PreservedConfig", "moving_time", "park_boundary", "parked_time", "run_preserved"]

INF = math.inf
ROWS = 100_000  # more than any run gets to (a list of them is built)
MUTATION_P = 0.5


@attrs.define
class PreservedConfig:
    kills: int = 10
    instances: int = 4
    rows_in_flight: int = 32
    group_size: int = 4
    groups_per_step: int = 8
    train_s: float = 5.0
    turns: tuple[int, int] = (4, 24)
    turn_mean_s: float = 3.5
    turn_sigma: float = TURN_SIGMA
    turn_cap: float = TURN_CAP
    modes: tuple[str, ...] = MODES
    kill_window_s: tuple[float, float] = (60.0, 600.0)
    seed: int = 7
    quick: bool = False

    def times(self) -> TurnTimes:
        return TurnTimes.with_mean(self.turn_mean_s, self.turn_sigma, self.turn_cap)

    def plan(self, row: int, slot: int) -> EpisodePlan:
        return heavy_plan(self.seed, row, slot, self.turns, self.times(), MUTATION_P)

    @classmethod
    def quick_defaults(cls) -> PreservedConfig:
        return cls(
            kills=6,  # in each mode
            instances=2,
            rows_in_flight=8,
            groups_per_step=2,
            kill_window_s=(60.0, 200.0),
            quick=True,
        )

    def kill_times(self) -> list[float]:
        rng = random.Random(f"gymckpt-preserved:{self.seed}")
        lo, hi = self.kill_window_s
        return sorted(round(rng.uniform(lo, hi), 3) for _ in range(self.kills))


# -- the episode timeline model -------------------------------------------------------------


def _park(t: float, windows: Sequence[tuple[float, float]]) -> float:
    """Where an episode reaching a step boundary at ``t`` moves on: at the end of the window
    that holds ``t`` (Gym prepared), else at ``t``. Windows are sorted and disjoint."""
    for p, r in windows:
        if p <= t < r:
            t = r
    return t


def moving_time(
    start: float, durations: Sequence[float], windows: Sequence[tuple[float, float]], t: float
) -> float:
    """Rollout-seconds an episode started at ``start`` has done by ``t``: its turns run back to
    back, and at every step boundary it waits out a checkpoint window that holds it."""
    tau, done = start, 0.0
    for d in durations:
        tau = _park(tau, windows)
        if tau >= t:
            return done
        if tau + d > t:
            return done + (t - tau)
        tau += d
        done += d
    return done


def parked_time(
    start: float, durations: Sequence[float], windows: Sequence[tuple[float, float]], t: float
) -> float:
    """Seconds the episode spent parked at a step boundary in a checkpoint window by ``t``
    (from its start to its end or ``t``, less its moving time)."""
    tau = start
    for d in durations:
        tau = _park(tau, windows)
        if tau >= t:
            return t - start - moving_time(start, durations, windows, t)
        tau += d
    end = min(_park(tau, windows), t)  # the last boundary parks too, before it completes
    return max(0.0, end - start - moving_time(start, durations, windows, t))


def park_boundary(
    start: float,
    durations: Sequence[float],
    windows: Sequence[tuple[float, float]],
    window: tuple[float, float],
) -> int | None:
    """The step boundary at which the episode is parked in ``window`` (a member of
    ``windows``): the first boundary it reaches at or after the window opens. None if it had
    not started when the window opened."""
    p = window[0]
    if start >= p:
        return None
    tau = start
    for i in range(len(durations) + 1):
        if tau >= p:
            return i
        tau = _park(tau, windows)
        if tau >= p:  # waited out an earlier window into this one: cannot happen (disjoint)
            return i
        if i < len(durations):
            tau += durations[i]
    return len(durations)  # completed before the window opened


# -- one kill -------------------------------------------------------------------------------


@attrs.define
class _Run:
    """What the trainer side saw up to the kill (all times on the virtual clock)."""

    mode: str
    starts: dict[str, tuple[float, int, int, str]] = attrs.field(factory=dict)
    taken: list[str] = attrs.field(factory=list)
    windows: list[list[float]] = attrs.field(factory=list)
    # checkpoint_id -> (window index, ids taken before it, publish time)
    published: dict[str, tuple[int, int, float]] = attrs.field(factory=dict)
    # per window: instance -> the time its commit began (an unaligned checkpoint's cut)
    cuts: list[dict[str, float]] = attrs.field(factory=list)
    # what the episodes felt (the agent's own record, on the virtual clock): every gap between
    # a step boundary and the next turn, summed, the turn time done, and each gap over 0.5 ms
    gap_s: float = 0.0
    turn_s: float = 0.0
    held: list[float] = attrs.field(factory=list)


class _GymRecorder:
    """Delegates to the Gym; records the episodes each ``restore`` call hands to it and when
    each instance's ``commit`` began (``cuts``: one dict per checkpoint, appended by the
    trainer's hook)."""

    def __init__(self, gym: Any, cuts: list[dict[str, float]] | None = None) -> None:
        self._gym = gym
        self.episodes: dict[str, int] = {}
        self.cuts = cuts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._gym, name)
        if name == "commit" and self.cuts is not None:
            cuts = self.cuts

            async def commit(instance: str, *args: Any, **kwargs: Any) -> Any:
                if cuts:
                    cuts[-1].setdefault(instance, trio.current_time())
                return await attr(instance, *args, **kwargs)

            return commit
        if name != "restore":
            return attr

        async def restore(
            instance: str, state_root: str, record: Any, episodes: Any, deadline_ts: float
        ) -> Any:
            for ep in episodes:
                self.episodes[ep.rollout_id] = len(ep.capture_keys)
            return await attr(instance, state_root, record, episodes, deadline_ts)

        return restore


def _gym(cfg: PreservedConfig, work: Path, record_dir: str | None) -> Any:
    return EmbeddedGym.host(
        heavy_refs(cfg.instances, cfg.turns, cfg.times(), record_dir, MUTATION_P),
        cfg.instances,
        cfg.seed,
        work,
        host_config(),
    )


def _runtime_config(mode: str) -> Any:
    from gymckpt.runtime import RuntimeConfig

    # a prepare waits up to the longest turn (the cap): the default control deadline is shorter
    return RuntimeConfig(checkpoint_mode=mode, control_timeout_s=600.0, lease_s=3600.0)


async def _until_kill(cfg: PreservedConfig, mode: str, kill_at: float, work: Path) -> _Run:
    from gymckpt.gym_adapter import RunRow
    from gymckpt.nurseries import open_rollouts

    run = _Run(mode)
    record_dir = work / "pauses"  # a recorder of its own for this run
    record_dir.mkdir()

    def dispatched(instance: str, rows: Sequence[RunRow]) -> None:
        now = trio.current_time()
        for row in rows:
            run.starts[row.rollout_id] = (now, row.row, row.slot, instance)

    with trio.CancelScope() as crash:
        async with _gym(cfg, work / "gym", str(record_dir)) as gym:
            proxy = _GymRecorder(gym, run.cuts)
            async with open_rollouts(
                cast(Any, proxy),
                work / "run",
                rows=ROWS,
                group_size=cfg.group_size,
                max_rows_in_flight=cfg.rows_in_flight,
                restore=False,
                handle_signals=False,
                on_dispatch=dispatched,
                config=_runtime_config(mode),
            ) as ro:

                def hook(cid: str, point: str) -> None:
                    now = trio.current_time()
                    if point == "before_prepare":
                        run.windows.append([now, INF])
                        run.cuts.append({})
                    elif point == "before_resume":
                        run.windows[-1][1] = now
                    elif point == "after_publish":
                        run.published[cid] = (len(run.windows) - 1, len(run.taken), now)

                ro.coordinator.on_stage = hook

                async def trainer() -> None:
                    steps = ro.batches(groups_per_step=cfg.groups_per_step)
                    async with aclosing(steps) as batches:  # type: ignore[type-var]
                        async for batch in batches:
                            for group in batch:
                                run.taken.extend(group.rollout_ids)
                            await trio.sleep(cfg.train_s)
                            await ro.checkpoint()
                            if run.windows and run.windows[-1][1] == INF:  # no before_resume
                                run.windows[-1][1] = trio.current_time()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trainer)
                    await trio.sleep_until(kill_at)
                    crash.cancel()  # the crash: nothing more runs, nothing is flushed
    rec = recorder(str(record_dir))
    run.gap_s, run.turn_s = rec.gap_s, rec.turn_s
    run.held = [g for _k, _t, g, _n in rec.gaps]
    return run


async def _restore(cfg: PreservedConfig, mode: str, work: Path) -> dict[str, Any]:
    from gymckpt.nurseries import open_rollouts

    async with _gym(cfg, work / "gym-after", None) as gym:
        rec = _GymRecorder(gym)
        t0 = time.perf_counter()
        async with open_rollouts(
            cast(Any, rec),
            work / "run",
            rows=ROWS,
            group_size=cfg.group_size,
            max_rows_in_flight=cfg.rows_in_flight,
            restore=True,
            handle_signals=False,
            config=_runtime_config(mode),
        ) as ro:
            wall = time.perf_counter() - t0
            restored = ro.restored
            summary = ro.restore_summary
            out = {
                "checkpoint_id": None if restored is None else restored.snapshot.checkpoint_id,
                "episodes": dict(rec.episodes),
                "restore_wall_s": wall,
                "summary": None if summary is None else attrs.asdict(summary),
            }
    return out


def _turns_done_by(start: float, durations: Sequence[float], t: float) -> int:
    """Turns an episode that never parks (unaligned checkpoints) has completed by ``t``."""
    tau, k = start, 0
    for d in durations:
        if tau + d > t:
            return k
        tau += d
        k += 1
    return k


def _account(
    cfg: PreservedConfig, kill_at: float, run: _Run, after: dict[str, Any]
) -> dict[str, Any]:
    aligned = run.mode == "aligned"
    windows = [(p, r) for p, r in run.windows if p < kill_at]
    windows = [(p, min(r, INF) if r <= kill_at else INF) for p, r in windows]
    parks = windows if aligned else []  # an unaligned checkpoint parks nothing
    cid = after["checkpoint_id"]
    restored_eps: dict[str, int] = after["episodes"]
    if cid is None:
        w_idx, n_taken, t_ckpt = -1, 0, 0.0
    else:
        w_idx, n_taken, _pub = run.published[cid]
        t_ckpt = windows[w_idx][0]
    trained = set(run.taken[:n_taken])
    at_risk = done_total = kept_total = moved_all = parked_all = 0.0
    episodes = in_flight_at_kill = kept_whole = kept_partly = mismatches = 0
    for rid, (start, row, slot, instance) in run.starts.items():
        if start >= kill_at:
            continue
        durs = cfg.plan(row, slot).durations
        total = sum(durs)
        done = moving_time(start, durs, parks, kill_at)
        # the checkpoints' cost in rollout time, over every episode of the run so far
        moved_all += done
        parked_all += parked_time(start, durs, parks, kill_at)
        if rid in trained:
            continue
        episodes += 1
        in_flight_at_kill += done < total
        at_risk += done
        kept = 0.0
        if w_idx >= 0:
            if aligned:
                b = park_boundary(start, durs, windows, windows[w_idx])
                keys_ok: tuple[int, ...] = () if b is None else (b,)
            else:  # taken at its last boundary before its instance's cut, with the call made
                cut = run.cuts[w_idx].get(instance, t_ckpt)
                b = _turns_done_by(start, durs, cut) if start < cut else None
                keys_ok = () if b is None else (b, b + 1)
            if rid in restored_eps:
                got = restored_eps[rid]
                mismatches += got not in keys_ok
                kept = sum(durs[: min(got, b if b is not None else got)])
                kept_partly += 1
            elif b is not None and b >= len(durs):  # result in the snapshot, untrained
                kept = total
                kept_whole += 1
            elif b is not None:
                mismatches += 1  # the model says in flight at the checkpoint, restore disagrees
        kept_total += min(kept, done)
        done_total += done
    redone = done_total - kept_total
    return {
        "kill_s": kill_at,
        "restored_checkpoint": cid,
        "checkpoint_s": round(t_ckpt, 3),
        "since_checkpoint_s": round(kill_at - t_ckpt, 3),
        "at_risk_episodes": episodes,
        "in_flight_at_kill": in_flight_at_kill,
        "kept_whole_results": kept_whole,
        "restored_episodes": len(restored_eps),
        "continued_episodes": kept_partly,
        "boundary_mismatches": mismatches,
        "in_flight_rollout_s": round(at_risk, 3),
        "gymckpt_redone_rollout_s": round(redone, 3),
        "baseline_redone_rollout_s": round(done_total, 3),
        "gymckpt_redone_fraction": round(redone / done_total, 4) if done_total else None,
        "baseline_redone_fraction": 1.0 if done_total else None,
        "restore_wall_s": round(after["restore_wall_s"], 3),
        "restore_summary": after["summary"],
        "checkpoints_before_kill": len([w for w in windows if w[0] < kill_at]),
        "rollout_s_before_kill": round(moved_all, 3),
        "parked_rollout_s_before_kill": round(parked_all, 3),
        # measured by the episodes themselves (virtual clock): every boundary-to-next-turn gap
        "measured_turn_s_before_kill": round(run.turn_s, 3),
        "measured_parked_s_before_kill": round(run.gap_s, 3),
        "held_episodes": len(run.held),
        "_held": run.held,  # pooled over kills by run_preserved, then dropped
    }


async def _one_kill(cfg: PreservedConfig, mode: str, kill_at: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gymckpt-preserved-") as tmp:
        work = Path(tmp)
        run = await _until_kill(cfg, mode, kill_at, work)
        after = await _restore(cfg, mode, work)
        return _account(cfg, kill_at, run, after)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _summary(cfg: PreservedConfig, kills: list[dict[str, Any]]) -> dict[str, Any]:
    fr = [k["gymckpt_redone_fraction"] for k in kills if k["gymckpt_redone_fraction"] is not None]
    ours = sum(k["gymckpt_redone_rollout_s"] for k in kills)
    base = sum(k["baseline_redone_rollout_s"] for k in kills)
    held = [g for k in kills for g in k.pop("_held")]
    checkpoints = sum(k["checkpoints_before_kill"] for k in kills)
    return {
        "kills": len(kills),
        "gymckpt_redone_fraction_median": round(median(fr), 4) if fr else None,
        "gymckpt_redone_fraction_max": round(max(fr), 4) if fr else None,
        "gymckpt_redone_fraction_pooled": round(ours / base, 4) if base else None,
        "baseline_redone_fraction": 1.0,
        "gymckpt_redone_rollout_s_total": round(ours, 1),
        "baseline_redone_rollout_s_total": round(base, 1),
        "boundary_mismatches": sum(k["boundary_mismatches"] for k in kills),
        # what gymckpt's checkpoints cost: episodes parked at a step boundary while Gym is
        # prepared (the baseline's step-boundary checkpoint does not stop rollouts); modelled
        # from the checkpoint windows, and measured by the episodes
        "parked_fraction_of_rollout_time": round(
            sum(k["parked_rollout_s_before_kill"] for k in kills)
            / max(1e-9, sum(k["rollout_s_before_kill"] for k in kills)),
            4,
        ),
        "measured_parked_fraction": round(
            sum(k["measured_parked_s_before_kill"] for k in kills)
            / max(1e-9, sum(k["measured_turn_s_before_kill"] for k in kills)),
            5,
        ),
        # the episodes a checkpoint held at a boundary (over 0.5 ms), and for how long
        "held_per_checkpoint": round(len(held) / checkpoints, 2) if checkpoints else None,
        "held_pause_p50_s": round(_pct(held, 0.5), 3) if held else 0.0,
        "held_pause_p99_s": round(_pct(held, 0.99), 3) if held else 0.0,
        "held_pause_max_s": round(max(held), 3) if held else 0.0,
        "restores": sum(k["restored_checkpoint"] is not None for k in kills),
        "per_kill": kills,
    }


def run_preserved(cfg: PreservedConfig, progress: Progress) -> dict[str, Any]:
    """One run per kill time and mode (the same kill times for every mode); the figures per
    kill and over all kills, per mode. The top level is the aligned run's (the reference)."""
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in cfg.modes}
    for i, kill_at in enumerate(cfg.kill_times()):
        for mode in cfg.modes:
            t0 = time.perf_counter()
            clock = trio.testing.MockClock(autojump_threshold=0)
            rec = trio.run(_one_kill, cfg, mode, kill_at, clock=clock)
            rec["wall_s"] = round(time.perf_counter() - t0, 2)
            per_mode[mode].append(rec)
            progress(
                f"crash {i + 1}/{cfg.kills} at {kill_at:.0f} s, {mode}: "
                f"{rec['in_flight_rollout_s']:.0f} in-flight rollout-s, gymckpt redoes "
                f"{rec['gymckpt_redone_rollout_s']:.0f}, the baseline "
                f"{rec['baseline_redone_rollout_s']:.0f} ({rec['wall_s']:.1f} s)"
            )
    modes = {m: {"checkpoint_mode": m, **_summary(cfg, k)} for m, k in per_mode.items()}
    top = dict(modes.get("aligned") or modes[cfg.modes[0]])
    return {
        **top,
        "modes": modes,
        "kill_times_s": cfg.kill_times(),
        "turn_times": cfg.times().describe(),
        "config": attrs.asdict(cfg),
    }
