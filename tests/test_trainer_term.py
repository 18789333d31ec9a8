"""A work directory's lineage and its trainers' terms (``runtime/_trainer_term.py``): a lineage
is generated once and kept, each start takes the next term, written durably; a term file that
is not one is refused (exit code 2) and never replaced silently."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gymckpt.nurseries import ExitCode, run_exit
from gymckpt.runtime import ManifestError, TrainerTerm
from gymckpt.runtime._shared import TERM_FILE, next_term


def test_a_lineage_is_kept_and_every_start_takes_the_next_term(tmp_path: Path) -> None:
    first = next_term(tmp_path)
    assert first.term == 1 and first.workdir == str(tmp_path)
    assert [next_term(tmp_path).term for _ in range(3)] == [2, 3, 4]
    assert next_term(tmp_path).lineage == first.lineage
    (tmp_path / "other").mkdir()
    assert next_term(tmp_path / "other").lineage != first.lineage  # another run
    saved = orjson.loads((tmp_path / TERM_FILE).read_bytes())
    assert saved == {"version": 1, "lineage": first.lineage, "term": 5}


def test_the_header_form_round_trips_and_a_bad_one_is_refused() -> None:
    term = TrainerTerm("0123456789abcdef0123456789abcdef", 12, "/w")
    assert TrainerTerm.parse(term.header()) == term
    for bad in ("", "0123456789abcdef0123456789abcdef", "xyz.1", f"{term.lineage}.0", "a.b.c"):
        with pytest.raises(ValueError):
            TrainerTerm.parse(bad)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"version": 1, "lineage": "0123456789abcdef0123456789abcdef"}',
        b'{"version": 2, "lineage": "0123456789abcdef0123456789abcdef", "term": 3}',
        b'{"version": 1, "lineage": "ABC", "term": 3}',
        b'{"version": 1, "lineage": "0123456789abcdef0123456789abcdef", "term": 0}',
    ],
)
def test_a_term_file_that_is_not_one_is_refused_and_left_as_it_is(
    tmp_path: Path, body: bytes
) -> None:
    (tmp_path / TERM_FILE).write_bytes(body)
    with pytest.raises(ManifestError, match=TERM_FILE) as caught:
        next_term(tmp_path)
    assert (tmp_path / TERM_FILE).read_bytes() == body
    decided = run_exit(caught.value)
    assert decided is not None and decided[0] == ExitCode.BAD_INPUT
