"""In a training job: unique checkpoint ids, a full disk, one trainer per work directory,
preemption by SIGTERM/SIGINT. The process-level tests run real trainer programs."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.app.demo.main import DemoOptions
from gymckpt.gym_adapter import (
    EmbeddedGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import Rollouts, open_rollouts, snapshot_problems
from gymckpt.nurseries._calls import classify
from gymckpt.runtime import (
    CheckpointsFailed,
    ManifestError,
    RuntimeConfig,
    SnapshotStore,
    WorkDirLock,
    WorkDirLocked,
    _store,
    load_snapshot,
    runtime_config_from_toml,
)
from gymckpt.runtime._shared import COMMIT_MARKER, STEP_FILE

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=5.0,
    lease_s=30.0,
    max_consecutive_failures=2,
)


@asynccontextmanager
async def running(
    workdir: Path, gym_dir: Path, rows: int = 12, faults: tuple[str, ...] = (), **kw: Any
) -> AsyncIterator[Rollouts]:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=gym_dir,
        faults=faults,
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, workdir, rows=rows, group_size=2, config=CONFIG, max_rows_in_flight=6, **kw
        ) as ro:
            yield ro


def staging_dirs(workdir: Path) -> list[str]:
    return [p.name for p in (workdir / "snapshots").iterdir() if p.name.startswith(".staging")]


# -- checkpoint ids --------------------------------------------------------------------------


async def test_checkpoint_ids_are_unique_across_incarnations(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ids: list[str] = []
    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        ids += [(await ro.checkpoint()).checkpoint_id for _ in range(2)]
    # a new incarnation (restore) goes on from the last id, it does not restart at run-0001
    async with running(tmp_path / "w", tmp_path / "gym2") as ro:
        assert ro.restored is not None
        await trio.sleep(1)
        ids.append((await ro.checkpoint()).checkpoint_id)
    assert ids == ["run-0001", "run-0002", "run-0003"]


def test_reserved_checkpoint_seq_survives_a_lost_mark(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert [store.reserve_checkpoint_seq() for _ in range(3)] == [1, 2, 3]
    assert SnapshotStore(tmp_path).reserve_checkpoint_seq() == 4  # a new process goes on
    (tmp_path / "ckpt-000009").mkdir()  # published folders count even without the mark
    (tmp_path / ".checkpoint-seq").unlink()
    assert SnapshotStore(tmp_path).reserve_checkpoint_seq() == 10


# -- a full disk -----------------------------------------------------------------------------


def test_storage_errors_are_retryable_and_other_os_errors_are_not() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        assert classify(OSError(code, os.strerror(code))) == "snapshot_io"
    group = ExceptionGroup("commit", [OSError(errno.ENOSPC, "No space left on device")])
    assert classify(group) == "snapshot_io"
    assert classify(OSError(errno.EACCES, "Permission denied")) == "invariant"


async def test_enospc_while_publishing_is_a_failed_retryable_checkpoint(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    real_write = _store.write_atomic
    full = True

    def write_atomic(path: Path, data: bytes) -> None:
        if full and path.name == "gym_checkpoint.json":  # some files are written already
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, data)

    monkeypatch.setattr(_store, "write_atomic", write_atomic)
    workdir = tmp_path / "w"
    with caplog.at_level(logging.WARNING, logger="gymckpt"):
        async with running(workdir, tmp_path / "gym") as ro:
            await trio.sleep(1)
            first = await ro.checkpoint(b'{"step": 1}')
            assert not first.ok and first.reason == "snapshot_io"
            assert "No space left on device" in (first.error or "")
            assert staging_dirs(workdir) == []  # staging removed, nothing published
            assert ro.store.list_complete() == []
            assert ro.coordinator.consecutive_failures == 1
            assert ro.metrics.get("checkpoint/snapshot_io_total") == 1
            full = False
            again = await ro.checkpoint(b'{"step": 1}')
            assert again.ok and ro.coordinator.consecutive_failures == 0
            rows = [g.row for batch in [b async for b in ro.batches(2)] for g in batch]
            assert sorted(rows) == list(range(12))
    lines = [r.getMessage() for r in caplog.records if "snapshot_io" in r.getMessage()]
    assert len(lines) == 1
    assert str(workdir / "snapshots") in lines[0] and "bytes free" in lines[0]
    assert snapshot_problems(load_snapshot(again.snapshot.path)).all == []  # type: ignore[union-attr]


async def test_a_disk_that_stays_full_stops_the_run_naming_the_cause(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def write_atomic(path: Path, data: bytes) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(path))

    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        monkeypatch.setattr(_store, "write_atomic", write_atomic)
        for _ in range(CONFIG.max_consecutive_failures):
            assert (await ro.checkpoint()).reason == "snapshot_io"
        with pytest.raises(CheckpointsFailed, match=r"last \(snapshot_io\).*quota"):
            await ro.checkpoint()
        assert staging_dirs(tmp_path / "w") == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs (root only: ``mount -t tmpfs``); skipped where it cannot mount."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(ballast: Path) -> None:
    """Fill the file system holding ``ballast`` to the last byte."""
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_small_file_system_filling_mid_run(small_tmpfs: Path, tmp_path: Path) -> None:
    """Snapshots on a real 3 MiB tmpfs; a ballast file fills it between checkpoints."""
    workdir = small_tmpfs / "work"
    ballast = small_tmpfs / "ballast"
    outcomes: list[tuple[bool, str | None]] = []

    async def main() -> list[int]:
        trained: list[int] = []
        sim = CalendarConfig(turns=(1, 2), turn_s=(0.001, 0.005), mutation_p=1.0)
        async with EmbeddedGym.host(
            calendar_environment(config=sim),
            instances=2,
            seed=1,
            work_dir=tmp_path / "gym",
            config=sim.host_config(),
        ) as gym:
            async with open_rollouts(
                gym, workdir, rows=40, group_size=2, config=CONFIG, max_rows_in_flight=8
            ) as ro:
                async for batch in ro.batches(2):
                    trained += [g.row for g in batch]
                    step = ro.steps + 1
                    if step == 2:
                        assert (await ro.checkpoint(b"x" * 1000)).ok
                        fill(ballast)
                    if 3 <= step <= 4:  # the disk is full: failed, retryable
                        out = await ro.checkpoint(b"y" * 1000)
                        outcomes.append((out.ok, out.reason))
                    if step == 5:
                        ballast.unlink()  # space returns: the run goes on
                        out = await ro.checkpoint(b"z" * 1000)
                        outcomes.append((out.ok, out.reason))
        return trained

    trained = trio.run(main)
    assert sorted(trained) == list(range(40))
    assert outcomes == [(False, "snapshot_io"), (False, "snapshot_io"), (True, None)]
    assert staging_dirs(workdir) == []
    latest = SnapshotStore(workdir / "snapshots").latest_complete()
    assert latest is not None
    snap = load_snapshot(latest.path)
    assert snap.files["trainer.json"] == b"z" * 1000 and snapshot_problems(snap).all == []


# -- one trainer per work directory ----------------------------------------------------------


def test_work_dir_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    first = WorkDirLock(tmp_path)
    first.acquire()
    with pytest.raises(WorkDirLocked, match=rf"in use by process {os.getpid()}"):
        WorkDirLock(tmp_path).acquire()
    first.release()
    second = WorkDirLock(tmp_path)
    second.acquire()  # free again
    second.release()


TRAINER = textwrap.dedent("""
    import json, os, sys
    import trio
    import gymckpt
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment

    WORK, ROWS, HOLD = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
    SIM = CalendarConfig(turns=(1, 2), turn_s=(0.005, 0.02), mutation_p=0.5)

    async def main() -> None:
        async with gymckpt.EmbeddedGym.host(calendar_environment(config=SIM), instances=2,
                                            work_dir=WORK + "-gym",
                                            config=SIM.host_config()) as gym:
            async with gymckpt.open_rollouts(gym, WORK, rows=ROWS, group_size=2,
                                             checkpoint_every=3) as rollouts:
                state = json.loads(rollouts.trainer_state or b'{"step": 0}')
                print("holding", flush=True)
                if HOLD:
                    await trio.to_thread.run_sync(sys.stdin.readline)
                journal = open(os.path.join(WORK, "journal.jsonl"), "a")
                async for batch in rollouts.batches(
                        2, state=lambda: json.dumps(state).encode()):
                    await trio.sleep(0.05)  # train
                    state["step"] += 1
                    journal.write(json.dumps({"step": state["step"],
                                              "rows": [g.row for g in batch]}) + "\\n")
                    journal.flush()
                    os.fsync(journal.fileno())
                    print("step", state["step"], flush=True)

    gymckpt.run(main)
""")


TRAINER_ASYNCIO = textwrap.dedent("""
    import asyncio, json, os, sys
    import gymckpt.aio
    from gymckpt.gym_adapter.environments.calendar import CalendarConfig, calendar_environment

    WORK, ROWS = sys.argv[1], int(sys.argv[2])
    SIM = CalendarConfig(turns=(1, 2), turn_s=(0.005, 0.02), mutation_p=0.5)

    async def main() -> None:
        async with gymckpt.aio.open_embedded_gym(calendar_environment(config=SIM), instances=2,
                                                 seed=0, work_dir=WORK + "-gym",
                                                 config=SIM.host_config()) as gym:
            async with gymckpt.aio.open_rollouts(gym, WORK, rows=ROWS, group_size=2,
                                                 checkpoint_every=3) as rollouts:
                state = json.loads(rollouts.trainer_state or b'{"step": 0}')
                print("holding", flush=True)
                journal = open(os.path.join(WORK, "journal.jsonl"), "a")
                async for batch in rollouts.batches(
                        2, state=lambda: json.dumps(state).encode()):
                    await asyncio.sleep(0.05)  # train
                    state["step"] += 1
                    journal.write(json.dumps({"step": state["step"],
                                              "rows": [g.row for g in batch]}) + "\\n")
                    journal.flush()
                    os.fsync(journal.fileno())
                    print("step", state["step"], flush=True)

    gymckpt.aio.run(main)
""")


def _trainer(
    tmp_path: Path, work: Path, rows: int, hold: bool = False, flavor: str = "trio"
) -> subprocess.Popen[str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER if flavor == "trio" else TRAINER_ASYNCIO)
    return subprocess.Popen(
        [sys.executable, str(script), str(work), str(rows), "hold" if hold else "go"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _journal(work: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (work / "journal.jsonl").read_text().splitlines()]


@pytest.mark.subprocess
def test_a_second_trainer_on_the_same_work_dir_fails_at_start(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = _trainer(tmp_path, work, rows=12, hold=True)
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline() == "holding\n"
        second = _trainer(tmp_path, work, rows=12)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        # the program enters its embedded Gym (work_dir WORK-gym) before open_rollouts takes
        # the trainer's lock: the Gym's instance directory refuses it first, before its host
        # opens (and, starting afresh, would cut) the first one's journal of retained sessions
        gym_dir = Path(f"{work}-gym") / "gym-0"
        assert err.strip().splitlines() == [
            f"gymckpt: error: instance directory {gym_dir} is in use by process {first.pid}; "
            "one Gym instance (gymckpt serve, or a host with this work_dir) per instance "
            "directory — stop that one, or give this one another work directory (--work-dir) "
            "or instance name (--instance)"
        ]
        assert "holding" not in out
        first.stdin.write("\n")
        first.stdin.flush()
        _out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, err  # the first one is unharmed
    rows = [r for entry in _journal(work) for r in entry["rows"]]
    assert sorted(rows) == list(range(12))


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("flavor", "sig"),
    [("trio", signal.SIGTERM), ("trio", signal.SIGINT), ("asyncio", signal.SIGTERM)],
)
def test_preemption_takes_a_final_snapshot_and_a_rerun_trains_every_step_once(
    tmp_path: Path, flavor: str, sig: signal.Signals
) -> None:
    work = tmp_path / "work"
    rows = 60
    first = _trainer(tmp_path, work, rows, flavor=flavor)
    try:
        assert first.stdout is not None
        assert first.stdout.readline() == "holding\n"
        line = first.stdout.readline()
        while line != "step 4\n":  # mid-run: some steps done, between two checkpoints
            assert line.startswith("step"), line
            line = first.stdout.readline()
        first.send_signal(sig)
        _out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gymckpt: {sig.name}: stopped after step")
    journal = _journal(work)
    steps = len(journal)
    assert steps < rows // 2  # it really stopped early
    latest = SnapshotStore(work / "snapshots").latest_complete()
    assert latest is not None and str(latest.path) in lines[0]
    snap = load_snapshot(latest.path)
    # the final snapshot holds every finished step
    assert json.loads(snap.files["trainer.json"]) == {"step": steps}
    assert snapshot_problems(snap).all == []

    again = _trainer(tmp_path, work, rows, flavor=flavor)
    _out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    journal = _journal(work)
    assert [e["step"] for e in journal] == list(range(1, len(journal) + 1))  # each step once
    trained = Counter(r for e in journal for r in e["rows"])
    assert sorted(trained) == list(range(rows)) and set(trained.values()) == {1}


# -- the trainer's own files in the snapshot ---------------------------------------------------


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def test_trainer_files_are_committed_with_the_rollouts_and_restored(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = random.Random(7).randbytes(1 << 20)
    gate_open_while_writing: list[bool] = []

    async with running(tmp_path / "w", tmp_path / "gym") as ro:

        def write(directory: Path) -> None:
            gate_open_while_writing.append(ro.coordinator.gate.is_open)  # Gym not parked
            (directory / "model").mkdir()
            (directory / "model" / "shard-0.bin").write_bytes(weights)
            (directory / "optimizer.bin").write_bytes(weights[:1000])

        await trio.sleep(1)
        outcome = await ro.checkpoint(b'{"step": 3}', files=write)
        assert outcome.ok and outcome.snapshot is not None
        assert gate_open_while_writing == [True]
        published = outcome.snapshot.path
        written = _digests(published / "trainer")
        assert set(written) == {"model/shard-0.bin", "optimizer.bin"}
        assert "trainer" in load_snapshot(published).marker.trees

    async with running(tmp_path / "w", tmp_path / "gym2") as ro:
        assert ro.trainer_state == b'{"step": 3}'
        assert ro.trainer_files is not None
        assert _digests(ro.trainer_files) == written  # the same bytes come back
        assert (ro.trainer_files / "model" / "shard-0.bin").read_bytes() == weights

    assert cli_main(["verify", str(published)]) == 0
    capsys.readouterr()
    edited = bytearray(weights)
    edited[12345] ^= 1
    (published / "trainer" / "model" / "shard-0.bin").write_bytes(bytes(edited))
    assert cli_main(["verify", str(published)]) == 2
    err = capsys.readouterr().err
    assert "trainer/: trainer files digest" in err and "committed" in err


async def test_a_failing_weights_writer_publishes_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    def broken(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"x")
        raise ValueError("model not on this rank")

    def full(directory: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "w.bin"))

    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(1)
        with pytest.raises(ValueError, match="model not on this rank"):  # the trainer's error
            await ro.checkpoint(files=broken)
        assert staging_dirs(tmp_path / "w") == [] and ro.store.list_complete() == []
        assert ro.coordinator.gate.is_open
        outcome = await ro.checkpoint(files=full)
        assert not outcome.ok and outcome.reason == "snapshot_io"
        assert staging_dirs(tmp_path / "w") == [] and ro.store.list_complete() == []
        assert (await ro.checkpoint()).ok


# -- retention ---------------------------------------------------------------------------------


async def test_restore_copies_are_pruned_with_the_snapshots(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    work = tmp_path / "w"
    for incarnation in range(3):
        async with running(work, tmp_path / f"gym{incarnation}") as ro:
            await trio.sleep(1)
            assert (await ro.checkpoint()).ok
            pinned = ro.restored.pinned.path.name if ro.restored is not None else None
    # the third run restored ckpt-000002; the second run's copy (ckpt-000001) is gone
    assert pinned == "ckpt-000002"
    assert sorted(p.name for p in (work / "restored").iterdir()) == ["ckpt-000002"]


def test_snapshots_list_and_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def make() -> None:
        async with running(tmp_path / "w", tmp_path / "gym", keep_snapshots=0) as ro:
            for _ in range(3):
                await trio.sleep(1)
                assert (await ro.checkpoint()).ok
        async with running(tmp_path / "w", tmp_path / "gym2", keep_snapshots=0) as ro:
            await trio.sleep(1)
            assert (await ro.checkpoint()).ok

    trio.run(make, clock=trio.testing.MockClock(autojump_threshold=0))
    capsys.readouterr()
    assert cli_main(["snapshots", "list", str(tmp_path / "w"), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["pinned"]) for r in listing["snapshots"]] == [
        ("ckpt-000001", False),
        ("ckpt-000002", False),
        ("ckpt-000003", False),
        ("ckpt-000004", False),
        ("ckpt-000003", True),
    ]
    assert [r["checkpoint_id"] for r in listing["snapshots"]][:4] == [
        "run-0001",
        "run-0002",
        "run-0003",
        "run-0004",
    ]
    assert all(r["bytes"] > 0 for r in listing["snapshots"])

    holder = WorkDirLock(tmp_path / "w")
    holder.acquire()  # a trainer is running: prune refuses
    assert cli_main(["snapshots", "prune", str(tmp_path / "w"), "--keep", "1"]) == 2
    assert f"in use by process {os.getpid()}" in capsys.readouterr().err
    holder.release()

    assert cli_main(["snapshots", "prune", str(tmp_path / "w"), "--keep", "1", "--json"]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert [Path(p).name for p in pruned["removed"]] == [
        "ckpt-000001",
        "ckpt-000002",
        "ckpt-000003",
    ]
    assert [(r["name"], r["pinned"]) for r in pruned["snapshots"]] == [
        ("ckpt-000004", False),
        ("ckpt-000003", True),
    ]  # the pinned copy is kept
    assert cli_main(["snapshots", "list", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("ckpt-000004") and "(pinned)" in out[1]


def test_help_lists_no_hidden_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    out = capsys.readouterr().out
    assert "SUPPRESS" not in out and "_phase" not in out and "snapshots" in out


# -- metrics and logs ------------------------------------------------------------------------


async def test_checkpoint_metrics_and_logs_per_step(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    logged: list[tuple[int, dict[str, float]]] = []
    async with running(tmp_path / "w", tmp_path / "gym", checkpoint_every=2) as ro:
        ro.metrics.clock = trio.current_time  # ages in virtual time
        async for _batch in ro.batches(2, log_metrics=lambda m, step: logged.append((step, m))):
            if ro.steps == 2:
                await trio.sleep(7)
        m = ro.metrics.snapshot()
    assert [step for step, _ in logged] == list(range(1, 7))
    at_two = logged[1][1]
    assert at_two["checkpoint/completed_total"] == 1  # the periodic checkpoint of step 2
    assert at_two["checkpoint/since_last_completed_s"] == 0
    assert logged[2][1]["checkpoint/since_last_completed_s"] >= 7
    assert at_two["checkpoint/last_size_bytes"] == _store.tree_size(ro.outcomes[0].snapshot.path)  # type: ignore[union-attr]
    assert at_two["checkpoint/last_duration_s"] == pytest.approx(
        sum(ro.outcomes[0].stage_s.values()), abs=1e-6
    )
    assert {f"checkpoint/stage_{s}_s" for s in ("close", "prepare", "commit", "publish")} <= set(m)
    assert m["checkpoint/completed_total"] == 3 and m["checkpoint/failed_total"] == 0

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gymckpt"):
        async with running(tmp_path / "w", tmp_path / "gym2", faults=("prepare:error@1",)) as ro:
            await trio.sleep(1)
            failed = await ro.checkpoint()
            assert ro.metrics.get("checkpoint/restored_total") == 1
            assert ro.metrics.get("checkpoint/failed_total") == 1
    messages = [r.getMessage() for r in caplog.records]
    restore_lines = [m for m in messages if m.startswith("gymckpt: resumed from snapshot")]
    assert len(restore_lines) == 1 and "ckpt-000003" in restore_lines[0]
    assert "at step 6:" in restore_lines[0]  # ckpt-000003 is the periodic checkpoint of step 6
    assert "completed-but-untrained" in restore_lines[0] and "parked" in restore_lines[0]
    fail_lines = [m for m in messages if "failed (gym_unavailable" in m]
    assert len(fail_lines) == 1 and failed.checkpoint_id in fail_lines[0]


async def test_a_resumed_run_goes_on_from_the_restored_step(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A logger's step (W&B, TensorBoard) must not go backwards after a restore.
    first: list[int] = []
    async with running(tmp_path / "w", tmp_path / "gym", checkpoint_every=2) as ro:
        steps = ro.batches(2, log_metrics=lambda _m, step: first.append(step))
        async with contextlib.aclosing(steps):
            async for _batch in steps:
                if ro.steps == 4:
                    break  # ckpt-000002 was taken at step 4
    assert first == [1, 2, 3, 4]
    snap = tmp_path / "w" / "snapshots" / "ckpt-000002"
    assert json.loads((snap / STEP_FILE).read_bytes()) == {"step": 4, "policy_version": 0}
    second: list[int] = []
    async with running(tmp_path / "w", tmp_path / "gym2", checkpoint_every=2) as ro:
        assert (ro.step, ro.steps) == (4, 0)
        async for _batch in ro.batches(2, log_metrics=lambda _m, step: second.append(step)):
            pass
        assert (ro.step, ro.steps) == (6, 2)
    assert second == [5, 6]  # 12 rows, groups of 2, two groups a step: 6 steps in all

    # a step file that does not hold a step: verify and restore refuse it by name
    bad = tmp_path / "w" / "snapshots" / "ckpt-000003"
    (bad / STEP_FILE).write_bytes(b'{"step": -1}')
    marker = json.loads((bad / COMMIT_MARKER).read_bytes())
    marker["files"][STEP_FILE] = hashlib.sha256((bad / STEP_FILE).read_bytes()).hexdigest()
    (bad / COMMIT_MARKER).write_text(json.dumps(marker))  # a consistent-looking edit
    assert cli_main(["verify", str(bad)]) == 2
    says = r"step\.json: step must be an integer >= 0, got -1"
    with pytest.RaisesGroup(
        pytest.RaisesExc(ManifestError, match=says), flatten_subgroups=True, allow_unwrapped=True
    ):
        async with running(tmp_path / "w", tmp_path / "gym3"):
            pass


# -- configuration from a file ---------------------------------------------------------------


def test_runtime_config_from_toml_is_strict(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[demo]\nrows = 3\n[runtime]\nlease_s = 90\nmax_consecutive_failures = 5\n")
    config = runtime_config_from_toml(job)
    assert config.lease_s == 90.0 and config.max_consecutive_failures == 5
    assert config.control_timeout_s == RuntimeConfig().control_timeout_s  # defaults kept
    for body, says in [
        ("[runtime]\nlease_seconds = 9\n", r"\[runtime\]: extra fields found \(lease_seconds\)"),
        ("[runtime]\nlease_s = 'long'\n", r"\[runtime\]: .*expected float @ \$.lease_s"),
        ("[runtime]\nmax_row_attempts = 0\n", r"\[runtime\]: '?max_row_attempts'? must be > 0"),
        ("[runtime\n", r"job.toml: not valid TOML"),
        ("[runtim]\nlease_s = 9\n", r"job.toml: no \[runtime\] table, but a \[runtim\]"),
        ("lease_s = 9\n[model]\nlr = 0.1\n", r"job.toml: lease_s at the top level; put it under"),
    ]:
        job.write_text(body)
        with pytest.raises(ManifestError, match=says):
            runtime_config_from_toml(job)
    job.write_text("[model]\nlr = 0.1\n[runtime]\nlease_s = 70\n")  # other tools' tables: theirs
    assert runtime_config_from_toml(job).lease_s == 70.0
    job.write_text("[model]\nlr = 0.1\n")
    assert runtime_config_from_toml(job) == RuntimeConfig()


def test_demo_config_file_unknown_or_ill_typed_key_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "demo.toml"
    for body, says in [
        ("[demo]\nrows = 8\nbogus = 1\n", "[demo]: extra fields found (bogus)"),
        ("rows = 8\n", "rows at the top level; put it under [demo]"),
        ("[runtime]\nlease_seconds = 9\n", "[runtime]: extra fields found (lease_seconds)"),
        ("[runtime]\nlease_s = 1.0\n", "[runtime]: control_timeout_s + "),
        (
            "[demo]\ngroup_size = 'two'\n",
            "[demo]: invalid value for type, expected int @ $.group_size",
        ),
    ]:
        conf.write_text(body)
        assert cli_main(["demo", "--config", str(conf)]) == 2
        err = capsys.readouterr().err
        assert str(conf) in err and says in err, err


def test_demo_runtime_settings_from_the_config_file_reach_its_phases() -> None:
    opts = DemoOptions(runtime=(("lease_s", 45.0), ("max_consecutive_failures", 7)))
    again = DemoOptions.from_json(opts.to_json())  # what a phase process is handed
    assert again == opts
    config = again.runtime_config()
    assert (config.lease_s, config.max_consecutive_failures) == (45.0, 7)
    assert config.control_timeout_s == DemoOptions().runtime_config().control_timeout_s


# -- rough edges -------------------------------------------------------------------------------


def test_demo_on_ray_without_the_extra_is_one_line_exit_2() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from gymckpt.app.cli import main\n"
        "sys.exit(main(['demo', '--backend', 'ray']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "gymckpt: error: --backend ray needs Ray, an optional extra: pip install 'gymckpt[ray]'"
    ]


async def test_inspect_shows_non_json_trainer_state_as_its_size_and_a_finished_rerun_says_so(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        async for _batch in ro.batches(2):
            pass
        outcome = await ro.checkpoint(b"\x00\xffweights")
        assert outcome.ok and outcome.snapshot is not None
    assert cli_main(["inspect", str(outcome.snapshot.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer_state"] == "9 bytes (not JSON)"
    with caplog.at_level(logging.WARNING, logger="gymckpt"):
        async with running(tmp_path / "w", tmp_path / "gym2") as ro:
            assert [b async for b in ro.batches(2)] == []
    said = [r.getMessage() for r in caplog.records if "nothing left to do" in r.getMessage()]
    assert len(said) == 1 and "every row of the dataset was trained" in said[0]


@pytest.mark.subprocess
def test_sigterm_to_gymckpt_demo_leaves_a_snapshot_and_exits_0(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gymckpt",
            "demo",
            "--rows",
            "2000",
            "--group-size",
            "2",
            "--crash-after-checkpoint",
            "0",
            "--checkpoint-every",
            "1",
            "--workdir",
            str(work),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = work / "journal.jsonl"
    # the demo's own progress line says a step was trained: read stderr as it comes (an event,
    # not a poll of the journal), and keep every line for the assertions below
    lines: list[str] = []
    trained = threading.Event()

    def read_stderr() -> None:
        assert demo.stderr is not None
        for line in demo.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("[phase 1] step"):
                trained.set()

    reader = threading.Thread(target=read_stderr, name="demo-stderr", daemon=True)
    reader.start()
    try:
        if not trained.wait(timeout=60):
            raise AssertionError("the demo trained nothing in 60 s:\n" + "\n".join(lines))
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=120)
        reader.join(timeout=30)
        assert demo.stdout is not None
        out = demo.stdout.read()
    finally:
        demo.kill()
        demo.wait()
        for pipe in (demo.stdout, demo.stderr):
            if pipe is not None:
                pipe.close()
    err = "\n".join(lines)
    assert demo.returncode == 0, err
    assert "Traceback" not in err and out == ""
    latest = SnapshotStore(work / "snapshots").latest_complete()
    assert latest is not None
    lines = err.strip().splitlines()  # rate-limited progress lines, then the one line
    assert lines[-1] == f"gymckpt: demo stopped by SIGTERM; the trainer left snapshot {latest.path}"
    assert all(line.startswith(("phase", "[phase")) for line in lines[:-1]), lines
    state = json.loads(load_snapshot(latest.path).files["trainer.json"])
    trained_steps = [
        json.loads(line)["step"]
        for line in journal.read_text().splitlines()
        if '"step"' in line and '"rows"' in line
    ]
    assert state["step"] == len(trained_steps) < 1000  # stopped early, every step in it


def test_progress_lines_are_rate_limited_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from gymckpt.app.demo.main import _Progress

    progress = _Progress(enabled=True, tty=False, every_s=3600.0)
    for step in range(5):
        progress(f"step {step}", frequent=True)
    progress("phase 2 restores")
    assert capsys.readouterr().err.splitlines() == ["step 0", "phase 2 restores"]
    on_a_terminal = _Progress(enabled=True, tty=True)
    for step in range(3):
        on_a_terminal(f"step {step}", frequent=True)
    assert capsys.readouterr().err.splitlines() == ["step 0", "step 1", "step 2"]
