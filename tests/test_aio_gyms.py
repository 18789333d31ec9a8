"""An asyncio trainer on any Gym deployment (``gymckpt.aio.open_gym``): a user's own environment
on the embedded host, and the same on Ray, with the semantics of the trio facade: every row
trained once, a checkpoint in the middle published, and a restore that goes on from it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import gymckpt.aio
from gymckpt.gym_adapter import EmbeddedGym
from gymckpt.runtime import load_snapshot, verify_snapshot

ROWS = 8
ENV = "gymckpt.testing.examples:guess_the_number"


def _train(gym_factory: Any, work: Path, stop_after: int | None = None) -> dict[str, Any]:
    """An asyncio program: train (up to ``stop_after`` rows), checkpointing after 4 rows."""

    async def main() -> dict[str, Any]:
        asyncio.get_running_loop()  # asyncio code, on trio-asyncio's loop
        seen: dict[str, Any] = {"rows": [], "results": [], "checkpoints": []}
        async with (
            gymckpt.aio.open_gym(gym_factory) as gym,
            gymckpt.aio.open_rollouts(
                gym, work, rows=ROWS, group_size=2, max_rows_in_flight=4, handle_signals=False
            ) as ro,
        ):
            seen["restored_step"] = ro.step
            async for batch in ro.batches(1):
                await asyncio.sleep(0)  # train
                seen["rows"] += [g.row for g in batch]
                seen["results"] += [r for g in batch for r in g.results]
                if len(seen["rows"]) == 4:
                    outcome = await ro.checkpoint(b"trainer")
                    assert outcome.ok, outcome
                    seen["checkpoints"].append(outcome.snapshot.path)  # type: ignore[union-attr]
                if stop_after is not None and len(seen["rows"]) >= stop_after:
                    break
        return seen

    return gymckpt.aio.run(main)


def _check_results(results: list[Any]) -> None:
    for r in results:  # the environment's own payload: the agent's guesses, the last one right
        assert isinstance(r.payload, list) and r.payload and r.reward == 1 / len(r.payload)


def test_an_asyncio_trainer_on_its_own_environment(tmp_path: Path) -> None:
    first = _train(
        lambda: EmbeddedGym.host(ENV, instances=2, work_dir=tmp_path / "gym"),
        tmp_path / "w",
        stop_after=5,
    )
    assert first["restored_step"] == 0 and len(first["checkpoints"]) == 1
    snap = load_snapshot(first["checkpoints"][0])
    assert verify_snapshot(snap) == []
    _check_results(first["results"])
    # a second process-like run restores the checkpoint taken after 4 rows and trains the rest
    second = _train(
        lambda: EmbeddedGym.host(ENV, instances=2, work_dir=tmp_path / "gym2"), tmp_path / "w"
    )
    assert second["restored_step"] == 4
    assert sorted(first["rows"][:4] + second["rows"]) == list(range(ROWS))  # each row once
    _check_results(second["results"])


@pytest.mark.ray
def test_an_asyncio_trainer_on_ray(tmp_path: Path) -> None:
    from gymckpt.gym_adapter import RayGym

    seen = _train(lambda: RayGym.host(ENV, instances=2, work_dir=tmp_path / "gym"), tmp_path / "w")
    assert sorted(seen["rows"]) == list(range(ROWS)) and len(seen["checkpoints"]) == 1
    _check_results(seen["results"])
