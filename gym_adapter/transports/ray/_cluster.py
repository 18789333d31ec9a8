"""This process's connection to a Ray cluster, and the watch that tells a lost cluster.

A process already connected to Ray keeps its connection; otherwise ``address=None`` starts a
local cluster of our own (``local_cluster_options``) for as long as a deployment uses it, and
``address="auto"`` or an address joins a cluster and leaves it running. Every deployment of the
process shares the connection (``acquire_cluster`` / ``release_cluster``): the last one to leave
disconnects, if the connection is ours.

Why the GCS is watched (``GcsWatch``): a Ray client that cannot reach its GCS gives up after
``gcs_rpc_server_reconnect_timeout_s`` (60 s by default) by ending the process — exit 1, no
exception, nothing of ours. Until then every actor call fails as *unavailable*, which would read
as Gym failing. The watch raises ``GymConnectionLost`` well before Ray's limit, so the run stops
with its last snapshot intact.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Final

import attrs
import ray
import trio

from gymckpt.runtime import GymConnectionLost

from .._errors import as_if_no_nursery, first_line
from .._niceness import INSTANCE_NICENESS, check_instance_niceness

__all__ = [
    "CLUSTER_LOSS_S",
    "GcsWatch",
    "acquire_cluster",
    "as_if_no_nursery",
    "local_cluster_options",
    "release_cluster",
]

logger = logging.getLogger("gymckpt")

GCS_PROBE_INTERVAL_S: Final = 1.0
"""How often a deployment checks that the cluster's GCS still accepts connections."""
GCS_PROBE_TIMEOUT_S: Final = 2.0
"""How long one such check waits for the connection."""
CLUSTER_LOSS_S: Final = 10.0
"""Default ``cluster_loss_s``: a GCS silent this long is the cluster lost (Ray's client itself
ends the process after 60 s by default)."""
SHUTDOWN_TIMEOUT_S: Final = 5.0
"""How long leaving a lost cluster may take (``ray.shutdown``)."""


def local_cluster_options(instance_niceness: int = INSTANCE_NICENESS) -> dict[str, Any]:
    """``ray.init`` arguments of the local cluster started when no address is given: always a
    new cluster of our own (``address="local"``: never one that happens to run on this machine,
    which ``ray.init()`` would join and then refuse these options, nor one a ``ray start`` or a
    test cluster recorded in Ray's temp directory and that is gone — Ray's client then spends
    60 s failing to reach its GCS and ends the process), no dashboard, a small object store,
    worker output kept out of the driver's, and workers ``instance_niceness`` steps below the
    driver (``transports/_niceness``; Ray's own default, 15, would make our Gym instances' episodes
    wait whenever the trainer on the same machine works)."""
    return {
        "address": "local",
        "include_dashboard": False,
        "object_store_memory": 100 * 2**20,
        "log_to_driver": False,
        "_system_config": {"worker_niceness": check_instance_niceness(instance_niceness)},
    }


@attrs.define(eq=False)
class _ClusterUse:
    """This process's use of Ray: connected by us (and disconnected by the last user)?"""

    users: int = 0
    ours: bool = False
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def connect(self, address: str | None, instance_niceness: int) -> bool:
        with self.lock:
            if ray.is_initialized():
                return False
            if address is None:
                ray.init(**local_cluster_options(instance_niceness))
                return True
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as exc:
                raise GymConnectionLost(
                    f"cannot join the Ray cluster at {address}: {first_line(exc)}", address
                ) from None
            return True


_CLUSTER = _ClusterUse()


async def acquire_cluster(address: str | None, instance_niceness: int = INSTANCE_NICENESS) -> None:
    """Connect this process to Ray (unless it is already), for one more user; a local cluster
    started here runs its workers ``instance_niceness`` steps below this process."""
    _CLUSTER.users += 1
    try:
        if address is not None and not ray.is_initialized():
            await _check_reachable(address)
        if await trio.to_thread.run_sync(_CLUSTER.connect, address, instance_niceness):
            _CLUSTER.ours = True
    except BaseException:
        _CLUSTER.users -= 1
        raise


async def release_cluster(lost: bool) -> None:
    """One user less; the last one disconnects a connection of ours (bounded if ``lost``)."""
    _CLUSTER.users -= 1
    if _CLUSTER.users == 0 and _CLUSTER.ours:
        _CLUSTER.ours = False
        # with the cluster gone, Ray's shutdown may wait on it: never longer than this
        with trio.move_on_after(SHUTDOWN_TIMEOUT_S if lost else math.inf):
            await trio.to_thread.run_sync(ray.shutdown, abandon_on_cancel=True)


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` GCS address; None for anything else (``auto``, a
    ``ray://`` client address), which is left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def _gcs_answers(host: str, port: int, timeout_s: float) -> bool:
    """Does the GCS at ``host:port`` accept a connection within ``timeout_s``?"""
    with trio.move_on_after(timeout_s):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


async def _check_reachable(address: str) -> None:
    """Before ``ray.init(address=...)``: a GCS that does not answer makes Ray's client retry for
    60 s and then end the process (exit 1, no word of ours); say so at once instead."""
    where = _host_port(address)
    if where is None:
        return
    if not await _gcs_answers(*where, GCS_PROBE_TIMEOUT_S * 2):
        raise GymConnectionLost(
            f"cannot reach the Ray cluster: nothing answers at {address} (its GCS); start it "
            "(ray start --head) or give the address of a running cluster",
            address,
        )


@attrs.define(eq=False)
class GcsWatch:
    """The trainer's connection to the cluster, watched: ``run`` raises ``GymConnectionLost``
    once the GCS has not accepted a connection for ``loss_s`` (probed every
    ``GCS_PROBE_INTERVAL_S``). ``loss_s`` must be well below Ray's own limit (see the module
    docstring)."""

    address: str
    loss_s: float
    lost: bool = False

    async def run(self) -> None:
        where = _host_port(self.address)
        if where is None:
            return
        last_ok = trio.current_time()
        while True:
            if await _gcs_answers(*where, GCS_PROBE_TIMEOUT_S):
                last_ok = trio.current_time()
            elif (silent := trio.current_time() - last_ok) >= self.loss_s:
                self.lost = True
                lost = GymConnectionLost(
                    f"lost the Ray cluster: its GCS at {self.address} has not answered for "
                    f"{silent:.0f}s; the last snapshot is intact: restart once the cluster is "
                    "back to resume from it",
                    self.address,
                )
                logger.error("the run stops: %s", lost)
                raise lost
            await trio.sleep(GCS_PROBE_INTERVAL_S)
