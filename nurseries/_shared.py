"""The orchestration's plumbing that gymckpt's own packages share: private, not API.

The barrier key of a ready group, the collector-pause holder a checkpoint takes, and the
helper that flattens exception groups, for the application and the tests. This is the one
private module of ``gymckpt.nurseries`` that another gymckpt package may import
(``tests/test_layers.py``). The nurseries have no low-level namespace: nothing in them is for a
backend author, who works below them (``gymckpt.runtime.lowlevel``); the trainer API is
``gymckpt.nurseries``.
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
