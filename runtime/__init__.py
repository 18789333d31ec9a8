"""gymckpt runtime: state and synchronisation for rollout checkpoints, with no Gym I/O.

Public names are re-exported here; the modules behind them are private.
"""

from ._barrier import ANY, BarrierStatistics, MutationBarrier
from ._config import RuntimeConfig
from ._converter import converter, structure
from ._deadlines import DeadlineRegistry, DeadlineStatistics
from ._drain import wait_drained
from ._errors import (
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    DeadlineExpired,
    DrainTimeout,
    GymAdmissionClosed,
    GymCheckpointUnavailable,
    ManifestError,
    StrandedSessionError,
    TopologyMismatch,
    WorkDirLocked,
    sample_ids,
)
from ._gate import DispatchGate, GateStatistics
from ._ledger import (
    Attempt,
    AttemptState,
    CompletedGroup,
    EpisodeResult,
    FailureClass,
    LedgerStatistics,
    RecoveryLedger,
    RestoredGymState,
    RetireItem,
    rollout_id_for,
)
from ._manifest import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    PARTICIPANT_KINDS,
    EpisodeRecord,
    GymManifest,
    InstanceRecord,
    ParticipantRecord,
)
from ._metrics import ADMISSION_CLOSED_ROWS, Metrics
from ._store import (
    COMMIT_MARKER,
    GYM_STATE_DIR,
    CommitMarker,
    LoadedSnapshot,
    SnapshotInfo,
    SnapshotStore,
    check_snapshot,
    fsync_dir,
    load_snapshot,
    participant_state_problem,
    records_digest,
    verify_snapshot,
    write_atomic,
)
from ._workdir import LOCK_FILE, WorkDirLock

__all__ = [
    "ADMISSION_CLOSED_ROWS",
    "ANY",
    "COMMIT_MARKER",
    "GYM_STATE_DIR",
    "LOCK_FILE",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "PARTICIPANT_KINDS",
    "Attempt",
    "AttemptState",
    "BarrierStatistics",
    "BudgetExhausted",
    "CheckpointInvariantError",
    "CheckpointsFailed",
    "CommitMarker",
    "CompletedGroup",
    "DeadlineExpired",
    "DeadlineRegistry",
    "DeadlineStatistics",
    "DispatchGate",
    "DrainTimeout",
    "EpisodeRecord",
    "EpisodeResult",
    "FailureClass",
    "GateStatistics",
    "GymAdmissionClosed",
    "GymCheckpointUnavailable",
    "GymManifest",
    "InstanceRecord",
    "LedgerStatistics",
    "LoadedSnapshot",
    "ManifestError",
    "Metrics",
    "MutationBarrier",
    "ParticipantRecord",
    "RecoveryLedger",
    "RestoredGymState",
    "RetireItem",
    "RuntimeConfig",
    "SnapshotInfo",
    "SnapshotStore",
    "StrandedSessionError",
    "TopologyMismatch",
    "WorkDirLock",
    "WorkDirLocked",
    "check_snapshot",
    "converter",
    "fsync_dir",
    "load_snapshot",
    "participant_state_problem",
    "records_digest",
    "rollout_id_for",
    "sample_ids",
    "structure",
    "verify_snapshot",
    "wait_drained",
    "write_atomic",
]
