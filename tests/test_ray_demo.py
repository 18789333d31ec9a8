"""``gymckpt demo --backend ray --json``: the two-process crash and restore on Ray.

Phase 1 (a real SIGKILL after its first checkpoint) and phase 2 (a fresh deployment with the
same topology restoring it) are separate processes. Without ``--ray-address`` each phase starts
and stops its own local cluster; with it, both join the session's cluster and leave it running.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]


def demo(workdir: Path, *extra: str) -> dict[str, object]:
    cmd = [
        sys.executable,
        "-m",
        "gymckpt",
        "demo",
        "--backend",
        "ray",
        "--json",
        "--rows",
        "32",
        "--workdir",
        str(workdir),
        *extra,
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.timeout(240)  # a local cluster started and stopped by each phase: as demo() waits
def test_demo_on_its_own_local_clusters_is_exactly_once(tmp_path: Path) -> None:
    report = demo(tmp_path / "w")
    assert report["exactly_once"] is True
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["backend"] == "ray"
    assert report["duplicates"] == report["lost"] == report["steps_trained_twice"] == 0
    assert report["checkpoint_mode"] == "aligned" and report["episodes_mid_turn"] == 0


def test_unaligned_checkpoints_on_ray_take_episodes_mid_turn_exactly_once(
    tmp_path: Path,
) -> None:
    import ray

    # the session's cluster (starting one per phase is the first test's): each actor takes
    # its own cut, and the restore is a fresh deployment on the same cluster
    address = ray.get_runtime_context().gcs_address
    report = demo(
        tmp_path / "w",
        "--ray-address",
        address,
        "--checkpoint-mode",
        "unaligned",
        "--crash-after-checkpoint",
        "1",
    )
    assert report["exactly_once"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["duplicates"] == report["lost"] == report["sentinels_duplicated"] == 0
    assert report["checkpoint_mode"] == "unaligned" and report["backend"] == "ray"
    assert report["episodes_mid_turn"] > 0, report


def test_demo_joins_a_running_cluster_and_leaves_it_running(tmp_path: Path) -> None:
    import ray

    address = ray.get_runtime_context().gcs_address
    report = demo(tmp_path / "w", "--ray-address", address, "--fault", "commit:error@2")
    assert report["exactly_once"] is True and report["restores"] == 1
    assert report["checkpoints_failed"] >= 1  # the injected commit error, retried
    assert ray.is_initialized() and ray.cluster_resources().get("CPU", 0) > 0  # still up


def test_a_dead_instance_is_replaced_and_the_demo_stays_exactly_once(tmp_path: Path) -> None:
    # the 4th prepare is the second checkpoint of phase 2 (3 instances): its instance dies
    report = demo(tmp_path / "w", "--instances", "3", "--fault", "prepare:dead@4")
    assert report["exactly_once"] is True and report["restores"] == 1
    assert report["replacements"] >= 1
    assert report["checkpoints_failed"] >= 1  # the checkpoint that met the death
    assert report["duplicates"] == report["lost"] == report["sentinels_duplicated"] == 0
