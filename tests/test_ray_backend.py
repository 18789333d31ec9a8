"""RayGym on a local Ray cluster: placement, the trio-asyncio bridge, cancellation, errors.

Real time throughout (no virtual clock can drive Ray); bounds are generous. The session's
cluster comes from ``conftest.ray_cluster``. ``open_for_conformance`` is the Ray factory of the
Gym conformance suite (``tests/test_gym_conformance.py``).
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from gymckpt.gym_adapter import (
    Completed,
    EnvironmentRef,
    GymControlError,
    GymInstanceDead,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_sessions_of,
    plan_episode,
    sentinel,
)

if TYPE_CHECKING:
    from gymckpt.gym_adapter import RayGym
from gymckpt.nurseries._calls import bounded_call, classify
from gymckpt.runtime import (
    GymCallTimeout,
    GymCheckpointUnavailable,
    RuntimeConfig,
    TopologyMismatch,
    rollout_id_for,
)

RAY_TIME_SCALE = 5.0
"""The conformance suite's episodes run this many times slower on Ray: its scenarios were timed
for a virtual clock (turns of 10-50 ms, events a few ms apart), and on Ray real replies take a
few ms each way. Stretching the turns keeps every assertion and widens the margins."""


def calendar_on_ray(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    config: CalendarConfig | None = None,
    **kwargs: Any,
) -> AbstractAsyncContextManager[RayGym]:
    """The calendar workplace on ``RayGym.host`` (one agent kind per instance); ``kwargs`` are
    ``RayGym.host``'s."""
    from test_gym_conformance import agent_kinds_of

    from gymckpt.gym_adapter import RayGym  # Ray only when a test asks for it

    cfg = config if config is not None else CalendarConfig()
    environments = [
        EnvironmentRef.to(calendar_environment, agent_kind=kind, config=cfg)
        for kind in agent_kinds_of(instances, agent_kinds)
    ]
    return RayGym.host(environments, instances, config=cfg.host_config(), **kwargs)


def open_for_conformance(**kwargs: Any) -> AbstractAsyncContextManager[Any]:
    """``calendar_on_ray`` with the simulated turns ``RAY_TIME_SCALE`` times slower."""

    config: CalendarConfig = kwargs.pop("config", None) or CalendarConfig()
    lo, hi = config.turn_s
    kwargs["config"] = attrs.evolve(config, turn_s=(lo * RAY_TIME_SCALE, hi * RAY_TIME_SCALE))
    return calendar_on_ray(**kwargs)


CONFIG = CalendarConfig(turns=(2, 3), turn_s=(0.01, 0.03), mutation_p=0.5)


def rows(n: int, start: int = 0) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(start, start + n)]


def deadline(seconds: float = 5.0) -> float:
    return trio.current_time() + seconds


async def drain(stream: ReplyStream) -> list[RunReply]:
    return [r async for batch in stream for r in batch]


@asynccontextmanager
async def ray_gym(tmp_path: Path, **kwargs: Any) -> AsyncIterator[Any]:
    kwargs.setdefault("config", CONFIG)
    async with calendar_on_ray(work_dir=tmp_path, seed=5, **kwargs) as gym:
        yield gym


async def settled(gym: Any, instance: str = "gym-0") -> Any:
    """The actor's call statistics once nothing runs there (fails after 10 s)."""
    with trio.fail_after(10):
        while True:
            calls = await gym.calls(instance)
            if calls.in_progress == 0:
                return calls
            await trio.sleep(0.05)


async def all_replied(gym: Any, count: int, instance: str = "gym-0") -> Any:
    """The inventory once ``count`` rows have replied and sit on the wire, none running (checked
    every 50 ms, failing after 10 s): a condition on Gym's state, not a guess at timing."""
    with trio.fail_after(10):
        while True:
            inv = await gym.inventory(instance)
            if not inv.running and len(inv.on_wire) == count:
                return inv
            await trio.sleep(0.05)


def cancelled_in_ray(ref: Any, timeout: float = 10.0) -> bool:
    """Whether Ray resolved ``ref`` as a cancelled task (it will never run)."""
    import ray
    from ray.exceptions import TaskCancelledError

    ready, _ = ray.wait([ref], timeout=timeout, fetch_local=False)
    if not ready:
        return False
    try:
        ray.get(ref, timeout=timeout)
    except TaskCancelledError:
        return True
    except Exception:
        return False
    return False


# -- packaging -----------------------------------------------------------------------------------


def test_import_gym_adapter_does_not_import_ray() -> None:
    code = (
        "import sys, gym_adapter, nurseries, runtime\n"
        "assert 'ray' not in sys.modules and 'trio_asyncio' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('ray', 'trio_asyncio')))\n"
        "assert gym_adapter.RayGym.__name__ == 'RayGym' and 'ray' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- placement and data plane ---------------------------------------------------------------------


@pytest.mark.ray
async def test_four_instances_fit_on_two_cores_spread_and_answer(tmp_path: Path) -> None:
    import ray

    async with ray_gym(tmp_path, instances=4) as gym:
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert set(gym.placement) == {"gym-0", "gym-1", "gym-2", "gym-3"}
        assert set(gym.placement.values()) <= nodes
        assert len(set(gym.placement.values())) == min(4, len(nodes))  # SPREAD
        streams = [await gym.run(n, rows(3, start=10 * i)) for i, n in enumerate(gym.instances)]
        for i, stream in enumerate(streams):
            replies = await drain(stream)
            assert sorted(r.rollout_id for r in replies) == [
                rollout_id_for(r, 0, 0) for r in range(10 * i, 10 * i + 3)
            ]
            assert all(isinstance(r, Completed) for r in replies)
            await stream.aclose()
        # the calendar's sessions come back through the same view a user's environment has
        expected = {
            sentinel(r, 0, t)
            for r in range(20, 23)
            for t, m in enumerate(plan_episode(5, r, 0, CONFIG).mutates)
            if m
        }
        assert expected  # some turns mutate
        calendar = await calendar_sessions_of(gym, "gym-2")
        assert sorted(calendar) == [f"{r}-0" for r in range(20, 23)]
        assert {s for sess in calendar.values() for s in sess.sentinels} == expected
        views = await gym.session_states("gym-2", "calendar")
        assert {k: v.rollout_id for k, v in views.items()} == {
            k: c.rollout_id for k, c in calendar.items()
        }
        topo = await gym.topology()
        assert topo.names == gym.instances
        assert gym.bridge_statistics().asyncio_pending == 0


@pytest.mark.ray
async def test_replies_coalesce_into_few_objects_for_a_slow_consumer(tmp_path: Path) -> None:
    config = CalendarConfig(turns=(1, 1), turn_s=(0.0, 0.02), mutation_p=0.0, max_batch=4)
    async with ray_gym(tmp_path, config=config) as gym:
        stream = await gym.run("gym-0", rows(200))
        # every row replies while nobody consumes: all 200 on the wire (yielded into Ray or
        # waiting), and the consumer then finds them coalesced
        await all_replied(gym, 200)
        sizes = [len(batch) async for batch in stream]
        assert sum(sizes) == 200
        assert len(sizes) < 200 // 4 / 2  # far fewer objects than Gym's 4-reply batches
        assert (await gym.inventory("gym-0")).on_wire == ()
        stats = (await gym.statistics()).instances[0]
        assert stats.completed == 200 and stats.discarded_replies == 0


@pytest.mark.ray
async def test_one_object_per_row_mode_delivers_every_row_once(tmp_path: Path) -> None:
    async with ray_gym(tmp_path, batch_replies=False) as gym:
        stream = await gym.run("gym-0", rows(20))
        batches = [list(b) async for b in stream]
        assert all(len(b) == 1 for b in batches)
        assert sorted(r.rollout_id for b in batches for r in b) == sorted(
            rollout_id_for(r, 0, 0) for r in range(20)
        )
        assert (await gym.inventory("gym-0")).on_wire == ()


@pytest.mark.ray
async def test_acks_travel_with_the_next_call_and_free_the_actor(tmp_path: Path) -> None:
    config = CalendarConfig(turns=(1, 1), turn_s=(0.0, 0.2), mutation_p=0.0, max_batch=2)
    async with ray_gym(tmp_path, config=config) as gym:
        stream = await gym.run("gym-0", rows(40))
        got = 0
        async for batch in stream:
            got += len(batch)
            # whatever Ray did with the standalone ack, a view sees every batch asked past
            inv = await gym.inventory("gym-0")
            assert {r.rollout_id for r in batch} <= set(inv.on_wire)
            assert len(inv.on_wire) + len(inv.running) <= 40 - got + len(batch)
        assert got == 40
        with trio.fail_after(5):  # the final ack lets the actor forget the stream
            while True:
                calls = await gym.calls("gym-0")
                if calls.streams == 0:
                    break
                await trio.sleep(0.05)
        assert (await gym.inventory("gym-0")).on_wire == ()


@pytest.mark.ray
async def test_aclose_discards_replies_still_in_ray(tmp_path: Path) -> None:
    config = CalendarConfig(turns=(1, 1), turn_s=(0.0, 0.01), mutation_p=0.0, max_batch=2)
    async with ray_gym(tmp_path, config=config) as gym:
        stream = await gym.run("gym-0", rows(12))
        first = await stream.__anext__()
        await all_replied(gym, 12)  # the rest replied and sits in Ray, unread (and the first
        await stream.aclose()  # batch, not acknowledged yet)
        await stream.aclose()  # idempotent
        inv = await gym.inventory("gym-0")
        assert inv.on_wire == ()
        stats = (await gym.statistics()).instances[0]
        assert stats.discarded_replies == 12 - len(first)
        calls = await settled(gym)
        assert calls.streams == 0


# -- cancellation --------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.parametrize("stuck_loop_s", [0.0, 1.0], ids=["hung-call", "stuck-loop"])
async def test_a_cancelled_call_leaves_no_task_future_or_ray_call_behind(
    tmp_path: Path, stuck_loop_s: float
) -> None:
    async with ray_gym(tmp_path, faults=["prepare:hang@1"], stuck_loop_s=stuck_loop_s) as gym:
        before = gym.bridge_statistics()
        t0 = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await gym.prepare("gym-0", "c", deadline())
        assert scope.cancelled_caught
        assert trio.current_time() - t0 < 0.3 + 0.5  # the asyncio side let go at once
        after = gym.bridge_statistics()
        assert after.asyncio_pending == 0  # no asyncio task or future left pending
        assert after.cancelled == before.cancelled + 1
        (ref,) = gym.cancelled_refs
        assert await trio.to_thread.run_sync(cancelled_in_ray, ref)  # Ray dropped the call
        calls = await settled(gym)  # with a stuck loop: once the loop is free again
        assert dict(calls.cancelled) == {"prepare": 1}
        assert calls.in_progress == 0
        assert (await gym.inventory("gym-0")).admission_open  # it never reached Gym
        await gym.prepare("gym-0", "c", deadline())  # the 2nd call is fine
        await gym.resume("gym-0", "c", deadline())
        assert gym.bridge_statistics().asyncio_pending == 0


@pytest.mark.ray
async def test_a_call_ray_never_schedules_is_bounded_and_cancelled(tmp_path: Path) -> None:
    config = RuntimeConfig(
        control_timeout_s=0.5,
        alignment_timeout_s=0.25,
        reply_grace_s=0.2,
        lease_s=5.0,
        drain_timeout_s=2.0,
    )
    async with ray_gym(tmp_path) as gym:
        async with gym.unschedulable("gym-0"):
            t0 = trio.current_time()
            with pytest.raises(GymCallTimeout, match=r"instance gym-0 did not answer prepare"):
                await bounded_call(
                    "gym-0", "prepare", functools.partial(gym.prepare, "gym-0", "c"), config
                )
            elapsed = trio.current_time() - t0
            assert 0.7 <= elapsed < 0.7 + 0.5
            assert gym.bridge_statistics().asyncio_pending == 0
            (ref,) = gym.cancelled_refs
            assert await trio.to_thread.run_sync(cancelled_in_ray, ref)
        reply = await bounded_call(
            "gym-0", "prepare", functools.partial(gym.prepare, "gym-0", "c"), config
        )
        assert reply.instance == "gym-0"
        calls = await settled(gym)
        assert calls.cancelled == ()  # the real actor never saw the cancelled call


# -- errors crossing Ray ---------------------------------------------------------------------------


@pytest.mark.ray
async def test_errors_cross_ray_as_retryable_gym_errors(tmp_path: Path) -> None:
    import ray

    faults = ["commit:error@1", "resume:unpicklable@1", "retire:dead@1"]
    async with ray_gym(tmp_path, instances=2, faults=faults) as gym:
        await gym.prepare("gym-0", "c", deadline())
        with pytest.raises(GymControlError) as control:
            await gym.commit("gym-0", "c", "s", deadline())
        assert (control.value.instance, control.value.operation) == ("gym-0", "commit")
        assert pickle.loads(pickle.dumps(control.value)).message == control.value.message

        with pytest.raises(GymCheckpointUnavailable, match="cannot be pickled") as unpicklable:
            await gym.resume("gym-0", "c", deadline())
        assert unpicklable.value.__cause__ is None
        assert (unpicklable.value.instance, unpicklable.value.operation) == ("gym-0", "resume")

        # an error Ray itself cannot serialise reaches us as RayTaskError: same replacement
        def raise_unserialisable() -> None:  # defined here: Ray ships it by value
            class Unserialisable(RuntimeError):  # neither pickle nor cloudpickle carry a lock
                def __init__(self, message: str) -> None:
                    super().__init__(message)
                    self.lock = threading.Lock()

            raise Unserialisable("gym state lock")

        raised = ray.remote(num_cpus=0)(raise_unserialisable).remote()
        with pytest.raises(Exception) as ray_error:
            await trio.to_thread.run_sync(ray.get, raised)
        replaced = gym._translate("gym-1", "prepare", ray_error.value)
        assert isinstance(replaced, GymCheckpointUnavailable)
        assert "cannot be pickled" in str(replaced) and "Unserialisable" in str(replaced)

        await gym.resume("gym-0", "c", deadline())
        with pytest.raises(GymInstanceDead, match="gym-1") as dead:  # the actor really died
            await gym.retire("gym-1", [], deadline())
        assert dead.value.__cause__ is None
        with pytest.raises(GymInstanceDead):
            await gym.inventory("gym-1")
        assert (await gym.statistics()).instances[1].dead

        for exc in (control.value, unpicklable.value, replaced, dead.value):
            assert classify(exc) == "gym_unavailable"
        assert (await gym.inventory("gym-0")).admission_open


@pytest.mark.ray
async def test_topology_mismatch_arrives_as_itself(tmp_path: Path) -> None:
    from gymckpt.runtime import InstanceRecord, ParticipantRecord

    planner = ParticipantRecord("planner", "environment", "gym-0/planner", "sha256:" + "0" * 64)
    record = InstanceRecord("gym-0", (planner,))
    async with ray_gym(tmp_path) as gym:
        with pytest.raises(TopologyMismatch, match="participant planner missing") as info:
            await gym.restore("gym-0", str(tmp_path), record, [], deadline())
        assert classify(info.value) == "invariant"


@pytest.mark.ray
async def test_deadline_is_re_anchored_on_the_actor(tmp_path: Path) -> None:
    async with ray_gym(tmp_path, faults=["prepare:delay@1:0.4"]) as gym:
        with pytest.raises(GymCallTimeout, match="gym-0 prepare: deadline passed"):
            await gym.prepare("gym-0", "c", deadline(0.2))
        assert not (await gym.inventory("gym-0")).prepared
        past: Callable[[], float] = lambda: trio.current_time() - 1  # noqa: E731
        with pytest.raises(GymCallTimeout, match="gym-0"):
            await gym.resume("gym-0", "c", past())


@pytest.mark.ray
def test_no_address_starts_our_own_cluster_whatever_the_environment_says() -> None:
    """Without ``--ray-address`` we start a local cluster of our own. ``ray.init()`` left to
    itself joins whatever ``RAY_ADDRESS`` (or the last ``ray start`` on this machine) names, and
    then refuses our object-store option: the suite's whole Ray group errored on a machine where
    another cluster ran."""
    script = (
        "import ray\n"
        "from gymckpt.gym_adapter.transports.ray._gym import local_cluster_options\n"
        "ray.init(**local_cluster_options())\n"
        "print('nodes', len(ray.nodes()))\n"
        "ray.shutdown()\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nodes 1" in proc.stdout
