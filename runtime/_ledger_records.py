"""The ledger's records: attempt identity, states, and the values the ledger hands out.

An attempt is ``(row, slot, attempt)`` with a stable rollout ID ``"{row}-{slot}"`` (attempt 0)
or ``"{row}-{slot}-a{n}"``; ``rollout_id_for`` builds it and ``parse_rollout_id`` reads back
exactly the IDs it builds (one spelling per attempt, so an ID names at most one attempt).

The ledger stores none of these records per attempt (see ``_ledger_columns``): it builds them
when asked, so they are plain frozen values a caller may keep.
"""

from __future__ import annotations

import enum
from typing import Any, Literal, TypeVar

import attrs

from ._converter import structure as _conv_structure

__all__ = [
    "AttemptState",
    "CompletedGroup",
    "EpisodeResult",
    "FailureClass",
    "LedgerStatistics",
    "RestoreSummary",
    "RestoredGymState",
    "RetireItem",
    "parse_rollout_id",
    "rollout_id_for",
]

T = TypeVar("T")
FailureClass = Literal["infra", "data"]


def rollout_id_for(row: int, slot: int, attempt: int) -> str:
    """The stable rollout ID of an attempt: ``"{row}-{slot}"``, plus ``"-a{n}"`` for n > 0."""
    base = f"{row}-{slot}"
    return base if attempt == 0 else f"{base}-a{attempt}"


def parse_rollout_id(rollout_id: str) -> tuple[int, int, int] | None:
    """``(row, slot, attempt)`` of a canonical rollout ID (``rollout_id_for``), else None."""
    head, _, tail = rollout_id.rpartition("-")
    try:
        if tail[:1] == "a":
            attempt = int(tail[1:])
            head, _, tail = head.rpartition("-")
        else:
            attempt = 0
        row, slot = int(head), int(tail)
    except ValueError:
        return None
    if rollout_id_for(row, slot, attempt) != rollout_id:  # "01-0", "1-0-a0", " 1-0", …
        return None
    return row, slot, attempt


class AttemptState(enum.Enum):
    """Where an attempt is (the ledger's module docstring draws the transitions).

    RESERVED, DISPATCHED and COMPLETED are current attempts; FAILED and ABANDONED are the end
    of one (its slot holds the next attempt, or its row left the ledger).
    """

    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


@attrs.frozen
class EpisodeResult:
    """What a completed episode gives the trainer: its reward, turns and trajectory payload
    (a JSON value from the episode, or None). Held with its completed attempt until trained,
    and part of the rollout snapshot meanwhile."""

    reward: float
    turns: int
    payload: Any = None

    def payload_as(self, cls: type[T]) -> T:
        """The payload structured as ``cls`` (an attrs class) through the project's converter;
        ``ManifestError`` naming the field if it does not fit."""
        return _conv_structure(self.payload, cls, "episode payload")


@attrs.frozen
class RestoredGymState:
    """Gym state an attempt continues from after a restore (S11).

    ``from_rollout_id`` is the attempt Gym parked and exported; ``instance`` is its original
    replica, where the replacement must be dispatched; ``owner`` is the participant that exported
    it; ``capture_keys`` are the model calls staged for it.
    """

    instance: str
    owner: str
    from_rollout_id: str
    capture_keys: tuple[str, ...] = ()


@attrs.frozen
class RetireItem:
    """A dropped attempt Gym may still hold, and where."""

    rollout_id: str
    instance: str
    restored: bool = False


@attrs.frozen
class CompletedGroup:
    """A row whose every generation slot completed: ready to train. ``row`` is the dataset
    row it trained; ``position`` its place in the run's row order (``_row_order``: the
    ledger's identity for it, the head of its rollout IDs), equal to ``row`` in the default
    order and different for each epoch that trains the row."""

    row: int
    results: tuple[EpisodeResult, ...]
    rollout_ids: tuple[str, ...]
    position: int


@attrs.frozen
class LedgerStatistics:
    attempts: int
    by_state: dict[str, int]
    failed_total: int
    abandoned_total: int
    rows_reserved: int
    rows_trained: int
    rows_failed: int
    groups_ready: int
    retire_queue: int
    unclaimed: int
    row_attempts_spent: int
    data_failures: int
    stale_replies: int
    released_total: int = 0
    """Attempts ended at no cost: abandoned because their instance died
    (``release_instance``, ``abandon(spend=False)``; counted in ``abandoned_total``) or failed
    as infra (``fail(..., "infra", ...)``; counted in ``failed_total``). None spent a row
    attempt."""


@attrs.frozen
class RestoreSummary:
    """What ``RecoveryLedger.from_snapshot`` did with the snapshot's attempts."""

    restored: int
    completed_untrained: int
    reserved: int
    redispatched_fresh: int
