"""The backend kit's real-usage checks: what a deployment that outlives its trainer must do.

``check_usage`` runs after the contract checks of ``check_backend``, on the same open backend:

8. ``trainer_terms``: the backend implements ``attach`` and ``release`` (``TrainerAware``);
   without them none of the checks below can run, and a restarted trainer could not fence
   the one it replaces.
9. ``trainer_restart[running]``: term 1 of a lineage attaches every instance and dispatches
   rows, and is abandoned as a SIGKILLed trainer is (no retire, no aclose, nothing). Term 2
   of the same lineage attaches: each reply says it took over from term 1; right after it, no
   instance runs, parks or holds anything of term 1, admission is open, and every stream of
   term 1 ends; term 1 may not call again (its ``attach`` is refused with ``GymInUse``);
   term 2 re-runs the rows term 1 left without a final reply, and every row ends exactly once.
10. ``trainer_restart[prepared]``: the same, with term 1 dying after ``prepare`` on every
    instance (its checkpoint left open): term 2's attach aborts that checkpoint (its reply
    names it) and the instances serve term 2 at once.
11. ``second_trainer``: while term 2 runs rows, a trainer of another lineage attaching any
    instance is refused with ``GymInUse``; term 2 still holds every instance (its own attach
    takes nothing over) and its rows each end exactly once. Term 2 then releases them.
12. ``shuffled_restore``: ``open_rollouts`` with rows in a shuffled order over two epochs
    trains part of them, takes a checkpoint and is abandoned; reopened on the same work
    directory it restores and trains the rest: every position of the order exactly once,
    each with the row the order puts there.

The kit's trainers are runs of their own (lineages generated here): instances an unfinished
run holds refuse them, and the kit fails ``trainer_restart`` saying so; instances a finished
run released are taken over (what is left there is fenced). The checks end with the instances
released, as a finished run leaves them.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import trio

from gymckpt.gym_adapter import (
    Completed,
    Failed,
    GymBackend,
    ReplyStream,
    RunReply,
    RunRow,
    can_attach,
)
from gymckpt.runtime import CompletedGroup, GymInUse, TrainerTerm, rollout_id_for
from gymckpt.runtime._shared import RowOrder

from ._report import Checks

__all__ = ["check_usage"]

_DEADLINE_S = 30.0
_SHUFFLE_SEED = 31
_EPOCHS = 2


def _lineage() -> str:
    return secrets.token_hex(16)


async def check_usage(
    checks: Checks, gym: GymBackend, names: tuple[str, ...], workdir: Path, rows: int
) -> int:
    """Checks 8-12 (module docstring); the number of episodes that replied."""
    if not can_attach(gym):
        checks.check(
            "trainer_terms",
            False,
            f"{type(gym).__name__} has no attach(instance, trainer, deadline_ts) and "
            "release(instance, trainer, deadline_ts) (gymckpt.gym_adapter.TrainerAware): a "
            "restarted trainer could not fence the one it replaces; implement them (pass the "
            "trainer to the host's attach, carry it on every later call)",
        )
        return 0
    checks.check("trainer_terms", True)
    gym_: Any = gym
    lineage = _lineage()
    try:
        episodes = await _restart(checks, gym_, names, lineage, 1, rows, slot=3, prepared=False)
        episodes += await _restart(checks, gym_, names, lineage, 3, rows, slot=4, prepared=True)
        holder = TrainerTerm(lineage, 4)
        episodes += await _second_trainer(checks, gym_, names, holder, rows, slot=5)
    except GymInUse as exc:  # a call the checks expect to pass was refused
        checks.check(
            "trainer_restart",
            False,
            f"{exc} (the kit's trainers attach with a lineage of their own: run it on "
            "instances no unfinished run holds)",
        )
        return 0
    episodes += await _shuffled_restore(checks, gym, workdir / "shuffled", rows)
    return episodes


def _rows(names: tuple[str, ...], rows: int, slot: int, attempt: int) -> dict[str, list[RunRow]]:
    """``rows`` rows per instance, disjoint across instances."""
    return {
        name: [
            RunRow(rollout_id_for(i * rows + r, slot, attempt), i * rows + r, slot, attempt)
            for r in range(rows)
        ]
        for i, name in enumerate(names)
    }


async def _collect(stream: ReplyStream, into: list[RunReply], ended: trio.Event) -> None:
    """Read ``stream`` to its end into ``into``, then set ``ended``."""
    async for batch in stream:
        into.extend(batch)
    ended.set()


def _finals(replies: list[RunReply], rows_of: dict[str, int]) -> dict[int, int]:
    """Final replies per row (``rows_of``: rollout id -> row)."""
    counts: dict[int, int] = {}
    for r in replies:
        if isinstance(r, (Completed, Failed)):
            row = rows_of.get(r.rollout_id, -1)
            counts[row] = counts.get(row, 0) + 1
    return counts


def _ids(*runs: dict[str, list[RunRow]]) -> dict[str, int]:
    return {r.rollout_id: r.row for run in runs for rows in run.values() for r in rows}


async def _restart(
    checks: Checks,
    gym: Any,
    names: tuple[str, ...],
    lineage: str,
    term: int,
    rows: int,
    *,
    slot: int,
    prepared: bool,
) -> int:
    name = "trainer_restart[prepared]" if prepared else "trainer_restart[running]"
    old, new = TrainerTerm(lineage, term, "kit-term-1"), TrainerTerm(lineage, term + 1, "kit")
    checkpoint_id = f"conformance-dies-{term}"
    problems: list[str] = []
    deadline = trio.current_time() + _DEADLINE_S
    for inst in names:
        await gym.attach(inst, old, deadline)
    first = _rows(names, rows, slot, 0)
    old_replies: list[RunReply] = []
    ended = {inst: trio.Event() for inst in names}
    streams = {inst: await gym.run(inst, first[inst]) for inst in names}
    await trio.lowlevel.checkpoint()
    if prepared:  # term 1 dies with its checkpoint open, before commit and resume
        for inst in names:
            await gym.prepare(inst, checkpoint_id, deadline)
    # term 1 is abandoned here: it reads no reply, retires, resumes and closes nothing
    held = 0
    for inst in names:
        inv = await gym.inventory(inst)
        held += len(inv.running) + len(inv.parked) + len(inv.on_wire)
    if held == 0 and not prepared:
        problems.append(
            "nothing of term 1 was running, parked or on the wire when term 2 attached, though "
            "term 1 read no reply: a reply must wait on the wire until its trainer asks for it"
        )
    async with trio.open_nursery() as nursery:
        opened = checkpoint_id if prepared else None
        problems += await _takeovers(gym, names, old, new, deadline, opened)
        problems += await _term_one_gone(gym, names)
        for inst, stream in streams.items():  # what term 1's streams still deliver
            nursery.start_soon(_collect, stream, old_replies, ended[inst])
        with trio.move_on_after(_DEADLINE_S) as waited:
            for event in ended.values():
                await event.wait()
        if waited.cancelled_caught:
            going = sorted(inst for inst, event in ended.items() if not event.is_set())
            problems.append(
                f"term 1's reply streams of {going} did not end "
                f"within {_DEADLINE_S:.0f} s of term 2's attach"
            )
            nursery.cancel_scope.cancel()
    problems += await _late_attach_refused(gym, names, old, new)
    rerun = _rows(names, rows, slot, 1)
    rows_of = _ids(first, rerun)
    done = _finals(old_replies, rows_of)
    new_replies = await _run_unfinished(gym, names, rerun, done)
    counts = _finals(old_replies + new_replies, rows_of)
    want = {r.row: 1 for inst in names for r in first[inst]}
    if counts != want:
        twice = sorted(r for r, n in counts.items() if n > 1)
        never = sorted(set(want) - set(counts))
        problems.append(f"rows ended twice {twice}, rows never ended {never}")
    checks.check(name, not problems, "; ".join(problems))
    return len(counts)


async def _takeovers(
    gym: Any,
    names: tuple[str, ...],
    old: TrainerTerm,
    new: TrainerTerm,
    deadline: float,
    opened: str | None,
) -> list[str]:
    """Term ``new`` attaches to every instance: each attach must take over from ``old`` (and
    abort its open checkpoint ``opened``, if any). The problems found."""
    problems: list[str] = []
    for inst in names:
        reply = await gym.attach(inst, new, deadline)
        if not reply.took_over or reply.previous != old:
            problems.append(
                f"{inst}: term 2's attach took_over={reply.took_over} from "
                f"{reply.previous}, expected a takeover from term {old.term}"
            )
        if opened is not None and reply.aborted != opened:
            problems.append(
                f"{inst}: term 2's attach aborted {reply.aborted!r}, not term 1's open "
                f"checkpoint {opened!r}"
            )
    return problems


async def _term_one_gone(gym: Any, names: tuple[str, ...]) -> list[str]:
    """After the takeover, no instance holds an episode of the older term, a checkpoint it
    opened, or closed admission. The problems found."""
    problems: list[str] = []
    for inst in names:
        inv = await gym.inventory(inst)
        left = (*inv.running, *inv.parked, *inv.unclaimed, *inv.on_wire)
        if left or inv.prepared or not inv.admission_open:
            problems.append(
                f"{inst}: after term 2 attached, term 1's episodes {sorted(left)} are still "
                f"there, prepared={inv.prepared}, admission_open={inv.admission_open}: the "
                "attach must end every episode and abort any checkpoint an older term started"
            )
    return problems


async def _late_attach_refused(
    gym: Any, names: tuple[str, ...], old: TrainerTerm, new: TrainerTerm
) -> list[str]:
    """Term ``old`` attaching again after ``new`` is refused (``GymInUse``); then the facade
    carries ``new`` again. The problems found."""
    problems: list[str] = []
    try:
        await gym.attach(names[0], old, trio.current_time() + _DEADLINE_S)
    except GymInUse:
        pass
    else:
        problems.append(f"{names[0]}: term 1's late attach was accepted after term 2's")
    for inst in names:  # this facade carries term 2 again (the holder's attach changes nothing)
        await gym.attach(inst, new, trio.current_time() + _DEADLINE_S)
    return problems


async def _run_unfinished(
    gym: Any, names: tuple[str, ...], rerun: dict[str, list[RunRow]], done: dict[int, int]
) -> list[RunReply]:
    """Run again, to their ends, the rows of ``rerun`` not in ``done``; their replies."""
    replies: list[RunReply] = []
    async with trio.open_nursery() as nursery:
        for inst in names:
            again = [r for r in rerun[inst] if r.row not in done]
            if again:
                stream = await gym.run(inst, again)
                nursery.start_soon(_collect, stream, replies, trio.Event())
    return replies


async def _second_trainer(
    checks: Checks, gym: Any, names: tuple[str, ...], holder: TrainerTerm, rows: int, *, slot: int
) -> int:
    problems: list[str] = []
    intruder = TrainerTerm(_lineage(), 1, "kit-second-trainer")
    deadline = trio.current_time() + _DEADLINE_S
    run = _rows(names, rows, slot, 0)
    replies: list[RunReply] = []
    async with trio.open_nursery() as nursery:
        for inst in names:
            stream = await gym.run(inst, run[inst])
            nursery.start_soon(_collect, stream, replies, trio.Event())
        await trio.lowlevel.checkpoint()
        for inst in names:
            try:
                await gym.attach(inst, intruder, deadline)
            except GymInUse:
                pass
            else:
                problems.append(
                    f"{inst}: a trainer of another lineage attached while {holder.describe()} "
                    "held it (expected GymInUse)"
                )
        for inst in names:  # this facade carries the holder's term again
            try:
                reply = await gym.attach(inst, holder, deadline)
            except GymInUse as exc:
                problems.append(f"{inst}: the holder lost the instance: {exc}")
                continue
            if reply.took_over:
                problems.append(f"{inst}: the holder's own attach took something over")
    counts = _finals(replies, _ids(run))
    want = {r.row: 1 for inst in names for r in run[inst]}
    if counts != want:
        problems.append(f"the holder's rows ended {counts}, expected each once")
    for inst in names:
        await gym.release(inst, holder, trio.current_time() + _DEADLINE_S)
    checks.check("second_trainer", not problems, "; ".join(problems))
    return len(counts)


async def _shuffled_restore(checks: Checks, gym: GymBackend, workdir: Path, rows: int) -> int:
    from gymckpt.nurseries import open_rollouts

    def batches_of(ro: Any) -> AsyncGenerator[list[CompletedGroup], None]:
        """``ro.batches`` (an async generator annotated as an iterator), closed by the caller."""
        return cast(AsyncGenerator[list[CompletedGroup], None], ro.batches(groups_per_step=1))

    order_rows = [(r * 5 + 3) % (2 * rows + 1) for r in range(2 * rows)]  # shuffled, unique
    order = RowOrder.of(order_rows, None, epochs=_EPOCHS, shuffle_seed=_SHUFFLE_SEED)
    seen: list[tuple[int, int]] = []
    kw: dict[str, Any] = {
        "rows": order_rows,
        "group_size": 1,
        "epochs": _EPOCHS,
        "shuffle_seed": _SHUFFLE_SEED,
        "handle_signals": False,
    }
    problems: list[str] = []
    try:
        async with open_rollouts(gym, workdir, **kw) as ro:
            async with aclosing(batches_of(ro)) as batches:
                async for batch in batches:
                    seen.extend((g.position, g.row) for g in batch)
                    if len(seen) >= len(order) // 2:
                        break
            outcome = await ro.checkpoint()
            if not outcome.ok:
                problems.append(f"the checkpoint failed: {outcome}")
        # abandoned after the checkpoint: the next open restores it (term 2 of its lineage)
        async with (
            open_rollouts(gym, workdir, **kw) as ro,
            aclosing(batches_of(ro)) as batches,
        ):
            async for batch in batches:
                seen.extend((g.position, g.row) for g in batch)
    except Exception as exc:  # a backend's failure is a failed check, named
        checks.check("shuffled_restore", False, f"the run raised {type(exc).__name__}: {exc}")
        return len(seen)
    positions = [p for p, _ in seen]
    twice = sorted({p for p in positions if positions.count(p) > 1})
    never = sorted(set(range(len(order))) - set(positions))
    wrong = sorted(p for p, row in seen if p < len(order) and order.row_at(p) != row)
    if twice or never or wrong:
        problems.append(
            f"positions trained twice {twice}, never {never}, with another row than the "
            f"order's {wrong} (rows {order_rows}, epochs {_EPOCHS}, shuffle_seed "
            f"{_SHUFFLE_SEED})"
        )
    checks.check("shuffled_restore", not problems, "; ".join(problems))
    return len(seen)
