"""TextArena games (``gym_adapter.environments.textarena``): the replay codec restores a session
bit-identically in another session, sessions' ``random`` states never mix, an id that cannot
run fails in one line, and the demo survives a SIGKILL with identical trajectories."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest

pytest.importorskip("textarena")

from gymckpt.app.cli import main as cli_main
from gymckpt.gym_adapter import EnvironmentSpecError
from gymckpt.gym_adapter.environments.textarena import (
    TextArenaParticipant,
    TextArenaSession,
    random_legal_policy,
    reference_trajectory,
    supported_games,
    textarena_environment,
)

GAMES = supported_games()


def _play(session: TextArenaSession, moves: int, seed: int) -> list[tuple[int, str, str]]:
    """``moves`` moves of the random legal policy: (player, observation, move) each."""
    rng = random.Random(seed)
    out = []
    for _ in range(moves):
        if session.done:
            break
        move = random_legal_policy(session.observation, session.legal_moves(), rng)
        out.append((session.player, session.observation, move))
        session.step(move)
    return out


@pytest.mark.parametrize("game", GAMES)
def test_an_exported_session_restored_elsewhere_continues_bit_identically(game: str) -> None:
    env = TextArenaParticipant(game)
    original = TextArenaSession.start(game, 1234)
    _play(original, 3, seed=5)
    data = orjson.loads(orjson.dumps(env.export(original)))  # through JSON
    restored = env.restore(data)
    assert restored.digest() == original.digest()
    assert _play(restored, 100, seed=6) == _play(original, 100, seed=6)
    assert (restored.done, restored.rewards) == (original.done, original.rewards)
    assert restored.rng == original.rng


def test_a_replay_that_does_not_reach_the_exported_state_fails_closed() -> None:
    env = TextArenaParticipant("KuhnPoker-v0")
    session = TextArenaSession.start("KuhnPoker-v0", 7)
    _play(session, 2, seed=1)
    data = env.export(session)
    with pytest.raises(ValueError, match="not a function of its seed and moves"):
        env.restore({**data, "seed": data["seed"] + 1})  # other cards dealt


def test_interleaved_sessions_draw_what_sequential_ones_do() -> None:
    game = "KuhnPoker-v0"  # deals with random.shuffle on every round
    alone = []
    for seed in (1, 2):
        s = TextArenaSession.start(game, seed)
        alone.append(_play(s, 100, seed=seed))
    a, b = TextArenaSession.start(game, 1), TextArenaSession.start(game, 2)
    ra, rb = random.Random(1), random.Random(2)
    got: list[list[tuple[int, str, str]]] = [[], []]
    random.seed(99)
    process_state = random.getstate()
    while not (a.done and b.done):
        for i, (s, rng) in enumerate(((a, ra), (b, rb))):
            if not s.done:
                move = random_legal_policy(s.observation, s.legal_moves(), rng)
                got[i].append((s.player, s.observation, move))
                s.step(move)
    assert got == alone
    assert random.getstate() == process_state  # the process's own random untouched


@pytest.mark.parametrize(
    ("env_id", "says"),
    [
        ("NoSuchGame-v0", "no such TextArena game"),
        ("Wordle-v0", "downloads NLTK data"),
        ("Chess-v0", "has no legal-move function"),
    ],
)
def test_an_id_that_cannot_run_fails_in_one_line_naming_the_supported(
    env_id: str, says: str
) -> None:
    with pytest.raises(EnvironmentSpecError) as caught:
        textarena_environment(env_id)
    line = str(caught.value)
    assert says in line and "\n" not in line
    assert all(game in line for game in GAMES)


def test_the_demo_on_an_unsupported_id_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["demo", "--env", "textarena:Wordle-v0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gymckpt: error: {_spec_error('Wordle-v0')}"]


def _spec_error(env_id: str) -> str:
    with pytest.raises(EnvironmentSpecError) as caught:
        textarena_environment(env_id)
    return str(caught.value)


def test_the_reference_run_leaves_the_process_random_alone() -> None:
    random.seed(3)
    before = random.getstate()
    traj = reference_trajectory("GuessTheNumber-v0", 0, 1, 2)
    assert random.getstate() == before
    assert len(traj.actions) == len(traj.observations) == len(traj.players) >= 1
    assert traj.rewards and traj.reason


@pytest.mark.subprocess
def test_demo_sigkill_and_restore_on_textarena(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's phases are processes: phase 1 is SIGKILLed after its first checkpoint."""
    argv = ["demo", "--env", "textarena:ConnectFour-v0", "--rows", "16"]
    argv += ["--crash-after-checkpoint", "1", "--checkpoint-mode", "unaligned", "--json"]
    assert cli_main([*argv, "--workdir", str(tmp_path / "w")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exactly_once"] and report["trajectories_match"], report
    assert report["killed_with_sigkill"] and report["restores"] == 1
    assert report["episodes"] == 64 and report["env"] == "textarena:ConnectFour-v0"
    restored = orjson.loads((tmp_path / "w" / "phase-2.json").read_bytes())["restored"]
    assert restored["restored"] >= 1, restored  # games in flight were parked and replayed
