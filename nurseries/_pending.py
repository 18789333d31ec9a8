"""PendingCheckpoint: one checkpoint in flight, and everything it must give back.

A checkpoint takes four things from the running system, one after another: a staging snapshot
directory (``SnapshotStore.begin``), admission (``DispatchGate.close``), the request deadlines
(a pause under the holder ``"gym-checkpoint"``), and Gym itself (parked from the first
``prepare`` call on). Each is recorded here the moment it is taken, and given back by
``release`` — whatever happened, in one shielded block, in this order:

1. Gym, if it may still be parked: resumed, best effort (a resume that fails is reported, and
   Gym's lease reopens it if the resume is lost too);
2. the staging directory, unless it was published: removed;
3. the deadline pause: released (never another holder's pause, S7);
4. admission, if this checkpoint closed it: reopened (a new gate ID).

A failure before admission closed (the trainer's files, the close itself) gives back only the
staging directory; a published snapshot is not the pending checkpoint's any more. A resume
cut short by cancellation leaves Gym recorded as parked, so ``release`` resumes it at once
instead of leaving it parked until its lease runs out.

The pending checkpoint also times its stages (``stage``; failed stages are timed too) and
calls the coordinator's test hook at each point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import attrs
import trio

from gymckpt.gym_adapter import CommitReply, GymBackend
from gymckpt.runtime import (
    CheckpointMode,
    DeadlineRegistry,
    DispatchGate,
    FailureKind,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    failure_kind,
)
from gymckpt.runtime._shared import GYM_STATE_DIR, TRAINER_FILES_DIR, GymManifest

from ._calls import fan_out
from ._offload import offload

__all__ = ["PAUSE_HOLDER", "PendingCheckpoint", "TrainerFilesFailed"]

PAUSE_HOLDER = "gym-checkpoint"


class TrainerFilesFailed(Exception):
    """Carries an error the trainer's ``trainer_files`` callback raised (not a storage error):
    the trainer's own code failed, and its error propagates unchanged."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _write_trainer_files(write: Callable[[Path], None], target: Path) -> None:
    """Run the trainer's writer into a fresh ``target``; its own errors are carried out as is,
    a full disk or I/O error stays an ``OSError`` (a retryable checkpoint failure)."""
    target.mkdir()
    try:
        write(target)
    except OSError as exc:
        if failure_kind(exc) is FailureKind.SNAPSHOT_IO:
            raise
        raise TrainerFilesFailed(exc) from exc
    except Exception as exc:
        raise TrainerFilesFailed(exc) from exc


async def _prepare_in(
    gym: GymBackend,
    instance: str,
    checkpoint_id: str,
    deadline_ts: float,
    *,
    mode: CheckpointMode,
    alignment_timeout_s: float,
) -> object:
    return await gym.prepare(
        instance, checkpoint_id, deadline_ts, mode, alignment_timeout_s=alignment_timeout_s
    )


@attrs.define(eq=False, slots=True, repr=False)
class PendingCheckpoint:
    """One checkpoint in flight: its ID, its stage timings, and what it took (see the module).

    Use as ``async with``: leaving the block calls ``release``. Invariant: after ``release``
    Gym was asked to resume if it may have been parked, no staging directory of this
    checkpoint is left, the pause is released and admission is open again — exactly what this
    checkpoint took, nothing else.
    """

    checkpoint_id: str
    gym: GymBackend
    store: SnapshotStore
    gate: DispatchGate
    deadlines: DeadlineRegistry
    config: RuntimeConfig
    on_point: Callable[[str, str], None]
    """Called as ``on_point(checkpoint_id, point)`` at each hook point."""
    on_resume_failed: Callable[[Exception], None]
    """Told about a resume that failed (the snapshot stands; Gym's lease reopens Gym)."""
    stage_s: dict[str, float] = attrs.field(factory=dict, init=False)
    """Seconds per stage, failed stages included."""
    _staging: Path | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _paused: bool = attrs.field(default=False, init=False)
    _parked: tuple[str, ...] = attrs.field(default=(), init=False)
    """Instances Gym may be parked on: from the first prepare call to a resume that returned."""

    def __repr__(self) -> str:  # what it holds, never its collaborators
        held = [
            name
            for name, taken in (
                ("staging", self._staging is not None),
                ("admission", self._closed),
                ("pause", self._paused),
            )
            if taken
        ]
        return (
            f"<PendingCheckpoint {self.checkpoint_id} holds={','.join(held) or '-'} "
            f"parked={len(self._parked)} stages={len(self.stage_s)}>"
        )

    async def __aenter__(self) -> PendingCheckpoint:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (a failed stage is timed too)."""
        t = trio.current_time()
        try:
            yield
        finally:
            self.stage_s[name] = trio.current_time() - t

    def hook(self, point: str) -> None:
        self.on_point(self.checkpoint_id, point)

    async def write_trainer_files(self, write: Callable[[Path], None]) -> None:
        """Stage the snapshot and run the trainer's writer into its ``trainer/`` directory,
        then seal it (a link to a directory or to nothing, or a special file, is refused)."""
        staged = await self._begin()
        target = staged / TRAINER_FILES_DIR
        await offload(lambda: _write_trainer_files(write, target))
        await offload(lambda: self.store.seal_trainer_files(staged))

    async def close_admission(self) -> None:
        """Close admission (S1); returns once no admission is in progress."""
        await self.gate.close(by=self.checkpoint_id)
        self._closed = True

    async def pause_deadlines(self) -> None:
        """Stop request deadlines while Gym is parked (S7), under this checkpoint's holder
        (their cancel scopes retargeted in slices: ``DeadlineRegistry.pause_in_slices``)."""
        await self.deadlines.pause_in_slices(PAUSE_HOLDER)  # not cancellable: no window
        self._paused = True

    async def prepare(self, names: Sequence[str]) -> None:
        """Ask every instance to prepare in the configured mode (aligned: park, and leave the
        episodes not parked within the alignment timeout to the commit's cut); from the first
        call on, Gym may be parked (or holding replies after its cut)."""
        self._parked = tuple(names)
        gym, checkpoint_id, config = self.gym, self.checkpoint_id, self.config
        calls = {
            n: functools.partial(
                _prepare_in,
                gym,
                n,
                checkpoint_id,
                mode=config.checkpoint_mode,
                alignment_timeout_s=config.alignment_timeout_s,
            )
            for n in names
        }
        await fan_out("prepare", calls, self.config)

    async def commit(self, names: Sequence[str]) -> dict[str, CommitReply]:
        """Every instance commits its participants into the staging snapshot."""
        staging = self._staging if self._staging is not None else await self._begin()
        # absolute: Gym's working directory may differ from ours
        state_root = str(await offload((staging / GYM_STATE_DIR).resolve))
        gym, checkpoint_id = self.gym, self.checkpoint_id
        return await fan_out(
            "commit",
            {n: functools.partial(gym.commit, n, checkpoint_id, state_root) for n in names},
            self.config,
        )

    async def publish(self, manifest: GymManifest, files: Mapping[str, bytes]) -> SnapshotInfo:
        """Publish the staging snapshot (one rename, with its commit marker); from then on it is
        the store's, not this checkpoint's to remove."""
        ready = self._staging
        assert ready is not None, "publish before commit"
        info = await offload(functools.partial(self.store.publish, ready, manifest, files))
        self._staging = None
        return info

    async def resume(self) -> None:
        """Resume Gym everywhere; a failure is reported, not raised (the snapshot stands).
        Only a resume that returned clears ``parked``: one cut short by cancellation is
        retried by ``release``."""
        await self._resume()
        self._parked = ()

    async def release(self) -> None:
        """Give back what this checkpoint took, shielded (see the module for the order)."""
        with trio.CancelScope(shield=True):
            if self._parked:
                await self._resume()
            if self._staging is not None:
                staging, self._staging = self._staging, None
                await offload(lambda: self.store.abort(staging))
            if self._paused:
                await self.deadlines.release_in_slices(PAUSE_HOLDER)
            if self._closed:
                await self.gate.reopen()

    async def _begin(self) -> Path:
        self._staging = await offload(lambda: self.store.begin(self.checkpoint_id))
        return self._staging

    async def _resume(self) -> None:
        gym, checkpoint_id = self.gym, self.checkpoint_id
        try:
            await fan_out(
                "resume",
                {n: functools.partial(gym.resume, n, checkpoint_id) for n in self._parked},
                self.config,
            )
        except Exception as exc:
            self.on_resume_failed(exc)
