"""Dispatch throughput through the gate and the ledger, without Gym.

With a ledger already holding N attempts in flight (200k; 1M with ``--million``), one dispatcher
task pushes ``--rows`` attempts (default 65 536, one step of a large run) through the runtime's
data-plane path, in batches of B attempts (one ``/run`` call each; B = 1, 64, 512):

1. reserve rows as needed (``await barrier.mutate(ledger.reserve_row)``);
2. ``async with gate.admit() as gate_id:`` then, in ONE mutation, ``ledger.mark_dispatched(batch,
   instance, gate_id)`` and the submission (a no-op here: no Gym yet), as the runtime does
   (no checkpoint can cut between the ledger saying "dispatched" and the submission);
3. one completion mutation per attempt (``ledger.complete``, one streamed reply each);
4. hand finished groups to the trainer (``take_ready``).

Reported: end-to-end rows/s (a *row* is one attempt = one ``/run`` row), and rows/s of the
admit+dispatch part and of the completion part alone (time spent in each, summed). One task on
one core, so this is the runtime's CPU ceiling per trainer, not Gym's.

With ``--loop``: rows/s through the whole loop (``open_rollouts``: dispatcher, gate, ledger,
one submission task per instance batch, the reply stream's consumer, completion mutations, the
trainer taking groups), ``--loop-attempts`` attempts per run, dispatcher batch 512, group size 8,
4 instances, virtual clock, on two Gyms:

* ``null``: a Gym that admits at once and answers every row ``Completed`` in reply batches of
  64, with no episode and no task of its own. This is the runtime's own cost per row through
  the whole loop (plus the Gym contract's objects, ``RunRow`` and ``Completed``).
* ``bare``: the embedded Gym host with episodes of one turn whose agent ends the episode at
  once (``Done`` at its first step: no participant, no model call, no sleep). This is the
  host's own cost per episode (its task and cancel scope, admission, sessions, boundary mark,
  the value checks of the result, the reply stream) on top of the runtime's.
* ``embedded``: the embedded simulated Gym with one-turn episodes of 10-20 ms, as
  ``gymckpt bench checkpoint`` measures it (every row is an episode task on the same loop; the
  calendar's episode is two agent steps, its one turn with a model call, one sleep and, half the
  time, a journaled calendar event, then the step that reports the end, so this adds the
  environment's own cost; each sleep ends at its own virtual instant: two scheduler passes per
  episode, the first of which only jumps the virtual clock, one under a real clock).

Each is run ``--loop-runs`` times; the medians are ``loop_rows_per_s_null``,
``loop_rows_per_s_bare`` and ``loop_rows_per_s_embedded`` (wall), ``bare_over_null`` the
host's throughput as a fraction of the runtime alone (medians, same run), and
``loop_rows_per_cpu_s_*`` per second of the process's CPU time (steadier than wall time on a
shared machine: time the loop waited for the CPU while other processes ran is not counted).
"""

from __future__ import annotations

import functools
import gc
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from gymckpt.gym_adapter import (
    CommitReply,
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    GymBackend,
    InstanceInventory,
    PrepareReply,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
)
from gymckpt.gym_adapter.environments.calendar import calendar_environment
from gymckpt.runtime import DispatchGate, EpisodeRecord, InstanceRecord, RecoveryLedger

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
    instances_loop: int = 4
    seed: int = 2
    quick: bool = False
    loop: bool = False
    loop_attempts: int = 65_536
    loop_runs: int = 3
    loop_batch: int = 512

    @classmethod
    def quick_defaults(cls) -> DispatchConfig:
        return cls(in_flight=(2_000,), rows=2_048, quick=True, loop_attempts=2_048, loop_runs=1)


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


# -- the whole loop -------------------------------------------------------------------------------


class _NullStream:
    """All of a submission's rows, ``Completed``, in batches of ``chunk`` (one checkpoint each)."""

    __slots__ = ("_chunk", "_i", "_rows")

    def __init__(self, rows: Sequence[RunRow], chunk: int) -> None:
        self._rows = rows
        self._chunk = chunk
        self._i = 0

    def __aiter__(self) -> _NullStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        await trio.lowlevel.checkpoint()
        i = self._i
        if i >= len(self._rows):
            raise StopAsyncIteration
        self._i = i + self._chunk
        return [Completed(r.rollout_id, 1.0, 1) for r in self._rows[i : i + self._chunk]]

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class NullGym:
    """A Gym with no episodes: ``run`` admits at once and its stream answers every row
    ``Completed``. Only the data plane is served (the loop benchmark takes no checkpoint)."""

    def __init__(self, instances: int, chunk: int = 64) -> None:
        self._names = tuple(f"null-{i}" for i in range(instances))
        self._chunk = chunk

    @property
    def instances(self) -> tuple[str, ...]:
        return self._names

    async def run(self, instance: str, rows: Sequence[RunRow]) -> _NullStream:
        await trio.lowlevel.checkpoint()
        return _NullStream(list(rows), self._chunk)

    def _control(self, op: str) -> NotImplementedError:
        return NotImplementedError(f"NullGym serves the data plane only, not {op}")

    async def topology(self) -> Topology:
        raise self._control("topology")

    async def prepare(self, instance: str, checkpoint_id: str, deadline_ts: float) -> PrepareReply:
        raise self._control("prepare")

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        raise self._control("commit")

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None:
        raise self._control("resume")

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        raise self._control("retire")

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply:
        raise self._control("restore")

    async def retire_restored(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        raise self._control("retire_restored")

    async def inventory(self, instance: str) -> InstanceInventory:
        raise self._control("inventory")


async def _loop_once(gym: GymBackend, work: Path, attempts: int, batch: int) -> dict[str, Any]:
    from gymckpt.nurseries import open_rollouts  # the application layer sits above

    g = 8
    trained = 0
    cpu0 = time.process_time_ns()
    t0 = perf_ns()
    async with open_rollouts(
        gym,
        work,
        rows=attempts // g,
        group_size=g,
        max_rows_in_flight=max(64, 4 * batch // g),
        batch_size=batch,
        restore=False,
        handle_signals=False,
    ) as ro:
        async for got in ro.batches(groups_per_step=max(1, batch // g)):
            trained += len(got)
    wall_ns = perf_ns() - t0
    cpu_ns = time.process_time_ns() - cpu0
    return {
        "attempts": trained * g,
        "seconds": round(wall_ns / 1e9, 3),
        "rows_per_s": round(trained * g / (wall_ns / 1e9)),
        "us_per_row": round(wall_ns / 1e3 / (trained * g), 2),
        "cpu_s": round(cpu_ns / 1e9, 3),
        "rows_per_cpu_s": round(trained * g / (cpu_ns / 1e9)),
    }


async def _loop_null(cfg: DispatchConfig, work: Path) -> dict[str, Any]:
    return await _loop_once(NullGym(cfg.instances_loop), work, cfg.loop_attempts, cfg.loop_batch)


@attrs.define
class _EndAtOnce:
    """An agent whose episodes end at their first step: what is left is the host's cost."""

    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: Any) -> int:
        return 0

    def export(self, state: int) -> int:
        return state

    def restore(self, data: Any) -> int:
        return int(data)

    async def step(self, ctx: Any, state: int) -> Done:
        return Done(1.0)


async def _loop_bare(cfg: DispatchConfig, work: Path) -> dict[str, Any]:
    async with EmbeddedGym.host(
        Environment(agent=_EndAtOnce()),
        instances=cfg.instances_loop,
        seed=cfg.seed,
        work_dir=work / "gym",
    ) as gym:
        return await _loop_once(gym, work / "run", cfg.loop_attempts, cfg.loop_batch)


async def _loop_embedded(cfg: DispatchConfig, work: Path) -> dict[str, Any]:
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig

    sim = CalendarConfig(
        turns=(1, 1), turn_s=(0.01, 0.02), mutation_p=0.5, max_batch=cfg.loop_batch
    )
    async with EmbeddedGym.host(
        calendar_environment(config=sim),
        instances=cfg.instances_loop,
        seed=cfg.seed,
        work_dir=work / "gym",
        config=sim.host_config(),
    ) as gym:
        return await _loop_once(gym, work / "run", cfg.loop_attempts, cfg.loop_batch)


def run_loop(cfg: DispatchConfig, progress: Progress) -> dict[str, Any]:
    """The whole loop on the null, the bare and the embedded Gym, ``loop_runs`` times each,
    alternating."""
    runs: dict[str, list[dict[str, Any]]] = {"null": [], "bare": [], "embedded": []}
    gyms = (("null", _loop_null), ("bare", _loop_bare), ("embedded", _loop_embedded))
    for i in range(cfg.loop_runs):
        for name, fn in gyms:
            gc.collect()
            with tempfile.TemporaryDirectory(prefix="gymckpt-bench-loop-") as tmp:
                r = trio.run(fn, cfg, Path(tmp), clock=trio.testing.MockClock(autojump_threshold=0))
            runs[name].append(r)
            progress(
                f"dispatch loop {name} run {i + 1}: {r['rows_per_s']:,} rows/s "
                f"({r['us_per_row']:.1f} us/row)"
            )
    out: dict[str, Any] = {"loop": runs, "loop_batch": cfg.loop_batch}
    for name, rs in runs.items():
        out[f"loop_rows_per_s_{name}"] = round(statistics.median(r["rows_per_s"] for r in rs))
        out[f"loop_rows_per_cpu_s_{name}"] = round(
            statistics.median(r["rows_per_cpu_s"] for r in rs)
        )
    out["bare_over_null"] = round(out["loop_rows_per_s_bare"] / out["loop_rows_per_s_null"], 3)
    return out


def run_dispatch(cfg: DispatchConfig, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"rows_per_config": cfg.rows, "batch_sizes": list(cfg.batch_sizes)}
    if cfg.loop:
        out.update(run_loop(cfg, progress))
    results: list[dict[str, Any]] = []
    for n in cfg.in_flight:
        progress(f"dispatch N={n:,}: building ledger")
        fx = InFlightFixture.build(
            n,
            group_size=cfg.group_size,
            instances=cfg.instances,
            seed=cfg.seed,
            progress=progress,
        )
        gc.collect()
        for batch in cfg.batch_sizes:
            r = trio.run(_pipeline, fx, batch, cfg.rows)
            results.append({"in_flight": n, **r})
            out[f"rows_per_s_batch{batch}_{label(n)}"] = r["rows_per_s"]
            progress(
                f"dispatch N={n:,} batch {batch}: {r['rows_per_s']:,} rows/s "
                f"({r['us_per_row']:.1f} us/row)"
            )
        del fx
        gc.collect()
    out["results"] = results
    out["config"] = attrs.asdict(cfg)
    return out
