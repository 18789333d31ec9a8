"""The hostile-tree lane of the simulation: ``gymckpt simulate --trees``.

Each seed draws a small workload of agents working in sandbox trees (``Sandbox``), a
checkpoint mode, the virtual time of one checkpoint, and one to three *acts* against the
trees, each striking one row at one turn (every attempt of it: a restored turn does it again):

* ``symlink_out``: the agent plants a symlink out of its tree, then reads and writes through
  it. The file API must refuse both (``SandboxPathError``) and the file outside must stay as
  it was; an export that meets the link refuses the tree, so the episode fails as data naming
  the link, never a snapshot a restore would refuse.
* ``enormous_file``: a sparse file over the per-file limit appears in the tree, and the agent
  writes one over it through the file API, which must refuse it clearly. An export that meets
  the file refuses the tree (data, "over the limit"), and no object of the store is left half
  written (no temporary file, nothing over the limit).
* ``endless_command``: a real command that never ends and starts another in the background
  is killed at its deadline with its whole process group (no process of it left running).
* ``changes_once``, ``changes_always``: a file of the tree changes while an export reads it
  (``os.read`` appends to it on the first read of an open). Once: the next export meets one
  change, reads the file again and succeeds. Always (a process that keeps writing): every
  export from then on meets a change at every retry and reports ``TreeChanged``; a checkpoint
  that needs the tree fails the episode as data.

The lane runs the workload on one embedded host, takes the checkpoint at its time, resumes
and lets the host finish; then a second host restores the snapshot and plays every episode it
holds to its end. Verdict (``TreeReport.violations``): every row ends once on the first host,
completed with each turn's line in its tree once, or failed as data for a reason its own act
accounts for; every restored episode ends as it did on the first host; no act's rule broken.

Determinism: virtual time (``MockClock`` with autojump) and the seeded scheduling of
``determinism``. A real command's waits are no virtual time: the agent that runs the endless
command stops autojump (``autojump_threshold = inf``) while it starts, moves the clock past
the command's deadline itself once the command has reported its process group (through a
FIFO outside the tree), and turns autojump on again once the command is reaped. So no
deadline of another task passes during a real wait, and a seed replays exactly
(``TreeReport.fingerprint``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import select
import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import attrs
import orjson
import trio
import trio.testing

from gymckpt.gym_adapter import (
    Completed,
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    Failed,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.sandbox import (
    CommandLimits,
    Sandbox,
    SandboxPathError,
    TreeLimits,
)
from gymckpt.nurseries import ExitCode
from gymckpt.runtime import CheckpointMode, EpisodeRecord, InstanceRecord, ParticipantRecord

from .determinism import check_scheduling_hook, deterministic_scheduling

__all__ = [
    "TREE_ACTS",
    "TreeAct",
    "TreeReport",
    "TreeScenario",
    "draw_tree_scenario",
    "main_trees",
    "run_tree_scenario",
    "run_tree_seed",
    "summarise",
]

TREE_ACTS: Final = (
    "symlink_out",
    "enormous_file",
    "endless_command",
    "changes_once",
    "changes_always",
)
MAX_FILE_BYTES: Final = 1 << 16
"""The lane's per-file limit (an enormous file is one byte over it)."""
COMMAND_S: Final = 5.0
"""The deadline of the lane's commands, in virtual seconds."""
_FAR: Final = 1e9
_REASONS: Final = {  # a data failure each act accounts for, by what its message says
    "symlink_out": "resolve outside the tree",
    "enormous_file": "over the limit",
    "changes_always": "changed while it was hashed",
}


class LaneViolation(AssertionError):
    """An act's rule was broken where the agent could see it (the episode fails with this)."""


@attrs.frozen
class TreeAct:
    """``kind`` (one of ``TREE_ACTS``) strikes row ``row`` at turn ``turn``."""

    kind: str = attrs.field(validator=attrs.validators.in_(TREE_ACTS))
    row: int
    turn: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.row}:t{self.turn}"


@attrs.frozen
class TreeScenario:
    """What a seed draws (``draw_tree_scenario``)."""

    seed: int
    mode: CheckpointMode
    rows: int
    turns: int
    cut_at: float
    """Virtual seconds after the start at which the checkpoint is prepared."""
    acts: tuple[TreeAct, ...]

    def describe(self) -> str:
        acts = ", ".join(str(a) for a in self.acts)
        return (
            f"{self.rows} rows of {self.turns} turns, {self.mode.value} checkpoint at "
            f"{self.cut_at:.2f} s, acts {acts}"
        )


def draw_tree_scenario(seed: int) -> TreeScenario:
    """The scenario of ``seed``: a pure function of it (its own generator). At most one
    ``endless_command`` (it alone stops autojump)."""
    rng = random.Random(f"trees:{seed}")
    rows, turns = rng.randint(2, 4), rng.randint(2, 4)
    acts: list[TreeAct] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(TREE_ACTS)
        if kind == "endless_command" and any(a.kind == kind for a in acts):
            continue
        acts.append(TreeAct(kind, rng.randrange(rows), rng.randrange(turns)))
    mode = rng.choice((CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED))
    cut_at = round(rng.uniform(0.2, turns + 0.8), 3)
    return TreeScenario(seed, mode, rows, turns, cut_at, tuple(acts))


@attrs.frozen
class TreeReport:
    """A seed's verdict: ``violations`` (none: ok), what each row ended as on the first host
    (``outcomes``) and, restored, on the second (``restored``), how many acts struck, and a
    ``fingerprint`` of all of it (equal for two runs of one seed)."""

    seed: int
    scenario: TreeScenario
    violations: tuple[str, ...]
    outcomes: tuple[tuple[str, str], ...]
    restored: tuple[tuple[str, str], ...]
    fired: tuple[tuple[str, int], ...]
    mid_turn: int
    fingerprint: str

    @property
    def ok(self) -> bool:
        return not self.violations


# -- the lane's world -------------------------------------------------------------------------


@attrs.define(eq=False)
class _World:
    """What the acts share: the lane's directory, the file outside every tree, the trees
    armed for a change at their next export (by root), and what fired."""

    root: Path
    acts: tuple[TreeAct, ...]
    armed: dict[str, str] = attrs.field(factory=dict)
    fired: Counter[str] = attrs.field(factory=Counter)

    @property
    def outside(self) -> Path:
        return self.root / "outside" / "secret"

    def act_at(self, row: int, turn: int) -> list[str]:
        return [a.kind for a in self.acts if (a.row, a.turn) == (row, turn)]


class _Worker:
    """The lane's agent: each turn appends its line to ``log.txt``, does the acts of its row
    and turn, and works a virtual second; its payload is the log."""

    name, kind = "agent", "simple_agent"

    def __init__(self, world: _World, turns: int) -> None:
        self.world, self.turns = world, turns

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, Any]) -> Done | None:
        box = ctx.session("sandbox")
        if ctx.turn == self.turns:
            return Done(1.0, payload={"log": box.read("log.txt").decode()})
        box.append("log.txt", f"turn {ctx.turn}\n")
        for kind in self.world.act_at(ctx.info.row, ctx.turn):
            self.world.fired[kind] += 1
            await _ACTS[kind](self.world, box)
        await anyio.sleep(1.0)
        return None


async def _symlink_out(world: _World, box: Any) -> None:
    os.symlink(str(world.outside.parent), box.root / "out")
    for use in (lambda: box.read("out/secret"), lambda: box.write("out/secret", "owned")):
        try:
            use()
        except SandboxPathError:
            continue
        raise LaneViolation("the file API followed a symlink out of the tree")


async def _enormous_file(world: _World, box: Any) -> None:
    huge = box.root / "huge.bin"
    os.close(os.open(huge, os.O_WRONLY | os.O_CREAT, 0o644))
    os.truncate(huge, MAX_FILE_BYTES + 1)  # sparse: no disk used
    try:
        box.write("big.bin", b"x" * (MAX_FILE_BYTES + 1))
    except SandboxPathError as exc:
        if "over the sandbox's limit" not in str(exc):
            raise LaneViolation(f"a write over the limit was refused unclearly: {exc}") from exc
    else:
        raise LaneViolation("the file API wrote a file over the per-file limit")


async def _endless_command(world: _World, box: Any) -> None:
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock)
    ready = world.root / f"ready-{os.path.basename(box.root)}"
    os.mkfifo(ready)
    endless = f"sleep 1000 & echo $$ > {ready}; while :; do sleep 1; done"
    results: list[Any] = []

    async def run() -> None:
        results.append(await box.run(["sh", "-c", endless]))

    clock.autojump_threshold = math.inf  # no deadline passes during a real wait
    started = trio.current_time()  # and the command's deadline is this plus COMMAND_S
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            pgid = int(await trio.to_thread.run_sync(_read_fifo, ready))
            await spawned()
            clock.jump(started + COMMAND_S - trio.current_time())  # its deadline passes
    finally:
        clock.autojump_threshold = 0
    [result] = results
    alive = _group_alive(pgid)
    if not result.timed_out or result.returncode is not None or alive:
        raise LaneViolation(
            f"the endless command was not killed at its deadline with its group: "
            f"{result.as_plain()}, still running {alive}"
        )


async def _changes_once(world: _World, box: Any) -> None:
    box.write("noise.txt", "changes once\n")
    world.armed[str(box.root)] = "changes_once"


async def _changes_always(world: _World, box: Any) -> None:
    box.write("noise.txt", "changes always\n")
    world.armed[str(box.root)] = "changes_always"


_ACTS: Final = {
    "symlink_out": _symlink_out,
    "enormous_file": _enormous_file,
    "endless_command": _endless_command,
    "changes_once": _changes_once,
    "changes_always": _changes_always,
}


async def spawned() -> None:
    """Return once every process started through ``trio.to_thread`` (``open_process`` starts
    them there) is back in its task and every task is blocked: a command that has written to
    its FIFO is then inside its deadline's cancel scope. (The thread that started it may hand
    it back after the command's first write: moving the clock before that would put the
    deadline after the jump.)"""
    limiter = trio.to_thread.current_default_thread_limiter()
    while limiter.statistics().borrowed_tokens:  # a thread's result not yet delivered
        await trio.lowlevel.checkpoint()
    await trio.testing.wait_all_tasks_blocked()


def _read_fifo(path: Path) -> str:
    """The line a command writes to FIFO ``path``, within a real-time bound (a writer of our
    own keeps the FIFO from reading as ended before the command opens it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        data = b""
        while not data.endswith(b"\n"):
            if not select.select([fd], [], [], 30.0)[0]:
                raise LaneViolation(f"the command never wrote to {path}")
            data += os.read(fd, 64)
        return data.decode()
    finally:
        os.close(keep)
        os.close(fd)


def _group_alive(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still running, each waited for first within a
    real-time bound (a SIGKILLed process takes a moment to die; a zombie is dead), then
    killed: reported, never left behind."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid or fields[0] == "Z":
            continue
        try:
            fd = os.pidfd_open(int(entry))
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], 20.0)[0]:
                alive.append(int(entry))
                os.kill(int(entry), signal.SIGKILL)  # reported; not left behind
        finally:
            os.close(fd)
    return alive


@contextmanager
def _changing(path: Path, always: bool) -> Iterator[None]:
    """While open, the first ``os.read`` of each open of file ``path`` appends to it first
    (``always``: every open; else the first only): a file changing while it is hashed."""
    real_read = os.read
    struck = [0]

    def read(fd: int, n: int) -> bytes:
        if (always or not struck[0]) and _names(fd, path) and os.lseek(fd, 0, os.SEEK_CUR) == 0:
            struck[0] += 1  # the first read of this open (a retry opens the file again)
            with open(path, "ab") as f:
                f.write(b"more\n")
        return real_read(fd, n)

    os.read = read
    try:
        yield
    finally:
        os.read = real_read


def _names(fd: int, path: Path) -> bool:
    """Whether open file ``fd`` is ``path``."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


@attrs.define(eq=False)
class _ChangingSandbox:
    """The lane's sandbox participant: a ``Sandbox`` whose export of an armed tree meets a
    file changing while it is read (``_changing``)."""

    inner: Sandbox
    world: _World
    name: str = "sandbox"
    kind: str = "environment"

    def __getattr__(self, name: str) -> Any:  # any hook a host looks for: the sandbox's own
        return getattr(self.inner, name)

    def open(self, info: EpisodeInfo) -> Any:
        return self.inner.open(info)

    def export(self, state: Any) -> Any:
        kind = self.world.armed.get(str(state.root))
        if kind == "changes_once":
            del self.world.armed[str(state.root)]
        if kind is None:
            return self.inner.export(state)
        self.world.fired[f"{kind}:export"] += 1
        with _changing((state.root / "noise.txt").resolve(), always=kind == "changes_always"):
            return self.inner.export(state)

    def restore(self, data: Any) -> Any:
        return self.inner.restore(data)


# -- a seed -----------------------------------------------------------------------------------


def _environment(world: _World, turns: int) -> Environment:
    template = world.root / "template"
    template.mkdir()
    (template / "log.txt").write_text("")
    world.outside.parent.mkdir()
    world.outside.write_text("outside\n")
    sandbox = Sandbox(
        template,
        world.root / "gym",
        limits=TreeLimits(max_file_bytes=MAX_FILE_BYTES),
        commands=CommandLimits(timeout_s=COMMAND_S),
    )
    return Environment(
        agent=_Worker(world, turns), participants=(_ChangingSandbox(sandbox, world),)
    )


async def _collect(stream: Any, into: dict[str, RunReply]) -> None:
    async for batch in stream:
        for r in batch:
            if r.rollout_id in into:
                raise LaneViolation(f"{r.rollout_id} replied twice")
            into[r.rollout_id] = r


def _records(commit: Any) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    record = InstanceRecord(
        commit.instance,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in commit.participants
        ),
    )
    episodes = [
        EpisodeRecord(e.rollout_id, e.owner, commit.instance, e.capture_keys)
        for e in commit.exported
    ]
    return record, episodes


async def run_tree_scenario(sc: TreeScenario, root: Path) -> TreeReport:
    """Run ``sc`` under ``root`` (needs a trio run on a ``MockClock`` with autojump) and judge
    it (see the module docstring)."""
    world = _World(root, sc.acts)
    env = _environment(world, sc.turns)
    first: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, work_dir=root / "first") as host:
        async with trio.open_nursery() as nursery:
            for row in range(sc.rows):
                stream = await host.run([RunRow(f"{row}-0", row, 0, 0)])
                nursery.start_soon(_collect, stream, first)
            await trio.sleep(sc.cut_at)
            await host.prepare("c1", _FAR, sc.mode)
            commit = await host.commit("c1", str(root / "snap"), _FAR)
            await host.resume("c1", _FAR)
    record, episodes = _records(commit)
    restored: dict[str, RunReply] = {}
    async with GymHost("gym-0", env, work_dir=root / "second") as fresh:
        await fresh.restore(str(root / "snap"), record, episodes, _FAR)
        claims = [
            RunRow(f"{e.rollout_id}-a1", int(e.rollout_id.split("-")[0]), 0, 1, e.rollout_id)
            for e in episodes
        ]
        if claims:
            await _collect(await fresh.run(claims), restored)
    return _judge(sc, world, first, restored, commit.mid_turn)


def _outcome(reply: RunReply | None) -> str:
    """A reply as the fingerprint and the verdict see it (no paths: they hold random names)."""
    if isinstance(reply, Completed):
        return "completed:" + orjson.dumps(reply.payload, option=orjson.OPT_SORT_KEYS).decode()
    if isinstance(reply, Failed):
        why = [k for k, says in _REASONS.items() if says in reply.message]
        return f"failed:{reply.failure_class}:{','.join(why) or reply.message}"
    return "none"


def _judge(
    sc: TreeScenario,
    world: _World,
    first: dict[str, RunReply],
    restored: dict[str, RunReply],
    mid_turn: int,
) -> TreeReport:
    violations: list[str] = []
    log = "".join(f"turn {t}\n" for t in range(sc.turns))
    outcomes = tuple((f"{row}-0", _outcome(first.get(f"{row}-0"))) for row in range(sc.rows))
    for rid, got in outcomes:
        row = int(rid.split("-")[0])
        kinds = {a.kind for a in sc.acts if a.row == row}
        if got.startswith("failed:data:") and set(got.split(":")[2].split(",")) <= kinds:
            continue
        if got != "completed:" + orjson.dumps({"log": log}).decode():
            violations.append(f"row {row} ({', '.join(sorted(kinds)) or 'no act'}): {got}")
    again = tuple(sorted((rid, _outcome(r)) for rid, r in restored.items()))
    for rid, got in again:
        before = dict(outcomes).get(rid.rsplit("-a", 1)[0])
        if got != before:
            violations.append(f"restored {rid} ended {got}, the first host's {before}")
    violations += _store_problems(world.root)
    if world.outside.read_text() != "outside\n":
        violations.append("the file outside every tree was changed through a symlink")
    fired = tuple(sorted(world.fired.items()))
    digest = hashlib.sha256(orjson.dumps([outcomes, again, fired, mid_turn])).hexdigest()
    return TreeReport(sc.seed, sc, tuple(violations), outcomes, again, fired, mid_turn, digest)


def _store_problems(root: Path) -> list[str]:
    """Objects left half written (temporary files) or stored over the per-file limit, and
    half-built trees, anywhere in the sandboxes' homes."""
    problems = []
    for home in (root / "gym" / "sandbox").iterdir():
        for dirpath, dirnames, filenames in os.walk(home):
            here = Path(dirpath)
            if here.parent.name == "trees" or here.name == "trees":
                dirnames[:] = [d for d in dirnames if d.startswith(".")]
                problems += [f"half-built tree {here / d}" for d in dirnames]
                dirnames[:] = []
                continue
            for name in filenames:
                path = here / name
                if name.endswith(".tmp"):
                    problems.append(f"object left half written: {path}")
                elif path.stat().st_size > MAX_FILE_BYTES:
                    problems.append(f"object over the limit stored: {path}")
    return problems


def run_tree_seed(seed: int, tmp_root: Path | None = None) -> TreeReport:
    """The scenario of ``seed`` in its own trio run under a MockClock, its tasks scheduled as a
    function of the seed; its files removed after."""
    sc = draw_tree_scenario(seed)
    with deterministic_scheduling(seed):
        root = Path(tempfile.mkdtemp(prefix=f"gymckpt-trees-{seed}-", dir=tmp_root))
        try:
            clock = trio.testing.MockClock(autojump_threshold=0)
            try:
                return trio.run(run_tree_scenario, sc, root, clock=clock)
            except Exception as exc:  # the lane itself broke: report, never hide
                return TreeReport(
                    seed, sc, (f"lane crashed: {type(exc).__name__}: {exc}",), (), (), (), 0, ""
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)


def summarise(reports: Sequence[TreeReport]) -> dict[str, Any]:
    """What ``gymckpt simulate --trees`` prints: seeds, failures, acts fired, outcomes."""
    fired: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for r in reports:
        fired.update(dict(r.fired))
        ends.update(
            o.split(":")[0] + (":" + o.split(":")[2] if o.startswith("failed") else "")
            for _, o in r.outcomes
        )
    return {
        "seeds": len(reports),
        "passed": sum(r.ok for r in reports),
        "failed": [{"seed": r.seed, "violations": list(r.violations)} for r in reports if not r.ok],
        "acts_fired": dict(sorted(fired.items())),
        "row_ends": dict(sorted(ends.items())),
        "episodes_mid_turn": sum(r.mid_turn for r in reports),
        "restored": sum(len(r.restored) for r in reports),
        "fingerprint": hashlib.sha256("".join(r.fingerprint for r in reports).encode()).hexdigest(),
    }


def main_trees(
    seeds: int,
    start: int,
    as_json: bool,
    tmp_root: Path | None = None,
    progress: Any = None,
) -> int:
    """``gymckpt simulate --trees``: the lane's seeds ``start .. start+seeds-1``; exit 0, or 3
    when a seed broke a rule (each failing seed printed with its replay command)."""
    if seeds < 1 or start < 0:
        raise ValueError(f"--seeds must be >= 1 and --start >= 0, got {seeds} and {start}")
    check_scheduling_hook()
    quiet = logging.NullHandler()  # the episodes' failures are the lane's to report
    logging.getLogger("gymckpt").addHandler(quiet)
    try:
        reports = [
            _one_seed(seed, start, seeds, tmp_root, as_json, progress)
            for seed in range(start, start + seeds)
        ]
    finally:
        logging.getLogger("gymckpt").removeHandler(quiet)
    return _print_trees(reports, seeds, start, as_json)


def _one_seed(
    seed: int, start: int, seeds: int, tmp_root: Path | None, as_json: bool, progress: Any
) -> TreeReport:
    report = run_tree_seed(seed, tmp_root)
    if not report.ok and not as_json:
        print(
            f"seed {seed}: FAIL: {report.violations[0]}  replay: gymckpt simulate --trees "
            f"--seeds 1 --start {seed}",
            flush=True,
        )
    if progress is not None:
        progress(f"simulate --trees: {seed - start + 1}/{seeds} seeds")
    return report


def _print_trees(reports: Sequence[TreeReport], seeds: int, start: int, as_json: bool) -> int:
    summary = summarise(reports)
    if as_json:
        print(orjson.dumps({**summary, "trees": True, "start": start}).decode())
    else:
        if seeds == 1:
            r = reports[0]
            print(f"seed {r.seed}: {r.scenario.describe()}; rows {dict(r.outcomes)}")
        print(
            f"{seeds} tree seeds from {start}: {summary['passed']} passed, "
            f"{len(summary['failed'])} failed; acts fired {summary['acts_fired']}; rows ended "
            f"{summary['row_ends']}; {summary['episodes_mid_turn']} episodes cut mid-turn, "
            f"{summary['restored']} restored"
        )
    return ExitCode.INVARIANT if summary["failed"] else ExitCode.OK
