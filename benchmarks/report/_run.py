"""``gymckpt bench all`` and ``gymckpt bench report``: run every benchmark and write its JSON
result, then draw the plots and write ``SUMMARY.md``; or draw and write them again from the
results already on disk (after a change to the report itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._common import Progress
from ..checkpoint import CheckpointConfig, run_checkpoint
from ..checkpoint_ray import CheckpointRayConfig, run_remote_checkpoints
from ..dispatch import DispatchConfig, run_dispatch
from ..drain import DrainConfig, run_drain
from ..fanout import FanoutConfig, run_fanout
from ..memory import run_memory
from ..preserved import PreservedConfig, run_preserved
from ..sandbox import SandboxBenchConfig, run_sandbox
from ..trainer_side import TrainerSideConfig, run_trainer_side
from ._plots import plot_checkpoint, plot_drain, plot_fanout, plot_preserved
from ._results import Result, Results, dump, flat, load_result, other_runs
from ._summary import results_targets, write_summary

__all__ = ["rerender", "run_all"]


def run_all(
    *,
    drain_cfg: DrainConfig,
    memory_sizes: tuple[int, ...],
    dispatch_cfg: DispatchConfig,
    checkpoint_cfg: CheckpointConfig,
    fanout_cfg: FanoutConfig | None,
    preserved_cfg: PreservedConfig | None,
    out: Path,
    meta: dict[str, Any],
    progress: Progress,
    checkpoint_ray_cfg: CheckpointRayConfig | None = None,
    remote_backends: tuple[str, ...] = ("ray", "http"),
    trainer_side_cfg: TrainerSideConfig | None = None,
    sandbox_cfg: SandboxBenchConfig | None = None,
) -> dict[str, Any]:
    """Every benchmark, then the JSON results, the plots and SUMMARY.md in ``out``.
    ``fanout_cfg`` and ``checkpoint_ray_cfg`` None skip the Ray parts (``--no-ray``); both
    measure Ray and HTTP side by side (``remote_backends``, the checkpoint's: Ray, then HTTP
    at the same size). A remote checkpoint that cannot run (Ray does not start, the worker
    dies) is a result (``checkpoint_ok`` false, with the error), not the end of the run. A
    ``host.json`` already in ``out`` (``gymckpt bench host --json``, never run by ``all``) is
    read into the report and named as another run's. ``trainer_side_cfg`` None: no trainer side."""
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []

    def write(name: str, result: Result) -> Result:
        dump(out / name, {**result, "meta": meta})
        files.append(out / name)
        return result

    drain = write("drain.json", run_drain(drain_cfg, progress, gc_freeze_variant=True))
    memory = write("memory.json", run_memory(memory_sizes, progress))
    dispatch = write("dispatch.json", run_dispatch(dispatch_cfg, progress))
    checkpoint = write("checkpoint.json", run_checkpoint(checkpoint_cfg, progress))
    opt: dict[str, Result | None] = dict.fromkeys(STALE_FILES)  # the benchmarks all may skip
    if trainer_side_cfg is not None:
        trainer_side = run_trainer_side(trainer_side_cfg, progress)
        opt["trainer_side"] = write("trainer_side.json", trainer_side)
    if checkpoint_ray_cfg is not None:
        remote = run_remote_checkpoints(checkpoint_ray_cfg, remote_backends, progress)
        opt["checkpoint_ray"] = write("checkpoint_ray.json", remote)
    if fanout_cfg is not None:
        opt["fanout"] = write("fanout.json", run_fanout(fanout_cfg, progress))
    if preserved_cfg is not None:
        opt["preserved"] = write("preserved.json", run_preserved(preserved_cfg, progress))
    if sandbox_cfg is not None:
        opt["sandbox"] = write("sandbox.json", run_sandbox(sandbox_cfg, progress))
    _forget_stale(out, opt)
    progress("writing plots and SUMMARY.md")
    host = load_result(out, "host.json")  # `bench host`, run on its own: kept, and named
    results = Results.of(
        drain=drain,
        memory=memory,
        dispatch=dispatch,
        meta=meta,
        checkpoint=checkpoint,
        host=host,
        others=other_runs(meta, {"host.json": host}),
        **opt,
    )
    files += _render(results, out)
    written = {"drain": drain, "memory": memory, "dispatch": dispatch, "checkpoint": checkpoint}
    written.update(opt)
    return {
        **{name: flat(result) for name, result in written.items()},
        "targets": [t.to_json() for t in results_targets(results)],
        "files": [str(p) for p in files],
        "meta": meta,
    }


STALE_FILES = {
    "checkpoint_ray": ("checkpoint_ray.json",),
    "fanout": ("fanout.json", "fanout.png"),
    "preserved": ("preserved.json", "preserved_work.png"),
    "trainer_side": ("trainer_side.json",),
    "sandbox": ("sandbox.json",),
}
"""The files of each benchmark ``all`` may skip (its JSON result and its plot)."""


def _forget_stale(out: Path, results: dict[str, Result | None]) -> None:
    """Remove the files (``STALE_FILES``) of each benchmark this run skipped (None): results
    of an earlier run must not pass for this one's."""
    for name, result in results.items():
        if result is None:
            for file in STALE_FILES[name]:
                (out / file).unlink(missing_ok=True)


def rerender(out: Path) -> dict[str, Any]:
    """Rewrite the plots and SUMMARY.md from the JSON results already in ``out`` (after a
    change to the report itself; the figures and the command that produced them are kept)."""
    results = Results.read(out)
    return {"files": [str(p) for p in _render(results, out)], "meta": results.meta}


def _render(results: Results, out: Path) -> list[Path]:
    """Draw the plots and write SUMMARY.md in ``out``; the files written, SUMMARY.md last."""
    plots = plot_drain(results.drain, out)
    if results.checkpoint is not None:
        plots += plot_checkpoint(results.checkpoint, out)
    if results.fanout is not None:
        plots += plot_fanout(results.fanout, out)
    if results.preserved is not None:
        plots += plot_preserved(results.preserved, out)
    summary = out / "SUMMARY.md"
    write_summary(summary, results, plots)
    return [*plots, summary]
