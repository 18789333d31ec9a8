"""The runtime's plumbing that gymckpt's own packages share: private, not API.

The Gym host, the transports, the coordinator, the restore, the application, the conformance
kits and the benchmarks build on these: the snapshot's file names and versions, the manifest,
the ledger snapshot, the Gym host's participant records and the step record with their readers
and writers, the dataset and row-order records, the trainer term file, the project's
converter, the TOML table readers, the startup freeze of the garbage collector, errors'
sample of ids, tree sizes and state-directory checks, and topology comparison.

This is the one private module of ``gymckpt.runtime`` that another gymckpt package may import
(``tests/test_layers.py``: only a package allowed to import the runtime, and only the names in
``__all__``); what a backend author may use is ``gymckpt.runtime.lowlevel``, and no name is in
both. Nothing here is stable: it changes with the packages that share it.
"""

from __future__ import annotations

from ._collector import (
    FULL_COLLECTION_EVERY,
    freeze_startup_objects,
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
from ._errors import sample_ids
from ._plain import all_finite
from ._row_order import ORDER_FILE, OrderRecord, RowOrder, check_order, load_order_record
from ._slices import release_in_slices, set_in_slices
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
    STAGING_PREFIX,
    STEP_FILE,
    TRAINER_FILES_DIR,
    TRAINER_STATE_FILE,
    AgentRecords,
    AgentSession,
    AttemptRow,
    ChunkedRecords,
    CommittedRecords,
    EpisodeColumns,
    GymManifest,
    LedgerSnapshot,
    SessionRecord,
    SessionRecords,
    StagedCall,
    StagedEpisode,
    StagedRecords,
    StepRecord,
    agent_records_plain,
    chunk_records,
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
    split_chunks,
    staged_records_plain,
)
from ._store import (
    CommitMarker,
    check_snapshot,
    participant_state_problem,
    read_snapshot_records,
    state_dir_problem,
    tree_size,
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
    "STAGING_PREFIX",
    "STEP_FILE",
    "TERM_FILE",
    "TRAINER_FILES_DIR",
    "TRAINER_STATE_FILE",
    "AgentRecords",
    "AgentSession",
    "AttemptRow",
    "ChunkedRecords",
    "CommitMarker",
    "CommittedRecords",
    "DatasetIdentity",
    "DatasetRecord",
    "EpisodeColumns",
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
    "chunk_records",
    "converter",
    "dump_ledger_snapshot",
    "dump_manifest",
    "dump_records",
    "dump_step",
    "dumps_chunked",
    "freeze_startup_objects",
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
    "read_snapshot_records",
    "records_to_plain",
    "release_in_slices",
    "row_ranges",
    "sample_ids",
    "session_records_plain",
    "set_in_slices",
    "split_chunks",
    "staged_records_plain",
    "state_dir_problem",
    "structure",
    "structure_table",
    "topology_differences",
    "tree_size",
]
