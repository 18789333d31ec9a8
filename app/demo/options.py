"""The demo's options (``DemoOptions``): its flags, checked on construction, and the settings
they make (the simulated Gym's, the runtime's). A phase process gets them as JSON
(``to_json`` / ``from_json``) on its command line."""

from __future__ import annotations

import json
from typing import Any

import attrs

from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.nurseries import HOOK_POINTS
from gymckpt.runtime import CheckpointMode, ManifestError, RuntimeConfig
from gymckpt.runtime._shared import structure_table

from .envs import EnvChoice, env_choice

__all__ = ["BACKENDS", "CHECKPOINT_MODES", "CRASH_STAGES", "MID_PUBLISH", "TURN_S", "DemoOptions"]

BACKENDS = ("embedded", "ray", "http")
"""``--backend``'s values: in-process, a Ray actor per instance, a spawned ``gymckpt serve``
process per instance."""
CHECKPOINT_MODES = tuple(m.value for m in CheckpointMode)
"""``--checkpoint-mode``'s values: ``RuntimeConfig.checkpoint_mode``'s names."""

TURN_S = {"aligned": (0.005, 0.02), "unaligned": (0.05, 0.2)}
"""The calendar's turn times (s) per checkpoint mode. Aligned, every checkpoint waits for the
slowest turn in flight, so the demo keeps them short. Unaligned, no checkpoint waits for one,
and a turn must outlast the way from a row's dispatch to the cut (on Ray: the actor call, the
reply stream, the trainer's batching), or every episode in Gym has ended by the time a
checkpoint comes and none is ever taken mid-turn."""

MID_PUBLISH = "mid_publish"
CRASH_STAGES = (*HOOK_POINTS, MID_PUBLISH)
"""Where ``crash_stage`` may SIGKILL phase 1: the coordinator's hook points, and
``mid_publish`` (after the snapshot's files and manifest are written, before its commit marker).
"""


@attrs.frozen(kw_only=True)
class DemoOptions:
    """The demo's flags (C2). ``crash_after_checkpoint`` 0 means no crash."""

    backend: str = "embedded"
    rows: int = 64
    group_size: int = 4
    instances: int = 2
    seed: int = 0
    checkpoint_every: int = 2
    crash_after_checkpoint: int = 1
    faults: tuple[str, ...] = ()
    workdir: str | None = None
    groups_per_step: int = 4
    max_rows_in_flight: int = 16
    ray_address: str | None = None
    agent_kind: str = "simple_agent"
    hold_first_mutation: bool = False
    """Test agent (S12): the episode making an instance's first calendar mutation holds at its
    next step boundary until a checkpoint parks it."""
    env: str = "calendar"
    """The environment: the calendar workplace, or ``PREFIX:ID`` of a family in
    ``demo_envs.FAMILIES`` (``gymnasium:ID``, ``textarena:ID``); only a family with ``http``
    (``sandbox:ID``) runs on ``--backend http``, none on ray."""
    crash_stage: str | None = None
    """Fault matrix: phase 1 SIGKILLs itself at this point (one of ``CRASH_STAGES``) of its
    checkpoint number ``crash_after_checkpoint`` (counting attempts, 1-based), instead of the
    parent killing it after that checkpoint is published."""
    runtime: tuple[tuple[str, Any], ...] = ()
    """``RuntimeConfig`` settings over the demo's own (table ``[runtime]`` of ``--config``), as
    ``(field, value)`` pairs; checked strictly by ``runtime_config``."""
    checkpoint_mode: str = CheckpointMode.ALIGNED.value
    """``RuntimeConfig.checkpoint_mode`` of the trainer (one of ``CHECKPOINT_MODES``): the
    demo's own option, so ``[runtime]`` may not set it too (one place says which mode runs)."""
    keep: bool = False
    """Keep the temporary work directory of a run that finished exactly once (without
    ``workdir`` it is removed then; a run that did not is always kept, to be looked at)."""

    def __attrs_post_init__(self) -> None:
        for name in (
            "rows",
            "group_size",
            "instances",
            "checkpoint_every",
            "groups_per_step",
            "max_rows_in_flight",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.crash_after_checkpoint < 0:
            raise ValueError("--crash-after-checkpoint must be >= 0")
        if self.crash_stage is not None:
            if self.crash_stage not in CRASH_STAGES:
                raise ValueError(
                    f"--crash-at-stage must be one of {', '.join(CRASH_STAGES)}, "
                    f"got {self.crash_stage!r}"
                )
            if self.crash_after_checkpoint < 1:
                raise ValueError("--crash-at-stage needs --crash-after-checkpoint >= 1")
        if self.checkpoint_mode not in CHECKPOINT_MODES:
            raise ValueError(
                f"--checkpoint-mode must be {' or '.join(CHECKPOINT_MODES)}, "
                f"got {self.checkpoint_mode!r}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(
                f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        choice = env_choice(self.env)
        if choice is not None and self.backend != "embedded":
            if not choice.family.http:
                raise ValueError(f"--env {choice.family.prefix}ID runs on --backend embedded")
            if self.backend != "http":
                raise ValueError(
                    f"--env {choice.family.prefix}ID runs on --backend embedded or http"
                )

    @property
    def env_choice(self) -> EnvChoice | None:
        """The family and id of ``env``; None for the calendar."""
        return env_choice(self.env)

    def sim_config(self) -> CalendarConfig:
        return CalendarConfig(
            turns=(2, 4),
            turn_s=TURN_S[self.checkpoint_mode],
            mutation_p=0.5,
            lease_s=30.0,
            hold_after_first_mutation=self.hold_first_mutation,
        )

    def runtime_config(self, where: str = "demo [runtime]") -> RuntimeConfig:
        """The demo's runtime settings with ``runtime`` over them; an unknown or ill-typed
        field, or settings that do not fit together, is a ``ManifestError`` naming ``where``."""
        base = RuntimeConfig(
            control_timeout_s=5.0,
            reply_grace_s=0.5,
            drain_timeout_s=5.0,
            lease_s=30.0,
            max_consecutive_failures=3,
            checkpoint_mode=self.checkpoint_mode,
        )
        if not self.runtime:
            return base
        if any(k == "checkpoint_mode" for k, _ in self.runtime):
            raise ManifestError(
                f"{where}: checkpoint_mode is the demo's option: set it as checkpoint_mode in "
                "[demo] or with --checkpoint-mode, not in [runtime]"
            )
        return structure_table(attrs.asdict(base) | dict(self.runtime), RuntimeConfig, where)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DemoOptions:
        raw = json.loads(text)
        raw["faults"] = tuple(raw["faults"])
        raw["runtime"] = tuple((k, v) for k, v in raw.get("runtime", ()))
        return cls(**raw)
