"""The demo's environment families (``gymckpt demo --env PREFIX:ID``): a small registry keyed by
prefix, so a family from another project is one entry here.

Interface. ``FAMILIES`` maps a prefix (``"gymnasium:"``) to an ``EnvFamily``:

- ``title``, ``extra``, ``example``: the project's name, its optional extra
  (``pip install -e '.[extra]'``; ``""`` when it needs none) and an id for the ``--env``
  help (``"CartPole-v1"``).
- ``model_latency_s``: how long the demo's model takes to answer (``slow_model``); choose it
  with the environment's own per-turn pace so that a checkpoint finds episodes in flight (the
  restore then has parked episodes to install, not only finished ones).
- ``model_server``: the demo hosts the project's offline OpenAI-compatible test server
  (``gymckpt.testing.openai_server``) for each phase, and the environment's model is
  ``openai_model`` against it (the family's ``reference`` answers as that server does).
- ``environment(env_id, work_dir) -> Environment``: the demo's environment for ``env_id``
  (``work_dir``: the Gym's work directory, where a sandbox keeps its trees), with a policy
  that plays legal moves and an ``Environment.model`` that answers from the capture key and
  request alone (a call asked again after a restore answers as the first asking did). Import
  the family's adapter inside the function: a missing extra is an ``ImportError`` there
  (reported as one line naming the extra); an id the family cannot run (unknown, no state
  codec, needs the network) is an ``EnvironmentSpecError`` with a one-line message naming the
  supported ids. The demo calls it once in the parent before any process starts (the check,
  with a temporary ``work_dir`` removed after) and once per phase to host the Gym
  (``open_demo_gym`` wraps the model with ``slow_model``), or, on ``--backend http``, once in
  each ``gymckpt serve`` process (``served_environment``).
- ``http``: the family also runs on ``--backend http``: each instance a ``gymckpt serve``
  process loading ``SERVED_FACTORY``, which builds the family's environment from what the
  trainer puts in ``SERVED_ENV`` (the id, the Gym's work directory, the model server's URL).
- ``reference(env_id, seed, row, slot) -> payload``: the episode of (row, slot) under
  deployment ``seed`` run uninterrupted with the plain library, the same value the hosted
  episode's ``Done.payload`` is (attrs records are unstructured with the project's converter
  before the digest). ``trajectory_verdict`` compares its digest with every trained one.
  For ``sandbox:`` the payload holds the final tree's manifest and its ``work.log``: a match
  means the tree is byte-identical to the uninterrupted run's, each log line once.

Every family runs on ``--backend embedded`` (its Gym is hosted in the trainer's process); a
family with ``http`` (the sandbox) also on ``--backend http``. There every server's environment
keeps its files (a sandbox's blobs and trees) in the deployment's work directory, the same one
embedded uses, which lies inside the state root the servers confine request paths to. A server
started there after a kill (the next trainer process's, or a replacement) reuses no tree the
killed one left: a restored session's tree is built from the snapshot's manifest, an episode
run again starts from the template.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs

from gymckpt.gym_adapter import (
    EmbeddedGym,
    Environment,
    EpisodeInfo,
    GymBackend,
    HostConfig,
    HttpGym,
)

from .gymnasium import (
    MAX_EPISODE_STEPS,
    MODEL_LATENCY_S,
    PACE_S,
    slow_model,
    trajectory_digest,
)

__all__ = [
    "FAMILIES",
    "SERVED_ENV",
    "SERVED_FACTORY",
    "EnvChoice",
    "EnvFamily",
    "demo_environment",
    "env_choice",
    "open_demo_gym",
    "served_environ",
    "served_environment",
    "trajectory_verdict",
]

TEXTARENA_MAX_TURNS: Final = 100
"""The demo truncates a TextArena game here (every supported game ends well before)."""
TEXTARENA_PACE_S: Final = 0.01
TEXTARENA_MODEL_LATENCY_S: Final = 0.02
"""A TextArena game is a few moves, each an LLM's answer in real use: the demo's turns take
this long (the policy's answer, then the pause before the move), so a checkpoint finds games
in flight, to be restored, rather than every game already over."""


@attrs.frozen
class EnvFamily:
    """One family of ``--env PREFIX:ID`` (see the module docstring for the contract)."""

    prefix: str
    title: str
    extra: str
    example: str
    environment: Callable[[str, Path], Environment]
    reference: Callable[[str, int, int, int], Any]
    model_latency_s: float = MODEL_LATENCY_S
    model_server: bool = False
    http: bool = False


def _gymnasium_environment(env_id: str, work_dir: Path) -> Environment:
    from gymckpt.gym_adapter.environments.gymnasium import gymnasium_environment

    return gymnasium_environment(env_id, pace_s=PACE_S, max_episode_steps=MAX_EPISODE_STEPS)


def _gymnasium_reference(env_id: str, seed: int, row: int, slot: int) -> Any:
    from gymckpt.gym_adapter.environments.gymnasium import reference_trajectory

    return reference_trajectory(env_id, seed, row, slot, max_episode_steps=MAX_EPISODE_STEPS)


def _textarena_environment(env_id: str, work_dir: Path) -> Environment:
    from gymckpt.gym_adapter.environments.textarena import textarena_environment

    return textarena_environment(env_id, pace_s=TEXTARENA_PACE_S, max_turns=TEXTARENA_MAX_TURNS)


def _textarena_reference(env_id: str, seed: int, row: int, slot: int) -> Any:
    from gymckpt.gym_adapter.environments.textarena import reference_trajectory

    return reference_trajectory(env_id, seed, row, slot, max_turns=TEXTARENA_MAX_TURNS)


OPENSPIEL_MAX_TURNS: Final = 200
"""The demo truncates an OpenSpiel game after this many decisions (random chess runs longer)."""
OPENSPIEL_PACE_S: Final = 0.003
OPENSPIEL_MODEL_LATENCY_S: Final = 0.005
"""Short games (Kuhn and Leduc poker are a handful of decisions) would all be over by the first
checkpoint at the Gymnasium demo's 1 ms turns: at these, a checkpoint finds them in flight."""


def _openspiel_environment(env_id: str, work_dir: Path) -> Environment:
    from gymckpt.gym_adapter.environments.openspiel import openspiel_environment

    return openspiel_environment(env_id, pace_s=OPENSPIEL_PACE_S, max_turns=OPENSPIEL_MAX_TURNS)


def _openspiel_reference(env_id: str, seed: int, row: int, slot: int) -> Any:
    from gymckpt.gym_adapter.environments.openspiel import reference_trajectory

    return reference_trajectory(env_id, seed, row, slot, max_turns=OPENSPIEL_MAX_TURNS)


SANDBOX_MODEL_LATENCY_S: Final = 0.1
"""A coding turn runs the project's tests (a Python process, tens of ms) after the model's
answer: at this latency a checkpoint finds turns awaiting the model as well as in a command."""


def _sandbox_environment(env_id: str, work_dir: Path) -> Environment:
    from gymckpt.gym_adapter.environments.coding import coding_environment

    return coding_environment(env_id, work_dir)


def _sandbox_reference(env_id: str, seed: int, row: int, slot: int) -> Any:
    from gymckpt.gym_adapter.environments.coding import reference_result
    from gymckpt.testing.openai_server import DEFAULT_MODEL, chat_completion

    # the test server's answer is this function of the request: the uninterrupted run asks it
    return reference_result(
        env_id, seed, row, slot, lambda request: chat_completion(request, DEFAULT_MODEL)
    )


FAMILIES: Final[dict[str, EnvFamily]] = {
    f.prefix: f
    for f in (
        EnvFamily(
            "gymnasium:",
            "Gymnasium",
            "gymnasium",
            "CartPole-v1",
            _gymnasium_environment,
            _gymnasium_reference,
        ),
        EnvFamily(
            "textarena:",
            "TextArena",
            "textarena",
            "TicTacToe-v0",
            _textarena_environment,
            _textarena_reference,
            TEXTARENA_MODEL_LATENCY_S,
        ),
        EnvFamily(
            "openspiel:",
            "OpenSpiel",
            "openspiel",
            "connect_four",
            _openspiel_environment,
            _openspiel_reference,
            OPENSPIEL_MODEL_LATENCY_S,
        ),
        EnvFamily(
            "sandbox:",
            "the sandbox",
            "",
            "coding",
            _sandbox_environment,
            _sandbox_reference,
            SANDBOX_MODEL_LATENCY_S,
            model_server=True,
            http=True,
        ),
    )
}


@attrs.frozen
class EnvChoice:
    """``--env PREFIX:ID`` parsed: the family and the id within it."""

    family: EnvFamily
    env_id: str

    @property
    def label(self) -> str:
        return f"{self.family.prefix}{self.env_id}"


def env_choice(env: str) -> EnvChoice | None:
    """The family and id of ``--env PREFIX:ID``, None for the calendar; ValueError else."""
    if env == "calendar":
        return None
    for prefix, family in FAMILIES.items():
        if env.startswith(prefix) and len(env) > len(prefix):
            return EnvChoice(family, env[len(prefix) :])
    ids = " or ".join(f"{p}ID" for p in FAMILIES)
    raise ValueError(f"--env must be calendar or {ids}, got {env!r}")


def demo_environment(
    choice: EnvChoice, work_dir: Path, model: Callable[[str, Any, EpisodeInfo], Any] | None = None
) -> Environment:
    """The family's environment for the id (its files under ``work_dir``), its model
    (``model`` when given, else the family's own) answering after the family's
    ``model_latency_s``."""
    env = choice.family.environment(choice.env_id, work_dir)
    if model is not None:
        env = attrs.evolve(env, model=model)
    assert env.model is not None
    return attrs.evolve(env, model=slow_model(env.model, choice.family.model_latency_s))


@asynccontextmanager
async def open_demo_gym(
    choice: EnvChoice,
    instances: int,
    seed: int,
    work_dir: Path,
    faults: Sequence[str],
    lease_s: float,
    *,
    backend: str = "embedded",
    state_root: Path | None = None,
) -> AsyncIterator[GymBackend]:
    """The family's Gym (``demo_environment``, through the offline test server when
    ``model_server``): hosted in this process, or on ``backend`` ``"http"`` served by
    ``instances`` spawned ``gymckpt serve`` processes (loopback, one bearer token, request
    paths confined to ``state_root``) that load ``SERVED_FACTORY``. The test server, a child
    of this process, lives as long as the Gym: a replaced server asks the same one."""
    async with AsyncExitStack() as stack:
        server = None
        if choice.family.model_server:
            from gymckpt.testing.openai_server import open_openai_test_server

            # loopback, no network; it exits with this process, a SIGKILLed phase's included
            server = await stack.enter_async_context(open_openai_test_server())
        config = HostConfig(lease_s=lease_s)
        if backend == "http":
            # the family's files (a sandbox's template) written once, here, before any server
            # reads them: servers starting at once never write one file together
            choice.family.environment(choice.env_id, work_dir)
            environ = served_environ(
                choice,
                work_dir,
                server.base_url if server else None,
                server.model if server else None,
            )
            gym: GymBackend = await stack.enter_async_context(
                HttpGym.spawn(
                    SERVED_FACTORY,
                    instances,
                    work_dir=work_dir,
                    config=config,
                    faults=faults,
                    seed=seed,
                    state_root=state_root,
                    environ=environ,
                )
            )
        else:
            model = _openai_model(server.base_url, server.model) if server else None
            env = demo_environment(choice, work_dir, model)
            gym = await stack.enter_async_context(
                EmbeddedGym.host(
                    env,
                    instances=instances,
                    seed=seed,
                    work_dir=work_dir,
                    config=config,
                    faults=faults,
                )
            )
        yield gym


def _openai_model(base_url: str, model: str) -> Callable[[str, Any, EpisodeInfo], Any]:
    from gymckpt.gym_adapter.environments.openai_model import openai_model

    return openai_model(base_url=base_url, model=model)


SERVED_ENV: Final = "GYMCKPT_DEMO_ENV"
"""The environment variable a ``gymckpt serve`` process of the demo reads its environment from
(JSON: ``env``, ``work_dir``, ``model_url``, ``model``; written by ``served_environ``)."""
SERVED_FACTORY: Final = f"{__name__}:served_environment"
"""The import path every ``gymckpt serve`` process of ``--backend http`` loads."""
_SERVED_KEYS: Final = frozenset({"env", "work_dir", "model_url", "model"})


def served_environ(
    choice: EnvChoice, work_dir: Path, model_url: str | None, model: str | None
) -> dict[str, str]:
    """What ``served_environment`` reads: ``SERVED_ENV`` naming the family and id, the Gym's
    work directory (absolute: a server may run elsewhere) and the model server, if any."""
    config = {
        "env": choice.label,
        "work_dir": str(Path(work_dir).resolve()),
        "model_url": model_url,
        "model": model,
    }
    return {SERVED_ENV: json.dumps(config, sort_keys=True)}


def served_environment() -> Environment:
    """``demo_environment`` of the family and id ``SERVED_ENV`` names, its files under the
    work directory named there, its model ``openai_model`` against the named server (the
    family's own without one): the factory a demo's ``gymckpt serve`` loads. A missing or
    malformed ``SERVED_ENV``, or a family that does not run over HTTP, is a ``ValueError``
    naming it (``gymckpt serve`` exits 2 with it)."""
    text = os.environ.get(SERVED_ENV)
    if text is None:
        raise ValueError(f"{SERVED_ENV} is not set: gymckpt demo --backend http sets it")
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{SERVED_ENV} is not JSON: {exc}") from None
    if not isinstance(config, dict) or set(config) != _SERVED_KEYS:
        raise ValueError(f"{SERVED_ENV} must be an object with keys {sorted(_SERVED_KEYS)}")
    choice = env_choice(config["env"])
    if choice is None or not choice.family.http:
        raise ValueError(f"{SERVED_ENV}: --env {config['env']} does not run on --backend http")
    model = None
    if config["model_url"] is not None:
        model = _openai_model(config["model_url"], config["model"])
    return demo_environment(choice, Path(config["work_dir"]), model)


def trajectory_verdict(
    choice: EnvChoice, seed: int, lineage: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """``episodes`` trained in the lineage and whether each equals its uninterrupted run."""
    got: dict[tuple[int, int], list[str]] = {}
    for step in lineage:
        for row, slot, digest in step.get("episodes", ()):
            got.setdefault((row, slot), []).append(digest)
    mismatched = 0
    for (row, slot), digests in got.items():
        ref = trajectory_digest(
            _plain_trajectory(choice.family.reference(choice.env_id, seed, row, slot))
        )
        mismatched += sum(1 for d in digests if d != ref)
    return {
        "env": choice.label,
        "episodes": sum(len(d) for d in got.values()),
        "trajectories_mismatched": mismatched,
        "trajectories_match": bool(got) and mismatched == 0,
    }


def _plain_trajectory(traj: Any) -> Any:
    from gymckpt.runtime._shared import converter

    return converter.unstructure(traj)
