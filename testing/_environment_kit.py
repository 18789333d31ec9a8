"""Conformance of a user's ``Environment``: does it survive a checkpoint the way gymckpt needs?

The kit hosts the environment on an in-process ``GymHost`` and checks, with real files:

1. ``spec``: the environment can be hosted (kinds registered, methods present, names unique).
2. ``completes``: every episode of ``rows`` completes uninterrupted, with a plain-data payload.
3. ``restore_equivalence[k]``: park every episode after about ``k`` turns, commit (export every
   session to plain data, on disk), tear the host down, restore the commit into a fresh host and
   let attempt + 1 claim each parked episode: every payload and reward equals the uninterrupted
   run's. This needs an environment that is deterministic given (seed, row, slot) — as
   reproducible training needs anyway.
4. ``model_calls_once[k]``: no model call is repeated across the park and restore (the calls of
   both hosts add up to the uninterrupted run's).
3'. ``restore_equivalence[k,unaligned]`` and ``model_calls_once[k,unaligned]``: the same with an
   unaligned checkpoint, taken the moment about ``k`` turns were played, most episodes inside a
   turn: each restored turn replays from its step boundary, its completed model calls answered
   from the capture — concurrent ones too, in whatever order the turn starts them — so no call
   the snapshot captured is asked again (a call in flight at the cut is asked, once).
4'. ``captured_steps_once[k]`` and ``captured_steps_once[k,unaligned]`` (only for an agent
   that runs captured steps, ``ctx.captured_step``): the same for the steps' functions. Parked,
   the functions run across both hosts as often as in the uninterrupted run; cut, no step the
   snapshot captured runs again after the restore (one in flight at the cut runs, once), and
   none runs twice.
4''. ``export_round_trip[k]``: at each aligned park, every live session of every participant
   (the agent's too) exported, serialised as a commit does, restored and exported again gives
   the same data: a state that keeps files in a tree (a sandbox) must restore the whole tree —
   modes, links, contents — not only what the payload shows.
4'''. ``restore_refuses_bad_data[k]``: at each aligned park with episodes, the fresh host is
   first asked to restore while the environment's first participant refuses the first session
   state it is given (as its ``restore`` must refuse data it cannot take: a tree whose link
   leaves it, a file over its limit). The host raises ``TopologyMismatch`` naming it and holds
   nothing after (no session, no unclaimed episode); the restore that follows, in the same
   host, is the one ``restore_equivalence[k]`` judges.
5. ``fencing``: a fresh attempt of a slot silences the older one (no reply from it) and
   completes.
6. ``retained_journal`` (only with ``retained`` participants): the sessions that outlive their
   episodes are journaled; a host opened on the same ``work_dir`` with ``recover=True`` (what
   replaces a dead instance) holds the same sessions, exported to the same plain data.

Every check runs twice, under each event loop a deployment runs the host on: in the caller's
trio run (as embedded), and as ``<check>@asyncio`` with the host in a trio run hosted on an
asyncio loop (as in a Ray actor). Environment code may call trio, anyio or asyncio, and must
pass both.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs
import orjson

from gymckpt.gym_adapter import (
    CommitReply,
    Completed,
    Environment,
    EnvironmentSpecError,
    EpisodeInfo,
    GymHost,
    ReplyStream,
    RunReply,
    RunRow,
    load_environment,
    parse_call_id,
    run_on_an_asyncio_loop,
    split_capture_key,
    to_plain,
)
from gymckpt.gym_adapter._shared import step_identity
from gymckpt.runtime import (
    CheckpointMode,
    EpisodeRecord,
    InstanceRecord,
    ParticipantRecord,
    TopologyMismatch,
    rollout_id_for,
)

from ._report import Checks, ConformanceReport

__all__ = ["check_environment"]

_INSTANCE = "conformance-0"


@attrs.define
class _CountingModel:
    """The environment's model, counting its calls and recording each by (slot, call id)."""

    inner: Callable[[str, Any, EpisodeInfo], Any]
    calls: int = 0
    asked: list[tuple[str, str]] = attrs.field(factory=list)

    async def __call__(self, key: str, request: Any, info: EpisodeInfo) -> Any:
        self.calls += 1
        self.asked.append((info.session_key, split_capture_key(key)[1]))
        out = self.inner(key, request, info)
        return await out if inspect.isawaitable(out) else out


StepRun = tuple[str, int, str, int]
"""A captured step whose function ran: (slot, turn, its name's identity digest, occurrence)."""


@attrs.define(eq=False)
class _CountingContext:
    """The episode context the agent under test gets: the host's own, except that every
    captured step whose function runs is recorded in ``ran`` (occurrences counted per name,
    as the host counts them within a turn)."""

    inner: Any
    ran: list[StepRun]
    seen: dict[str, int] = attrs.field(factory=dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def captured_step(self, name: str, args: Any, fn: Callable[[Any], Any]) -> Any:
        occurrence = self.seen.get(name, 0)
        self.seen[name] = occurrence + 1
        slot, turn = self.inner.info.session_key, self.inner.turn

        def counted(a: Any) -> Any:
            self.ran.append((slot, turn, step_identity(name), occurrence))
            return fn(a)

        return await self.inner.captured_step(name, args, counted)


@attrs.define(eq=False)
class _TurnWatch:
    """The agent of the environment under test, which sets ``reached`` once ``target`` turns
    have been played (an event to wait on, rather than a poll that a virtual clock never
    advances past), and records the captured steps whose functions ran (``steps``)."""

    inner: Any
    target: float
    reached: anyio.Event = attrs.field(factory=anyio.Event)
    turns: int = 0
    steps: list[StepRun] = attrs.field(factory=list)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def kind(self) -> str:
        return str(self.inner.kind)

    def open(self, info: EpisodeInfo) -> Any:
        return self.inner.open(info)

    def export(self, state: Any) -> Any:
        return self.inner.export(state)

    def restore(self, data: Any) -> Any:
        return self.inner.restore(data)

    async def step(self, ctx: Any, state: Any) -> Any:
        try:
            return await self.inner.step(_CountingContext(ctx, self.steps), state)
        finally:
            self.turns += 1
            if self.turns >= self.target:
                self.reached.set()


class KitRefusal(ValueError):
    """What the kit's refusing participant raises for the session state it refuses."""


@attrs.define(eq=False)
class _RefuseOnce:
    """A participant as it is, except that while ``armed`` its ``restore`` refuses the first
    state it is given (``KitRefusal``) and disarms. Every other attribute is the participant's
    own (hooks a host may look for included)."""

    inner: Any
    armed: bool = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def restore(self, data: Any) -> Any:
        if self.armed:
            self.armed = False
            raise KitRefusal(f"the kit's {self.inner.name} refuses this state")
        return self.inner.restore(data)


def _with_counter(env: Environment) -> tuple[Environment, _CountingModel | None]:
    if env.model is None:
        return env, None
    counter = _CountingModel(env.model)
    return attrs.evolve(env, model=counter), counter


async def _read(stream: ReplyStream, into: dict[str, RunReply]) -> None:
    async for batch in stream:
        for r in batch:
            into[r.rollout_id] = r


def _rows(n: int, group_size: int, attempt: int = 0) -> list[RunRow]:
    return [
        RunRow(rollout_id_for(r, s, attempt), r, s, attempt)
        for r in range(n)
        for s in range(group_size)
    ]


def _same(a: RunReply | None, b: RunReply | None) -> bool:
    return (
        isinstance(a, Completed)
        and isinstance(b, Completed)
        and (a.reward, a.payload) == (b.reward, b.payload)
    )


async def check_environment(
    environment: Environment | str,
    workdir: str | Path,
    *,
    rows: int = 4,
    group_size: int = 2,
    seed: int = 0,
    park_after: Sequence[int] = (1, 2, 3),
    timeout_s: float = 120.0,
    modes: Sequence[CheckpointMode] = (CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED),
) -> ConformanceReport:
    """Run the checks above on ``environment`` (or its import path); files go under
    ``workdir``. Raises ``ConformanceError`` listing every failed check. ``modes``: the
    checkpoint modes the park-and-restore checks take (both by default).

    The checks run under every event loop a deployment runs the host on: first in the caller's
    trio run (embedded), then again, each named ``<check>@asyncio``, with the host in a trio run
    hosted on an asyncio loop in a thread of its own (what a Ray actor does), files under
    ``workdir/asyncio``. Environment code may call trio, anyio or asyncio: an environment that
    works under one and not the other fails the checks of that one."""
    workdir = Path(workdir)
    name = environment if isinstance(environment, str) else type(environment.agent).__name__
    checks = Checks(f"environment {name}")
    try:
        env = load_environment(environment)
        env.check()
    except (EnvironmentSpecError, ValueError) as exc:
        checks.check("spec", False, str(exc))
        return checks.finish()
    checks.check("spec", True)
    args = (env, rows, group_size, seed, tuple(park_after), tuple(modes), timeout_s)
    await _all_checks(workdir, *args, checks)
    on_asyncio = Checks(checks.subject)
    await anyio.to_thread.run_sync(  # as a Ray actor runs the host
        run_on_an_asyncio_loop, _all_checks, workdir / "asyncio", *args, on_asyncio
    )
    checks.passed += [f"{c}@asyncio" for c in on_asyncio.passed]
    checks.failed += [
        f"{c.split(':', 1)[0]}@asyncio:{c.split(':', 1)[1]}" if ":" in c else f"{c}@asyncio"
        for c in on_asyncio.failed
    ]
    checks.episodes += on_asyncio.episodes
    return checks.finish()


async def _all_checks(
    workdir: Path,
    env: Environment,
    rows: int,
    group_size: int,
    seed: int,
    park_after: Sequence[int],
    modes: Sequence[CheckpointMode],
    timeout_s: float,
    checks: Checks,
) -> None:
    with anyio.fail_after(timeout_s):
        ref_env, ref_model = _with_counter(env)
        ref_watch = _TurnWatch(ref_env.agent, math.inf)
        ref_env = attrs.evolve(ref_env, agent=ref_watch)
        ref: dict[str, RunReply] = {}
        async with GymHost(_INSTANCE, ref_env, seed, workdir / "reference") as host:
            await _read(await host.run(_rows(rows, group_size)), ref)
        bad = {rid: r for rid, r in ref.items() if not isinstance(r, Completed)}
        checks.episodes += len(ref)
        if not checks.check(
            "completes",
            len(ref) == rows * group_size and not bad,
            f"{len(ref)} of {rows * group_size} replied; not completed: {list(bad.values())[:3]}",
        ):
            return
        ref_calls = ref_model.calls if ref_model is not None else 0
        ref_counts = (ref_calls, len(ref_watch.steps))
        for mode in modes:
            for k in park_after:
                aligned = mode is CheckpointMode.ALIGNED
                where = workdir / (f"park-{k}" if aligned else f"cut-{k}")
                await _park_and_restore(
                    env, where, rows, group_size, seed, k, mode, ref, ref_counts, checks
                )
        await _fencing(env, workdir / "fencing", seed, checks)
        if any(getattr(p, "retained", False) is True for p in env.participants):
            await _retained_journal(env, workdir / "journal", rows, group_size, seed, checks)


def _retained(host: GymHost) -> dict[str, dict[str, Any]]:
    env = host.environment
    return {
        p.name: {
            key: (v.rollout_id, v.attempt, to_plain(p.export(v.state)))
            for key, v in host.session_states(p.name).items()
        }
        for p in env.participants
        if p.name in host.retained_names
    }


async def _retained_journal(
    env: Environment, where: Path, rows: int, group_size: int, seed: int, checks: Checks
) -> None:
    done: dict[str, RunReply] = {}
    async with GymHost(_INSTANCE, env, seed, where) as host:
        await _read(await host.run(_rows(rows, group_size)), done)
        before = _retained(host)
    async with GymHost(_INSTANCE, env, seed, where, recover=True) as replacement:
        after = _retained(replacement)
    held = sum(len(v) for v in before.values())
    differ = [n for n in before if before[n] != after.get(n)]
    checks.check(
        "retained_journal",
        after == before and held > 0,
        f"{held} retained sessions after {len(done)} episodes; the recovered host holds "
        f"{sum(len(v) for v in after.values())}, differing in participants {differ}",
    )


async def _park_and_restore(
    env: Environment,
    where: Path,
    rows: int,
    group_size: int,
    seed: int,
    k: int,
    mode: CheckpointMode,
    ref: dict[str, RunReply],
    ref_counts: tuple[int, int],
    checks: Checks,
) -> None:
    ref_calls, ref_steps = ref_counts
    aligned = mode is CheckpointMode.ALIGNED
    label = f"[{k}]" if aligned else f"[{k},unaligned]"
    got: dict[str, RunReply] = {}
    first_env, first_model = _with_counter(env)
    watch = _TurnWatch(first_env.agent, k * rows * group_size)
    first_env = attrs.evolve(first_env, agent=watch)

    async def read_all() -> None:
        await _read(await host.run(_rows(rows, group_size)), got)
        watch.reached.set()  # every episode ended before the target

    async with GymHost(_INSTANCE, first_env, seed, where) as host, anyio.create_task_group() as tg:
        tg.start_soon(read_all)
        await watch.reached.wait()
        await host.prepare("conformance", anyio.current_time() + 60, mode)
        commit = await host.commit("conformance", "snapshot", anyio.current_time() + 60)
        if aligned:
            _check_round_trip(checks, label, host)
        await anyio.sleep(0.05)  # let replies produced before the park reach the reader
        tg.cancel_scope.cancel()
    held = [s.rollout_id for s in commit.sessions]
    record, episodes = _manifest_of(commit, env.agent.name)
    second_env, second_model = _with_counter(env)
    second_watch = _TurnWatch(second_env.agent, math.inf)
    second_env = attrs.evolve(second_env, agent=second_watch)
    refusing = None
    if aligned and held and env.participants:
        refusing = _RefuseOnce(second_env.participants[0])
        second_env = attrs.evolve(second_env, participants=(refusing, *second_env.participants[1:]))
    async with GymHost(_INSTANCE, second_env, seed, where) as fresh:
        if refusing is not None:
            await _check_refused_restore(checks, label, fresh, refusing, record, episodes)
        await fresh.restore("snapshot", record, episodes, anyio.current_time() + 60)
        claims = []
        for rid in held:
            row, slot = (int(x) for x in rid.split("-")[:2])
            claims.append(RunRow(rollout_id_for(row, slot, 1), row, slot, 1, restored_from=rid))
        continued: dict[str, RunReply] = {}
        if claims:
            await _read(await fresh.run(claims), continued)
    for rid, reply in continued.items():
        got[rid.rsplit("-a", 1)[0]] = reply
    checks.episodes += len(held)
    mismatched = [rid for rid in ref if not _same(ref[rid], got.get(rid))]
    how = "parked" if aligned else "cut (unaligned)"
    checks.check(
        f"restore_equivalence{label}",
        not mismatched,
        f"{len(held)} episodes {how} after ~{k} turns; {len(mismatched)} differ from the "
        f"uninterrupted run after restore (e.g. {mismatched[:3]}: "
        f"{[got.get(r) for r in mismatched[:1]]} vs {[ref[r] for r in mismatched[:1]]})",
    )
    if ref_steps:
        _check_steps_once(checks, label, aligned, ref_steps, watch, second_watch, episodes)
    if first_model is None or second_model is None:
        return
    if aligned:
        calls = first_model.calls + second_model.calls
        checks.check(
            f"model_calls_once{label}",
            calls == ref_calls,
            f"{calls} model calls across park and restore, {ref_calls} uninterrupted",
        )
        return
    _check_captured_calls_once(checks, label, second_model, episodes)


def _manifest_of(commit: CommitReply, agent: str) -> tuple[InstanceRecord, list[EpisodeRecord]]:
    """The instance's record and its episodes' records as the coordinator writes them into
    the manifest after ``commit`` (an episode's owner: its exporter's, else the agent's)."""
    record = InstanceRecord(
        _INSTANCE,
        tuple(
            ParticipantRecord(p.server_name, p.kind, p.state_dir, p.records_digest)
            for p in commit.participants
        ),
    )
    owners = {e.rollout_id: e for e in commit.exported}
    agent_sessions = {s.rollout_id: s for s in commit.sessions}
    episodes = [  # what the coordinator records: the exporter's, else the agent session's
        EpisodeRecord(
            rid,
            owners[rid].owner if rid in owners else agent,
            _INSTANCE,
            (owners[rid] if rid in owners else agent_sessions[rid]).capture_keys,
        )
        for rid in (s.rollout_id for s in commit.sessions)
    ]
    return record, episodes


def _check_captured_calls_once(
    checks: Checks, label: str, second_model: _CountingModel, episodes: Sequence[EpisodeRecord]
) -> None:
    """After an unaligned cut's restore, a call in flight at the cut is asked again; one the
    snapshot captured is not, and none is asked twice."""
    captured = {  # (slot, call id): the call ids of every attempt of a slot are the same
        ("-".join(e.rollout_id.split("-")[:2]), split_capture_key(key)[1])
        for e in episodes
        for key in e.capture_keys
    }
    again = [c for c in second_model.asked if c in captured]
    twice = len(second_model.asked) - len(set(second_model.asked))
    checks.check(
        f"model_calls_once{label}",
        not again and not twice,
        f"{len(again)} calls the snapshot captured were asked again after the restore "
        f"(e.g. {again[:3]}), {twice} asked twice by the restored attempts",
    )


async def _fencing(env: Environment, where: Path, seed: int, checks: Checks) -> None:
    old: dict[str, RunReply] = {}
    new: dict[str, RunReply] = {}
    async with GymHost(_INSTANCE, env, seed, where) as host, anyio.create_task_group() as tg:
        tg.start_soon(_read, await host.run([RunRow("0-0", 0, 0, 0)]), old)
        await _read(await host.run([RunRow("0-0-a1", 0, 0, 1)]), new)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    checks.check(
        "fencing",
        not old and isinstance(new.get("0-0-a1"), Completed),
        f"older attempt replied {list(old.values())}, newer {list(new.values())}",
    )


def _check_steps_once(
    checks: Checks,
    label: str,
    aligned: bool,
    ref_steps: int,
    first: _TurnWatch,
    second: _TurnWatch,
    episodes: Sequence[EpisodeRecord],
) -> None:
    """Parked: the steps' functions ran as often across both hosts as uninterrupted. Cut: no
    step the snapshot captured ran again after the restore, and none ran twice there."""
    twice = len(second.steps) - len(set(second.steps))
    if aligned:
        ran = len(first.steps) + len(second.steps)
        checks.check(
            f"captured_steps_once{label}",
            ran == ref_steps and not twice,
            f"captured steps' functions ran {ran} times across park and restore, {ref_steps} "
            f"uninterrupted ({twice} ran twice after the restore)",
        )
        return
    captured: set[tuple[str, int, str, int]] = set()
    for e in episodes:  # model calls' keys too: their digest part is never a step's
        slot = "-".join(e.rollout_id.split("-")[:2])
        for key in e.capture_keys:
            call = parse_call_id(split_capture_key(key)[1])
            captured.add((slot, call.turn, call.request, call.occurrence))
    width = len(next(iter(captured))[2]) if captured else 0  # a call id's digest part
    again = [r for r in second.steps if (r[0], r[1], r[2][:width], r[3]) in captured]
    checks.check(
        f"captured_steps_once{label}",
        not again and not twice,
        f"{len(again)} captured steps the snapshot held ran again after the restore (e.g. "
        f"{[(slot, turn, occ) for slot, turn, _, occ in again[:3]]} as (slot, turn, "
        f"occurrence)), {twice} ran twice after the restore",
    )


def _check_round_trip(checks: Checks, label: str, host: GymHost) -> None:
    """Every live session of every participant, exported and serialised as a commit does,
    restores to a state that exports the same data (``export_round_trip[k]``)."""
    env = host.environment
    differ: list[str] = []
    sessions = 0
    for p in (env.agent, *env.participants):
        for key, view in host.session_states(p.name).items():
            sessions += 1
            try:
                data = orjson.loads(orjson.dumps(to_plain(p.export(view.state))))
                again = orjson.loads(orjson.dumps(to_plain(p.export(p.restore(data)))))
            except Exception as exc:  # the user's code: any failure is the check's finding
                differ.append(f"{p.name}/{key}: {exc!r}")
                continue
            if again != data:
                differ.append(f"{p.name}/{key}: {_first_difference(data, again)}")
    checks.check(
        f"export_round_trip{label}",
        not differ,
        f"{len(differ)} of {sessions} sessions do not export the same data after a restore of "
        f"their export (e.g. {differ[:2]})",
    )


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two plain values first differ, and what each holds there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k, _MISSING) != b.get(k, _MISSING):
                return _first_difference(a.get(k, _MISSING), b.get(k, _MISSING), f"{where}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return f"at {where or 'the top'}: exported {_short(a)}, then {_short(b)}"


_MISSING: Any = "<missing>"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _check_refused_restore(
    checks: Checks,
    label: str,
    host: GymHost,
    refusing: _RefuseOnce,
    record: InstanceRecord,
    episodes: Sequence[EpisodeRecord],
) -> None:
    """A restore one participant refuses raises ``TopologyMismatch`` naming the refusal and
    leaves ``host`` holding nothing (``restore_refuses_bad_data[k]``)."""
    refusing.armed = True
    raised: BaseException | None = None
    try:
        await host.restore("snapshot", record, episodes, anyio.current_time() + 60)
    except Exception as exc:  # TopologyMismatch is the contract; another error the finding
        raised = exc
    refusing.armed = False
    inv = host.inventory()
    held = {p.name: list(host.session_states(p.name)) for p in host.environment.participants}
    leftover = {name: keys for name, keys in held.items() if keys}
    checks.check(
        f"restore_refuses_bad_data{label}",
        isinstance(raised, TopologyMismatch)
        and "refuses this state" in str(raised)
        and not inv.unclaimed
        and not leftover,
        f"a restore whose {refusing.inner.name} refused a session state raised {raised!r}; "
        f"the host then held unclaimed episodes {list(inv.unclaimed)} and sessions {leftover}",
    )
