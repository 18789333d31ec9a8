"""gymckpt runtime: state and synchronisation for rollout checkpoints, with no Gym I/O.

What a trainer or a backend author needs is re-exported here: the primitives and their
statistics, the ledger and its records, the records a backend returns (``InstanceRecord``,
``ParticipantRecord``, ``EpisodeRecord``, ``records_digest``), the snapshot store, the
configuration, the failure classification and the error family. The runtime's tools a backend
author may also use (errors made to cross a process, plain-data checks, atomic writes, the
garbage collector around a checkpoint) are one namespace down, in ``gymckpt.runtime.lowlevel``.
The modules behind both are private; the plumbing gymckpt's own packages share (the work
directory's file names, the manifest and ledger snapshot formats, the converter) goes through
one of them, ``gymckpt.runtime._shared``.
"""

from ._barrier import ANY, BarrierStatistics, MutationBarrier
from ._config import CheckpointMode, RuntimeConfig
from ._config_file import runtime_config_from_toml
from ._dataset import TaskDataset
from ._deadlines import DeadlineRegistry, DeadlineStatistics
from ._drain import wait_drained
from ._errors import (
    BadInput,
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    DatasetError,
    DatasetMismatch,
    DeadlineExpired,
    DrainTimeout,
    EpisodeConfigFailed,
    GymAdmissionClosed,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    GymControlError,
    GymInstanceDead,
    GymInUse,
    GymUnavailable,
    InfraOutage,
    InstanceDirLocked,
    ManifestError,
    Preempted,
    ReplacementsExhausted,
    StrandedSessionError,
    TopologyMismatch,
    TrainerFilesRefused,
    WorkDirLocked,
)
from ._failures import FailureKind, failure_kind
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
    RestoreSummary,
    RetireItem,
    rollout_id_for,
)
from ._metrics import ADMISSION_CLOSED_ROWS, Metrics
from ._plain import NotPlainData
from ._snapshot_format import EpisodeRecord, InstanceRecord, ParticipantRecord
from ._store import (
    LoadedSnapshot,
    PublishStats,
    SnapshotInfo,
    SnapshotStore,
    load_snapshot,
    records_digest,
    verify_snapshot,
)
from ._trainer_term import TrainerTerm
from ._workdir import WorkDirLock, workdir_of

__all__ = [
    "ADMISSION_CLOSED_ROWS",
    "ANY",
    "Attempt",
    "AttemptState",
    "BadInput",
    "BarrierStatistics",
    "BudgetExhausted",
    "CheckpointInvariantError",
    "CheckpointMode",
    "CheckpointsFailed",
    "CompletedGroup",
    "DatasetError",
    "DatasetMismatch",
    "DeadlineExpired",
    "DeadlineRegistry",
    "DeadlineStatistics",
    "DispatchGate",
    "DrainTimeout",
    "EpisodeConfigFailed",
    "EpisodeRecord",
    "EpisodeResult",
    "FailureClass",
    "FailureKind",
    "GateStatistics",
    "GymAdmissionClosed",
    "GymCallTimeout",
    "GymCheckpointUnavailable",
    "GymConnectionLost",
    "GymControlError",
    "GymInUse",
    "GymInstanceDead",
    "GymUnavailable",
    "InfraOutage",
    "InstanceDirLocked",
    "InstanceRecord",
    "LedgerStatistics",
    "LoadedSnapshot",
    "ManifestError",
    "Metrics",
    "MutationBarrier",
    "NotPlainData",
    "ParticipantRecord",
    "Preempted",
    "PublishStats",
    "RecoveryLedger",
    "ReplacementsExhausted",
    "RestoreSummary",
    "RestoredGymState",
    "RetireItem",
    "RuntimeConfig",
    "SnapshotInfo",
    "SnapshotStore",
    "StrandedSessionError",
    "TaskDataset",
    "TopologyMismatch",
    "TrainerFilesRefused",
    "TrainerTerm",
    "WorkDirLock",
    "WorkDirLocked",
    "failure_kind",
    "load_snapshot",
    "records_digest",
    "rollout_id_for",
    "runtime_config_from_toml",
    "verify_snapshot",
    "wait_drained",
    "workdir_of",
]
