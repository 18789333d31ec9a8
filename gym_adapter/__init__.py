"""gymckpt Gym adapter: the Gym contract, the Gym host for environments (the calendar
workplace among them), the embedded deployment and the Ray deployment.

``GymControlError`` and ``GymInstanceDead`` live in ``gymckpt.runtime`` with the rest of the
``GymUnavailable`` family; they are re-exported here, where backends raise them.

``RayGym`` and ``local_cluster_options`` are exported lazily (and left out of ``__all__``): Ray
is an optional extra, so ``import gym_adapter`` does not import it; ``gym_adapter.RayGym`` (or
``from gym_adapter import RayGym``) does.
"""

from typing import TYPE_CHECKING, Any

from gymckpt.runtime import GymControlError, GymInstanceDead

from ._contract import (
    ADMISSION_CLOSED,
    AgentSession,
    CommitReply,
    Completed,
    ExportedEpisode,
    Failed,
    GymBackend,
    InstanceInventory,
    InstanceTopology,
    ParticipantInfo,
    PrepareReply,
    Refused,
    ReplaceableGym,
    ReplyStream,
    RestoreReply,
    RetireReply,
    RunReply,
    RunRow,
    Topology,
    can_replace,
)
from ._embedded import EmbeddedGym
from ._environment import DEFAULT_MAX_PAYLOAD_BYTES, Environment
from ._episode import (
    ROLES,
    AgentParticipant,
    Done,
    EnvironmentSpecError,
    EpisodeContext,
    EpisodeFenced,
    EpisodeInfo,
    Participant,
    PayloadTooLarge,
    StateParticipant,
    participant_kinds,
    register_participant_kind,
    to_plain,
)
from ._faults import FAULT_GRAMMAR, FAULT_KINDS, FAULT_OPS, FaultPlan, FaultSpec
from ._host import GymHost, HostConfig, HostStatistics, SessionView
from ._host_episodes import capture_key as host_capture_key
from ._host_journal import JOURNAL_FILE
from ._host_records import RECORDS_FILE
from ._host_views import RetainedSession
from ._load import EnvironmentRef, load_environment
from ._statistics import GymStatistics
from ._trio_guest import run_on_an_asyncio_loop
from .calendar_env import (
    CalendarEvent,
    CalendarSession,
    EpisodePlan,
    SimConfig,
    calendar_environment,
    calendar_host,
    calendar_state,
    plan_episode,
    sentinel,
)

if TYPE_CHECKING:
    from ._ray import RayGym as RayGym
    from ._ray import local_cluster_options as local_cluster_options

_LAZY = ("RayGym", "local_cluster_options")
"""Names from ``_ray``, imported (with Ray) on first use."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            from . import _ray
        except ModuleNotFoundError as exc:
            if exc.name != "ray" and not (exc.name or "").startswith("ray."):
                raise
            raise ModuleNotFoundError(
                f"gymckpt's {name} needs Ray, an optional extra: pip install 'gymckpt[ray]'",
                name=exc.name,
            ) from exc
        return getattr(_ray, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADMISSION_CLOSED",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "FAULT_GRAMMAR",
    "FAULT_KINDS",
    "FAULT_OPS",
    "JOURNAL_FILE",
    "RECORDS_FILE",
    "ROLES",
    "AgentParticipant",
    "AgentSession",
    "CalendarEvent",
    "CalendarSession",
    "CommitReply",
    "Completed",
    "Done",
    "EmbeddedGym",
    "Environment",
    "EnvironmentRef",
    "EnvironmentSpecError",
    "EpisodeContext",
    "EpisodeFenced",
    "EpisodeInfo",
    "EpisodePlan",
    "ExportedEpisode",
    "Failed",
    "FaultPlan",
    "FaultSpec",
    "GymBackend",
    "GymControlError",
    "GymHost",
    "GymInstanceDead",
    "GymStatistics",
    "HostConfig",
    "HostStatistics",
    "InstanceInventory",
    "InstanceTopology",
    "Participant",
    "ParticipantInfo",
    "PayloadTooLarge",
    "PrepareReply",
    "Refused",
    "ReplaceableGym",
    "ReplyStream",
    "RestoreReply",
    "RetainedSession",
    "RetireReply",
    "RunReply",
    "RunRow",
    "SessionView",
    "SimConfig",
    "StateParticipant",
    "Topology",
    "calendar_environment",
    "calendar_host",
    "calendar_state",
    "can_replace",
    "host_capture_key",
    "load_environment",
    "participant_kinds",
    "plan_episode",
    "register_participant_kind",
    "run_on_an_asyncio_loop",
    "sentinel",
    "to_plain",
]
