"""``gymckpt bench sandbox``: what a checkpoint of many sandboxes writes, full against
incremental, in one run; the boundary mark's cost against the size of the change; the restore
time per sandbox.

The run: ``--sessions`` (1,000) sandbox sessions of one generated template (about 1,000 files,
~20 MB: many small source files, a few large data files), each an episode on an embedded
``GymHost`` (the real host: its boundary marks, its unaligned cut, its commit writing the
participants' records under ``snaps/<checkpoint>/``). Checkpoint 1 is taken once every episode
has passed its first step boundary; then each episode edits 1 % of its tree's files (small
edits of source files, content unique per session) and passes another boundary; checkpoint 2.

Bytes written per checkpoint, two figures for each:

* ``full``: what a snapshot writes when every tree is written whole: the bytes of every file
  each session's tree holds, plus a whole-tree record per session (its version-1 state's JSON);
  computed from the trees, never written (20 GB at full size).
* ``incremental``: the bytes actually written since the previous checkpoint (since the host
  started, for the first), measured on disk: the sizes of the files whose inodes are new under
  the snapshot root (``snaps/``: records, and the objects a host that keeps participant objects
  links or writes) and under the sandbox's object store (new file contents and base trees,
  written by the marks and the commit's export). A hard link to an inode that was there before
  writes nothing and counts nothing: an object the host links from the sandbox's store into
  the snapshot counts once, as the store's (``object_bytes``); ``snapshot_bytes`` is then the
  records (their index and chunks).

The target's ratio is ``second incremental / first full``; ``second / first incremental`` is
reported beside it (the first checkpoint's incremental figure holds the template once, so with
unique edits in every session the second can be larger than the first).

The mark (``mark``): one session outside the host, ``k`` files of it edited (``k`` in
``--mark-changes``), then, once the edits are older than the scanner's racily-clean window (a
file written within a second of a mark is hashed again at the next), the time of ``export`` plus
the state's serialisation, as a boundary mark does it; the files it hashed. ``restore``: the
time of ``Sandbox.restore`` of a checkpoint-2 state (rebuild, check, materialise the tree) per
sandbox, for ``--restores`` sessions.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from gymckpt.gym_adapter import (
    Completed,
    Done,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    GymHost,
    RunRow,
)
from gymckpt.gym_adapter._shared import RACY_NS
from gymckpt.gym_adapter.environments.sandbox import Sandbox, SandboxSession, TreeLimits
from gymckpt.runtime import CheckpointMode

from ._common import Progress

__all__ = ["SandboxBenchConfig", "run_sandbox", "write_template"]

_FAR = 1e12
_LARGE_FILES = 4
"""How many large data files the template holds; the rest are small source files."""


@attrs.define
class SandboxBenchConfig:
    """The sizes measured (``quick_defaults``: a smoke run of seconds)."""

    sessions: int = 1000
    template_bytes: int = 20 << 20
    template_files: int = 1000
    changed_fraction: float = 0.01
    mark_changes: tuple[int, ...] = (0, 1, 10, 100)
    mark_repeats: int = 5
    restores: int = 10
    work_dir: Path | None = None
    """Where the trees and snapshots go (a temporary directory, removed after, when None)."""

    @classmethod
    def quick_defaults(cls) -> SandboxBenchConfig:
        return cls(
            sessions=8,
            template_bytes=1 << 20,
            template_files=100,
            mark_changes=(0, 1, 10),
            mark_repeats=1,
            restores=2,
        )

    def check(self) -> None:
        """``ValueError`` naming the setting that cannot run."""
        if self.sessions < 1 or self.template_files < _LARGE_FILES + 10:
            raise ValueError("--sessions must be >= 1 and the template hold >= 14 files")
        if max(self.mark_changes, default=0) > self.template_files - _LARGE_FILES:
            raise ValueError("--mark-changes: more files than the template's source files")
        if self.restores < 1 or self.restores > self.sessions:
            raise ValueError("--restores must be between 1 and --sessions")


def write_template(root: Path, files: int, total_bytes: int, seed: int = 0) -> dict[str, Any]:
    """A repository-like template at ``root``: ``files - 4`` small source files (log-normal
    sizes, a few KB, in 10 x 5 package directories) holding ~25 % of ``total_bytes``, and 4
    large data files holding the rest. Its sources (relative paths) and sizes."""
    rng = random.Random(seed)
    small = files - _LARGE_FILES
    weights = [rng.lognormvariate(0, 0.8) for _ in range(small)]
    budget = total_bytes // 4
    sources: list[str] = []
    for i, w in enumerate(weights):
        rel = f"pkg{i % 10}/sub{(i // 10) % 5}/module_{i}.py"
        size = max(64, int(budget * w / sum(weights)))
        line = f"def f_{i}(x):  # a line of module {i}\n    return x + {i}\n"
        text = (line * (size // len(line) + 1))[:size]
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        sources.append(rel)
    (root / "data").mkdir(parents=True, exist_ok=True)
    large = (total_bytes - budget) // _LARGE_FILES
    for j in range(_LARGE_FILES):
        (root / "data" / f"blob_{j}.bin").write_bytes(rng.randbytes(large))
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return {"files": files, "bytes": size, "sources": sources}


@attrs.define(eq=False)
class _Phases:
    """What the episodes wait for and how far they got (counted per turn reached)."""

    sessions: int
    sources: list[str]
    edits: int
    edit: trio.Event = attrs.Factory(trio.Event)
    finish: trio.Event = attrs.Factory(trio.Event)
    reached: dict[int, int] = attrs.Factory(dict)
    all_reached: dict[int, trio.Event] = attrs.Factory(
        lambda: {turn: trio.Event() for turn in (1, 2)}
    )
    boxes: dict[str, SandboxSession] = attrs.Factory(dict)

    def arrive(self, turn: int) -> None:
        self.reached[turn] = self.reached.get(turn, 0) + 1
        if self.reached[turn] == self.sessions and turn in self.all_reached:
            self.all_reached[turn].set()


@attrs.define(eq=False)
class _Editor:
    """Turn 0 ends at once (a boundary: the mark checkpoint 1 takes); turn 1 waits for the
    edit phase, edits ``edits`` source files, ends (the mark checkpoint 2 takes); turn 2 waits
    for the finish."""

    phases: _Phases
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, Any]:
        return {}

    def export(self, state: Any) -> Any:
        return state

    def restore(self, data: Any) -> Any:
        return data

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        box = ctx.session("sandbox")
        p = self.phases
        p.boxes[ctx.info.session_key] = box
        p.arrive(ctx.turn)
        if ctx.turn == 1:
            await p.edit.wait()
            edit_files(box, p.sources, p.edits, ctx.info.row, ctx.info.session_key)
        elif ctx.turn == 2:
            await p.finish.wait()
            return Done(1.0)
        return None


def edit_files(box: SandboxSession, sources: list[str], count: int, seed: int, tag: str) -> None:
    """Append a line unique to ``tag`` to ``count`` of the source files (chosen by ``seed``)."""
    for rel in random.Random(seed).sample(sources, count):
        box.append(rel, f"# edited by session {tag}\n")


def _new_bytes(roots: list[Path], seen: set[tuple[int, int]]) -> tuple[int, int]:
    """The bytes and count of the regular files under ``roots`` whose inodes are not in
    ``seen`` (added to it): what was written since ``seen`` was taken."""
    total = count = 0
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                st = os.lstat(os.path.join(dirpath, name))
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_size
                    count += 1
    return total, count


def _full_bytes(boxes: dict[str, SandboxSession]) -> int:
    """What a snapshot writing every tree whole writes: every file each tree holds, and a
    whole-tree record (its version-1 state) per session."""
    total = 0
    for key, box in boxes.items():
        tree = box.tree()
        total += sum(e["size"] for e in tree.values() if e["kind"] == "file")
        total += len(orjson.dumps({"version": 1, "label": key, "tree": tree}))
    return total


async def _checkpoint(
    host: GymHost, name: str, work: Path, sandbox: Sandbox, seen: set[tuple[int, int]]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    await host.prepare(name, _FAR, CheckpointMode.UNALIGNED)
    reply = await host.commit(name, f"snaps/{name}", _FAR)
    wall = time.perf_counter() - t0
    await host.resume(name, _FAR)
    # the sandbox's store first: an object the host links into the snapshot is counted once,
    # where its bytes were written
    objects, object_files = _new_bytes([sandbox.objects.root], seen)
    snap, snap_files = _new_bytes([work / "snaps"], seen)
    return {
        "episodes": len(reply.exported),
        "commit_s": wall,
        "incremental_bytes": snap + objects,
        "snapshot_bytes": snap,
        "snapshot_files": snap_files,
        "object_bytes": objects,
        "object_files": object_files,
    }


async def _run_host(
    cfg: SandboxBenchConfig, work: Path, sandbox: Sandbox, sources: list[str], progress: Progress
) -> dict[str, Any]:
    edits = max(1, round(cfg.template_files * cfg.changed_fraction))
    phases = _Phases(cfg.sessions, sources, edits)
    env = Environment(agent=_Editor(phases), participants=(sandbox,))
    seen: set[tuple[int, int]] = set()
    _new_bytes([work], seen)  # the template's files: not written by a checkpoint
    done: list[Any] = []

    async def collect(stream: Any) -> None:
        async for batch in stream:
            done.extend(batch)

    async with GymHost("gym-0", env, work_dir=work) as host, trio.open_nursery() as nursery:
        rows = [RunRow(f"{i}-0", i, 0, 0) for i in range(cfg.sessions)]
        nursery.start_soon(collect, await host.run(rows))
        await phases.all_reached[1].wait()
        progress(f"sandbox: {cfg.sessions} sessions open; checkpoint 1")
        first = await _checkpoint(host, "c1", work, sandbox, seen)
        first["full_bytes"] = _full_bytes(phases.boxes)
        phases.edit.set()
        await phases.all_reached[2].wait()
        progress(f"sandbox: {edits} file(s) of each tree edited; checkpoint 2")
        second = await _checkpoint(host, "c2", work, sandbox, seen)
        second["full_bytes"] = _full_bytes(phases.boxes)
        states = [sandbox.export(phases.boxes[k]) for k in sorted(phases.boxes)[: cfg.restores]]
        phases.finish.set()
    completed = sum(isinstance(r, Completed) for r in done)
    return {"edits": edits, "first": first, "second": second, "states": states, "done": completed}


def _mark_costs(cfg: SandboxBenchConfig, sandbox: Sandbox, sources: list[str]) -> list[Any]:
    """Per ``k`` in ``mark_changes``: the median time of a mark (export + serialisation) with
    ``k`` files changed since the last, and the files it hashed."""
    box = sandbox.open(EpisodeInfo("mark-0", 0, 0, 0, 0, "gym-0"))
    sandbox.export(box)
    rows = []
    for k in cfg.mark_changes:
        times, hashed = [], []
        for rep in range(cfg.mark_repeats):
            edit_files(box, sources, k, 1000 * k + rep, f"mark-{k}-{rep}")
            time.sleep(RACY_NS / 1e9 + 0.05)  # the edits are older than the racy window
            before = box.scanner.hashed
            t0 = time.perf_counter_ns()
            orjson.dumps(sandbox.export(box))
            times.append((time.perf_counter_ns() - t0) / 1e6)
            hashed.append(box.scanner.hashed - before)
        rows.append(
            {"changed_files": k, "mark_ms_median": statistics.median(times), "hashed": hashed}
        )
    return rows


def _restore_costs(sandbox: Sandbox, states: list[Any]) -> list[float]:
    times = []
    for state in states:
        t0 = time.perf_counter_ns()
        box = sandbox.restore(state)
        times.append((time.perf_counter_ns() - t0) / 1e6)
        shutil.rmtree(box.root)
    return times


def run_sandbox(cfg: SandboxBenchConfig, progress: Progress) -> dict[str, Any]:
    """The whole benchmark (module docstring); its result as plain data."""
    cfg.check()
    if cfg.work_dir is not None:
        Path(cfg.work_dir).mkdir(parents=True, exist_ok=True)  # --dir: made if missing
    with tempfile.TemporaryDirectory(dir=cfg.work_dir, prefix="gymckpt-bench-sandbox-") as tmp:
        work = Path(tmp)
        template = work / "template"
        info = write_template(template, cfg.template_files, cfg.template_bytes)
        limits = TreeLimits(max_tree_bytes=max(1 << 30, 2 * info["bytes"]))
        sandbox = Sandbox(template, work, limits=limits)
        progress(f"sandbox: template of {info['files']} files, {info['bytes']} bytes")
        t0 = time.perf_counter()
        ran = trio.run(_run_host, cfg, work, sandbox, info["sources"], progress)
        host_s = time.perf_counter() - t0
        progress("sandbox: the mark's cost against the size of the change")
        marks = _mark_costs(cfg, sandbox, info["sources"])
        restores = _restore_costs(sandbox, ran["states"])
        shutil.rmtree(work / "sandbox" / sandbox.name / "trees", ignore_errors=True)
    first, second = ran["first"], ran["second"]
    return {
        "sessions": cfg.sessions,
        "template_files": info["files"],
        "template_bytes": info["bytes"],
        "changed_files_per_session": ran["edits"],
        "changed_fraction": ran["edits"] / info["files"],
        "completed": ran["done"],
        "host_run_s": host_s,
        "first": first,
        "second": second,
        "second_incremental_over_first_full": second["incremental_bytes"] / first["full_bytes"],
        "second_over_first_incremental": second["incremental_bytes"]
        / max(1, first["incremental_bytes"]),
        "second_incremental_over_second_full": second["incremental_bytes"] / second["full_bytes"],
        "mark": marks,
        "restore_ms": restores,
        "restore_ms_median": statistics.median(restores),
    }
