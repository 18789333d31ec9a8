"""The dispatcher's own rules, against a scripted Gym: what it sends where and under which gate,
and what each kind of reply does to the ledger (S1, S2, S3, finite rewards, stale replies).

The scripted Gym answers each ``run`` with the batches its ``script`` returns for those rows,
then ends the stream; rows it does not answer are an early stream end.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import Completed, Failed, Refused, RetireReply, RunReply, RunRow
from gymckpt.nurseries import Dispatcher
from gymckpt.nurseries._dispatcher import EPISODE_FAILURES_DATA
from gymckpt.nurseries._replace import InstanceReplacer
from gymckpt.nurseries._run import leaf_errors
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    AttemptState,
    DeadlineRegistry,
    DispatchGate,
    GymAdmissionClosed,
    GymCheckpointUnavailable,
    InfraOutage,
    Metrics,
    RecoveryLedger,
    RuntimeConfig,
)

CONFIG = RuntimeConfig(control_timeout_s=2.0, reply_grace_s=0.5, lease_s=30.0)
Script = Callable[[str, Sequence[RunRow]], list[list[RunReply]]]


def complete_all(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
    return [[Completed(r.rollout_id, 1.0, 2) for r in rows]]


@attrs.define
class ScriptedStream:
    batches: list[list[RunReply]]
    closed: bool = False

    def __aiter__(self) -> ScriptedStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        await trio.sleep(0.1)
        if not self.batches:
            raise StopAsyncIteration
        return self.batches.pop(0)

    async def aclose(self) -> None:
        self.closed = True


@attrs.define
class ScriptedGym:
    script: Script = complete_all
    instances: tuple[str, ...] = ("gym-0", "gym-1")
    runs: list[tuple[str, tuple[RunRow, ...]]] = attrs.field(factory=list)
    retired: list[tuple[str, tuple[str, ...]]] = attrs.field(factory=list)
    refuse_submissions: int = 0
    """How many of the next ``run`` calls refuse the whole submission (``admission_closed``)."""

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ScriptedStream:
        await trio.lowlevel.checkpoint()
        if self.refuse_submissions:
            self.refuse_submissions -= 1
            raise GymAdmissionClosed(rows[0].rollout_id, instance)
        self.runs.append((instance, tuple(rows)))
        return ScriptedStream(self.script(instance, rows))

    async def retire(self, instance: str, ids: Sequence[str], deadline_ts: float) -> RetireReply:
        await trio.lowlevel.checkpoint()
        self.retired.append((instance, tuple(ids)))
        return RetireReply(instance, tuple(ids))


@attrs.define
class Harness:
    gym: ScriptedGym
    ledger: RecoveryLedger
    gate: DispatchGate
    metrics: Metrics
    dispatcher: Dispatcher

    def sent(self) -> list[str]:
        return [r.rollout_id for _, rows in self.gym.runs for r in rows]


@asynccontextmanager
async def dispatching(
    gym: ScriptedGym, rows: int, gate: DispatchGate | None = None, **kw: int
) -> AsyncIterator[Harness]:
    ledger = RecoveryLedger(group_size=1)
    gate = gate if gate is not None else DispatchGate()
    metrics = Metrics(clock=trio.current_time)
    replacer = InstanceReplacer(gym, ledger, CONFIG, metrics)  # type: ignore[arg-type]
    dispatcher = Dispatcher(
        gym,
        ledger,
        gate,
        DeadlineRegistry(),
        CONFIG,
        metrics,  # type: ignore[arg-type]
        iter(range(rows)),
        replacer,
        **kw,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        yield Harness(gym, ledger, gate, metrics, dispatcher)
        nursery.cancel_scope.cancel()


async def test_rows_go_round_robin_and_complete_under_the_admitting_gate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with dispatching(ScriptedGym(), rows=4, batch_size=1) as h:
        await trio.sleep(5)
        assert [i for i, _ in h.gym.runs] == ["gym-0", "gym-1", "gym-0", "gym-1"]
        assert h.ledger.statistics().by_state["completed"] == 4
        for rid in h.sent():
            att = h.ledger.get(rid)
            assert att is not None and att.state is AttemptState.COMPLETED
            assert att.gate_id == 1
        assert h.dispatcher.statistics().rows_sent == 4


async def test_nothing_is_sent_while_admission_is_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = DispatchGate()
    await gate.close("a checkpoint")
    async with dispatching(ScriptedGym(), rows=2, gate=gate) as h:
        await trio.sleep(5)
        assert h.gym.runs == []  # S1: planned, reserved, waiting at the gate
        assert h.ledger.statistics().by_state["reserved"] == 2
        assert h.dispatcher.statistics().submissions >= 1
        assert gate.statistics().waiting >= 1
        new_id = await gate.reopen()
        await trio.sleep(5)
        assert h.ledger.statistics().by_state["completed"] == 2
        assert {h.ledger.get(rid).gate_id for rid in h.sent()} == {new_id}  # type: ignore[union-attr]


async def test_refused_rows_keep_their_identity_and_cost_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused_once: set[str] = set()

    def refuse_first(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        replies: list[RunReply] = []
        for r in rows:
            if r.rollout_id not in refused_once:
                refused_once.add(r.rollout_id)
                replies.append(Refused(r.rollout_id))
            else:
                replies.append(Completed(r.rollout_id, 1.0, 2))
        return [replies]

    async with dispatching(ScriptedGym(refuse_first), rows=2) as h:
        await trio.sleep(10)
        sent = h.sent()
        assert sorted(set(sent)) == sorted(refused_once)  # re-sent under the same IDs
        assert len(sent) == 4
        assert h.metrics.get(ADMISSION_CLOSED_ROWS) == 2
        stats = h.ledger.statistics()
        assert stats.row_attempts_spent == 0 and stats.by_state["completed"] == 2


async def test_a_whole_submission_refused_is_resent_with_the_same_rows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with dispatching(ScriptedGym(refuse_submissions=1), rows=1) as h:
        await trio.sleep(10)
        assert len(h.sent()) == 1
        assert h.dispatcher.statistics().refused == 1
        assert h.ledger.statistics().by_state["completed"] == 1


async def test_an_early_stream_end_retires_the_lost_rows_and_resends_them_fresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first: list[str] = []

    def lose_the_first(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        if not first:
            first.extend(r.rollout_id for r in rows)
            return []  # the stream ends with nothing answered
        return complete_all(_instance, rows)

    async with dispatching(ScriptedGym(lose_the_first), rows=1) as h:
        await trio.sleep(10)
        assert h.gym.retired and h.gym.retired[0][1] == tuple(first)
        assert h.ledger.get(first[0]) is None  # abandoned, retired, forgotten
        (_, (lost,)), (_, (fresh,)) = h.gym.runs
        assert (fresh.row, fresh.slot, fresh.attempt) == (lost.row, lost.slot, lost.attempt + 1)
        assert fresh.rollout_id != lost.rollout_id  # a fresh attempt, a new ID
        assert h.ledger.statistics().by_state["completed"] == 1
        assert h.dispatcher.statistics().early_ends == 1


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), True])
async def test_a_reward_that_is_not_a_finite_number_is_a_data_failure(
    reward: object, autojump_clock: trio.testing.MockClock
) -> None:
    answered: list[str] = []

    def bad_then_good(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        out: list[RunReply] = []
        for r in rows:
            out.append(Completed(r.rollout_id, 1.0 if answered else reward, 2))  # type: ignore[arg-type]
            answered.append(r.rollout_id)
        return [out]

    async with dispatching(ScriptedGym(bad_then_good), rows=1) as h:
        await trio.sleep(10)
        assert len(answered) == 2 and answered[0] != answered[1]  # failed, then re-sent fresh
        assert h.metrics.get(EPISODE_FAILURES_DATA) == 1
        stats = h.ledger.statistics()
        assert (stats.data_failures, stats.failed_total) == (1, 1)
        assert stats.by_state["completed"] == 1


async def test_an_int_reward_is_taken_as_a_float_and_stale_replies_are_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def int_and_stale(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        return [[Completed("9-0-a9", 5.0, 1), *(Completed(r.rollout_id, 3, 2) for r in rows)]]

    async with dispatching(ScriptedGym(int_and_stale), rows=1) as h:
        await trio.sleep(5)
        att = h.ledger.get(h.sent()[0])
        assert att is not None and att.result is not None
        assert type(att.result.reward) is float and att.result.reward == 3.0
        assert h.ledger.get("9-0-a9") is None


async def test_failed_replies_count_by_class_and_infra_spends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answered: list[str] = []

    def infra_then_good(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        out: list[RunReply] = []
        for r in rows:
            out.append(
                Completed(r.rollout_id, 1.0, 2)
                if answered
                else Failed(r.rollout_id, "infra", "sandbox crashed")
            )
            answered.append(r.rollout_id)
        return [out]

    async with dispatching(ScriptedGym(infra_then_good), rows=1) as h:
        await trio.sleep(30)  # past the infra backoff
        assert len(answered) == 2
        assert h.metrics.get("rollout/episode_failures_infra_total") == 1
        assert h.ledger.statistics().by_state["completed"] == 1
        assert h.ledger.statistics().row_attempts_spent == 0


def down_until(t_up: float, log: list[tuple[float, str]]) -> Script:
    """Every episode fails as infra (its model server is down) until ``t_up``, then
    completes; ``log`` gets (time, rollout ID) of every attempt sent."""

    def script(_instance: str, rows: Sequence[RunRow]) -> list[list[RunReply]]:
        now = trio.current_time()
        log.extend((now, r.rollout_id) for r in rows)
        if now < t_up:
            return [[Failed(r.rollout_id, "infra", "model unavailable: 503") for r in rows]]
        return [[Completed(r.rollout_id, 1.0, 2) for r in rows]]

    return script


async def test_an_outage_longer_than_the_attempts_budget_is_waited_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """60 s of model-server downtime, far more than 3 row attempts' worth: the rows wait
    (re-sent with a backoff that grows with the outage, capped at ``infra_backoff_max_s``)
    and every one completes, no row attempt spent, no row given up (issue 31, finding 7)."""
    sent: list[tuple[float, str]] = []
    async with dispatching(ScriptedGym(down_until(60.0, sent)), rows=4) as h:
        await trio.sleep(90)
        stats = h.ledger.statistics()
        assert stats.by_state["completed"] == 4 and stats.rows_failed == 0
        assert stats.row_attempts_spent == 0 and stats.data_failures == 0
        assert not h.dispatcher.outage.is_down  # the completions ended the outage
    per_row = [[t for t, rid in sent if rid.startswith(f"{row}-")] for row in range(4)]
    for times in per_row:
        assert times[-1] >= 60.0  # still waiting when the server came back
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= CONFIG.infra_backoff_initial_s for g in gaps), gaps  # never a spin
        assert len(times) < 200  # spaced: the late gaps are the 2 s cap
        assert max(gaps) <= CONFIG.infra_backoff_max_s + 0.5


async def test_an_outage_past_its_budget_stops_the_run_naming_what_is_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The server never comes back: past ``outage_budget_s`` the dispatcher raises
    ``InfraOutage`` (exit code 8) naming the last failure; the rows are still in the ledger,
    not given up."""
    config = attrs.evolve(CONFIG, outage_budget_s=30.0)
    ledger = RecoveryLedger(group_size=1)
    metrics = Metrics(clock=trio.current_time)
    gym = ScriptedGym(down_until(float("inf"), []))
    dispatcher = Dispatcher(
        gym,  # type: ignore[arg-type]
        ledger,
        DispatchGate(),
        DeadlineRegistry(),
        config,
        metrics,
        iter(range(3)),
        InstanceReplacer(gym, ledger, config, metrics),  # type: ignore[arg-type]
    )
    with pytest.RaisesGroup(InfraOutage, flatten_subgroups=True) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(dispatcher.run)
    [err] = [e for e in leaf_errors(caught.value) if isinstance(e, InfraOutage)]
    assert 30.0 < err.down_s < 30.0 + config.infra_backoff_max_s + 1.0
    assert "model unavailable: 503" in err.last and str(err).startswith("infrastructure")
    assert "outage_budget_s=30" in str(err)
    assert ledger.statistics().rows_failed == 0 and len(ledger.rows()) == 3


@attrs.define
class UnreachableStream:
    """A reply stream whose connection breaks (``GymCheckpointUnavailable``) until ``t_up``,
    then answers every row."""

    rows: Sequence[RunRow]
    t_up: float
    done: bool = False

    def __aiter__(self) -> UnreachableStream:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        await trio.sleep(0.1)
        if self.done:
            raise StopAsyncIteration
        if trio.current_time() < self.t_up:
            raise GymCheckpointUnavailable("connection reset by peer", "gym-0", "run")
        self.done = True
        return [Completed(r.rollout_id, 1.0, 2) for r in self.rows]

    async def aclose(self) -> None:
        pass


@attrs.define
class UnreachableGym(ScriptedGym):
    t_up: float = 0.0

    async def run(self, instance: str, rows: Sequence[RunRow]) -> UnreachableStream:  # type: ignore[override]
        await trio.lowlevel.checkpoint()
        self.runs.append((instance, tuple(rows)))
        return UnreachableStream(rows, self.t_up)


async def test_a_stream_broken_by_an_unreachable_instance_spends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An instance that cannot be reached for 30 s breaks every reply stream (a transport
    error, not a death): the rows are abandoned and re-sent fresh after the outage's backoff,
    spending nothing, and every one completes once it is back."""
    gym = UnreachableGym(t_up=30.0)
    async with dispatching(gym, rows=3) as h:
        await trio.sleep(60)
        stats = h.ledger.statistics()
        assert stats.by_state["completed"] == 3 and stats.rows_failed == 0
        assert stats.row_attempts_spent == 0
        assert h.metrics.get("rollout/stream_errors_total") >= 3
        assert h.dispatcher.outage.statistics().outages >= 1
    assert 3 < len(gym.runs) < 200  # re-sent, with a backoff between
