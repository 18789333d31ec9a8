"""The trainer losing its Ray cluster (issue 15): one clear line, exit code 6
(``ExitCode.CLUSTER_LOST``), the last snapshot intact and verifiable, and a restart resumes
from it.

The cluster is a real ``ray start --head --block`` in a temporary directory of its own; the
trainer is ``gymckpt demo --backend ray --ray-address ...`` (its phase process joins the
cluster). Once the first snapshot is published the head's GCS is killed with SIGKILL, which
takes the cluster down with it (``--block`` ends the head's other processes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from gymckpt.nurseries import ExitCode
from gymckpt.runtime import SnapshotStore
from gymckpt.runtime._shared import SNAPSHOTS_DIR

pytestmark = [pytest.mark.ray, pytest.mark.subprocess, pytest.mark.timeout(300)]

ROWS = 200


def no_auth() -> dict[str, str]:
    """The environment of the head and its clients: no token authentication (a head's token
    would live in its own temp dir, where no client looks for it; and a process that started
    a local cluster, as this one may have, has ``RAY_AUTH_MODE=token`` set for its children)."""
    return {**os.environ, "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Head:
    """One ``ray start --head --block`` cluster (a single node) in a temp dir of its own."""

    def __init__(self) -> None:
        import psutil

        # short: Ray's socket paths live under it
        self.temp_dir = tempfile.mkdtemp(prefix="gr", dir="/tmp")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--block",
                f"--port={_free_port()}",
                "--num-cpus=2",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
                f"--object-store-memory={100 * 2**20}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            env=no_auth(),
        )
        self._ps = psutil.Process(self.proc.pid)
        # `ray start --block` says when the head is up, then blocks: wait for that line (an
        # event), reading its output to the end in a thread so the pipe never fills
        self.output: list[str] = []
        self._up = threading.Event()
        self._reader = threading.Thread(target=self._read, name="ray-head-output", daemon=True)
        self._reader.start()
        if not self._up.wait(timeout=60):
            raise AssertionError("the Ray head did not start in 60 s:\n" + "".join(self.output))
        recorded = Path(self.temp_dir) / "ray_current_cluster"  # not Ray's shared temp dir
        assert recorded.exists() and self._named("raylet"), "".join(self.output)
        self.address = recorded.read_text().strip()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "will now block" in line:
                self._up.set()

    def _processes(self) -> list[Any]:
        import psutil

        with suppress(psutil.NoSuchProcess):
            return list(self._ps.children(recursive=True))
        return []

    def _named(self, name: str) -> list[Any]:
        return [p for p in self._processes() if name in p.name()]

    def kill_gcs(self) -> None:
        (gcs,) = self._named("gcs_server")
        gcs.kill()

    def stop(self) -> None:
        import psutil

        left = self._processes()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for proc in left:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        self._reader.join(timeout=20)  # the pipe's writers are all gone now
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture
def ray_head() -> Iterator[Callable[[], Head]]:
    """Start heads on demand; every one is stopped at the end."""
    heads: list[Head] = []

    def start() -> Head:
        heads.append(Head())
        return heads[-1]

    try:
        yield start
    finally:
        for head in heads:
            head.stop()


def gymckpt(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymckpt", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        env=no_auth(),
    )


def our_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gymckpt")]


def test_the_trainer_losing_its_cluster_stops_with_one_line_and_a_restart_resumes(
    ray_head: Callable[[], Head], tmp_path: Path
) -> None:
    from gymckpt.app.demo.main import DemoOptions, verdict

    head = ray_head()
    workdir = tmp_path / "w"
    store = SnapshotStore(workdir / SNAPSHOTS_DIR)
    # the demo's own progress line says its first snapshot is published (an event, read as the
    # lines come; the reader keeps draining, so the pipe never fills)
    lines: list[str] = []
    published = threading.Event()
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--backend",
            "ray",
            "--ray-address",
            head.address,
            "--rows",
            str(ROWS),
            "--crash-after-checkpoint",
            "0",
            "--workdir",
            str(workdir),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=no_auth(),
    ) as demo:

        def read_stderr() -> None:
            assert demo.stderr is not None
            for line in demo.stderr:
                lines.append(line.rstrip("\n"))
                if line.startswith("[phase 1] checkpoint") and ": ok" in line:
                    published.set()
            published.set()  # the demo ended: the assertions below say how

        reader = threading.Thread(target=read_stderr, name="demo-stderr", daemon=True)
        reader.start()
        try:
            if not published.wait(timeout=120):
                raise AssertionError("no snapshot published in 120 s:\n" + "\n".join(lines))
            assert demo.poll() is None and store.latest_complete() is not None, (
                "the demo finished before its cluster was lost:\n" + "\n".join(lines[-40:])
            )
            t0 = time.monotonic()
            head.kill_gcs()
            demo.wait(timeout=120)
            reader.join(timeout=30)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
    stderr = "\n".join(lines)
    stopped_s = time.monotonic() - t0
    assert demo.returncode == ExitCode.CLUSTER_LOST, stderr[-3000:]
    lines = our_lines(stderr)
    assert len(lines) == 1 and "lost the Ray cluster" in lines[0], stderr[-3000:]
    assert stopped_s < 45  # well before Ray's client would end the process (60 s)

    latest = store.latest_complete()
    assert latest is not None
    verified = gymckpt("verify", str(latest.path))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    head = ray_head()  # the cluster is back (a new one): the trainer resumes
    opts = DemoOptions(backend="ray", rows=ROWS, crash_after_checkpoint=0, ray_address=head.address)
    resumed = gymckpt(
        "_phase", "--phase", "2", "--workdir", str(workdir), "--options", opts.to_json()
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    phase2 = json.loads((workdir / "phase-2.json").read_text())
    assert phase2["restored"] is not None
    journal = [json.loads(line) for line in (workdir / "journal.jsonl").read_text().splitlines()]
    restores = [r["snapshot"] for r in journal if "restore_to_step" in r]
    assert restores == [latest.checkpoint_id]  # from the snapshot the lost run left
    report = verdict(opts, workdir, [phase2])
    assert report["exactly_once"] is True, report
    assert report["rows_trained"] == ROWS


def test_an_address_where_no_cluster_answers_is_one_line_not_a_60s_hang(
    ray_head: Callable[[], Head], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    t0 = time.monotonic()
    done = gymckpt(
        "demo",
        "--backend",
        "ray",
        "--ray-address",
        address,
        "--rows",
        "8",
        "--workdir",
        str(tmp_path / "w"),
        "--json",
        timeout=60,
    )
    assert done.returncode == ExitCode.CLUSTER_LOST, done.stderr[-3000:]
    lines = our_lines(done.stderr)
    assert (
        len(lines) == 1
        and f"cannot reach the Ray cluster: nothing answers at {address}" in lines[0]
    ), done.stderr[-3000:]
    assert time.monotonic() - t0 < 40  # Ray's client alone would try for 60 s, then exit 1
