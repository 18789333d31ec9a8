"""Committed participant records of the Gym host: building and writing them (off the loop), and
reading them back verified.

Each participant's records are one JSON file (``records.json``) in its own directory, written
atomically (temp, fsync, rename, fsync dir); its digest goes in the commit reply and the
manifest. Reading back first checks what the runtime checks too (topology equal to the live
instance's, state directory inside the snapshot, digest as committed) and collects every
difference, so a restore refuses with the whole list and changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import orjson
import sniffio

from gymckpt.runtime import (
    InstanceRecord,
    dumps_chunked,
    participant_differences,
    participant_state_problem,
    write_atomic,
)

from ._episode import to_plain

if TYPE_CHECKING:
    from ._environment import Environment
    from ._host_episodes import Episode

__all__ = [
    "RECORDS_FILE",
    "Kept",
    "build_records",
    "offload",
    "read_verified",
    "topology_differences",
    "write_records",
]

T = TypeVar("T")
RECORDS_FILE: Final = "records.json"
MODEL_PROXY: Final = "model_proxy"
Kept = tuple[str, str, int, dict[str, Any]]
"""A retained slot of an ended episode: (key, rollout ID, attempt, states by participant)."""


def write_records(directory: Path, records: Mapping[str, Any]) -> None:
    """Write ``records`` as ``directory/records.json`` (sorted keys, atomic)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = dumps_chunked(records, orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
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


def build_records(
    env: Environment, owner: str, retained_participants: Sequence[Any], checkpoint_id: str,
    held: Sequence[Episode], kept: Sequence[Kept], stranded: str | None,
) -> dict[str, Any]:
    """Every participant's records for a commit, by server name: the agent's sessions (with
    their step boundary; None for ``stranded``), each participant's sessions of the ``held``
    episodes (and, for a retained one, of ``kept`` slots) and which it exports (``owner``),
    the model proxy's staged calls. Calls the participants' ``export``."""
    agent = env.agent
    export, name = agent.export, agent.name
    records: dict[str, Any] = {
        name: {
            "participant": name, "kind": agent.kind, "checkpoint_id": checkpoint_id,
            "sessions": [
                {"rollout_id": ep.rollout_id, "row": (info := ep.info).row, "slot": info.slot,
                 "attempt": info.attempt,
                 "step_boundary": None if ep.rollout_id == stranded else ep.turn,
                 "state": to_plain(export(ep.sessions[name]))}
                for ep in held
            ],
        }
    }
    retained = {p.name for p in retained_participants}
    for p in env.participants:
        export, name = p.export, p.name
        sessions = [
            {"key": ep.key, "rollout_id": ep.rollout_id, "attempt": ep.info.attempt,
             "state": to_plain(export(ep.sessions[name]))}
            for ep in held
        ]
        if p.name in retained:
            sessions.extend(
                {"key": key, "rollout_id": rid, "attempt": attempt,
                 "state": to_plain(p.export(states[p.name]))}
                for key, rid, attempt, states in kept
            )
            sessions.sort(key=lambda s: s["key"])
        records[p.name] = {
            "participant": p.name, "kind": p.kind, "checkpoint_id": checkpoint_id,
            "exported": [ep.rollout_id for ep in held] if p.name == owner else [],
            "retained": p.name in retained,
            "sessions": sessions,
        }
    if env.model is not None:
        records[MODEL_PROXY] = {
            "participant": MODEL_PROXY, "kind": "model_proxy", "checkpoint_id": checkpoint_id,
            "staged": [
                {"rollout_id": ep.rollout_id,
                 "calls": [{"key": k, "response": r} for k, r in ep.staged]}
                for ep in held
            ],
        }
    return records


_EXPORT_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "gymckpt_host_export_threads"
)


async def offload(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread; inline under trio's ``MockClock`` (virtual time would leap
    past every deadline while a real thread runs).

    One such thread per event loop at a time: instances hosted in one process share one GIL, so
    parallel exports are not faster, and every extra thread wanting the GIL makes the event
    loop wait longer for it."""
    if sniffio.current_async_library() == "trio":
        import trio

        # looked up, not imported: trio.testing imports pytest (objects every full collection
        # would walk), and a MockClock exists only once it was imported
        testing = sys.modules.get("trio.testing")
        if testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock):
            await anyio.lowlevel.checkpoint()
            return fn()
    try:
        limiter = _EXPORT_THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _EXPORT_THREADS.set(limiter)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)
