"""gymckpt's Gym side, in three rooms: the host (``host/``: one instance's state and its
episodes, and the episode API environments are written against), the transports
(``transports/``: embedded, Ray and HTTP, under the one contract in ``_contract``) and the
environments (``environments/``: calendar, Gymnasium, TextArena, OpenSpiel, the model client).
This module is the front door: the contract's records, the episode API and the three backends.

``GymControlError`` and ``GymInstanceDead`` live in ``gymckpt.runtime`` with the rest of the
``GymUnavailable`` family; they are re-exported here, where backends raise them.

The environments' names are their modules' (``gymckpt.gym_adapter.environments.calendar``,
``gymckpt.gym_adapter.environments.gymnasium`` ...). What a backend author needs beyond
these names (the remote transport's base class, ``RemoteGym``, and what it stands on; serving
an instance over HTTP) is in ``gymckpt.gym_adapter.lowlevel``.

``RayGym`` and ``local_cluster_options`` are exported lazily (and left out of ``__all__``): Ray
is an optional extra, so ``import gym_adapter`` does not import it; ``gym_adapter.RayGym`` (or
``from gym_adapter import RayGym``) does.
"""

from typing import TYPE_CHECKING, Any

from gymckpt.runtime import GymControlError, GymInstanceDead

from ._contract import (
    ADMISSION_CLOSED,
    AgentSession,
    AttachReply,
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
    TrainerAware,
    can_attach,
    can_replace,
)
from ._faults import FAULT_GRAMMAR, FAULT_KINDS, FAULT_OPS, FaultPlan, FaultSpec
from .host._captured import CapturedStepChanged, NotExactJSON
from .host._environment import DEFAULT_MAX_PAYLOAD_BYTES, Environment
from .host._episode import (
    ROLES,
    AgentParticipant,
    AgentWrapper,
    CallId,
    Done,
    EnvironmentSpecError,
    EpisodeConfigError,
    EpisodeContext,
    EpisodeFenced,
    EpisodeInfo,
    ModelCall,
    ModelUnavailable,
    Participant,
    PayloadTooLarge,
    StateParticipant,
    parse_call_id,
    participant_kinds,
    policy_version_in_force,
    register_participant_kind,
    split_capture_key,
    to_plain,
)
from .host._host import GymHost, HostConfig, HostStatistics, SessionView
from .host._load import EnvironmentRef, load_environment
from .host._views import RetainedSession
from .transports._deployment import Replacement
from .transports._embedded import EmbeddedGym
from .transports._statistics import GymStatistics
from .transports._trio_guest import run_on_an_asyncio_loop
from .transports.http._gym import HttpGym

if TYPE_CHECKING:
    from .transports.ray._gym import RayGym as RayGym
    from .transports.ray._gym import local_cluster_options as local_cluster_options

_LAZY = ("RayGym", "local_cluster_options")
"""Names from ``transports/ray/_gym``, imported (with Ray) on first use."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            from .transports.ray import _gym as _ray
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
    "ROLES",
    "AgentParticipant",
    "AgentSession",
    "AgentWrapper",
    "AttachReply",
    "CallId",
    "CapturedStepChanged",
    "CommitReply",
    "Completed",
    "Done",
    "EmbeddedGym",
    "Environment",
    "EnvironmentRef",
    "EnvironmentSpecError",
    "EpisodeConfigError",
    "EpisodeContext",
    "EpisodeFenced",
    "EpisodeInfo",
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
    "HttpGym",
    "InstanceInventory",
    "InstanceTopology",
    "ModelCall",
    "ModelUnavailable",
    "NotExactJSON",
    "Participant",
    "ParticipantInfo",
    "PayloadTooLarge",
    "PrepareReply",
    "Refused",
    "ReplaceableGym",
    "Replacement",
    "ReplyStream",
    "RestoreReply",
    "RetainedSession",
    "RetireReply",
    "RunReply",
    "RunRow",
    "SessionView",
    "StateParticipant",
    "Topology",
    "TrainerAware",
    "can_attach",
    "can_replace",
    "load_environment",
    "parse_call_id",
    "participant_kinds",
    "policy_version_in_force",
    "register_participant_kind",
    "run_on_an_asyncio_loop",
    "split_capture_key",
    "to_plain",
]
