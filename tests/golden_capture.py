"""Capture the golden fixtures under ``tests/data/golden``: today's bytes of a rollout snapshot,
of the HTTP wire and of the command line's ``--json`` outputs, for ``tests/test_golden.py``.

Run it with the interpreter of the tree to capture (``.venv/bin/python tests/golden_capture.py
OUT``); it writes a tree of files under ``OUT`` (which must not exist):

* ``snapshot/aligned/`` and ``snapshot/unaligned/``: every file of a trainer's work directory
  after a small run on the embedded calendar Gym (2 instances, seed 7, 6 rows, groups of 2), one
  checkpoint taken while episodes run (in the unaligned mode, mid-turn) and one after the last
  row: the snapshots (marker, manifest, ledger, order, step, trainer state, the participants'
  records), the work directory's own files and the instances' session journals. The run is
  deterministic: trio's ``MockClock`` (autojump) and the simulation's deterministic scheduling
  (``deterministic_scheduling``, seeded), so no wall time and no scheduling order enters it.
* ``wire/NN-<call>.http``: each exchange of a scripted session with two real ``gymckpt serve``
  processes of the calendar on loopback (``/health``, ``/run``, every ``/control/v1/<op>``, a
  restore into a second server, a refusal and a Gym error), recorded by an httpx transport at
  the HTTP layer: the method and path, the request body as sent, the status, the response's
  ``Content-Type`` and ``Gymckpt-Instance`` headers and its body as received. Requests are
  encoded by the wire module of the tree (``encode_control_request``, ``encode_run_request``).
  Sequential calls, one row per ``/run``: the replies' order and batching are deterministic.
* ``cli/<name>.json``: ``gymckpt demo --json`` (embedded calendar; with a SIGKILL and restore;
  on Gymnasium CartPole), ``inspect --json``, ``verify --json``, ``snapshots list --json`` and
  ``snapshots prune --json`` of the aligned work directory above, ``simulate --seeds 3 --json``;
  run as ``python -m gymckpt``, stdout as printed, then its exit code on a last line.

Normalisation (each field below was seen to differ between two runs of identical inputs, and
nothing else is touched; everything is literal substitution on the bytes, so what is left is
compared byte for byte):

* absolute temporary paths: the capture's scratch directory is written ``<tmp>``;
* the trainer's lineage (``trainer_term.json``, 32 random hex digits per run) is ``<lineage>``;
* a ``gymckpt serve``'s incarnation (random per process start, in ``/health``) is
  ``<incarnation>``;
* the wire's ``deadline.sent_wall`` is no normalisation: requests are sent with ``sent_wall``
  fixed in the future (``FAR_WALL``), which the server reads as no time spent (a receiver clock
  behind counts as none), so the request bytes are fixed;
* ``demo --json``: ``elapsed_s`` and each value of ``stage_ms_median`` (wall-clock durations) are
  ``"<s>"`` and ``"<ms>"``; ``episodes_mid_turn`` of an unaligned demo would depend on timing, so
  no unaligned demo is captured (the unaligned snapshot above pins that mode);
* ``simulate --json``: ``elapsed_s`` (wall clock) is ``"<s>"``.

Layouts: the tree may have the application at ``gymckpt.app`` and the Gym side in rooms
(``gym_adapter.environments``, ``transports``) or the layout before that move
(``gymckpt.nurseries.app``, ``gym_adapter.calendar_env``, ``_http_wire``): ``_module`` takes the
first that exists. Everything else goes through public names and the ``gymckpt`` command.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import CheckpointMode, RuntimeConfig

__all__ = ["capture"]

_MODULES: dict[str, tuple[str, ...]] = {
    "calendar": ("gymckpt.gym_adapter.environments.calendar", "gymckpt.gym_adapter.calendar_env"),
    "determinism": (
        "gymckpt.app.simulation.determinism",
        "gymckpt.nurseries.app.sim_determinism",
    ),
    "http_wire": ("gymckpt.gym_adapter.transports.http._wire", "gymckpt.gym_adapter._http_wire"),
    "deadlines": (
        "gymckpt.gym_adapter.transports._deadlines",
        "gymckpt.gym_adapter._transport_deadlines",
    ),
    "admission": (
        "gymckpt.gym_adapter.transports._admission",
        "gymckpt.gym_adapter._transport_admission",
    ),
}
"""Where each module lives, in the layout after issue 32's move and before it."""

SEED = 7
SNAPSHOT_ROWS = 6
FAR_WALL = 4102444800.0
"""``sent_wall`` of every wire request: 2100-01-01, so the server counts no time as spent."""
LINEAGE = re.compile(rb'"lineage": "[0-9a-f]{32}"')
INCARNATION_HEADER = "gymckpt-incarnation"


def _module(name: str) -> ModuleType:
    for path in _MODULES[name]:
        if _has(path):
            return importlib.import_module(path)
    raise ImportError(f"none of {_MODULES[name]} in this tree")


def _calendar_factory() -> str:
    return _MODULES["calendar"][0 if _has(_MODULES["calendar"][0]) else 1] + (
        ":calendar_environment"
    )


def _has(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:
        return False


class _Scrub:
    """The run-dependent strings of one capture and what they are written as."""

    def __init__(self, tmp: Path) -> None:
        self.literals: list[tuple[bytes, bytes]] = [(str(tmp).encode(), b"<tmp>")]

    def add(self, value: str, as_: str) -> None:
        self.literals.append((value.encode(), as_.encode()))

    def __call__(self, data: bytes) -> bytes:
        for value, as_ in self.literals:
            data = data.replace(value, as_)
        return LINEAGE.sub(b'"lineage": "<lineage>"', data)


# --- a. snapshot bytes ------------------------------------------------------------------------


async def _rollout_run(workdir: Path, gym_dir: Path, mode: CheckpointMode) -> None:
    cal = _module("calendar")
    sim = cal.SimConfig(turns=(2, 3), turn_s=(0.5, 1.5), mutation_p=1.0)
    config = RuntimeConfig(checkpoint_mode=mode)
    async with cal.calendar_embedded(instances=2, seed=SEED, work_dir=gym_dir, config=sim) as gym:
        async with open_rollouts(
            gym,
            workdir,
            rows=SNAPSHOT_ROWS,
            group_size=2,
            config=config,
            max_rows_in_flight=4,
            handle_signals=False,
        ) as ro:
            first = await ro.next_batch(1)
            await trio.sleep(0.7)  # the other rows in flight are inside a turn
            outcome = await ro.checkpoint(b'{"groups": %d}' % len(first))
            assert outcome.ok and outcome.episodes > 0, outcome
            while not ro.finished:
                await ro.next_batch(1)
            assert (await ro.checkpoint(b'{"groups": "all"}')).ok


def _snapshot(out: Path, scratch: Path, mode: CheckpointMode) -> Path:
    work = scratch / f"work-{mode.value}"
    gym_dir = work / "gym-live"
    with _module("determinism").deterministic_scheduling(SEED):
        trio.run(
            _rollout_run,
            work,
            gym_dir,
            mode,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    scrub = _Scrub(scratch)
    for path in sorted(work.rglob("*")):
        if path.is_file():
            _write(out / "snapshot" / mode.value / path.relative_to(work), scrub(path.read_bytes()))
    return work


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# --- b. the HTTP wire ------------------------------------------------------------------------


class _Recorder(httpx.AsyncHTTPTransport):
    """An httpx transport that keeps each exchange's bytes, numbered in the order sent."""

    def __init__(self, log: list[tuple[int, str, bytes]], scrub: _Scrub, instance: str) -> None:
        super().__init__()
        self.log, self.scrub, self.instance = log, scrub, instance

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        n = len(self.log)
        self.log.append((n, "", b""))  # the slot of this exchange, by send order
        body = request.content
        response = await super().handle_async_request(request)
        content = await response.aread()
        await response.aclose()
        label = request.url.path.rsplit("/", 1)[-1] or "root"
        head = [
            f"> {request.method} {request.url.path}\n".encode(),
            body,
            b"\n",
            f"< {response.status_code} {response.headers.get('content-type')} "
            f"{response.headers.get('gymckpt-instance')}\n".encode(),
            content,
        ]
        assert response.headers.get(INCARNATION_HEADER) is not None
        self.log[n] = (n, f"{self.instance}-{label}", self.scrub(b"".join(head)))
        return httpx.Response(
            response.status_code, headers=response.headers, content=content, request=request
        )


def _control(op: str, args: dict[str, Any] | None = None, acks: Any = None) -> bytes:
    wire = _module("http_wire")
    deadline = _module("deadlines").WireDeadline(30.0, FAR_WALL)
    return bytes(wire.encode_control_request(op, deadline=deadline, acks=acks or {}, args=args))


def _run(sid: int, rows: tuple[Any, ...], acks: Any = None) -> bytes:
    wire = _module("http_wire")
    shape = _module("admission").RunShape()
    return bytes(wire.encode_run_request(wire.RunRequest(sid, acks or {}, shape, False, 64, rows)))


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    was = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if was is None:
            del os.environ[name]
        else:
            os.environ[name] = was


async def _wire_session(scratch: Path, log: list[tuple[int, str, bytes]], scrub: _Scrub) -> None:
    from gymckpt.gym_adapter import RunRow
    from gymckpt.runtime import EpisodeRecord, InstanceRecord, ParticipantRecord, TrainerTerm
    from gymckpt.testing._http_serve_process import serve_process

    wire = _module("http_wire")
    factory = _calendar_factory().replace(":calendar_environment", ":calendar_from_environ")
    states = scratch / "states"
    states.mkdir()
    common = ("--state-root", str(states), "--seed", str(SEED))
    term = TrainerTerm("0123456789abcdef" * 2, 1, "golden")

    def client(proc: Any, name: str, token: bool = True) -> httpx.AsyncClient:
        scrub.add(proc.incarnation, "<incarnation>")
        return httpx.AsyncClient(
            base_url=proc.url,
            headers=proc.auth() if token else {},
            timeout=30.0,
            transport=_Recorder(log, scrub, name),
        )

    def plain(proc: Any) -> httpx.AsyncClient:  # not recorded: waiting for a state
        return httpx.AsyncClient(base_url=proc.url, headers=proc.auth(), timeout=30.0)

    async def post(c: httpx.AsyncClient, op: str, body: bytes) -> httpx.Response:
        path = "/run" if op == "run" else f"/control/v1/{op}"
        return await c.post(path, content=body)

    cal = _module("calendar")
    held = cal.SimConfig(mutation_p=1.0, hold_after_first_mutation=True)
    async with contextlib.AsyncExitStack() as stack:
        with _environ(cal.CONFIG_ENV, json.dumps(attrs.asdict(held))):
            proc = await stack.enter_async_context(serve_process(scratch / "a", factory, *common))
        async with client(proc, "a") as c, client(proc, "a", token=False) as bare, plain(proc) as p:
            await c.get("/health")
            await post(c, "topology", _control("topology"))
            await post(c, "attach", _control("attach", {"trainer": term}))
            async with trio.open_nursery() as nursery:
                # row 0 mutates the calendar on its first turn and is held at the step boundary
                # after it (hold_after_first_mutation) until the prepare parks it
                nursery.start_soon(post, c, "run", _run(1, (RunRow("0-0", 0, 0, 0),)))
                with trio.fail_after(20):
                    while not (await p.post("/control/v1/retained_sessions", content=_control(
                        "retained_sessions"
                    ))).json()["result"].get("calendar", {}).get("0-0", {}).get("state", {}).get(
                        "events"
                    ):
                        await trio.sleep(0.02)
                await post(c, "inventory", _control("inventory"))
                await post(c, "prepare", _control("prepare", {"checkpoint_id": "c1"}))
                commit = await post(
                    c, "commit", _control("commit", {"checkpoint_id": "c1", "state_root": "c1"})
                )
                await post(c, "resume", _control("resume", {"checkpoint_id": "c1"}))
            one = RunRow("1-0", 1, 0, 0, task={"prompt": "golden", "n": [1, 2.5]})
            ran = await post(c, "run", _run(2, (one,), acks={1: 2}))
            await post(c, "inventory", _control("inventory"))
            last = len(ran.content.splitlines()) - 2
            await post(c, "ack", _control("ack", {"sid": 2, "upto": last}))
            await post(c, "retained_sessions", _control("retained_sessions"))
            await post(c, "retire", _control("retire", {"rollout_ids": ["0-0", "1-0", "9-0"]}))
            await post(c, "release", _control("release", {"trainer": term}))
            await post(bare, "topology", _control("topology"))  # no token: 401
            bad_commit = {"checkpoint_id": "never", "state_root": "never"}
            await post(c, "commit", _control("commit", bad_commit))  # a Gym error: 503
    reply = wire.decode_result("commit", commit.content)
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(q.server_name, q.kind, q.state_dir, q.records_digest)
            for q in reply.participants
        ),
    )
    episodes = tuple(
        EpisodeRecord(e.rollout_id, e.owner, "gym-0", e.capture_keys) for e in reply.exported
    )
    plain_config = cal.SimConfig(mutation_p=1.0)  # the same workplace, no episode held
    async with contextlib.AsyncExitStack() as stack:
        with _environ(cal.CONFIG_ENV, json.dumps(attrs.asdict(plain_config))):
            proc = await stack.enter_async_context(serve_process(scratch / "b", factory, *common))
        async with client(proc, "b") as c:
            restore = {"state_root": "c1", "record": record, "episodes": episodes}
            await post(c, "restore", _control("restore", restore))
            await post(c, "inventory", _control("inventory"))
            claim = RunRow("0-0-a1", 0, 0, 1, restored_from="0-0")
            await post(c, "run", _run(1, (claim,)))
            await post(c, "retire_restored", _control("retire_restored", {"rollout_ids": ["0-0"]}))
            bad = InstanceRecord("gym-0", (ParticipantRecord("calendar", "environment", "x", "0"),))
            wrong = {"state_root": "c1", "record": bad, "episodes": ()}
            await post(c, "restore", _control("restore", wrong))  # TopologyMismatch: 409


def _wire(out: Path, scratch: Path) -> None:
    log: list[tuple[int, str, bytes]] = []
    scrub = _Scrub(scratch)
    trio.run(_wire_session, scratch, log, scrub)
    for n, label, data in log:
        _write(out / "wire" / f"{n:02d}-{label}.http", data)
    states = scratch / "states"
    for path in sorted(states.rglob("*")):
        if path.is_file():
            _write(out / "wire" / "state" / path.relative_to(states), scrub(path.read_bytes()))


def capture(out: Path, parts: tuple[str, ...] = ("snapshot", "wire", "cli")) -> None:
    """Write the golden tree of the installed ``gymckpt`` under ``out`` (a new directory)."""
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gymckpt-golden-") as tmp:
        scratch = Path(tmp).resolve()
        aligned = None
        if "snapshot" in parts or "cli" in parts:
            aligned = _snapshot(out, scratch, CheckpointMode.ALIGNED)
            _snapshot(out, scratch, CheckpointMode.UNALIGNED)
        if "wire" in parts:
            _wire(out, scratch)


if __name__ == "__main__":
    capture(Path(sys.argv[1]), tuple(sys.argv[2:]) or ("snapshot", "wire", "cli"))
