"""The names of a rollout snapshot's files and directories (and the work directory's lock), in
one place.

A published snapshot ``ckpt-NNNNNN/`` holds the commit marker (written last: its presence makes
the snapshot complete, and it lists every other top-level file with its sha256), the Gym
manifest, the ledger, the trainer's state and files, and Gym's participant state under ``gym/``.
Every module that reads or writes one of these names imports it from here.
"""

from __future__ import annotations

from typing import Final

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

COMMIT_MARKER: Final = "COMMITTED"
"""The commit marker: written last, it makes the snapshot complete."""
MANIFEST_NAME: Final = "gym_checkpoint.json"
"""The Gym manifest: participant topology, digests and exported episodes."""
LEDGER_FILE: Final = "ledger.json"
"""The recovery ledger's snapshot: attempts, rows trained and failed, results not yet trained."""
TRAINER_STATE_FILE: Final = "trainer.json"
"""The state the trainer saved with the checkpoint (opaque bytes, JSON or not)."""
STEP_FILE: Final = "step.json"
"""The trainer facade's step counter, ``{"step": N}``: steps trained before this snapshot, across
every incarnation (a resumed run's logger steps go on from it, never backwards)."""
TRAINER_FILES_DIR: Final = "trainer"
"""The directory holding the trainer's own files (weights, optimizer shards)."""
GYM_STATE_DIR: Final = "gym"
"""The directory Gym's participants commit their records under (each in its ``state_dir``)."""
SNAPSHOTS_DIR: Final = "snapshots"
"""In the work directory: the snapshot store (``ckpt-NNNNNN/`` …)."""
RESTORED_DIR: Final = "restored"
"""In the work directory: the pinned copies of the snapshots restores started from."""
LOCK_FILE: Final = ".gymckpt.lock"
"""In the work directory (not a snapshot): the lock one trainer holds while it runs."""
