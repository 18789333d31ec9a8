"""Small things a new user meets: a restored run prints short and says it resumed; an unknown
Gymnasium id is "no such environment"; a missing extra is one line naming it; the demo cleans
its temporary directory; mypy sees gymckpt's types after the README's editable install."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing

from gymckpt.app.cli import main as cli_main
from gymckpt.gym_adapter import (
    EmbeddedGym,
    EnvironmentSpecError,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import RuntimeConfig

REPO = Path(__file__).resolve().parent.parent
SIM = CalendarConfig(turns=(1, 2), turn_s=(0.5, 1.0), mutation_p=0.5, lease_s=30.0)
CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, drain_timeout_s=5.0, lease_s=30.0)


async def _two_incarnations(tmp_path: Path, rows: int = 48) -> tuple[str, str]:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=1,
        work_dir=tmp_path / "gym",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(
            gym, tmp_path / "w", rows=rows, group_size=2, config=CONFIG, max_rows_in_flight=48
        ) as ro:
            await trio.sleep(5)  # every episode completes: 48 untrained groups in the snapshot
            outcome = await ro.checkpoint(b"x" * 10_000)
            assert outcome.ok and outcome.snapshot is not None
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=2,
        seed=1,
        work_dir=tmp_path / "gym2",
        config=SIM.host_config(),
    ) as gym:
        async with open_rollouts(gym, tmp_path / "w", rows=rows, group_size=2, config=CONFIG) as ro:
            assert ro.restored is not None
            return repr(ro.restored), str(outcome.snapshot.path)


async def test_a_restored_run_prints_short(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    shown, snapshot = await _two_incarnations(tmp_path)
    assert len(shown) < 300, shown  # not every byte of the snapshot's files
    assert snapshot in shown and "run-0001" in shown and "completed_untrained=96" in shown


async def test_a_resumed_run_says_so_at_warning(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gymckpt"):
        _shown, snapshot = await _two_incarnations(tmp_path)
    said = [r for r in caplog.records if "resumed from snapshot" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert (
        said[0]
        .getMessage()
        .startswith(f"gymckpt: resumed from snapshot {snapshot} (checkpoint run-0001) at step 0: ")
    )


RERUN = textwrap.dedent("""
    import gymckpt
    from gymckpt.gym_adapter.environments.calendar import calendar_environment

    async def main() -> None:
        async with gymckpt.EmbeddedGym.host(
            calendar_environment(), instances=2, work_dir="gym-live"
        ) as gym:
            async with gymckpt.open_rollouts(gym, "work", rows=8, group_size=2) as rollouts:
                async for _batch in rollouts.batches(groups_per_step=2):
                    await rollouts.checkpoint()
                    break  # one step, then "crash" (end) with a snapshot left

    gymckpt.run(main)
""")


@pytest.mark.subprocess
def test_a_rerun_that_resumed_says_so_on_stderr_with_no_logging_configured(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(RERUN)
    runs = [
        subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr
    assert "resumed" not in runs[0].stderr  # a fresh start says nothing
    lines = [ln for ln in runs[1].stderr.splitlines() if "resumed from snapshot" in ln]
    assert len(lines) == 1, runs[1].stderr
    assert lines[0].startswith(f"gymckpt: resumed from snapshot {tmp_path}/work/snapshots/ckpt-")


def test_an_unknown_gymnasium_id_is_no_such_environment() -> None:
    from gymckpt.gym_adapter.environments.gymnasium import gymnasium_environment

    with pytest.raises(EnvironmentSpecError, match="no such Gymnasium environment 'NoSuch"):
        gymnasium_environment("NoSuchEnv-v0")
    with pytest.raises(EnvironmentSpecError, match="no such Gymnasium environment"):
        gymnasium_environment("CartPole-v9")  # a known name, an unknown version
    with pytest.raises(EnvironmentSpecError, match="has no state codec"):
        gymnasium_environment("CarRacing-v3")  # exists, but cannot be checkpointed


def test_demo_on_an_unknown_gymnasium_id_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli_main(["demo", "--env", "gymnasium:NoSuchEnv-v0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gymckpt: error: no such Gymnasium environment 'NoSuchEnv-v0': "
        "Environment `NoSuchEnv` doesn't exist."
    ]
    assert list(tmp_path.iterdir()) == []  # no phase started, no directory made


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which ``modules`` are not installed (for this process and its
    children): each is shadowed by a package that raises as a missing one does."""
    shadow = tmp_path / "shadow"
    for module in modules:
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n"
        )
    path = os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("argv", "missing", "extra"),
    [
        (["demo", "--env", "gymnasium:CartPole-v1"], "gymnasium", "gymnasium"),
        (["bench", "host", "--quick", "--no-ray"], "gymnasium", "gymnasium"),
        (["bench", "memory", "--quick"], "psutil", "bench"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, argv: list[str], missing: str, extra: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gymckpt", *argv],
        cwd=tmp_path,
        env=_without(tmp_path, missing),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"pip install -e '.[{extra}]'" in lines[0] and missing in lines[0]


def test_the_demo_removes_its_temporary_directory_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fast = ["demo", "--rows", "8", "--group-size", "2", "--crash-after-checkpoint", "0"]
    assert cli_main(fast) == 0
    assert "(removed; --keep keeps it)" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert cli_main([*fast, "--keep"]) == 0
    (kept,) = tmp_path.iterdir()
    assert kept.name.startswith("gymckpt-demo-") and (kept / "snapshots").is_dir()
    assert f"workdir {kept}\n" in capsys.readouterr().out


@pytest.mark.subprocess
@pytest.mark.timeout(400)
def test_mypy_sees_gymckpt_types_after_the_readme_editable_install(tmp_path: Path) -> None:
    """The README's ``pip install -e .`` of a clone, in a fresh virtual environment (its own
    pip: the test's environment is left alone), then mypy on a user's file."""
    src = tmp_path / "clone"  # the checkout as it is (a file not yet committed included)
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        path = REPO / name
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            (src / name).symlink_to(path.readlink())
        elif path.is_file():
            (src / name).write_bytes(path.read_bytes())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # the dependencies, from this environment (installing them again is not the point)
    ours = subprocess.run(
        [
            sys.executable,
            "-c",
            "import attrs, os; print(os.path.dirname(os.path.dirname(attrs.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site.strip()) / "deps.pth").write_text(ours + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(src)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    user = tmp_path / "user"
    user.mkdir()
    (user / "train.py").write_text(
        textwrap.dedent("""
        import gymckpt

        config = gymckpt.RuntimeConfig(lease_s=60.0)
        lease: int = config.lease_s  # a float: only gymckpt's own types can tell
    """)
    )
    checked = subprocess.run(
        [
            str(Path(sys.executable).parent / "mypy"),
            "--python-executable",
            str(py),
            "--no-incremental",
            "train.py",
        ],
        cwd=user,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert checked.returncode == 1, checked.stdout
    assert checked.stdout.splitlines()[:-1] == [
        'train.py:5: error: Incompatible types in assignment (expression has type "float", '
        'variable has type "int")  [assignment]'
    ], checked.stdout
    imported = subprocess.run(
        [str(py), "-c", "import gymckpt; print(gymckpt.__file__)"],
        cwd=user,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == str(src / ".typecheck" / "gymckpt" / "__init__.py")
