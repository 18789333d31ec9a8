"""The ownership rule (S10) over commit replies, built as columns (``EpisodeColumns``): a
pass per field over each reply's exported episodes, legacy agent sessions after them."""

from __future__ import annotations

import pytest

from gymckpt.gym_adapter import AgentSession, CommitReply, ExportedEpisode
from gymckpt.nurseries._ownership import ownership
from gymckpt.runtime import CheckpointInvariantError, EpisodeRecord, StrandedSessionError


def _reply(name: str, *exported: str, sessions: tuple[AgentSession, ...] = ()) -> CommitReply:
    episodes = tuple(ExportedEpisode(r, "calendar", (f"{r}:t0",)) for r in exported)
    return CommitReply(name, "c1", (), episodes, ("9-0",), sessions)


def test_episodes_are_columns_in_reply_order_legacy_sessions_after_their_instance() -> None:
    legacy = (
        AgentSession("0-0", "agent", "legacy_agent", 3),  # exported already: not twice
        AgentSession("5-0", "agent", "legacy_agent", 2, ("5-0:t1",)),
        AgentSession("9-0", "agent", "simple_agent", None),  # its reply is on the wire
    )
    replies = {"gym-0": _reply("gym-0", "0-0", "1-0", sessions=legacy), "gym-1": _reply("gym-1")}
    owned = ownership(replies, ["gym-0", "gym-1"])
    assert list(owned.episodes) == [
        EpisodeRecord("0-0", "calendar", "gym-0", ("0-0:t0",)),
        EpisodeRecord("1-0", "calendar", "gym-0", ("1-0:t0",)),
        EpisodeRecord("5-0", "agent", "gym-0", ("5-0:t1",)),
    ]
    assert owned.episodes.replica == ("gym-0",) * 3
    assert owned.by_instance == {"gym-0": {"0-0", "1-0", "5-0"}, "gym-1": frozenset()}
    assert owned.on_wire == {"gym-0": {"9-0"}, "gym-1": {"9-0"}}
    assert owned.episodes.without({"1-0"}).rollout_id == ("0-0", "5-0")
    assert owned.episodes.without(()) is owned.episodes


def test_an_episode_exported_twice_by_an_instance_is_an_invariant_violation() -> None:
    with pytest.raises(
        CheckpointInvariantError, match="instance gym-1: episode 2-1 exported twice"
    ):
        ownership({"gym-1": _reply("gym-1", "1-1", "2-1", "2-1")}, ["gym-1"])


def test_a_parked_session_nobody_owns_and_not_on_the_wire_is_stranded() -> None:
    stranded = (AgentSession("7-0", "agent", "simple_agent", None),)
    with pytest.raises(StrandedSessionError):
        ownership({"gym-0": _reply("gym-0", sessions=stranded)}, ["gym-0"])
