"""Boundary marks (``gym_adapter.host._cut.mark_boundary``) on their fast path: a mark holds
each exported state's bytes as a chunk entry of the records holds them (``checked_json``'s bytes
read back and serialised with keys sorted, agent first), and a mark
still refuses what is not finite plain data (``nan`` and ``inf`` anywhere, ``None`` beside them
or not, inside numpy arrays, and inside a container whose ``__eq__`` would hide them); the
Gymnasium agent's export is a copy of its history that a later step does not change."""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import orjson
import pytest

from gymckpt.gym_adapter.host._cut import mark_boundary
from gymckpt.gym_adapter.host._episode import EpisodeInfo
from gymckpt.gym_adapter.host._episodes import BOUNDARY, Episode
from gymckpt.runtime.lowlevel import checked_json

INFO = EpisodeInfo("3-1", 3, 1, 0, 7, "i-0")


@attrs.frozen
class Exported:
    """A participant whose export is its session state as it is."""

    name: str

    def export(self, state: Any) -> Any:
        return state


def mark(agent: Any, env: Any) -> Any:
    ep = Episode(INFO, {"agent": agent, "env": env}, BOUNDARY, turn=4)
    return mark_boundary((Exported("agent"), Exported("env")), ep)


class Liar(dict):  # type: ignore[type-arg]
    """A dict that says it equals anything (so a ``nan`` in it would read back as equal)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("agent", "env"),
    [
        ({"obs": [[0.1, -2.5], [3.0, 1e-310]], "actions": [0, 1]}, {"fields": {"x": 1.5}}),
        ({"obs": [0.25]}, {"fields": {"steps_beyond_terminated": None}, "elapsed_steps": 3}),
        ([None, "null", {"k": None}], None),
        ({"t": (1, 2.5)}, {"n": None}),  # a tuple: the checked path, the same bytes
        ({"a": np.array([1.5, 2.0])}, {"s": np.float32(0.5), "n": None}),
        # float32 text (8.7001214e+15) is not the float64 text it reads back as
        ({"b": np.float32(8.7001214e15), "a": [1]}, {"s": np.array([1e-8], np.float32)}),
    ],
)
def test_a_mark_holds_the_bytes_a_chunk_entry_holds(agent: Any, env: Any) -> None:
    m = mark(agent, env)
    assert m.problem is None and m.turn == 4
    # checked_json's bytes read back and serialised with keys sorted: what the records hold
    assert m.parts == tuple(
        orjson.dumps(orjson.loads(checked_json(x, "state")), option=orjson.OPT_SORT_KEYS)
        for x in (agent, env)
    )
    assert orjson.loads(m.states) == orjson.loads(checked_json([agent, env], "session state"))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "env",
    [
        lambda bad: {"x": bad},
        lambda bad: {"x": [1.0, bad], "n": None},
        lambda bad: {"n": None, "a": np.array([1.0, bad])},
        lambda bad: {"n": None, "a": np.array([bad])},
        lambda bad: {"n": None, "s": np.float64(bad)},
        lambda bad: {"n": None, "liar": Liar(v=bad)},
        lambda bad: [None, Liar(v=[bad])],
    ],
)
def test_a_mark_refuses_non_finite_numbers(bad: float, env: Any) -> None:
    m = mark({"obs": [None]}, env(bad))
    assert m.states is None
    assert m.problem is not None and "env session state" in m.problem, m.problem


def test_gymnasium_agent_export_is_a_copy_of_the_history() -> None:
    from gymckpt.gym_adapter.environments.gymnasium import GymnasiumAgent, Trajectory

    traj = Trajectory([[0.5, 1.0], [0.25, 2.0]], [1], [1.0])
    exported = GymnasiumAgent().export(traj)
    assert exported == attrs.asdict(traj)
    traj.observations.append([9.0, 9.0])
    traj.actions.append(0)
    traj.rewards.append(1.0)
    traj.terminated = True
    assert exported == {
        "observations": [[0.5, 1.0], [0.25, 2.0]],
        "actions": [1],
        "rewards": [1.0],
        "terminated": False,
        "truncated": False,
    }
