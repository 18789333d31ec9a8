"""Acceptance: a trainer with an LLM agent is SIGKILLed mid-turn while model calls to a real
OpenAI-compatible server process are in flight, and a new process restores. No call a
snapshot captured is asked of the server again; each replayed call's response and policy
version are the captured ones; a restored episode whose request changed fails closed."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gymckpt.gym_adapter import split_capture_key
from gymckpt.runtime import SnapshotStore, load_snapshot
from gymckpt.runtime._shared import (
    AgentRecords,
    StagedRecords,
    read_snapshot_records,
)
from gymckpt.testing.openai_server import OpenAITestServer, open_openai_test_server

pytestmark = pytest.mark.subprocess

KEY = "sk-test"


def _trainer(workdir: Path, server: OpenAITestServer, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gymckpt.testing.llm_agent",
        "--workdir",
        str(workdir),
        "--base-url",
        server.base_url,
        "--api-key",
        KEY,
        "--rows",
        "16",
        *extra,
    ]


def _staged(snapshot: Path) -> dict[str, list[Any]]:
    """rollout ID -> the model calls the snapshot captured for it."""
    snap = load_snapshot(snapshot)
    out: dict[str, list[Any]] = {}
    for inst in snap.manifest.instances:
        for part in inst.participants:
            if part.kind == "model_proxy":
                records = read_snapshot_records(snap.path, part.state_dir, StagedRecords)
                for e in records.staged:
                    out[e.rollout_id] = list(e.calls)
    return out


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _reasked(workdir: Path) -> set[str]:
    """The capture keys of the latest snapshot that a restore asks again: calls completed
    inside the turn an episode was cut in (its turn runs again from its boundary)."""
    snap = load_snapshot(SnapshotStore(workdir / "snapshots").list_complete()[-1].path)
    boundary: dict[str, int] = {}
    for inst in snap.manifest.instances:
        for part in inst.participants:
            if part.kind == "simple_agent":
                agent = read_snapshot_records(snap.path, part.state_dir, AgentRecords)
                for s in agent.sessions:
                    if s.step_boundary is not None:
                        boundary[s.rollout_id] = s.step_boundary
    return {
        c.key
        for rid, calls in _staged(snap.path).items()
        for c in calls
        if rid in boundary and split_capture_key(c.key)[1].startswith(f"t{boundary[rid]}-")
    }


def _kill_mid_turn(workdir: Path, server: OpenAITestServer, *extra: str) -> None:
    """Run the trainer until a checkpoint took episodes mid-turn, with model calls they had
    completed, then SIGKILL it while calls are in flight at the server."""
    proc = subprocess.Popen(
        _trainer(workdir, server, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seen = []
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()  # bounded by the test's timeout
            assert line, f"the trainer ended before a checkpoint took episodes mid-turn: {seen}"
            _, _cid, ok, mid = line.split()
            in_flight = server.stats()["in_flight"]
            seen.append((line.strip(), in_flight))
            if ok == "True" and int(mid) > 0 and in_flight > 0 and _reasked(workdir):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.timeout(300)
def test_sigkill_mid_turn_with_model_calls_in_flight_then_restore(tmp_path: Path) -> None:
    with open_openai_test_server(api_key=KEY, latency_s=0.3) as server:
        work = tmp_path / "work"
        _kill_mid_turn(work, server)
        latest = SnapshotStore(work / "snapshots").list_complete()[-1]
        staged = _staged(latest.path)
        captured = {c.key: c for calls in staged.values() for c in calls}
        reasked = _reasked(work)
        assert reasked and reasked <= set(captured)
        asked_before = server.stats()["by_capture_key"]
        assert all(asked_before[k] == 1 for k in captured)
        changed = tmp_path / "changed"
        shutil.copytree(work, changed)

        done = subprocess.run(
            _trainer(work, server), capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        asked = server.stats()["by_capture_key"]
        # no call the snapshot captured was asked again: each was asked once, before the crash
        assert {k: asked[k] for k in captured} == dict.fromkeys(captured, 1)

        journal = [orjson.loads(x) for x in (work / "journal.jsonl").read_bytes().splitlines()]
        replayed = 0
        for step in journal:
            for payload in step["payloads"]:
                for call in payload["calls"]:
                    if not call["replayed"] or call["key"] not in captured:
                        continue
                    original = captured[call["key"]]
                    assert call["request_digest"] == original.request_digest
                    assert call["policy_version"] == original.policy_version
                    assert call["response_digest"] == _digest(original.response)
                    replayed += 1
        assert replayed >= len(reasked), "restored episodes replayed captured calls"

        # the same snapshot, restored by an agent that asks differently: fails closed
        again = subprocess.run(
            _trainer(changed, server, "--changed-request"),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert again.returncode == 0, again.stderr[-3000:]
        refused = [ln for ln in again.stderr.splitlines() if "ended without asking again" in ln]
        assert refused, again.stderr[-3000:]
        digests = {captured[k].request_digest for k in reasked}
        assert any(any(d in ln for d in digests) for ln in refused)


@pytest.mark.timeout(300)
def test_sigkill_mid_turn_with_concurrent_calls_then_restore(tmp_path: Path) -> None:
    """The agent asks three calls at once each turn (a trio nursery; two identical): a restore
    answers every captured call from the capture, whatever order its calls start in, and none
    fails closed (start-order call ids failed about half of the restored episodes)."""
    with open_openai_test_server(api_key=KEY, latency_s=0.3) as server:
        work = tmp_path / "work"
        _kill_mid_turn(work, server, "--parallel")
        staged = _staged(SnapshotStore(work / "snapshots").list_complete()[-1].path)
        captured = {c.key: c for calls in staged.values() for c in calls}
        reasked = _reasked(work)
        assert reasked and reasked <= set(captured)
        before = server.stats()["requests"]
        asked_before = server.stats()["by_capture_key"]
        done = subprocess.run(
            _trainer(work, server, "--parallel"),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "ModelRequestChanged" not in done.stderr, done.stderr[-3000:]
        assert "ended without asking again" not in done.stderr, done.stderr[-3000:]
        stats = server.stats()
        assert {k: stats["by_capture_key"][k] for k in captured} == dict.fromkeys(captured, 1)
        journal = [orjson.loads(x) for x in (work / "journal.jsonl").read_bytes().splitlines()]
        calls = [c for step in journal for p in step["payloads"] for c in p["calls"]]
        replayed = [c for c in calls if c["replayed"] and c["key"] in reasked]
        assert {c["key"] for c in replayed} == reasked  # every call cut mid-turn, replayed
        for c in replayed:
            assert c["response_digest"] == _digest(captured[c["key"]].response)
        # after the restore the server was asked each call once, and never a captured one
        after = Counter(stats["by_capture_key"]) - Counter(asked_before)
        assert after and set(after.values()) == {1} and not set(after) & set(captured)
        assert stats["requests"] - before == after.total()
