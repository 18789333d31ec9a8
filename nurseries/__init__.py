"""gymckpt orchestration: dispatcher, checkpoint coordinator, restore, trainer facade, CLI."""

from ._coordinator import (
    HOOK_POINTS,
    PAUSE_HOLDER,
    STAGES,
    CheckpointCoordinator,
    CheckpointOutcome,
    CoordinatorStatistics,
)
from ._dispatcher import READY, Dispatcher, DispatcherStatistics
from ._restore import RestoredRun, SnapshotProblems, restore_latest, snapshot_problems
from ._run import ExitCode, leaf_errors, run, run_exit, run_failure
from ._trainer import (
    RESTORED_DIR,
    SNAPSHOTS_DIR,
    TRAINER_STATE_FILE,
    Rollouts,
    open_rollouts,
)

__all__ = [
    "HOOK_POINTS",
    "PAUSE_HOLDER",
    "READY",
    "RESTORED_DIR",
    "SNAPSHOTS_DIR",
    "STAGES",
    "TRAINER_STATE_FILE",
    "CheckpointCoordinator",
    "CheckpointOutcome",
    "CoordinatorStatistics",
    "Dispatcher",
    "DispatcherStatistics",
    "ExitCode",
    "RestoredRun",
    "Rollouts",
    "SnapshotProblems",
    "leaf_errors",
    "open_rollouts",
    "restore_latest",
    "run",
    "run_exit",
    "run_failure",
    "snapshot_problems",
]
