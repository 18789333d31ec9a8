"""The names of a rollout snapshot's files and directories (and the work directory's lock).

Their one home is ``_snapshot_format``; this module re-exports them for the modules that import
them from here.
"""

from __future__ import annotations

from ._snapshot_format import (
    COMMIT_MARKER,
    GYM_STATE_DIR,
    LEDGER_FILE,
    LOCK_FILE,
    MANIFEST_NAME,
    RESTORED_DIR,
    SNAPSHOTS_DIR,
    STEP_FILE,
    TRAINER_FILES_DIR,
    TRAINER_STATE_FILE,
)

__all__ = [
    "COMMIT_MARKER",
    "GYM_STATE_DIR",
    "LEDGER_FILE",
    "LOCK_FILE",
    "MANIFEST_NAME",
    "RESTORED_DIR",
    "SNAPSHOTS_DIR",
    "STEP_FILE",
    "TRAINER_FILES_DIR",
    "TRAINER_STATE_FILE",
]
