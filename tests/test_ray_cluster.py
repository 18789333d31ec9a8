"""The cluster connection's pure parts: which addresses are probed, and the GCS watch on a
port nothing listens on (no Ray cluster needed); the local cluster's workers run
``INSTANCE_NICENESS`` below the driver (the session's cluster)."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

pytest.importorskip("ray")

from gymckpt.gym_adapter.transports._niceness import INSTANCE_NICENESS
from gymckpt.gym_adapter.transports.ray._cluster import (
    GcsWatch,
    _host_port,
    as_if_no_nursery,
    local_cluster_options,
)
from gymckpt.runtime import GymConnectionLost


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("ray://head:10001", None),
        ("head:port", None),
    ],
)
def test_only_host_port_addresses_are_probed(address: str, expected: object) -> None:
    assert _host_port(address) == expected


def test_the_local_cluster_is_always_a_new_one() -> None:
    assert local_cluster_options()["address"] == "local"


def test_the_local_cluster_asks_for_workers_the_instance_niceness_below_the_driver() -> None:
    """Not Ray's default (15): the instances would wait whenever the trainer works."""
    assert local_cluster_options()["_system_config"] == {"worker_niceness": INSTANCE_NICENESS}
    assert INSTANCE_NICENESS < 15


@pytest.mark.ray
def test_the_local_cluster_runs_its_workers_the_instance_niceness_below_the_driver() -> None:
    """The session's cluster is ``local_cluster_options``'s: an actor there (a Gym instance's
    process) runs ``INSTANCE_NICENESS`` below the driver (Ray's default is 15)."""
    import ray

    @ray.remote
    class Niceness:
        def get(self) -> int:
            return os.nice(0)

    actor = Niceness.remote()  # type: ignore[attr-defined]
    try:
        assert ray.get(actor.get.remote(), timeout=60) == min(19, os.nice(0) + INSTANCE_NICENESS)
    finally:
        ray.kill(actor)


def test_one_error_leaves_the_nursery_as_it_went_in() -> None:
    with pytest.raises(KeyError), as_if_no_nursery():
        raise BaseExceptionGroup("one", [KeyError("k")])
    with pytest.raises(BaseExceptionGroup), as_if_no_nursery():
        raise BaseExceptionGroup("two", [KeyError("k"), ValueError("v")])


async def test_a_silent_gcs_is_the_cluster_lost() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there any more: every probe is refused
    watch = GcsWatch(f"127.0.0.1:{port}", loss_s=2.5)
    with trio.fail_after(30), pytest.raises(GymConnectionLost, match="has not answered"):
        await watch.run()
    assert watch.lost


async def test_a_watch_of_an_address_it_cannot_probe_ends_at_once() -> None:
    watch = GcsWatch("auto", loss_s=1.0)
    with trio.fail_after(1):
        await watch.run()
    assert not watch.lost
