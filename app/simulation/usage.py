"""The real-usage dimension of the simulation: how people run RL, drawn by seed (``RealUsage``).

The other dimensions draw faults; this one draws the *workload* the way trainers and agents
really are, which no fault schedule covers:

* ``shuffle``: one to three epochs of the rows, each in a seeded shuffle
  (``open_rollouts(epochs=, shuffle_seed=)``), the way a ``DistributedSampler`` or
  ``datasets.shuffle(seed)`` hands them out (``RowOrder``);
* ``calls``: concurrent model calls inside one turn: the agent starts two or three
  ``ctx.model`` calls in one trio nursery (parallel tool calls), sometimes with identical
  requests (``ConcurrentCalls``);
* ``long-turns``: turns longer than every timeout (``control_timeout_s`` and the lease): a long
  generation, a test suite run (``LongTurn``);
* ``outages``: the model server down for a drawn window of virtual time, every call in it
  raising ``ModelUnavailable`` (the OpenAI client's infrastructure error; ``Outage``);
* ``live-restart``: the first life's trainer dies and its Gym is *not* torn down: the
  next life restores into the same live Gym, which still runs the dead trainer's
  episodes and maybe holds its checkpoint open;
* ``second-trainer``: a second trainer (another work directory) attaches to the Gym the first
  one drives, ``at_s`` virtual seconds into the first life (``SecondTrainer``): it must
  be refused, and the first run must not notice.

Each sub-dimension is drawn from a generator of its own (``random.Random("usage:NAME:SEED")``):
switching one on or off leaves every other draw of the seed as it was, and the scenario's
other dimensions never see these generators. ``draw_usage`` with no names draws nothing
(``RealUsage()``: the workload the simulation drew before this dimension existed).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any, Final

import attrs

from gymckpt.gym_adapter.environments.calendar import CalendarConfig, plan_episode
from gymckpt.runtime import RuntimeConfig

__all__ = [
    "USAGE_NAMES",
    "ConcurrentCalls",
    "LongTurn",
    "Outage",
    "RealUsage",
    "RowOrder",
    "SecondTrainer",
    "draw_usage",
    "parse_real_usage",
    "usage_flag",
]

OUTAGE_BUDGET_S: Final = RuntimeConfig().outage_budget_s
"""The default outage budget, which the simulation's runtime config keeps: every drawn outage
is shorter (waited out), but one over it (``Outage.over_budget``)."""
OUTAGE_LENGTHS_S: Final = (5.0, 15.0, 30.0, 60.0)
"""The lengths of the outages the run must wait out (a model server restarting)."""
OVER_BUDGET_S: Final = OUTAGE_BUDGET_S + 30.0
"""The length of an outage over the budget: the run stops with exit code 8 and one line."""

USAGE_NAMES: Final = ("shuffle", "calls", "long-turns", "outages", "live-restart", "second-trainer")
"""The sub-dimensions, each switchable on its own (``gymckpt simulate --real-usage``)."""


def parse_real_usage(text: str) -> frozenset[str]:
    """``--real-usage``'s value: ``all``, ``none`` or a comma-separated list of
    ``USAGE_NAMES``. ``ValueError`` names an unknown one."""
    text = text.strip()
    if text == "all":
        return frozenset(USAGE_NAMES)
    if text == "none":
        return frozenset()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in USAGE_NAMES]
    if unknown or not names:
        raise ValueError(
            f"--real-usage: unknown sub-dimension {', '.join(map(repr, unknown)) or repr(text)}; "
            f"expected all, none or a comma-separated list of {', '.join(USAGE_NAMES)}"
        )
    return frozenset(names)


def usage_flag(names: Iterable[str]) -> str:
    """The ``--real-usage`` value that selects ``names`` (``all``, ``none`` or a list in
    ``USAGE_NAMES`` order): ``parse_real_usage`` of it gives ``names`` back."""
    chosen = frozenset(names)
    if chosen == frozenset(USAGE_NAMES):
        return "all"
    return ",".join(n for n in USAGE_NAMES if n in chosen) or "none"


@attrs.frozen(kw_only=True)
class RowOrder:
    """The order the rows are trained in: ``epochs`` epochs, each a seeded shuffle
    (``shuffle_seed``) of rows ``0..rows-1``, as a ``DistributedSampler.set_epoch`` or
    ``datasets.shuffle(seed)`` gives it, through ``open_rollouts``' own ``epochs=`` and
    ``shuffle_seed=`` (``open_kwargs``). The run trains ``positions`` positions, each dataset
    row once per epoch; the verdict counts positions (``CompletedGroup.position``). Drawn, an
    epoch has the scenario's rows divided by the epochs (rounded up): rows ``0..rows-1`` of
    the workplace, about as many positions in all as a single epoch would have."""

    rows: int
    epochs: int
    shuffle_seed: int

    def open_kwargs(self) -> dict[str, Any]:
        """What ``open_rollouts`` gets for this order."""
        return {"rows": self.rows, "epochs": self.epochs, "shuffle_seed": self.shuffle_seed}

    @property
    def positions(self) -> int:
        """Positions the run trains: every row once per epoch."""
        return self.rows * self.epochs

    def __str__(self) -> str:
        return f"shuffled (seed {self.shuffle_seed}, {self.epochs} epoch(s))"


@attrs.frozen(kw_only=True)
class ConcurrentCalls:
    """Turns that make ``fanout`` concurrent model calls in one trio nursery before the turn's
    own call: each turn of each episode with chance ``p`` (a function of the seed, row, slot
    and turn: every attempt of a slot does the same). ``identical``: the concurrent requests
    are equal (interchangeable), else each is different (identity must not follow the order
    trio happens to start the tasks in)."""

    p: float
    fanout: int
    identical: bool

    def fans_out(self, seed: int, row: int, slot: int, turn: int) -> bool:
        return random.Random(f"usage:calls:{seed}:{row}:{slot}:{turn}").random() < self.p

    def __str__(self) -> str:
        same = "identical" if self.identical else "distinct"
        return f"{self.fanout} concurrent {same} calls in {self.p:.0%} of turns"


@attrs.frozen(kw_only=True)
class LongTurn:
    """Turn ``turn`` of slot (``row``, ``slot``) works ``seconds`` longer than planned, in
    every attempt (it is the workload, not a fault)."""

    row: int
    slot: int
    turn: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.row}-{self.slot}:t{self.turn} +{self.seconds:g}s"


@attrs.frozen(kw_only=True)
class Outage:
    """The model server is down from ``start_s`` for ``length_s`` virtual seconds after the
    scenario starts: every model call asked then raises ``ModelUnavailable``. Within the
    outage budget (``OUTAGE_BUDGET_S``) the run waits it out; over it (``over_budget``) an
    life may stop with ``InfraOutage`` (exit code 8) and one line, an expected end, and
    the next restores after it."""

    start_s: float
    length_s: float

    @property
    def over_budget(self) -> bool:
        return self.length_s > OUTAGE_BUDGET_S

    def __str__(self) -> str:
        return f"{self.length_s:g}s from {self.start_s:g}s"


@attrs.frozen(kw_only=True)
class SecondTrainer:
    """A second trainer (a work directory of its own) opens the Gym ``at_s`` virtual seconds
    into the first life and tries to train one step within ``window_s``."""

    at_s: float
    window_s: float = 30.0

    def __str__(self) -> str:
        return f"attaches at {self.at_s:g}s"


@attrs.frozen(kw_only=True)
class RealUsage:
    """What the real-usage dimension drew for one seed; every field empty: nothing drawn."""

    names: frozenset[str] = frozenset()
    """The sub-dimensions switched on (``USAGE_NAMES``), drawn or not."""
    order: RowOrder | None = None
    calls: ConcurrentCalls | None = None
    long_turns: tuple[LongTurn, ...] = ()
    outage: Outage | None = None
    live_restart: bool = False
    """The first life's crash leaves its Gym running; the second restores into it."""
    second_trainer: SecondTrainer | None = None

    @property
    def active(self) -> bool:
        return bool(
            self.order
            or self.calls
            or self.long_turns
            or self.outage
            or self.live_restart
            or self.second_trainer
        )

    @property
    def longest_wait_s(self) -> float:
        """The longest the workload may legitimately keep everything still: the longest long
        turn plus the outage (part of the liveness bound)."""
        longest = max((t.seconds for t in self.long_turns), default=0.0)
        return longest + (self.outage.length_s if self.outage is not None else 0.0)

    def describe(self) -> str:
        if not self.names:
            return "off"
        parts = [
            f"order {self.order}" if self.order else "",
            f"calls {self.calls}" if self.calls else "",
            "long turns " + ", ".join(map(str, self.long_turns)) if self.long_turns else "",
            f"model outage {self.outage}" if self.outage else "",
            "live restart (first crash keeps its Gym running)" if self.live_restart else "",
            f"second trainer {self.second_trainer}" if self.second_trainer else "",
        ]
        return "; ".join(p for p in parts if p) or "nothing drawn"


def draw_usage(
    seed: int,
    names: Iterable[str],
    *,
    rows: int,
    group_size: int,
    config: CalendarConfig,
    lease_s: float,
    first_crash: bool,
) -> RealUsage:
    """The real-usage draws of ``seed`` for the sub-dimensions ``names``: a pure function of
    its arguments, each sub-dimension from its own generator (module docstring). ``rows``,
    ``group_size`` and ``config`` are the scenario's workload; ``lease_s`` its lease (long turns
    outlast it); ``first_crash``: the scenario crashes its first life already (a live
    restart then keeps that crash's Gym; else it draws a crash of its own)."""
    chosen = frozenset(names)
    unknown = chosen - frozenset(USAGE_NAMES)
    if unknown:
        raise ValueError(f"unknown real-usage sub-dimensions {sorted(unknown)}")

    def rng(name: str) -> random.Random:
        return random.Random(f"usage:{name}:{seed}")

    out: dict[str, Any] = {"names": chosen}
    if "shuffle" in chosen:
        r = rng("shuffle")
        if r.random() < 0.8:
            epochs = r.choice((1, 2, 3))
            # the scenario's rows split over the epochs: about as many positions as rows, so a
            # multi-epoch seed costs what a single-epoch one does
            out["order"] = RowOrder(
                rows=-(-rows // epochs), epochs=epochs, shuffle_seed=r.getrandbits(32)
            )
    if "calls" in chosen:
        r = rng("calls")
        if r.random() < 0.6:
            out["calls"] = ConcurrentCalls(
                p=r.choice((0.2, 0.5, 1.0)), fanout=r.choice((2, 3)), identical=r.random() < 0.25
            )
    if "long-turns" in chosen:
        r = rng("long-turns")
        if r.random() < 0.4:
            turns: list[LongTurn] = []
            for _ in range(r.choice((1, 1, 2))):
                row, slot = r.randrange(rows), r.randrange(group_size)
                plan = plan_episode(seed, row, slot, config)
                seconds = round(lease_s * r.choice((1.2, 2.0, 4.0)), 3)
                turns.append(
                    LongTurn(row=row, slot=slot, turn=r.randrange(plan.turns), seconds=seconds)
                )
            out["long_turns"] = tuple(turns)
    if "outages" in chosen:
        r = rng("outages")
        if r.random() < 0.4:
            start, length = round(r.uniform(0.0, 20.0), 3), r.choice(OUTAGE_LENGTHS_S)
            if r.random() < 0.05:  # drawn after the rest: the other outages stay as they were
                length = OVER_BUDGET_S
            out["outage"] = Outage(start_s=start, length_s=length)
    if "live-restart" in chosen:
        r = rng("live-restart")
        # a crash of the first life keeps its Gym (drawn below when it has none)
        out["live_restart"] = r.random() < (0.6 if first_crash else 0.25)
    if "second-trainer" in chosen:
        r = rng("second-trainer")
        if r.random() < 0.2:
            out["second_trainer"] = SecondTrainer(at_s=round(r.uniform(0.0, 10.0), 3))
    return RealUsage(**out)


def live_restart_crash_at(seed: int) -> float:
    """Where a live restart's own crash strikes when the scenario drew none for its first
    life: ``at_s`` virtual seconds in (from the live-restart generator, after its
    draw in ``draw_usage``)."""
    r = random.Random(f"usage:live-restart:{seed}")
    r.random()  # draw_usage's
    return round(r.uniform(0.5, 20.0), 3)
