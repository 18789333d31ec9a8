"""The chaos runs: the uninterrupted baseline, then one run per seed under its planned kills,
each on a fresh work directory, each restarted until it exits 0; their digests compared.

A run's digests are the ``NAME sha256: HEX`` lines its last (successful) start printed on
stdout, ``weights`` required. A run is *identical* when it printed every digest the baseline
printed, each equal to the baseline's. A start that exits non-zero without being killed (the
program failed, e.g. after a Gym server was killed under it) is restarted too, at most
``MAX_FAILED_STARTS`` times; a run that then still fails, or outlives its ``timeout_s``, is not
identical (its ``error`` says why).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .plan import ARMED_ANCHOR, Kill, plan_kills
from .points import ARMED, KILL_AT_ENV, MARK, MARKS_ENV, read_marks
from .process import Start

__all__ = [
    "MAX_FAILED_STARTS",
    "WEIGHTS",
    "WORKDIR",
    "BadBaseline",
    "Run",
    "read_digests",
    "run_baseline",
    "run_seed",
]

WORKDIR = "{workdir}"
"""What stands for a run's fresh work directory in the command."""
WEIGHTS = "weights"
"""The digest every program must print: ``weights sha256: HEX``, its final weights."""
MAX_FAILED_STARTS = 3
"""Starts of a run that may exit non-zero without a kill before the run is given up."""

_DIGEST = re.compile(r"^(?P<name>[A-Za-z][\w .-]*?) sha256: (?P<hex>[0-9a-f]{64})\s*$")
TAIL = 2000
"""Characters of a failed start's stderr a message shows."""


class BadBaseline(Exception):
    """The uninterrupted run failed or printed no ``weights sha256:`` line (exit 2)."""


def read_digests(stdout: str) -> dict[str, str]:
    """``NAME -> HEX`` of every ``NAME sha256: HEX`` line of ``stdout`` (the last one of a
    name wins)."""
    return {m["name"]: m["hex"] for m in map(_DIGEST.match, stdout.splitlines()) if m}


def _argv(command: Sequence[str], workdir: Path) -> list[str]:
    return [arg.replace(WORKDIR, str(workdir)) for arg in command]


def _tail(path: Path) -> str:
    return _read(path)[-TAIL:]


def _read(path: Path) -> str:
    """A start's output file as text ("" while it does not exist)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@attrs.define(slots=True)
class Run:
    """One run (the baseline: ``seed`` 0) and what happened in it."""

    seed: int
    workdir: Path
    kills_planned: list[Kill] = attrs.field(factory=list)
    kills: list[dict[str, Any]] = attrs.field(factory=list)
    """Each kill as it went: kind, where it was aimed, whether it landed, the victim."""
    starts: int = 0
    exit_codes: list[int] = attrs.field(factory=list)
    digests: dict[str, str] = attrs.field(factory=dict)
    wall_s: float = 0.0
    marks: list[tuple[str, int]] = attrs.field(factory=list)
    mark_times: dict[tuple[str, int], float] = attrs.field(factory=dict)
    """When each stage mark appeared, seconds after the start (the baseline's)."""
    armed_s: float | None = None
    """When the program armed its kill points (its runtime open), seconds after its start."""
    error: str | None = None

    @property
    def landed(self) -> int:
        return sum(1 for k in self.kills if k["landed"])

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    def matched(self, baseline: Run) -> dict[str, bool]:
        """Per digest name of the baseline: did this run print the same?"""
        return {name: self.digests.get(name) == hex for name, hex in baseline.digests.items()}

    def identical(self, baseline: Run) -> bool:
        return self.error is None and all(self.matched(baseline).values())


Progress = Callable[[str], None]


def run_baseline(
    command: Sequence[str], root: Path, env: Mapping[str, str], timeout_s: float
) -> Run:
    """The uninterrupted run; ``BadBaseline`` (saying which, with its stderr tail) if it
    fails, times out, or prints no ``weights sha256:`` line."""
    run = Run(0, root / "baseline" / "work")
    run.workdir.mkdir(parents=True)
    t0 = time.monotonic()
    logs = root / "baseline" / "start-1"
    with Start.spawn(_argv(command, run.workdir), logs, {**env, MARKS_ENV: "1"}) as start:
        run.armed_s = start.wait_for_line(logs / "stderr", ARMED, timeout_s)
        rc = _follow_marks(start, logs / "stderr", t0 + timeout_s, run.mark_times)
    run.starts, run.wall_s = 1, time.monotonic() - t0
    stderr = _tail(logs / "stderr")
    if rc is None:
        raise BadBaseline(f"the uninterrupted run did not end within --timeout {timeout_s:g}s")
    if rc != 0:
        raise BadBaseline(
            f"the uninterrupted run exited with code {rc}; its stderr ends:\n{stderr}"
        )
    run.exit_codes.append(rc)
    run.digests = read_digests((logs / "stdout").read_text(errors="replace"))
    if WEIGHTS not in run.digests:
        raise BadBaseline(
            "the uninterrupted run printed no 'weights sha256: HEX' line on stdout (the "
            "program must end with its final weights' digest); its stdout ends:\n"
            + _tail(logs / "stdout")
        )
    run.marks = read_marks((logs / "stderr").read_text(errors="replace"))
    return run


def run_seed(
    command: Sequence[str],
    root: Path,
    env: Mapping[str, str],
    seed: int,
    kills: int,
    baseline: Run,
    timeout_s: float,
    progress: Progress,
) -> Run:
    """Seed ``seed``'s run: start, kill as planned, restart on the same work directory until
    a start exits 0 (the kills spent), within ``timeout_s`` in all."""
    rng, plan = plan_kills(
        seed, kills, baseline.wall_s, baseline.marks, baseline.armed_s, baseline.mark_times
    )
    run = Run(seed, root / f"seed-{seed}" / "work", kills_planned=list(plan))
    run.workdir.mkdir(parents=True)
    argv = _argv(command, run.workdir)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    pending = list(plan)
    failed = 0
    while True:
        run.starts += 1
        logs = root / f"seed-{seed}" / f"start-{run.starts}"
        aimed = pending[0].stage if pending and pending[0].stage else None
        start_env = {**env, MARKS_ENV: "1", **({KILL_AT_ENV: aimed} if aimed else {})}
        with Start.spawn(argv, logs, start_env) as start:
            rc = _one_start(start, logs / "stderr", pending, run, rng, deadline)
        if rc is not None:
            run.exit_codes.append(rc)
        if rc == 0:
            break
        if rc is None:
            run.error = f"did not end within --timeout {timeout_s:g}s (start {run.starts})"
            break
        if rc != -signal.SIGKILL:
            failed += 1
            progress(f"gymckpt chaos: seed {seed}: start {run.starts} exited with code {rc}")
            if failed > MAX_FAILED_STARTS:
                run.error = (
                    f"start {run.starts} exited with code {rc} ({failed} failed starts); its "
                    f"stderr ends:\n{_tail(logs / 'stderr')}"
                )
                break
    run.wall_s = time.monotonic() - t0
    if run.error is None:
        run.digests = read_digests((logs / "stdout").read_text(errors="replace"))
    for k in pending:  # the run finished before these
        run.kills.append({"kind": k.kind, "aim": k.describe(), "landed": False})
    return run


def _follow_marks(
    start: Start, stderr: Path, deadline: float, times: dict[tuple[str, int], float]
) -> int | None:
    """Wait for ``start`` to end (None at ``deadline``), noting in ``times`` when each stage
    mark appeared on its ``stderr`` (seconds after the start, to the 50 ms the wait slices)."""
    while True:
        rc = start.wait(min(0.05, deadline - time.monotonic()))
        now = time.monotonic() - start.started
        for mark in read_marks(_read(stderr)):
            times.setdefault(mark, now)
        if rc is not None or time.monotonic() >= deadline:
            return rc


def _anchor_line(after: str) -> str:
    """The stderr line a kill anchored ``after`` (``ARMED_ANCHOR`` or ``STAGE@N``) waits for."""
    if after == ARMED_ANCHOR:
        return ARMED
    stage, _, n = after.partition("@")
    return f"{MARK} {stage} {n}"


def _one_start(
    start: Start, stderr: Path, pending: list[Kill], run: Run, rng: Any, deadline: float
) -> int | None:
    """Run one start, landing the pending timed kills in order (a kill of a descendant lets the
    program go on, and the next kill's delay counts from then, or from its anchor's mark); its
    exit code, or None at the deadline."""
    mark = start.started
    while pending and pending[0].delay_s is not None:
        kill = pending[0]
        if kill.after is not None:
            seen = start.wait_for_line(
                stderr, _anchor_line(kill.after), deadline - time.monotonic()
            )
            if seen is None:  # ended (or the deadline) before the anchor: the kill waits
                return start.wait(max(0.0, deadline - time.monotonic()))
            mark = time.monotonic()
        rc = start.wait(min(mark + kill.delay_s - time.monotonic(), deadline - time.monotonic()))
        if rc is not None:
            return rc  # ended first: the kill waits for the next start, if any
        if time.monotonic() >= deadline:
            return None
        pending.pop(0)
        victim = start.kill(rng)
        record = {"kind": kill.kind, "aim": kill.describe(), "landed": True, "victim": victim}
        run.kills.append({**record, "start": run.starts})
        if victim == "program":
            rc = start.wait(max(0.0, deadline - time.monotonic()))
            if rc == 0:  # it had just ended: the kill found nothing to kill
                run.kills[-1]["landed"] = False
            return rc
        mark = time.monotonic()
    rc = start.wait(deadline - time.monotonic())
    if pending and pending[0].stage is not None and rc is not None:
        kill = pending.pop(0)
        landed = rc == -signal.SIGKILL
        run.kills.append(
            {
                "kind": kill.kind,
                "aim": kill.describe(),
                "landed": landed,
                "victim": "program" if landed else None,
                "start": run.starts,
            }
        )
    return rc
