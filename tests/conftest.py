"""Shared fixtures: one local Ray cluster per session for every test marked ``ray``.

Tests marked ``ray`` (including the ``ray`` variant of the Gym conformance suite) get the
session's cluster automatically and run on trio's real clock: Ray answers from other threads and
processes, which a virtual clock would leap past. The conformance tests that only make sense in
virtual time are skipped for Ray, each with its reason (``RAY_SKIPS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio.testing

RAY_SKIPS = {
    "test_replies_are_batched_per_flush_interval_and_max_batch":
        "asserts batch boundaries at exact virtual instants; real-time replies of one instant "
        "spread over a few ms and Ray re-batches them (batching on Ray: test_ray_backend.py)",
    "test_nothing_progresses_while_prepared":
        "waits 20 s of virtual time for nothing to happen",
    "test_prepare_parks_at_the_next_step_boundary":
        "asserts prepare returns at an exact virtual instant",
    "test_fault_hang_never_answers":
        "waits 30 s of virtual time; the Ray hang faults are covered with short real "
        "deadlines in test_ray_faults.py",
    "test_fault_delay_then_deadline":
        "asserts a delay of exactly 2 virtual seconds",
    "test_fault_unpicklable_becomes_checkpoint_unavailable":
        "sleeps the default 60 s lease; unpicklable errors on Ray are covered in "
        "test_ray_backend.py and test_ray_faults.py",
    "test_same_seed_same_replies_and_timings":
        "compares reply timings to the nanosecond, which only virtual time reproduces",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("open_gym") is None:
            continue
        if "ray" in callspec.id.split("-") and item.originalname in RAY_SKIPS:  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.skip(reason="Ray: " + RAY_SKIPS[item.originalname]))  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for the whole session (started once: about 2-4 s)."""
    ray = pytest.importorskip("ray")
    from gymckpt.gym_adapter._ray import local_cluster_options

    if ray.is_initialized():
        yield
        return
    ray.init(**local_cluster_options())
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _ray_cluster_for_ray_tests(request: pytest.FixtureRequest) -> None:
    if {"ray_nodes", "ray_head"} & set(request.fixturenames):
        return  # a cluster of its own
    if request.node.get_closest_marker("ray") is not None:
        request.getfixturevalue("ray_cluster")


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[Any]:
    """A multi-node Ray cluster on this machine (``NodeCluster``: a head without CPUs, which
    the driver connects to, and ``WORKER_NODES`` worker nodes), for one test module.

    The session's single-node cluster is shut down meanwhile and started again after (a
    process joins one cluster at a time). Each node is a real raylet with its own worker
    processes; removing one kills them all, as losing a machine does.
    """
    pytest.importorskip("ray")
    with NodeCluster.running() as nodes:
        yield nodes


WORKER_NODES = 3
"""Worker nodes of ``ray_nodes``: an instance on each, and room for two nodes to be lost."""
NODE_OPTIONS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
HEALTH_CHECKS: dict[str, int] = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
"""Ray finds a lost node by its GCS's health checks (by default every 3 s, dead after 5
failures: about 15 s). Until then the node's actors are *unavailable* (``ActorUnavailableError``,
retryable), after it *dead*; these settings make that about 1.5 s, as a cluster that wants to
replace lost instances quickly would set them."""


@attrs.define(eq=False)
class NodeCluster:
    """A ``ray.cluster_utils.Cluster`` on this machine, the driver connected to its head."""

    cluster: Any
    workers: dict[str, Any] = attrs.field(factory=dict)
    """Ray node ID -> the live worker node."""
    removed: list[str] = attrs.field(factory=list)

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[NodeCluster]:
        import ray
        from ray._private.utils import get_ray_address_file
        from ray.cluster_utils import Cluster

        from gymckpt.gym_adapter._ray import local_cluster_options

        reconnect = ray.is_initialized()
        if reconnect:
            ray.shutdown()
        # the Cluster records its address where ``ray.init()`` looks; put back what was there
        address_file = Path(get_ray_address_file(None))
        recorded = address_file.read_text() if address_file.exists() else None
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 * 2**20,
            "_system_config": HEALTH_CHECKS})
        try:
            nodes = cls(cluster)
            for _ in range(WORKER_NODES):
                nodes.add()
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            yield nodes
        finally:
            ray.shutdown()
            cluster.shutdown()
            if recorded is None:
                address_file.unlink(missing_ok=True)
            else:
                address_file.write_text(recorded)
            if reconnect:
                ray.init(**local_cluster_options())

    def add(self) -> str:
        """Start one more worker node; its Ray node ID."""
        node = self.cluster.add_node(**NODE_OPTIONS)
        node_id: str = node.node_id
        self.workers[node_id] = node
        return node_id

    def remove(self, node_id: str) -> None:
        """Kill every process of worker node ``node_id`` at once with SIGKILL, its raylet and
        the worker processes hosting its actors, as losing the machine does. (Killing only
        the raylet leaves its workers serving until they notice.)"""
        import psutil

        node = self.workers.pop(node_id)
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        for proc in [*raylet.children(recursive=True), raylet]:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        self.cluster.remove_node(node, allow_graceful=False)
        self.removed.append(node_id)

    def alive(self) -> set[str]:
        """The Ray node IDs the cluster holds alive right now."""
        import ray

        return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.fixture
def autojump_clock(request: pytest.FixtureRequest) -> trio.testing.MockClock | None:
    """pytest-trio's autojump clock, except for tests marked ``ray`` (real time)."""
    if request.node.get_closest_marker("ray") is not None:
        return None
    return trio.testing.MockClock(autojump_threshold=0)
