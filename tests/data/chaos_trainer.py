"""A small deterministic training program for ``gymckpt chaos``'s tests: a real program on the
public trainer API (``open_rollouts`` on the embedded calendar Gym), whose "model" is a list of
floats updated from each row's results in slot order, rows trained in dataset order.

    python tests/data/chaos_trainer.py WORKDIR [--rows N] [--http]
        [--break-after-restore drop|duplicate]

``--http`` serves the Gym from spawned ``gymckpt serve`` processes (children chaos may kill).

Deterministic: the calendar's reward is a function of (seed, row, slot); the program trains
the rows in dataset order whatever order their groups complete in, holding the groups that
came early in its trainer state (they are trained data in the ledger once handed out, so the
state must keep them). The weights go into every checkpoint through ``files=``; the state holds
the next row, the held groups and the running digest of the training journal (every result
trained, in order). It ends with ``weights sha256: HEX`` and ``journal sha256: HEX``. A rerun
on the same WORKDIR resumes from its latest snapshot.

``--break-after-restore drop`` (``duplicate``) is the deliberately broken trainer: after a
restore it drops (trains twice) the first row it trains, which is not exactly once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import gymckpt
from gymckpt.app.chaos import arm_kill_points
from gymckpt.gym_adapter import EmbeddedGym, HttpGym
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_from_environ_path,
)

DIM = 8
WEIGHTS = "weights.json"
SIM = CalendarConfig(turns=(1, 2), turn_s=(0.002, 0.01), mutation_p=0.5)


class Model:
    """The weights and the trainer state that goes with them."""

    def __init__(self) -> None:
        self.weights = [0.0] * DIM
        self.next_row = 0
        self.held: dict[int, list[list[float]]] = {}
        self.journal = hashlib.sha256(b"chaos-trainer").hexdigest()

    def state(self) -> bytes:
        held = {str(k): v for k, v in sorted(self.held.items())}
        raw = {"next_row": self.next_row, "held": held, "journal": self.journal}
        return json.dumps(raw).encode()

    def load(self, state: bytes, files: Path | None) -> None:
        raw = json.loads(state)
        self.next_row, self.journal = raw["next_row"], raw["journal"]
        self.held = {int(k): v for k, v in raw["held"].items()}
        assert files is not None, "a snapshot with trainer state has the weights"
        self.weights = json.loads((files / WEIGHTS).read_text())

    def save(self, directory: Path) -> None:
        (directory / WEIGHTS).write_text(json.dumps(self.weights))

    def train_row(self, row: int, results: list[list[float]]) -> None:
        """One row's results, in slot order: an update whose result depends on the order."""
        w = self.weights
        for slot, (reward, turns) in enumerate(results):
            i = (row * 3 + slot) % DIM
            w[i] = w[i] * 0.75 + reward * (1 + slot) + 0.001 * row + 0.01 * turns
            w[(i + 1) % DIM] += 0.5 * w[i]
            line = f"{self.journal}:{row}:{slot}:{reward!r}:{turns}".encode()
            self.journal = hashlib.sha256(line).hexdigest()

    def digest(self) -> str:
        return hashlib.sha256(struct.pack(f"<{DIM}d", *self.weights)).hexdigest()


async def main(args: argparse.Namespace) -> None:
    model = Model()
    work = Path(args.workdir)
    live = work / "gym-live"
    if args.http:
        gym_context: Any = HttpGym.spawn(
            calendar_from_environ_path(),
            2,
            work_dir=live,
            config=SIM.host_config(),
            seed=0,
            state_root=work,
            environ=SIM.environ(),
        )
    else:
        gym_context = EmbeddedGym.host(
            calendar_environment(config=SIM), 2, 0, live, SIM.host_config()
        )
    async with (
        gym_context as gym,
        gymckpt.open_rollouts(
            gym, work, rows=args.rows, group_size=2, checkpoint_every=1, max_rows_in_flight=6
        ) as rollouts,
    ):
        arm_kill_points(rollouts)
        restored = rollouts.trainer_state is not None
        if restored:
            model.load(rollouts.trainer_state, rollouts.trainer_files)
        broken = args.break_after_restore if restored else None
        async for batch in rollouts.batches(1, state=model.state, files=model.save):
            for group in batch:
                model.held[group.row] = [[r.reward, r.turns] for r in group.results]
            while model.next_row in model.held:
                results = model.held.pop(model.next_row)
                if broken != "drop":
                    model.train_row(model.next_row, results)
                if broken == "duplicate":
                    model.train_row(model.next_row, results)
                broken = None
                model.next_row += 1
    assert model.next_row == args.rows and not model.held, (model.next_row, model.held)
    print(f"weights sha256: {model.digest()}")
    print(f"journal sha256: {model.journal}")


def parse(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--break-after-restore", choices=["drop", "duplicate"])
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    gymckpt.run(lambda: main(options))
