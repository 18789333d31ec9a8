"""The durable journal of a Gym host's retained sessions: what a replacement continues.

A participant with ``retained = True`` keeps a slot's session after its episode ends (an
environment whose state the world keeps). When the instance dies, that state must not die with
it: the replacement of the same name, opened on the same ``work_dir`` with ``recover=True``,
replays this journal and holds the same sessions, each retirable by the attempt that owned it.

One JSON array per line (no fsync: the OS has it even if the process dies next; a machine crash
is what checkpoints are for):

    ["n", key, rollout_id, attempt, {participant: state}]   a slot's sessions (re)opened
    ["o", key, rollout_id, attempt]                          taken over by a claim
    ["s", key, participant, state]                           a session's state after a turn
    ["d", key]                                               freed (retired)

A restore replaces the whole journal atomically (``rewrite``).

Complete or not at all
----------------------
- **A record counts only when its newline is there.** Records are only ever appended, and
  orjson never writes a newline inside one, so a record's one newline is its last byte: what
  follows the last newline of the file is a record cut short (the process died inside the
  append, or the append failed and could not be undone). Replay never applies it, whether or
  not it happens to parse, and a replacement cuts it before it appends; replaying before or
  after the cut gives the same sessions. A bad complete line anywhere is an error naming it.
  (No length or checksum frame: the newline already says where a record ends, so a journal
  stays plain JSON lines.)
- **An append is one record, written whole.** ``os.write`` may write less than asked (a signal,
  a file-size limit, a filesystem filling up): the rest is written until the whole line is
  there. If a write fails midway, the file is cut back to the end of the last complete record;
  should that fail too, the partial record stays as a torn tail that replay ignores (above).

Fail closed
-----------
When the journal cannot record a change (a full disk, any I/O error), the change has already
happened in memory: from then on a replacement could not continue what this instance holds.
So the instance stops, as a dead one does (``GymHost.kill``, through ``on_failure``): every
later call and every reply stream raises ``GymInstanceDead``, the runtime re-sends its
attempts in flight as fresh attempts at no cost (neither a row attempt nor data budget), frees
their sessions on the replacement, and the replacement continues from the journal's last
complete record, which is a state the dead instance really held. The failure is logged as a
WARNING (``gymckpt.gym``) naming the instance, the file and the OS error, with its traceback.
``JournalFailed``, the error the append raises after the instance stopped, is a
``GymInstanceDead``: a control call that met it (retire, restore) reports a dead instance; a
row whose admission met it is answered ``Failed(..., "infra", ...)``, and an episode whose turn
met it ends with the instance (neither reply is delivered: the stream of a dead instance ends
at once). It is never a data failure, and never a bare ``OSError``. A disk that stays full
fails each replacement the same way, until the run's replacement budget (``max_replacements``)
stops it with a message naming the instance.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, NoReturn, final

import attrs
import orjson

from gymckpt.runtime import GymInstanceDead
from gymckpt.runtime.lowlevel import checked_json, write_atomic

__all__ = [
    "JOURNAL_FILE",
    "JournalFailed",
    "JournaledSlot",
    "SessionJournal",
    "replay_journal",
]

JOURNAL_FILE: Final = "sessions.journal"
LOGGER: Final = logging.getLogger("gymckpt.gym")


class JournalFailed(GymInstanceDead):
    """Instance ``instance`` stopped: its session journal ``path`` could not record a change
    (``error``: what failed, with the OS error). Raised once the instance is dead (see the
    module docstring); picklable like every Gym error (its arguments are its ``args``)."""

    def __init__(self, instance: str, path: str, error: str) -> None:
        super().__init__(instance, "journal")
        self.args = (instance, path, error)
        self.path = path
        self.error = error

    def __str__(self) -> str:
        return (
            f"instance {self.instance} stopped: its session journal {self.path} could not "
            f"record a change ({self.error}); a replacement continues from the journal's last "
            "complete record"
        )


@attrs.define(eq=False, slots=True)
class JournaledSlot:
    """A slot as the journal holds it: the owning attempt and its retained sessions' data."""

    rollout_id: str
    attempt: int
    states: dict[str, Any]


def complete_length(data: bytes) -> int:
    """How many bytes of ``data`` are complete records (up to and with its last newline); what
    follows is a torn tail (see the module docstring)."""
    return data.rfind(b"\n") + 1


def replay_journal(data: bytes) -> dict[str, JournaledSlot]:
    """The slots the complete records of a journal hold, by session key (a torn tail is never
    applied: see the module docstring)."""
    slots: dict[str, JournaledSlot] = {}
    end = complete_length(data)
    for n, line in enumerate(data[:end].split(b"\n"), 1):
        if not line:
            continue
        try:
            rec = orjson.loads(line)
            op, key = rec[0], rec[1]
            if op == "n":
                slots[key] = JournaledSlot(str(rec[2]), int(rec[3]), dict(rec[4]))
            elif op == "o":
                slots[key].rollout_id, slots[key].attempt = str(rec[2]), int(rec[3])
            elif op == "s":
                slots[key].states[rec[2]] = rec[3]
            elif op == "d":
                del slots[key]
            else:
                raise ValueError(f"unknown record {op!r}")
        except (orjson.JSONDecodeError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"session journal line {n}: {exc!r}") from None
    return slots


@final
@attrs.define(eq=False, slots=True)
class SessionJournal:
    """The append side of one instance's journal (``path``); ``open`` replays what is there.

    Invariant: while open, the file is ``_end`` bytes of complete records (every append either
    adds one whole record or raises ``JournalFailed`` with the file cut back to ``_end``, or,
    if even that failed, with a torn tail that replay ignores). After a failure the journal is
    closed for good: later appends do nothing (the instance is dead; ``failure`` says why).
    ``on_failure`` is called with the error just before it is raised (the host stops there).
    """

    path: Path
    instance: str = ""
    on_failure: Callable[[JournalFailed], object] | None = attrs.field(default=None, kw_only=True)
    failure: JournalFailed | None = attrs.field(default=None, init=False)
    _fd: int | None = attrs.field(default=None, init=False)
    _end: int = attrs.field(default=0, init=False)

    def open(self, *, recover: bool) -> dict[str, JournaledSlot]:
        """Open for appends. ``recover``: replay and continue what the file holds (a
        replacement); else start it empty (a new deployment). Returns the replayed slots.
        ``JournalFailed`` if the file cannot be read, cut or opened (``on_failure`` is not
        called: the instance has not started); ``ValueError`` naming the file and the line if
        a complete record is bad."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not (recover and self.path.exists()):
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
                self._end = 0
                return {}
            data = self.path.read_bytes()
        except OSError as exc:
            self._fail("opening it", exc, notify=False)
        try:
            slots = replay_journal(data)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}; the journal cannot be continued") from None
        end = complete_length(data)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self._fd = fd
            if end < len(data):  # cut a torn tail (never replayed), then go on
                LOGGER.warning(
                    "instance %s: session journal %s ends with %d bytes of a record cut short; "
                    "ignored and cut",
                    self.instance,
                    self.path,
                    len(data) - end,
                )
                os.ftruncate(fd, end)
        except OSError as exc:
            self._fail("opening it", exc, notify=False)
        self._end = end
        return slots

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, record: list[Any]) -> None:
        fd = self._fd
        if fd is None:
            return
        # a user's state: refused (NotPlainData, before any write) if not finite plain data,
        # never journaled as null
        line = checked_json(record, "journaled state") + b"\n"
        size = len(line)
        try:
            written = os.write(fd, line)
            while written < size:  # a short write: the rest, until the whole record is there
                more = os.write(fd, memoryview(line)[written:])
                if more <= 0:
                    raise OSError(errno.EIO, f"write wrote nothing, {size - written} bytes left")
                written += more
        except OSError as exc:
            self._fail("appending a record", exc)
        self._end += size

    def _fail(self, what: str, exc: OSError, *, notify: bool = True) -> NoReturn:
        """Cut the file back to its complete records, close for good, log, notify, raise."""
        detail = f"{what}: {exc!r}"
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._end)
            except OSError as cut:
                detail += f"; cutting the partial record failed too ({cut!r}), replay ignores it"
            try:
                self.close()
            except OSError:
                self._fd = None
        error = self.failure = JournalFailed(self.instance, str(self.path), detail)
        LOGGER.warning("%s", error, exc_info=exc)
        if notify and self.on_failure is not None:
            self.on_failure(error)
        raise error from exc

    def opened(self, key: str, rollout_id: str, attempt: int, states: Mapping[str, Any]) -> None:
        self._append(["n", key, rollout_id, attempt, states])

    def claimed(self, key: str, rollout_id: str, attempt: int) -> None:
        self._append(["o", key, rollout_id, attempt])

    def state(self, key: str, participant: str, data: Any) -> None:
        self._append(["s", key, participant, data])

    def freed(self, key: str) -> None:
        self._append(["d", key])

    def rewrite(self, slots: Iterable[tuple[str, str, int, Mapping[str, Any]]]) -> None:
        """Replace the whole journal by ``(key, rollout_id, attempt, states)`` slots, atomically
        (on a failure the file holds the old journal or the new one, whole)."""
        if self._fd is None:
            return
        self.close()
        lines = [
            orjson.dumps(["n", key, rid, attempt, states], option=orjson.OPT_SERIALIZE_NUMPY)
            for key, rid, attempt, states in sorted(slots, key=lambda s: s[0])
        ]
        data = b"".join(line + b"\n" for line in lines)
        try:
            write_atomic(self.path, data)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._fail("rewriting it for a restore", exc)
        self._end = len(data)
