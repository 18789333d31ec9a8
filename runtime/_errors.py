"""Errors of the runtime, one module for all of them.

Every class here is a plain subclass of a built-in exception whose constructor arguments are
exactly its ``args``, so each pickles and unpickles unchanged: these errors cross Ray.
Messages say what differs and what to do; errors about many episodes carry a count and a short
sample, never every identity (S9, S10).

"Gym is unavailable, the checkpoint may be retried" is one family: ``GymUnavailable`` and its
subclasses (a control-plane failure, a dead instance, an unanswered call, an error that could not
cross a process boundary, replies that never arrived). Classifying a failure is an ``isinstance``
check against that base; nothing keeps a tuple of "retryable" types by hand.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = [
    "BadInput",
    "BudgetExhausted",
    "CheckpointInvariantError",
    "CheckpointsFailed",
    "DatasetError",
    "DatasetMismatch",
    "DeadlineExpired",
    "DrainTimeout",
    "EpisodeConfigFailed",
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
    "ManifestError",
    "Preempted",
    "ReplacementsExhausted",
    "StrandedSessionError",
    "TopologyMismatch",
    "TrainerFilesRefused",
    "WorkDirLocked",
    "crossable_error",
    "crossing_boundary",
    "sample_ids",
    "unpicklable_error",
]

SAMPLE_SIZE = 5


class BadInput(Exception):
    """gymckpt refused what it was given: a snapshot, manifest or configuration file, the
    deployment's topology, a work directory or a Gym server in use. ``gymckpt.run`` ends such a
    run with one line and exit code 2; any other error (a bug in the trainer's own code
    included) keeps its traceback. A mixin: each subclass also derives from the built-in error
    it always was."""


def sample_ids(ids: Iterable[str], limit: int = SAMPLE_SIZE) -> str:
    """Render ``count`` and at most ``limit`` sorted ids: ``"3 (a, b, c)"`` or ``"9 (a, b, …)"``."""
    items = sorted(ids)
    shown = ", ".join(items[:limit])
    more = ", …" if len(items) > limit else ""
    return f"{len(items)} ({shown}{more})"


class GymAdmissionClosed(RuntimeError):
    """Gym refused a ``/run`` row with ``admission_closed`` because a checkpoint is open (S2).

    The attempt goes back to RESERVED with its identity and is re-sent when admission reopens;
    it spends no row attempt and no data budget.
    """

    def __init__(self, rollout_id: str, instance: str = "") -> None:
        super().__init__(rollout_id, instance)
        self.rollout_id = rollout_id
        self.instance = instance

    def __str__(self) -> str:
        where = f" on {self.instance}" if self.instance else ""
        return f"row {self.rollout_id} refused{where}: admission_closed"


class GymUnavailable(RuntimeError):
    """Gym could not serve a call, and nothing the trainer holds changed: retryable (S6).

    The base of every "Gym is unavailable" error; a checkpoint that fails with one of these (and
    nothing else) is reported as ``gym_unavailable`` and retried, up to
    ``max_consecutive_failures``.
    """


class GymCheckpointUnavailable(GymUnavailable):
    """A checkpoint failed in a way that changed nothing the trainer holds (S6): retryable.

    Raised for a checkpoint that could not park, went unanswered, hit a dead actor, or failed in
    Gym's control plane, and in place of any Gym error that cannot be pickled.
    """

    def __init__(self, message: str, instance: str = "", operation: str = "") -> None:
        super().__init__(message, instance, operation)
        self.message = message
        self.instance = instance
        self.operation = operation

    def __str__(self) -> str:
        parts = [p for p in (self.instance, self.operation) if p]
        prefix = f"{' '.join(parts)}: " if parts else ""
        return f"{prefix}{self.message}"


class GymControlError(GymUnavailable):
    """Gym's control plane refused or failed a call (retryable for the checkpoint, S6)."""

    def __init__(self, instance: str, operation: str, message: str) -> None:
        super().__init__(instance, operation, message)
        self.instance = instance
        self.operation = operation
        self.message = message

    def __str__(self) -> str:
        return f"{self.instance} {self.operation}: {self.message}"


class GymInstanceDead(GymUnavailable):
    """The instance is gone (its actor died); every later call fails the same way."""

    def __init__(self, instance: str, operation: str = "") -> None:
        super().__init__(instance, operation)
        self.instance = instance
        self.operation = operation

    def __str__(self) -> str:
        tail = f" (during {self.operation})" if self.operation else ""
        return f"instance {self.instance} is dead{tail}"


class GymConnectionLost(RuntimeError):
    """The trainer cannot reach the cluster its Gym deployment runs on (a Ray cluster whose GCS
    does not answer): nothing can be dispatched, checkpointed or replaced, so the run stops.
    Not retryable from inside the run (not a ``GymUnavailable``); the last published snapshot
    is intact, and a trainer restarted once the cluster is back resumes from it. ``address``
    is the GCS address."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message, address)
        self.message = message
        self.address = address

    def __str__(self) -> str:
        return self.message


class GymCallTimeout(GymUnavailable, TimeoutError):
    """A Gym call got no reply in time, or Gym found its deadline passed (S5); retryable.

    ``message`` names the instance and the call; ``instance`` and ``operation`` say the same for
    code. Also a ``TimeoutError``, so callers that only care about time can catch that.
    """

    def __init__(self, message: str, instance: str = "", operation: str = "") -> None:
        super().__init__(message, instance, operation)
        self.message = message
        self.instance = instance
        self.operation = operation

    def __str__(self) -> str:
        return self.message


def crossable_error(exc: Exception, instance: str, operation: str) -> Exception:
    """``exc`` itself if it survives pickling, else a ``GymCheckpointUnavailable`` naming it.

    Every backend passes a Gym error through this before it crosses a process boundary (Ray) or
    reaches the runtime: an error that cannot be pickled would turn into a Ray error whose cause
    chain the runtime would classify as an invariant, although Gym changed nothing (S6).
    """
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return unpicklable_error(f"{type(exc).__name__}: {exc}", instance, operation)
    return exc


def unpicklable_error(detail: str, instance: str, operation: str) -> GymCheckpointUnavailable:
    """What stands in for a Gym error that could not cross a process boundary (``detail``
    describes it): retryable, since Gym changed nothing by failing to send it."""
    return GymCheckpointUnavailable(
        f"Gym raised an error that cannot be pickled: {detail}", instance, operation
    )


@contextmanager
def crossing_boundary(instance: str, operation: str) -> Iterator[None]:
    """Every ``Exception`` leaving the block is safe to pickle (``crossable_error``).

    One that pickles leaves unchanged, cause chain included; one that does not is replaced by
    ``GymCheckpointUnavailable`` raised ``from None`` (its unpicklable cause stays behind).
    """
    try:
        yield
    except Exception as exc:
        crossing = crossable_error(exc, instance, operation)
        if crossing is exc:
            raise
        raise crossing from None


class CheckpointInvariantError(RuntimeError):
    """An ownership, topology or reply mismatch: the run must abort (S6, exit code 3)."""


class DrainTimeout(GymUnavailable, TimeoutError):
    """Pending episodes whose reply was on the wire did not arrive before the drain deadline.

    Gym did not deliver replies it listed; the checkpoint changed nothing and may be retried.
    """

    def __init__(self, pending: Iterable[str], timeout_s: float) -> None:
        ids = tuple(sorted(pending))
        super().__init__(ids, timeout_s)
        self.pending = ids
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return (
            f"drain timed out after {self.timeout_s:g}s with {sample_ids(self.pending)} "
            "episodes still pending; raise drain_timeout_s or look for lost replies"
        )


class StrandedSessionError(CheckpointInvariantError):
    """A parked legacy agent session that no participant owns: its reply cannot arrive (S10)."""

    def __init__(self, instance: str, sessions: Iterable[str]) -> None:
        ids = tuple(sorted(sessions))
        super().__init__(instance, ids)
        self.instance = instance
        self.sessions = ids

    def __str__(self) -> str:
        return (
            f"instance {self.instance}: {sample_ids(self.sessions)} parked legacy agent sessions "
            "are owned by no participant and cannot reply while Gym is prepared"
        )


class ManifestError(BadInput, ValueError):
    """A manifest or snapshot on disk is unreadable or invalid (C6; exit code 2)."""


class TrainerFilesRefused(BadInput, ValueError):
    """The trainer's ``files=`` writer left something in ``trainer/`` that cannot be a file of
    the snapshot: a link to a directory, a dangling link, a fifo, socket or device. The
    checkpoint fails (``reason="trainer_files"``, retried at the next one) and names the entry."""


class DatasetError(BadInput, ValueError):
    """The trainer's dataset cannot be used as given (exit code 2): a row that is not a finite
    plain JSON value (the message names the row and the place in it), a ``rows`` index outside
    the dataset, a JSONL file that cannot be read, or a row that changed while the run was
    open."""


class DatasetMismatch(BadInput, ValueError):
    """A restore against another dataset than the one its snapshot was made with (exit code 2):
    the first row that differs (both digests), a dataset shorter than the rows the snapshot
    used, or a dataset given to one of the two runs and not to the other. Raised before Gym is
    asked to install anything."""


class TopologyMismatch(BadInput, ValueError):
    """The live deployment or the state on disk differs from the manifest (S8; exit code 2).

    ``differences`` lists every difference, one line each (instance, participant, expected vs
    found). Gym is left untouched.
    """

    def __init__(self, differences: Iterable[str]) -> None:
        diffs = tuple(differences)
        super().__init__(diffs)
        self.differences = diffs

    def __str__(self) -> str:
        head = f"{len(self.differences)} difference(s) between manifest and deployment"
        return head + ": " + "; ".join(self.differences)


class DeadlineExpired(TimeoutError):
    """A request deadline expired; ``what`` says what the request was for (S7)."""

    def __init__(self, key: str, what: str, budget_s: float) -> None:
        super().__init__(key, what, budget_s)
        self.key = key
        self.what = what
        self.budget_s = budget_s

    def __str__(self) -> str:
        return f"deadline of {self.budget_s:g}s expired for {self.key} ({self.what})"


class BudgetExhausted(RuntimeError):
    """Episodes failed as data more often than ``data_failure_budget`` allows, or every row of
    the dataset failed for good: the run stops (exit code 7). The message names the last
    failure (rollout id, instance, the environment's error); each failure is also logged under
    the ``gymckpt`` logger with its traceback."""


class Preempted(Exception):
    """``Rollouts.batches`` ended because SIGTERM or SIGINT preempted the run, not because the
    dataset is done: raised after the final checkpoint, so code after the loop (a final
    evaluation, an upload) does not run on a preemption. ``gymckpt.run`` ends the program with
    exit code 0 (the line naming the final snapshot is already logged); a rerun resumes.
    ``snapshot`` is the path of the snapshot the run left (None: there is none), ``step`` the
    run's step."""

    def __init__(self, signal_name: str, step: int, snapshot: str | None, message: str) -> None:
        super().__init__(signal_name, step, snapshot, message)
        self.signal_name = signal_name
        self.step = step
        self.snapshot = snapshot
        self.message = message

    def __str__(self) -> str:
        return self.message


class CheckpointsFailed(RuntimeError):
    """Checkpoints failed more than ``max_consecutive_failures`` times in a row (exit code 4)."""


class ReplacementsExhausted(RuntimeError):
    """An instance died more often than its replacement budget allows: the run stops (exit
    code 5). ``replacements`` were made or tried within the last ``window_s`` seconds."""

    def __init__(self, instance: str, replacements: int, window_s: float, last: str = "") -> None:
        super().__init__(instance, replacements, window_s, last)
        self.instance = instance
        self.replacements = replacements
        self.window_s = window_s
        self.last = last

    def __str__(self) -> str:
        tail = f" (last replace error: {self.last})" if self.last else ""
        return (
            f"instance {self.instance} died again after {self.replacements} replacements "
            f"within {self.window_s:g}s, its budget (max_replacements per "
            f"replacement_window_s){tail}: find out why it keeps dying, or raise "
            "max_replacements"
        )


class InfraOutage(RuntimeError):
    """Infrastructure stayed down past ``outage_budget_s``: the run stops (exit code 8).
    ``what`` names what is down (a model server's URL in the last failure, or a Gym
    instance), ``down_s`` how long it has been down, ``last`` the last failure it caused.
    Nothing was given up: the rows waiting for it are in the ledger, and a rerun resumes from
    the last snapshot once the infrastructure is back."""

    def __init__(self, what: str, down_s: float, budget_s: float, last: str = "") -> None:
        super().__init__(what, down_s, budget_s, last)
        self.what = what
        self.down_s = down_s
        self.budget_s = budget_s
        self.last = last

    def __str__(self) -> str:
        tail = f" (last: {self.last})" if self.last else ""
        return (
            f"{self.what} down for {self.down_s:.0f}s, past outage_budget_s="
            f"{self.budget_s:g}{tail}: bring it back and run again (it resumes from the last "
            "snapshot), or raise outage_budget_s"
        )


class EpisodeConfigFailed(BadInput, RuntimeError):
    """An episode failed with an ``EpisodeConfigError`` (Gym's ``Failed(..., "config", ...)``):
    the configuration is wrong for every row (a model server that refuses a request field,
    or never returns a required one), so the run stops at the first such failure (exit code
    2) rather than failing every row. ``rollout_id`` and ``instance`` say where it was met,
    ``message`` is Gym's (it names what is wrong and what to change). No row was failed for
    it: the rows are in the ledger, and a rerun after fixing the configuration resumes from
    the last snapshot."""

    def __init__(self, rollout_id: str, instance: str, message: str) -> None:
        super().__init__(rollout_id, instance, message)
        self.rollout_id = rollout_id
        self.instance = instance
        self.message = message

    def __str__(self) -> str:
        where = "" if self.rollout_id in self.message else f"episode {self.rollout_id} on "
        where += f"{self.instance}: " if where else ""
        return (
            f"{where}{self.message}; the configuration is wrong for every row, so the run "
            "stopped at the first such failure: fix it and run again (it resumes from the "
            "last snapshot; no row was failed)"
        )


class WorkDirLocked(BadInput, RuntimeError):
    """Another trainer holds the work directory (exit code 2): two trainers on one work
    directory would race on its snapshots."""

    def __init__(self, workdir: str, pid: int | None) -> None:
        super().__init__(workdir, pid)
        self.workdir = workdir
        self.pid = pid

    def __str__(self) -> str:
        holder = f"process {self.pid}" if self.pid is not None else "another process"
        return (
            f"work directory {self.workdir} is in use by {holder}; one trainer per work "
            "directory — stop that one or choose another directory"
        )


class InstanceDirLocked(WorkDirLocked):
    """Another Gym instance of the same name holds its directory (``<work_dir>/<instance>``,
    exit code 2): a ``gymckpt serve``, or a host with that ``work_dir``. Two of them would both
    write its journal of retained sessions (the second one, started without ``recover``, cuts
    it); the second one is refused before it opens anything."""

    def __str__(self) -> str:
        holder = f"process {self.pid}" if self.pid is not None else "another process"
        return (
            f"instance directory {self.workdir} is in use by {holder}; one Gym instance "
            "(gymckpt serve, or a host with this work_dir) per instance directory — stop that "
            "one, or give this one another work directory (--work-dir) or instance name "
            "(--instance)"
        )


class GymInUse(BadInput, RuntimeError):
    """A Gym instance serves another trainer (exit code 2): another lineage (a run of another
    work directory) holds it, or a newer term of this lineage took it over, fencing this one.
    The instance refused the call and changed nothing."""

    def __init__(self, instance: str, operation: str, message: str) -> None:
        super().__init__(instance, operation, message)
        self.instance = instance
        self.operation = operation
        self.message = message

    def __str__(self) -> str:
        return f"instance {self.instance} {self.operation}: {self.message}"
