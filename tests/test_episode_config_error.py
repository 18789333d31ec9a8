"""A configuration wrong for every row stops the run at the first episode that meets it
(``EpisodeConfigError`` in the episode, ``Failed(..., "config", ...)`` from Gym,
``EpisodeConfigFailed`` on the trainer, exit code 2): no second row is dispatched into the same
failure, no row is failed for it, and a rerun after fixing the configuration trains every row
once. The error is public (``gym_adapter.EpisodeConfigError``): a user's environment raises it
as the model client does (``ModelServerIncompatible``, ``ModelResponseIncomplete``).

Embedded, under trio's autojump clock; the same record crosses the HTTP wire (``gymckpt:config``)
and Ray's JSON wire (the contract's ``Failed``), round-tripped here. The real processes (a model
server answering 422, a real run that makes one model call) are in
``tests/test_model_weight_sync.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from plain_state import PlainState

from gymckpt.gym_adapter import (
    Done,
    EmbeddedGym,
    Environment,
    EpisodeConfigError,
    EpisodeInfo,
    Failed,
    ModelUnavailable,
)
from gymckpt.gym_adapter.environments.openai_model import (
    ModelResponseIncomplete,
    ModelServerIncompatible,
)
from gymckpt.gym_adapter.host._turns import failure_class_of
from gymckpt.gym_adapter.transports import _wire as json_wire
from gymckpt.gym_adapter.transports.http import _wire as http_wire
from gymckpt.nurseries import ExitCode, open_rollouts
from gymckpt.nurseries._run import leaf_errors, run_exit
from gymckpt.runtime import EpisodeConfigFailed

ROWS = 6


@attrs.define
class Agent(PlainState):
    """One turn per episode; ``broken``: the turn raises ``EpisodeConfigError`` (a user's
    environment finding its configuration wrong); ``open_broken``: opening the session does."""

    broken: bool = True
    open_broken: bool = False
    steps: list[int] = attrs.field(factory=list)
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> Any:
        if self.open_broken:
            raise EpisodeConfigError("the agent's prompt template names no such file")
        return {}

    async def step(self, ctx: Any, state: Any) -> Done | None:
        self.steps.append(ctx.info.row)
        await trio.sleep(1.0)
        if self.broken:
            raise EpisodeConfigError("tool server at http://tools refuses field 'x': drop it")
        return Done(reward=1.0, payload={"row": ctx.info.row})


async def _train(agent: Agent, tmp_path: Path) -> list[int]:
    async with (
        EmbeddedGym.host(Environment(agent=agent), instances=1, work_dir=tmp_path / "gym") as gym,
        open_rollouts(
            gym,
            tmp_path / "work",
            rows=ROWS,
            group_size=1,
            max_rows_in_flight=1,
            handle_signals=False,
        ) as ro,
    ):
        trained = []
        async for batch in ro.batches(1):
            trained += [r.payload["row"] for g in batch for r in g.results]
            assert (await ro.checkpoint()).ok
        return trained


@pytest.mark.parametrize("where", ["step", "open"])
async def test_the_first_config_failure_stops_the_run_and_fails_no_row(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, where: str
) -> None:
    broken = Agent(open_broken=where == "open")
    with pytest.RaisesGroup(
        EpisodeConfigFailed, flatten_subgroups=True, allow_unwrapped=True
    ) as caught:
        await _train(broken, tmp_path)
    assert len(broken.steps) == (1 if where == "step" else 0)  # no second row dispatched
    (error,) = leaf_errors(caught.value)  # alone: nothing else failed with it
    assert isinstance(error, EpisodeConfigFailed)
    wanted = "refuses field 'x'" if where == "step" else "names no such file"
    assert wanted in str(error) and "no row was failed" in str(error)
    assert run_exit(caught.value) == (ExitCode.BAD_INPUT, error)
    fixed = Agent(broken=False)
    assert sorted(await _train(fixed, tmp_path)) == list(range(ROWS))  # every row, once
    assert sorted(fixed.steps) == list(range(ROWS))


def test_config_wins_over_whatever_failed_beside_it() -> None:
    """Calls made at once in a nursery: a config error among model outages is config (the
    configuration is wrong whether or not the server is up); outages alone are infra."""
    config = EpisodeConfigError("wrong")
    down = ModelUnavailable("down")
    assert failure_class_of(ExceptionGroup("g", [down, config])) == ("config", config)
    assert failure_class_of(ExceptionGroup("g", [down, down]))[0] == "infra"
    assert failure_class_of(ValueError("bad row"))[0] == "data"
    for error in (
        ModelServerIncompatible("422", 422, "m"),
        ModelResponseIncomplete("no logprobs"),
    ):
        assert failure_class_of(error) == ("config", error)
        assert isinstance(error, ValueError)  # and still what they were


def test_a_config_failure_crosses_both_wires_as_itself() -> None:
    reply = Failed("3-0", "config", "server refuses return_token_ids")
    assert json_wire.decode(json_wire.encode(reply), Failed) == reply  # Ray's wire
    raw = http_wire._reply_to_wire(reply, 3)
    assert raw["failure"]["failure_kind"] == http_wire.KIND_CONFIG == "gymckpt:config"
    assert raw["failure"]["terminal"] is True and raw["failure"]["stage"] == "agent"
    assert http_wire._reply_from_raw(raw) == reply


def test_the_run_ending_line_names_the_episode_once() -> None:
    """Gym's message names the episode already (the host's label); another producer's may
    not, and then the line says where it was met."""
    ours = EpisodeConfigFailed("3-0", "gym-1", "episode 3-0 (row 3 slot 0) on gym-1: bad")
    assert str(ours).startswith("episode 3-0 (row 3 slot 0) on gym-1: bad; the configuration")
    theirs = EpisodeConfigFailed("3-0", "gym-1", "no such tool")
    assert str(theirs).startswith("episode 3-0 on gym-1: no such tool; the configuration")
