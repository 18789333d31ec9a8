"""gymckpt.nurseries.lowlevel: orchestration plumbing that the application and tests use.

The barrier key of a ready group, the collector-pause holder a checkpoint takes, and the
helper that flattens exception groups; the trainer API is ``gymckpt.nurseries``.
"""

from __future__ import annotations

from ._coordinator import PAUSE_HOLDER
from ._dispatcher import READY
from ._run import leaf_errors

__all__ = [
    "PAUSE_HOLDER",
    "READY",
    "leaf_errors",
]
