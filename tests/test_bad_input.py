"""Bad input (C4 exit 2, C6): a damaged rollout snapshot is a clear error naming what differs,
through ``gymckpt verify DIR``, through a restore with ``open_rollouts``, and through the
CLI's restore (the demo's phase process) — and neither Gym nor the snapshot is touched.

Hand edits that keep the commit marker consistent (its sha256 of the manifest updated, as a
careful hand-editor would) reach the manifest's own validation; one that does not is caught by
the marker.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main
from gymckpt.app.demo.main import DemoOptions
from gymckpt.gym_adapter import (
    EmbeddedGym,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_sessions_of,
)
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import ManifestError, RuntimeConfig, TopologyMismatch
from gymckpt.runtime._shared import COMMIT_MARKER, MANIFEST_NAME
from gymckpt.runtime._snapshot_format import _attempt_arrays

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.2, 1.0), lease_s=30.0)
CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0, lease_s=30.0)
ROWS, GROUP = 40, 2


async def _make_snapshots(workdir: Path, count: int) -> list[Path]:
    paths = []
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=workdir / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(gym, workdir, rows=ROWS, group_size=GROUP, config=CONFIG) as ro:
            for step in range(count):
                await trio.sleep(1)
                state = orjson.dumps({"step": step + 1, "reward_ema": 0.0, "rows_trained": 0})
                outcome = await ro.checkpoint(state)
                assert outcome.ok and outcome.episodes > 0 and outcome.snapshot is not None
                paths.append(outcome.snapshot.path)
    return paths


def make_snapshots(workdir: Path, count: int = 1) -> list[Path]:
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(_make_snapshots, workdir, count, clock=clock)


def tree_digest(root: Path) -> str:
    """sha256 over every path and file content under ``root`` (is it untouched?)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            file = Path(dirpath, name)
            h.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return h.hexdigest()


# -- damage ---------------------------------------------------------------------------------


def _rehash(snap: Path) -> None:
    marker = orjson.loads((snap / COMMIT_MARKER).read_bytes())
    marker["files"][MANIFEST_NAME] = hashlib.sha256((snap / MANIFEST_NAME).read_bytes()).hexdigest()
    (snap / COMMIT_MARKER).write_bytes(orjson.dumps(marker))


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(snap: Path) -> None:
        manifest = orjson.loads((snap / MANIFEST_NAME).read_bytes())
        fn(manifest)
        (snap / MANIFEST_NAME).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        _rehash(snap)

    return damage


def _bytes(fn: Callable[[bytes], bytes], rehash: bool = True) -> Callable[[Path], None]:
    def damage(snap: Path) -> None:
        (snap / MANIFEST_NAME).write_bytes(fn((snap / MANIFEST_NAME).read_bytes()))
        if rehash:
            _rehash(snap)

    return damage


def _instance(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    return next(i for i in manifest["instances"] if i["name"] == name)


def _flip_state_byte(snap: Path) -> None:
    records = snap / "gym" / "gym-1" / "calendar" / "records.json"
    data = bytearray(records.read_bytes())
    data[len(data) // 2] ^= 0x01
    records.write_bytes(bytes(data))


def _set_digest(m: dict[str, Any]) -> None:
    _instance(m, "gym-1")["participants"][1]["records_digest"] = "sha256:" + "0" * 64


def _add_participant(m: dict[str, Any]) -> None:
    _instance(m, "gym-0")["participants"].append(
        {
            "server_name": "scratchpad",
            "kind": "environment",
            "state_dir": "gym/gym-0/scratchpad",
            "records_digest": "sha256:" + "1" * 64,
        }
    )


def _drop_participant(m: dict[str, Any]) -> None:
    parts = _instance(m, "gym-0")["participants"]
    parts[:] = [p for p in parts if p["server_name"] != "model_proxy"]


# (id, damage, what verify says, what a restore says, error class of the restore)
CASES: list[tuple[str, Callable[[Path], None], str, str, type[Exception]]] = [
    (
        "truncated-manifest",
        _bytes(lambda b: b[: len(b) // 2]),
        r"gym_checkpoint.json: not valid JSON, truncated\?",
        "",
        ManifestError,
    ),
    (
        "truncated-manifest-stale-marker",
        _bytes(lambda b: b[: len(b) // 2], rehash=False),
        r"gym_checkpoint.json: sha256 [0-9a-f]{12}… on disk, [0-9a-f]{12}… committed",
        "",
        ManifestError,
    ),
    (
        "empty-manifest",
        _bytes(lambda b: b""),
        r"gym_checkpoint.json: file is empty",
        "",
        ManifestError,
    ),
    (
        "foreign-version",
        _edit(lambda m: m.update(version=7)),
        r"gym_checkpoint.json: version 7 is not supported "
        r"\(this runtime reads versions 4, 5 and 6\)"
        r": it was written by a newer gymckpt release",
        "",
        ManifestError,
    ),
    (
        "version-1",
        _edit(lambda m: m.update(version=1)),
        r"gym_checkpoint.json: version 1 is not supported "
        r"\(this runtime reads versions 4, 5 and 6\): "
        r"a version 1 snapshot's model calls carry no request digest",
        "",
        ManifestError,
    ),
    (
        "version-2",
        _edit(lambda m: m.update(version=2)),
        r"gym_checkpoint.json: version 2 is not supported "
        r"\(this runtime reads versions 4, 5 and 6\): "
        r"a version 2 snapshot's capture keys have the old shape .*start this one fresh",
        "",
        ManifestError,
    ),
    (
        "version-3",
        _edit(lambda m: m.update(version=3)),
        r"gym_checkpoint.json: version 3 is not supported "
        r"\(this runtime reads versions 4, 5 and 6\): "
        r"a version 3 snapshot's call ids .* numbered in the order calls started.*start this "
        r"one fresh",
        "",
        ManifestError,
    ),
    (
        "hand-edited-unknown-key",
        _edit(lambda m: m.update(written_by="me")),
        r"gym_checkpoint.json: extra fields found \(written_by\)",
        "",
        ManifestError,
    ),
    (
        "hand-edited-path-escapes",
        _edit(lambda m: _instance(m, "gym-0")["participants"][0].update(state_dir="gym/../../x")),
        r"instance gym-0: participant agent: state_dir 'gym/../../x' contains '\.\.'",
        "",
        ManifestError,
    ),
    (
        "hand-edited-digest",
        _edit(_set_digest),
        r"instance gym-1: participant calendar digest sha256:[0-9a-f]{12}… on disk, "
        r"sha256:000000000000… committed",
        "",
        TopologyMismatch,
    ),
    (
        "state-file-byte-changed",
        _flip_state_byte,
        r"instance gym-1: participant calendar digest sha256:[0-9a-f]{12}… on disk, "
        r"sha256:[0-9a-f]{12}… committed",
        "",
        TopologyMismatch,
    ),
    (
        "extra-participant",
        _edit(_add_participant),
        r"instance gym-0: participant scratchpad state directory gym/gym-0/scratchpad missing",
        r"instance gym-0: participant scratchpad missing from the live deployment",
        TopologyMismatch,
    ),
    (
        "missing-participant",
        _edit(_drop_participant),
        r"gym/gym-0/model_proxy: participant state on disk that gym_checkpoint.json does not "
        r"list",
        r"instance gym-0: extra live participant model_proxy",
        TopologyMismatch,
    ),
    (
        "missing-commit-marker",
        lambda snap: (snap / COMMIT_MARKER).unlink(),
        r"not a complete rollout snapshot: no COMMITTED marker",
        r"newest rollout snapshot has no COMMITTED marker \(latest complete one: ckpt-000001\)",
        ManifestError,
    ),
]


async def _restore_attempt(workdir: Path, error: type[Exception], message: str) -> None:
    """A restore through the facade fails with ``message`` and leaves the fresh Gym idle."""
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=3,
        work_dir=workdir / "gym2",
        config=SIM.host_config(),
    ) as gym:
        with pytest.raises(error) as raised:
            async with open_rollouts(gym, workdir, rows=ROWS, group_size=GROUP, config=CONFIG):
                pytest.fail("restored a damaged snapshot")
        assert raised.match(message)
        stats = await gym.statistics()
        for name, inst in zip(gym.instances, stats.instances, strict=True):
            inv = await gym.inventory(name)
            assert inv.unclaimed == inv.running == inv.parked == ()
            assert inst.restored == 0 and inst.episodes_started == 0
            assert await calendar_sessions_of(gym, name) == {}


@pytest.mark.parametrize(
    ("damage", "verify_says", "restore_says", "error"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_damaged_snapshot_is_a_clear_error_and_nothing_is_touched(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], None],
    verify_says: str,
    restore_says: str,
    error: type[Exception],
) -> None:
    workdir = tmp_path / "w"
    paths = make_snapshots(workdir, count=2)
    snap = paths[-1]
    assert main(["verify", str(snap)]) == 0
    capsys.readouterr()
    damage(snap)
    before = tree_digest(workdir / "snapshots")
    restore_says = restore_says or verify_says

    # gymckpt verify DIR: exit 2 and a line naming what differs
    assert main(["verify", str(snap)]) == 2
    assert _search(verify_says, capsys.readouterr().err)
    # gymckpt verify WORKDIR finds the damaged newest snapshot too
    assert main(["verify", str(workdir)]) == 2
    assert _search(
        restore_says if "marker" in restore_says else verify_says, capsys.readouterr().err
    )

    # a restore through the facade: the error, with a fresh Gym left untouched
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(_restore_attempt, workdir, error, restore_says, clock=clock)

    # a restore through the CLI (the demo's phase-2 process): exit 2, one line, no traceback
    opts = DemoOptions(rows=ROWS, group_size=GROUP, instances=2, seed=3, crash_after_checkpoint=0)
    rc = main(["_phase", "--phase", "2", "--workdir", str(workdir), "--options", opts.to_json()])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("gymckpt: error: ") and _search(restore_says, err)
    assert "Traceback" not in err

    assert tree_digest(workdir / "snapshots") == before  # the snapshot is untouched
    assert not (workdir / "journal.jsonl").exists()  # and the run never started


def _search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


def test_verify_json_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = make_snapshots(tmp_path / "w")[0]
    _flip_state_byte(snap)
    _edit(_drop_participant)(snap)
    assert main(["verify", "--json", str(snap)]) == 2
    report = orjson.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["problems"]) == 2
    assert any("gym-1: participant calendar digest" in p for p in report["problems"])
    assert any("gym/gym-0/model_proxy" in p for p in report["problems"])


def _drop_exported_row_from_ledger(snap: Path) -> str:
    """Hand-edit ledger.json (marker re-hashed): the row of an exported episode is marked
    trained and its attempts removed. Returns that episode's rollout ID."""
    ledger = orjson.loads((snap / "ledger.json").read_bytes())
    # edited in version 1's form (an array per attempt, still read)
    ledger.update(version=1, attempts=_attempt_arrays(ledger))
    dispatched = next(a for a in ledger["attempts"] if a[3] == "dispatched")
    row = dispatched[0]
    ledger["attempts"] = [a for a in ledger["attempts"] if a[0] != row]
    ledger["trained"] = [*ledger["trained"], [row, row]]
    (snap / "ledger.json").write_bytes(orjson.dumps(ledger))
    marker = orjson.loads((snap / COMMIT_MARKER).read_bytes())
    marker["files"]["ledger.json"] = hashlib.sha256((snap / "ledger.json").read_bytes()).hexdigest()
    (snap / COMMIT_MARKER).write_bytes(orjson.dumps(marker))
    return f"{row}-{dispatched[1]}" + (f"-a{dispatched[2]}" if dispatched[2] else "")


def test_ledger_inconsistent_with_the_manifest_fails_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = make_snapshots(tmp_path / "w")[0]
    rid = _drop_exported_row_from_ledger(snap)
    assert main(["verify", str(snap)]) == 2
    assert (
        f"gym_checkpoint.json: episode {rid} exported but not in flight in the ledger"
        in capsys.readouterr().err
    )


def test_ledger_inconsistent_with_the_manifest_is_refused_at_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "w"
    snap = make_snapshots(workdir)[0]
    rid = _drop_exported_row_from_ledger(snap)
    opts = DemoOptions(rows=ROWS, group_size=GROUP, instances=2, seed=3, crash_after_checkpoint=0)
    rc = main(["_phase", "--phase", "2", "--workdir", str(workdir), "--options", opts.to_json()])
    err = capsys.readouterr().err
    assert rid in err
    assert rc == 2, err
