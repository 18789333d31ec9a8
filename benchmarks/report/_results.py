"""The benchmarks' results as the report reads them: one JSON file per benchmark in the results
directory, each with the run's ``meta`` (command, commit, machine).

Writing replaces a file atomically, with every non-finite float written as ``null`` (JSON has
no NaN), so an interrupted run never leaves half a result beside the others. ``Results.read``
is the report's only reader: a directory without the drain, memory and dispatch results is a
``ValueError`` that says to run ``all`` first; the other benchmarks are optional (skipped with
``--no-ray``, or not part of an older run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs

from gymckpt.runtime.lowlevel import write_atomic

__all__ = ["Result", "Results", "dump", "flat"]

Result = dict[str, Any]
"""One benchmark's result, as its ``run_*`` function returns it and its JSON file holds it."""


@attrs.frozen
class Results:
    """Every benchmark's result of one run; None for a benchmark the run did not include."""

    drain: Result
    memory: Result
    dispatch: Result
    meta: dict[str, Any]
    checkpoint: Result | None = None
    fanout: Result | None = None
    preserved: Result | None = None
    checkpoint_ray: Result | None = None

    @classmethod
    def read(cls, out: Path) -> Results:
        """The results in ``out``; the run's ``meta`` is the drain result's."""

        def load(name: str) -> Result | None:
            path = out / name
            if not path.exists():
                return None
            data: Result = json.loads(path.read_text())
            return data

        drain, memory, dispatch = load("drain.json"), load("memory.json"), load("dispatch.json")
        if drain is None or memory is None or dispatch is None:
            raise ValueError(
                f"{out} lacks drain.json, memory.json or dispatch.json; run `all` first"
            )
        return cls(
            drain=drain,
            memory=memory,
            dispatch=dispatch,
            meta=drain["meta"],
            checkpoint=load("checkpoint.json"),
            fanout=load("fanout.json"),
            preserved=load("preserved.json"),
            checkpoint_ray=load("checkpoint_ray.json"),
        )


def dump(path: Path, data: Result) -> None:
    """Write ``data`` to ``path`` atomically as indented JSON, non-finite floats as null."""
    write_atomic(path, (json.dumps(_finite(data), indent=2) + "\n").encode())


def flat(data: Result | None) -> Result | None:
    """``data``'s scalar figures (the headline a ``--json`` run prints), None for None."""
    if data is None:
        return None
    return {k: v for k, v in data.items() if not isinstance(v, dict | list)}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
