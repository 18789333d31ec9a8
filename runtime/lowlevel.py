"""gymckpt.runtime.lowlevel: the runtime's plumbing that gymckpt's other packages share.

Not what a trainer or a backend author needs (that is ``gymckpt.runtime``), but what the Gym
host, the coordinator, the restore, the CLI and the benchmarks build on: the snapshot's file
names and versions and the functions that read and write its files atomically, the manifest
the ledger snapshot, the Gym host's participant records and the step record, the garbage
collector held still around a checkpoint, the project's converter, plain-data checks, errors
prepared to cross a process, and topology comparison.
The layer test lets every package import this module, as trio's own packages use
``trio.lowlevel``; nothing here is re-exported by ``gymckpt.runtime``.
"""

from __future__ import annotations

from ._collector import (
    FULL_COLLECTION_EVERY,
    collector_paused,
    freeze_startup_objects,
    promote_survivors,
)
from ._config_file import load_toml_table, structure_table
from ._converter import converter, dumps_chunked, structure
from ._dataset import row_ranges
from ._dataset_record import (
    DATASET_FILE,
    DATASET_ROWS_FILE,
    DatasetIdentity,
    DatasetRecord,
    check_dataset,
    load_dataset_record,
    merge_ranges,
)
from ._errors import crossable_error, crossing_boundary, sample_ids, unpicklable_error
from ._plain import all_finite, checked_json, plain_problem
from ._row_order import ORDER_FILE, OrderRecord, RowOrder, check_order, load_order_record
from ._snapshot_format import (
    COMMIT_MARKER,
    GYM_STATE_DIR,
    LEDGER_FILE,
    LOCK_FILE,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    PARTICIPANT_KIND_RE,
    PARTICIPANT_KINDS,
    RECORDS_FILE,
    RESTORED_DIR,
    SNAPSHOTS_DIR,
    STEP_FILE,
    TRAINER_FILES_DIR,
    TRAINER_STATE_FILE,
    AgentRecords,
    AgentSession,
    AttemptRow,
    CommittedRecords,
    GymManifest,
    LedgerSnapshot,
    SessionRecord,
    SessionRecords,
    StagedCall,
    StagedEpisode,
    StagedRecords,
    StepRecord,
    agent_records_plain,
    dump_ledger_snapshot,
    dump_manifest,
    dump_records,
    dump_step,
    load_ledger_snapshot,
    load_manifest,
    load_records,
    load_step,
    records_to_plain,
    session_records_plain,
    staged_records_plain,
)
from ._store import (
    CommitMarker,
    check_snapshot,
    fsync_dir,
    participant_state_problem,
    state_dir_problem,
    tree_size,
    write_atomic,
)
from ._topology import LiveTopology, participant_differences, topology_differences
from ._trainer_term import TERM_FILE, next_term

__all__ = [
    "COMMIT_MARKER",
    "DATASET_FILE",
    "DATASET_ROWS_FILE",
    "FULL_COLLECTION_EVERY",
    "GYM_STATE_DIR",
    "LEDGER_FILE",
    "LOCK_FILE",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "ORDER_FILE",
    "PARTICIPANT_KINDS",
    "PARTICIPANT_KIND_RE",
    "RECORDS_FILE",
    "RESTORED_DIR",
    "SNAPSHOTS_DIR",
    "STEP_FILE",
    "TERM_FILE",
    "TRAINER_FILES_DIR",
    "TRAINER_STATE_FILE",
    "AgentRecords",
    "AgentSession",
    "AttemptRow",
    "CommitMarker",
    "CommittedRecords",
    "DatasetIdentity",
    "DatasetRecord",
    "GymManifest",
    "LedgerSnapshot",
    "LiveTopology",
    "OrderRecord",
    "RowOrder",
    "SessionRecord",
    "SessionRecords",
    "StagedCall",
    "StagedEpisode",
    "StagedRecords",
    "StepRecord",
    "agent_records_plain",
    "all_finite",
    "check_dataset",
    "check_order",
    "check_snapshot",
    "checked_json",
    "collector_paused",
    "converter",
    "crossable_error",
    "crossing_boundary",
    "dump_ledger_snapshot",
    "dump_manifest",
    "dump_records",
    "dump_step",
    "dumps_chunked",
    "freeze_startup_objects",
    "fsync_dir",
    "load_dataset_record",
    "load_ledger_snapshot",
    "load_manifest",
    "load_order_record",
    "load_records",
    "load_step",
    "load_toml_table",
    "merge_ranges",
    "next_term",
    "participant_differences",
    "participant_state_problem",
    "plain_problem",
    "promote_survivors",
    "records_to_plain",
    "row_ranges",
    "sample_ids",
    "session_records_plain",
    "staged_records_plain",
    "state_dir_problem",
    "structure",
    "structure_table",
    "topology_differences",
    "tree_size",
    "unpicklable_error",
    "write_atomic",
]
