"""``gymckpt train NAME WORKDIR [--seed S] [--steps N] [--deterministic]``: run a built-in
learner and print the final weights' digest.

Progress goes to stderr, one line per step (``step 3/40: mean return 41.2, policy version
3``); stdout ends with ``journal sha256: HEX`` (the training journal: every step's groups,
their rows, results and policy version, chained; ``loop.chain_journal``) and, last,
``weights sha256: HEX`` (``weights.weights_sha256``). Running
the same command on a work directory that holds a snapshot resumes the run from it; a finished
run's rerun prints the same digest. Exit codes are the command line's (2: bad input, an
unknown NAME listing the known ones, a work directory of another run or in use).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gymckpt.nurseries import ExitCode

__all__ = ["LEARNERS", "add_train_parser", "run_train"]

LEARNERS: dict[str, str] = {
    "cartpole": "an MLP policy on Gymnasium CartPole-v1, GRPO; return ~20 to >= 150",
    "text": "a character-level transformer trained from scratch, writing its guesses as text "
    "in TextArena's GuessTheNumber-v0, token-level GRPO; mean reward ~0.2 to ~0.8",
}
"""The built-in learners, by name."""

DEFAULT_STEPS = {"cartpole": 20, "text": 30}


def add_train_parser(subparsers: Any) -> None:
    """Register ``train`` on the command line's subparsers."""
    known = ", ".join(f"{name} ({what})" for name, what in LEARNERS.items())
    train = subparsers.add_parser(
        "train",
        help="train a built-in learner (PyTorch, GRPO) on the runtime; print its weights' sha256",
        description=(
            "Trains a built-in learner on Gym through the runtime, with checkpoints that hold "
            "the weights and the optimizer, and ends with 'journal sha256: HEX' (every step's "
            "groups, rows, results and policy version, chained) and 'weights sha256: HEX' (the "
            "final weights' tensors in state-dict order, as raw bytes). Run again on the same "
            f"WORKDIR to resume from its latest snapshot. Learners: {known}. Needs the train "
            "extra: pip install 'gymckpt[train]'."
        ),
    )
    train.add_argument("name", metavar="NAME", choices=list(LEARNERS), help="the learner")
    train.add_argument("workdir", metavar="WORKDIR", help="the run's work directory")
    train.add_argument("--seed", type=int, default=0, help="seed of the run (default 0)")
    train.add_argument(
        "--steps",
        type=int,
        help="training steps ("
        + ", ".join(f"{name}: {steps}" for name, steps in DEFAULT_STEPS.items())
        + ")",
    )
    train.add_argument(
        "--deterministic",
        action="store_true",
        help="same seed, same weights bit for bit (crash or not): one step's rollouts at a "
        "time, batches in dataset order, torch deterministic and single-threaded",
    )
    train.add_argument("--checkpoint-every", type=int, default=5, metavar="STEPS", help="default 5")
    train.add_argument(
        "--curve",
        metavar="FILE",
        help="write the per-step mean return to FILE (CSV) and its plot beside it (.png)",
    )
    train.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    """The ``train`` command (parsed by ``add_train_parser``); returns the exit code."""
    try:
        import torch
    except ImportError:
        print(
            "gymckpt: error: gymckpt train needs PyTorch: pip install 'gymckpt[train]'",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    import gymckpt

    from .loop import StepReport, TrainOptions, deterministic_torch, train
    from .weights import weights_sha256

    options = TrainOptions(
        name=args.name,
        seed=args.seed,
        steps=args.steps if args.steps is not None else DEFAULT_STEPS[args.name],
        deterministic=args.deterministic,
        checkpoint_every=args.checkpoint_every,
    )
    torch.set_num_threads(1)  # small models: one thread is the fastest, and kind to neighbours
    if options.deterministic:
        deterministic_torch()
    try:
        learner = _learner(options)
    except ImportError as exc:
        print(
            f"gymckpt: error: gymckpt train {options.name} needs {exc.name}: pip install "
            "'gymckpt[train]'",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT

    def progress(report: StepReport) -> None:
        print(
            f"step {report.step}/{options.steps}: mean return {report.mean_return:.1f}, "
            f"policy version {report.policy_version}",
            file=sys.stderr,
            flush=True,
        )

    workdir = Path(args.workdir)
    try:
        trained = gymckpt.run(lambda: train(learner, workdir, options, progress))
    except SystemExit as exc:  # gymckpt.run ended the run with its one line
        return int(exc.code or 0)
    if args.curve:
        from .curve import write_curve

        write_curve(
            Path(args.curve), trained.curve, f"gymckpt train {options.name} --seed {options.seed}"
        )
    print(f"journal sha256: {trained.journal_sha256}", flush=True)
    print(f"weights sha256: {weights_sha256(learner.weights())}", flush=True)
    return ExitCode.OK


def _learner(options: Any) -> Any:
    if options.name == "text":
        from .text import TextLearner

        return TextLearner(options.seed)
    from .cartpole import CartPoleLearner

    return CartPoleLearner(options.seed)
