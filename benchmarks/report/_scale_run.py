"""``gymckpt bench issue34``: exactly the measurements the targets at scale need, in one run,
then their verdicts (``ISSUE34.md``) and, when the directory holds a whole ``bench all`` run,
SUMMARY.md re-rendered with them.

The steps, in order (the cheap and sensitive ones first; the remote backends last, since they
start Ray and server processes), each with its rough time on a quiet 2-core machine (about 7
minutes in all, measured at 1867141):

1. the trainer side alone at 1M in flight (``checkpoint --backend null``), ~1 min;
2. dispatch through the whole loop, null and embedded Gym (``dispatch --loop``, with the gate
   and ledger table at 200k), ~1 min;
3. the host on CartPole (``host``: per step against plain Gymnasium, marks on demand, the
   loop; Ray's part skipped with ``--no-ray``), ~1 min;
4. the embedded checkpoint at 200k, three modes, three checkpoints each (``checkpoint``,
   turns of mean ``TURN_MEAN_S``: their p99 far above every timeout, the reference protocol's
   one-hour bound included), ~3 min;
5. the checkpoint at 200k on Ray with 4 actors then over HTTP with 4 servers, unaligned and
   ``aligned_timeout`` (``checkpoint --backend both --modes unaligned,aligned_timeout``; skipped
   with ``--no-ray``), ~3 min.

Each step writes its JSON result into ``--out`` as ``bench all`` names it (``trainer_side.json``,
``dispatch.json``, ``host.json``, ``checkpoint.json``, ``checkpoint_ray.json``); a step that
raises is recorded in ``issue34.json`` as failed and the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from gymckpt.runtime.lowlevel import write_atomic

from .._common import Progress, describe_error
from ..checkpoint import CheckpointConfig, run_checkpoint
from ..checkpoint_ray import CheckpointRayConfig, run_remote_checkpoints
from ..dispatch import DispatchConfig, run_dispatch
from ..host import HostBenchConfig, run_host
from ..trainer_side import TrainerSideConfig, run_trainer_side
from ._checkpoint import trainer_side_section
from ._format import Add
from ._modes import mode_miss_lines
from ._records import (
    CheckpointRayResult,
    CheckpointResult,
    DispatchResult,
    HostResult,
    TrainerSideResult,
)
from ._results import dump, load_result, read_result
from ._scale_misses import scale_miss_lines
from ._scale_targets import scale_rows
from ._targets import Status, TargetRow, _Rows, _unaligned_embedded_rows

__all__ = ["STEPS", "ScaleConfigs", "run_scale"]

STEPS = (
    ("trainer_side", "trainer side alone at 1M in flight", 1),
    ("dispatch", "dispatch through the whole loop, null and embedded Gym", 1),
    ("host", "the host on CartPole", 1),
    ("checkpoint", "embedded checkpoint at 200k, three modes", 3),
    ("checkpoint_ray", "checkpoint at 200k on Ray, then over HTTP", 3),
)
"""(result name, what it measures, rough minutes on a quiet machine), in the order run."""


TURN_MEAN_S = 2_000.0
"""The embedded checkpoint's mean turn length here: lognormal with sigma 2 capped at 21 times
the median, so p99 = the cap = 11,400 s, far above every timeout of both aligned modes (the
default 1 s alignment and 10 s control timeouts; the reference protocol's one-hour control
bound and the host's one-hour lease), as the target asks; and 100 turn ends a real second at
200k, light for the unaligned checkpoint's real-time figures."""


REMOTE_MODES = ("unaligned", "aligned_timeout")
"""The modes measured on Ray and over HTTP here: the targets' unaligned checkpoint, and the
default configuration's aligned one (the reference protocol's wait for the slowest turn, minutes
in real time, is not among the targets)."""


@attrs.define
class ScaleConfigs:
    """Each step's configuration; None skips it (``--no-ray``: the remote checkpoints)."""

    trainer_side: TrainerSideConfig
    dispatch: DispatchConfig
    host: HostBenchConfig
    checkpoint: CheckpointConfig
    checkpoint_ray: CheckpointRayConfig | None

    @classmethod
    def of(cls, quick: bool, remote: bool) -> ScaleConfigs:
        """The issue's sizes (200k, 1M), or the quick ones."""
        ts = TrainerSideConfig.quick_defaults() if quick else TrainerSideConfig()
        dp = DispatchConfig.quick_defaults() if quick else DispatchConfig()
        dp.loop = True
        host = HostBenchConfig.quick_defaults() if quick else HostBenchConfig()
        host.ray = remote
        ck = CheckpointConfig.quick_defaults() if quick else CheckpointConfig()
        ck.turn_mean_s = TURN_MEAN_S
        cr = CheckpointRayConfig.quick_defaults() if quick else CheckpointRayConfig()
        cr.modes = REMOTE_MODES
        return cls(ts, dp, host, ck, attrs.evolve(cr, in_flight=ck.in_flight) if remote else None)


def run_scale(
    cfgs: ScaleConfigs, out: Path, meta: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    """Run the steps into ``out``; the targets' rows; ``ISSUE34.md`` (and SUMMARY.md when
    ``out`` holds ``bench all``'s results)."""
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Callable[[], dict[str, Any]] | None] = {
        "trainer_side": lambda: run_trainer_side(cfgs.trainer_side, progress),
        "dispatch": lambda: run_dispatch(cfgs.dispatch, progress),
        "host": lambda: run_host(cfgs.host, progress),
        "checkpoint": lambda: run_checkpoint(cfgs.checkpoint, progress),
        "checkpoint_ray": None
        if cfgs.checkpoint_ray is None
        else lambda: run_remote_checkpoints(cfgs.checkpoint_ray, ("ray", "http"), progress),
    }
    steps: dict[str, Any] = {}
    left = sum(m for _n, _w, m in STEPS)
    for k, (name, what, minutes) in enumerate(STEPS, 1):
        run = runs[name]
        if run is None:
            steps[name] = {"ok": None, "skipped": "--no-ray"}
            progress(f"step {k}/{len(STEPS)}: {what}: skipped (--no-ray)")
            left -= minutes
            continue
        progress(f"step {k}/{len(STEPS)}: {what} (~{minutes} min; ~{left} min left in all)")
        t0 = time.monotonic()
        try:
            dump(out / f"{name}.json", {**run(), "meta": meta})
            steps[name] = {"ok": True}
        except Exception as exc:  # a step that cannot run is a result, not the run's end
            steps[name] = {"ok": False, "error": describe_error(exc)}
            progress(f"step {k} failed: {describe_error(exc)}")
        steps[name]["seconds"] = round(time.monotonic() - t0, 1)
        left -= minutes
    rows, misses = scale_verdicts(out)
    trainer_side = _read(out, "trainer_side", TrainerSideResult)
    write_scale_report(out / "ISSUE34.md", rows, misses, meta, steps, trainer_side)
    files = [str(out / f"{n}.json") for n, s in steps.items() if s.get("ok")]
    files.append(str(out / "ISSUE34.md"))
    if all((out / f"{n}.json").exists() for n in ("drain", "memory", "dispatch")):
        from ._run import rerender

        files += rerender(out)["files"]
    result = {
        "report": str(out / "ISSUE34.md"),
        "verdicts": [f"{t.status.value}: {t.key}: {t.measured}" for t in rows],
        "steps": steps,
        "targets": [t.to_json() for t in rows],
        "files": files,
        "meta": meta,
    }
    dump(out / "issue34.json", result)
    return result


def _read(out: Path, name: str, cls: type) -> Any:
    """``<name>.json`` in ``out`` as ``cls``, None when there is none."""
    data = load_result(out, f"{name}.json")
    return None if data is None else read_result(data, cls, f"{name}.json")


def scale_verdicts(out: Path) -> tuple[list[TargetRow], list[str]]:
    """The targets at scale on the results in ``out`` (the unaligned embedded rows first),
    and the misses with what it would take."""
    checkpoint = _read(out, "checkpoint", CheckpointResult)
    checkpoint_ray = _read(out, "checkpoint_ray", CheckpointRayResult)
    dispatch = _read(out, "dispatch", DispatchResult)
    host = _read(out, "host", HostResult)
    trainer_side = _read(out, "trainer_side", TrainerSideResult)
    row = _Rows()
    _unaligned_embedded_rows(row, checkpoint)
    scale_rows(row, checkpoint, checkpoint_ray, dispatch, host, trainer_side)
    missed = {t.key for t in row.rows if t.status is Status.MISSED}
    measured = {t.key: t.measured for t in row.rows}
    misses = mode_miss_lines(missed, checkpoint, None)
    misses += scale_miss_lines(
        missed, measured, checkpoint, checkpoint_ray, dispatch, host, trainer_side
    )
    return row.rows, misses


def write_scale_report(
    path: Path,
    rows: list[TargetRow],
    misses: list[str],
    meta: dict[str, Any],
    steps: dict[str, Any],
    trainer_side: TrainerSideResult | None = None,
) -> None:
    """``ISSUE34.md``: the command, the steps, the targets table, the misses, and the trainer
    side's stages."""
    lines: list[str] = []
    add: Add = lines.append
    src = meta.get("source") or {}
    add("# Targets at scale (issue 34)")
    add("")
    add(
        f"Produced by `{meta['command']}` on {meta['machine']['date_utc']}, commit "
        f"`{src.get('commit_full') or src.get('commit')}`"
        + (" with uncommitted changes." if src.get("uncommitted_changes") else ".")
    )
    add("")
    for name, what, _m in STEPS:
        s = steps.get(name, {})
        state = (
            "skipped (--no-ray)"
            if s.get("ok") is None
            else f"{s.get('seconds')} s"
            if s.get("ok")
            else f"failed: {s.get('error')}"
        )
        add(f"- {what} (`{name}.json`): {state}")
    add("")
    add("| figure | target | measured | |")
    add("| --- | --- | --- | --- |")
    for t in rows:
        add(f"| {t.figure} | {t.target} | {t.measured} | {t.status.cell()} |")
    add("")
    add("## Where a target is missed, and what it would take")
    add("")
    lines.extend(misses or ["- Nothing measured is missed."])
    add("")
    if trainer_side is not None:
        trainer_side_section(add, trainer_side)
    write_atomic(path, "\n".join(lines).encode())
