"""The hosted step path's cost rules (issue 34): what a Gym host does per step and per episode
that plain code would not, pinned by counting rather than timing.

- Every episode runs in the host's episodes nursery (trio's own tasks and cancel scopes), also
  those of a ``run`` asked for right after entry, before that nursery's task ran: they wait for
  it, never start through anyio's task group (a task handle, a cancel scope and an event more
  per episode, a frame more per step), which trio's scheduler let happen half the time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from gymckpt.gym_adapter import Completed, Done, Environment, GymHost, RunRow
from gymckpt.gym_adapter.host._episode import EpisodeInfo


@attrs.define
class Agent:
    """``turns`` turns; each records the name of the task owning the nursery its task runs in."""

    turns: int = 2
    owners: list[str] = attrs.field(factory=list)
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        return dict(state)

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: Any, state: Any) -> Done | None:
        nursery = trio.lowlevel.current_task().parent_nursery
        assert nursery is not None and nursery.parent_task is not None
        self.owners.append(nursery.parent_task.name)
        state["n"] += 1
        return Done(1.0, payload=state["n"]) if state["n"] == self.turns else None


async def test_a_run_asked_right_after_entry_runs_every_episode_in_the_episodes_nursery(
    tmp_path: Path,
) -> None:
    agent = Agent()
    for n in range(24):  # main: each entry had a one-in-two chance of starting them elsewhere
        env = Environment(agent=agent)
        async with GymHost(f"g{n}", env, 0, tmp_path / str(n)) as host:
            replies = []
            async for batch in await host.run([RunRow(f"{r}-0", r, 0, 0) for r in range(4)]):
                replies.extend(batch)
        assert all(isinstance(r, Completed) for r in replies), replies
    assert len(agent.owners) == 24 * 4 * 2
    assert {owner.rsplit(".", 1)[-1] for owner in agent.owners} == {"_trio_episodes"}, set(
        agent.owners
    )
