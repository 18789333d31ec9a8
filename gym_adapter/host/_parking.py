"""Parking: how a Gym host holds every episode still at a step boundary for a checkpoint.

``prepare`` closes admission and raises the *prepared* flag; every moving episode parks at its
next step boundary (between two calls of the agent's ``step``), and ``wait_parked`` returns once
none moves. A parked episode is data, not a task: its task ends when it parks (a suspended
task is a dozen collector-tracked objects, and CPython puts every resumed coroutine back in the
youngest generation uncounted, so 200k tasks parking at once would make the next young
collection walk millions of objects inside the checkpoint). ``reopen`` (a resume, or the lease
running out) starts a task for each again, ``RESUME_CHUNK`` per scheduler batch, so restarting
200k never stalls the loop at once.

An *unaligned* prepare (``prepare(..., park=False)``) closes admission and raises the flag
without parking anything: episodes pass their boundaries on, an episode held by ``ctx.hold()``
is let go, a reopen's restart of the episodes an earlier checkpoint parked goes on, and
``wait_parked`` has nothing to wait for (the instance's cut is its commit).

An aligned prepare may give up waiting (the *alignment timeout*, Flink's aligned-checkpoint
timeout): ``alignment_timed_out`` then says, for the rest of the generation, that the episodes
still moving are the commit's to take as an unaligned cut does (they go on; one reaching its
boundary meanwhile parks there as usual).

Each prepare that raises the flag starts a new *generation*: a prepare waiting for its episodes
to park, and a lease timer, act only for their own generation, so a reopen followed by another
prepare never lets a stale one through. The lease: a prepared instance reopens by itself after
``lease_s`` without a resume (a trainer that died mid-checkpoint never holds Gym forever).

Boundary marks (``_cut``) are taken only once armed (``arm_marks``): from the start, or by the
first prepare that may end in a cut (``HostConfig.boundary_marks``).

``Parking`` is the only writer of admission, the prepared flag, the checkpoint ID, the
generation, whether its alignment timed out, the count of moving episodes, the parked list,
whether marks are armed, and the lease; the episodes it moves
between ``MOVING`` and ``BOUNDARY`` are the host's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, final

import anyio
import anyio.lowlevel
import attrs
import sniffio
import trio

from gymckpt.runtime.lowlevel import collector_paused, promote_survivors

from ._episode import EpisodeFenced
from ._episodes import BOUNDARY, MOVING, Episode

__all__ = ["RESUME_CHUNK", "Parking"]

RESUME_CHUNK: Final = 128
"""Parked episodes woken per scheduler batch on a resume."""


@final
@attrs.define(eq=False, slots=True, repr=False)
class Parking:
    """Admission, the step-boundary parking and the lease of one instance (module docstring).

    Invariants: ``moving`` counts the instance's episodes in ``MOVING`` (the host reports each
    start and each end through ``started`` and ``ended``); ``parked`` holds episodes in
    ``BOUNDARY`` whose task has ended; while ``prepared``, admission is closed.

    ``open`` gives it the instance's task spawner (for the lease timer and the restarts) and
    ``restart_episode`` (starts a task for a parked episode again); ``freeze_survivors`` as in
    ``HostConfig``."""

    lease_s: float
    freeze_survivors: bool
    admission_open: bool = attrs.field(default=True, init=False)
    prepared: bool = attrs.field(default=False, init=False)
    parks: bool = attrs.field(default=True, init=False)
    """Whether the prepared checkpoint parks episodes at their boundaries (aligned)."""
    alignment_timed_out: bool = attrs.field(default=False, init=False)
    """The prepared (aligned) checkpoint stopped waiting for episodes to park: its commit is a
    cut (module docstring). Reset by the next generation."""
    checkpoint_id: str | None = attrs.field(default=None, init=False)
    generation: int = attrs.field(default=0, init=False)
    moving: int = attrs.field(default=0, init=False)
    closing: bool = attrs.field(default=False, init=False)
    """Shutting down (or dead): nothing restarts, no lease is armed."""
    marks: bool = attrs.field(default=False, init=False)
    """Whether episodes take a boundary mark at each step boundary (``_cut``): armed by the
    first prepare that may end in a cut (``arm_marks``), never disarmed. Before that no
    boundary exports anything: a run that never cuts pays nothing for marks."""
    unmarked_turns: bool = attrs.field(default=False, init=False)
    """Marks were armed while episodes moved, and no cut has run since: an episode may be inside
    a turn that started before, with no mark to be taken at, so the next cut runs whole, in one
    step (``ControlPlane._commit_cut``), and clears this; every later cut runs in slices."""
    _parked: list[Episode] = attrs.field(factory=list, init=False)
    _prepared_evt: anyio.Event | None = attrs.field(default=None, init=False)
    """Set when a checkpoint is prepared (wakes episodes held by ``ctx.hold()``)."""
    _all_parked: anyio.Event | None = attrs.field(default=None, init=False)
    _lease: anyio.CancelScope | None = attrs.field(default=None, init=False)
    _start_soon: Callable[..., Any] | None = attrs.field(default=None, init=False)
    _restart_episode: Callable[[Episode], object] | None = attrs.field(default=None, init=False)
    _checkpoint: Callable[[], Any] = attrs.field(default=anyio.lowlevel.checkpoint, init=False)
    """The event loop's own checkpoint, taken at a step boundary: under trio, trio's (anyio's
    looks its backend up at each call, a third of the cost)."""
    _if_cancelled: Callable[[], Any] = attrs.field(
        default=anyio.lowlevel.checkpoint_if_cancelled, init=False
    )
    """The event loop's own ``checkpoint_if_cancelled``, at a boundary the task reached through
    the scheduler already."""

    def open(
        self, start_soon: Callable[..., Any], restart_episode: Callable[[Episode], object]
    ) -> None:
        """The instance starts serving."""
        self.closing = False
        self._start_soon, self._restart_episode = start_soon, restart_episode
        under_trio = sniffio.current_async_library() == "trio"
        self._checkpoint = trio.lowlevel.checkpoint if under_trio else anyio.lowlevel.checkpoint
        self._if_cancelled = (
            trio.lowlevel.checkpoint_if_cancelled
            if under_trio
            else anyio.lowlevel.checkpoint_if_cancelled
        )
        self._prepared_evt = anyio.Event()
        self._all_parked = anyio.Event()

    def close(self) -> None:
        """The instance shuts down: admission closes, the lease is cancelled, nothing restarts
        (the host ends every episode next, then calls ``release_all``)."""
        self.closing = True
        self.admission_open = False
        self._cancel_lease()

    def release_all(self) -> None:
        """After shutdown: the parked list is dropped (the host ended those episodes) and a
        prepare waiting for episodes to park is woken."""
        self._parked = []
        if self._all_parked is not None:
            self._all_parked.set()

    def __repr__(self) -> str:
        state = "closing" if self.closing else "prepared" if self.prepared else "open"
        return (
            f"<Parking {state} checkpoint={self.checkpoint_id} generation={self.generation} "
            f"moving={self.moving} parked={len(self._parked)} lease={self._lease is not None}>"
        )

    # -- episodes moving -----------------------------------------------------------------------

    def started(self) -> None:
        """A new episode started moving."""
        self.moving += 1

    def ended(self, was: str) -> None:
        """An episode that was in state ``was`` ended."""
        if was == MOVING:
            self.moving -= 1
            self._check_parked()

    def _check_parked(self) -> None:
        if self.prepared and self.moving == 0 and self._all_parked is not None:
            self._all_parked.set()

    # -- boundary marks ------------------------------------------------------------------------

    def arm_marks(self) -> None:
        """From now on every step boundary takes a mark (``marks``); armed while episodes move,
        the next cut runs whole (``unmarked_turns``)."""
        if not self.marks:
            self.unmarked_turns = self.moving > 0
        self.marks = True

    async def boundary(
        self, ep: Episode, fenced: Callable[[Episode], bool], scheduled: bool = False
    ) -> bool:
        """Pass step boundary ``ep.turn`` (True), or park there while a checkpoint is prepared
        (or, held, until one is): False, and the caller's task ends, leaving ``ep`` parked.
        ``EpisodeFenced`` if ``fenced(ep)``: a newer attempt owns its slot.

        A boundary is a scheduling point (other tasks run, a cancel arrives) unless the task
        went through the scheduler since its last one (``scheduled``: its task just started,
        or the turn before it waited): then it only raises a cancel that came meanwhile. So
        every turn passes the scheduler at least once, and once only: an episode of one turn
        that never waits costs one pass, not two."""
        if ep.state == BOUNDARY:  # restarted by a reopen
            if self.prepared and self.parks:  # prepared again before this task ran: it stays
                self._parked.append(ep)
                return False
            ep.state = MOVING
            self.moving += 1
            if fenced(ep):
                raise EpisodeFenced(ep.rollout_id)
            return True
        if fenced(ep):
            raise EpisodeFenced(ep.rollout_id)
        if scheduled:
            await self._if_cancelled()
        else:
            await self._checkpoint()
        if not ((self.prepared and self.parks) or ep.hold):
            return True
        ep.state = BOUNDARY
        self.moving -= 1
        self._check_parked()
        if ep.hold and not self.prepared:
            try:
                while ep.hold and not self.prepared:
                    assert self._prepared_evt is not None
                    await self._prepared_evt.wait()
            except BaseException:
                if ep.state == BOUNDARY:  # not ended meanwhile: count it moving again
                    ep.state = MOVING
                    self.moving += 1
                raise
        ep.hold = False
        if not self.parks and ep.state == BOUNDARY:  # unaligned: a held episode goes on
            ep.state = MOVING
            self.moving += 1
            return True
        self._parked.append(ep)
        return False

    # -- prepare / reopen ----------------------------------------------------------------------

    def prepare(self, checkpoint_id: str, *, park: bool = True) -> int:
        """Close admission and raise the prepared flag for ``checkpoint_id`` (a new generation
        unless already prepared); the lease is armed afresh. ``park``: episodes park at their
        next step boundary (aligned); a prepare never turns parking off for a generation that
        parks already. Returns the generation."""
        self.admission_open = False
        self.checkpoint_id = checkpoint_id
        if not self.prepared:
            assert self._prepared_evt is not None
            self.parks = park
            self.alignment_timed_out = False
            self.prepared = True
            self.generation += 1
            self._all_parked = anyio.Event()
            self._prepared_evt.set()
        assert self._all_parked is not None
        if self.moving and self._all_parked.is_set():
            self._all_parked = anyio.Event()
        return self.generation

    async def wait_parked(self, generation: int, deadline_ts: float) -> bool:
        """Wait until nothing moves, the instance reopens (or re-prepares: another generation)
        or shuts down; False if ``deadline_ts`` passed first."""
        with anyio.move_on_at(deadline_ts) as scope:
            while (
                self.parks
                and self.moving
                and self.prepared
                and self.generation == generation
                and not self.closing
            ):
                assert self._all_parked is not None
                await self._all_parked.wait()
        return not scope.cancelled_caught

    def time_out_alignment(self, generation: int) -> None:
        """The alignment timeout of ``generation`` ran out with episodes still moving: the
        commit takes those as a cut (no-op for another generation, or when nothing parks)."""
        if self.prepared and self.parks and self.generation == generation:
            self.alignment_timed_out = True

    def reopen(self) -> None:
        """Reopen admission and start every parked episode's task again (see ``restart``)."""
        assert self._all_parked is not None
        self._cancel_lease()
        self.prepared = False
        self.checkpoint_id = None
        self.admission_open = True
        self._prepared_evt = anyio.Event()
        self._unpark_all()
        self._all_parked.set()

    def _unpark_all(self) -> None:
        parked, self._parked = self._parked, []
        if parked and not self.closing and self._start_soon is not None:
            self._start_soon(self._restart, parked)

    async def _restart(self, parked: list[Episode]) -> None:
        """``RESUME_CHUNK`` per scheduler batch; prepared again meanwhile, the rest stay
        parked for the next reopen (an unaligned prepare parks nothing: the restart goes on)."""
        assert self._restart_episode is not None
        with collector_paused(self.freeze_survivors):
            for start in range(0, len(parked), RESUME_CHUNK):
                if self.closing:
                    return
                if self.prepared and self.parks:  # prepared again: the rest stay parked
                    self._parked.extend(ep for ep in parked[start:] if ep.state == BOUNDARY)
                    return
                for ep in parked[start : start + RESUME_CHUNK]:
                    if ep.state == BOUNDARY:
                        self._restart_episode(ep)
                await anyio.lowlevel.checkpoint()  # this chunk runs before the next starts
            if self.freeze_survivors:
                await anyio.lowlevel.checkpoint()  # the last chunk's first steps ran
                promote_survivors()

    # -- the lease -----------------------------------------------------------------------------

    def arm_lease(self, expired: Callable[[], object]) -> None:
        """(Re)start the lease of the current generation: after ``lease_s`` still prepared in
        it, ``expired()`` is called (the host counts it and reopens)."""
        self._cancel_lease()
        if self.closing or self._start_soon is None:  # the task group takes no new task
            return
        scope = self._lease = anyio.CancelScope()
        self._start_soon(self._lease_watch, scope, self.generation, expired)

    def _cancel_lease(self) -> None:
        if self._lease is not None:
            self._lease.cancel()
            self._lease = None

    async def _lease_watch(
        self, scope: anyio.CancelScope, generation: int, expired: Callable[[], object]
    ) -> None:
        with scope:
            await anyio.sleep(self.lease_s)
            if self.prepared and self.generation == generation and not self.closing:
                expired()
