"""Preemption by SIGTERM/SIGINT, path by path, with real signals delivered to this process
(``signal.raise_signal``) under trio's virtual clock: a preempted run raises ``Preempted``
instead of ending as a finished one; a trainer waiting for groups is woken by the signal; the
final checkpoint is bounded by ``preempt_timeout_s`` and cut short by a second signal (also one
that arrives before it starts); a signal during the restore lets no step start."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gymckpt.gym_adapter import EmbeddedGym, GymBackend
from gymckpt.gym_adapter.environments.calendar import (
    CalendarConfig,
    calendar_environment,
)
from gymckpt.nurseries import Rollouts, open_rollouts
from gymckpt.runtime import Preempted, RuntimeConfig


# ``Preempted`` is raised in the body of the deployment's and open_rollouts' nurseries, so it
# reaches the caller inside their exception groups (``except* Preempted``)
def raises_preempted() -> pytest.RaisesGroup[Preempted]:
    return pytest.RaisesGroup(Preempted, flatten_subgroups=True)


def _leaf(info: Any) -> Preempted:
    exc = info.value
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, Preempted)
    return exc


QUICK = CalendarConfig(turns=(1, 2), turn_s=(0.5, 1.0), mutation_p=0.5, lease_s=300.0)
LONG = CalendarConfig(turns=(50, 50), turn_s=(1.0, 1.0), mutation_p=0.0, lease_s=300.0)
"""Episodes of 50 one-second turns: no group completes for 50 s, but every turn ends at a
step boundary within a second, so a checkpoint parks them quickly."""
SLOW_CALLS = RuntimeConfig(
    control_timeout_s=100.0,
    reply_grace_s=0.5,
    drain_timeout_s=100.0,
    lease_s=300.0,
    max_consecutive_failures=5,
)
"""A hanging control call gives up only after 100 s: the final checkpoint's own bound (or a
second signal) is what ends it sooner."""


@asynccontextmanager
async def running(
    workdir: Path,
    gym_dir: Path,
    sim: CalendarConfig = QUICK,
    faults: tuple[str, ...] = (),
    config: RuntimeConfig = SLOW_CALLS,
    wrap: Any = None,
    **kw: Any,
) -> AsyncIterator[Rollouts]:
    async with EmbeddedGym.host(
        calendar_environment(config=sim),
        instances=2,
        seed=5,
        work_dir=gym_dir,
        faults=faults,
        config=sim.host_config(),
    ) as gym:
        backend: GymBackend = gym if wrap is None else wrap(gym)
        async with open_rollouts(
            backend, workdir, rows=8, group_size=2, config=config, max_rows_in_flight=4, **kw
        ) as ro:
            yield ro


def _raise_soon(nursery: trio.Nursery, at_s: float, sig: signal.Signals = signal.SIGTERM) -> None:
    async def later() -> None:
        await trio.sleep(at_s)
        signal.raise_signal(sig)

    nursery.start_soon(later)


async def test_a_preempted_loop_raises_and_code_after_it_does_not_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    after_the_loop: list[str] = []
    steps = 0
    with raises_preempted() as preempted:
        async with running(tmp_path / "w", tmp_path / "gym") as ro:
            async for _batch in ro.batches(1, state=lambda: b'{"s": 1}'):
                steps += 1
                if steps == 1:
                    signal.raise_signal(signal.SIGTERM)  # during the first step
            after_the_loop.append("final evaluation, upload")
    assert after_the_loop == []
    err = _leaf(preempted)
    assert err.signal_name == "SIGTERM" and err.step == steps == 1  # the step finished
    assert ro.preempted_by == signal.SIGTERM
    assert ro.final_snapshot is not None and err.snapshot == str(ro.final_snapshot.path)
    assert str(err).startswith("gymckpt: SIGTERM: stopped after step 1; final snapshot ")


async def test_a_trainer_waiting_for_groups_is_woken_by_the_signal(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    t0 = trio.current_time()
    with raises_preempted() as preempted:
        async with (
            running(tmp_path / "w", tmp_path / "gym", sim=LONG) as ro,
            trio.open_nursery() as nursery,
        ):
            _raise_soon(nursery, 2.0)
            async for _batch in ro.batches(1):
                pytest.fail("no group can be complete before 50 s")
    waited = trio.current_time() - t0
    # woken at 2 s, parked at the next step boundary (1 s turns): long before any group ends
    assert waited < 10.0, waited
    assert _leaf(preempted).step == 0 and _leaf(preempted).snapshot is not None


async def test_the_final_checkpoint_is_bounded_by_preempt_timeout_s(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with raises_preempted() as preempted:
        async with (
            running(
                tmp_path / "w", tmp_path / "gym", faults=("prepare:hang",), preempt_timeout_s=20.0
            ) as ro,
            trio.open_nursery() as nursery,
        ):
            _raise_soon(nursery, 1.0)
            async for _batch in ro.batches(1):
                pass
    signalled_at = 1.0
    ended = trio.current_time()
    # the hanging prepare would take control_timeout_s (100 s) to give up
    assert 20.0 <= ended - signalled_at < 40.0, ended
    assert "timed out after preempt_timeout_s=20s" in str(_leaf(preempted))
    assert _leaf(preempted).snapshot is None  # there is none: it said so


async def test_a_second_signal_cuts_the_final_checkpoint_short(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gymckpt"), raises_preempted() as got:
        async with (
            running(
                tmp_path / "w", tmp_path / "gym", faults=("prepare:hang",), preempt_timeout_s=500.0
            ) as ro,
            trio.open_nursery() as nursery,
        ):
            _raise_soon(nursery, 1.0)
            _raise_soon(nursery, 3.0, signal.SIGINT)  # while the final checkpoint hangs
            async for _batch in ro.batches(1):
                pass
    assert trio.current_time() < 10.0  # not the 100 s of the hanging call, nor 500 s
    assert "the final checkpoint cut short" in str(_leaf(got))
    said = [r.getMessage() for r in caplog.records]
    assert any("SIGINT again: cutting the final checkpoint short" in m for m in said), said


async def test_a_second_signal_during_the_step_skips_the_final_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with raises_preempted() as got:
        async with running(tmp_path / "w", tmp_path / "gym") as ro:
            async for _batch in ro.batches(1):
                signal.raise_signal(signal.SIGTERM)
                await trio.sleep(0.1)
                signal.raise_signal(signal.SIGTERM)  # the operator insists, mid-step
                await trio.sleep(5.0)  # the step finishes
    assert "the final checkpoint cut short" in str(_leaf(got))
    assert ro.outcomes == []  # no checkpoint was even started


class _SignalDuringRestore:
    """The deployment, with SIGTERM delivered to the process while a restore runs."""

    def __init__(self, inner: EmbeddedGym) -> None:
        self._inner = inner
        self.restores = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def restore(self, *args: Any, **kw: Any) -> Any:
        self.restores += 1
        if self.restores == 1:  # one signal (a second one would cut the final checkpoint)
            signal.raise_signal(signal.SIGTERM)
        return await self._inner.restore(*args, **kw)


async def test_a_signal_during_the_restore_lets_no_step_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path / "w", tmp_path / "gym") as ro:
        await trio.sleep(30)  # every episode completed: the snapshot holds untrained groups
        outcome = await ro.checkpoint(b'{"step": 0}')
        assert outcome.ok and ro.ledger.ready_groups > 0
    wrapped: list[_SignalDuringRestore] = []

    def wrap(gym: EmbeddedGym) -> Any:
        wrapped.append(_SignalDuringRestore(gym))
        return wrapped[0]

    handed = 0
    with raises_preempted():
        async with running(tmp_path / "w", tmp_path / "gym2", wrap=wrap) as ro:
            assert ro.restored is not None and ro.ledger.ready_groups > 0
            async for _batch in ro.batches(1):
                handed += 1
    assert wrapped[0].restores > 0
    assert handed == 0 and ro.steps == 0 and ro.preempted_by == signal.SIGTERM


async def test_signal_handlers_are_put_back_when_the_block_ends(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    async with running(tmp_path / "w", tmp_path / "gym"):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before
