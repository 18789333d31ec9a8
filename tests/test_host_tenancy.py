"""Trainer terms at the Gym host (``_host_tenancy``, ``ControlPlane.fence``): an instance serves
one lineage at a time; a newer term's ``attach`` fences everything an older term started, and
nothing of the older term may reply, mutate or commit afterwards; another lineage is refused
and changes nothing. On the host itself, through the embedded backend (two trainer processes'
facades over the same instances), and through Ray (``tests/test_ray_host.py`` style, marked
``ray``). Every test runs under trio's autojump clock except the Ray one.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import (
    AttachReply,
    Completed,
    Done,
    EmbeddedGym,
    Environment,
    EpisodeContext,
    EpisodeInfo,
    FaultPlan,
    GymControlError,
    GymHost,
    RunReply,
    RunRow,
)
from gymckpt.runtime import CheckpointMode, GymInUse, TrainerTerm, rollout_id_for

FAR = 1e9
LINEAGE = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"
TURNS = 4


class Ledger:
    """A retained participant: every turn of every attempt adds one entry (a mutation)."""

    name, kind, retained = "ledger", "environment", True

    def open(self, info: EpisodeInfo) -> list[int]:
        return []

    def export(self, state: list[int]) -> Any:
        return list(state)

    def restore(self, data: Any) -> list[int]:
        return list(data)


class Agent:
    """``TURNS`` turns of one second, each mutating the ledger session once."""

    name, kind = "agent", "simple_agent"

    def open(self, info: EpisodeInfo) -> dict[str, int]:
        return {"turn": 0}

    def export(self, state: dict[str, int]) -> Any:
        return dict(state)

    def restore(self, data: Any) -> dict[str, int]:
        return dict(data)

    async def step(self, ctx: EpisodeContext, state: dict[str, int]) -> Done | None:
        await trio.sleep(1.0)
        ctx.session("ledger").append(state["turn"])
        state["turn"] += 1
        return Done(reward=1.0) if state["turn"] == TURNS else None


def environment() -> Environment:
    return Environment(agent=Agent(), participants=(Ledger(),))


def rows(n: int, attempt: int = 0) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, attempt), r, 0, attempt) for r in range(n)]


async def replies(stream: Any) -> list[RunReply]:
    return [r async for batch in stream for r in batch]


def ledgers(host: GymHost) -> dict[str, list[int]]:
    return {key: view.state for key, view in host.session_states("ledger").items()}


async def test_a_newer_term_fences_the_older_terms_episodes_checkpoint_and_late_calls(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    old, new = TrainerTerm(LINEAGE, 1, "/w"), TrainerTerm(LINEAGE, 2, "/w")
    async with GymHost("gym-0", environment(), work_dir=tmp_path) as host:
        assert await host.attach(old, FAR) == AttachReply("gym-0", took_over=True)
        kept = RunRow(rollout_id_for(7, 0, 2), 7, 0, 2)  # a third attempt, completed and kept
        assert [type(r) for r in await replies(await host.run([kept], trainer=old))] == [Completed]
        assert ledgers(host) == {"7-0": list(range(TURNS))}
        stream = await host.run(rows(3), trainer=old)
        await trio.sleep(1.5)  # one mutation each, inside their second turn
        await host.prepare("c1", FAR, CheckpointMode.UNALIGNED, trainer=old)
        await host.commit("c1", str(tmp_path / "snap"), FAR, trainer=old)
        assert host.inventory().prepared  # the old trainer dies here: c1 is never resumed

        reply = await host.attach(new, FAR)
        assert reply == AttachReply("gym-0", True, old, episodes=3, sessions=4, aborted="c1")
        assert host.trainer == new
        assert await replies(stream) == []  # nothing the old term started replies
        inv = host.inventory()
        assert inv.admission_open and not inv.prepared and not inv.running
        assert ledgers(host) == {}  # every session freed, as a retire frees it
        await trio.sleep(10)  # the cancelled turns mutate nothing afterwards
        assert ledgers(host) == {}

        late = [  # the old term's late calls: refused before they act
            lambda: host.resume("c1", FAR, trainer=old),
            lambda: host.commit("c1", str(tmp_path / "late"), FAR, trainer=old),
            lambda: host.prepare("c2", FAR, trainer=old),
            lambda: host.run(rows(1), trainer=old),
            lambda: host.retire([rollout_id_for(0, 0, 0)], FAR, trainer=old),
            lambda: host.attach(old, FAR),
        ]
        for call in late:
            with pytest.raises(GymInUse, match=r"trainer term 1 .* was fenced"):
                await call()
        assert not (tmp_path / "late").exists()
        assert host.inventory().admission_open

        fresh = [*rows(3), RunRow(rollout_id_for(7, 0, 0), 7, 0, 0)]  # a fresh start
        done = await replies(await host.run(fresh, trainer=new))  # the new term proceeds
        assert sorted(r.rollout_id for r in done if isinstance(r, Completed)) == sorted(
            r.rollout_id for r in fresh
        )
        assert set(map(tuple, ledgers(host).values())) == {tuple(range(TURNS))}  # each once
        assert host.statistics().fenced_terms == 1
        assert await host.attach(new, FAR) == AttachReply("gym-0", took_over=False)


async def test_a_prepare_of_the_fenced_term_still_waiting_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    old, new = TrainerTerm(LINEAGE, 3), TrainerTerm(LINEAGE, 4)
    async with GymHost("gym-0", environment()) as host:
        await host.attach(old, FAR)
        await host.run(rows(2), trainer=old)
        await trio.sleep(0.5)
        failed: list[BaseException] = []

        async def prepare() -> None:
            try:
                await host.prepare("c1", FAR, trainer=old)  # aligned: waits for boundaries
            except GymControlError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prepare)
            await trio.sleep(0.1)
            await host.attach(new, FAR)
        [exc] = failed
        assert "reopened before it parked" in str(exc)
        assert host.inventory().admission_open


async def test_another_lineage_is_refused_naming_the_holder_and_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    holder = TrainerTerm(LINEAGE, 2, "/runs/first")
    intruder = TrainerTerm(OTHER, 1, "/runs/second")
    async with GymHost("gym-0", environment()) as host:
        await host.run(rows(2), trainer=holder)  # a fresh instance adopts the first caller
        assert host.trainer == holder
        await trio.sleep(1.5)
        before = (host.inventory(), ledgers(host))
        for call in (
            lambda: host.attach(intruder, FAR),
            lambda: host.run(rows(1, attempt=1), trainer=intruder),
            lambda: host.prepare("x-0001", FAR, trainer=intruder),
            lambda: host.restore("snap", None, (), FAR, trainer=intruder),  # type: ignore[arg-type]
        ):
            with pytest.raises(GymInUse, match="serves another training run") as caught:
                await call()
            assert "/runs/first" in str(caught.value) and "/runs/second" in str(caught.value)
        assert (host.inventory(), ledgers(host)) == before
        assert host.trainer == holder
        newer = TrainerTerm(LINEAGE, 3)
        with pytest.raises(GymInUse, match="has not attached here"):
            await host.run(rows(1), trainer=newer)  # a newer term takes over by attach only


async def test_embedded_two_trainer_processes_over_the_same_instances(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What two trainer processes would do to a deployment that outlives the first: each
    drives the same instances through its own ``EmbeddedGym`` facade."""
    old, new = TrainerTerm(LINEAGE, 1), TrainerTerm(LINEAGE, 2)
    async with trio.open_nursery() as nursery:
        hosts = [GymHost(f"gym-{n}", environment()) for n in range(2)]
        for host in hosts:
            await nursery.start(host.serve)
        first, second = (EmbeddedGym(hosts, FaultPlan(())) for _ in range(2))
        for name in first.instances:
            await first.attach(name, old, FAR)
        streams = [await first.run(name, rows(2)) for name in first.instances]
        await trio.sleep(1.5)
        took = [await second.attach(name, new, FAR) for name in second.instances]
        assert [r.episodes for r in took] == [2, 2] and all(r.previous == old for r in took)
        for stream in streams:
            assert await replies(stream) == []
        with pytest.raises(GymInUse, match="was fenced"):
            await first.prepare("gym-0", "run-0003", FAR)
        with pytest.raises(GymInUse, match="was fenced"):
            await first.run("gym-1", rows(1))
        done = await replies(await second.run("gym-1", rows(1)))
        assert [type(r) for r in done] == [Completed]
        nursery.cancel_scope.cancel()


@pytest.mark.ray
async def test_ray_actors_fence_an_older_term_and_refuse_its_late_calls() -> None:
    RayGym = pytest.importorskip("gymckpt.gym_adapter.transports.ray._gym").RayGym
    old, new = TrainerTerm(LINEAGE, 1), TrainerTerm(LINEAGE, 2)
    async with RayGym.host("gymckpt.testing.examples:slow_task_reader", instances=1) as gym:
        deadline = trio.current_time() + 30
        await gym.attach("gym-0", old, deadline)
        stream = await gym.run("gym-0", rows(2))
        reply = await gym.attach("gym-0", new, trio.current_time() + 30)
        assert reply.took_over and reply.previous == old and reply.episodes == 2
        with trio.fail_after(30):
            assert await replies(stream) == []
        gym._trainer = old  # what a fenced trainer still sends
        with pytest.raises(GymInUse, match="was fenced"):
            await gym.prepare("gym-0", "run-0002", trio.current_time() + 30)
        with pytest.raises(GymInUse, match="was fenced"):
            await gym.run("gym-0", rows(1))
        with pytest.raises(GymInUse, match="serves another training run"):
            await gym.attach("gym-0", TrainerTerm(OTHER, 1), trio.current_time() + 30)
        gym._trainer = new  # its run finished: it lets go, and another run may attach
        await gym.release("gym-0", new, trio.current_time() + 30)
        other = await gym.attach("gym-0", TrainerTerm(OTHER, 1), trio.current_time() + 30)
        assert other.took_over and other.previous == new


async def test_a_fenced_trainer_stops_at_its_next_checkpoint_with_exit_2(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A trainer whose servers were taken over by a newer term of its run (a second process it
    does not know of) stops, with ``GymInUse`` (exit code 2), at its next checkpoint: it
    neither retries nor aborts as an invariant violation."""
    from gymckpt.nurseries import ExitCode, open_rollouts, run_exit
    from gymckpt.runtime._shared import next_term

    async with trio.open_nursery() as nursery:
        hosts = [GymHost(f"gym-{n}", environment()) for n in range(2)]
        for host in hosts:
            await nursery.start(host.serve)
        gym, newer = EmbeddedGym(hosts, FaultPlan(())), EmbeddedGym(hosts, FaultPlan(()))
        with pytest.raises(Exception) as caught:  # GymInUse, in the rollouts' nursery
            async with open_rollouts(
                gym, tmp_path, rows=8, group_size=2, handle_signals=False
            ) as ro:
                await ro.next_batch(1)
                term = next_term(tmp_path)  # what the newer process took
                for name in newer.instances:
                    await newer.attach(name, term, FAR)
                await ro.checkpoint()
        decided = run_exit(caught.value)
        assert decided is not None and decided[0] == ExitCode.BAD_INPUT
        assert isinstance(decided[1], GymInUse) and "was fenced" in str(decided[1])
        nursery.cancel_scope.cancel()


async def test_a_finished_run_releases_its_instances_for_another_run(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A run that trained its whole dataset lets go of its instances as ``open_rollouts``
    closes: another run (another work directory) may then attach, and does, fencing what
    was left. A run that stops before (here: left early) keeps them."""
    from gymckpt.nurseries import open_rollouts

    async with trio.open_nursery() as nursery:
        hosts = [GymHost(f"gym-{n}", environment()) for n in range(2)]
        for host in hosts:
            await nursery.start(host.serve)

        async def train(workdir: Path, rows: int, *, leave_early: bool = False) -> None:
            gym = EmbeddedGym(hosts, FaultPlan(()))
            async with (
                open_rollouts(gym, workdir, rows=rows, group_size=2, handle_signals=False) as ro,
                aclosing(ro.batches(groups_per_step=1)) as batches,
            ):
                async for _batch in batches:
                    if leave_early:
                        break

        await train(tmp_path / "first", 4, leave_early=True)
        with pytest.raises(GymInUse, match="serves another training run"):
            await train(tmp_path / "second", 2)  # still held: the first run comes back
        await train(tmp_path / "first", 4)  # it came back and finished: released
        await train(tmp_path / "second", 2)  # another run takes the instances over
        assert all(h.trainer is not None and "second" in h.trainer.workdir for h in hosts)
        nursery.cancel_scope.cancel()


async def test_an_instance_found_dead_by_the_attach_is_replaced_and_attached(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    from gymckpt.nurseries import open_rollouts

    async with EmbeddedGym.host(environment(), instances=2, work_dir=tmp_path / "live") as gym:
        gym.sim("gym-1").kill()
        async with (
            open_rollouts(gym, tmp_path / "w", rows=4, group_size=2, handle_signals=False) as ro,
            aclosing(ro.batches(groups_per_step=2)) as batches,
        ):
            rows = sorted(g.row for batch in [b async for b in batches] for g in batch)
        assert rows == [0, 1, 2, 3]
        assert gym.replacement_count("gym-1") == 1
        assert {gym.sim(n).trainer.lineage for n in gym.instances} == {  # type: ignore[union-attr]
            next_term_lineage(tmp_path / "w")
        }


def next_term_lineage(workdir: Path) -> str:
    import orjson

    from gymckpt.runtime._shared import TERM_FILE

    lineage: str = orjson.loads((workdir / TERM_FILE).read_bytes())["lineage"]
    return lineage


async def test_a_refused_attach_leaves_the_embedded_deployment_on_its_trainers_term(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A second lineage's ``attach`` through the same ``EmbeddedGym`` is refused, and the
    deployment's later calls still carry the holder's term (the simulation's second trainer
    once left the first run's next checkpoint refused as the intruder's)."""
    holder, intruder = TrainerTerm(LINEAGE, 1, "/runs/first"), TrainerTerm(OTHER, 1, "/runs/x")
    async with trio.open_nursery() as nursery:
        host = GymHost("gym-0", environment())
        await nursery.start(host.serve)
        gym = EmbeddedGym([host], FaultPlan(()))
        await gym.attach("gym-0", holder, FAR)
        with pytest.raises(GymInUse):
            await gym.attach("gym-0", intruder, FAR)
        await gym.prepare("gym-0", "run-0001", FAR)  # the holder's checkpoint goes on
        await gym.resume("gym-0", "run-0001", FAR)
        nursery.cancel_scope.cancel()


async def test_a_restore_into_servers_that_outlived_the_trainer_replaces_one_found_dead(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The trainer dies, its Gym keeps running, and an instance dies while no trainer drives
    it: the next trainer's restore replaces it (the topology found it dead) and proceeds,
    instead of failing with ``GymInstanceDead`` before it checked anything (simulate seeds 17
    and 30, a live restart)."""
    from gymckpt.nurseries import open_rollouts

    work = tmp_path / "work"
    async with EmbeddedGym.host(environment(), instances=2, work_dir=tmp_path / "gym") as gym:
        with trio.CancelScope() as crash:
            async with open_rollouts(gym, work, rows=6, group_size=2, handle_signals=False) as ro:
                await ro.next_batch(1)
                assert (await ro.checkpoint()).ok
                crash.cancel()  # the trainer dies mid-run; its Gym runs on
        gym.sim("gym-0").kill()
        async with open_rollouts(gym, work, rows=6, group_size=2, handle_signals=False) as ro:
            assert ro.restored is not None
            async with aclosing(ro.batches(groups_per_step=1)) as batches:
                async for _batch in batches:
                    pass
            assert ro.ledger.statistics().rows_trained == 6
        assert gym.replacement_count("gym-0") == 1


async def test_the_replacement_of_a_dead_instance_serves_the_run_that_replaced_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A replacement starts with no holder; adopted by whoever reached it first, it let a
    second trainer (another process, another run) take it over between its start and the
    first run's next call, and the first run then stopped with ``GymInUse`` (simulate seeds
    193, 331). The replacing deployment's trainer holds it from the start."""
    holder, intruder = TrainerTerm(LINEAGE, 1, "/runs/first"), TrainerTerm(OTHER, 1, "/runs/x")
    async with EmbeddedGym.host(environment(), instances=2, work_dir=tmp_path) as gym:
        for name in gym.instances:
            await gym.attach(name, holder, FAR)
        gym.sim("gym-0").kill()
        await gym.replace("gym-0", FAR)
        second = EmbeddedGym([gym.sim(n) for n in gym.instances], FaultPlan(()))
        with pytest.raises(GymInUse, match="serves another training run"):
            await second.attach("gym-0", intruder, FAR)
        assert gym.sim("gym-0").trainer == holder
        await gym.prepare("gym-0", "run-0001", FAR)  # the first run goes on there


async def test_a_fence_takes_off_the_wire_the_batches_a_transport_took_and_never_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Ray actor or an HTTP server reads its host stream's batches itself and acknowledges
    them when its trainer does (``HostReplyStream.run_stream``). The old term's trainer never
    will: after a newer term's attach nothing of the old term is on the wire, whoever took
    its batches (else every later commit lists them on the wire)."""
    old, new = TrainerTerm(LINEAGE, 1), TrainerTerm(LINEAGE, 2)
    async with GymHost("gym-0", environment()) as host:
        await host.attach(old, FAR)
        stream: Any = await host.run(rows(2), trainer=old)
        taken = await stream.run_stream.receive.receive()  # the transport's pump took it
        assert {r.rollout_id for r in taken} <= set(host.inventory().on_wire)
        await host.attach(new, FAR)
        assert host.inventory().on_wire == ()


async def test_a_replacement_keeps_the_dead_instances_holder_so_a_newer_term_fences_its_journal(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An instance of a dead trainer's run dies too; the next trainer's attach finds it dead
    once it has attached elsewhere (so the deployment already carries the new term) and
    replaces it. The replacement continues the dead instance's journal, whose retained
    sessions are the old term's mutations: it must serve the old term until the new one
    attaches, which fences them. Adopted by the new term it fenced nothing, and a fresh start
    ran those rows again beside them (simulate seed 5595: two sentinels twice)."""
    old, new = TrainerTerm(LINEAGE, 1, "/runs/w"), TrainerTerm(LINEAGE, 2, "/runs/w")
    async with EmbeddedGym.host(environment(), instances=2, work_dir=tmp_path) as gym:
        for name in gym.instances:
            await gym.attach(name, old, FAR)
        stream: Any = await gym.sim("gym-1").run(rows(2), trainer=old)
        assert len(await replies(stream)) == 2
        assert len(ledgers(gym.sim("gym-1"))) == 2  # the old term's retained mutations
        gym.sim("gym-1").kill()
        await gym.attach("gym-0", new, FAR)  # the new trainer reached gym-0 first
        await gym.replace("gym-1", FAR)
        assert gym.sim("gym-1").trainer == old
        reply = await gym.attach("gym-1", new, FAR)
        assert reply.took_over and reply.sessions == 2
        assert ledgers(gym.sim("gym-1")) == {}
        assert gym.sim("gym-1").trainer == new


async def test_the_replacement_of_a_released_instance_serves_nobody_until_the_next_run_attaches(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A finished run released its instances; one dies and the next run (another lineage),
    having attached elsewhere first, replaces it: the replacement is not held by the finished
    run (the next run would be refused) nor adopted by the next one (the journal's sessions
    of the finished run would stay): the next run's attach takes it over and fences them."""
    first, second = TrainerTerm(LINEAGE, 1, "/runs/a"), TrainerTerm(OTHER, 1, "/runs/b")
    async with EmbeddedGym.host(environment(), instances=2, work_dir=tmp_path) as gym:
        for name in gym.instances:
            await gym.attach(name, first, FAR)
        stream: Any = await gym.sim("gym-1").run(rows(2), trainer=first)
        assert len(await replies(stream)) == 2
        for name in gym.instances:
            await gym.release(name, first, FAR)
        gym.sim("gym-1").kill()
        await gym.attach("gym-0", second, FAR)
        await gym.replace("gym-1", FAR)
        assert gym.sim("gym-1").trainer is None
        reply = await gym.attach("gym-1", second, FAR)
        assert reply.took_over and reply.sessions == 2
        assert ledgers(gym.sim("gym-1")) == {} and gym.sim("gym-1").trainer == second
