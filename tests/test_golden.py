"""Golden fixtures: today's bytes of a rollout snapshot, of the HTTP wire and of the command
line's ``--json`` outputs, regenerated with the current code and compared byte for byte with
``tests/data/golden`` (issue 32: a restructure changes none of them).

``tests/golden_capture.py`` says what is captured, how the runs are made deterministic (trio's
``MockClock`` and seeded scheduling for the snapshots; sequential calls and a held episode for
the wire; crashes from inside for the demos) and the few fields it normalises (temporary paths,
the trainer's random lineage, a server's random incarnation, wall-clock durations), each seen
to differ between two runs of the same inputs (``golden_capture.py OUT --raw``, twice, then
``diff -r``).

A failure names each file that differs, with a diff: a change to an on-disk format, the wire or
a ``--json`` output. Unless that change is deliberate, fix the code. Regenerating the fixtures
needs a reason: a deliberate format change that bumps the format's version (the manifest's
``version``, ``gymckpt-http/2``, ...) and says so in the commit; then

    .venv/bin/python tests/golden_capture.py /tmp/golden-new
    rm -rf tests/data/golden && mv /tmp/golden-new tests/data/golden

and read ``git diff tests/data/golden`` before committing it.
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "golden"
PARTS = ("snapshot", "wire", "cli")

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden tree as the current code writes it (one capture for every part)."""
    out = tmp_path_factory.mktemp("golden") / "now"
    done = subprocess.run(
        [sys.executable, str(HERE / "golden_capture.py"), str(out)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, f"the capture failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _diff(name: str, want: bytes, got: bytes) -> str:
    lines = difflib.unified_diff(
        want.decode(errors="replace").splitlines(keepends=True),
        got.decode(errors="replace").splitlines(keepends=True),
        f"golden/{name}",
        f"now/{name}",
    )
    return "".join(lines)[:3000] or f"{name}: the bytes differ (line endings or encoding)\n"


def golden_differences(golden: Path, now: Path) -> list[str]:
    """What differs between two golden trees: each missing, extra or changed file, named."""
    want, got = _files(golden), _files(now)
    problems = [f"{n}: in the fixtures, not written now" for n in sorted(want.keys() - got)]
    problems += [f"{n}: written now, not in the fixtures" for n in sorted(got.keys() - want)]
    for name in sorted(want.keys() & got.keys()):
        if want[name] != got[name]:
            problems.append(_diff(name, want[name], got[name]))
    return problems


@pytest.mark.parametrize("part", PARTS)
def test_the_bytes_are_todays(captured: Path, part: str) -> None:
    assert (GOLDEN / part).is_dir(), f"no fixtures under {GOLDEN / part}"
    problems = golden_differences(GOLDEN / part, captured / part)
    assert not problems, f"{len(problems)} file(s) differ from tests/data/golden/{part}:\n" + (
        "\n".join(problems)
    )


def test_a_changed_byte_is_named_with_its_diff(tmp_path: Path) -> None:
    """The comparison itself: one byte changed, one file missing, one extra, each named."""
    golden, now = tmp_path / "golden", tmp_path / "now"
    for root in (golden, now):
        (root / "a").mkdir(parents=True)
        (root / "a" / "same.json").write_bytes(b'{"x": 1}\n')
    (golden / "a" / "m.json").write_bytes(b'{"version": 4, "id": "c1"}\n')
    (now / "a" / "m.json").write_bytes(b'{"version": 5, "id": "c1"}\n')
    (golden / "gone.http").write_bytes(b"")
    (now / "new.http").write_bytes(b"")
    problems = golden_differences(golden, now)
    assert problems[:2] == [
        "gone.http: in the fixtures, not written now",
        "new.http: written now, not in the fixtures",
    ]
    assert len(problems) == 3 and "golden/a/m.json" in problems[2]
    assert '-{"version": 4, "id": "c1"}' in problems[2]
    assert '+{"version": 5, "id": "c1"}' in problems[2]
