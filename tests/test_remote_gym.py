"""``RemoteGym``: the contract's verbs written once over one call primitive (``_call``).

A fake transport records what the verbs hand its primitive, so these tests pin, in process and
without a server or a cluster, what ``RayGym`` and ``HttpGym`` both send: the contract's named
arguments (the HTTP wire's), the deadline of a control call and none for a view, the fault the
plan drew for a control call, the trainer's term recorded before the attach, a dead instance
refused before the plan counts the call, and the deployment's extras (statistics of a dead
instance, the replacements in one shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from gymckpt.gym_adapter import (
    FaultPlan,
    HostStatistics,
    InstanceTopology,
    Replacement,
    ReplyStream,
    RunRow,
    can_attach,
    can_replace,
)
from gymckpt.gym_adapter.lowlevel import RemoteGym
from gymckpt.runtime import CheckpointMode, GymInstanceDead, TrainerTerm


@attrs.frozen
class Sent:
    instance: str
    op: str
    args: dict[str, Any]
    deadline_ts: float | None
    fault: str | None


class FakeTransport(RemoteGym):
    """A transport whose primitive records each call and answers from ``answers``."""

    def __init__(self, names: Sequence[str], faults: Sequence[str] = ()) -> None:
        super().__init__(FaultPlan(faults), names)
        self.sent: list[Sent] = []
        self.answers: dict[str, Any] = {}
        self.terms: list[TrainerTerm | None] = []

    async def _call(
        self,
        instance: str,
        op: str,
        args: Mapping[str, Any],
        deadline_ts: float | None,
        fault: Any = None,
    ) -> Any:
        self._incarnations.live(instance, op)
        self.terms.append(self._trainer)
        self.sent.append(
            Sent(instance, op, dict(args), deadline_ts, None if fault is None else str(fault))
        )
        answer = self.answers.get(op)
        return answer(instance) if callable(answer) else answer

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream:
        raise NotImplementedError

    async def replace(self, instance: str, deadline_ts: float) -> None:
        incarnation = self._incarnations.begin_replacement(instance)
        self._incarnations.installed(instance, incarnation)
        self._log_replacement(Replacement(instance, 0.5, 1.5, "old", "new"))


def _stats(name: str, completed: int) -> HostStatistics:
    # ``f.type`` is the string "int", or ``int`` once something resolved the class's types
    # (the converter does): either way a count
    counts = {f.name: 0 for f in attrs.fields(HostStatistics) if f.type in ("int", int)}
    return HostStatistics(
        **{
            **counts,
            "instance": name,
            "dead": False,
            "admission_open": True,
            "prepared": False,
            "counters": {},
            "completed": completed,
        }
    )


async def test_the_verbs_send_the_contracts_named_arguments_over_the_primitive() -> None:
    gym = FakeTransport(["gym-0"])
    await gym.prepare("gym-0", "c1", 10.0)
    await gym.prepare("gym-0", "c2", 11.0, CheckpointMode.UNALIGNED, alignment_timeout_s=2)
    await gym.commit("gym-0", "c2", "/snap", 12.0)
    await gym.resume("gym-0", "c2", 13.0)
    await gym.retire("gym-0", ["a", "b"], 14.0)
    await gym.retire_restored("gym-0", ["c"], 15.0)
    await gym.inventory("gym-0")
    await gym.retained_sessions("gym-0")
    assert [(s.op, s.args, s.deadline_ts) for s in gym.sent] == [
        ("prepare", {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED}, 10.0),
        (
            "prepare",
            {"checkpoint_id": "c2", "mode": CheckpointMode.UNALIGNED, "alignment_timeout_s": 2.0},
            11.0,
        ),
        ("commit", {"checkpoint_id": "c2", "state_root": "/snap"}, 12.0),
        ("resume", {"checkpoint_id": "c2"}, 13.0),
        ("retire", {"rollout_ids": ("a", "b")}, 14.0),
        ("retire_restored", {"rollout_ids": ("c",)}, 15.0),
        ("inventory", {}, None),  # a view: no deadline, the transport bounds it
        ("retained_sessions", {}, None),
    ]


async def test_a_control_call_draws_its_fault_and_a_view_draws_none() -> None:
    gym = FakeTransport(["gym-0"], faults=["prepare:error@2"])
    await gym.prepare("gym-0", "c1", 10.0)
    await gym.prepare("gym-0", "c2", 10.0)
    await gym.inventory("gym-0")
    assert [s.fault for s in gym.sent] == [None, "prepare:error@2", None]
    assert gym.faults.calls("prepare") == 2 and gym.faults.calls("inventory") == 0


async def test_a_dead_instance_is_refused_before_the_plan_counts_the_call() -> None:
    gym = FakeTransport(["gym-0", "gym-1"])
    gym._incarnations.mark_dead("gym-1", 0)
    with pytest.raises(GymInstanceDead) as info:
        await gym.prepare("gym-1", "c1", 10.0)
    assert (info.value.instance, info.value.operation) == ("gym-1", "prepare")
    assert gym.faults.calls("prepare") == 0 and gym.sent == []
    with pytest.raises(GymInstanceDead):  # topology asks nobody while one is dead
        await gym.topology()
    assert gym.sent == []


async def test_attach_records_the_term_before_the_call_so_the_takeover_carries_it() -> None:
    gym = FakeTransport(["gym-0", "gym-1"])
    term = TrainerTerm("ab" * 16, 1)
    await gym.attach("gym-0", term, 10.0)
    await gym.prepare("gym-1", "c1", 10.0)
    await gym.release("gym-0", term, 11.0)
    assert [(s.op, s.args) for s in gym.sent] == [
        ("attach", {"trainer": term}),
        ("prepare", {"checkpoint_id": "c1", "mode": CheckpointMode.ALIGNED}),
        ("release", {"trainer": term}),
    ]
    assert gym.terms == [term, term, term]
    assert can_attach(gym) and can_replace(gym)


async def test_topology_asks_every_instance_in_topology_order() -> None:
    gym = FakeTransport(["gym-0", "gym-1"])
    gym.answers["topology"] = lambda name: InstanceTopology(name, (("calendar", "state"),))
    topology = await gym.topology()
    assert topology.names == ("gym-0", "gym-1")


async def test_a_dead_instance_reports_the_counts_last_seen() -> None:
    gym = FakeTransport(["gym-0", "gym-1"], faults=["prepare:error@1"])
    gym.answers["statistics"] = lambda name: _stats(name, 3)
    first = await gym.statistics()
    assert [s.completed for s in first.instances] == [3, 3]
    gym._incarnations.mark_dead("gym-1", 0)
    await gym.prepare("gym-0", "c1", 10.0)
    stats = await gym.statistics()
    assert [(s.instance, s.dead, s.completed) for s in stats.instances] == [
        ("gym-0", False, 3),
        ("gym-1", True, 3),
    ]
    assert stats.instances[1].admission_open is False
    assert stats.faults_fired == (("prepare:error@1", 1),)


async def test_replacements_have_one_shape_and_count_per_instance() -> None:
    gym = FakeTransport(["gym-0", "gym-1"])
    await gym.replace("gym-1", 10.0)
    await gym.replace("gym-1", 10.0)
    assert (gym.replacement_count("gym-0"), gym.replacement_count("gym-1")) == (0, 2)
    (first, _) = gym.replacements
    assert (first.instance, first.total_s, first.old_location) == ("gym-1", 2.0, "old")
    with pytest.raises(ValueError, match=r"unknown instance 'gym-7' \(instances: gym-0, gym-1\)"):
        gym.replacement_count("gym-7")
