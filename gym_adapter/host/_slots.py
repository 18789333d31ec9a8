"""The slot table of a Gym host: who owns each slot's sessions, the retained ones, their journal.

A slot (``"{row}-{slot}"``, an ``EpisodeInfo.session_key``) has one owning attempt at a time.
An attempt's episode holds the slot's session states while it is active or unclaimed; when it
completes, the sessions of retained participants (``retained = True``) stay here, *kept*, until
the attempt is retired or a newer attempt of the slot opens sessions of its own. A failed
attempt's sessions are freed when it fails (its retry starts afresh).

``SlotTable`` is the only writer of the three maps and of the journal (``_host_journal``):

- ``owners``: slot → (rollout ID, attempt) of the owning attempt. An episode whose rollout ID
  is not its slot's owner is *fenced*: it stops at its next boundary or context call, and its
  reply is dropped.
- ``kept``: slot → the retained sessions of an ended (completed) owner.
- ``finished``: rollout ID → slot of each completed owner, so a retire of it finds its slot.

Every change of a slot's retained sessions is journaled in the same call that makes it (open,
claim, a turn that fetched them, free), so the journal replays to what this table holds. A
journal that fails stops the instance (``on_failure``) before the append raises
``JournalFailed``; the change in memory has happened already and dies with the instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, final

import attrs

from ._episode import Participant, to_plain
from ._episodes import Episode
from ._journal import JournalFailed, SessionJournal

__all__ = ["JournalSlot", "KeptCopy", "SlotTable"]

JournalSlot = tuple[str, str, int, Mapping[str, Any]]
"""``(key, rollout_id, attempt, states)``: one slot as a restore journals it."""


@attrs.frozen
class KeptCopy:
    """Copies of the table a commit exports from (taken on the loop, read in a thread)."""

    kept: list[tuple[str, dict[str, Any]]]
    owners: dict[str, tuple[str, int]]
    finished: dict[str, str]

    def sessions(self) -> list[tuple[str, str, int, dict[str, Any]]]:
        """``(key, rollout_id, attempt, states)`` of every kept slot whose owner ended."""
        return [
            (key, rid, self.owners[key][1], states)
            for key, states in self.kept
            if (rid := self.owners.get(key, ("",))[0]) in self.finished
        ]


@final
@attrs.define(eq=False, slots=True, repr=False)
class SlotTable:
    """Ownership, fencing and the retained sessions of one instance (``instance``), and their
    journal (see the module docstring). ``retained``: the participants whose sessions are kept
    and journaled."""

    instance: str
    retained: tuple[Participant, ...]
    _owners: dict[str, tuple[str, int]] = attrs.field(factory=dict, init=False)
    _kept: dict[str, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _finished: dict[str, str] = attrs.field(factory=dict, init=False)
    _journal: SessionJournal | None = attrs.field(default=None, init=False)

    # -- reading -------------------------------------------------------------------------------

    def owner(self, key: str) -> tuple[str, int] | None:
        """(rollout ID, attempt) of the attempt owning slot ``key``, or None."""
        return self._owners.get(key)

    def fenced(self, ep: Episode) -> bool:
        """Whether ``ep`` no longer owns its slot (a newer attempt took it, or it was freed)."""
        owner = self._owners.get(ep.key)
        return owner is None or owner[0] != ep.rollout_id

    def owners(self) -> Iterator[tuple[str, tuple[str, int]]]:
        """Every owned slot and its owner, sorted by slot."""
        for key in sorted(self._owners):
            yield key, self._owners[key]

    def kept_states(self, key: str) -> dict[str, Any]:
        """The kept sessions of slot ``key`` (empty when none are kept)."""
        return self._kept.get(key, {})

    def finished_slot(self, rollout_id: str) -> str | None:
        """The slot of completed attempt ``rollout_id``, while it owns it or until retired."""
        return self._finished.get(rollout_id)

    @property
    def journaling(self) -> bool:
        return self._journal is not None

    @property
    def n_kept(self) -> int:
        return len(self._kept)

    def __repr__(self) -> str:
        return (
            f"<SlotTable {self.instance} owned={len(self._owners)} kept={len(self._kept)} "
            f"finished={len(self._finished)} journaling={self._journal is not None}>"
        )

    def copy(self) -> KeptCopy:
        """C-level copies of the maps, for an export off the loop."""
        return KeptCopy(list(self._kept.items()), dict(self._owners), dict(self._finished))

    # -- a slot changing hands -------------------------------------------------------------------

    def supersede(self, key: str) -> None:
        """A newer attempt is about to open slot ``key``: the kept sessions of its ended owner
        are dropped (the owner stays until ``open`` or ``release``)."""
        current = self._owners.get(key)
        if current is not None:
            self._finished.pop(current[0], None)
            self._kept.pop(key, None)

    def open(self, key: str, rollout_id: str, attempt: int, sessions: Mapping[str, Any]) -> None:
        """Attempt ``rollout_id`` owns slot ``key`` with freshly opened ``sessions``: journaled
        first (the retained participants' ``export``; what it raises propagates, nothing
        changed here), then owned."""
        if self._journal is not None:
            self._journal.opened(
                key,
                rollout_id,
                attempt,
                {p.name: to_plain(p.export(sessions[p.name])) for p in self.retained},
            )
        self._owners[key] = (rollout_id, attempt)

    def claim(self, key: str, rollout_id: str, attempt: int) -> None:
        """Attempt ``rollout_id`` (a claim of a restored episode) takes slot ``key`` over with
        the restored sessions; ``JournalFailed`` after the change if the journal failed."""
        self._owners[key] = (rollout_id, attempt)
        if self._journal is not None:
            self._journal.claimed(key, rollout_id, attempt)

    def finish(self, ep: Episode) -> None:
        """``ep`` completed: its slot stays owned, its retained sessions are kept."""
        self._finished[ep.rollout_id] = ep.key
        if self.retained:
            self._kept[ep.key] = {p.name: ep.sessions[p.name] for p in self.retained}

    def release(self, key: str, rollout_id: str) -> bool:
        """Free slot ``key`` if ``rollout_id`` owns it (False otherwise: a newer attempt's
        sessions are never freed by an older one); ``JournalFailed`` after the change if the
        journal failed."""
        if self._owners.get(key, ("",))[0] == rollout_id:
            del self._owners[key]
            self._kept.pop(key, None)
            if self._journal is not None:
                self._journal.freed(key)
            return True
        return False

    def release_quietly(self, key: str, rollout_id: str) -> None:
        """``release`` where the caller must not fail (an episode ending): a journal that
        cannot record it has stopped the instance, whose stream says the rest."""
        with suppress(JournalFailed):
            self.release(key, rollout_id)

    def retire(self, rollout_id: str, key: str) -> None:
        """Attempt ``rollout_id`` of slot ``key`` is retired: forgotten as finished, and its
        slot freed if it still owns it."""
        self._finished.pop(rollout_id, None)
        self.release(key, rollout_id)

    def install(
        self,
        restored: Iterable[Episode],
        kept: Mapping[str, tuple[str, int, dict[str, Any]]],
        journal: Iterable[JournalSlot],
    ) -> None:
        """A restore: the owners are the ``restored`` (unclaimed) episodes and the ``kept``
        slots (key → (rollout ID, attempt, states), ended owners); the journal is rewritten
        to ``journal``."""
        self._owners = {ep.key: (ep.rollout_id, ep.info.attempt) for ep in restored}
        self._owners.update((key, (rid, attempt)) for key, (rid, attempt, _) in kept.items())
        self._kept = {key: states for key, (_, _, states) in kept.items()}
        self._finished = {rid: key for key, (rid, _, _) in kept.items()}
        if self._journal is not None:
            self._journal.rewrite(journal)

    # -- the journal ---------------------------------------------------------------------------

    def open_journal(
        self, path: Path, *, recover: bool, on_failure: Callable[[JournalFailed], object]
    ) -> None:
        """Journal to ``path``; ``recover``: continue what it holds (each journaled slot owned
        by the attempt that owned it, its sessions kept, as on the instance that wrote it)."""
        self._journal = SessionJournal(path, self.instance, on_failure=on_failure)
        slots = self._journal.open(recover=recover)
        for key, slot in slots.items():
            try:
                states = {p.name: p.restore(slot.states[p.name]) for p in self.retained}
            except Exception as exc:
                self._journal.close()
                raise ValueError(
                    f"instance {self.instance}: journaled session {key} cannot be restored "
                    f"({exc!r}); the journal is {path}"
                ) from None
            self._owners[key] = (slot.rollout_id, slot.attempt)
            self._kept[key] = states
            self._finished[slot.rollout_id] = key

    def close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def journal_turn(self, ep: Episode, touched: set[str] | None) -> str | None:
        """Journal the retained sessions of ``ep`` its turn fetched (``touched``); the problem
        if one cannot export (a data failure). A fenced episode's turn is not journaled (the
        sessions are no longer its). If the journal cannot record them the instance has
        stopped (``on_failure``): the episode ended with it, and what it returns is dropped,
        so None."""
        if not touched or self._journal is None or self.fenced(ep):
            return None
        try:
            for p in self.retained:
                if p.name in touched:
                    self._journal.state(ep.key, p.name, to_plain(p.export(ep.sessions[p.name])))
        except JournalFailed:
            return None
        except Exception as exc:
            return (
                f"{self.instance}: episode {ep.rollout_id} turn {ep.turn}: exporting a retained "
                f"session for the journal: {exc!r}"
            )
        return None
