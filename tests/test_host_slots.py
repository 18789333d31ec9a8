"""The host's slot table (``gym_adapter.host._slots``): one owning attempt per slot, fencing by
it, retained sessions kept for a completed owner, freed only by their owner, and every change
journaled so a replay holds what the table holds.

Each test drives a ``SlotTable`` directly, with real journal files under ``tmp_path``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gymckpt.gym_adapter.host import _journal as _host_journal
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import MOVING, Episode
from gymckpt.gym_adapter.host._journal import JournalFailed, replay_journal
from gymckpt.gym_adapter.host._slots import KeptCopy, SlotTable


class Counter:
    """A retained participant whose session is ``{"n": int}``."""

    name, kind, retained = "counter", "environment", True

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        if state.get("broken"):
            raise ValueError("cannot export a broken counter")
        return dict(state)

    def restore(self, data: Any) -> dict[str, int]:
        return dict(data)


def episode(row: int, slot: int, attempt: int, n: int = 0) -> Episode:
    info = EpisodeInfo(f"r{row}-{slot}-a{attempt}", row, slot, attempt, 0, "gym-0")
    return Episode(info, {"agent": {}, "counter": {"n": n}}, MOVING)


def table(tmp_path: Path | None = None, *, recover: bool = False) -> SlotTable:
    slots = SlotTable("gym-0", (Counter(),))
    if tmp_path is not None:
        slots.open_journal(tmp_path / "j", recover=recover, on_failure=lambda _: None)
    return slots


def opened(slots: SlotTable, ep: Episode) -> Episode:
    slots.open(ep.key, ep.rollout_id, ep.info.attempt, ep.sessions)
    return ep


def journaled(tmp_path: Path) -> dict[str, tuple[str, int, dict[str, Any]]]:
    slots = replay_journal((tmp_path / "j").read_bytes())
    return {k: (s.rollout_id, s.attempt, s.states) for k, s in slots.items()}


def test_the_owner_is_the_last_attempt_opened_and_every_other_attempt_is_fenced() -> None:
    slots = table()
    old = opened(slots, episode(1, 0, 0))
    assert slots.owner("1-0") == (old.rollout_id, 0) and not slots.fenced(old)
    new = opened(slots, episode(1, 0, 1))
    assert slots.owner("1-0") == (new.rollout_id, 1)
    assert slots.fenced(old) and not slots.fenced(new)
    assert slots.fenced(episode(2, 0, 0))  # a slot nobody owns fences everyone


def test_a_completed_owner_keeps_its_retained_sessions_until_a_newer_attempt_supersedes_it() -> (
    None
):
    slots = table()
    ep = opened(slots, episode(1, 0, 0, n=7))
    slots.finish(ep)
    assert slots.kept_states("1-0") == {"counter": {"n": 7}}  # the retained participant only
    assert slots.finished_slot(ep.rollout_id) == "1-0" and slots.n_kept == 1
    slots.supersede("1-0")
    assert slots.kept_states("1-0") == {} and slots.finished_slot(ep.rollout_id) is None
    assert slots.owner("1-0") == (ep.rollout_id, 0)  # owned until the newer attempt opens


def test_only_the_owner_releases_a_slot(tmp_path: Path) -> None:
    slots = table(tmp_path)
    old = opened(slots, episode(1, 0, 0))
    new = opened(slots, episode(1, 0, 1))
    assert slots.release("1-0", old.rollout_id) is False
    assert slots.owner("1-0") == (new.rollout_id, 1)
    assert journaled(tmp_path) == {"1-0": (new.rollout_id, 1, {"counter": {"n": 0}})}
    assert slots.release("1-0", new.rollout_id) is True
    assert slots.owner("1-0") is None and journaled(tmp_path) == {}


def test_a_retire_forgets_the_finished_attempt_and_frees_only_a_slot_it_still_owns(
    tmp_path: Path,
) -> None:
    slots = table(tmp_path)
    old = opened(slots, episode(1, 0, 0))
    slots.finish(old)
    new = opened(slots, episode(1, 0, 1))
    slots.retire(old.rollout_id, "1-0")
    assert slots.finished_slot(old.rollout_id) is None
    assert slots.owner("1-0") == (new.rollout_id, 1)  # the newer attempt's sessions stay
    slots.finish(new)
    slots.retire(new.rollout_id, "1-0")
    assert slots.owner("1-0") is None and slots.kept_states("1-0") == {}
    assert journaled(tmp_path) == {}


def test_a_claim_takes_the_slot_over_and_is_journaled(tmp_path: Path) -> None:
    slots = table(tmp_path)
    ep = opened(slots, episode(1, 0, 0, n=3))
    slots.claim("1-0", "claim-1", 1)
    assert slots.owner("1-0") == ("claim-1", 1) and slots.fenced(ep)
    assert journaled(tmp_path) == {"1-0": ("claim-1", 1, {"counter": {"n": 3}})}


def test_a_turn_journals_what_it_touched_unless_fenced_and_reports_an_export_failure(
    tmp_path: Path,
) -> None:
    slots = table(tmp_path)
    ep = opened(slots, episode(1, 0, 0))
    ep.sessions["counter"]["n"] = 5
    assert slots.journal_turn(ep, None) is None  # nothing touched: nothing written
    assert journaled(tmp_path)["1-0"][2] == {"counter": {"n": 0}}
    assert slots.journal_turn(ep, {"counter"}) is None
    assert journaled(tmp_path)["1-0"][2] == {"counter": {"n": 5}}
    newer = opened(slots, episode(1, 0, 1))
    ep.sessions["counter"]["n"] = 99  # the fenced attempt's mutation is never journaled
    assert slots.journal_turn(ep, {"counter"}) is None
    assert journaled(tmp_path)["1-0"] == (newer.rollout_id, 1, {"counter": {"n": 0}})
    newer.sessions["counter"]["broken"] = True
    problem = slots.journal_turn(newer, {"counter"})
    assert problem is not None and "cannot export a broken counter" in problem


def test_opening_with_a_session_that_cannot_export_changes_nothing(tmp_path: Path) -> None:
    slots = table(tmp_path)
    ep = episode(1, 0, 0)
    ep.sessions["counter"]["broken"] = True
    with pytest.raises(ValueError, match="broken"):
        opened(slots, ep)
    assert slots.owner("1-0") is None and journaled(tmp_path) == {}


def test_a_recovered_journal_holds_each_slot_for_the_attempt_that_owned_it(
    tmp_path: Path,
) -> None:
    slots = table(tmp_path)
    done = opened(slots, episode(1, 0, 0, n=4))
    slots.finish(done)
    opened(slots, episode(2, 0, 0))
    slots.release("2-0", "r2-0-a0")
    slots.close_journal()
    again = table(tmp_path, recover=True)
    assert list(again.owners()) == [("1-0", (done.rollout_id, 0))]
    assert again.kept_states("1-0") == {"counter": {"n": 4}}
    assert again.finished_slot(done.rollout_id) == "1-0"
    fresh = table(tmp_path, recover=False)  # a new deployment starts the journal afresh
    assert list(fresh.owners()) == [] and journaled(tmp_path) == {}


def test_a_restore_installs_restored_and_kept_owners_and_rewrites_the_journal(
    tmp_path: Path,
) -> None:
    slots = table(tmp_path)
    opened(slots, episode(9, 0, 0))  # what was here before the restore is gone
    restored = episode(1, 0, 2)
    kept = {"3-1": ("r3-1-a0", 0, {"counter": {"n": 8}})}
    slots.install([restored], kept, [("3-1", "r3-1-a0", 0, {"counter": {"n": 8}})])
    assert list(slots.owners()) == [("1-0", (restored.rollout_id, 2)), ("3-1", ("r3-1-a0", 0))]
    assert slots.kept_states("3-1") == {"counter": {"n": 8}}
    assert slots.finished_slot("r3-1-a0") == "3-1"
    assert journaled(tmp_path) == {"3-1": ("r3-1-a0", 0, {"counter": {"n": 8}})}


def test_the_commit_copy_lists_kept_slots_of_ended_owners_only() -> None:
    slots = table()
    done = opened(slots, episode(1, 0, 0, n=2))
    slots.finish(done)
    opened(slots, episode(2, 0, 0))
    copy = slots.copy()
    assert isinstance(copy, KeptCopy)
    assert copy.sessions() == [("1-0", done.rollout_id, 0, {"counter": {"n": 2}})]
    slots.supersede("1-0")  # the copy is a copy: later changes do not reach it
    assert len(copy.sessions()) == 1 and slots.copy().sessions() == []


class FullDisk:
    """``os`` as the journal module sees it, with every ``write`` failing (ENOSPC)."""

    def write(self, fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.parametrize("quietly", [False, True])
def test_a_failing_journal_stops_the_instance_after_the_change_and_only_quietly_on_an_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quietly: bool,
) -> None:
    failures: list[JournalFailed] = []
    slots = SlotTable("gym-0", (Counter(),))
    slots.open_journal(tmp_path / "j", recover=False, on_failure=failures.append)
    one, two = opened(slots, episode(1, 0, 0)), opened(slots, episode(2, 0, 0))
    monkeypatch.setattr(_host_journal, "os", FullDisk())
    if quietly:
        slots.release_quietly("1-0", one.rollout_id)  # an episode ending never raises
    else:
        with pytest.raises(JournalFailed, match="gym-0"):
            slots.release("1-0", one.rollout_id)
    assert slots.owner("1-0") is None  # freed in memory; dies with the instance
    assert len(failures) == 1
    slots.release("2-0", two.rollout_id)  # closed for good: nothing more is recorded
    assert slots.owner("2-0") is None and len(failures) == 1
    monkeypatch.undo()
    assert set(journaled(tmp_path)) == {"1-0", "2-0"}  # the journal still holds both


def test_the_table_says_what_it_holds_in_its_repr(tmp_path: Path) -> None:
    slots = table(tmp_path)
    opened(slots, episode(1, 0, 0))
    slots.finish(opened(slots, episode(2, 0, 0)))
    assert repr(slots) == "<SlotTable gym-0 owned=2 kept=1 finished=1 journaling=True>"
