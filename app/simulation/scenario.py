"""What a seed draws: the workload, its faults, crashes and races (``Scenario``).

A scenario is a pure function of its seed (``draw_scenario``): the workload (rows, group size,
instances, agent kinds, turn durations, batching), a fault schedule in the C3 grammar, crash
points, sometimes a rollback to an older snapshot. Races (stream drops and instance deaths
between checkpoint stages, late stream ends, a restore retried into the same Gym) and the
environment's hostile acts are drawn from generators of their own, so adding a dimension leaves
the draws of the others as they were: a seed's replay command keeps reproducing the same run.
So is the real-usage dimension (``usage``: shuffled row orders, concurrent model calls, long
turns, model-server outages, a restart into a live Gym, a second trainer), each of its
sub-dimensions from a generator of its own; a live restart that finds no crash of the first
life adds one (the only draw of another dimension it touches).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs

from gymckpt.gym_adapter import FAULT_KINDS
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.nurseries import HOOK_POINTS
from gymckpt.runtime import CheckpointMode, RuntimeConfig
from gymckpt.testing.hostile import HostileAct, acts_summary, draw_hostile

from .usage import USAGE_NAMES, RealUsage, draw_usage, live_restart_crash_at, usage_flag

__all__ = ["MAX_LIVES", "Crash", "Scenario", "draw_scenario", "replay_command"]

MAX_LIVES = 4
"""Lives per scenario; the last one runs without faults or crashes."""

# (op, kind) pairs a fault schedule may use every call (no @N) without stalling the run for
# good: the rest would refuse or fail every submission forever, which no runtime can finish.
_EVERY_CALL_OK = frozenset(
    {
        (op, k)
        for op in ("prepare", "commit", "resume", "retire", "restore")
        for k in ("hang", "delay", "error", "unpicklable", "dead")
    }
    | {("run", "drop"), ("run", "delay"), ("run", "hang"), ("run", "dead")}
)


def replay_command(seed: int, hostile: bool = False, usage: frozenset[str] | None = None) -> str:
    """The command that replays ``seed`` exactly (in its own process, ``PYTHONHASHSEED=0``);
    ``usage``: the real-usage sub-dimensions it ran with (None: the command's default, all)."""
    flags = " --hostile" if hostile else ""
    if usage is not None and usage != frozenset(USAGE_NAMES):
        flags += f" --real-usage {usage_flag(usage)}"
    return f"gymckpt simulate --seeds 1 --start {seed}" + flags


@attrs.frozen(kw_only=True)
class Crash:
    """Abandon a life ``at_s`` virtual seconds after it starts, or at hook ``point`` of
    its checkpoint number ``checkpoint`` (1-based, counting attempts)."""

    at_s: float | None = None
    checkpoint: int | None = None
    point: str | None = None

    def __str__(self) -> str:
        if self.at_s is not None:
            return f"crash at {self.at_s:g}s"
        return f"crash at {self.point} of checkpoint {self.checkpoint}"


@attrs.frozen(kw_only=True)
class Scenario:
    """One simulated run. Defaults are a small healthy run; tests override what they need."""

    seed: int = 0
    rows: int = 12
    group_size: int = 2
    instances: int = 2
    agent_kinds: tuple[str, ...] = ()
    """One per instance; empty means ``simple_agent`` everywhere."""
    turns: tuple[int, int] = (2, 4)
    turn_s: tuple[float, float] = (0.5, 2.0)
    mutation_p: float = 0.5
    flush_interval_s: float = 0.005
    max_batch: int = 64
    max_rows_in_flight: int = 6
    batch_size: int = 64
    groups_per_step: int = 2
    checkpoint_every: int = 1
    keep_snapshots: int = 3
    max_consecutive_failures: int = 2
    lease_s: float = 30.0
    faults: tuple[str, ...] = ()
    """C3 specs of the first life's Gym."""
    restore_faults: tuple[str, ...] = ()
    """C3 specs of the second life's Gym (the one restored into after a crash)."""
    crashes: tuple[Crash | None, ...] = ()
    """Per life (index), where it is abandoned; None or absent: no crash."""
    rollback: bool = False
    """After the first crash or abort, restore an older snapshot than the latest, if any."""
    stage_drops: tuple[tuple[int, str], ...] = ()
    """(checkpoint number within a life, hook point): Gym ends one open reply stream
    there (its rows run on), between two checkpoint stages. Every life but the last."""
    stage_deaths: tuple[tuple[int, str], ...] = ()
    """(checkpoint number within a life, hook point): one live Gym instance dies there
    (and is replaced). Every life but the last."""
    late_end_s: float = 0.0
    """Every stream's end reaches the consumer this many seconds after Gym ended it."""
    restore_retry: bool = False
    """A restore Gym could not serve is retried once, into the same Gym (all-or-nothing)."""
    max_lives: int = MAX_LIVES
    checkpoint_mode: CheckpointMode = CheckpointMode.ALIGNED
    """How every life's checkpoints take episodes in the middle of a turn."""
    hostile: tuple[HostileAct, ...] = ()
    """What the environment does wrong (``gymckpt.testing.hostile``): episodes that raise
    after a mutation, end with non-finite or non-JSON values, hang; exports that return such
    values or raise; journal writes that are short, torn or hit a full disk. Every life
    but the last."""
    usage: RealUsage = attrs.field(factory=RealUsage)
    """The real-usage dimension's draws (``usage``; in every life: it is the
    workload, not a fault)."""

    @property
    def positions(self) -> int:
        """Positions of the run's row order: ``rows`` once per epoch drawn (``RowOrder``)."""
        return self.usage.order.positions if self.usage.order is not None else self.rows

    def sim_config(self) -> CalendarConfig:
        return CalendarConfig(
            turns=self.turns,
            turn_s=self.turn_s,
            mutation_p=self.mutation_p,
            lease_s=self.lease_s,
            flush_interval_s=self.flush_interval_s,
            max_batch=self.max_batch,
        )

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            control_timeout_s=2.0,
            reply_grace_s=0.5,
            drain_timeout_s=5.0,
            lease_s=self.lease_s,
            max_consecutive_failures=self.max_consecutive_failures,
            checkpoint_mode=self.checkpoint_mode,
        )

    def kinds(self) -> tuple[str, ...]:
        return self.agent_kinds or ("simple_agent",) * self.instances

    def describe(self) -> str:
        kinds = ",".join(k.replace("_agent", "") for k in self.kinds())
        crashes = "; ".join(f"#{i}: {c}" for i, c in enumerate(self.crashes) if c) or "none"
        return (
            f"rows {self.rows} x group {self.group_size} on {self.instances} instance(s) "
            f"[{kinds}], turns {self.turns} of {self.turn_s}s, in flight "
            f"{self.max_rows_in_flight}, batch {self.batch_size}, {self.groups_per_step} "
            f"groups/step, checkpoint every {self.checkpoint_every}, max failures "
            f"{self.max_consecutive_failures}; faults {list(self.faults)}, restore faults "
            f"{list(self.restore_faults)}; crashes {crashes}; rollback {self.rollback}; "
            f"stream drops at {list(self.stage_drops)}; instance deaths at "
            f"{list(self.stage_deaths)}; late stream ends {self.late_end_s:g}s; "
            f"restore retried into the same Gym {self.restore_retry}; checkpoints "
            f"{self.checkpoint_mode.value}; hostile {acts_summary(self.hostile)}; real usage "
            f"{self.usage.describe()}"
        )


def _draw_faults(rng: random.Random, n: int, ops: Sequence[str]) -> tuple[str, ...]:
    specs: list[str] = []
    for _ in range(n):
        op = rng.choice(ops)
        kinds = [k for k in FAULT_KINDS if op == "run" or k not in ("refuse", "drop")]
        kind = rng.choice(kinds)
        every = (op, kind) in _EVERY_CALL_OK and rng.random() < 0.2
        at = "" if every else f"@{rng.randint(1, 6)}"
        arg = f":{rng.choice((0.05, 0.5, 3.0)):g}" if kind == "delay" else ""
        specs.append(f"{op}:{kind}{at}{arg}")
    return tuple(specs)


def draw_scenario(
    seed: int, hostile: bool = False, usage: frozenset[str] = frozenset()
) -> Scenario:
    """The scenario of ``seed``: a pure function of the seed (and ``hostile``: draw what the
    environment does wrong too; ``usage``: the real-usage sub-dimensions to draw, of
    ``USAGE_NAMES``; each from its own generator, so the other draws stay as they were)."""
    sc = _draw_scenario(seed)
    if hostile:
        sc = attrs.evolve(sc, hostile=draw_hostile(seed, sc.rows, sc.group_size, sc.sim_config()))
    if not usage:
        return sc
    first_crash = bool(sc.crashes) and sc.crashes[0] is not None
    drawn = draw_usage(
        seed,
        usage,
        rows=sc.rows,
        group_size=sc.group_size,
        config=sc.sim_config(),
        lease_s=sc.lease_s,
        first_crash=first_crash,
    )
    sc = attrs.evolve(sc, usage=drawn)
    if drawn.live_restart and not first_crash:
        crash = Crash(at_s=live_restart_crash_at(seed))
        sc = attrs.evolve(sc, crashes=(crash, *sc.crashes[1:]))
    return sc


def _draw_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    instances = rng.randint(1, 3)
    groups_per_step = rng.randint(1, 4)
    low = rng.randint(1, 3)
    turn_low = rng.choice((0.01, 0.1, 0.3))
    crashes: list[Crash | None] = []
    for p in (0.5, 0.25):
        if rng.random() >= p:
            crashes.append(None)
        elif rng.random() < 0.5:
            crashes.append(Crash(at_s=round(rng.uniform(0.0, 30.0), 3)))
        else:
            crashes.append(Crash(checkpoint=rng.randint(1, 4), point=rng.choice(HOOK_POINTS)))
    races = _draw_races(seed, instances)
    races.update(_draw_deaths(seed))
    races.update(_draw_mode(seed))
    after = races.pop("crash_after_drop", None)
    if after is not None:  # the drop's checkpoint publishes, then the trainer dies
        crashes[:1] = [Crash(checkpoint=after, point="after_publish")]
    return Scenario(
        seed=seed,
        rows=rng.randint(2, 32),
        group_size=rng.randint(1, 4),
        instances=instances,
        agent_kinds=tuple(rng.choice(("simple_agent", "legacy_agent")) for _ in range(instances)),
        turns=(low, low + rng.randint(0, 3)),
        turn_s=(turn_low, round(turn_low * rng.choice((1, 2, 5)), 6)),
        mutation_p=rng.choice((0.0, 0.3, 0.5, 1.0)),
        flush_interval_s=rng.choice((0.005, 0.05, 0.5)),
        max_batch=rng.choice((1, 4, 64)),
        # fewer rows in flight than groups per step can never fill a step: trained groups are
        # the only ones that leave the ledger (a facade trap, reported, not simulated)
        max_rows_in_flight=rng.randint(groups_per_step, 12),
        batch_size=rng.choice((1, 3, 64)),
        groups_per_step=groups_per_step,
        checkpoint_every=rng.randint(1, 3),
        keep_snapshots=rng.randint(1, 3),
        max_consecutive_failures=rng.randint(1, 3),
        faults=_draw_faults(
            rng, rng.choice((0, 1, 1, 2, 3)), ("prepare", "commit", "resume", "retire", "run")
        ),
        restore_faults=_draw_faults(
            rng,
            rng.choice((0, 0, 1, 2)),
            ("restore", "restore", "prepare", "commit", "retire", "run"),
        )
        + races.pop("restore_faults", ()),
        crashes=tuple(crashes),
        rollback=rng.random() < 0.2,
        **races,
    )


def _draw_races(seed: int, instances: int) -> dict[str, Any]:
    """Race-prone additions, from their own generator so the draws above stay as they were:
    stream drops between checkpoint stages, late stream ends, and a restore that fails on one
    instance of several and is retried into the same Gym."""
    rng = random.Random(f"races:{seed}")
    drops = tuple(
        (rng.randint(1, 3), rng.choice(HOOK_POINTS)) for _ in range(rng.choice((0, 0, 1, 2)))
    )
    late = rng.choice((0.0, 0.0, 0.2, 1.0, 3.0))
    extra: dict[str, Any] = {"stage_drops": drops, "late_end_s": late}
    if drops and rng.random() < 0.5:
        extra["crash_after_drop"] = drops[0][0]
    if instances > 1 and rng.random() < 0.3:
        extra["restore_retry"] = True
        kind = rng.choice(("error", "unpicklable", "hang"))
        extra["restore_faults"] = (f"restore:{kind}@2",)
    return extra


def _draw_mode(seed: int) -> dict[str, Any]:
    """The checkpoint mode, from its own generator (the draws above stay as they were): half
    the seeds checkpoint unaligned."""
    rng = random.Random(f"mode:{seed}")
    return {"checkpoint_mode": rng.choice((CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED))}


def _draw_deaths(seed: int) -> dict[str, Any]:
    """Instance deaths between checkpoint stages, from their own generator (the draws above
    stay as they were): about a third of the seeds lose one or two instances."""
    rng = random.Random(f"deaths:{seed}")
    if rng.random() >= 0.35:
        return {}
    deaths = tuple(
        (rng.randint(1, 3), rng.choice(HOOK_POINTS)) for _ in range(rng.choice((1, 1, 2)))
    )
    return {"stage_deaths": deaths}
