"""The ledger's records: one canonical rollout ID per attempt, parsed back exactly; the
payload of a result structured through the converter."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymckpt.runtime import AttemptState, EpisodeResult, ManifestError
from gymckpt.runtime._ledger_records import parse_rollout_id, rollout_id_for


@given(st.integers(0, 10**9), st.integers(0, 64), st.integers(0, 1000))
def test_a_rollout_id_parses_back_to_its_attempt(row: int, slot: int, attempt: int) -> None:
    assert parse_rollout_id(rollout_id_for(row, slot, attempt)) == (row, slot, attempt)


def test_only_canonical_ids_parse() -> None:
    assert rollout_id_for(3, 1, 0) == "3-1" and rollout_id_for(3, 1, 2) == "3-1-a2"
    for bad in (
        "03-1",
        "3-01",
        "3-1-a0",
        "3-1-a02",
        "3-1-b1",
        "3-1-a",
        "3",
        "",
        " 3-1",
        "3--1",
        "3-1 ",
        "+3-1",
        "\uff13-1",
        "3-1-a-1",
    ):
        assert parse_rollout_id(bad) is None, bad


def test_the_current_states_come_first() -> None:
    """The column store codes states by this order: the three current states, then the ends."""
    assert [s.value for s in AttemptState] == [
        "reserved",
        "dispatched",
        "completed",
        "failed",
        "abandoned",
    ]


@attrs.frozen
class Moves:
    moves: tuple[int, ...]


def test_payload_as_structures_or_names_the_field() -> None:
    assert EpisodeResult(1.0, 2, {"moves": [1, 2]}).payload_as(Moves) == Moves((1, 2))
    with pytest.raises(ManifestError, match="episode payload"):
        EpisodeResult(1.0, 2, {"moves": "x"}).payload_as(Moves)
