"""Exactly-once under the races a review found: each test reproduces one of them on the embedded
Gym, in virtual time, and checks the outcome a user relies on.

* a snapshot restore must reject runs before Gym installs anything, and ``gymckpt verify``
  rejects the same snapshots;
* a restore is all-or-nothing across instances;
* an attempt dropped between the checkpoint's retire stage and its cut is retired by the restore
  before its replacement is dispatched (no environment mutation twice);
* a late end-of-stream is a transient, never an abort;
* control-plane failures the design calls retryable are retried, and partial retire progress is
  kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from gymckpt.app.cli import main
from gymckpt.app.demo.main import snapshot_sentinels
from gymckpt.app.simulation.gym import LateEnd
from gymckpt.gym_adapter import (
    EmbeddedGym,
    Failed,
    GymControlError,
    ReplyStream,
    RetireReply,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
    calendar_state,
)
from gymckpt.nurseries import Rollouts, open_rollouts
from gymckpt.runtime import (
    ADMISSION_CLOSED_ROWS,
    BudgetExhausted,
    CheckpointInvariantError,
    GymAdmissionClosed,
    GymCheckpointUnavailable,
    ManifestError,
    RetireItem,
    RuntimeConfig,
    load_snapshot,
)
from gymckpt.runtime._ledger import load_ledger_snapshot
from gymckpt.runtime._shared import COMMIT_MARKER
from gymckpt.runtime._snapshot_format import _attempt_arrays

SIM = CalendarConfig(turns=(2, 4), turn_s=(0.5, 2.0), mutation_p=0.9, lease_s=60.0)
CONFIG = RuntimeConfig(
    control_timeout_s=2.0,
    reply_grace_s=0.5,
    drain_timeout_s=30.0,
    lease_s=60.0,
    max_consecutive_failures=2,
)


class Wrapped:
    """An ``EmbeddedGym`` with some methods replaced (a unit-test seam, not a second Gym)."""

    def __init__(self, gym: EmbeddedGym, **overrides: Any) -> None:
        self._gym = gym
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._gym, name)


@asynccontextmanager
async def gym_at(
    tmp_path: Path, name: str, faults: Sequence[str] = (), instances: int = 2
) -> AsyncIterator[EmbeddedGym]:
    async with EmbeddedGym.host(
        calendar_environment(config=SIM),
        instances=instances,
        seed=3,
        work_dir=tmp_path / name,
        faults=faults,
        config=SIM.host_config(),
    ) as gym:
        yield gym


async def train_all(ro: Rollouts) -> list[int]:
    rows: list[int] = []
    async for batch in ro.batches(2):
        rows.extend(g.row for g in batch)
    return rows


async def nothing_installed(gym: EmbeddedGym) -> None:
    for n in gym.instances:
        inv = await gym.inventory(n)
        assert inv.unclaimed == () and inv.parked == () and inv.running == (), inv
        assert calendar_state(gym.sim(n)) == {}, n


async def one_snapshot(tmp_path: Path, rows: int = 40) -> Path:
    async with gym_at(tmp_path, "gym-a") as gym:
        async with open_rollouts(
            gym, tmp_path, rows=rows, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(1)
            outcome = await ro.checkpoint()
            assert outcome.ok and outcome.episodes > 0 and outcome.snapshot is not None
            return outcome.snapshot.path


def rewrite_ledger(snap: Path, change: Any) -> None:
    """Edit ``ledger.json`` and re-hash it in the commit marker (a consistent-looking forgery)."""
    ledger = orjson.loads((snap / "ledger.json").read_bytes())
    change(ledger)
    (snap / "ledger.json").write_bytes(orjson.dumps(ledger))
    marker = orjson.loads((snap / COMMIT_MARKER).read_bytes())
    marker["files"]["ledger.json"] = hashlib.sha256((snap / "ledger.json").read_bytes()).hexdigest()
    (snap / COMMIT_MARKER).write_bytes(orjson.dumps(marker))


# -- every check before Gym installs anything; verify runs the same ones ------------------------


@pytest.mark.parametrize("forgery", ["unknown_state", "missing_slot", "bad_version"])
async def test_a_bad_ledger_is_rejected_by_verify_and_before_any_install(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    forgery: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    snap = await one_snapshot(tmp_path)

    def change(ledger: dict[str, Any]) -> None:
        # edited in version 1's form (an array per attempt, still read)
        ledger.update(version=1, attempts=_attempt_arrays(ledger))
        if forgery == "unknown_state":
            ledger["attempts"][0][3] = "teleported"
        elif forgery == "missing_slot":
            ledger["attempts"] = [
                a
                for a in ledger["attempts"]
                if not (a[0] == ledger["attempts"][-1][0] and a[1] == 1)
            ]
        else:
            ledger["version"] = 99

    rewrite_ledger(snap, change)
    capsys.readouterr()
    assert main(["verify", str(snap)]) == 2
    assert "ledger.json" in capsys.readouterr().err
    async with gym_at(tmp_path, "gym-b") as gym:
        with pytest.raises(ManifestError, match=r"ledger\.json"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=2, config=CONFIG):
                pass
        await nothing_installed(gym)


async def test_another_group_size_is_rejected_before_any_install(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await one_snapshot(tmp_path)
    async with gym_at(tmp_path, "gym-b") as gym:
        with pytest.raises(ManifestError, match="group_size 2, this run asks for 3"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=3, config=CONFIG):
                pass
        await nothing_installed(gym)


# -- all-or-nothing across instances ------------------------------------------------------------


async def test_a_restore_failing_on_one_instance_leaves_none_installed_and_a_retry_works(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await one_snapshot(tmp_path, rows=16)
    async with gym_at(tmp_path, "gym-b", faults=("restore:error@2",)) as gym:
        with pytest.raises(GymCheckpointUnavailable, match="restore"):
            async with open_rollouts(gym, tmp_path, rows=16, group_size=2, config=CONFIG):
                pass
        for n in gym.instances:  # the instance that installed dropped its restored episodes
            assert (await gym.inventory(n)).unclaimed == ()
        # a corrected restart into the same Gym restores and finishes exactly once
        async with open_rollouts(
            gym, tmp_path, rows=16, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            assert ro.restore_summary is not None and ro.restore_summary.restored > 0
            trained = await train_all(ro)
        done = ro.ledger.rows_trained
        assert sorted(trained) == sorted(set(trained)) and len(done) + len(trained) >= 16
        assert set(range(16)) == done | ro.ledger.rows_failed


# -- a drop between the retire stage and the cut, then a crash ----------------------------------


async def test_an_attempt_dropped_during_a_checkpoint_is_retired_by_the_restore(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The attempt is dropped after commit (its stream ended): Gym committed its session, the
    ledger no longer owns it. After a crash, the restore must retire it before its replacement
    runs anywhere — else its calendar mutations stay next to the replacement's."""
    async with gym_at(tmp_path, "gym-a") as gym:
        async with open_rollouts(
            gym, tmp_path, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(2.5)
            ledger = ro.ledger
            mutated = {
                s.rollout_id
                for n in gym.instances
                for s in calendar_state(gym.sim(n)).values()
                if s.events
            }
            victim = sorted(mutated & ledger.held_by("gym-0"))[0]

            def stream_ends_now(_cid: str, point: str) -> None:
                if point == "after_commit":
                    touched = [victim]
                    ledger.barrier.mutate_nowait(
                        lambda: ro.dispatcher._abandon([victim], touched), touched
                    )

            ro.coordinator.on_stage = stream_ends_now
            outcome = await ro.checkpoint()
            assert outcome.ok and outcome.snapshot is not None, outcome.error
            path = outcome.snapshot.path
    # crash: the runtime and its Gym are gone; the snapshot carries the drop
    carried = load_ledger_snapshot(load_snapshot(path).files["ledger.json"]).retire
    assert RetireItem(victim, "gym-0") in carried
    assert main(["verify", str(path)]) == 0

    async with gym_at(tmp_path, "gym-b") as gym:
        async with open_rollouts(
            gym, tmp_path, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            # nothing is dispatched yet (the dispatcher runs once we wait): the dropped
            # attempt's committed session must already be gone from every instance
            holders = {
                n
                for n in gym.instances
                if any(s.rollout_id == victim for s in calendar_state(gym.sim(n)).values())
            }
            assert ro.dispatcher.statistics().rows_sent == 0
            assert holders == set(), "the dropped attempt outlived the restore"
            assert ro.ledger.statistics().retire_queue == 0
            await train_all(ro)
            final = await ro.checkpoint()
            assert final.ok and final.snapshot is not None
    counts, _failed = snapshot_sentinels(final.snapshot.path)
    assert counts and max(counts.values()) == 1, {k: v for k, v in counts.items() if v > 1}


# -- a late end-of-stream -----------------------------------------------------------------------


# ``LateEnd``: the simulation's own late-ending stream (app/simulation/gym.py)


async def test_a_late_end_of_stream_is_waited_for_not_an_abort(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A stream is dropped; its other rows finish inside Gym, which discards their replies. At
    commit they are neither exported nor on the wire, yet still in flight in the ledger,
    because the consumer reads the end 12 s late. The checkpoint waits for it and succeeds."""
    async with gym_at(tmp_path, "gym-a", faults=("run:drop@1",), instances=1) as inner:

        async def run(instance: str, rows: Sequence[RunRow]) -> ReplyStream:
            return LateEnd(await inner.run(instance, rows), 12.0)

        gym = Wrapped(inner, run=run)
        async with open_rollouts(
            gym, tmp_path, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(9.0)  # the dropped rows have finished inside Gym
            before = ro.dispatcher.statistics().early_ends
            outcome = await ro.checkpoint()
            assert outcome.ok, outcome.error
            assert ro.dispatcher.statistics().early_ends == before + 1
            assert outcome.stage_s["snapshot"] > 0  # it waited for the late end
            trained = await train_all(ro)
    assert sorted(trained) == list(range(12))


# -- failure classification and partial progress ------------------------------------------------


async def test_an_os_error_in_the_control_plane_is_retried_and_an_unknown_error_aborts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with gym_at(tmp_path, "gym-a") as inner:
        failures: list[BaseException] = [OSError(28, "No space left on device")]

        async def commit(*args: Any) -> Any:
            if failures:
                raise failures.pop()
            return await inner.commit(*args)

        gym = Wrapped(inner, commit=commit)
        async with open_rollouts(
            gym, tmp_path, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(1)
            outcome = await ro.checkpoint()
            assert not outcome.ok and outcome.reason == "snapshot_io"
            assert "No space left" in (outcome.error or "")
            assert (await ro.checkpoint()).ok
            failures.append(RuntimeError("commit reply from another protocol version"))
            with pytest.raises(CheckpointInvariantError, match="another protocol version"):
                await ro.checkpoint()


async def test_a_retire_failing_on_one_instance_keeps_what_the_others_retired(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with gym_at(tmp_path, "gym-a") as inner:

        async def retire(instance: str, ids: Sequence[str], deadline: float) -> RetireReply:
            if instance == "gym-1":
                raise GymControlError(instance, "retire", "injected")
            return await inner.retire(instance, ids, deadline)

        gym = Wrapped(inner, retire=retire)
        async with open_rollouts(
            gym, tmp_path, rows=40, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            await trio.sleep(1)
            ledger = ro.ledger
            rows = {
                ledger.get(r).row
                for n in gym.instances  # type: ignore[union-attr]
                for r in ledger.held_by(n)
            }
            for row in sorted(rows)[:4]:
                await ledger.barrier.mutate(lambda row=row: ledger.drop_row(row))
            queued = ledger.retire_queue()
            assert set(queued) == {"gym-0", "gym-1"}
            outcome = await ro.checkpoint()
            assert not outcome.ok and outcome.reason == "gym_unavailable"
            assert ledger.retire_queue() == {"gym-1": queued["gym-1"]}


async def test_an_unanswered_topology_call_bounds_the_restore(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await one_snapshot(tmp_path)
    async with gym_at(tmp_path, "gym-b") as inner:

        async def topology() -> Any:
            await trio.sleep_forever()

        gym = Wrapped(inner, topology=topology)
        start = trio.current_time()
        with pytest.raises(TimeoutError, match="topology"):
            async with open_rollouts(gym, tmp_path, rows=40, group_size=2, config=CONFIG):
                pass
        assert trio.current_time() - start == pytest.approx(2.5)
        await nothing_installed(gym)


async def test_a_submission_refused_as_a_whole_costs_nothing_and_is_resent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A backend may refuse a whole ``run`` with ``GymAdmissionClosed`` instead of refusing row
    by row (S2): the rows keep their identity, spend nothing and go out again."""
    async with gym_at(tmp_path, "gym-a") as inner:
        refusals = [2]

        async def run(instance: str, rows: Sequence[RunRow]) -> ReplyStream:
            if refusals[0]:
                refusals[0] -= 1
                raise GymAdmissionClosed(rows[0].rollout_id, instance)
            return await inner.run(instance, rows)

        gym = Wrapped(inner, run=run)
        async with open_rollouts(
            gym, tmp_path, rows=12, group_size=2, config=CONFIG, max_rows_in_flight=6
        ) as ro:
            trained = await train_all(ro)
            stats = ro.ledger.statistics()
    assert sorted(trained) == list(range(12))
    assert stats.row_attempts_spent == 0 and stats.abandoned_total == 0
    assert ro.metrics.get(ADMISSION_CLOSED_ROWS) > 0
    assert ro.dispatcher.statistics().refused > 0


class FirstRowFails:
    """A reply stream that turns the first completion it carries into a data failure."""

    def __init__(self, inner: ReplyStream, failed: list[str]) -> None:
        self._inner, self._failed = inner, failed

    def __aiter__(self) -> FirstRowFails:
        return self

    async def __anext__(self) -> Sequence[RunReply]:
        batch = list(await self._inner.__anext__())
        if not self._failed and batch:
            self._failed.append(batch[0].rollout_id)
            batch[0] = Failed(batch[0].rollout_id, "data", "poisoned row")
        return batch

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_an_exhausted_budget_retires_what_gym_runs_and_re_raises(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Prompt-group recovery (S3): the run ends with ``BudgetExhausted``, and Gym is left
    running nothing for it."""
    config = RuntimeConfig(
        control_timeout_s=2.0,
        reply_grace_s=0.5,
        drain_timeout_s=30.0,
        lease_s=60.0,
        data_failure_budget=0,
    )
    async with gym_at(tmp_path, "gym-a") as inner:
        failed: list[str] = []

        async def run(instance: str, rows: Sequence[RunRow]) -> ReplyStream:
            return FirstRowFails(await inner.run(instance, rows), failed)

        gym = Wrapped(inner, run=run)
        with pytest.RaisesGroup(BudgetExhausted, flatten_subgroups=True, allow_unwrapped=True):
            async with open_rollouts(
                gym, tmp_path, rows=40, group_size=2, config=config, max_rows_in_flight=6
            ) as ro:
                await train_all(ro)
        assert failed
        for n in inner.instances:
            inv = await inner.inventory(n)
            assert inv.running == () and inv.unclaimed == (), inv
