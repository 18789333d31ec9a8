"""The durable journal of a Gym host's retained sessions: what a replacement continues.

A participant with ``retained = True`` keeps a slot's session after its episode ends (an
environment whose state the world keeps). When the instance dies, that state must not die with
it: the replacement of the same name, opened on the same ``work_dir`` with ``recover=True``,
replays this journal and holds the same sessions, each retirable by the attempt that owned it.

One JSON array per line, appended with one ``os.write`` each (the OS has it even if the process
dies next; no fsync: a machine crash is what checkpoints are for):

    ["n", key, rollout_id, attempt, {participant: state}]   a slot's sessions (re)opened
    ["o", key, rollout_id, attempt]                          taken over by a claim
    ["s", key, participant, state]                           a session's state after a turn
    ["d", key]                                               freed (retired)

A restore replaces the whole journal atomically (``rewrite``). A torn last line (the process
died inside the append) is cut and ignored; a bad line anywhere else is an error naming it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import orjson

from gymckpt.runtime import write_atomic

from ._episode import to_plain

if TYPE_CHECKING:
    from ._host_episodes import Episode, StepContext

__all__ = ["JOURNAL_FILE", "HostJournaling", "JournaledSlot", "SessionJournal", "replay_journal"]

JOURNAL_FILE: Final = "sessions.journal"


@attrs.define(eq=False, slots=True)
class JournaledSlot:
    """A slot as the journal holds it: the owning attempt and its retained sessions' data."""

    rollout_id: str
    attempt: int
    states: dict[str, Any]


def replay_journal(data: bytes) -> dict[str, JournaledSlot]:
    """The slots a journal holds, by session key (see the module docstring)."""
    slots: dict[str, JournaledSlot] = {}
    lines = data.split(b"\n")
    for n, line in enumerate(lines, 1):
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
            if n == len(lines) and not data.endswith(b"\n"):
                break  # a torn last append
            raise ValueError(f"session journal line {n}: {exc!r}") from None
    return slots


@final
@attrs.define(eq=False, slots=True)
class SessionJournal:
    """The append side of one instance's journal (``path``); ``open`` replays what is there."""

    path: Path
    _fd: int | None = attrs.field(default=None, init=False)

    def open(self, *, recover: bool) -> dict[str, JournaledSlot]:
        """Open for appends. ``recover``: replay and continue what the file holds (a
        replacement); else start it empty (a new deployment). Returns the replayed slots."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not (recover and self.path.exists()):
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            return {}
        data = self.path.read_bytes()
        slots = replay_journal(data)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if data and not data.endswith(b"\n"):  # cut a torn last append, then go on
            os.ftruncate(fd, data.rfind(b"\n") + 1)
        self._fd = fd
        return slots

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, record: list[Any]) -> None:
        if self._fd is not None:
            os.write(self._fd, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def opened(self, key: str, rollout_id: str, attempt: int, states: Mapping[str, Any]) -> None:
        self._append(["n", key, rollout_id, attempt, states])

    def claimed(self, key: str, rollout_id: str, attempt: int) -> None:
        self._append(["o", key, rollout_id, attempt])

    def state(self, key: str, participant: str, data: Any) -> None:
        self._append(["s", key, participant, data])

    def freed(self, key: str) -> None:
        self._append(["d", key])

    def rewrite(self, slots: Iterable[tuple[str, str, int, Mapping[str, Any]]]) -> None:
        """Replace the whole journal by ``(key, rollout_id, attempt, states)`` slots, atomically."""
        if self._fd is None:
            return
        self.close()
        lines = [
            orjson.dumps(["n", key, rid, attempt, states], option=orjson.OPT_SERIALIZE_NUMPY)
            for key, rid, attempt, states in sorted(slots, key=lambda s: s[0])
        ]
        write_atomic(self.path, b"".join(line + b"\n" for line in lines))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)


class HostJournaling:
    """How ``GymHost`` uses its journal (a mixin: the fields are the host's). The admission,
    claim, retire and restore paths append their own records; this opens and replays the
    journal and journals the sessions a turn fetched."""

    if not TYPE_CHECKING:
        __slots__ = ()
    else:
        name: str
        work_dir: Path | None
        recover: bool
        _journal: SessionJournal | None
        _retained: tuple[Any, ...]
        _owners: dict[str, tuple[str, int]]
        _kept: dict[str, dict[str, Any]]
        _finished: dict[str, str]

        def fenced(self, ep: Episode) -> bool:
            raise NotImplementedError

    @property
    def journal_path(self) -> Path | None:
        """The retained sessions' journal (None without a ``work_dir`` or retained
        participants)."""
        if self.work_dir is None or not self._retained:
            return None
        return self.work_dir / self.name / JOURNAL_FILE

    def _open_journal(self) -> None:
        path = self.journal_path
        if path is None:
            return
        self._journal = SessionJournal(path)
        slots = self._journal.open(recover=self.recover)
        for key, slot in slots.items():
            try:
                states = {p.name: p.restore(slot.states[p.name]) for p in self._retained}
            except Exception as exc:
                self._journal.close()
                raise ValueError(
                    f"instance {self.name}: journaled session {key} cannot be restored "
                    f"({exc!r}); the journal is {path}"
                ) from None
            # each slot is retirable by the attempt that owned it, as on the dead instance
            self._owners[key] = (slot.rollout_id, slot.attempt)
            self._kept[key] = states
            self._finished[slot.rollout_id] = key

    def _journal_turn(self, ep: Episode, ctx: StepContext) -> str | None:
        """Journal the retained sessions this turn fetched; the problem if one cannot export."""
        if not ctx.touched or self._journal is None or self.fenced(ep):
            return None
        try:
            for p in self._retained:
                if p.name in ctx.touched:
                    self._journal.state(ep.key, p.name, to_plain(p.export(ep.sessions[p.name])))
        except Exception as exc:
            return (
                f"{self.name}: episode {ep.rollout_id} turn {ep.turn}: exporting a retained "
                f"session for the journal: {exc!r}"
            )
        return None

