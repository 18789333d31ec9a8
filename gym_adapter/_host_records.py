"""Committed participant records of the Gym host: writing them, and reading them back verified.

Each participant's records are one JSON file (``records.json``) in its own directory, written
atomically (temp, fsync, rename, fsync dir); its digest goes in the commit reply and the
manifest. Reading back first checks what the runtime checks too (topology equal to the live
instance's, state directory inside the snapshot, digest as committed) and collects every
difference, so a restore refuses with the whole list and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from gymckpt.runtime import (
    InstanceRecord,
    participant_differences,
    participant_state_problem,
    write_atomic,
)

__all__ = ["RECORDS_FILE", "read_verified", "topology_differences", "write_records"]

RECORDS_FILE: Final = "records.json"


def write_records(directory: Path, records: Mapping[str, Any]) -> None:
    """Write ``records`` as ``directory/records.json`` (sorted keys, atomic)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(records, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    write_atomic(directory / RECORDS_FILE, data)


def topology_differences(
    instance: str, live: Sequence[tuple[str, str]], record: InstanceRecord
) -> list[str]:
    """Every way the committed participants differ from the live ones (names, kinds, order)."""
    where = f"instance {instance}"
    diffs: list[str] = []
    if record.name != instance:
        diffs.append(f"{where}: manifest record is for instance {record.name}")
    diffs += participant_differences(where, record.participants, live)
    return diffs


def read_verified(
    instance: str, live: Sequence[tuple[str, str]], root: Path, record: InstanceRecord
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(every difference, each participant's records by server name) for a restore."""
    diffs = topology_differences(instance, live, record)
    loaded: dict[str, dict[str, Any]] = {}
    for p in record.participants:
        who = f"instance {instance}: participant {p.server_name}"
        problem = participant_state_problem(root, p, who)
        if problem is not None:
            diffs.append(problem)
            continue
        try:
            data = orjson.loads((root / p.state_dir / RECORDS_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            diffs.append(f"{who} records unreadable ({exc})")
            continue
        if not isinstance(data, dict):
            diffs.append(f"{who} records are not a JSON object")
            continue
        loaded[p.server_name] = data
    return diffs, loaded
