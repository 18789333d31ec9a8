"""The trainer side alone: one whole checkpoint with 1M rollouts in flight against a Gym that
answers every control call at once (``gymckpt bench checkpoint --backend null``).

Why a backend of ``bench checkpoint``: it is the same measurement as the embedded, Ray and HTTP
checkpoints (``checkpoint.measure_checkpoint``: the coordinator's whole protocol, each stage's
wall time and longest loop stall, the 1 ms heartbeat, GC, scheduler batches, the time spent
inside Gym's calls), with a Gym that costs nothing, so that every figure is the runtime's own.

The Gym (``HoldingGym``, a ``dispatch.NullGym`` that holds its rows): ``run`` admits at once
and its stream yields nothing until the run ends, so every row dispatched stays in flight;
``prepare`` answers at once (every episode parked, nothing on the wire), ``commit`` exports
every episode the instance holds, owned by its one participant (``null``, an ``environment``
whose records are an empty directory), ``resume`` and ``retire`` answer at once. The commit's
episodes are built as the rows arrive (one ``ExportedEpisode`` each, kept per instance), so a
commit costs Gym one tuple copy, not 250k objects built on the trainer's loop.

The run: ``open_rollouts`` on ``instances`` (4) such Gym instances with the default
``RuntimeConfig`` (aligned, its control and alignment timeouts), ``max_rows_in_flight`` = N / 8,
filled in real time until N (1,000,000) attempts are dispatched; then one ``checkpoint()``
measured from close to resume (``checkpoint_wall_s``, the target's figure: <= 2 s at 1M), by
stage, with the longest loop stall of all causes (task step or heartbeat lateness). Like the
embedded checkpoint it runs in a fresh subprocess, which exits without tearing the ledger down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import trio

from gymckpt.gym_adapter import (
    CommitReply,
    ExportedEpisode,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
)
from gymckpt.nurseries import ExitCode
from gymckpt.runtime import records_digest

from ._common import Progress, label
from .checkpoint import _TimedGym, measure_checkpoint
from .dispatch import NullGym

__all__ = ["HoldingGym", "TrainerSideConfig", "run_trainer_side"]

PARTICIPANT = ("null", "environment")
"""Each instance's one participant: ``(server_name, kind)``."""


@attrs.define
class TrainerSideConfig:
    in_flight: int = 1_000_000
    instances: int = 4
    group_size: int = 8
    dispatch_batch: int = 512
    after_s: float = 2.0
    fill_timeout_s: float = 1200.0
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> TrainerSideConfig:
        return cls(in_flight=20_000, after_s=0.5, quick=True)


class _HeldStream:
    """A submission's reply stream that yields nothing until it is closed: its rows stay in
    flight (one cancellable wait, owned by the consumer reading it)."""

    __slots__ = ("_closed",)

    def __init__(self) -> None:
        self._closed = trio.Event()

    def __aiter__(self) -> _HeldStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        await self._closed.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self._closed.set()
        await trio.lowlevel.checkpoint()


class HoldingGym(NullGym):
    """A Gym that holds every row in flight and answers control calls at once (the module's
    docstring). Invariant: ``held[instance]`` is every rollout ID run on ``instance`` and not
    retired, each with its ``ExportedEpisode``."""

    def __init__(self, instances: int) -> None:
        super().__init__(instances)
        self.held: dict[str, dict[str, ExportedEpisode]] = {n: {} for n in self.instances}
        self._digest: str | None = None

    async def run(self, instance: str, rows: Sequence[RunRow]) -> _HeldStream:  # type: ignore[override]
        held = self.held[instance]
        for r in rows:
            held[r.rollout_id] = ExportedEpisode(r.rollout_id, PARTICIPANT[0])
        await trio.lowlevel.checkpoint()
        return _HeldStream()

    async def topology(self) -> Topology:
        await trio.lowlevel.checkpoint()
        return Topology(tuple(InstanceTopology(n, (PARTICIPANT,)) for n in self.instances))

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: Any = None,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        await trio.lowlevel.checkpoint()
        return PrepareReply(instance, checkpoint_id, len(self.held[instance]), 0)

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply:
        rel = f"{instance}/{PARTICIPANT[0]}"
        state = Path(state_root) / rel
        state.mkdir(parents=True, exist_ok=True)
        if self._digest is None:  # an empty directory: the same digest every time
            self._digest = records_digest(state)
        info = ParticipantInfo(PARTICIPANT[0], PARTICIPANT[1], rel, self._digest)
        exported = tuple(self.held[instance].values())
        await trio.lowlevel.checkpoint()
        return CommitReply(instance, checkpoint_id, (info,), exported, ())

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None:
        await trio.lowlevel.checkpoint()

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply:
        held = self.held[instance]
        gone = tuple(r for r in rollout_ids if held.pop(r, None) is not None)
        await trio.lowlevel.checkpoint()
        return RetireReply(instance, gone, tuple(r for r in rollout_ids if r not in gone))


async def _fill(cfg: TrainerSideConfig, ledger: Any, say: Callable[[str], None]) -> float:
    """Wait (at most ``cfg.fill_timeout_s``) until ``cfg.in_flight`` attempts are dispatched;
    how long it took."""
    t0 = last = time.perf_counter()
    with trio.fail_after(cfg.fill_timeout_s):
        while ledger.statistics().by_state["dispatched"] < cfg.in_flight:
            await trio.sleep(0.2)
            if time.perf_counter() - last > 5:
                last = time.perf_counter()
                say(f"dispatched {ledger.statistics().by_state['dispatched']:,}/{cfg.in_flight:,}")
    return time.perf_counter() - t0


async def _main(
    cfg: TrainerSideConfig, verbose: bool, finish: Callable[[dict[str, Any]], None]
) -> None:
    """Fill, measure one checkpoint; ``finish(result)`` before anything is torn down."""
    from gymckpt.nurseries import STAGES, open_rollouts
    from gymckpt.runtime import RuntimeConfig

    def say(msg: str) -> None:
        if verbose:
            print(f"[trainer-side] {msg}", file=sys.stderr, flush=True)

    n, g = cfg.in_flight, cfg.group_size
    rc = RuntimeConfig()
    gym = HoldingGym(cfg.instances)
    timed = _TimedGym(gym)
    async with trio.open_nursery() as top:
        with tempfile.TemporaryDirectory(prefix="gymckpt-bench-trainer-") as tmp:
            async with open_rollouts(
                cast(Any, timed),
                Path(tmp) / "run",
                rows=n // g + 1,
                group_size=g,
                config=rc,
                max_rows_in_flight=n // g,
                batch_size=cfg.dispatch_batch,
                restore=False,
                keep_snapshots=0,
                handle_signals=False,
            ) as ro:
                fill_s = await _fill(cfg, ro.ledger, say)
                dispatched = ro.ledger.statistics().by_state["dispatched"]
                say(f"{dispatched:,} in flight after {fill_s:.1f} s; checkpointing")
                r = await measure_checkpoint(
                    ro,
                    timed.spans,
                    STAGES,
                    nursery=top,
                    dispatched=dispatched,
                    pause_collector=rc.pause_collector,
                    after_s=cfg.after_s,
                    say=say,
                )
                late = max((s["heartbeat_max_late_ms"] or 0.0 for s in r["stages"]), default=0.0)
                r.update(
                    {
                        "backend": "null",
                        "in_flight": dispatched,
                        "instances": cfg.instances,
                        "checkpoint_mode": rc.checkpoint_mode.value,
                        "close_to_resume_s": r["checkpoint_wall_s"],
                        "stall_all_causes_ms": max(r["max_loop_stall_ms"], late),
                        "fill_wall_s": round(fill_s, 2),
                        "fill_rows_per_s": round(dispatched / fill_s),
                    }
                )
                finish(r)


def run_trainer_side(cfg: TrainerSideConfig, progress: Progress) -> dict[str, Any]:
    """Measure in a fresh subprocess (the module's docstring); its result."""
    progress(f"trainer side alone: checkpoint at N={cfg.in_flight:,} on a null Gym")
    cmd = [
        sys.executable,
        "-m",
        "gymckpt.benchmarks.trainer_side",
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
        timeout=cfg.fill_timeout_s + 600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"trainer-side worker failed:\n{(done.stderr or '').strip()[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["config"] = attrs.asdict(cfg)
    result["label"] = label(cfg.in_flight)
    progress(
        f"trainer side N={cfg.in_flight:,}: {result['close_to_resume_s']:.2f} s close to "
        f"resume, longest stall {result['stall_all_causes_ms']:.1f} ms"
    )
    return result


def _worker(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--worker":
        cfg = TrainerSideConfig(**json.loads(argv[1]))

        def finish(result: dict[str, Any]) -> None:
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # skip tearing down 1M attempts in flight

        trio.run(_main, cfg, "--verbose" in argv, finish)
        return 1  # finish() exits
    print(
        "usage: python -m gymckpt.benchmarks.trainer_side --worker CONFIG_JSON [--verbose]",
        file=sys.stderr,
    )
    return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
