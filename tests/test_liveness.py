"""Liveness: whatever ``max_rows_in_flight`` and however many rows fail for good, a run either
makes progress or ends with its exit code; it never waits for nothing.

The hang this pins (issue 31, finding 6): the dispatcher reserves rows up to
``max_rows_in_flight`` and stops asking the row iterator for more. When every row in flight
then fails for good, the rows leave the ledger, which opens room, but nothing woke the
dispatcher's planning loop: it never learnt that the dataset was done, and the trainer waited
for ``rows_exhausted`` forever. (With more room than rows the iterator had already run dry, so
the run ended at once.) Virtual time makes a hang a ``TooSlowError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import Done, EmbeddedGym, Environment
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import BudgetExhausted, RuntimeConfig

CONFIG = RuntimeConfig(
    control_timeout_s=2.0, reply_grace_s=0.5, lease_s=30.0, data_failure_budget=1000
)


class Game:
    name, kind = "game", "environment"

    def open(self, info: Any) -> dict[str, int]:
        return {"n": 0}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data


class Player:
    """Fails every attempt of the rows in ``failing`` (as data), finishes the others."""

    name, kind = "agent", "simple_agent"

    def __init__(self, failing: frozenset[int]) -> None:
        self.failing = failing

    def open(self, info: Any) -> dict[str, int]:
        return {"row": info.row}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: Any, state: Any) -> Done:
        await trio.sleep(0.5)
        if state["row"] in self.failing:
            raise KeyError("this row always fails")
        return Done(reward=1.0)


async def train(
    tmp_path: Path, rows: int, in_flight: int, failing: frozenset[int]
) -> tuple[list[int], BaseException | None]:
    env = Environment(agent=Player(failing), participants=[Game()], model=lambda k, b, i: 0)
    trained: list[int] = []
    ended: BaseException | None = None
    async with EmbeddedGym.host(env, instances=2, work_dir=tmp_path / "gym") as gym:
        async with open_rollouts(
            gym,
            tmp_path / "work",
            rows=rows,
            group_size=2,
            config=CONFIG,
            max_rows_in_flight=in_flight,
            handle_signals=False,
        ) as ro:
            try:
                async for batch in ro.batches(groups_per_step=2):
                    trained.extend(g.row for g in batch)
            except BudgetExhausted as exc:
                ended = exc
    return sorted(trained), ended


@pytest.mark.parametrize("in_flight", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
async def test_every_row_failing_for_good_ends_the_run_whatever_the_room(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, rows: int, in_flight: int
) -> None:
    with trio.fail_after(600):  # virtual: a run that waits for nothing fails here
        trained, ended = await train(tmp_path, rows, in_flight, frozenset(range(rows)))
    assert trained == []
    assert isinstance(ended, BudgetExhausted), ended
    assert f"({rows} rows, none trained" in str(ended)


@pytest.mark.parametrize("in_flight", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("rows", [2, 3, 5])
async def test_rows_failing_for_good_make_room_for_the_rest(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, rows: int, in_flight: int
) -> None:
    """The first rows fail for good and the last one trains: the room they free is used."""
    with trio.fail_after(600):
        trained, ended = await train(tmp_path, rows, in_flight, frozenset(range(rows - 1)))
    assert ended is None
    assert trained == [rows - 1]
