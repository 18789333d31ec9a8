"""The trainer loop every built-in learner runs on: gymckpt's runtime as a user would drive it.

    async with EmbeddedGym.host(env, instances=2, seed=S) as gym:
        async with gymckpt.open_rollouts(gym, workdir, rows=steps * groups, group_size=G) as ro:
            restore the learner from ro.trainer_state and ro.trainer_files, if any
            async for batch in ro.batches(groups, state=..., files=...):   # checkpoints
                learner.update(batch); ro.set_policy_version(learner.version)
            a final checkpoint, so a rerun of a finished run restores the final weights

The policy runs inside the Gym (the environment's model, called per decision through the
host's model proxy, so every decision is captured). Its sampling is seeded from the call's
place in the episode — the slot (``"{position}-{slot}"``), the turn and the call's occurrence —
never the attempt, which a retry or a restore advances: an episode played again after a crash
draws what the uninterrupted run drew. A decision yields to the scheduler before it computes,
as a call to a model server would: a checkpoint then cuts through a step's rollouts rather
than after them, even when an episode's turns are quicker than the checkpoint (the text
learner's are), so a restore resumes parked episodes there too.

Deterministic mode (``TrainOptions.deterministic``) makes the final weights a function of the
program, the seed and the step count alone, bit for bit:

- a step's rollouts all run under one policy version: the runtime keeps exactly one step's
  rows in flight (``max_rows_in_flight = groups_per_step``), and the model of a row of step
  ``k`` waits until the learner has made ``k`` updates (``VersionGate``), so no rollout of
  step ``k + 1`` samples before step ``k``'s update, however the dispatcher is scheduled;
- batches in dataset order: groups sorted by their position in the run's row order, results in
  slot order (as the runtime hands them), whatever order they completed in;
- torch's deterministic algorithms, one thread.

Outside it, rows run ahead (two steps in flight, off-policy by one version) and batches are
trained in completion order; every rollout is still trained exactly once.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import orjson
import torch
import trio

import gymckpt
from gymckpt.app.chaos import arm_kill_points
from gymckpt.gym_adapter import (
    EmbeddedGym,
    Environment,
    EpisodeInfo,
    parse_call_id,
    split_capture_key,
)
from gymckpt.runtime import BadInput, CompletedGroup

__all__ = [
    "Learner",
    "StepReport",
    "TrainMismatch",
    "TrainOptions",
    "Trained",
    "VersionGate",
    "chain_journal",
    "generator_state",
    "journal_entry",
    "ordered_batch",
    "sampling_rng",
    "set_generator_state",
    "train",
]

INSTANCES = 2
"""Gym instances the built-in learners run on (embedded, in the trainer's process)."""


class TrainMismatch(BadInput, ValueError):
    """The work directory holds a run of other options (learner, seed, steps, mode): a rerun
    resumes a run, it does not change it (exit code 2)."""


@attrs.frozen(kw_only=True)
class TrainOptions:
    """One training run. ``steps`` updates of ``groups_per_step`` groups each; a checkpoint
    every ``checkpoint_every`` steps and one after the last."""

    name: str
    seed: int = 0
    steps: int
    deterministic: bool = False
    checkpoint_every: int = 5

    def __attrs_post_init__(self) -> None:
        if type(self.seed) is not int or self.seed < 0:
            raise ValueError(f"--seed must be an int >= 0, got {self.seed!r}")
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"--checkpoint-every must be >= 1, got {self.checkpoint_every}")

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run in its work directory."""
        return {
            "learner": self.name,
            "seed": self.seed,
            "steps": self.steps,
            "deterministic": self.deterministic,
        }


@attrs.frozen
class StepReport:
    """One trained step: the run's step number (1-based), the batch's mean return and the
    policy version after the update."""

    step: int
    mean_return: float
    policy_version: int


Act = Callable[[Any, np.random.Generator], Any]


class Learner(Protocol):
    """A built-in learner: a torch policy, its optimizer and its RNG.

    ``version`` counts the updates made (the policy version); ``update`` trains one batch
    (groups in the order given, results in slot order) and adds one. ``act(request, rng)`` is
    the policy's decision for one model call, drawing its randomness from ``rng`` only.
    ``state``/``load`` round-trip everything but the files (``save_files``: weights and
    optimizer), bit for bit."""

    group_size: int
    groups_per_step: int
    version: int

    def environment(self, model: Callable[[str, Any, EpisodeInfo], Any]) -> Environment: ...

    def act(self, request: Any, rng: np.random.Generator) -> Any: ...

    def update(self, batch: Sequence[CompletedGroup]) -> float: ...

    def state(self) -> dict[str, Any]: ...

    def load(self, state: Mapping[str, Any], files: Path) -> None: ...

    def save_files(self, directory: Path) -> None: ...

    def weights(self) -> Mapping[str, torch.Tensor]: ...


def sampling_rng(seed: int, session_key: str, turn: int, occurrence: int) -> np.random.Generator:
    """The generator of one policy decision: a function of the run's seed and the call's place
    in the episode (slot, turn, occurrence of the request in the turn), never the attempt."""
    material = f"gymckpt-train:{seed}:{session_key}/t{turn}/c{occurrence}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(material).digest()[:16], "little"))


def generator_state(generator: torch.Generator) -> str:
    """A torch generator's state as text (base64 of its state bytes), for the trainer state."""
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def set_generator_state(generator: torch.Generator, text: str) -> None:
    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy()
    generator.set_state(torch.from_numpy(raw))


def ordered_batch(batch: Sequence[CompletedGroup]) -> list[CompletedGroup]:
    """The batch in dataset order: groups by their position in the run's row order (results
    are in slot order already), whatever order they completed in."""
    return sorted(batch, key=lambda group: group.position)


def journal_entry(step: int, batch: Sequence[CompletedGroup], policy_version: int) -> bytes:
    """One trained step as the training journal records it: the step, the policy version it
    made, and per group (in the order trained) its position, its dataset row and every result's
    reward (``float.hex``: exact) and turns. What a lost, duplicated, reordered or altered
    rollout changes."""
    groups = [
        [g.position, g.row, [[float(r.reward).hex(), r.turns] for r in g.results]] for g in batch
    ]
    return orjson.dumps({"step": step, "policy_version": policy_version, "groups": groups})


def chain_journal(previous: str, entry: bytes) -> str:
    """The journal's digest after ``entry``: sha256 of the previous digest (hex) and the entry.
    The empty journal's digest is the empty string's sha256."""
    return hashlib.sha256(previous.encode() + b"\n" + entry).hexdigest()


EMPTY_JOURNAL = hashlib.sha256(b"").hexdigest()


@attrs.frozen
class Trained:
    """A finished run: the per-step mean returns (restored steps included) and the training
    journal's digest (``chain_journal`` over every step trained, in order). A run resumed after
    any crash ends with the uninterrupted run's journal digest when every rollout was trained
    once, in the same step, in the same order, with the same results (deterministic mode)."""

    curve: list[float]
    journal_sha256: str


@attrs.define(eq=False, slots=True)
class VersionGate:
    """Holds a decision of step ``k`` until the learner has made ``k`` updates. A decision of an
    older step after a newer update cannot happen in deterministic mode (a step's groups are
    all trained together) and is refused, naming both."""

    version: int = 0
    _waiting: dict[int, trio.Event] = attrs.field(factory=dict)

    def advance(self, version: int) -> None:
        self.version = version
        for wanted in [v for v in self._waiting if v <= version]:
            self._waiting.pop(wanted).set()

    async def reach(self, step: int) -> None:
        if step < self.version:
            raise RuntimeError(
                f"a decision of step {step} asked after update {self.version}: a step's "
                "rollouts must all run under one policy version"
            )
        if step > self.version:
            event = self._waiting.setdefault(step, trio.Event())
            await event.wait()


def _step_of(info: EpisodeInfo, groups_per_step: int) -> int:
    return int(info.session_key.split("-", 1)[0]) // groups_per_step


def deterministic_torch() -> None:
    """Torch's deterministic algorithms, one thread (the process's setting)."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def _resume(
    learner: Learner, workdir: Path, options: TrainOptions, rollouts: gymckpt.Rollouts
) -> tuple[list[float], str]:
    """Load the learner from the restored snapshot (refused when the run's options differ or
    the runtime's step or policy version disagrees with the learner's updates) and return the
    restored curve and journal digest."""
    assert rollouts.trainer_state is not None
    saved = orjson.loads(rollouts.trainer_state)
    mine = options.identity()
    theirs = {k: saved.get(k) for k in mine}
    if theirs != mine:
        differ = ", ".join(
            f"{k} {theirs[k]!r} (now {mine[k]!r})" for k in mine if theirs[k] != mine[k]
        )
        raise TrainMismatch(
            f"{workdir} holds a run with other options: {differ}; rerun it with "
            "its own options to resume it, or use a fresh work directory"
        )
    files = rollouts.trainer_files
    if files is None:
        raise TrainMismatch(f"{workdir}: the restored snapshot has no weights")
    learner.load(saved["learner_state"], files)
    if learner.version != rollouts.step or learner.version != rollouts.policy_version:
        raise TrainMismatch(
            f"{workdir}: the snapshot's learner made {learner.version} updates but "
            f"the runtime restored step {rollouts.step}, policy version "
            f"{rollouts.policy_version}"
        )
    return [float(r) for r in saved["curve"]], str(saved.get("journal", EMPTY_JOURNAL))


async def train(
    learner: Learner,
    workdir: Path,
    options: TrainOptions,
    on_step: Callable[[StepReport], None] = lambda report: None,
) -> Trained:
    """Run ``options`` with ``learner`` in ``workdir`` (resuming the run there, if any) and
    return its curve and its training journal's digest (restored steps included)."""
    gate = VersionGate()
    gps = learner.groups_per_step

    async def model(key: str, request: Any, info: EpisodeInfo) -> Any:
        if options.deterministic:
            await gate.reach(_step_of(info, gps))
        call = parse_call_id(split_capture_key(key)[1])
        rng = sampling_rng(options.seed, info.session_key, call.turn, call.occurrence)
        await trio.lowlevel.checkpoint()  # a decision yields, as a call to a model server does
        return learner.act(request, rng)

    curve: list[float] = []
    journal = EMPTY_JOURNAL
    env = learner.environment(model)
    async with EmbeddedGym.host(env, instances=INSTANCES, seed=options.seed) as gym:
        async with gymckpt.open_rollouts(
            gym,
            workdir,
            rows=options.steps * gps,
            group_size=learner.group_size,
            max_rows_in_flight=gps if options.deterministic else 2 * gps,
            checkpoint_every=options.checkpoint_every,
        ) as rollouts:
            arm_kill_points(rollouts)  # under gymckpt chaos: kills aimed at checkpoint stages

            def state() -> bytes:
                run = {
                    **options.identity(),
                    "curve": curve,
                    "journal": journal,
                    "learner_state": learner.state(),
                }
                return orjson.dumps(run)

            if rollouts.trainer_state is not None:
                restored_curve, journal = _resume(learner, workdir, options, rollouts)
                curve.extend(restored_curve)
            gate.advance(learner.version)
            trained = 0
            async for batch in rollouts.batches(gps, state=state, files=learner.save_files):
                if options.deterministic:
                    batch = ordered_batch(batch)
                mean = learner.update(batch)
                journal = chain_journal(
                    journal, journal_entry(len(curve) + 1, batch, learner.version)
                )
                rollouts.set_policy_version(learner.version)
                gate.advance(learner.version)
                curve.append(mean)
                trained += 1
                on_step(StepReport(learner.version, mean, learner.version))
            if trained or rollouts.restored is None:
                outcome = await rollouts.checkpoint(state(), files=learner.save_files)
                if not outcome.ok:  # retried once: the final weights must be in a snapshot
                    await rollouts.checkpoint(state(), files=learner.save_files)
    return Trained(curve, journal)


def mean_return(batch: Sequence[CompletedGroup]) -> float:
    """The batch's mean episode return (every result of every group)."""
    rewards = [r.reward for group in batch for r in group.results]
    return math.fsum(rewards) / len(rewards)
