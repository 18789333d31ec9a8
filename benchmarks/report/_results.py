"""The benchmarks' results as the report reads them: one JSON file per benchmark in the results
directory, each with the run's ``meta`` (command, commit, machine).

Writing replaces a file atomically, with every non-finite float written as ``null`` (JSON has
no NaN), so an interrupted run never leaves half a result beside the others. ``Results.read``
is the report's only reader: a directory without the drain, memory and dispatch results is a
``ValueError`` that says to run ``all`` first; the other benchmarks are optional (skipped with
``--no-ray``, or not part of an older run). ``host.json`` is never written by ``all``: it is
``gymckpt bench host --json`` saved on its own, read when present (its ``meta`` then names
another run).

Each result is structured once, here, into its record of ``_records`` by a copy of the
project's converter that keeps its strict types (no string taken for a number) but skips the
keys the report does not read; a result that lacks a field the report needs, or holds the
wrong type, is a ``ValueError`` naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs

from gymckpt.runtime._shared import converter
from gymckpt.runtime.lowlevel import write_atomic

from .._common import finite
from ._records import (
    CheckpointRayResult,
    CheckpointResult,
    DispatchResult,
    DrainResult,
    FanoutResult,
    HostResult,
    MemoryResult,
    PreservedResult,
    SandboxResult,
    TrainerSideResult,
)

__all__ = [
    "OPTIONAL",
    "Result",
    "Results",
    "dump",
    "flat",
    "load_result",
    "other_runs",
    "read_result",
]

T = TypeVar("T")

_reader = converter.copy(forbid_extra_keys=False)

Result = dict[str, Any]
"""One benchmark's result, as its ``run_*`` function returns it and its JSON file holds it."""


@attrs.frozen
class Results:
    """Every benchmark's result of one run; None for a benchmark the run did not include."""

    drain: DrainResult
    memory: MemoryResult
    dispatch: DispatchResult
    meta: dict[str, Any]
    checkpoint: CheckpointResult | None = None
    fanout: FanoutResult | None = None
    preserved: PreservedResult | None = None
    checkpoint_ray: CheckpointRayResult | None = None
    sandbox: SandboxResult | None = None
    trainer_side: TrainerSideResult | None = None
    """``trainer_side.json`` (``bench checkpoint --backend null --json``, or ``issue34``)."""
    host: HostResult | None = None
    """``host.json``, when present (``gymckpt bench host --json``, run on its own)."""
    others: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """The ``meta`` of each result file that another run wrote (another command or commit
    than the drain's): a benchmark run on its own after ``all``."""

    @classmethod
    def of(
        cls,
        *,
        drain: Result,
        memory: Result,
        dispatch: Result,
        meta: dict[str, Any],
        others: dict[str, dict[str, Any]] | None = None,
        **optional: Result | None,
    ) -> Results:
        """The results from each benchmark's JSON form (a file's, or what its ``run_*``
        function returned), each structured into its record; None for one not run
        (``optional``: the benchmarks of ``OPTIONAL``, by name)."""
        records = {
            name: None if data is None else read_result(data, OPTIONAL[name], f"{name}.json")
            for name, data in optional.items()
        }
        return cls(
            drain=read_result(drain, DrainResult, "drain.json"),
            memory=read_result(memory, MemoryResult, "memory.json"),
            dispatch=read_result(dispatch, DispatchResult, "dispatch.json"),
            meta=meta,
            others=others or {},
            **records,
        )

    @classmethod
    def read(cls, out: Path) -> Results:
        """The results in ``out``; the run's ``meta`` is the drain result's."""
        drain, memory, dispatch = (
            load_result(out, "drain.json"),
            load_result(out, "memory.json"),
            load_result(out, "dispatch.json"),
        )
        if drain is None or memory is None or dispatch is None:
            raise ValueError(
                f"{out} lacks drain.json, memory.json or dispatch.json; run `all` first"
            )
        rest = {name: load_result(out, f"{name}.json") for name in OPTIONAL}
        return cls.of(
            drain=drain,
            memory=memory,
            dispatch=dispatch,
            meta=drain["meta"],
            others=other_runs(
                drain.get("meta") or {},
                {
                    "memory.json": memory,
                    "dispatch.json": dispatch,
                    **{f"{name}.json": data for name, data in rest.items()},
                },
            ),
            **rest,
        )


OPTIONAL: dict[str, type] = {
    "checkpoint": CheckpointResult,
    "fanout": FanoutResult,
    "preserved": PreservedResult,
    "checkpoint_ray": CheckpointRayResult,
    "host": HostResult,
    "sandbox": SandboxResult,
    "trainer_side": TrainerSideResult,
}
"""The benchmarks a run may lack (``--no-ray``, an older run, ``host.json`` saved on its own
or not): each one's ``Results`` field and ``<name>.json`` file, and its record."""


def other_runs(meta: dict[str, Any], results: dict[str, Result | None]) -> dict[str, Any]:
    """The result files whose run differs from ``meta``'s (command or commit), by name."""

    def run(m: dict[str, Any]) -> tuple[Any, Any]:
        return m.get("command"), (m.get("source") or {}).get("commit_full")

    out: dict[str, dict[str, Any]] = {}
    for name, data in results.items():
        other = None if data is None else data.get("meta")
        if isinstance(other, dict) and run(other) != run(meta):
            out[name] = other
    return out


def load_result(out: Path, name: str) -> Result | None:
    """The result file ``name`` in ``out`` as JSON, None when there is none."""
    path = out / name
    if not path.exists():
        return None
    data: Result = json.loads(path.read_text())
    return data


def read_result(data: Result, cls: type[T], name: str) -> T:
    """``data`` (the result file ``name`` holds, or a ``run_*`` function returned) as ``cls``;
    a missing field or a value of the wrong type is a ``ValueError`` naming both."""
    try:
        return _reader.structure(data, cls)
    except cattrs.BaseValidationError as exc:
        problems = "; ".join(cattrs.transform_error(exc, path=name))
        raise ValueError(f"{problems}; run the benchmark again to rewrite it") from exc


def dump(path: Path, data: Result) -> None:
    """Write ``data`` to ``path`` atomically as indented JSON, non-finite floats as null."""
    write_atomic(path, (json.dumps(finite(data), indent=2) + "\n").encode())


def flat(data: Result | None) -> Result | None:
    """``data``'s scalar figures (the headline a ``--json`` run prints), None for None."""
    if data is None:
        return None
    return {k: v for k, v in data.items() if not isinstance(v, dict | list)}
