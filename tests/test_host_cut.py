"""An unaligned checkpoint's cut (``gym_adapter.host._cut``): ``mark_boundary`` serialises an
episode's session states as it passes a step boundary (a later change of a live state never
reaches the mark; what cannot be taken is a problem in the mark naming the participant, never
an exception); ``take_cut`` takes each episode at its mark with a copy of its staged calls;
``stand_ins`` rebuild the episodes the cut holds for the records.

Episodes are bare records; no host runs."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest

from gymckpt.gym_adapter.host._cut import BoundaryMark, mark_boundary, stand_ins, take_cut
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import BOUNDARY, MOVING, Episode, StagedModelCall


def S(key: str, response: object) -> StagedModelCall:
    """A staged call of a request with digest 0...0 at policy version 0."""
    return StagedModelCall(key, response, "0" * 64, 0)


@attrs.define
class Part:
    """A participant whose ``export`` returns the live state itself (the worst case for a
    mark); ``fail``: its export raises; ``nan``: it exports a nan."""

    name: str
    fail: bool = False
    nan: bool = False

    def export(self, state: Any) -> Any:
        if self.fail:
            raise RuntimeError(f"{self.name} cannot export")
        if self.nan:
            return {"x": float("nan")}
        return state

    def restore(self, data: Any) -> Any:
        return data


AGENT, CAL = Part("agent"), Part("cal")


def episode(rid: str = "3-0", turn: int = 2, **kw: Any) -> Episode:
    info = EpisodeInfo(rid, 3, 0, 0, 0, "gym-0")
    sessions = {"agent": {"seen": [1, 2]}, "cal": {"events": ["t0", "t1"]}}
    return Episode(info, sessions, MOVING, turn=turn, **kw)


def test_a_mark_holds_the_states_as_they_were_at_the_boundary() -> None:
    ep = episode()
    mark = mark_boundary((AGENT, CAL), ep)
    assert mark.turn == 2 and mark.problem is None and mark.exc is None
    ep.sessions["cal"]["events"].append("t2")  # the next turn mutates the live state in place
    ep.sessions["agent"]["seen"].append(3)
    assert mark.states is not None
    assert orjson.loads(mark.states) == [{"seen": [1, 2]}, {"events": ["t0", "t1"]}]


@pytest.mark.parametrize("which", ["agent", "cal"])
def test_an_export_that_raises_is_a_problem_naming_the_participant_not_an_exception(
    which: str,
) -> None:
    parts = tuple(Part(n, fail=n == which) for n in ("agent", "cal"))
    mark = mark_boundary(parts, episode())
    assert mark.states is None and mark.problem is not None
    assert mark.problem == (
        f"episode 3-0 (row 3 slot 0 attempt 0) on gym-0: exporting its {which} session state "
        f"at step boundary 2 raised RuntimeError('{which} cannot export')"
    )
    assert isinstance(mark.exc, RuntimeError)


@pytest.mark.parametrize("which", ["agent", "cal"])
def test_an_export_that_is_not_finite_is_a_problem_naming_the_participant(which: str) -> None:
    parts = tuple(Part(n, nan=n == which) for n in ("agent", "cal"))
    mark = mark_boundary(parts, episode())
    assert mark.states is None and mark.exc is None
    assert mark.problem == (
        "episode 3-0 (row 3 slot 0 attempt 0) on gym-0: at step boundary 2, "
        f"{which} session state.x is nan, not a finite number"
    )


def test_a_state_too_deep_for_the_records_is_a_problem_not_an_exception() -> None:
    deep: list[Any] = []
    for _ in range(252):  # 253 levels: orjson serialises it alone, not where a chunk holds it
        deep = [deep]
    assert orjson.loads(orjson.dumps([deep])) == [deep]
    ep = episode()
    ep.sessions["cal"] = deep
    mark = mark_boundary((AGENT, CAL), ep)
    assert mark.states is None and mark.parts is None
    assert mark.problem == (
        "episode 3-0 (row 3 slot 0 attempt 0) on gym-0: at step boundary 2, cal session state "
        "nests too deep: a snapshot's records hold it 2 levels down, where JSON may nest 254 "
        "levels; keep its own nesting to at most 252 levels"
    )
    ep.sessions["cal"] = deep[0]  # 252 levels: taken
    assert mark_boundary((AGENT, CAL), ep).problem is None


def test_a_mark_holds_each_state_in_the_bytes_its_chunk_entry_needs() -> None:
    ep = episode()
    ep.sessions["agent"] = {"z": 1, "a": {"y": [0.5, "é"], "b": None}}
    mark = mark_boundary((AGENT, CAL), ep)
    assert mark.parts == (
        orjson.dumps(ep.sessions["agent"], option=orjson.OPT_SORT_KEYS),
        b'{"events":["t0","t1"]}',
    )
    assert mark.parts[0] == '{"a":{"b":null,"y":[0.5,"é"]},"z":1}'.encode()


def test_the_cut_takes_each_episode_at_its_mark_with_the_calls_completed_so_far() -> None:
    ep = episode(staged=[S("3-0:t0-c0", "a"), S("3-0:t1-c0", "b")])
    ep.mark = mark_boundary((AGENT, CAL), ep)
    ep.stepping = True
    ep.staged.append(S("3-0:t2-c0", {"r": 1}))  # completed inside the turn, before the cut
    other = episode("4-0", turn=0)
    other.mark = mark_boundary((AGENT, CAL), other)
    taken, refused = take_cut([ep, other])
    assert refused == []
    assert [(c.ep, c.mark, c.mid_turn) for c in taken] == [
        (ep, ep.mark, True),
        (other, other.mark, False),
    ]
    assert taken[0].staged == (S("3-0:t0-c0", "a"), S("3-0:t1-c0", "b"), S("3-0:t2-c0", {"r": 1}))
    ep.staged.append(S("3-0:t2-c1", "after the cut"))  # a capture made after the cut
    assert len(taken[0].staged) == 3


def test_the_cut_hands_back_the_episodes_whose_mark_holds_a_problem() -> None:
    good, bad = episode("1-0"), episode("2-0")
    good.mark = mark_boundary((AGENT, CAL), good)
    bad.mark = mark_boundary((AGENT, Part("cal", fail=True)), bad)
    taken, refused = take_cut([bad, good])
    assert [c.ep for c in taken] == [good] and refused == [bad]


def test_the_cut_refuses_a_mark_of_another_boundary() -> None:
    ep = episode()
    ep.mark = BoundaryMark(1, b"[{},{}]")  # a stale mark would take the episode a turn back
    with pytest.raises(AssertionError, match="3-0"):
        take_cut([ep])


def test_stand_ins_are_the_episodes_as_the_cut_holds_them() -> None:
    ep = episode(staged=[S("3-0:t0-c0", "a")])
    ep.mark = mark_boundary((AGENT, CAL), ep)
    ep.stepping = True
    taken, _ = take_cut([ep])
    ep.sessions["cal"]["events"].append("t2")  # the turn goes on after the cut
    ep.staged.append(S("3-0:t2-c0", "late"))
    ep.turn += 1
    unclaimed = Episode(
        EpisodeInfo("9-0", 9, 0, 0, 0, "gym-0"),
        {"agent": {"seen": []}, "cal": {"events": ["u"]}},
        "unclaimed",
        turn=4,
        staged=[S("9-0:t3-c0", "z")],
    )
    [stand_in, kept] = stand_ins((AGENT, CAL), taken, [unclaimed])
    assert stand_in.info is ep.info and stand_in.state == BOUNDARY
    assert stand_in.turn == 2 and stand_in.capture_keys == ("3-0:t0-c0",)
    assert stand_in.sessions == {"agent": {"seen": [1, 2]}, "cal": {"events": ["t0", "t1"]}}
    assert stand_in.staged is not ep.staged
    assert (kept.info, kept.state, kept.turn) == (unclaimed.info, BOUNDARY, 4)
    assert kept.sessions == unclaimed.sessions and kept.capture_keys == ("9-0:t3-c0",)


def test_an_unclaimed_episode_whose_export_raises_raises_from_stand_ins() -> None:
    unclaimed = episode("9-0")
    with pytest.raises(RuntimeError, match="cal cannot export"):
        stand_ins((AGENT, Part("cal", fail=True)), [], [unclaimed])
