"""``gymckpt demo``: a toy trio trainer against Gym, checkpoints, a real SIGKILL, a restore.

The parent process runs no trainer. It starts phase 1 as a child process; phase 1 trains steps
from prompt groups, checkpoints every ``--checkpoint-every`` steps and prints a line once its
N-th checkpoint is published; the parent then kills it with SIGKILL (phase 1 keeps training until
the signal lands, so work after the checkpoint is lost for real). Phase 2 is a new process: it
restores the latest complete snapshot and finishes the dataset. The parent then judges the run
from files alone:

* the **training journal** (``journal.jsonl``, one fsynced line per trained step, plus a
  ``restore_to_step`` line per restore) gives the lineage of the final model: steps after the
  restored one are discarded, as their weights died with the process;
* the **final snapshot**'s committed calendar state gives every sentinel the environment holds;
* the final ledger gives the rows that failed for good.

Exactly once means: every row trained once in the lineage (no duplicates, none lost), every step
once, and every sentinel a trained episode's plan calls for present exactly once.

``--checkpoint-mode`` is the trainer's ``RuntimeConfig.checkpoint_mode``: aligned (the default)
parks every episode at its next step boundary; unaligned parks none and takes an episode inside
a turn at its last step boundary, with the model calls it completed since. The report's
``episodes_mid_turn`` sums ``CheckpointOutcome.mid_turn`` over the run's checkpoints (both
phases, from the journal). Unaligned, the calendar's turns are longer (``TURN_S``) so a cut
finds episodes inside one; the Gymnasium demo's policy answers after an awaited latency.

Layout: ``demo_options`` (the flags), ``toy_trainer`` (the trainer), ``demo_journal`` (the
training journal), ``demo_crash`` (phase 1 killing itself at a checkpoint stage),
``demo_progress`` (progress lines), ``demo_phase`` (one trainer process), ``demo_parent`` (the
processes, SIGKILL, preemption), ``demo_verdict`` (the verdict from files), ``demo_report``
(printing it). This module is the demo's front door.
"""

from __future__ import annotations

from gymckpt.nurseries import run_exit
from gymckpt.nurseries._shared import leaf_errors

from ..simulation.ends import single_error
from ..toy_trainer import ToyTrainer
from ..verdict import expected_sentinels, snapshot_sentinels
from .journal import JOURNAL, Journal, read_journal
from .options import CRASH_STAGES, MID_PUBLISH, DemoOptions
from .parent import phase_cmd, run_demo, run_until_published
from .phase import PUBLISHED, open_gym, phase_main, run_phase
from .progress import PROGRESS_ENV, Progress
from .verdict import error_report, verdict

__all__ = [
    "CRASH_STAGES",
    "JOURNAL",
    "MID_PUBLISH",
    "PROGRESS_ENV",
    "PUBLISHED",
    "DemoOptions",
    "Journal",
    "ToyTrainer",
    "error_report",
    "expected_sentinels",
    "leaf_errors",
    "open_gym",
    "phase_main",
    "run_demo",
    "run_exit",
    "run_phase",
    "single_error",
    "snapshot_sentinels",
    "verdict",
]

# the names the fault-matrix, crash-restore and training-job tests import from here
_phase_cmd = phase_cmd
_read_journal = read_journal
_run_until_published = run_until_published
_Progress = Progress
