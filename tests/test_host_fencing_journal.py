"""Two host paths of a slot that changes hands between attempts, with retained sessions:

* a fenced attempt's turn is never journaled: attempt 0 touched its retained session, attempt
  1 took the slot, then attempt 0's step raised: the journal (what a replacement continues)
  must keep attempt 1's session, not the fenced one's;
* a retire frees only the session of the attempt it names: retiring attempt 0 of a slot that
  attempt 1 owns now leaves attempt 1's kept session (live and journaled) alone.

Named mutants in ``tests/mutation.py`` break each (``journal-fenced-turn``,
``retire-frees-a-newer-attempt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from gymckpt.gym_adapter import (
    Completed,
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.runtime import rollout_id_for

FAR = 1e9


class Box:
    """A retained participant: a list of marks per slot."""

    name, kind, retained = "box", "environment", True

    def open(self, info: EpisodeInfo) -> list[str]:
        return []

    def export(self, state: list[str]) -> Any:
        return list(state)

    def restore(self, data: Any) -> list[str]:
        return list(data)


class Marker:
    """Turn 0 marks the box with its attempt; attempt 0 then waits for ``release`` (if given)
    and raises, any other attempt ends at once."""

    name, kind = "agent", "simple_agent"

    def __init__(self, release: trio.Event | None = None, fail_first: bool = True) -> None:
        self.release = release
        self.fail_first = fail_first

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        ctx.session("box").append(f"a{ctx.info.attempt}")
        if ctx.info.attempt == 0:
            if self.release is not None:
                await self.release.wait()
            if self.fail_first:
                raise RuntimeError("attempt 0 fails after its mark")
        return Done(reward=1.0)


async def _replies(host: GymHost, rows: list[RunRow], into: dict[str, RunReply]) -> None:
    async for batch in await host.run(rows):
        for r in batch:
            if isinstance(r, (Completed, Failed)):
                into[r.rollout_id] = r


def _box(host: GymHost) -> dict[str, tuple[str, int, Any]]:
    return {
        k: (s.rollout_id, s.attempt, s.state) for k, s in host.retained_sessions()["box"].items()
    }


async def test_a_fenced_attempts_turn_is_not_journaled(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    release = trio.Event()
    env = Environment(agent=Marker(release), participants=(Box(),))
    first, second = rollout_id_for(0, 0, 0), rollout_id_for(0, 0, 1)
    got: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, 0, tmp_path) as host, trio.open_nursery() as nursery:
        nursery.start_soon(_replies, host, [RunRow(first, 0, 0, 0)], got)
        await trio.testing.wait_all_tasks_blocked()  # attempt 0 marked the box and waits
        nursery.start_soon(_replies, host, [RunRow(second, 0, 0, 1)], got)
        await trio.testing.wait_all_tasks_blocked()  # attempt 1 took the slot and ended
        assert isinstance(got.get(second), Completed)
        release.set()  # attempt 0, fenced, now raises: its reply is dropped
        await trio.testing.wait_all_tasks_blocked()
        live = _box(host)
    assert first not in got  # a fenced attempt never replies
    assert live == {"0-0": (second, 1, ["a1"])}
    async with GymHost("gym-0", env, 0, tmp_path, recover=True) as replacement:
        assert _box(replacement) == live  # the journal kept attempt 1's session


async def test_a_retire_frees_only_the_attempt_it_names(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Attempt 0 hangs in its step (the runtime gave up on it: its stream's deadline), attempt
    1 of the same slot ran on the same instance and ended; the retire of attempt 0 at the next
    checkpoint stops it, and frees nothing of attempt 1."""
    env = Environment(agent=Marker(trio.Event(), fail_first=False), participants=(Box(),))
    first, second = rollout_id_for(0, 0, 0), rollout_id_for(0, 0, 1)
    got: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, 0, tmp_path) as host, trio.open_nursery() as nursery:
        nursery.start_soon(_replies, host, [RunRow(first, 0, 0, 0)], got)
        await trio.testing.wait_all_tasks_blocked()  # attempt 0 marked the box and hangs
        await _replies(host, [RunRow(second, 0, 0, 1)], got)  # the slot's newer attempt
        assert isinstance(got[second], Completed)
        assert _box(host) == {"0-0": (second, 1, ["a1"])}
        reply = await host.retire([first], trio.current_time() + FAR)
        assert reply.retired == (first,)  # stopped: but the slot is not its own
        assert _box(host) == {"0-0": (second, 1, ["a1"])}
        await trio.testing.wait_all_tasks_blocked()
        assert first not in got
        kept = _box(host)
    async with GymHost("gym-0", env, 0, tmp_path, recover=True) as replacement:
        assert _box(replacement) == kept  # the journal did not free it either
        reply = await replacement.retire([second], trio.current_time() + FAR)
        assert reply.retired == (second,) and _box(replacement) == {}


async def test_a_data_failed_attempts_session_is_freed_in_the_journal_too(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Attempt 0 marks the box and fails as data on gym-0; its retry completes on gym-1. The
    failed attempt's session is freed on gym-0 and in its journal: a replacement of gym-0
    must not bring the mark back beside the retry's (the mutation twice)."""
    env = Environment(agent=Marker(), participants=(Box(),))
    first, second = rollout_id_for(5, 1, 0), rollout_id_for(5, 1, 1)
    got: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, 0, tmp_path) as a, GymHost("gym-1", env, 0, tmp_path) as b:
        await _replies(a, [RunRow(first, 5, 1, 0)], got)
        await _replies(b, [RunRow(second, 5, 1, 1)], got)
        assert isinstance(got[first], Failed) and got[first].failure_class == "data"
        assert isinstance(got[second], Completed)
        assert _box(a) == {} and _box(b) == {"5-1": (second, 1, ["a1"])}
        a.kill()  # gym-0 dies; its replacement replays its journal
    async with GymHost("gym-0", env, 0, tmp_path, recover=True) as replacement:
        assert _box(replacement) == {}
