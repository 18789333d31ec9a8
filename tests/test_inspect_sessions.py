"""Reading an instance's retained sessions: live (``retained_sessions(instance)`` of a
deployment, plain data per slot) and offline from a snapshot (``gymckpt inspect DIR``), the
same mapping both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.gym_adapter import (
    Done,
    EmbeddedGym,
    Environment,
    EnvironmentRef,
    EpisodeContext,
    EpisodeInfo,
    GymHost,
    RetainedSession,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_sessions_of,
    sentinel,
)
from gymckpt.nurseries import open_rollouts
from gymckpt.testing.examples import guess_the_number

CONFIG = CalendarConfig(turns=(2, 3), turn_s=(0.01, 0.05), mutation_p=1.0)


@attrs.define
class _Tally:  # a live state that is not plain data: exported as a dict
    seen: list[int] = attrs.field(factory=list)


class Ledger:
    """A retained participant whose live state is an object; ``export`` makes it plain."""

    name, kind, retained = "ledger", "environment", True

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def open(self, info: EpisodeInfo) -> _Tally:
        return _Tally()

    def export(self, state: _Tally) -> Any:
        if self.broken and state.seen:
            raise RuntimeError("cannot export")
        return {"seen": list(state.seen)}

    def restore(self, data: Any) -> _Tally:
        return _Tally(list(data["seen"]))


class Writer:
    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        ctx.session("ledger").seen.append(ctx.info.row * 10 + ctx.turn)
        return Done(reward=1.0) if ctx.turn == 1 else None


async def _run_all(host: GymHost, rows: list[RunRow]) -> None:
    stream = await host.run(rows)
    async for _ in stream:
        pass


async def test_live_retained_sessions_are_plain_data_per_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Environment(agent=Writer(), participants=(Ledger(),))
    async with GymHost("gym-0", env) as host:
        await _run_all(host, [RunRow(f"{r}-0", r, 0, 0) for r in range(3)])
        got = host.retained_sessions()
    assert got == {
        "ledger": {
            f"{r}-0": RetainedSession(f"{r}-0", f"{r}-0", 0, {"seen": [r * 10, r * 10 + 1]})
            for r in range(3)
        }
    }
    json.dumps({k: attrs.asdict(v) for k, v in got["ledger"].items()})  # plain JSON
    assert not isinstance(got["ledger"]["0-0"].state, _Tally)


async def test_an_export_that_raises_names_the_participant_and_the_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Environment(agent=Writer(), participants=(Ledger(broken=True),))
    async with GymHost("gym-0", env) as host:
        await _run_all(host, [RunRow("4-0", 4, 0, 0)])
        with pytest.raises(ValueError, match=r"participant ledger .* slot 4-0"):
            host.retained_sessions()


async def test_an_environment_without_retained_participants_has_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with EmbeddedGym.host(guess_the_number()) as gym:
        assert await gym.retained_sessions("gym-0") == {}


async def _checkpointed_run(workdir: Path, gym_dir: Path) -> dict[str, Any]:
    """Train every row, then checkpoint with nothing running: the live retained sessions
    (instance -> participant -> slot -> dict) at that checkpoint."""
    async with EmbeddedGym.host(
        calendar_environment(config=CONFIG),
        instances=2,
        seed=3,
        work_dir=gym_dir,
        config=CONFIG.host_config(),
    ) as gym:
        async with open_rollouts(gym, workdir, rows=6, group_size=2) as ro:
            async for _batch in ro.batches(groups_per_step=2):
                pass
            outcome = await ro.checkpoint(b"{}")
            assert outcome.ok
            live = {}
            for name in gym.instances:
                live[name] = {
                    participant: {
                        k: {"rollout_id": s.rollout_id, "attempt": s.attempt, "state": s.state}
                        for k, s in slots.items()
                    }
                    for participant, slots in (await gym.retained_sessions(name)).items()
                }
            calendar = {n: await calendar_sessions_of(gym, n) for n in gym.instances}
    # the same sentinels the calendar's own view reports
    for name, sessions in calendar.items():
        assert {
            k: [e["sentinel"] for e in v["state"]["events"]]
            for k, v in live[name]["calendar"].items()
        } == {k: list(s.sentinels) for k, s in sessions.items()}
    return live


async def test_inspect_shows_the_retained_sessions_a_snapshot_committed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = await _checkpointed_run(tmp_path / "work", tmp_path / "gym")
    slots = sum(len(p["calendar"]) for p in live.values())
    assert slots == 12  # 6 rows x 2 slots, each kept after its episode ended
    assert cli_main(["inspect", str(tmp_path / "work"), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)["retained"]
    assert offline == {name: parts for name, parts in live.items() if parts["calendar"]}
    some = next(iter(offline.values()))["calendar"]
    key, sess = next(iter(some.items()))
    row, slot = map(int, key.split("-"))
    assert sentinel(row, slot, 0) in [e["sentinel"] for e in sess["state"]["events"]]

    assert cli_main(["inspect", str(tmp_path / "work")]) == 0
    text = capsys.readouterr().out
    for name, parts in offline.items():
        assert f"retained {name}/calendar: {len(parts['calendar'])} slot(s)" in text
    assert f"    {key}: {sess['rollout_id']} (attempt {sess['attempt']}) " in text


def test_inspect_says_when_nothing_is_retained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def run() -> None:
        async with EmbeddedGym.host(guess_the_number()) as gym:
            async with open_rollouts(gym, tmp_path / "work", rows=2, group_size=1) as ro:
                async for _batch in ro.batches(groups_per_step=1):
                    pass
                assert (await ro.checkpoint()).ok

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert cli_main(["inspect", str(tmp_path / "work"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["retained"] == {}
    assert cli_main(["inspect", str(tmp_path / "work")]) == 0
    assert "retained sessions: none" in capsys.readouterr().out


def test_inspect_names_an_unreadable_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(
        _checkpointed_run,
        tmp_path / "work",
        tmp_path / "gym",
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    record = next((tmp_path / "work" / "snapshots").glob("*/gym/gym-0/calendar/records.json"))
    record.write_text("{not json")
    assert cli_main(["inspect", str(tmp_path / "work")]) == 2
    assert "records unreadable" in capsys.readouterr().err


@pytest.mark.ray
async def test_ray_retained_sessions_cross_as_plain_data(tmp_path: Path) -> None:
    from gymckpt.gym_adapter import RayGym  # Ray only when the ray case runs

    async with RayGym.host(
        EnvironmentRef.to(calendar_environment, config=CONFIG),
        work_dir=tmp_path,
        seed=5,
        instances=1,
        config=CONFIG.host_config(),
    ) as gym:
        stream = await gym.run("gym-0", [RunRow(f"{r}-0", r, 0, 0) for r in range(2)])
        async for _ in stream:
            pass
        await stream.aclose()
        got = await gym.retained_sessions("gym-0")
    assert sorted(got["calendar"]) == ["0-0", "1-0"]
    assert all(isinstance(s.state, dict) and "events" in s.state for s in got["calendar"].values())
