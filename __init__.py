"""gymckpt: consistent checkpoints of RL rollouts while they run in a Gym service, restored
exactly once after a crash.

What a trainer needs is importable from here::

    import gymckpt
    from gymckpt.gym_adapter.environments.calendar import calendar_environment

    async with gymckpt.EmbeddedGym.host(
        calendar_environment(), instances=2, work_dir="gym-live"
    ) as gym:
        async with gymckpt.open_rollouts(gym, "work", rows=32, group_size=4) as rollouts:
            ...

The packages behind it are ``gymckpt.runtime`` (state and synchronisation, no Gym I/O),
``gymckpt.gym_adapter`` (the Gym contract, the embedded, Ray and HTTP deployments) and
``gymckpt.nurseries`` (dispatch, checkpoint, restore, the trainer facade); dependencies point
one way, in that order. ``RayGym`` is imported lazily: Ray is an optional extra
(``pip install 'gymckpt[ray]'``).
"""

from typing import TYPE_CHECKING, Any

# Absolute imports: pytest imports this file as a plain module named ``__init__`` when the
# checkout's directory is not a valid package name (``wt-1``); relative imports fail there.
from gymckpt._version import __version__
from gymckpt.gym_adapter import EmbeddedGym, FaultSpec, HttpGym
from gymckpt.nurseries import CheckpointOutcome, Rollouts, open_rollouts, run
from gymckpt.runtime import (
    BadInput,
    BudgetExhausted,
    CheckpointInvariantError,
    CheckpointsFailed,
    DatasetError,
    DatasetMismatch,
    DrainTimeout,
    GymAdmissionClosed,
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymControlError,
    GymInstanceDead,
    GymInUse,
    GymUnavailable,
    ManifestError,
    Preempted,
    RuntimeConfig,
    StrandedSessionError,
    TopologyMismatch,
    WorkDirLocked,
    runtime_config_from_toml,
)

if TYPE_CHECKING:
    from gymckpt.gym_adapter import RayGym as RayGym


def __getattr__(name: str) -> Any:
    if name == "RayGym":
        from gymckpt.gym_adapter import RayGym

        return RayGym
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BadInput",
    "BudgetExhausted",
    "CheckpointInvariantError",
    "CheckpointOutcome",
    "CheckpointsFailed",
    "DatasetError",
    "DatasetMismatch",
    "DrainTimeout",
    "EmbeddedGym",
    "FaultSpec",
    "GymAdmissionClosed",
    "GymCallTimeout",
    "GymCheckpointUnavailable",
    "GymControlError",
    "GymInUse",
    "GymInstanceDead",
    "GymUnavailable",
    "HttpGym",
    "ManifestError",
    "Preempted",
    "Rollouts",
    "RuntimeConfig",
    "StrandedSessionError",
    "TopologyMismatch",
    "WorkDirLocked",
    "__version__",
    "open_rollouts",
    "run",
    "runtime_config_from_toml",
]
