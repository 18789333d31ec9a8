"""Gymnasium on the Gym host: state codecs, the missing-codec error, and SIGKILL at every
checkpoint stage with trajectories bit-identical to an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymckpt.app.demo.main import (  # noqa: E402
    CRASH_STAGES,
    JOURNAL,
    DemoOptions,
    _phase_cmd,
    _read_journal,
    verdict,
)
from gymckpt.gym_adapter import EnvironmentSpecError  # noqa: E402
from gymckpt.gym_adapter.environments._codecs import codec_for, decode_value  # noqa: E402
from gymckpt.gym_adapter.environments.gymnasium import (  # noqa: E402
    AttributeCodec,
    builtin_codec_names,
    gymnasium_environment,
    plain,
    random_policy,
    reference_trajectory,
    register_state_codec,
)

BUILTIN_IDS = {
    "CartPole": "CartPole-v1",
    "MountainCar": "MountainCar-v0",
    "MountainCarContinuous": "MountainCarContinuous-v0",
    "Acrobot": "Acrobot-v1",
    "Pendulum": "Pendulum-v1",
    "FrozenLake": "FrozenLake-v1",
    "Taxi": "Taxi-v4",
    "CliffWalking": "CliffWalking-v1",
    "Blackjack": "Blackjack-v1",
}


def test_every_builtin_codec_is_tested() -> None:
    assert set(builtin_codec_names()) == set(BUILTIN_IDS)


def _rollout(env: Any, actions: list[Any], *, resets: bool = False) -> list[Any]:
    """Step through ``actions``; at an episode's end stop, or with ``resets`` reset without a
    seed (the environment's own RNG draws the next start) and go on."""
    out = []
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        out.append((plain(obs), float(reward), terminated, truncated))
        if terminated or truncated:
            if not resets:
                break
            out.append(plain(env.reset()[0]))
    return out


@pytest.mark.parametrize("name", sorted(BUILTIN_IDS))
def test_codec_export_restore_continues_bit_identically(name: str) -> None:
    """Export mid-episode through JSON bytes, restore into a fresh environment: both continue
    with the same observations, rewards and terminations (the RNG state included)."""
    env_id = BUILTIN_IDS[name]
    codec = codec_for(env_id)
    assert codec is not None
    import numpy as np

    rng = np.random.default_rng(5)
    env = gymnasium.make(env_id, max_episode_steps=400)
    env.reset(seed=123)
    _rollout(env, [random_policy(None, rng, env.action_space) for _ in range(3)], resets=True)
    data = orjson.loads(orjson.dumps(codec.export(env)))  # plain JSON, nothing else
    twin = gymnasium.make(env_id, max_episode_steps=400)
    twin.reset(seed=999)  # another seed: everything must come from the exported state
    codec.restore(twin, data)
    actions = [random_policy(None, rng, env.action_space) for _ in range(60)]
    assert _rollout(twin, actions, resets=True) == _rollout(env, actions, resets=True)


@pytest.mark.parametrize("name", sorted(BUILTIN_IDS))
def test_the_participants_export_is_the_codecs_at_every_step(name: str) -> None:
    """The ``env`` participant exports through its session's ``ExportMemo`` (the generator's
    encoding reused while unchanged): at every step of a run with resets, slippery FrozenLake's
    draws included, its export equals the codec's own, and restores to the same continuation.
    Where the generator did not move, the encoding is the previous export's (not redone)."""
    from gymckpt.gym_adapter.environments.gymnasium import GymnasiumParticipant, GymSession

    env_id = BUILTIN_IDS[name]
    codec = codec_for(env_id)
    assert codec is not None
    import numpy as np

    participant = GymnasiumParticipant(env_id, codec, 400)
    env = gymnasium.make(env_id, max_episode_steps=400)
    session = GymSession(env, plain(env.reset(seed=123)[0]))
    rng = np.random.default_rng(5)
    previous, reused = None, 0
    for _ in range(40):
        data = participant.export(session)
        assert data["env"] == codec.export(env)
        if previous is not None and data["env"]["rng"] == previous["rng"]:
            reused += data["env"]["rng"] is previous["rng"]
        previous = data["env"]
        _rollout(env, [random_policy(None, rng, env.action_space)], resets=True)
    if name in ("CartPole", "MountainCar", "Acrobot", "Pendulum"):  # draw only at reset
        assert reused > 0
    data = orjson.loads(orjson.dumps(participant.export(session)))
    twin = participant.restore(data)
    actions = [random_policy(None, rng, env.action_space) for _ in range(30)]
    assert _rollout(twin.env, actions, resets=True) == _rollout(env, actions, resets=True)


def test_restore_without_the_rng_state_would_diverge() -> None:
    """The RNG is part of the state: FrozenLake (slippery) restored without it diverges."""
    fields_only = AttributeCodec(("s", "lastaction"))
    env = gymnasium.make("FrozenLake-v1")
    env.reset(seed=1)
    data = fields_only.export(env)
    twin = gymnasium.make("FrozenLake-v1")
    twin.reset(seed=2)
    for name, value in data["fields"].items():
        setattr(twin.unwrapped, name, decode_value(value))
    actions = [1, 2, 2, 1, 0, 3, 1, 2] * 5
    assert _rollout(twin, actions) != _rollout(env, actions)


@pytest.fixture
def codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's registrations (``register_state_codec``) end with it: the table is a copy."""
    from gymckpt.gym_adapter.environments import _codecs

    monkeypatch.setattr(_codecs, "_CODECS", dict(_codecs._CODECS))


@pytest.mark.usefixtures("codecs")
def test_environment_without_codec_fails_at_start_naming_the_hook() -> None:
    gymnasium.register("GymckptGuess-v0", entry_point="gymnasium.envs.toy_text:FrozenLakeEnv")
    try:
        with pytest.raises(EnvironmentSpecError, match="register_state_codec"):
            gymnasium_environment("GymckptGuess-v0")
        register_state_codec("GymckptGuess", AttributeCodec(("s", "lastaction")))
        env = gymnasium_environment("GymckptGuess-v0")
        assert [n for n, _ in env.topology] == ["agent", "env", "model_proxy"]
    finally:
        gymnasium.registry.pop("GymckptGuess-v0", None)


@pytest.mark.usefixtures("codecs")
def test_unknown_id_fails_at_start() -> None:
    register_state_codec("NoSuchEnv", AttributeCodec(()))
    with pytest.raises(EnvironmentSpecError, match="NoSuchEnv-v0"):
        gymnasium_environment("NoSuchEnv-v0")


def test_reference_is_deterministic_per_seed_row_slot() -> None:
    a = reference_trajectory("CartPole-v1", 3, 1, 2)
    assert a == reference_trajectory("CartPole-v1", 3, 1, 2)
    assert a != reference_trajectory("CartPole-v1", 3, 1, 3)
    assert len(a.observations) == len(a.actions) + 1 and (a.terminated or a.truncated)


# -- SIGKILL a trainer at every checkpoint stage ---------------------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize("stage", CRASH_STAGES)
@pytest.mark.parametrize("env", ["gymnasium:CartPole-v1", "gymnasium:FrozenLake-v1"])
def test_sigkill_at_stage_trajectories_bit_identical(tmp_path: Path, env: str, stage: str) -> None:
    opts = DemoOptions(
        env=env,
        rows=16,
        group_size=4,
        instances=2,
        seed=5,
        checkpoint_every=1,
        crash_after_checkpoint=2,
        crash_stage=stage,
        groups_per_step=2,
        max_rows_in_flight=8,
    )
    phase1 = subprocess.run(
        _phase_cmd(opts, tmp_path, 1, 2),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert phase1.returncode == -signal.SIGKILL, phase1.stderr
    phase2 = subprocess.run(
        _phase_cmd(opts, tmp_path, 2, 0),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert phase2.returncode == 0, phase2.stderr
    phases = [orjson.loads((tmp_path / "phase-2.json").read_bytes())]
    assert phases[0]["restored"] is not None
    report = verdict(opts, tmp_path, phases)
    assert report["trajectories_match"] and report["exactly_once"], report
    assert report["episodes"] == 64 and report["trajectories_mismatched"] == 0
    lineage, _ = _read_journal(tmp_path / JOURNAL)
    trained = Counter((row, slot) for s in lineage for row, slot, _ in s["episodes"])
    assert sorted(trained) == [(r, s) for r in range(16) for s in range(4)]
    assert set(trained.values()) == {1}  # every episode trained exactly once
    journal = [orjson.loads(x) for x in (tmp_path / JOURNAL).read_bytes().splitlines()]
    claims = [r["restored_from"] for r in journal if "restored_from" in r]
    assert len(claims) == len(set(claims))  # a restored episode is dispatched once


@pytest.mark.subprocess
def test_demo_json_on_gymnasium_with_faults(tmp_path: Path) -> None:
    """The fault grammar acts on the hosted Gym as on the calendar; the verdict holds."""
    import json
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--env",
            "gymnasium:CartPole-v1",
            "--rows",
            "16",
            "--json",
            "--workdir",
            str(tmp_path / "w"),
            "--fault",
            "prepare:error@1",
            "--fault",
            "run:drop@3",
            "--fault",
            "commit:delay@2:0.05",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["exactly_once"] and report["trajectories_match"], report
    assert report["episodes"] == 64 and report["checkpoints_failed"] >= 1
    assert report["killed_with_sigkill"] and report["restores"] == 1
