"""The installed shape: one ``gymckpt`` namespace, ``py.typed``, ``gymckpt --version``.

A regular (non-editable) install is checked for real: the wheel is built from a copy of the
tracked source, its file list inspected, and it is unpacked as ``pip install --target`` would
and imported from outside the repository, in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gymckpt

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "gym_adapter", "nurseries", "app", "benchmarks", "testing")
GENERIC = ("runtime", "nurseries", "gym_adapter", "benchmarks", "tests", "testing")


def test_version_flag_prints_the_installed_version(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gymckpt", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"gymckpt {gymckpt.__version__}"
    assert gymckpt.__version__ != "0+unknown"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the tracked source (built from a copy: no build/ left in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        path = REPO / name
        if path.is_symlink():  # .typecheck/gymckpt, where the build finds the packages
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).symlink_to(path.readlink())
        elif path.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(path.read_bytes())
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (built,) = dist.glob("gymckpt-*.whl")
    return built


def test_the_wheel_installs_one_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"gymckpt", f"gymckpt-{gymckpt.__version__}.dist-info"}
    assert "gymckpt/py.typed" in names
    for pkg in ("runtime", "gym_adapter", "nurseries", "app", "benchmarks"):
        assert f"gymckpt/{pkg}/__init__.py" in names or any(
            n.startswith(f"gymckpt/{pkg}/") for n in names
        ), pkg
    assert not any(n.startswith("gymckpt/tests/") for n in names)
    # benchmark results are documentation (docs/benchmarks/results), not code: none installed
    results = [n for n in names if n.endswith((".json", ".png", ".md")) or "/results/" in n]
    assert results == [], results


def test_the_package_folders_hold_only_code() -> None:
    """An editable install is the checkout itself: data in a package folder (benchmark results
    once were) is installed with it. Results and documents live in ``docs/``."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *PACKAGES],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    data = [name for name in tracked.split("\0") if name and not name.endswith(".py")]
    assert data == [], f"move these out of the package folders (docs/ or tests/): {data}"


def test_a_regular_install_imports_gymckpt_and_nothing_generic(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = f"""
import importlib, sys
sys.path.insert(0, {str(site)!r})
import gymckpt
assert gymckpt.__file__.startswith({str(site)!r}), gymckpt.__file__
from gymckpt.app.cli import main
import gymckpt.runtime, gymckpt.gym_adapter, gymckpt.nurseries, gymckpt.benchmarks
for name in {GENERIC!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    raise SystemExit(f"{{name}} is importable at top level")
print(gymckpt.__version__)
sys.exit(main(["--version"]))
"""
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [gymckpt.__version__, "gymckpt", gymckpt.__version__]


def test_ray_gym_without_ray_names_the_extra(tmp_path: Path) -> None:
    # ``sys.modules["ray"] = None`` makes ``import ray`` fail as it does where Ray is not installed.
    probe = (
        "import sys; sys.modules['ray'] = None\n"
        "import gymckpt\n"
        "try:\n"
        "    gymckpt.RayGym\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == (
        "ray | gymckpt's RayGym needs Ray, an optional extra: pip install 'gymckpt[ray]'"
    ), out.stdout + out.stderr
