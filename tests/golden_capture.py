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
* ``wire/state/``: the participants' records the HTTP ``commit`` wrote under the state root.
* ``cli/<name>.out``: stdout as printed, then each stderr line after ``stderr: ``, then
  ``exit N``. The demos run as ``python -m gymckpt demo --json`` processes, started together:
  the embedded calendar without a crash; with phase 1 killing itself (SIGKILL) after its first
  checkpoint is published, then a restore; killing itself in the middle of publishing its
  second (a torn snapshot); on Gymnasium CartPole with the same crash; and a bad flag. The
  crashes come from inside at a checkpoint stage (``--crash-at-stage``), not from the parent's
  kill, whose landing races the training. ``inspect --json`` (the last and the mid-run
  snapshot), ``verify --json`` (intact, a participant's records changed, a file the marker
  digests changed), ``snapshots list --json`` and ``snapshots prune --keep 1 --json`` of the
  aligned work directory above, and ``simulate --seeds 3 --json`` run in this process through
  the command line's ``main``.

Normalisation. Each field below was seen to differ between two runs of identical inputs
(``golden_capture.py OUT --raw`` twice, then ``diff -r``: these and nothing else); nothing else
is touched, and what is left is compared byte for byte:

* absolute temporary paths: the capture's scratch directory is written ``<tmp>``;
* the trainer's lineage (``trainer_term.json``, 32 random hex digits per run) is ``<lineage>``;
* a ``gymckpt serve``'s incarnation (random per process start, in ``/health``) is
  ``<incarnation>``;
* ``demo --json``: ``elapsed_s`` (wall clock) is ``"<s>"`` and each value of
  ``stage_ms_median`` (wall-clock durations; the keys stay) is ``"<ms>"``;
* ``simulate --json``: ``elapsed_s`` and ``seeds_per_s`` (wall clock) are ``"<s>"``.

Made fixed rather than normalised: the wire's ``deadline.sent_wall`` is ``FAR_WALL``, in the
future, which a server reads as no time spent (a receiver clock behind counts as none); the
trainer term ``attach`` and ``release`` send is a constant. Not captured because it depends on
timing: an unaligned demo's ``episodes_mid_turn`` (the unaligned snapshot pins that mode) and
the parent's SIGKILL (above).

Layouts: the tree may have the application at ``gymckpt.app`` and the Gym side in rooms
(``gym_adapter.environments``, ``transports``) or the layout before that move
(``gymckpt.nurseries.app``, ``gym_adapter.calendar_env``, ``_http_wire``): ``_module`` takes the
first that exists. Everything else goes through public names and the ``gymckpt`` command.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym, EnvironmentRef
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
    "cli": ("gymckpt.app.cli", "gymckpt.nurseries.app.cli"),
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


def _calendar_config(**knobs: Any) -> Any:
    """The calendar's config (``CalendarConfig``; ``SimConfig`` before issue 32's rename)."""
    cal = _module("calendar")
    config = getattr(cal, "CalendarConfig", None) or cal.SimConfig
    return config(**knobs)


def _calendar_factory() -> str:
    """The import path of the calendar whose config is read from ``CONFIG_ENV``."""
    return f"{_module('calendar').__name__}:calendar_from_environ"


def _has(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:
        return False


class _Scrub:
    """The run-dependent strings of one capture and what they are written as."""

    def __init__(self, tmp: Path, normalise: bool = True) -> None:
        self.literals: list[tuple[bytes, bytes]] = [(str(tmp).encode(), b"<tmp>")]
        self.normalise = normalise

    def add(self, value: str, as_: str) -> None:
        self.literals.append((value.encode(), as_.encode()))

    def __call__(self, data: bytes) -> bytes:
        if not self.normalise:
            return data
        for value, as_ in self.literals:
            data = data.replace(value, as_)
        return LINEAGE.sub(b'"lineage": "<lineage>"', data)


# --- a. snapshot bytes ------------------------------------------------------------------------


async def _rollout_run(workdir: Path, gym_dir: Path, mode: CheckpointMode) -> None:
    cal = _module("calendar")
    sim = _calendar_config(turns=(2, 3), turn_s=(0.5, 1.5), mutation_p=1.0)
    config = RuntimeConfig(checkpoint_mode=mode)
    environment = EnvironmentRef.to(cal.calendar_environment, config=sim)
    async with EmbeddedGym.host(
        [environment, environment], 2, SEED, gym_dir, sim.host_config()
    ) as gym:
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
            assert (outcome.mid_turn > 0) == (mode is CheckpointMode.UNALIGNED), outcome
            while not ro.finished:
                await ro.next_batch(1)
            assert (await ro.checkpoint(b'{"groups": "all"}')).ok


def _snapshot(out: Path, scratch: Path, mode: CheckpointMode, normalise: bool) -> Path:
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
    scrub = _Scrub(scratch, normalise)
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
    factory = _calendar_factory()
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

    async def _held(p: httpx.AsyncClient, key: str) -> None:
        """Until slot ``key``'s calendar has its first event: the episode is held (another
        process's state: polled, with a deadline)."""
        with trio.fail_after(20):
            while True:
                got = await p.post(
                    "/control/v1/retained_sessions", content=_control("retained_sessions")
                )
                if (
                    got.json()["result"]
                    .get("calendar", {})
                    .get(key, {})
                    .get("state", {})
                    .get("events")
                ):
                    return
                await trio.sleep(0.02)

    async def post(c: httpx.AsyncClient, op: str, body: bytes) -> httpx.Response:
        path = "/run" if op == "run" else f"/control/v1/{op}"
        return await c.post(path, content=body)

    cal = _module("calendar")
    held = _calendar_config(mutation_p=1.0, hold_after_first_mutation=True)
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
                await _held(p, "0-0")
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
    plain_config = _calendar_config(mutation_p=1.0)  # the same workplace, no episode held
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


def _wire(out: Path, scratch: Path, normalise: bool) -> None:
    log: list[tuple[int, str, bytes]] = []
    scrub = _Scrub(scratch, normalise)
    trio.run(_wire_session, scratch, log, scrub)
    for n, label, data in log:
        _write(out / "wire" / f"{n:02d}-{label}.http", data)
    states = scratch / "states"
    for path in sorted(states.rglob("*")):
        if path.is_file():
            _write(out / "wire" / "state" / path.relative_to(states), scrub(path.read_bytes()))


# --- c. the command line's --json outputs ----------------------------------------------------

DEMO = ("demo", "--json", "--rows", "8", "--instances", "2", "--group-size", "2", "--seed", "3")
"""A small demo: the embedded calendar, 8 rows, 2 steps, a checkpoint every 2 steps."""

CRASH = ("--crash-after-checkpoint", "1", "--crash-at-stage", "after_publish")
"""Phase 1 kills itself (SIGKILL) once its first checkpoint is published: the same crash and
restore as the parent's kill after checkpoint 1, without the race of a signal from outside."""

TORN = ("--checkpoint-every", "1", "--crash-after-checkpoint", "2", "--crash-at-stage")
"""Phase 1 kills itself in the middle of publishing its second checkpoint (a torn snapshot)."""

CLI_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("demo", (*DEMO, "--crash-after-checkpoint", "0")),
    ("demo-crash-after-publish", (*DEMO, *CRASH)),
    ("demo-crash-mid-publish", (*DEMO, *TORN, "mid_publish")),
    ("demo-gymnasium-cartpole", (*DEMO, "--env", "gymnasium:CartPole-v1", *CRASH)),
    ("demo-bad-flag", ("demo", "--json", "--rows", "0")),
)
"""The demos: name, arguments after ``gymckpt`` (each a ``python -m gymckpt`` process, as the
demo's phases are processes of their own)."""

WALL_KEYS = re.compile(rb'"(elapsed_s|seeds_per_s)": -?[0-9][0-9.e+-]*')
STAGE_MS = re.compile(rb'"stage_ms_median": \{[^}]*\}')
NUMBER_VALUE = re.compile(rb'(": )-?[0-9][0-9.e+-]*')


def _wall_times(data: bytes) -> bytes:
    """``elapsed_s`` and ``seeds_per_s`` (wall clock) as ``"<s>"``, and each value of
    ``stage_ms_median`` (wall-clock stage durations) as ``"<ms>"``."""
    data = WALL_KEYS.sub(lambda m: b'"' + m.group(1) + b'": "<s>"', data)
    return STAGE_MS.sub(lambda m: NUMBER_VALUE.sub(rb'\1"<ms>"', m.group(0)), data)


def _in_process(args: tuple[str, ...]) -> bytes:
    """``gymckpt ARGS`` run by the command line's ``main`` in this process (no interpreter to
    start): stdout, then each stderr line after ``stderr: ``, then the exit code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _module("cli").main(list(args))
        except SystemExit as exc:
            code = exc.code
    lines = "".join(f"stderr: {line}\n" for line in err.getvalue().splitlines())
    return (out.getvalue() + lines + f"exit {int(code or 0)}\n").encode()


def _gymckpt(args: tuple[str, ...], cwd: Path) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "gymckpt", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.stdout + b"exit %d\n" % done.returncode


def _start_demos(pool: ThreadPoolExecutor, scratch: Path) -> dict[str, Future[bytes]]:
    """The demos, started at once (each a process that mostly waits: turns, phases)."""
    return {
        name: pool.submit(_gymckpt, (*args, "--workdir", str(scratch / f"cli-{name}")), scratch)
        for name, args in CLI_RUNS
    }


def _cli(
    out: Path, scratch: Path, aligned: Path, demos: dict[str, Future[bytes]], normalise: bool
) -> None:
    scrub = _Scrub(scratch, normalise)

    def wall(data: bytes) -> bytes:
        return _wall_times(data) if normalise else data

    for name, done in demos.items():
        _write(out / "cli" / f"{name}.out", wall(scrub(done.result())))
    pruned, tampered, torn = (scratch / f"cli-{n}" for n in ("pruned", "tampered", "torn"))
    for copy in (pruned, tampered, torn):
        shutil.copytree(aligned, copy)
    records = tampered / "snapshots" / "ckpt-000002" / "gym" / "gym-0" / "calendar"
    (records / "records.json").write_bytes(b"{}")  # verify finds a participant's digest off
    ledger = torn / "snapshots" / "ckpt-000002" / "ledger.json"
    ledger.write_bytes(ledger.read_bytes().replace(b'"next_row":6', b'"next_row":5'))
    offline = (
        ("inspect", ("inspect", str(aligned), "--json")),
        ("inspect-mid-run", ("inspect", str(aligned / "snapshots" / "ckpt-000001"), "--json")),
        ("verify", ("verify", str(aligned), "--json")),
        ("verify-tampered", ("verify", str(tampered), "--json")),
        ("verify-torn", ("verify", str(torn), "--json")),  # a file the marker digests: exit 2
        ("snapshots-list", ("snapshots", "list", str(aligned), "--json")),
        ("snapshots-prune", ("snapshots", "prune", "--keep", "1", str(pruned), "--json")),
        ("simulate-3-seeds", ("simulate", "--seeds", "3", "--json", "--tmp", str(scratch))),
    )
    for name, args in offline:
        _write(out / "cli" / f"{name}.out", wall(scrub(_in_process(args))))


PARTS = ("snapshot", "wire", "cli")


def capture(out: Path, parts: tuple[str, ...] = PARTS, normalise: bool = True) -> None:
    """Write the golden tree of the installed ``gymckpt`` under ``out`` (a new directory):
    ``parts`` of it, normalised as the module says (``normalise=False``: the raw bytes, to see
    which fields differ between two runs)."""
    out.mkdir(parents=True)
    with (
        tempfile.TemporaryDirectory(prefix="gymckpt-golden-") as tmp,
        ThreadPoolExecutor(len(CLI_RUNS)) as pool,
    ):
        scratch = Path(tmp).resolve()
        demos = _start_demos(pool, scratch) if "cli" in parts else {}
        aligned = _snapshot(out, scratch, CheckpointMode.ALIGNED, normalise)
        _snapshot(out, scratch, CheckpointMode.UNALIGNED, normalise)
        if "snapshot" not in parts:
            shutil.rmtree(out / "snapshot")
        if "wire" in parts:
            _wire(out, scratch, normalise)
        if "cli" in parts:
            _cli(out, scratch, aligned, demos, normalise)


def main(argv: list[str]) -> None:
    """``golden_capture.py OUT [--raw] [PART...]``: PART is snapshot, wire or cli (all by
    default); ``--raw`` skips the normalisation."""
    raw = "--raw" in argv
    args = [a for a in argv if a != "--raw"]
    if not args or any(a not in PARTS for a in args[1:]):
        raise SystemExit(main.__doc__)
    capture(Path(args[0]), tuple(args[1:]) or PARTS, normalise=not raw)


if __name__ == "__main__":
    main(sys.argv[1:])
