"""A multi-node Ray cluster on this machine, for tests and benchmarks that lose nodes.

``NodeCluster.running()`` starts a head (no CPUs: Gym instances never land on it; the driver
connects to it) and ``WORKER_NODES`` worker nodes with ``ray.cluster_utils.Cluster``, each a
real raylet with its own worker processes, and connects this process to the head. ``remove``
loses a worker node the way a machine is lost: every process of it killed at once.

Needs the ``ray`` extra (and ``psutil``, in the ``test`` and ``bench`` extras). A process joins
one cluster at a time: a Ray connection already open is closed first and opened again (on a
local cluster of its own) at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = ["HEALTH_CHECKS", "NODE_OPTIONS", "WORKER_NODES", "NodeCluster"]

WORKER_NODES: Final = 3
"""Worker nodes started by ``running``: an instance on each, and room for two nodes to be lost."""
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
    """A ``ray.cluster_utils.Cluster`` on this machine, this process connected to its head."""

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

        from gymckpt.gym_adapter import local_cluster_options

        reconnect = ray.is_initialized()
        if reconnect:
            ray.shutdown()
        # the Cluster records its address where ``ray.init()`` looks; put back what was there
        address_file = Path(get_ray_address_file(None))
        recorded = address_file.read_text() if address_file.exists() else None
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": 80 * 2**20,
                "_system_config": HEALTH_CHECKS,
            },
        )
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
