"""Restore: from the latest complete rollout snapshot back to a running ledger (S8, S11, S13).

Order matters. Nothing reaches Gym until every check that can reject the snapshot has passed,
and what reaches Gym is all-or-nothing across instances:

1. pick the latest complete snapshot and **copy it first** (pin), so trainer-checkpoint
   retention can never prune what we restore from (S13);
2. load it strictly (marker, digests of its files, manifest structure, paths inside it);
3. the trainer's dataset against the snapshot's dataset record (``check_dataset``: every row
   reserved before the checkpoint must have the digest it had; a dataset given to one run
   and not the other is refused too): ``DatasetMismatch`` naming the first row that differs;
   then ``snapshot_problems`` — the one check ``gymckpt verify`` runs too: every participant's
   on-disk digest, committed state the manifest does not list, the live topology (bounded like
   any control call; an instance found dead there, one that died while no trainer drove it, is
   replaced first when the backend can), the ledger (version, states, slots, its retire
   queue, this run's ``group_size``) and ledger vs manifest. Any problem raises before Gym is
   asked anything (``TopologyMismatch`` for state and topology, ``ManifestError`` for the
   ledger); the ledger is rebuilt here too, so a ledger the rebuild rejects never gets as far
   as Gym;
   then the run's row order against the snapshot's ``order.json`` and its ledger's cursor
   (``check_order``: the same epochs, seed and rows up to where the order stood):
   ``DatasetMismatch`` saying what differs;
4. attach the trainer's term to every instance (``attach_trainer``: an instance still running
   an older term's episodes, or holding its checkpoint open, fences that term and is idle
   afterwards; one that serves another run refuses, ``GymInUse``), then ask every instance,
   concurrently and each bounded, to restore its committed state;
5. retire, on each instance, the dropped attempts the snapshot carries: Gym committed their
   state, the ledger no longer owns them, and a replacement dispatched elsewhere would repeat
   their environment mutations;
6. if step 4 or 5 fails anywhere, every instance is asked to drop the episodes it may have
   installed (``retire_restored``; an instance that never installed reports them unknown), so
   none holds a claimable restored episode and a corrected restart into the same Gym restores
   cleanly; then the error is raised — unless instances were found dead and the backend can
   replace them (``ReplaceableGym``): then they are replaced, step 4 runs again on the
   replacements only (a replacement holds nothing restored) and step 5 again, at most
   ``max_replacements`` times in all;
7. hand over the ledger: each exported episode is attempt + 1, pinned to its original replica
   and **unclaimed** until its dispatch claims it (S11); completed-but-untrained results go
   straight to the trainer.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath

import attrs
import trio

from gymckpt.gym_adapter import GymBackend, Topology, can_replace
from gymckpt.runtime import (
    EpisodeRecord,
    InstanceRecord,
    LoadedSnapshot,
    ManifestError,
    RecoveryLedger,
    RestoreSummary,
    RuntimeConfig,
    SnapshotInfo,
    SnapshotStore,
    TaskDataset,
    TopologyMismatch,
    TrainerTerm,
    load_snapshot,
    rollout_id_for,
    verify_snapshot,
)
from gymckpt.runtime._shared import (
    DATASET_FILE,
    GYM_STATE_DIR,
    LEDGER_FILE,
    ORDER_FILE,
    STEP_FILE,
    GymManifest,
    LedgerSnapshot,
    RowOrder,
    check_dataset,
    check_order,
    load_dataset_record,
    load_ledger_snapshot,
    load_order_record,
    load_step,
)

from ._attach import attach_trainer
from ._calls import bounded_call, fan_out
from ._offload import offload
from ._replace import dead_in, replace_now

__all__ = [
    "RestoredRun",
    "SnapshotProblems",
    "ledger_manifest_differences",
    "restore_latest",
    "snapshot_problems",
]

log = logging.getLogger("gymckpt")


@attrs.frozen(repr=False)
class RestoredRun:
    """What a restore hands to the facade."""

    snapshot: SnapshotInfo
    pinned: SnapshotInfo
    ledger: RecoveryLedger
    summary: RestoreSummary
    files: dict[str, bytes]
    dataset_rows: tuple[tuple[int, int], ...] = ()
    """The dataset rows the snapshot covered (its ``dataset.json``), which the run's own
    snapshots go on covering."""

    @property
    def step(self) -> int:
        """The trainer facade's step when the snapshot was taken (0 if it saved none)."""
        return saved_step(self.files)

    @property
    def policy_version(self) -> int:
        """The trainer's policy version at the cut (0 if the snapshot saved none)."""
        raw = self.files.get(STEP_FILE)
        return 0 if raw is None else load_step(raw).policy_version

    def __repr__(self) -> str:  # never the snapshot's bytes (``files`` may be megabytes)
        s = self.summary
        sizes = sum(len(data) for data in self.files.values())
        return (
            f"<RestoredRun {self.snapshot.path} (checkpoint {self.snapshot.checkpoint_id}) "
            f"step={self.step} parked={s.restored} completed_untrained="
            f"{s.completed_untrained} to_dispatch={s.reserved + s.redispatched_fresh} "
            f"files={len(self.files)} ({sizes} bytes)>"
        )


def saved_step(files: Mapping[str, bytes]) -> int:
    """The step a snapshot's ``step.json`` holds, 0 without one; a malformed one raises
    ``ManifestError`` naming the file and what it holds."""
    raw = files.get(STEP_FILE)
    return 0 if raw is None else load_step(raw).step


def ledger_manifest_differences(manifest: GymManifest, ledger: LedgerSnapshot) -> list[str]:
    """Where ``ledger.json`` and ``gym_checkpoint.json`` of one snapshot disagree (a short
    sample of each kind): every attempt in flight must be exported, and every exported episode
    must be in flight or held unclaimed by a restored attempt."""
    dispatched = {
        rollout_id_for(a.row, a.slot, a.attempt) for a in ledger.attempts if a.state == "dispatched"
    }
    unclaimed = {
        a.restored.from_rollout_id
        for a in ledger.attempts
        if a.unclaimed and a.restored is not None
    }
    exported = {e.rollout_id for e in manifest.episodes}
    problems = [
        f"ledger.json: {rid} in flight but not exported in gym_checkpoint.json"
        for rid in sorted(dispatched - exported)[:5]
    ]
    problems += [
        f"gym_checkpoint.json: episode {rid} exported but not in flight in the ledger"
        for rid in sorted(exported - dispatched - unclaimed)[:5]
    ]
    return problems


@attrs.frozen
class SnapshotProblems:
    """What ``snapshot_problems`` found: ``state`` (participant state, digests, topology) and
    ``ledger`` (the ledger and its agreement with the manifest); ``ledger_snapshot`` is the
    parsed ledger when it could be read."""

    state: tuple[str, ...]
    ledger: tuple[str, ...]
    ledger_snapshot: LedgerSnapshot | None = None

    @property
    def all(self) -> list[str]:
        return [*self.state, *self.ledger]

    def raise_if_any(self, where: Path) -> None:
        """``TopologyMismatch`` for state problems, else ``ManifestError`` for ledger ones."""
        if self.state:
            raise TopologyMismatch(self.state)
        if self.ledger:
            raise ManifestError(f"{where}: " + "; ".join(self.ledger))


def snapshot_problems(
    snap: LoadedSnapshot,
    live: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    group_size: int | None = None,
) -> SnapshotProblems:
    """Every reason ``snap`` cannot be restored: the one check shared by ``gymckpt verify``
    (offline: ``live`` and ``group_size`` None) and ``restore_latest`` (before Gym installs
    anything). Blocking (reads and hashes every participant's state): run it off the loop."""
    state = verify_snapshot(snap, live) + _unlisted_state(snap)
    if LEDGER_FILE not in snap.files:
        return SnapshotProblems(tuple(state), (f"{LEDGER_FILE}: missing from the snapshot",))
    try:
        led = load_ledger_snapshot(snap.files[LEDGER_FILE])
    except ManifestError as exc:
        return SnapshotProblems(tuple(state), (str(exc),))
    problems: list[str] = []
    try:
        saved_step(snap.files)
    except ManifestError as exc:
        problems.append(str(exc))
    try:
        found = load_dataset_record(snap.files)
    except ManifestError as exc:
        problems.append(str(exc))
    else:
        has_order = ORDER_FILE in snap.files
        if found is not None and not has_order and found[0].end > led.next_row:
            problems.append(
                f"{DATASET_FILE}: covers rows up to {found[0].end - 1}, but {LEDGER_FILE} "
                f"reserved rows below {led.next_row} only"
            )
    try:
        order = load_order_record(snap.files)
    except ManifestError as exc:
        problems.append(str(exc))
    else:
        if order is not None and order.position != led.next_row:
            problems.append(
                f"{ORDER_FILE}: position {order.position}, but {LEDGER_FILE} reserved "
                f"positions below {led.next_row}"
            )
    if group_size is not None and led.group_size != group_size:
        problems.append(
            f"{LEDGER_FILE}: snapshot has group_size {led.group_size}, this run asks for "
            f"{group_size}; restart with --group-size {led.group_size} or a fresh work directory"
        )
    try:
        RecoveryLedger.from_snapshot(led, snap.manifest.episodes)
    except ManifestError as exc:
        problems.append(str(exc))
    instances = {i.name for i in snap.manifest.instances}
    problems += [
        f"{LEDGER_FILE}: {item.rollout_id} queued for retirement on {item.instance}, "
        "which is not an instance of gym_checkpoint.json"
        for item in led.retire
        if item.instance not in instances
    ][:5]
    problems += ledger_manifest_differences(snap.manifest, led)
    return SnapshotProblems(tuple(state), tuple(problems), led)


def _unlisted_state(snap: LoadedSnapshot) -> list[str]:
    """Committed participant state in the snapshot that no manifest participant covers.

    Offline there is no live topology to compare with, so a participant removed from a
    hand-edited manifest would otherwise verify clean; its state directory is still on disk
    and gives it away.
    """
    gym = snap.path / GYM_STATE_DIR
    if not gym.is_dir():
        return []
    listed = [PurePosixPath(p.state_dir) for i in snap.manifest.instances for p in i.participants]
    unlisted: set[str] = set()
    for dirpath, _dirnames, filenames in os.walk(gym):
        for name in filenames:
            rel = PurePosixPath(Path(dirpath, name).relative_to(snap.path).as_posix())
            if not any(rel.is_relative_to(d) for d in listed):
                unlisted.add(str(rel.parent))
    return [
        f"{d}: participant state on disk that gym_checkpoint.json does not list "
        "(a participant missing from the manifest?)"
        for d in sorted(unlisted)
    ]


async def restore_latest(
    gym: GymBackend,
    store: SnapshotStore,
    pin_dir: Path,
    config: RuntimeConfig,
    *,
    group_size: int | None = None,
    dataset: TaskDataset | None = None,
    order: RowOrder | None = None,
    trainer: TrainerTerm | None = None,
) -> RestoredRun | None:
    """Restore the latest complete snapshot in ``store``; None when there is none (then
    nothing was attached either).

    ``trainer``: this process's term, attached to every instance once every check passed and
    before anything is installed (step 4).

    ``group_size`` is this run's: a snapshot of another group size is rejected before Gym
    installs anything; so is one made with another ``dataset`` (``DatasetMismatch``), or with
    a dataset when this run has none, or the reverse; so is one whose row order (``order``:
    this run's) puts a position below the snapshot's cursor on another row (``check_order``:
    other ``epochs``, ``shuffle_seed`` or rows). See the module docstring for the order of
    the steps and the all-or-nothing rule.
    """
    info = await offload(store.latest_complete)
    if info is None:
        return None
    dest = pin_dir / info.path.name
    pinned = await offload(lambda: store.pin(info, dest))
    snap: LoadedSnapshot = await offload(lambda: load_snapshot(pinned.path))
    try:
        record = load_dataset_record(snap.files)
    except ManifestError as exc:
        raise ManifestError(f"{pinned.path}: {exc}") from None
    await offload(functools.partial(check_dataset, record, dataset, str(info.path)))
    topology = await _live_topology(gym, config)
    live = {i.name: list(i.participants) for i in topology.instances}
    found = await offload(lambda: snapshot_problems(snap, live, group_size))
    found.raise_if_any(pinned.path)
    assert found.ledger_snapshot is not None
    ledger_snap = found.ledger_snapshot
    if order is not None:
        saved_order = load_order_record(snap.files)  # read cleanly by snapshot_problems
        await offload(
            functools.partial(check_order, saved_order, order, ledger_snap.next_row, str(info.path))
        )
    ledger, summary = RecoveryLedger.from_snapshot(ledger_snap, snap.manifest.episodes)
    episodes_by_replica: dict[str, list[EpisodeRecord]] = {}
    for ep in snap.manifest.episodes:
        episodes_by_replica.setdefault(ep.replica, []).append(ep)
    if trainer is not None:
        await attach_trainer(gym, trainer, config)
    state_root = str(await offload(pinned.path.resolve))
    await _install_all_or_nothing(gym, snap, state_root, episodes_by_replica, ledger, config)
    rows = () if record is None else record[0].rows
    return RestoredRun(info, pinned, ledger, summary, dict(snap.files), rows)


async def _install_all_or_nothing(
    gym: GymBackend,
    snap: LoadedSnapshot,
    state_root: str,
    episodes_by_replica: Mapping[str, Sequence[EpisodeRecord]],
    ledger: RecoveryLedger,
    config: RuntimeConfig,
) -> None:
    """Step 4 and the retirement of the dropped attempts the snapshot carries, on every
    instance, all or nothing: an instance found dead is replaced (when the backend can, at
    most ``max_replacements`` times) and installed again, the others kept; any other failure
    rolls every instance back (shielded) and raises the restore's error."""
    records = {rec.name: rec for rec in snap.manifest.instances}
    installed: set[str] = set()
    replaced = 0
    while True:
        try:
            await _install(gym, state_root, records, episodes_by_replica, installed, config)
            await _retire_carried(gym, ledger, config)
        except Exception as exc:
            dead = sorted({d.instance for d in dead_in(exc)} & set(records))
            if dead and can_replace(gym) and replaced < config.max_replacements:
                # a replacement holds nothing restored: install it again there, keep the rest
                replaced += 1
                log.warning(
                    "restore found %s dead: replacing, then restoring there again", ", ".join(dead)
                )
                try:
                    for name in dead:
                        installed.discard(name)
                        await replace_now(gym, name, config)
                    continue
                except Exception as replace_error:  # roll back, raise the restore's error
                    log.warning(
                        "replacing %s for the restore failed: %s", ", ".join(dead), replace_error
                    )
            with trio.CancelScope(shield=True):
                await _roll_back(gym, snap.manifest, episodes_by_replica, config)
            raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await _roll_back(gym, snap.manifest, episodes_by_replica, config)
            raise
        return


async def _live_topology(gym: GymBackend, config: RuntimeConfig) -> Topology:
    """The deployment's topology (bounded). An instance found dead (one that died while no
    trainer drove it: servers that outlived the trainer) is replaced first when the backend
    can (``ReplaceableGym``, at most ``max_replacements`` times), as the dispatcher would
    replace it; the replacement continues the dead one's journal and hosts the same
    environment. Raises what the topology raised otherwise."""
    replaced = 0
    while True:
        try:
            return await bounded_call(
                "deployment", "topology", lambda _deadline: gym.topology(), config
            )
        except Exception as exc:
            dead = sorted({d.instance for d in dead_in(exc)} & set(gym.instances))
            if not dead or not can_replace(gym) or replaced >= config.max_replacements:
                raise
            replaced += 1
            log.warning("restore found %s dead: replacing before the checks", ", ".join(dead))
            for name in dead:
                await replace_now(gym, name, config)


async def _install(
    gym: GymBackend,
    state_root: str,
    records: Mapping[str, InstanceRecord],
    episodes_by_replica: Mapping[str, Sequence[EpisodeRecord]],
    installed: set[str],
    config: RuntimeConfig,
) -> None:
    """Step 4 on every instance not yet in ``installed``, concurrently; adds each that
    restored (so a retry after a replacement restores only the replacement)."""

    def call(name: str) -> Callable[[float], Awaitable[None]]:
        async def restore(deadline: float) -> None:
            await gym.restore(
                name, state_root, records[name], tuple(episodes_by_replica.get(name, ())), deadline
            )
            installed.add(name)

        return restore

    await fan_out("restore", {n: call(n) for n in records if n not in installed}, config)


async def _retire_carried(gym: GymBackend, ledger: RecoveryLedger, config: RuntimeConfig) -> None:
    """Retire the dropped attempts the snapshot carries, before anything is dispatched.

    After a restore Gym holds such an attempt only as committed state of a session that no
    longer runs (the manifest left it out), which a plain ``retire`` frees; an ID Gym does not
    know is reported unknown. Either way the ledger forgets it.
    """
    queue = ledger.retire_queue()
    if not queue:
        return
    calls = {
        instance: functools.partial(gym.retire, instance, [i.rollout_id for i in items])
        for instance, items in queue.items()
    }
    replies = await fan_out("retire", calls, config)
    done = [rid for r in replies.values() for rid in (*r.retired, *r.unknown)]
    await ledger.barrier.mutate(lambda: ledger.forget_retired(done))


async def _roll_back(
    gym: GymBackend,
    manifest: GymManifest,
    episodes_by_replica: Mapping[str, Sequence[EpisodeRecord]],
    config: RuntimeConfig,
) -> None:
    """Best effort, bounded: every instance drops the restored episodes it may hold."""
    calls = {
        rec.name: functools.partial(
            gym.retire_restored,
            rec.name,
            [e.rollout_id for e in episodes_by_replica.get(rec.name, ())],
        )
        for rec in manifest.instances
        if episodes_by_replica.get(rec.name)
    }
    if not calls:
        return
    try:
        await fan_out("restore_retire", calls, config)
    except Exception as exc:
        log.warning(
            "restore rollback incomplete, an instance may still hold restored "
            "episodes until the next restore replaces them: %s",
            exc,
        )
