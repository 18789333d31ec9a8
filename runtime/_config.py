"""Configuration of the runtime: one frozen attrs record, validated on construction."""

from __future__ import annotations

import enum
import math

import attrs

__all__ = ["CheckpointMode", "RuntimeConfig"]


class CheckpointMode(enum.Enum):
    """How a checkpoint takes the episodes that are in the middle of a turn.

    ``ALIGNED`` (the reference protocol): every episode parks at its next step boundary, and
    the checkpoint waits until none moves; the slowest turn in flight sets how long every
    episode waits.

    ``UNALIGNED``: no episode waits. Each instance takes its cut at ``commit``: an episode is
    taken at its last step boundary (the session states it had there, kept as it passed it),
    with every model call it completed up to the cut; after a restore its turn replays from
    that boundary with those calls answered from the capture. A reply an instance produces
    after its cut is held there until the checkpoint resumes it, so the snapshot never counts
    it. An environment that opts out (``Environment(unaligned=False)``) is checkpointed
    aligned even in this mode.
    """

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"


def _mode(value: object) -> CheckpointMode:
    """A ``CheckpointMode`` from itself or its name (``"aligned"``, ``"unaligned"``)."""
    if isinstance(value, CheckpointMode):
        return value
    try:
        return CheckpointMode(value)
    except ValueError:
        names = ", ".join(repr(m.value) for m in CheckpointMode)
        raise ValueError(f"checkpoint_mode is {value!r}; expected one of {names}") from None


def _finite(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attribute.name} is {value!r}; expected a finite number of seconds")


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """Knobs of the checkpoint runtime.

    Invariants checked on construction (each error names both knobs involved):

    - a control call's deadline plus its reply grace is shorter than the Gym lease, so giving up
      on a call always leaves the lease to reopen Gym (S5);
    - the drain fits in the lease as well, since Gym is parked while we drain;
    - the alignment timeout is shorter than the control timeout (so an aligned ``prepare``
      answers before its call gives up on it), hence shorter than the lease.
    """

    control_timeout_s: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    reply_grace_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    drain_timeout_s: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    lease_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))
    max_consecutive_failures: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    max_row_attempts: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    data_failure_budget: int = attrs.field(default=16, validator=attrs.validators.ge(0))
    infra_backoff_initial_s: float = attrs.field(default=0.05, validator=attrs.validators.ge(0.0))
    infra_backoff_max_s: float = attrs.field(default=2.0, validator=attrs.validators.ge(0.0))
    max_replacements: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    """How often one instance may be replaced within ``replacement_window_s`` (a dead Gym
    instance is brought back under its name); one more death stops the run
    (``ReplacementsExhausted``). 0: never replace."""
    replacement_window_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0))
    replace_timeout_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))
    """Bound of one ``replace`` call (a new Ray actor may take a while to schedule)."""
    outage_budget_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0.0))
    """How long infrastructure may stay down before the run stops (``InfraOutage``, exit code
    8): a model server every episode fails on (episodes failing as infra, nothing answered
    since), or a Gym instance that cannot be brought back (it dies again before it served an
    episode, or its ``replace`` fails). Meanwhile rows wait and are re-sent with backoff,
    spending no row attempt and no data budget. The default outlasts a model server's restart
    for a weight update."""
    checkpoint_mode: CheckpointMode = attrs.field(default=CheckpointMode.ALIGNED, converter=_mode)
    """``ALIGNED`` (every episode parks at its next step boundary) or ``UNALIGNED`` (no episode
    waits for a turn; see ``CheckpointMode``). A string names one."""
    alignment_timeout_s: float = attrs.field(
        default=1.0, validator=[attrs.validators.ge(0.0), _finite]
    )
    """Flink's aligned-checkpoint timeout: how long an aligned ``prepare`` waits for every
    episode to reach a step boundary. The episodes still inside a turn then are taken
    unaligned by that checkpoint (at their last step boundary, with the model calls they had
    completed: ``CheckpointOutcome.mid_turn`` counts them), so a turn longer than every
    timeout never fails a checkpoint, and the parked episodes idle at most this long waiting
    for it. 0 takes every episode not already at a boundary unaligned at once. An environment
    that opts out of unaligned cuts (``Environment(unaligned=False)``) is waited for until
    ``control_timeout_s``, as without a timeout. Must be < ``control_timeout_s``."""
    pause_collector: bool = True
    """No automatic full garbage collection while a checkpoint runs (``collector_paused``): one
    pauses the loop and every thread for as long as it walks all of the process's objects."""
    freeze_startup_objects: bool = True
    """``open_rollouts`` freezes what is alive when it first starts in this process (imported
    modules, the trainer's own long-lived objects), so full collections stop walking them
    (``runtime.freeze_startup_objects``)."""

    def __attrs_post_init__(self) -> None:
        if self.control_timeout_s + self.reply_grace_s >= self.lease_s:
            raise ValueError(
                f"control_timeout_s + reply_grace_s ({self.control_timeout_s:g} + "
                f"{self.reply_grace_s:g}) must be < lease_s ({self.lease_s:g}): an abandoned "
                "call must leave the lease time to reopen Gym"
            )
        if self.drain_timeout_s >= self.lease_s:
            raise ValueError(
                f"drain_timeout_s ({self.drain_timeout_s:g}) must be < lease_s "
                f"({self.lease_s:g}): Gym stays parked while the drain waits"
            )
        if self.alignment_timeout_s >= self.control_timeout_s:
            raise ValueError(
                f"alignment_timeout_s ({self.alignment_timeout_s:g}) must be < "
                f"control_timeout_s ({self.control_timeout_s:g}): an aligned prepare must "
                "answer before the trainer gives up on it; lower alignment_timeout_s or raise "
                "control_timeout_s"
            )
        if self.infra_backoff_initial_s > self.infra_backoff_max_s:
            raise ValueError(
                f"infra_backoff_initial_s ({self.infra_backoff_initial_s:g}) must be <= "
                f"infra_backoff_max_s ({self.infra_backoff_max_s:g})"
            )

    def backoff_s(self, failures: int) -> float:
        """Exponential backoff before the retry that follows ``failures`` infra failures,
        capped at ``infra_backoff_max_s`` whatever the count (an outage of many episodes counts
        thousands of failures: the doubling stops at the cap, it never overflows a float)."""
        if failures <= 0:
            return 0.0
        delay = self.infra_backoff_initial_s
        for _ in range(min(failures - 1, 1100)):  # 2**1100 of any positive float is past the cap
            if delay >= self.infra_backoff_max_s:
                break
            delay *= 2
        return float(min(self.infra_backoff_max_s, delay))
