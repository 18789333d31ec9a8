"""``gymckpt bench all`` and ``gymckpt bench report``: run every benchmark, then write the
JSON results, the plots and ``SUMMARY.md`` (headline figures against their targets, saying
plainly what is missed, why, and what it would take).

One module per part: ``_records`` is what the report reads of each result, ``_results`` reads
(structuring each result once into its record) and writes the JSON results, ``_targets`` gives
each target its verdict, ``_misses`` explains the missed ones, one module per benchmark writes its
section of the summary (``_drain``, ``_checkpoint``, ``_fanout``, ``_preserved``,
``_runtime_tables``, ``_per_step``: ``host.json``, the host's cost a step, which ``all`` reads but
never writes), ``_summary`` puts them in order, ``_plots`` draws, ``_run`` runs.
"""

from __future__ import annotations

from ._checkpoint import checkpoint_ray_section, checkpoint_section
from ._plots import plot_checkpoint, plot_drain, plot_fanout, plot_preserved
from ._records import (
    CheckpointRayResult,
    CheckpointResult,
    DispatchResult,
    DrainResult,
    FanoutResult,
    MemoryResult,
    PreservedResult,
)
from ._results import Results, read_result
from ._run import rerender, run_all
from ._scale_run import STEPS, ScaleConfigs, run_scale
from ._summary import write_summary
from ._targets import TARGETS, Status, TargetRow, targets

__all__ = [
    "STEPS",
    "TARGETS",
    "CheckpointRayResult",
    "CheckpointResult",
    "DispatchResult",
    "DrainResult",
    "FanoutResult",
    "MemoryResult",
    "PreservedResult",
    "Results",
    "ScaleConfigs",
    "Status",
    "TargetRow",
    "checkpoint_ray_section",
    "checkpoint_section",
    "plot_checkpoint",
    "plot_drain",
    "plot_fanout",
    "plot_preserved",
    "read_result",
    "rerender",
    "run_all",
    "run_scale",
    "targets",
    "write_summary",
]
