"""gymckpt orchestration: dispatcher, checkpoint coordinator, restore, trainer facade.

The work directory's file names are the runtime's (``gymckpt.runtime._shared``); the few
helpers the application and the tests share are in the private ``gymckpt.nurseries._shared``.
"""

from ._coordinator import (
    HOOK_POINTS,
    STAGES,
    CheckpointCoordinator,
    CheckpointOutcome,
    CoordinatorStatistics,
)
from ._dispatcher import Dispatcher, DispatcherStatistics
from ._restore import RestoredRun, SnapshotProblems, restore_latest, snapshot_problems
from ._run import ExitCode, run, run_exit, run_failure
from ._trainer import Rollouts, open_rollouts

__all__ = [
    "HOOK_POINTS",
    "STAGES",
    "CheckpointCoordinator",
    "CheckpointOutcome",
    "CoordinatorStatistics",
    "Dispatcher",
    "DispatcherStatistics",
    "ExitCode",
    "RestoredRun",
    "Rollouts",
    "SnapshotProblems",
    "open_rollouts",
    "restore_latest",
    "run",
    "run_exit",
    "run_failure",
    "snapshot_problems",
]
