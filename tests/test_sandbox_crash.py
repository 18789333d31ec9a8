"""Acceptance: a trainer process whose agent works in a sandbox (a captured search step, a line
appended to a file and a command run each turn) is SIGKILLed right after a checkpoint, in
either checkpoint mode, and a new process restores and finishes. The final trees are
byte-identical (the same manifest: digests, modes, links) to an uninterrupted run's, each
appended line and each command's line is in them once, and no captured step a snapshot holds
is asked again (the step appends to a log outside the sandbox)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gymckpt.gym_adapter.host._captured import arguments_digest
from gymckpt.runtime import SnapshotStore, load_snapshot
from gymckpt.runtime._shared import StagedRecords, read_snapshot_records

pytestmark = pytest.mark.subprocess

TURNS = 3
ROWS = 6
GROUP = 2

TRAINER = textwrap.dedent(
    f"""
    import json, os, signal, sys
    from pathlib import Path

    import gymckpt
    from gymckpt.runtime import RuntimeConfig
    from gymckpt.gym_adapter import Done, EmbeddedGym, Environment
    from gymckpt.gym_adapter.environments.sandbox import CommandLimits, Sandbox

    from gymckpt.runtime import load_snapshot
    from gymckpt.runtime._shared import StagedRecords, read_snapshot_records

    work, template, asked, results = (Path(a) for a in sys.argv[1:5])
    mode, crash = sys.argv[5], sys.argv[6] == "crash"

    def search(args):
        '''The outside world: every ask is logged (and fsynced) before it is answered.'''
        with asked.open("a") as f:
            f.write(json.dumps(args, sort_keys=True) + "\\n")
            f.flush()
            os.fsync(f.fileno())
        return {{"hit": "r%(row)d-s%(slot)d-t%(turn)d" % args}}

    def staged(path):
        snap = load_snapshot(path)
        return any(
            e.calls
            for inst in snap.manifest.instances
            for part in inst.participants
            if part.kind == "model_proxy"
            for e in read_snapshot_records(path, part.state_dir, StagedRecords).staged
        )

    class Coder:
        name, kind = "coder", "simple_agent"

        def open(self, info):
            return {{}}

        def export(self, state):
            return state

        def restore(self, data):
            return data

        async def step(self, ctx, state):
            box, info, turn = ctx.session("sandbox"), ctx.info, ctx.turn
            if turn == {TURNS}:
                return Done(1.0, payload={{
                    "row": info.row, "slot": info.slot, "tree": box.tree(),
                    "log": box.read("log.txt").decode(), "ran": box.read("ran.txt").decode(),
                }})
            args = {{"row": info.row, "slot": info.slot, "turn": turn}}
            hit = await ctx.captured_step("search", args, search)
            box.append("log.txt", "turn %d %s\\n" % (turn, hit["hit"]))
            r = await box.run(["sh", "-c", "sleep 0.4; echo ran >> ran.txt; wc -l < log.txt > n"])
            assert r.returncode == 0, r
            return None

    async def main():
        sandbox = Sandbox(template, work / "gym", commands=CommandLimits(timeout_s=60))
        env = Environment(agent=Coder(), participants=(sandbox,), model=lambda k, r, i: "-")
        config = RuntimeConfig(checkpoint_mode=mode)
        async with EmbeddedGym.host(env, instances=2) as gym:
            async with gymckpt.open_rollouts(
                gym, work, rows={ROWS}, group_size={GROUP}, max_rows_in_flight=4, config=config
            ) as ro:
                async for batch in ro.batches(groups_per_step=1):
                    with results.open("ab") as f:
                        for group in batch:
                            for r in group.results:
                                f.write(json.dumps(r.payload).encode() + b"\\n")
                        f.flush()
                        os.fsync(f.fileno())
                    if crash:
                        outcome = await ro.checkpoint(b"{{}}")
                        # killed after the first checkpoint that holds a captured step: one
                        # taken while every episode in flight was at its first boundary (a
                        # loaded machine) holds none, and would test nothing about them
                        if outcome.ok and outcome.episodes and staged(outcome.snapshot.path):
                            print("checkpointed", outcome.mid_turn, flush=True)
                            os.kill(os.getpid(), signal.SIGKILL)

    gymckpt.run(main)
    """
)


def _template(root: Path) -> Path:
    t = root / "template"
    (t / "src").mkdir(parents=True)
    (t / "src" / "app.py").write_text("print('hello')\n")
    (t / "log.txt").write_text("")
    (t / "ran.txt").write_text("")
    return t


def _run(tmp: Path, name: str, mode: str, crash: bool) -> subprocess.CompletedProcess[str]:
    script = tmp / "trainer.py"
    script.write_text(TRAINER)
    work = tmp / name
    cmd = [
        sys.executable,
        str(script),
        str(work),
        str(tmp / "template"),
        str(tmp / f"{name}.asked"),
        str(tmp / f"{name}.results"),
        mode,
        "crash" if crash else "run",
    ]
    return subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150, check=False
    )


def _results(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for line in path.read_bytes().splitlines():
        r = orjson.loads(line)
        assert (r["row"], r["slot"]) not in out, f"row {r['row']} slot {r['slot']} trained twice"
        out[r["row"], r["slot"]] = r
    return out


def _staged_digests(snapshot: Path) -> list[str]:
    snap = load_snapshot(snapshot)
    out = []
    for inst in snap.manifest.instances:
        for part in inst.participants:
            if part.kind == "model_proxy":
                records = read_snapshot_records(snap.path, part.state_dir, StagedRecords)
                for e in records.staged:
                    out += [c.request_digest for c in e.calls]
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Any]:
    tmp = tmp_path_factory.mktemp("plain")
    _template(tmp)
    done = _run(tmp, "plain", "aligned", crash=False)
    assert done.returncode == 0, done.stderr
    return _results(tmp / "plain.results")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_sandbox_run_killed_after_a_checkpoint_finishes_as_if_never_killed(
    tmp_path: Path, mode: str, uninterrupted: dict[tuple[int, int], Any]
) -> None:
    _template(tmp_path)
    first = _run(tmp_path, "w", mode, crash=True)
    assert first.returncode == -9, first.stderr  # a real SIGKILL after the checkpoint
    assert "checkpointed" in first.stdout
    mid_turn = int(first.stdout.split()[1])
    snap = SnapshotStore(tmp_path / "w" / "snapshots").latest_complete()
    assert snap is not None
    captured = _staged_digests(snap.path)
    assert captured, "the snapshot holds captured steps"

    second = _run(tmp_path, "w", mode, crash=False)
    assert second.returncode == 0, second.stderr
    results = _results(tmp_path / "w.results")
    assert sorted(results) == sorted(uninterrupted)
    for key, r in results.items():
        assert r["tree"] == uninterrupted[key]["tree"], f"row {key}: trees differ"
        lines = [f"turn {t} r{key[0]}-s{key[1]}-t{t}" for t in range(TURNS)]
        assert r["log"].splitlines() == lines  # each appended line once, in order
        assert r["ran"] == "ran\n" * TURNS  # each command's line once
    asked = Counter(
        arguments_digest("search", orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS))
        for line in (tmp_path / "w.asked").read_bytes().splitlines()
    )
    for digest in captured:
        assert asked[digest] == 1, f"a captured step was asked {asked[digest]} times"
    assert len(asked) == ROWS * GROUP * TURNS  # and every step was asked
    if mode == "unaligned":  # episodes taken mid-command re-ran their turn on the restored tree
        assert mid_turn > 0
