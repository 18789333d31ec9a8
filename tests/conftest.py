"""Shared fixtures: one local Ray cluster per session for every test marked ``ray``.

Tests marked ``ray`` (including the ``ray`` variant of the Gym conformance suite) get the
session's cluster automatically and run on trio's real clock: Ray answers from other threads and
processes, which a virtual clock would leap past. Tests marked ``http`` (the ``http`` variant:
real ``gymckpt serve`` processes) run on the real clock too, for the same reason. The
conformance tests that only make sense in virtual time are skipped for both, each with its
reason (``RAY_SKIPS``, ``HTTP_SKIPS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio.testing

RAY_SKIPS = {
    "test_replies_are_batched_per_flush_interval_and_max_batch": (
        "asserts batch boundaries at exact virtual instants; real-time replies of one instant "
        "spread over a few ms and Ray re-batches them (batching on Ray: test_ray_backend.py)"
    ),
    "test_nothing_progresses_while_prepared": "waits 20 s of virtual time for nothing to happen",
    "test_prepare_parks_at_the_next_step_boundary": (
        "asserts prepare returns at an exact virtual instant"
    ),
    "test_fault_hang_never_answers": (
        "waits 30 s of virtual time; the Ray hang faults are covered with short real "
        "deadlines in test_ray_faults.py"
    ),
    "test_fault_delay_then_deadline": "asserts a delay of exactly 2 virtual seconds",
    "test_fault_unpicklable_becomes_checkpoint_unavailable": (
        "sleeps the default 60 s lease; unpicklable errors on Ray are covered in "
        "test_ray_backend.py and test_ray_faults.py"
    ),
    "test_same_seed_same_replies_and_timings": (
        "compares reply timings to the nanosecond, which only virtual time reproduces"
    ),
}


HTTP_SKIPS = {
    **RAY_SKIPS,
    "test_replies_are_batched_per_flush_interval_and_max_batch": (
        "asserts batch boundaries at exact virtual instants; real-time replies of one instant "
        "spread over a few ms (batching over HTTP: test_http_backend.py)"
    ),
    "test_fault_hang_never_answers": (
        "waits 30 s of virtual time; a server that never answers is covered with short real "
        "deadlines in test_http_backend.py"
    ),
    "test_fault_unpicklable_becomes_checkpoint_unavailable": (
        "sleeps the default 60 s lease; an error that cannot cross HTTP is "
        "GymCheckpointUnavailable (test_http_backend.py)"
    ),
}
"""The conformance tests skipped for HTTP (real time: Ray's reasons, in HTTP's words)."""
REAL_TIME = ("ray", "http")
"""Marks whose tests run on the real clock."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the long soaks (marked slow); CI runs their short versions",
    )
    parser.addoption(
        "--real-engine",
        action="store_true",
        help="also run the tests against a real engine (marked real_engine: transformers serve)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--slow"):
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.skip(reason="a long soak: run with --slow"))
    if not config.getoption("--real-engine"):
        for item in items:
            if item.get_closest_marker("real_engine") is not None:
                reason = "a real engine (transformers serve): run with --real-engine"
                item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("open_gym") is None:
            continue
        ids = callspec.id.split("-")
        name = item.originalname  # type: ignore[attr-defined]
        if "ray" in ids and name in RAY_SKIPS:
            item.add_marker(pytest.mark.skip(reason="Ray: " + RAY_SKIPS[name]))
        if "http" in ids and name in HTTP_SKIPS:
            item.add_marker(pytest.mark.skip(reason="HTTP: " + HTTP_SKIPS[name]))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for the whole session (started once: about 2-4 s)."""
    ray = pytest.importorskip("ray")
    from gymckpt.gym_adapter.transports.ray._gym import local_cluster_options

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
    from gymckpt.testing.ray_nodes import NodeCluster

    with NodeCluster.running() as nodes:
        yield nodes


@pytest.fixture
def autojump_clock(request: pytest.FixtureRequest) -> trio.testing.MockClock | None:
    """pytest-trio's autojump clock, except for tests marked ``ray`` or ``http`` (real time)."""
    if any(request.node.get_closest_marker(mark) is not None for mark in REAL_TIME):
        return None
    return trio.testing.MockClock(autojump_threshold=0)
