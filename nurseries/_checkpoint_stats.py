"""CheckpointStatsTracker: a coordinator's checkpoint counts, metrics and log lines.

Every number and line a checkpoint reports is written here, so the protocol's code only says
what happened. The metric names follow Flink's checkpoint metrics:

* ``checkpoint/completed_total``, ``checkpoint/failed_total``, ``checkpoint/restored_total``:
  present (at 0) from the start; ``checkpoint/ok_total`` beside ``completed_total``;
* ``checkpoint/<kind>_total`` per retryable kind (``gym_unavailable``, ``snapshot_io``,
  ``trainer_files``), ``checkpoint/invariant_failures_total``;
* ``checkpoint/consecutive_failures``; ``checkpoint/since_last_completed_s`` (a mark);
* ``checkpoint/last_duration_s`` of the last checkpoint, completed or not, and
  ``checkpoint/last_size_bytes`` of the last completed one; ``checkpoint/stage_<name>_s``;
* of the last completed checkpoint: ``checkpoint/last_episodes`` and
  ``checkpoint/last_mid_turn`` (episodes taken in the middle of a turn, unaligned or past the
  alignment timeout), with ``checkpoint/mid_turn_total`` over the run;
* per stage: ``checkpoint/drain_pending``, ``checkpoint/retired_dropped_total``,
  ``checkpoint/restore_retire_total``, ``checkpoint/resume_failures_total``.

A failed checkpoint's stage timings are recorded like a completed one's; a checkpoint whose
``trainer_files`` writer raised (the trainer's own error) is only counted as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs
import trio

from gymckpt.runtime import FailureKind, Metrics

__all__ = ["CheckpointStatsTracker"]

logger = logging.getLogger("gymckpt")


@attrs.define(eq=False, slots=True)
class CheckpointStatsTracker:
    """Counts of checkpoints that completed and failed, and the metrics and log lines of each.

    Invariant: ``ok_total + failed_total`` is every checkpoint that returned an outcome or
    raised.
    """

    metrics: Metrics
    ok_total: int = attrs.field(default=0, init=False)
    failed_total: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        for name in ("completed_total", "failed_total", "restored_total"):
            self.metrics.inc(f"checkpoint/{name}", 0)  # present from the start, like Flink's

    def completed(self, stage_s: Mapping[str, float]) -> None:
        """A checkpoint was published (its size follows with ``record_last``)."""
        self.ok_total += 1
        self.metrics.inc("checkpoint/ok_total")
        self.metrics.inc("checkpoint/completed_total")
        self.metrics.mark("checkpoint/since_last_completed_s")
        self.metrics.set("checkpoint/consecutive_failures", 0)
        self._record_stages(stage_s)

    def taken(self, episodes: int, mid_turn: int) -> None:
        """A completed checkpoint took ``episodes``, ``mid_turn`` of them inside a turn."""
        self.metrics.set("checkpoint/last_episodes", episodes)
        self.metrics.set("checkpoint/last_mid_turn", mid_turn)
        self.metrics.inc("checkpoint/mid_turn_total", mid_turn)

    def trainer_code_failed(self) -> None:
        """The trainer's ``trainer_files`` writer raised: its error propagates unchanged."""
        self._count_failed()

    def aborted(
        self, checkpoint_id: str, error: BaseException, stage_s: Mapping[str, float], started: float
    ) -> None:
        """A checkpoint failed as an invariant violation: the run aborts."""
        self._count_failed()
        self._record_stages(stage_s)
        self.metrics.inc("checkpoint/invariant_failures_total")
        logger.error("checkpoint %s aborted the run: %s", checkpoint_id, error)
        self.record_last(started, None)

    def failed(
        self,
        checkpoint_id: str,
        kind: FailureKind,
        detail: str,
        consecutive: int,
        stage_s: Mapping[str, float],
        started: float,
    ) -> None:
        """A checkpoint failed retryably, the ``consecutive``-th in a row."""
        self._count_failed()
        self._record_stages(stage_s)
        self.metrics.inc(f"checkpoint/{kind}_total")
        self.metrics.set("checkpoint/consecutive_failures", consecutive)
        logger.warning(
            "checkpoint %s failed (%s, %d in a row, retried at the next checkpoint): %s",
            checkpoint_id,
            kind,
            consecutive,
            detail,
        )
        self.record_last(started, None)

    def record_last(self, started: float, size: int | None) -> None:
        """Flink's last-checkpoint gauges: duration of the last checkpoint (completed or not),
        size in bytes of the last completed one."""
        self.metrics.set("checkpoint/last_duration_s", trio.current_time() - started)
        if size is not None:
            self.metrics.set("checkpoint/last_size_bytes", size)

    def resume_failed(self) -> None:
        self.metrics.inc("checkpoint/resume_failures_total")

    def retired_dropped(self, count: int) -> None:
        self.metrics.inc("checkpoint/retired_dropped_total", count)

    def restore_retired(self, count: int) -> None:
        self.metrics.inc("checkpoint/restore_retire_total", count)

    def drain_pending(self, count: int) -> None:
        self.metrics.set("checkpoint/drain_pending", count)

    def _count_failed(self) -> None:
        self.failed_total += 1
        self.metrics.inc("checkpoint/failed_total")

    def _record_stages(self, stage_s: Mapping[str, float]) -> None:
        for name, seconds in stage_s.items():
            self.metrics.set(f"checkpoint/stage_{name}_s", seconds)
