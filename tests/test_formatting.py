"""The tree is formatted and linted as ``pyproject.toml`` says: ``ruff format --check`` and
``ruff check`` change nothing.

The formatter's output depends on its version, so the test extra pins ruff's minor version;
a new ruff that formats differently is a deliberate upgrade (bump the pin, reformat, commit).
To fix a failure: ``ruff format . && ruff check --fix .``, then read the diff.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.subprocess


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it is in the test extra (pip install -e '.[test]')")
    return [found]


@pytest.mark.parametrize(
    "args", [["format", "--check", "--diff"], ["check", "--no-cache"]], ids=["format", "lint"]
)
def test_ruff_changes_nothing(args: list[str]) -> None:
    out = subprocess.run(
        [*_ruff(), *args, "."], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
