"""The Gym contract: what the runtime may ask of a Gym deployment, typed with attrs.

The runtime depends on ``GymBackend`` only, never on a backend. A backend is a deployment of
instances (replicas); every call names its instance.

Data plane
----------
``await run(instance, rows)`` submits rows and returns a ``ReplyStream`` at once; the stream
yields *batches* of replies, one reply per row: ``Completed``, ``Failed`` (classed infra or data)
or ``Refused`` (``admission_closed`` — a sidecar row that names its row and does not end the
stream). A stream may end early, missing rows. Asking a stream for its next batch acknowledges
the previous one: until then Gym lists those replies as *on the wire* in its commit reply.

Control plane
-------------
Every control call carries an absolute ``deadline_ts`` on the caller's clock
(``trio.current_time()``; a remote backend converts it to the remaining time and re-anchors it
on its own clock). Gym enforces it only once it runs the call, so the caller bounds each call as
well (S5). Calls: ``prepare`` (close admission; in the ``ALIGNED`` mode park every episode at
its next step boundary, in the ``UNALIGNED`` mode park none; aligned with an
``alignment_timeout_s``, the episodes of an environment that takes unaligned cuts that have not
parked by then are left running, and the commit takes them as an unaligned one does), ``commit``
(write each participant's records under ``state_root`` and report them, the exported episodes
with their owner and ``capture_keys``, the replies on the wire, and the agent sessions;
unaligned, the commit is the instance's cut: each episode as it was at its last step boundary
with the model calls completed up to the cut, and every reply produced after it held back until
``resume``), ``resume``, ``retire`` (refused while a checkpoint is open), ``restore`` (verify,
then install committed state), ``retire_restored``; ``topology`` and ``inventory`` serve checks.

Replacing a dead instance
-------------------------
An instance may die (its actor or node is gone; the ``dead`` fault): every later call to it
raises ``GymInstanceDead``, and so does iterating one of its open reply streams. A backend that
can bring it back implements ``ReplaceableGym.replace(instance, deadline_ts)``. Postcondition:
``instance`` names a fresh live instance under the same name and topology, with admission open,
holding no episodes, streams, unclaimed restored episodes or retire work; its *environment
state* (what participants keep outside episodes, e.g. the calendar's sessions and events)
continues the dead one's where the backend can keep it (the simulated calendar replays a
durable log under ``work_dir/<instance>/``; a user's participants start empty unless their
state lives outside the instance). It raises a ``GymUnavailable`` when it cannot (the runtime
retries within its replacement budget). Replacing a live instance kills it first. A backend
without ``replace`` keeps a dead instance dead: checkpoints then fail until the run stops.

Trainer terms
-------------
A Gym deployment may outlive the trainer that drives it (servers someone else runs). A backend
whose instances do implements ``TrainerAware.attach(instance, trainer, deadline_ts)``: the
trainer's term (``runtime.TrainerTerm``) takes the instance over, fencing what an older term
of its lineage left there (``AttachReply``), and from then on the backend sends that term with
every call to every instance, so an instance refuses the calls of a fenced term and of another
lineage (``GymInUse``, exit code 2) before they act; ``release`` lets another run attach once
the trainer's run is done. See ``host/_tenancy.py``.

Paths: a commit reply's ``ParticipantInfo.state_dir`` is relative to that commit's
``state_root``; ``restore`` resolves each ``ParticipantRecord.state_dir`` of the manifest against
its own ``state_root`` (the snapshot directory, since the manifest's paths are relative to it).

Errors a backend raises belong to ``runtime.GymUnavailable`` (retryable): ``GymControlError``
(Gym's control plane refused or failed), ``GymInstanceDead``, ``GymCallTimeout`` (no reply in
time, or the deadline passed before the call ran); a backend passes every other error through
``runtime.crossable_error``, which replaces one that cannot be pickled with
``GymCheckpointUnavailable``. ``restore`` raises ``runtime.TopologyMismatch`` on any
difference and then has changed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

# re-exported: the contract names the errors a backend raises; they live with the rest of the
# ``GymUnavailable`` family in the runtime
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    GymControlError,
    GymInstanceDead,
    InstanceRecord,
    TrainerTerm,
)

__all__ = [
    "ADMISSION_CLOSED",
    "AgentSession",
    "AttachReply",
    "CommitReply",
    "Completed",
    "ExportedEpisode",
    "Failed",
    "GymBackend",
    "GymControlError",
    "GymInstanceDead",
    "InstanceInventory",
    "InstanceTopology",
    "ParticipantInfo",
    "PrepareReply",
    "Refused",
    "ReplaceableGym",
    "ReplyStream",
    "RestoreReply",
    "RetireReply",
    "RunReply",
    "RunRow",
    "Topology",
    "TrainerAware",
    "can_attach",
    "can_replace",
]

ADMISSION_CLOSED = "admission_closed"


# -- data plane --------------------------------------------------------------------------------


@attrs.frozen
class RunRow:
    """One attempt sent to ``/run``. ``restored_from`` names the exported attempt a restored
    replacement claims (attempt + 1 on the same instance, S11). ``task`` is the row's task from
    the trainer's dataset (a JSON value; None when the environment owns its data and reads
    ``row``); ``policy_version`` is the trainer's policy version when the row was dispatched."""

    rollout_id: str
    row: int
    slot: int
    attempt: int
    restored_from: str | None = None
    task: Any = None
    policy_version: int = 0


@attrs.frozen
class Completed:
    """A finished episode: its reward, its turns, and its trajectory payload (a JSON value, or
    None) for the trainer."""

    rollout_id: str
    reward: float
    turns: int
    payload: Any = None


@attrs.frozen
class Failed:
    """A failed episode. ``failure_class``: ``"data"`` (the episode's own problem: the
    attempt is spent), ``"infra"`` (a model server or the instance was down: the row is
    retried at no cost) or ``"config"`` (an ``EpisodeConfigError``: the configuration is
    wrong for every row, and the trainer stops the run without failing the row)."""

    rollout_id: str
    failure_class: Literal["infra", "data", "config"]
    message: str


@attrs.frozen
class Refused:
    """A sidecar row: Gym refused this row (``admission_closed``); the stream goes on."""

    rollout_id: str
    code: str = ADMISSION_CLOSED


RunReply = Completed | Failed | Refused


@runtime_checkable
class ReplyStream(Protocol):
    """Batches of replies. ``__anext__`` acknowledges the previous batch; ``aclose`` is
    idempotent and abandons the rest of the stream (its rows keep running in Gym)."""

    def __aiter__(self) -> ReplyStream: ...

    async def __anext__(self) -> Sequence[RunReply]: ...

    async def aclose(self) -> None: ...


# -- control plane -------------------------------------------------------------------------------


@attrs.frozen
class ParticipantInfo:
    """A participant as committed; ``state_dir`` is relative to the commit's ``state_root``."""

    server_name: str
    kind: str
    state_dir: str
    records_digest: str


@attrs.frozen
class ExportedEpisode:
    """An episode parked at a step boundary and exported by ``owner``."""

    rollout_id: str
    owner: str
    capture_keys: tuple[str, ...] = ()


@attrs.frozen
class AgentSession:
    """An agent session record. A legacy agent session with a ``step_boundary`` owns its episode
    when no environment participant exported it (S10); a parked one without a boundary is
    stranded. ``capture_keys`` are the model calls staged for its episode."""

    rollout_id: str
    participant: str
    kind: str
    step_boundary: int | None
    capture_keys: tuple[str, ...] = ()


@attrs.frozen
class PrepareReply:
    """``parked``: the episodes held at a step boundary (none in an unaligned prepare; in an
    aligned one whose alignment timeout ran out, fewer than the instance runs: the commit takes
    the others at their last step boundary)."""

    instance: str
    checkpoint_id: str
    parked: int
    on_wire: int


@attrs.frozen
class CommitReply:
    """``mid_turn``: the exported episodes that were inside a turn at the cut (taken at their
    last step boundary with the model calls they had completed): in an unaligned commit, or in
    an aligned one whose alignment timeout ran out before they parked; 0 for an aligned commit
    that found every episode parked."""

    instance: str
    checkpoint_id: str
    participants: tuple[ParticipantInfo, ...]
    exported: tuple[ExportedEpisode, ...]
    on_wire: tuple[str, ...]
    sessions: tuple[AgentSession, ...] = ()
    mid_turn: int = 0


@attrs.frozen
class RetireReply:
    instance: str
    retired: tuple[str, ...]
    unknown: tuple[str, ...] = ()


@attrs.frozen
class AttachReply:
    """A trainer attached to an instance (``GymHost.attach``). ``took_over``: it fenced what
    was there (every attach but the holder's own); then ``previous`` is the term it fenced
    (None for a fresh instance), ``episodes`` the episodes it ended or dropped (running,
    parked and unclaimed), ``sessions`` the slots whose sessions it freed, and ``aborted``
    the checkpoint it aborted (None if none was open)."""

    instance: str
    took_over: bool
    previous: TrainerTerm | None = None
    episodes: int = 0
    sessions: int = 0
    aborted: str | None = None


@attrs.frozen
class RestoreReply:
    instance: str
    restored: tuple[str, ...]


@attrs.frozen
class InstanceTopology:
    """An instance's participants as ``(server_name, kind)`` pairs, in order."""

    name: str
    participants: tuple[tuple[str, str], ...]


@attrs.frozen
class Topology:
    instances: tuple[InstanceTopology, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.instances)


@attrs.frozen
class InstanceInventory:
    """What an instance holds right now (for checks and tests)."""

    instance: str
    admission_open: bool
    prepared: bool
    running: tuple[str, ...]
    parked: tuple[str, ...]
    unclaimed: tuple[str, ...]
    on_wire: tuple[str, ...]
    lease_reopened: int


class GymBackend(Protocol):
    """A Gym deployment. Implemented by the three backends: the embedded deployment
    (``EmbeddedGym``, in the trainer's process), the Ray deployment (``RayGym``) and the HTTP
    deployment (``HttpGym``); the two remote ones write these verbs once, in ``RemoteGym``.
    Each also has what every deployment of ours has beside the verbs (``faults``,
    ``replacements``, ``statistics``, ``retained_sessions``: ``transports/_deployment.py``)."""

    @property
    def instances(self) -> tuple[str, ...]:
        """Instance names, in topology order."""
        ...

    async def topology(self) -> Topology: ...

    async def run(self, instance: str, rows: Sequence[RunRow]) -> ReplyStream: ...

    async def prepare(
        self,
        instance: str,
        checkpoint_id: str,
        deadline_ts: float,
        mode: CheckpointMode = CheckpointMode.ALIGNED,
        alignment_timeout_s: float | None = None,
    ) -> PrepareReply:
        """``alignment_timeout_s`` (aligned only; None: wait until ``deadline_ts``): seconds
        to wait for the episodes to park before the rest are left to the commit's cut
        (module docstring)."""
        ...

    async def commit(
        self, instance: str, checkpoint_id: str, state_root: str, deadline_ts: float
    ) -> CommitReply: ...

    async def resume(self, instance: str, checkpoint_id: str, deadline_ts: float) -> None: ...

    async def retire(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply: ...

    async def restore(
        self,
        instance: str,
        state_root: str,
        record: InstanceRecord,
        episodes: Sequence[EpisodeRecord],
        deadline_ts: float,
    ) -> RestoreReply: ...

    async def retire_restored(
        self, instance: str, rollout_ids: Sequence[str], deadline_ts: float
    ) -> RetireReply: ...

    async def inventory(self, instance: str) -> InstanceInventory: ...


@runtime_checkable
class ReplaceableGym(GymBackend, Protocol):
    """A Gym deployment that can replace a dead instance (see the module docstring)."""

    async def replace(self, instance: str, deadline_ts: float) -> None:
        """Bring up a fresh instance under ``instance``'s name, by ``deadline_ts`` (caller's
        clock). Raises a ``GymUnavailable`` if it cannot; the runtime retries."""
        ...


@runtime_checkable
class TrainerAware(GymBackend, Protocol):
    """A Gym deployment whose instances know which trainer term they serve (see the module
    docstring)."""

    async def attach(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> AttachReply:
        """``trainer`` takes ``instance`` over (fencing an older term of its lineage), and the
        backend sends it with every later call. ``GymInUse`` if the instance serves another
        lineage or a newer term."""
        ...

    async def release(self, instance: str, trainer: TrainerTerm, deadline_ts: float) -> None:
        """``trainer``'s run is done with ``instance``: another run may attach to it now."""
        ...


def can_attach(gym: object) -> bool:
    """Whether ``gym`` implements ``TrainerAware.attach``."""
    return callable(getattr(gym, "attach", None))


def can_replace(gym: object) -> bool:
    """Whether ``gym`` implements ``ReplaceableGym.replace``."""
    return callable(getattr(gym, "replace", None))
