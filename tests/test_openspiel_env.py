"""OpenSpiel on the Gym host (``gym_adapter.environments.openspiel``): hosted self-play
episodes equal
their uninterrupted pyspiel runs; a session exported mid-game through JSON bytes and restored
in another session continues bit-identically (chance nodes, simultaneous nodes included); the
chance RNG is per (seed, row, slot) and part of the export; the policy's answer is checked; a
game that cannot be hosted fails at start with one line. The SIGKILL demo runs are in
``test_demo_openspiel``."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

pyspiel = pytest.importorskip("pyspiel")

from gymckpt.gym_adapter import (  # noqa: E402
    Completed,
    EmbeddedGym,
    EnvironmentSpecError,
    EpisodeInfo,
    Failed,
    RunRow,
)
from gymckpt.gym_adapter.environments.openspiel import (  # noqa: E402
    OpenSpielParticipant,
    episode_rng,
    openspiel_environment,
    reference_trajectory,
)
from gymckpt.runtime._shared import converter  # noqa: E402

# deterministic, explicit chance at the start (cards), chance mid-game (leduc's public card,
# backgammon's and pig's dice every turn), simultaneous moves (goofspiel)
GAMES = ["tic_tac_toe", "connect_four", "kuhn_poker", "leduc_poker", "backgammon", "goofspiel"]
MAX_TURNS = 60


@attrs.define
class Ctx:
    """The two things ``OpenSpielAgent.step`` uses of its context: the env session and the
    model (called directly; the host's capture is exercised by the hosted tests)."""

    info: EpisodeInfo
    sessions: dict[str, Any]
    model_fn: Any

    def session(self, name: str) -> Any:
        return self.sessions[name]

    async def model(self, request: Any) -> Any:
        return self.model_fn("", orjson.loads(orjson.dumps(request)), self.info)


async def play(env: Any, ctx: Ctx, agent_state: Any, turns: int | None = None) -> Any:
    """Run ``env``'s agent for ``turns`` turns (None: to the end); its Done or None."""
    n = 0
    while turns is None or n < turns:
        done = await env.agent.step(ctx, agent_state)
        n += 1
        if done is not None:
            return done
    return None


def info(row: int, slot: int, seed: int = 7) -> EpisodeInfo:
    return EpisodeInfo(f"{row}-{slot}", row, slot, 0, seed, "")


def open_episode(env: Any, inf: EpisodeInfo) -> tuple[Ctx, Any]:
    (participant,) = env.participants
    ctx = Ctx(inf, {"env": participant.open(inf)}, env.model)
    return ctx, env.agent.open(inf)


def through_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


@pytest.mark.parametrize("game", GAMES)
async def test_export_restore_in_another_session_continues_bit_identically(game: str) -> None:
    env = openspiel_environment(game, max_turns=MAX_TURNS)
    inf = info(3, 1)
    ctx, traj = open_episode(env, inf)
    assert await play(env, ctx, traj, turns=1) is None
    (participant,) = env.participants
    session_data = through_json(participant.export(ctx.sessions["env"]))
    agent_data = through_json(env.agent.export(traj))
    # another environment object (a new process would build the same): nothing shared
    twin = openspiel_environment(game, max_turns=MAX_TURNS)
    (twin_participant,) = twin.participants
    twin_ctx = Ctx(inf, {"env": twin_participant.restore(session_data)}, twin.model)
    assert through_json(twin_participant.export(twin_ctx.sessions["env"])) == session_data
    twin_traj = twin.agent.restore(agent_data)
    done = await play(env, ctx, traj)
    twin_done = await play(twin, twin_ctx, twin_traj)
    assert done is not None and twin_done is not None
    original = converter.unstructure(done.payload)
    assert converter.unstructure(twin_done.payload) == original
    assert twin_done.reward == done.reward
    ref = reference_trajectory(game, 7, 3, 1, max_turns=MAX_TURNS)
    assert original == converter.unstructure(ref)
    assert original["turns"] > 1 and len(original["actions"]) == len(original["observations"])


async def test_chance_outcomes_come_from_the_sessions_rng_which_is_exported() -> None:
    """Backgammon rolls dice every turn: a restore with the state but a fresh RNG (another
    episode's) diverges; with the exported RNG it does not (the test above)."""
    env = openspiel_environment("backgammon", max_turns=MAX_TURNS)
    inf = info(0, 0)
    ctx, traj = open_episode(env, inf)
    await play(env, ctx, traj, turns=3)
    (participant,) = env.participants
    data = through_json(participant.export(ctx.sessions["env"]))
    assert set(data) == {"game", "state", "rng"} and data["game"] == "backgammon()"
    state_only = participant.restore(data)
    state_only.rng = episode_rng(7, 0, 1)
    agent_data = through_json(env.agent.export(traj))
    twin_ctx = Ctx(inf, {"env": state_only}, env.model)
    done = await play(env, ctx, traj)
    twin_done = await play(env, twin_ctx, env.agent.restore(agent_data))
    assert done is not None and twin_done is not None
    assert done.payload.history != twin_done.payload.history


def test_chance_is_deterministic_per_seed_row_slot() -> None:
    deals = {
        (seed, row, slot): reference_trajectory("leduc_poker", seed, row, slot).history[:2]
        for seed in (1, 2)
        for row in range(4)
        for slot in range(2)
    }
    for (seed, row, slot), deal in deals.items():
        assert reference_trajectory("leduc_poker", seed, row, slot).history[:2] == deal
    assert len(set(map(tuple, deals.values()))) > 4  # the dealt cards vary with the episode


def run_rows(n_rows: int, group: int) -> list[RunRow]:
    return [RunRow(f"{r}-{s}", r, s, 0) for r in range(n_rows) for s in range(group)]


@pytest.mark.parametrize("game", ["connect_four", "leduc_poker", "goofspiel"])
async def test_hosted_episodes_equal_their_uninterrupted_runs(
    autojump_clock: trio.testing.MockClock, game: str
) -> None:
    env = openspiel_environment(game, pace_s=0.01, max_turns=MAX_TURNS)
    async with EmbeddedGym.host(env, instances=1, seed=11) as gym:
        stream = await gym.run("gym-0", run_rows(3, 2))
        replies = [r async for batch in stream for r in batch]
    assert len(replies) == 6 and all(isinstance(r, Completed) for r in replies), replies
    for reply in replies:
        assert isinstance(reply, Completed)
        row, slot = map(int, reply.rollout_id.split("-"))
        ref = reference_trajectory(game, 11, row, slot, max_turns=MAX_TURNS)
        assert reply.payload == converter.unstructure(ref)
        assert reply.turns == ref.turns and reply.reward == ref.returns[0]


@pytest.mark.parametrize(
    ("answer", "message"),
    [(-1, "not a legal action"), ("3", "not an action"), (True, "not an action")],
)
async def test_an_answer_that_is_not_a_legal_action_fails_the_episode_as_data(
    autojump_clock: trio.testing.MockClock, answer: Any, message: str
) -> None:
    env = openspiel_environment("tic_tac_toe", policy=lambda obs, legal, rng: answer)
    async with EmbeddedGym.host(env, instances=1) as gym:
        stream = await gym.run("gym-0", run_rows(1, 1))
        (reply,) = [r async for batch in stream for r in batch]
    assert isinstance(reply, Failed) and reply.failure_class == "data", reply
    assert message in reply.message and "turn 0, player 0" in reply.message


def test_a_session_of_another_game_is_refused_naming_both() -> None:
    (participant,) = openspiel_environment("tic_tac_toe").participants
    (other,) = openspiel_environment("connect_four").participants
    data = through_json(other.export(other.open(info(0, 0))))
    with pytest.raises(ValueError, match=r"'connect_four\(\)'.*'tic_tac_toe\(\)'"):
        participant.restore(data)
    assert isinstance(participant, OpenSpielParticipant)


@pytest.mark.parametrize(
    ("game", "message"),
    [
        ("no_such_game", "no such OpenSpiel game 'no_such_game'"),
        ("nim(pile_sizes=1;x)", "does not load: Could not parse size 'x'"),
        ("misere", "does not load: Missing parameter game"),
        ("tarok", "samples its chance events itself"),  # its deserialize_state crashes
        ("negotiation", "samples its chance events itself"),
        ("mfg_garnet", "mean_field dynamics"),
        ("crossword", "cannot be checkpointed"),
    ],
)
def test_a_game_that_cannot_be_hosted_fails_at_start_with_one_line(
    capfd: pytest.CaptureFixture[str], game: str, message: str
) -> None:
    with pytest.raises(EnvironmentSpecError) as caught:
        openspiel_environment(game)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    # pyspiel's C++ side prints what it raises (the whole list of games for an unknown one)
    # to descriptor 2: the check keeps it quiet, its one line is the report
    assert capfd.readouterr().err == ""


def test_max_turns_truncates_and_is_checked() -> None:
    ref = reference_trajectory("chess", 1, 0, 0, max_turns=5)
    assert ref.turns == 5 and ref.truncated and not ref.terminal and len(ref.history) == 5
    with pytest.raises(ValueError, match="max_turns"):
        openspiel_environment("chess", max_turns=0)
