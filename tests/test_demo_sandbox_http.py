"""``gymckpt demo --env sandbox:coding --backend http``: the coding agent's sandbox served by real
``gymckpt serve`` processes on loopback (one per instance, the demo's bearer token), through a
real SIGKILL of the trainer after its first checkpoint, in both checkpoint modes.

Phase 1's servers die with the trainer (the kernel's parent-death signal, a SIGKILL): their
sandbox trees stay on disk as the kill left them, later than the snapshot. Phase 2 starts fresh
servers on the same work directory, which build every restored session's tree from the
snapshot's manifest; each trained episode's final tree must be byte-identical to an
uninterrupted run's, each ``work.log`` line once. The second test also SIGKILLs a server while
the trainer lives (the trainer replaces it) before the trainer itself is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from gymckpt.app.demo.envs import SERVED_ENV, env_choice, served_environ, served_environment
from gymckpt.app.demo.journal import JOURNAL, read_journal
from gymckpt.app.demo.main import PUBLISHED, DemoOptions, _phase_cmd
from gymckpt.app.demo.verdict import run_report
from gymckpt.gym_adapter import EpisodeInfo
from gymckpt.gym_adapter.environments.sandbox import Sandbox

pytestmark = [pytest.mark.http, pytest.mark.subprocess]

ROWS = 24
READY = "gymckpt serve: instance {} serving at"
STOPPED = "gymckpt serve: signal 15, stopping"
INSTANCES = ("gym-0", "gym-1")


def serve_log(workdir: Path, instance: str) -> str:
    return (workdir / "gym-live" / f"{instance}.serve.log").read_text()


def restored_claims(workdir: Path) -> list[str]:
    """The episodes phase 2 continued from the snapshot (one dispatch each)."""
    lines = [orjson.loads(x) for x in (workdir / JOURNAL).read_bytes().splitlines()]
    return [x["restored_from"] for x in lines if "restored_from" in x]


def assert_each_episode_trained_once(workdir: Path) -> None:
    lineage, _ = read_journal(workdir / JOURNAL)
    trained = Counter((r, s) for x in lineage for r, s, _ in x["episodes"])
    assert sorted(trained) == [(r, s) for r in range(ROWS) for s in range(2)]
    assert set(trained.values()) == {1}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_the_coding_demo_over_http_survives_a_sigkill_with_trees_identical_to_an_uninterrupted_run(
    tmp_path: Path, mode: str
) -> None:
    w = tmp_path / "w"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gymckpt", "demo", "--json", "--workdir", str(w)),
            *("--backend", "http", "--env", "sandbox:coding", "--checkpoint-mode", mode),
            *("--rows", str(ROWS), "--group-size", "2", "--checkpoint-every", "1"),
            *("--crash-after-checkpoint", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["backend"] == "http" and report["env"] == "sandbox:coding"
    assert report["exactly_once"] is True and report["trajectories_match"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["episodes"] == 2 * ROWS and report["trajectories_mismatched"] == 0
    assert_each_episode_trained_once(w)
    claims = restored_claims(w)  # phase 2 continued episodes the checkpoint held, once each
    assert claims and len(claims) == len(set(claims))
    for instance in INSTANCES:
        # phase 1's server was killed with the trainer, never stopped; phase 2's was stopped
        log = serve_log(w, instance)
        assert log.count(READY.format(instance)) == 2 and log.count(STOPPED) == 1, log
        assert log.index(STOPPED) > log.rindex(READY.format(instance)), log
    # the sandboxes lived in the deployment's work directory, inside the servers' state root
    trees = list((w / "gym-live" / "sandbox" / "sandbox" / "trees").iterdir())
    assert len(trees) >= 2 * ROWS + len(claims)


def server_pids(trainer: int, instance: str) -> list[int]:
    """The live ``gymckpt serve`` children of process ``trainer`` serving ``instance``."""
    pids = []
    for task in Path(f"/proc/{trainer}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:  # gone already
                continue
            if b"serve" in argv and instance.encode() in argv:
                pids.append(int(child))
    return pids


def wait_for_replacement(workdir: Path, proc: subprocess.Popen[bytes], within_s: float) -> None:
    """Until gym-0's log holds its second readiness line (the trainer's replacement served),
    failing if phase 1 ends first or ``within_s`` passes. The log is another process's file:
    read at intervals under a deadline."""
    deadline = time.monotonic() + within_s
    while serve_log(workdir, "gym-0").count(READY.format("gym-0")) < 2:
        assert proc.poll() is None, "phase 1 ended before it replaced the killed server"
        assert time.monotonic() < deadline, serve_log(workdir, "gym-0")
        time.sleep(0.05)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_server_sigkilled_and_replaced_then_the_trainer_sigkilled_restores_exactly_once(
    tmp_path: Path, mode: str
) -> None:
    """Phase 1 publishes checkpoint 1; the test SIGKILLs gym-0's server (its sandbox trees and
    episodes in flight lost for real), waits until the trainer serves gym-0 again (a
    replacement, ``--recover``), then SIGKILLs the trainer (its servers die with it). Phase 2
    restores and finishes: the verdict from files is exactly once, every tree as uninterrupted."""
    w = tmp_path / "w"
    w.mkdir()
    opts = DemoOptions(
        backend="http",
        env="sandbox:coding",
        checkpoint_mode=mode,
        rows=ROWS,
        group_size=2,
        checkpoint_every=1,
        crash_after_checkpoint=1,
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        _phase_cmd(opts, w, 1, 1), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if raw.startswith(PUBLISHED.encode()):
                break
        else:
            pytest.fail(f"phase 1 exited with {proc.wait()} before its checkpoint")
        (server,) = server_pids(proc.pid, "gym-0")
        os.kill(server, signal.SIGKILL)
        wait_for_replacement(w, proc, within_s=60)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    phase2 = subprocess.run(
        _phase_cmd(opts, w, 2, 0), stdin=subprocess.DEVNULL, capture_output=True, timeout=120
    )
    assert phase2.returncode == 0, phase2.stderr[-3000:]
    report = run_report(opts, w, True, t0)
    assert report["exactly_once"] is True and report["trajectories_match"] is True, report
    assert report["restores"] == 1 and report["episodes"] == 2 * ROWS
    assert_each_episode_trained_once(w)
    log = serve_log(w, "gym-0")  # phase 1's, its replacement, phase 2's (the one stopped)
    assert log.count(READY.format("gym-0")) == 3 and log.count(STOPPED) == 1, log


def test_a_served_demo_environment_keeps_its_sandbox_in_the_named_work_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choice = env_choice("sandbox:coding")
    assert choice is not None
    environ = served_environ(choice, tmp_path / "gym-live", None, None)
    monkeypatch.setenv(SERVED_ENV, environ[SERVED_ENV])
    env = served_environment()
    (sandbox,) = env.participants
    assert isinstance(sandbox, Sandbox)
    assert sandbox.work_dir == (tmp_path / "gym-live").resolve()
    assert sandbox.template == (tmp_path / "gym-live" / "coding-template").resolve()


def test_a_restarted_server_builds_a_restored_tree_from_the_manifest_not_the_one_left_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed after a checkpoint leaves its trees on disk, later than the snapshot; the
    server started in its place on the same work directory restores each session into a new
    tree built from the snapshot's manifest alone."""
    choice = env_choice("sandbox:coding")
    assert choice is not None
    environ = served_environ(choice, tmp_path / "gym-live", None, None)
    monkeypatch.setenv(SERVED_ENV, environ[SERVED_ENV])
    (killed,) = served_environment().participants
    assert isinstance(killed, Sandbox)
    box = killed.open(EpisodeInfo("", 3, 1, 0, 0, ""))
    box.append("work.log", "turn 0: return a * b -> fail\n")
    manifest = json.loads(json.dumps(killed.export(box)))  # what the checkpoint holds
    box.append("work.log", "turn 1: return a + b -> pass\n")  # work after it, on disk
    box.write("calc.py", "def add(a, b):\n    return a + b\n")
    (restarted,) = served_environment().participants  # a new process, the same work directory
    assert isinstance(restarted, Sandbox)
    restored = restarted.restore(manifest)
    assert restored.root != box.root and restored.root.parent == box.root.parent
    assert restored.read("work.log") == b"turn 0: return a * b -> fail\n"
    assert restored.manifest() == manifest


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "is not set: gymckpt demo --backend http sets it"),
        ("{", "is not JSON"),
        ('{"env": "sandbox:coding"}', "must be an object with keys"),
        (
            '{"env": "gymnasium:CartPole-v1", "work_dir": "w", "model_url": null, "model": null}',
            "does not run on --backend http",
        ),
    ],
)
def test_a_served_demo_environment_refuses_a_bad_setting_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str | None, message: str
) -> None:
    if value is None:
        monkeypatch.delenv(SERVED_ENV, raising=False)
    else:
        monkeypatch.setenv(SERVED_ENV, value)
    with pytest.raises(ValueError, match=message):
        served_environment()


def test_the_sandbox_runs_on_http_but_not_on_ray() -> None:
    assert DemoOptions(env="sandbox:coding", backend="http").backend == "http"
    with pytest.raises(ValueError, match="sandbox:ID runs on --backend embedded or http"):
        DemoOptions(env="sandbox:coding", backend="ray")
    with pytest.raises(ValueError, match="gymnasium:ID runs on --backend embedded"):
        DemoOptions(env="gymnasium:CartPole-v1", backend="http")
