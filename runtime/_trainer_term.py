"""Who a trainer process is, to the Gym servers it drives: its lineage and its term.

A *lineage* is one training run as the servers see it: 32 hex digits generated the first time
a trainer opens a work directory and kept there (``TERM_FILE``), so every trainer process on
that work directory (a restart after a crash, a fresh start with ``restore=False``) is the same
lineage. A *term* numbers those processes: each start of a trainer on the work directory takes
the next one (1, 2, ...), written before the trainer reaches Gym. The names are Raft's: a term
only grows, and whoever holds a newer term fences every older one.

A Gym instance serves one lineage at a time (``gym_adapter``'s tenancy): a trainer of a newer
term of the same lineage takes it over and fences what the older term started (its episodes,
its open checkpoint, its streams; nothing of it may reply, mutate or commit afterwards); a
trainer of another lineage is refused (``GymInUse``) while that lineage holds it.

``TrainerTerm.workdir`` is only a label for messages (where the holder runs); the identity is
``(lineage, term)``. The file is read and written under the work directory's lock
(``WorkDirLock``), so two trainers never take the same term.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Final, final

import attrs
import orjson

from ._errors import ManifestError
from ._store import write_atomic

__all__ = ["TERM_FILE", "TERM_FILE_VERSION", "TrainerTerm", "next_term"]

TERM_FILE: Final = "trainer_term.json"
"""The work directory's lineage and the last term a trainer took there."""
TERM_FILE_VERSION: Final = 1

_LINEAGE: Final = re.compile(r"[0-9a-f]{32}\Z")


def _lineage(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not _LINEAGE.match(value):
        raise ValueError(f"a lineage is 32 lowercase hex digits, got {value!r}")


def _term(_inst: object, _attr: object, value: int) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"a trainer term is an int >= 1, got {value!r}")


@final
@attrs.frozen
class TrainerTerm:
    """One trainer process of one lineage (module docstring). Invariant: ``lineage`` is 32
    lowercase hex digits and ``term`` >= 1; two processes of a lineage never share a term."""

    lineage: str = attrs.field(validator=_lineage)
    term: int = attrs.field(validator=_term)
    workdir: str = attrs.field(default="", eq=False)
    """Where the trainer runs: for messages only, not part of the identity."""

    def header(self) -> str:
        """``"{lineage}.{term}"``: the form the HTTP wire carries (``parse``)."""
        return f"{self.lineage}.{self.term}"

    @classmethod
    def parse(cls, text: str) -> TrainerTerm:
        """The ``header`` form back; ``ValueError`` saying what is wrong."""
        lineage, dot, term = text.partition(".")
        if not dot or not term.isdigit() or str(int(term)) != term:
            raise ValueError(f"a trainer term is '<lineage>.<term>', got {text[:80]!r}")
        return cls(lineage, int(term))

    def describe(self) -> str:
        where = f" (work directory {self.workdir})" if self.workdir else ""
        return f"trainer term {self.term} of lineage {self.lineage}{where}"


def next_term(workdir: Path) -> TrainerTerm:
    """Take the next term of ``workdir``'s lineage (a new lineage on first use) and write it
    durably before returning. Call it holding the work directory's lock. Blocking.

    A file that is not a valid term file is ``ManifestError`` (exit code 2): it is never
    replaced silently, since a new lineage could not take over the servers the old one holds."""
    path = workdir / TERM_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        current = None
    else:
        current = _load(raw, path)
    if current is None:
        nxt = TrainerTerm(secrets.token_hex(16), 1, str(workdir))
    else:
        nxt = TrainerTerm(current.lineage, current.term + 1, str(workdir))
    body = {"version": TERM_FILE_VERSION, "lineage": nxt.lineage, "term": nxt.term}
    write_atomic(path, orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    return nxt


def _load(raw: bytes, path: Path) -> TrainerTerm:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc}); fix or restore it") from None
    if not isinstance(data, dict) or set(data) != {"version", "lineage", "term"}:
        raise ManifestError(
            f"{path}: expected exactly the keys version, lineage and term; fix or restore it"
        )
    if data["version"] != TERM_FILE_VERSION:
        raise ManifestError(
            f"{path}: version {data['version']!r}, this gymckpt reads version "
            f"{TERM_FILE_VERSION}: run the gymckpt version that wrote it"
        )
    try:
        return TrainerTerm(data["lineage"], data["term"])
    except ValueError as exc:
        raise ManifestError(f"{path}: {exc}; fix or restore it") from None
