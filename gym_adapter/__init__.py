"""gymckpt Gym adapter: the Gym contract, the embedded simulated Gym, and the Ray deployment.

``RayGym`` is exported lazily (and left out of ``__all__``): Ray is an optional extra, so
``import gym_adapter`` does not import it; ``gym_adapter.RayGym`` (or ``from gym_adapter import
RayGym``) does.
"""

from typing import TYPE_CHECKING, Any

from ._contract import (
    ADMISSION_CLOSED,
    AgentSession,
    CommitReply,
    Completed,
    ExportedEpisode,
    Failed,
    GymBackend,
    GymControlError,
    GymInstanceDead,
    InstanceInventory,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    Refused,
    ReplyStream,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
)
from ._embedded import EmbeddedGym, GymStatistics
from ._faults import FAULT_GRAMMAR, FaultPlan, FaultSpec
from ._sim import (
    CalendarEvent,
    CalendarSession,
    EpisodePlan,
    SimConfig,
    SimInstance,
    SimReplyStream,
    SimStatistics,
    plan_episode,
)

if TYPE_CHECKING:
    from ._ray import RayGym as RayGym


def __getattr__(name: str) -> Any:
    if name == "RayGym":
        from ._ray import RayGym

        return RayGym
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADMISSION_CLOSED",
    "FAULT_GRAMMAR",
    "AgentSession",
    "CalendarEvent",
    "CalendarSession",
    "CommitReply",
    "Completed",
    "EmbeddedGym",
    "EpisodePlan",
    "ExportedEpisode",
    "Failed",
    "FaultPlan",
    "FaultSpec",
    "GymBackend",
    "GymControlError",
    "GymInstanceDead",
    "GymStatistics",
    "InstanceInventory",
    "InstanceTopology",
    "ParticipantInfo",
    "PrepareReply",
    "Refused",
    "ReplyStream",
    "RestoreReply",
    "RetireReply",
    "RunReply",
    "RunRow",
    "SimConfig",
    "SimInstance",
    "SimReplyStream",
    "SimStatistics",
    "Topology",
    "plan_episode",
]
