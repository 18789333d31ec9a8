"""RecoveryLedger: unit tests and a hypothesis state machine over its invariants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gymckpt.runtime import (
    AttemptState,
    BudgetExhausted,
    EpisodeRecord,
    EpisodeResult,
    ManifestError,
    RecoveryLedger,
    rollout_id_for,
)
from gymckpt.runtime._ledger import dump_ledger_snapshot, load_ledger_snapshot

R = EpisodeResult(1.0, 2)


def _m(ledger: RecoveryLedger, fn):  # type: ignore[no-untyped-def]
    return ledger.barrier.mutate_nowait(fn)


def test_rollout_ids() -> None:
    assert rollout_id_for(3, 1, 0) == "3-1"
    assert rollout_id_for(3, 1, 2) == "3-1-a2"


def test_changes_outside_a_mutation_are_refused() -> None:
    ledger = RecoveryLedger(group_size=1)
    with pytest.raises(RuntimeError, match=r"inside barrier\.mutate"):
        ledger.reserve_row(0)


def test_refusal_spends_nothing_and_keeps_identity() -> None:
    ledger = RecoveryLedger(group_size=1)
    _m(ledger, lambda: ledger.reserve_row(0))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0"], "gym-0", 1))
    assert _m(ledger, lambda: ledger.refuse("0-0"))
    att = ledger.get("0-0")
    assert att is not None and att.state is AttemptState.RESERVED
    assert (att.replica, att.gate_id) == (None, None)
    assert ledger.row_attempts_spent(0, 0) == 0 and ledger.data_failures == 0
    assert ledger.held_by("gym-0") == frozenset()


def test_completion_needs_matching_gate_id() -> None:
    ledger = RecoveryLedger(group_size=1)
    _m(ledger, lambda: ledger.reserve_row(0))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0"], "gym-0", 4))
    assert not _m(ledger, lambda: ledger.complete("0-0", 3, R))
    assert ledger.statistics().stale_replies == 1
    assert _m(ledger, lambda: ledger.complete("0-0", 4, R))
    assert ledger.ready_groups == 1


def test_data_failures_spend_attempts_then_fail_the_row() -> None:
    ledger = RecoveryLedger(group_size=2, max_row_attempts=2, data_failure_budget=10)
    _m(ledger, lambda: ledger.reserve_row(0))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0"], "gym-0", 1))
    nxt = _m(ledger, lambda: ledger.fail("0-0", 1, "data", "bad row"))
    assert nxt is not None and nxt.rollout_id == "0-0-a1"
    assert ledger.get("0-0") is None  # the old attempt is no longer current
    _m(ledger, lambda: ledger.mark_dispatched(["0-0-a1", "0-1"], "gym-1", 1))
    assert _m(ledger, lambda: ledger.fail("0-0-a1", 1, "data", "bad row")) is None
    assert ledger.rows_failed == {0}
    # the sibling Gym still runs is queued for retirement (S4)
    assert [i.rollout_id for i in ledger.retire_queue()["gym-1"]] == ["0-1"]


def test_infra_failures_spend_nothing_and_never_fail_the_row() -> None:
    """An outage (the model server down, an instance that could not run the episode) is not
    the row's fault: however often, it spends no row attempt and no data budget; the slot's
    next attempt is a fresh one (new rollout ID), and the old one's late replies are stale."""
    ledger = RecoveryLedger(group_size=1, max_row_attempts=1, data_failure_budget=0)
    _m(ledger, lambda: ledger.reserve_row(0))
    rid = "0-0"
    for n in range(1, 6):
        _m(ledger, lambda rid=rid: ledger.mark_dispatched([rid], "gym-0", 1))
        nxt = _m(ledger, lambda rid=rid: ledger.fail(rid, 1, "infra", "model unavailable"))
        assert nxt is not None and nxt.rollout_id == f"0-0-a{n}"
        assert not _m(ledger, lambda rid=rid: ledger.complete(rid, 1, R))  # fenced
        rid = nxt.rollout_id
    assert ledger.row_attempts_spent(0, 0) == 0 and ledger.data_failures == 0
    assert ledger.rows_failed == frozenset() and list(ledger.rows()) == [0]
    assert ledger.last_failure == "0-0-a4: infra: model unavailable"


def test_data_budget_exhausted_raises() -> None:
    ledger = RecoveryLedger(group_size=1, max_row_attempts=5, data_failure_budget=0)
    _m(ledger, lambda: ledger.reserve_row(0))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0"], "gym-0", 1))
    with pytest.raises(BudgetExhausted, match="data-failure budget of 0"):
        _m(ledger, lambda: ledger.fail("0-0", 1, "data", "bad"))


def test_abandon_queues_retire_and_resends_fresh() -> None:
    ledger = RecoveryLedger(group_size=2)
    _m(ledger, lambda: ledger.reserve_row(0))
    _m(ledger, lambda: ledger.mark_dispatched(["0-0"], "gym-0", 1))
    out = _m(ledger, lambda: ledger.abandon(["0-0", "0-1"]))  # 0-1 never reached Gym
    assert [a.rollout_id for a in out] == ["0-0-a1"]
    assert ledger.get("0-1") is not None  # kept its identity
    assert [i.rollout_id for i in ledger.retire_queue()["gym-0"]] == ["0-0"]


def test_retire_queue_forgets_only_what_was_retired() -> None:
    ledger = RecoveryLedger(group_size=1)
    for r in range(2):
        _m(ledger, lambda r=r: ledger.reserve_row(r))
        _m(ledger, lambda r=r: ledger.mark_dispatched([f"{r}-0"], "gym-0", 1))
    _m(ledger, lambda: ledger.drop_row(0))
    batch = ledger.retire_queue()
    _m(ledger, lambda: ledger.drop_row(1))  # recorded while the retire is in progress
    _m(ledger, lambda: ledger.forget_retired(i.rollout_id for i in batch["gym-0"]))
    assert [i.rollout_id for i in ledger.retire_queue()["gym-0"]] == ["1-0"]


def test_restore_replaces_exported_with_unclaimed_attempt_plus_one() -> None:
    ledger = RecoveryLedger(group_size=2)
    _m(ledger, lambda: ledger.reserve_row(7))
    _m(ledger, lambda: ledger.mark_dispatched(["7-0", "7-1"], "gym-1", 2))
    _m(ledger, lambda: ledger.complete("7-1", 2, R))
    snap = load_ledger_snapshot(dump_ledger_snapshot(ledger.to_snapshot()))
    restored, summary = RecoveryLedger.from_snapshot(
        snap, [EpisodeRecord("7-0", "calendar", "gym-1", ("7-0/t1",))]
    )
    assert (summary.restored, summary.completed_untrained) == (1, 1)
    att = restored.get("7-0-a1")
    assert att is not None and att.unclaimed and att.state is AttemptState.RESERVED
    assert att.restored is not None and att.restored.instance == "gym-1"
    assert restored.held_by("gym-1") == {"7-0"}  # Gym still knows it by the exported ID
    with pytest.raises(ValueError, match="restored on gym-1"):
        _m(restored, lambda: restored.mark_dispatched(["7-0-a1"], "gym-0", 1))
    _m(restored, lambda: restored.mark_dispatched(["7-0-a1"], "gym-1", 1))
    assert not restored.get("7-0-a1").unclaimed  # type: ignore[union-attr]
    assert restored.held_by("gym-1") == {"7-0-a1"}
    assert restored.statistics().unclaimed == 0


def test_dispatch_sendable_claims_a_restored_attempt_only_on_its_replica() -> None:
    ledger = RecoveryLedger(group_size=2)
    _m(ledger, lambda: ledger.reserve_row(7))
    _m(ledger, lambda: ledger.mark_dispatched(["7-0", "7-1"], "gym-1", 2))
    snap = load_ledger_snapshot(dump_ledger_snapshot(ledger.to_snapshot()))
    restored, _ = RecoveryLedger.from_snapshot(
        snap, [EpisodeRecord("7-0", "calendar", "gym-1", ("7-0/t1",))]
    )
    fresh = restored.reserved_attempt("7-1-a1")  # not exported: re-sent fresh, anywhere
    assert fresh == (7, 1, 1, None)
    info = restored.reserved_attempt("7-0-a1")
    assert info is not None and info[:3] == (7, 0, 1) and info[3] is not None
    assert info[3].instance == "gym-1" and info[3].from_rollout_id == "7-0"
    before = restored.statistics()
    with pytest.raises(ValueError, match="restored on gym-1"):
        _m(restored, lambda: restored.dispatch_sendable(["7-1-a1", "7-0-a1"], "gym-0", 1))
    assert restored.statistics() == before  # nothing changed, not even the fresh attempt
    ok, rest = _m(restored, lambda: restored.dispatch_sendable(["7-0-a1", "7-0"], "gym-1", 1))
    assert (ok, rest) == (["7-0-a1"], ["7-0"])
    assert restored.statistics().unclaimed == 0
    assert restored.held_by("gym-1") == {"7-0-a1"}


def test_snapshot_rejects_bad_input() -> None:
    with pytest.raises(ManifestError, match=r"ledger\.json"):
        load_ledger_snapshot(b"{}")
    with pytest.raises(ManifestError, match="empty"):
        load_ledger_snapshot(b"")
    ledger = RecoveryLedger(group_size=1)
    _m(ledger, lambda: ledger.reserve_row(0))
    raw = dump_ledger_snapshot(ledger.to_snapshot()).replace(b'"reserved"', b'"parked"')
    with pytest.raises(ManifestError, match="unknown attempt state 'parked'"):
        RecoveryLedger.from_snapshot(load_ledger_snapshot(raw))


def test_pending_among_is_proportional_to_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    from gymckpt.runtime import _ledger_columns

    ledger = RecoveryLedger(group_size=4)
    for r in range(5000):
        _m(ledger, lambda r=r: ledger.reserve_row(r))
    ids = [rollout_id_for(r, s, 0) for r in range(5000) for s in range(4)]
    _m(ledger, lambda: ledger.mark_dispatched(ids, "gym-0", 1))
    # the pending set question only locates the IDs it is given
    parsed: list[str] = []
    real = _ledger_columns.parse_rollout_id

    def counting(rid: str) -> tuple[int, int, int] | None:
        parsed.append(rid)
        return real(rid)

    monkeypatch.setattr(_ledger_columns, "parse_rollout_id", counting)
    assert ledger.pending_among(["3-1", "4-2", "nope"]) == {"3-1", "4-2"}
    assert ledger.pending_among(["3-1", "4-2"], "gym-1") == set()
    assert parsed == ["3-1", "4-2", "nope", "3-1", "4-2"]


INSTANCES = ("gym-0", "gym-1")


class LedgerMachine(RuleBasedStateMachine):
    """Random sequences of ledger changes; invariants checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = RecoveryLedger(group_size=2, max_row_attempts=3, data_failure_budget=1000)
        self.next_row = 0
        self.gate = 1
        self.spent: Counter[tuple[int, int]] = Counter()
        # drain checks made along the way, each with the IDs it was made for
        self.checks: list[tuple[Callable[[Hashable], bool], list[str]]] = []

    def m(self, fn):  # type: ignore[no-untyped-def]
        return self.ledger.barrier.mutate_nowait(fn)

    def _in_state(self, state: AttemptState) -> list[str]:
        return sorted(a.rollout_id for a in self.ledger._by_id.values() if a.state is state)

    @rule()
    def reserve(self) -> None:
        self.m(lambda: self.ledger.reserve_row(self.next_row))
        self.next_row += 1

    @rule(data=st.data(), inst=st.sampled_from(INSTANCES))
    def dispatch(self, data: st.DataObject, inst: str) -> None:
        reserved = [a.rollout_id for a in self.ledger.reserved() if a.restored is None]
        if not reserved:
            return
        ids = data.draw(st.lists(st.sampled_from(reserved), min_size=1, unique=True))
        self.m(lambda: self.ledger.mark_dispatched(ids, inst, self.gate))

    @rule()
    def reserve_ids(self) -> None:
        """The dispatch path's reserve names exactly the attempts ``reserve_row`` would."""
        row = self.next_row
        ids = self.m(lambda: self.ledger.reserve_row_ids(row))
        self.next_row += 1
        assert ids == [rollout_id_for(row, k, 0) for k in range(self.ledger.group_size)]
        for k, rid in enumerate(ids):
            assert self.ledger.reserved_attempt(rid) == (row, k, 0, None)

    @rule(data=st.data(), inst=st.sampled_from(INSTANCES))
    def dispatch_sendable(self, data: st.DataObject, inst: str) -> None:
        """Dispatch a mix of RESERVED, DISPATCHED, COMPLETED and unknown IDs (some twice): the
        RESERVED ones are dispatched once, in order, everything else is handed back."""
        ids = [*sorted(self.ledger._by_id), "9999-0", "not-an-id"]
        asked = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=6))
        want_ok = list(
            dict.fromkeys(rid for rid in asked if self.ledger.reserved_attempt(rid) is not None)
        )
        ok, rest = self.m(lambda: self.ledger.dispatch_sendable(asked, inst, self.gate))
        assert ok == want_ok
        assert sorted(ok + rest) == sorted(asked)
        for rid in ok:
            att = self.ledger.get(rid)
            assert att is not None and att.state is AttemptState.DISPATCHED
            assert (att.replica, att.gate_id) == (inst, self.gate)
            assert self.ledger.reserved_attempt(rid) is None

    @rule(data=st.data())
    def complete_with(self, data: st.DataObject) -> None:
        ids = self._in_state(AttemptState.DISPATCHED)
        if ids:
            rid = data.draw(st.sampled_from(ids))
            att = self.ledger.get(rid)
            assert att is not None and att.gate_id is not None
            assert not self.m(lambda: self.ledger.complete_with(rid, att.gate_id + 1, 2.0, 3))
            assert self.m(lambda: self.ledger.complete_with(rid, att.gate_id, 2.0, 3, {"p": 1}))
            assert att.result == EpisodeResult(2.0, 3, {"p": 1})

    @rule(data=st.data())
    def refuse(self, data: st.DataObject) -> None:
        ids = self._in_state(AttemptState.DISPATCHED)
        if not ids:
            return
        rid = data.draw(st.sampled_from(ids))
        stats = self.ledger.statistics()
        before = (stats.row_attempts_spent, stats.data_failures)
        assert self.m(lambda: self.ledger.refuse(rid))
        stats = self.ledger.statistics()
        assert (stats.row_attempts_spent, stats.data_failures) == before
        att = self.ledger.get(rid)
        assert att is not None and att.state is AttemptState.RESERVED

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        ids = self._in_state(AttemptState.DISPATCHED)
        if ids:
            rid = data.draw(st.sampled_from(ids))
            att = self.ledger.get(rid)
            assert att is not None and att.gate_id is not None
            stale = att.gate_id + 1
            assert not self.m(lambda: self.ledger.complete(rid, stale, R))
            assert self.m(lambda: self.ledger.complete(rid, att.gate_id, R))

    @rule(data=st.data(), cls=st.sampled_from(["infra", "data"]))
    def fail(self, data: st.DataObject, cls: str) -> None:
        ids = self._in_state(AttemptState.DISPATCHED)
        if ids:
            rid = data.draw(st.sampled_from(ids))
            att = self.ledger.get(rid)
            assert att is not None
            if cls == "data":  # an infra failure (an outage) spends nothing
                self.spent[(att.row, att.slot)] += 1
            self.m(lambda: self.ledger.fail(rid, att.gate_id, cls, "x"))  # type: ignore[arg-type]

    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        ids = self._in_state(AttemptState.DISPATCHED)
        if ids:
            rid = data.draw(st.sampled_from(ids))
            att = self.ledger.get(rid)
            assert att is not None
            self.spent[(att.row, att.slot)] += 1
            self.m(lambda: self.ledger.abandon([rid]))
            queued = {i.rollout_id for items in self.ledger.retire_queue().values() for i in items}
            assert rid in queued

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        rows = sorted(self.ledger.rows())
        if rows:
            row = data.draw(st.sampled_from(rows))
            self.m(lambda: self.ledger.drop_row(row))

    @rule(data=st.data())
    def retire_some(self, data: st.DataObject) -> None:
        queue = [i.rollout_id for items in self.ledger.retire_queue().values() for i in items]
        done = data.draw(st.lists(st.sampled_from(queue), unique=True)) if queue else []
        self.m(lambda: self.ledger.forget_retired(done))
        left = {i.rollout_id for items in self.ledger.retire_queue().values() for i in items}
        assert left == set(queue) - set(done)

    @rule(n=st.integers(1, 3))
    def take(self, n: int) -> None:
        before = self.ledger.ready_groups
        groups = self.m(lambda: self.ledger.take_ready(n))
        assert len(groups) == min(n, before)
        for g in groups:
            assert g.row in self.ledger.rows_trained

    @rule()
    def reopen_gate(self) -> None:
        self.gate += 1

    @precondition(lambda self: len(self.checks) < 4)
    @rule()
    def make_drain_check(self) -> None:
        ids = [*sorted(self.ledger._by_id), rollout_id_for(self.next_row, 0, 0), "not-an-id"]
        self.checks.append((self.ledger.settled_check(ids), ids))

    @precondition(lambda self: bool(self.checks))
    @rule(data=st.data())
    def ask_drain_check(self, data: st.DataObject) -> None:
        """A drain asks only about the IDs a mutation touched, possibly many changes after it
        located them: it answers exactly as ``is_in_flight``, however the ledger moved."""
        settled, ids = data.draw(st.sampled_from(self.checks))
        for rid in data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3)):
            assert settled(rid) is not self.ledger.is_in_flight(rid), rid

    @precondition(lambda self: not self._in_state(AttemptState.DISPATCHED))
    @rule()
    def snapshot_restore_is_identity(self) -> None:
        snap = self.ledger.to_snapshot()
        loaded = load_ledger_snapshot(dump_ledger_snapshot(snap))
        assert loaded == snap
        again, summary = RecoveryLedger.from_snapshot(loaded)
        assert summary.restored == summary.redispatched_fresh == 0
        assert again.to_snapshot() == snap

    @invariant()
    def invariants(self) -> None:
        ledger = self.ledger
        seen: set[str] = set()
        counts: Counter[AttemptState] = Counter()
        held: dict[str, set[str]] = {}
        for row_index, row in ledger._rows.items():
            assert [a.slot for a in row.slots] == list(range(ledger.group_size))
            for att in row.slots:
                assert att.row == row_index
                assert att.rollout_id == rollout_id_for(att.row, att.slot, att.attempt)
                assert att.rollout_id not in seen
                seen.add(att.rollout_id)
                assert ledger.get(att.rollout_id) is att
                counts[att.state] += 1
                if att.state is AttemptState.RESERVED:
                    assert att.replica is None and att.gate_id is None
                if att.state is AttemptState.DISPATCHED:
                    assert att.replica is not None and att.gate_id is not None
                    held.setdefault(att.replica, set()).add(att.rollout_id)
                assert att.state not in (AttemptState.FAILED, AttemptState.ABANDONED)
        assert seen == set(ledger._by_id)
        stats = ledger.statistics()
        assert stats.by_state == {s.value: counts[s] for s in AttemptState}
        for inst in INSTANCES:
            assert ledger.held_by(inst) == held.get(inst, set())
        for (row, slot), n in self.spent.items():
            assert ledger.row_attempts_spent(row, slot) == n <= ledger.max_row_attempts
        assert stats.row_attempts_spent == sum(self.spent.values())


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
