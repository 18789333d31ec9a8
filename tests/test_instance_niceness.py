"""The instance processes gymckpt starts on the trainer's machine run ``instance_niceness``
steps below the trainer (``gym_adapter/transports/_niceness``): ``HttpGym.spawn``'s real
``gymckpt serve`` processes (every thread of them, since a thread inherits its creator's
niceness) and the local Ray cluster's workers (``local_cluster_options``); a value that is not
a niceness is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import trio

from gymckpt.gym_adapter import HttpGym
from gymckpt.gym_adapter.environments.calendar import calendar_from_environ_path
from gymckpt.gym_adapter.transports._niceness import (
    INSTANCE_NICENESS,
    check_instance_niceness,
)


def _thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of process ``pid`` (field 19 of its tasks' ``stat``)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        out.add(int(stat.rpartition(")")[2].split()[16]))
    return out


@pytest.mark.parametrize("bad", [-1, 20, 2.0, True, "3", None])
def test_a_value_that_is_not_a_niceness_is_refused_saying_the_range(bad: object) -> None:
    with pytest.raises(ValueError, match=r"instance_niceness must be an int from 0 .* to 19"):
        check_instance_niceness(bad)


async def test_a_bad_niceness_starts_no_server(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="instance_niceness"):
        async with HttpGym.spawn(
            calendar_from_environ_path(), 1, work_dir=tmp_path, instance_niceness=-2
        ):
            pass  # pragma: no cover
    assert not list(tmp_path.glob("*.serve.log"))  # noqa: ASYNC240 - after the spawn


@pytest.mark.http
@pytest.mark.parametrize("niceness", [3, None])
async def test_spawned_servers_run_their_threads_the_niceness_below_the_trainer(
    tmp_path: Path, niceness: int | None
) -> None:
    own = os.nice(0)
    expected = own + (INSTANCE_NICENESS if niceness is None else niceness)
    extra = {} if niceness is None else {"instance_niceness": niceness}
    with trio.fail_after(120):
        async with HttpGym.spawn(
            calendar_from_environ_path(), 2, work_dir=tmp_path, **extra
        ) as gym:
            for name in gym.instances:
                pid = gym.pid(name)
                assert pid is not None
                assert _thread_niceness(pid) == {min(19, expected)}
    assert os.nice(0) == own  # the trainer's own priority is untouched


def test_the_local_ray_cluster_asks_for_its_workers_at_the_niceness() -> None:
    pytest.importorskip("ray")
    from gymckpt.gym_adapter import local_cluster_options

    assert local_cluster_options()["_system_config"] == {"worker_niceness": INSTANCE_NICENESS}
    assert local_cluster_options(7)["_system_config"] == {"worker_niceness": 7}
    with pytest.raises(ValueError, match="instance_niceness"):
        local_cluster_options(-1)


@pytest.mark.ray
def test_a_local_ray_cluster_started_by_raygym_runs_its_workers_the_niceness_below() -> None:
    """``RayGym.host`` with no address starts the cluster (in a process of its own here: the
    session's cluster is already connected, and a connected process keeps its cluster)."""
    pytest.importorskip("ray")
    script = textwrap.dedent(
        """
        import os, sys, tempfile
        import ray, trio
        from gymckpt.gym_adapter import RayGym
        from gymckpt.gym_adapter.environments.calendar import calendar_from_environ_path

        @ray.remote
        def niceness():
            return os.nice(0)

        async def main():
            with tempfile.TemporaryDirectory() as wd:
                async with RayGym.host(
                    calendar_from_environ_path(), 1, work_dir=wd, instance_niceness=4
                ):
                    print("worker", ray.get(niceness.remote(), timeout=60), flush=True)

        trio.run(main)
        """
    )
    with tempfile.TemporaryDirectory(prefix="gk-") as short:  # Ray's sockets live under TMPDIR
        env = {**os.environ, "TMPDIR": short}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"worker {min(19, os.nice(0) + 4)}" in proc.stdout


def test_a_cluster_we_start_gets_the_niceness_one_joined_or_connected_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("ray")
    from gymckpt.gym_adapter.transports.ray import _cluster

    inits: list[dict[str, object]] = []
    monkeypatch.setattr(_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(_cluster.ray, "init", lambda **kw: inits.append(kw))
    assert _cluster._ClusterUse().connect(None, 7)
    assert inits[-1]["_system_config"] == {"worker_niceness": 7}
    assert _cluster._ClusterUse().connect("127.0.0.1:6379", 7)  # joined: its workers' own
    assert "_system_config" not in inits[-1]
    monkeypatch.setattr(_cluster.ray, "is_initialized", lambda: True)
    assert not _cluster._ClusterUse().connect(None, 7)  # already connected: kept
    assert len(inits) == 2
