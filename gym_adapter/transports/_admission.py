"""Admission across a process boundary: a remote ``run`` returns only once its rows are admitted.

In-process, ``GymHost.run`` decides every row's fate (admitted, refused, fenced) before it
returns. A remote stream must keep that order (S1: a checkpoint must never overtake a
submission the ledger counts), so its first object is the **admission header**, a
``ReplyBatch`` of sequence ``HEADER_SEQ`` and no replies: the caller's ``run`` waits for it, and
an error of the ``run`` itself arrives in its place. Every later object is one batch of replies,
numbered ``HEADER_SEQ + 1``, ``+ 2``… for acknowledgement (``_acks``).

``RunShape`` is what the deployment-wide ``FaultPlan`` decided for one ``run`` (C3), the same for
every backend: ``refuse`` refuses every row, ``drop`` ends the stream after half of them, any
other fault is executed by the instance before it admits the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from .._contract import RunReply
from .._faults import FaultSpec

__all__ = ["HEADER_SEQ", "ReplyBatch", "RunShape", "admission_header"]

HEADER_SEQ: Final = 0
"""Sequence number of the admission header, the first object of every remote ``run`` stream."""


@attrs.frozen
class ReplyBatch:
    """One object of a remote ``run`` stream: the admission header (``seq == HEADER_SEQ``, no
    replies) or batch ``seq`` of replies."""

    seq: int = attrs.field(validator=attrs.validators.ge(HEADER_SEQ))
    replies: tuple[RunReply, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.seq == HEADER_SEQ and self.replies:
            raise ValueError(f"the admission header carries no replies, got {len(self.replies)}")

    @property
    def is_header(self) -> bool:
        return self.seq == HEADER_SEQ


def admission_header() -> ReplyBatch:
    """The first object of every stream: the rows were admitted (or refused, each a reply)."""
    return ReplyBatch(HEADER_SEQ)


@attrs.frozen
class RunShape:
    """How one ``run`` of ``rows`` rows is shaped by the fault the plan drew for it (if any)."""

    refuse_all: bool = False
    """``refuse``: every row is refused (``admission_closed``)."""
    drop_after: int | None = None
    """``drop``: the stream ends after this many replies."""
    inject: FaultSpec | None = None
    """Any other fault: executed by the instance before it admits the rows."""

    @classmethod
    def of(cls, spec: FaultSpec | None, rows: Sequence[object]) -> RunShape:
        if spec is None:
            return cls()
        if spec.kind == "refuse":
            return cls(refuse_all=True)
        if spec.kind == "drop":
            return cls(drop_after=len(rows) // 2)
        return cls(inject=spec)
