"""The host's session journal (``gym_adapter.host._journal``): every record is written whole or
not at all, replay counts only complete records (so two replays agree), and an I/O error under
the journal stops the instance (an infra failure the runtime survives), never a data failure
and never a bare ``OSError``.

Real files throughout. A short write and a full disk are faked by replacing ``os`` inside the
journal module only (``FaultyDisk``); one test gets a real short write and a real write error
from the kernel, with a file-size limit in a child process.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.verdict import judge
from gymckpt.gym_adapter import (
    EmbeddedGym,
    GymHost,
    GymInstanceDead,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_host,
    calendar_state,
)
from gymckpt.gym_adapter.host import _journal as _host_journal
from gymckpt.gym_adapter.host._journal import (
    JOURNAL_FILE,
    JournalFailed,
    SessionJournal,
    replay_journal,
)
from gymckpt.nurseries import ExitCode, open_rollouts, run_exit
from gymckpt.runtime import (
    EpisodeRecord,
    GymUnavailable,
    InfraOutage,
    InstanceDirLocked,
    InstanceRecord,
    ParticipantRecord,
    RuntimeConfig,
)
from gymckpt.testing.hostile import HostileAct, HostileActs, hostile_calendar_environment

CAL = CalendarConfig(turns=(2, 2), turn_s=(0.01, 0.01), mutation_p=1.0)
EV = {"turn": 0, "title": "m", "sentinel": "s0"}


class FaultyDisk:
    """``os`` as the journal module sees it, with ``write`` replaced: ``write(fd, data)`` is
    ``fault(n, fd, data)`` for the n-th call (from 0), which writes for real or raises."""

    def __init__(self, fault: Callable[[int, int, Any], int]) -> None:
        self.fault = fault
        self.calls = 0

    def write(self, fd: int, data: Any) -> int:
        n, self.calls = self.calls, self.calls + 1
        return self.fault(n, fd, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def full_disk(
    after: int, *, partial: int = 0, times: int | None = None
) -> Callable[[int, int, Any], int]:
    """Writes ``after`` calls for real; the next writes ``partial`` bytes of its data (a short
    write, if any), then ``times`` calls (forever: None) fail with ENOSPC; then room again."""
    failing = {"left": times}

    def fault(n: int, fd: int, data: Any) -> int:
        if n < after:
            return os.write(fd, data)
        if n == after and partial:
            return os.write(fd, bytes(data)[:partial])
        if failing["left"] is None or failing["left"] > 0:
            if failing["left"] is not None:
                failing["left"] -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    return fault


def line(record: list[Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


def journal_at(tmp_path: Path, **kw: Any) -> SessionJournal:
    j = SessionJournal(tmp_path / "gym-0" / JOURNAL_FILE, "gym-0", **kw)
    assert j.open(recover=False) == {}
    return j


def slots_of(path: Path) -> dict[str, tuple[str, int, dict[str, Any]]]:
    j = SessionJournal(path, "gym-0")
    try:
        return {k: (s.rollout_id, s.attempt, s.states) for k, s in j.open(recover=True).items()}
    finally:
        j.close()


# -- whole records ------------------------------------------------------------------------------


def test_short_writes_are_finished_so_every_record_is_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OS may write less than asked: the journal writes the rest, so the next record starts
    on a line of its own and a replacement replays every record."""
    disk = FaultyDisk(lambda _n, fd, data: os.write(fd, bytes(data)[:7]))  # 7 bytes a call
    monkeypatch.setattr(_host_journal, "os", disk)
    j = journal_at(tmp_path)
    j.opened("0-0", "0-0", 0, {"calendar": {"events": []}})
    j.state("0-0", "calendar", {"events": [EV]})
    j.opened("1-0", "1-0", 0, {"calendar": {"events": []}})
    j.freed("1-0")
    j.close()
    assert j.path.read_bytes() == b"".join(
        [
            line(["n", "0-0", "0-0", 0, {"calendar": {"events": []}}]),
            line(["s", "0-0", "calendar", {"events": [EV]}]),
            line(["n", "1-0", "1-0", 0, {"calendar": {"events": []}}]),
            line(["d", "1-0"]),
        ]
    )
    assert disk.calls > 4  # the writes really were short
    monkeypatch.undo()
    assert slots_of(j.path) == {"0-0": ("0-0", 0, {"calendar": {"events": [EV]}})}


def test_a_write_failing_midway_is_cut_back_and_the_journal_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record half written when the disk fills: the file is cut back to its complete
    records, the owner is told once (the host stops there), the error is a GymInstanceDead
    naming the file and the OS error, and the journal records nothing more."""
    told: list[JournalFailed] = []
    j = journal_at(tmp_path, on_failure=told.append)
    j.opened("0-0", "0-0", 0, {"calendar": {"events": []}})
    good = j.path.read_bytes()
    monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_disk(0, partial=9, times=1)))
    with pytest.raises(JournalFailed) as caught:
        j.state("0-0", "calendar", {"events": [EV]})
    err = caught.value
    assert isinstance(err, GymInstanceDead) and isinstance(err, GymUnavailable)
    assert told == [err] and j.failure is err
    assert str(j.path) in str(err) and "No space left" in str(err) and "gym-0" in str(err)
    assert j.path.read_bytes() == good  # the 9 bytes written are gone again
    j.state("0-0", "calendar", {"events": [EV, EV]})  # the disk has room again: still closed
    j.freed("0-0")
    assert j.path.read_bytes() == good and told == [err]
    again = pickle.loads(pickle.dumps(err))  # it crosses Ray like every Gym error
    assert type(again) is JournalFailed and str(again) == str(err) and again.args == err.args
    monkeypatch.undo()
    assert slots_of(j.path) == {"0-0": ("0-0", 0, {"calendar": {"events": []}})}


def test_a_failed_rewrite_leaves_the_old_journal_whole_and_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[JournalFailed] = []
    j = journal_at(tmp_path, on_failure=told.append)
    j.opened("0-0", "0-0", 0, {"calendar": {"events": [EV]}})
    good = j.path.read_bytes()

    def no_room(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_host_journal, "write_atomic", no_room)
    with pytest.raises(JournalFailed, match="rewriting it for a restore"):
        j.rewrite([("1-0", "1-0", 0, {"calendar": {"events": []}})])
    assert len(told) == 1 and j.path.read_bytes() == good
    j.freed("0-0")
    assert j.path.read_bytes() == good


def test_a_journal_that_cannot_be_read_refuses_to_start_the_instance(tmp_path: Path) -> None:
    """A replacement whose journal cannot be read (here a directory in its place) does not
    start: a GymInstanceDead naming the file, not a bare OSError."""
    path = tmp_path / "gym-0" / JOURNAL_FILE
    path.mkdir(parents=True)
    with pytest.raises(JournalFailed, match=r"opening it: IsADirectoryError") as caught:
        SessionJournal(path, "gym-0").open(recover=True)
    assert isinstance(caught.value, GymInstanceDead) and str(path) in str(caught.value)


REAL_LIMIT = textwrap.dedent("""
    import json, resource, signal, sys
    from pathlib import Path
    from gymckpt.gym_adapter.host._journal import SessionJournal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
    j = SessionJournal(Path(sys.argv[1]), "gym-0")
    j.open(recover=False)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    out = {"appended": 0}
    try:
        for i in range(100):
            j.state("0-0", "calendar", {"events": [{"turn": i, "sentinel": "s" * 20}]})
            out["appended"] += 1
    except Exception as exc:
        out["error"], out["type"] = str(exc), type(exc).__name__
    print(json.dumps(out))
""")


@pytest.mark.subprocess
def test_a_real_file_size_limit_cuts_a_write_short_and_only_whole_records_remain(
    tmp_path: Path,
) -> None:
    """The kernel itself: under RLIMIT_FSIZE the write that crosses the limit is short, the
    next fails with EFBIG. The record that crossed it is cut back, so the file holds exactly
    the records appended before it, each on its line."""
    path = tmp_path / JOURNAL_FILE
    done = subprocess.run(
        [sys.executable, "-c", REAL_LIMIT, str(path), "1000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = orjson.loads(done.stdout)
    assert out.get("type") == "JournalFailed" and "File too large" in out["error"], out
    data = path.read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == out["appended"] > 0
    assert all(orjson.loads(x)[0] == "s" for x in lines[:-1])
    assert len(data) < 1000  # the crossing record's bytes that fit were cut back


# -- deterministic replay ----------------------------------------------------------------------


def _written(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A journal written for real; (its path, all but its last record, all of it)."""
    j = journal_at(tmp_path)
    j.opened("0-0", "0-0", 0, {"calendar": {"events": []}})
    j.state("0-0", "calendar", {"events": [EV]})
    j.opened("1-0", "1-0", 0, {"calendar": {"events": []}})
    before = j.path.read_bytes()
    j.freed("0-0")  # the last record: ["d","0-0"], parseable once its newline is cut
    j.close()
    return j.path, before, j.path.read_bytes()


def test_a_torn_parseable_last_record_is_never_applied_and_two_replays_agree(
    tmp_path: Path,
) -> None:
    path, before, full = _written(tmp_path)
    os.truncate(path, len(full) - 1)  # the process died before the newline of the free
    assert orjson.loads(path.read_bytes()[len(before) :]) == ["d", "0-0"]  # it does parse
    first = slots_of(path)  # replays, then cuts the torn tail before appending
    assert path.read_bytes() == before
    second = slots_of(path)
    assert (
        first
        == second
        == {
            "0-0": ("0-0", 0, {"calendar": {"events": [EV]}}),
            "1-0": ("1-0", 0, {"calendar": {"events": []}}),
        }
    )


def test_a_record_torn_at_any_byte_replays_as_if_never_begun(tmp_path: Path) -> None:
    _path, before, full = _written(tmp_path / "a")
    expected = {k: (s.rollout_id, s.attempt, s.states) for k, s in replay_journal(before).items()}
    assert set(expected) == {"0-0", "1-0"} and replay_journal(full).keys() == {"1-0"}
    for cut in range(len(before), len(full)):
        p = tmp_path / f"cut{cut}" / JOURNAL_FILE
        p.parent.mkdir()
        p.write_bytes(full[:cut])
        assert slots_of(p) == expected, cut  # the first replay cuts the tail ...
        assert p.read_bytes() == before, cut
        assert slots_of(p) == expected, cut  # ... and the second agrees


def test_a_bad_complete_record_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_FILE
    path.write_bytes(line(["n", "0-0", "0-0", 0, {}]) + b'["x"]\n' + line(["d", "0-0"]))
    with pytest.raises(ValueError, match=r"sessions.journal: session journal line 2"):
        SessionJournal(path, "gym-0").open(recover=True)


# -- the host: an I/O error stops the instance, never a data failure -------------------------


async def _read_all(stream: Any) -> list[Any]:
    return [r async for batch in stream for r in batch]


@pytest.mark.parametrize("fails", ["admission", "turn"])
async def test_a_full_disk_under_the_journal_stops_the_instance_never_a_data_failure(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fails: str,
) -> None:
    """The first write (a slot opened at admission) or the third (the first turn's state,
    half written) meets a full disk: ``run`` does not raise, the stream says the instance is
    dead, nothing is answered as a data failure, and a replacement replays exactly the
    records that were complete."""
    after = 0 if fails == "admission" else 2
    monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_disk(after, partial=5)))
    rows = [RunRow("0-0", 0, 0, 0), RunRow("1-0", 1, 0, 0)]
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL) as host:
        stream = await host.run(rows)  # an OSError here would end the run
        with pytest.raises(GymInstanceDead):
            await _read_all(stream)
        assert host.dead
        stats = host.statistics()
        assert stats.failed == stats.completed == 0
        with pytest.raises(GymInstanceDead):
            await host.run([RunRow("2-0", 2, 0, 0)])
    assert any(
        "could not record a change" in r.getMessage()
        and "No space left" in r.getMessage()
        and r.levelno == logging.WARNING
        and r.exc_info
        for r in caplog.records
    )
    monkeypatch.undo()
    journal = tmp_path / "gym-0" / JOURNAL_FILE
    assert journal.read_bytes().endswith(b"\n") or journal.read_bytes() == b""
    expected = {} if fails == "admission" else {"0-0": (), "1-0": ()}
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL, recover=True) as again:
        assert {k: s.sentinels for k, s in calendar_state(again).items()} == expected


async def test_freeing_a_failed_attempt_the_journal_cannot_record_stops_only_the_instance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step mutates the retained calendar, then raises: the attempt fails and its sessions
    are freed as it ends (in the episode's own task). The free meets a full disk: the instance
    stops, the host's task group does not crash, and the replacement holds the slot the
    journal still has (the runtime retires the dead attempt there)."""
    acts = HostileActs((HostileAct(kind="raise_after_mutation", row=0, slot=0, turn=0),))
    env = hostile_calendar_environment("simple_agent", CAL, acts)
    disk = FaultyDisk(full_disk(2))  # "n" at admission, the turn's "s", then the free fails
    monkeypatch.setattr(_host_journal, "os", disk)
    async with GymHost("gym-0", env, work_dir=tmp_path) as host:
        with pytest.raises(GymInstanceDead):
            await _read_all(await host.run([RunRow("0-0", 0, 0, 0)]))
        assert host.dead and disk.calls == 3 and acts.fired["raise_after_mutation"] == 1
    monkeypatch.undo()
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL, recover=True) as again:
        assert len(calendar_state(again)["0-0"].sentinels) == 1
        assert (await again.retire(["0-0"], trio.current_time() + 1)).retired == ("0-0",)


async def test_a_retire_the_journal_cannot_record_reports_a_dead_instance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freeing a slot in memory that the journal still holds: the retire raises
    GymInstanceDead (so the runtime keeps the attempt queued and retires it on the
    replacement, which replays the slot), never a bare OSError."""
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL) as host:
        assert [
            r.rollout_id for r in await _read_all(await host.run([RunRow("0-0", 0, 0, 0)]))
        ] == ["0-0"]
        held = calendar_state(host)["0-0"].sentinels
        assert held
        monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_disk(0)))
        with pytest.raises(GymInstanceDead, match="could not record a change"):
            await host.retire(["0-0"], trio.current_time() + 1)
        assert host.dead
    monkeypatch.undo()
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL, recover=True) as again:
        assert calendar_state(again)["0-0"].sentinels == held
        assert (await again.retire(["0-0"], trio.current_time() + 1)).retired == ("0-0",)


async def _committed(tmp_path: Path) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    """One calendar episode committed mid-run under ``tmp_path/snap`` (with the sentinels of
    its first turns in its retained calendar): the records a restore takes."""
    sim = CalendarConfig(turns=(4, 4), turn_s=(1.0, 1.0), mutation_p=1.0)
    async with calendar_host("gym-0", work_dir=tmp_path, config=sim) as host:
        stream = await host.run([RunRow("3-1", 3, 1, 0)])
        await trio.sleep(1.5)
        assert (await host.prepare("c1", trio.current_time() + 5)).parked == 1
        reply = await host.commit("c1", "snap", trio.current_time() + 5)
        await stream.aclose()
    record = InstanceRecord(
        "gym-0",
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in reply.participants
        ),
    )
    return record, [
        EpisodeRecord(e.rollout_id, e.owner, "gym-0", e.capture_keys) for e in reply.exported
    ]


async def test_a_claim_the_journal_cannot_record_stops_the_instance_never_a_data_failure(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restored episode claimed by attempt 1 takes its slot over ("o"): that record meets
    a full disk. The claim is not a data failure; the instance stops; the replacement holds
    the slot as the restore journaled it, owned by the restored attempt (which the runtime
    then retires there, as for any dead instance)."""
    record, episodes = await _committed(tmp_path)
    sim = CalendarConfig(turns=(4, 4), turn_s=(1.0, 1.0), mutation_p=1.0)
    async with calendar_host("gym-0", work_dir=tmp_path, config=sim) as fresh:
        assert (
            await fresh.restore("snap", record, episodes, trio.current_time() + 5)
        ).restored == ("3-1",)
        held = calendar_state(fresh)["3-1"].sentinels
        assert held
        monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_disk(0)))
        stream = await fresh.run([RunRow("3-1-a1", 3, 1, 1, restored_from="3-1")])
        with pytest.raises(GymInstanceDead):
            await _read_all(stream)
        assert fresh.dead and fresh.statistics().failed == 0
    monkeypatch.undo()
    async with calendar_host("gym-0", work_dir=tmp_path, config=sim, recover=True) as again:
        assert calendar_state(again)["3-1"].sentinels == held
        assert (await again.retire(["3-1"], trio.current_time() + 1)).retired == ("3-1",)


async def test_a_restore_whose_journal_cannot_be_rewritten_reports_a_dead_instance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore installed its sessions in memory but the journal still holds what was
    there before: the restore raises GymInstanceDead (the runtime replaces the instance and
    restores there again), never a bare OSError."""
    record, episodes = await _committed(tmp_path)

    def no_room(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async with calendar_host("gym-0", work_dir=tmp_path) as fresh:
        monkeypatch.setattr(_host_journal, "write_atomic", no_room)
        with pytest.raises(GymInstanceDead, match="rewriting it for a restore"):
            await fresh.restore("snap", record, episodes, trio.current_time() + 5)
        assert fresh.dead


async def test_a_disk_full_for_a_moment_costs_one_replacement_and_the_run_goes_on_exactly_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-run, one journal append is cut short by a filling disk and its rest fails with
    ENOSPC (then space is freed). The instance stops and is replaced; the run trains every
    row, spends no row attempt and no data budget, and every sentinel is kept once."""
    sim = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
    config = RuntimeConfig(
        control_timeout_s=2.0,
        reply_grace_s=0.5,
        drain_timeout_s=5.0,
        lease_s=30.0,
        max_consecutive_failures=2,
    )
    async with (
        EmbeddedGym.host(
            calendar_environment(config=sim),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=sim.host_config(),
        ) as gym,
        open_rollouts(
            gym,
            tmp_path,
            rows=12,
            group_size=2,
            config=config,
            max_rows_in_flight=6,
            handle_signals=False,
        ) as ro,
    ):
        await trio.sleep(0.5)
        disk = FaultyDisk(full_disk(0, partial=11, times=1))
        monkeypatch.setattr(_host_journal, "os", disk)
        trained: list[list[str]] = []
        async with aclosing(ro.batches(2)) as batches:
            async for batch in batches:
                trained.extend(list(g.rollout_ids) for g in batch)
                await ro.checkpoint()
        final = await ro.checkpoint()
        assert final.ok, final.error
        assert disk.calls >= 2  # the fault fired
        stats = ro.ledger.statistics()
        assert stats.data_failures == 0 and stats.rows_failed == 0
        assert stats.row_attempts_spent == 0
        assert gym.replacement_count("gym-0") + gym.replacement_count("gym-1") == 1
        snapshot = ro.outcomes[-1].snapshot
    rows = [int(ids[0].split("-")[0]) for ids in trained]
    assert sorted(rows) == list(range(12))
    assert snapshot is not None
    verdict = judge(
        [(i + 1, (r,)) for i, r in enumerate(rows)],
        12,
        snapshot.path,
        seed=3,
        config=sim,
        group_size=2,
    )
    assert verdict.ok, verdict.violations()


async def test_a_disk_that_stays_full_ends_the_run_past_the_outage_budget(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every journal append fails from some point on: each replacement stops at its first
    change, before it serves an episode — one outage per instance, its replacements spaced by
    a backoff — until ``outage_budget_s`` ends the run with exit 8 naming the instance (and
    the log says why it kept dying), never a bare OSError, never a data failure, never a row
    given up."""
    sim = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
    config = RuntimeConfig(
        control_timeout_s=2.0,
        reply_grace_s=0.5,
        drain_timeout_s=5.0,
        lease_s=30.0,
        max_consecutive_failures=2,
        max_replacements=2,
        outage_budget_s=20.0,
    )
    data_failures = rows_failed = -1
    with pytest.raises(BaseException) as caught:  # a nursery's exception group
        async with (
            EmbeddedGym.host(
                calendar_environment(config=sim),
                instances=2,
                seed=3,
                work_dir=tmp_path / "gym",
                config=sim.host_config(),
            ) as gym,
            open_rollouts(
                gym,
                tmp_path,
                rows=12,
                group_size=2,
                config=config,
                max_rows_in_flight=6,
                handle_signals=False,
            ) as ro,
        ):
            await trio.sleep(0.5)
            monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_disk(0)))
            try:
                async with aclosing(ro.batches(2)) as batches:
                    async for _batch in batches:
                        await ro.checkpoint()
            finally:
                data_failures = ro.ledger.statistics().data_failures
                rows_failed = ro.ledger.statistics().rows_failed
    decided = run_exit(caught.value)
    assert decided is not None and decided[0] == ExitCode.INFRA_OUTAGE, caught.value
    assert isinstance(decided[1], InfraOutage)
    assert decided[1].what.startswith("gym instance gym-")
    assert data_failures == 0 and rows_failed == 0
    assert any("could not record a change" in r.getMessage() for r in caplog.records)


async def test_a_disk_full_for_1_5_s_is_waited_out_by_spaced_replacements(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is full for 1.5 s of (virtual) time: every instance dies at its first change,
    and so does each replacement while it lasts. Replacements of an instance that died again
    before it served back off (0.1, 0.2, 0.4, 0.8 s ...) and are not charged to
    ``max_replacements``: the run trains every row once, spends nothing, and is exactly
    once. (Before: three replacements in a few milliseconds, then exit 5.)"""
    sim = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
    config = RuntimeConfig(
        control_timeout_s=2.0,
        reply_grace_s=0.5,
        drain_timeout_s=5.0,
        lease_s=30.0,
        max_consecutive_failures=5,
    )
    full_until = 0.0

    def full_for_a_moment(_n: int, fd: int, data: Any) -> int:
        if trio.current_time() < full_until:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    async with (
        EmbeddedGym.host(
            calendar_environment(config=sim),
            instances=2,
            seed=3,
            work_dir=tmp_path / "gym",
            config=sim.host_config(),
        ) as gym,
        open_rollouts(
            gym,
            tmp_path,
            rows=12,
            group_size=2,
            config=config,
            max_rows_in_flight=6,
            handle_signals=False,
        ) as ro,
    ):
        await trio.sleep(0.5)
        full_until = trio.current_time() + 1.5
        monkeypatch.setattr(_host_journal, "os", FaultyDisk(full_for_a_moment))
        trained: list[list[str]] = []
        with trio.fail_after(300):
            async with aclosing(ro.batches(2)) as batches:
                async for batch in batches:
                    trained.extend(list(g.rollout_ids) for g in batch)
                    await ro.checkpoint()
            final = await ro.checkpoint()
        assert final.ok, final.error
        stats = ro.ledger.statistics()
        assert stats.data_failures == 0 and stats.rows_failed == 0
        assert stats.row_attempts_spent == 0
        replaced = gym.replacement_count("gym-0") + gym.replacement_count("gym-1")
        assert replaced >= 3  # it did die again while the disk was full
        assert ro.metrics.get("rollout/replace_backoffs_total") >= 1
        snapshot = ro.outcomes[-1].snapshot
    rows = [int(ids[0].split("-")[0]) for ids in trained]
    assert sorted(rows) == list(range(12))
    assert snapshot is not None
    verdict = judge(
        [(i + 1, (r,)) for i, r in enumerate(rows)],
        12,
        snapshot.path,
        seed=3,
        config=sim,
        group_size=2,
    )
    assert verdict.ok, verdict.violations()


async def test_a_second_host_of_one_instance_directory_is_refused_and_cuts_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Hosts share the journal code with ``gymckpt serve``, and its lock: a second host of the
    same name on the same ``work_dir`` (in this process here; another process alike) is
    refused on entry with ``InstanceDirLocked`` (exit 2) before it opens the journal, whose
    bytes stay as the first wrote them. Once the first dies, its replacement continues every
    retained session; another name on the same ``work_dir`` is another directory."""
    journal = tmp_path / "gym-0" / JOURNAL_FILE
    async with calendar_host("gym-0", work_dir=tmp_path, config=CAL) as first:
        await _read_all(await first.run([RunRow(f"{r}-0", r, 0, 0) for r in range(4)]))
        kept = {k: s.sentinels for k, s in calendar_state(first).items()}
        assert len(kept) == 4
        written = journal.read_bytes()
        for recover in (False, True):
            second = calendar_host("gym-0", work_dir=tmp_path, config=CAL, recover=recover)
            with pytest.raises(InstanceDirLocked, match=f"process {os.getpid()}") as caught:
                async with second:
                    pass
            assert run_exit(caught.value)[0] == ExitCode.BAD_INPUT
            assert journal.read_bytes() == written
        async with calendar_host("gym-1", work_dir=tmp_path, config=CAL):
            pass
        first.kill()  # a dead instance writes nothing more: its directory is free
        async with calendar_host("gym-0", work_dir=tmp_path, config=CAL, recover=True) as again:
            assert {k: s.sentinels for k, s in calendar_state(again).items()} == kept
