"""Protocol mutants: does the suite (plus a short simulation) notice when a rule is broken?

    python tests/mutation.py                 # every mutant; prints the mutation score
    python tests/mutation.py s9 bug2         # only mutants whose name contains one of these
    python tests/mutation.py --sim-only --seeds 300 bug  # the simulation alone vs the bug mutants
    python tests/mutation.py --list

Each mutant is a one-line change that breaks one behaviour rule the way a careless edit would:
the six checks that once could not fail, the three exactly-once races put back, others across
S1-S13 and fencing, and the rules of an unaligned checkpoint's cut. One at a time, the tree is
copied to a temporary directory (the working tree is never touched), the line is replaced, and
the copy is imported as ``gymckpt`` (``PYTHONPATH``) by:

1. the mutant's relevant tests (``pytest -x``; a hang fails through pytest-timeout);
2. if they all pass, ``gymckpt simulate`` over ``--seeds`` seeds.

A mutant is *killed* when either fails. The score is killed / total; a mutant whose line is no
longer in the tree is reported *stale* (edit its entry). Not part of CI: it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RACES = "tests/test_exactly_once_races.py"
ORCH = "tests/test_orchestration.py"
HOST_SLOTS = "tests/test_host_fencing_journal.py"
HOSTILE = "tests/test_hostile_environment.py"
JOURNAL = "tests/test_host_journal.py"
PREEMPT = "tests/test_preemption_paths.py"
UNALIGNED = "tests/test_unaligned_rules.py"
ALIGNMENT = "tests/test_alignment_timeout.py"
HTTP_SECURITY = "tests/test_http_security.py"
HTTP_SERVER = "tests/test_http_server.py"
TENANCY = "tests/test_host_tenancy.py"
HTTP_FENCING = "tests/test_http_trainer_fencing.py"
BACKEND_KIT = "tests/test_conformance_kit.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    nth: int = 1
    """Which occurrence of ``old`` in ``path`` is replaced (1-based)."""
    keyword: str = ""
    """``pytest -k`` expression narrowing ``tests`` (empty: all of them)."""
    sim_seeds: int | None = None
    """Seeds for the simulation step (None: the command-line default)."""


MUTANTS: tuple[Mutant, ...] = (
    # -- the six checks that could not fail --------------------------------------------------
    Mutant(
        "s7-checkpoint-pauses-only-beside-another-holder",
        "S7",
        "nurseries/_pending.py",
        "self.deadlines.pause(PAUSE_HOLDER)",
        "self.deadlines.pause(PAUSE_HOLDER) if self.deadlines.holders else None",
        (ORCH,),
        keyword="s7",
    ),
    Mutant(
        "s10-legacy-ownership-rule-off",
        "S10",
        "nurseries/_ownership.py",
        'if sess.kind == "legacy_agent" and sess.step_boundary is not None:',
        "if False:",
        (ORCH,),
        keyword="s10",
    ),
    Mutant(
        "s4-forget-the-whole-retire-queue",
        "S4",
        "nurseries/_coordinator.py",
        "await self.ledger.barrier.mutate(lambda: self.ledger.forget_retired(retired))",
        "await self.ledger.barrier.mutate(lambda: self.ledger.forget_retired("
        "list(self.ledger._retire)))",
        (ORCH, RACES),
        keyword="s4 or retire",
    ),
    Mutant(
        "s6-unknown-errors-retryable",
        "S6",
        "nurseries/_calls.py",
        "if not kinds or not kinds <= _RETRYABLE:",
        "if not kinds:",
        ("tests/test_config_metrics_errors.py", RACES),
        keyword="classify or error",
    ),
    Mutant(
        "c4-invariant-exits-4",
        "C4",
        "nurseries/_run.py",
        "FailureKind.INVARIANT: ExitCode.INVARIANT,",
        "FailureKind.INVARIANT: ExitCode.CHECKPOINTS_FAILED,",
        ("tests/test_config_metrics_errors.py",),
        keyword="exit_codes",
    ),
    Mutant(
        "s5-control-call-unbounded",
        "S5",
        "nurseries/_calls.py",
        "with trio.move_on_at(deadline + config.reply_grace_s) as scope:",
        "with trio.CancelScope() as scope:",
        (ORCH,),
        keyword="s5",
    ),
    # -- the three races put back -------------------------------------------------------------
    Mutant(
        "bug1-restore-installs-before-the-ledger-checks",
        "S8/C6",
        "nurseries/_restore.py",
        "found.raise_if_any(pinned.path)",
        "found.raise_if_any(pinned.path) if found.state else None",
        (RACES,),
        keyword="rejected",
    ),
    Mutant(
        "bug1-verify-skips-the-ledger",
        "C2/C6",
        "app/cli.py",
        "problems = snapshot_problems(snap).all",
        "problems = list(snapshot_problems(snap).state)",
        (RACES, "tests/test_bad_input.py"),
        keyword="ledger or verify",
    ),
    Mutant(
        "bug1-restore-not-all-or-nothing",
        "S8",
        "nurseries/_restore.py",
        "await _roll_back(gym, snap.manifest, episodes_by_replica, config)",
        "pass",
        (RACES,),
        keyword="restore_failing",
    ),
    Mutant(
        "bug2-snapshot-forgets-the-retire-queue",
        "S4/S11",
        "runtime/_ledger_snapshot.py",
        "retire=tuple(cols.retire_items()),",
        "retire=(),",
        (RACES,),
        keyword="dropped",
    ),
    Mutant(
        "bug2-restore-does-not-retire-dropped-attempts",
        "S4/S11",
        "nurseries/_restore.py",
        "await _retire_carried(gym, ledger, config)",
        "pass",
        (RACES,),
        keyword="dropped",
    ),
    Mutant(
        "bug3-late-stream-end-aborts",
        "S3/S6",
        "nurseries/_ownership.py",
        "unaccounted[name] = frozenset(missing)",
        'raise CheckpointInvariantError(f"{name}: {sample_ids(missing)} neither exported '
        'nor on the wire")',
        (RACES,),
        keyword="late",
    ),
    # -- other rules --------------------------------------------------------------------------
    Mutant(
        "s1-checkpoint-does-not-close-admission",
        "S1",
        "nurseries/_pending.py",
        "await self.gate.close(by=self.checkpoint_id)",
        "pass",
        (ORCH,),
        keyword="s1 or s9",
    ),
    Mutant(
        "s2-refusal-spends-an-attempt",
        "S2",
        "nurseries/_dispatcher.py",
        "elif isinstance(reply, Refused) and ledger.refuse(rid):",
        "elif isinstance(reply, Refused) and bool(ledger.abandon([rid])):",
        (ORCH,),
        keyword="s2",
    ),
    Mutant(
        "s2-whole-submission-refusal-kills-the-run",
        "S2",
        "nurseries/_dispatcher.py",
        "except GymAdmissionClosed:",
        "except ZeroDivisionError:",
        (RACES,),
        keyword="refused_as_a_whole",
    ),
    Mutant(
        "s3-exhausted-budget-leaves-gym-running",
        "S3",
        "nurseries/_dispatcher.py",
        "await self._retire_everything()",
        "pass",
        (RACES,),
        keyword="budget",
    ),
    Mutant(
        "s3-early-end-not-abandoned",
        "S3",
        "nurseries/_dispatcher.py",
        "abandoned = [rid for rid in outstanding if ledger.is_in_flight(rid)]",
        "abandoned: list[str] = []",
        (ORCH,),
        keyword="s3",
    ),
    Mutant(
        "s4-no-retire-stage",
        "S4",
        "nurseries/_coordinator.py",
        "await self._retire_dropped()",
        "pass",
        (ORCH,),
        keyword="s4",
    ),
    Mutant(
        "s4-drop-during-checkpoint-is-an-ownership-violation",
        "S4",
        "nurseries/_ownership.py",
        "gone = exported & {item.rollout_id for item in queued.get(name, ())}",
        "gone: frozenset[str] = frozenset()",
        (RACES, "tests/test_fault_matrix.py"),
        keyword="dropped",
    ),
    Mutant(
        "s8-live-topology-unchecked",
        "S8",
        "runtime/_store.py",
        "diffs.extend(topology_differences(snapshot.manifest, live))",
        "pass",
        (ORCH,),
        keyword="s8",
    ),
    Mutant(
        "s8-digests-unchecked-before-install",
        "S8",
        "runtime/_store.py",
        "problem = participant_state_problem(snapshot.path, p, where)",
        "problem = None",
        (ORCH,),
        keyword="s8",
    ),
    Mutant(
        "s9-drain-wakes-before-the-replies",
        "S9",
        "runtime/_drain.py",
        "settled = ledger.settled_check(pending)",
        "settled = lambda _rid: True  # noqa",
        (ORCH,),
        keyword="s9",
    ),
    Mutant(
        "s11-restored-episode-sent-to-any-replica",
        "S11",
        "nurseries/_dispatcher.py",
        "instance = restored.instance",
        "instance = live[next(self._rr) % len(live)]",
        (ORCH,),
        keyword="s11",
    ),
    Mutant(
        "s11-dropped-unclaimed-episode-not-retired",
        "S11",
        "runtime/_ledger_columns.py",
        "self._retire[restored[_FROM]] = self._intern(restored[_INSTANCE]) << 1 | 1",
        "return",
        (ORCH,),
        keyword="s11",
    ),
    Mutant(
        "s13-restore-reads-the-unpinned-snapshot",
        "S13",
        "nurseries/_restore.py",
        "pinned = await offload(lambda: store.pin(info, dest))",
        "pinned = info",
        (ORCH,),
        keyword="s13",
    ),
    Mutant(
        "fencing-stale-completion-accepted",
        "fencing",
        "runtime/_ledger_columns.py",
        "if s < 0 or self._state[s] != _DISPATCHED or self._gate[s] != gate_id:",
        "if s < 0 or self._state[s] != _DISPATCHED:",
        ("tests/test_ledger.py",),
    ),
    Mutant(
        "fencing-gym-lets-a-stale-attempt-mutate",
        "fencing",
        "gym_adapter/host/_slots.py",
        "return owner is None or owner[0] != ep.rollout_id",
        "return owner is None",
        ("tests/test_gym_conformance.py",),
        keyword="stale or fence",
    ),
    # -- a user's environment can be wrong in every way ---------------------------------------
    # two host paths of a slot changing hands that no test covered before
    Mutant(
        "host-journals-a-fenced-attempts-turn",
        "fencing",
        "gym_adapter/host/_slots.py",
        "if not touched or self._journal is None or self.fenced(ep):",
        "if not touched or self._journal is None:",
        (HOST_SLOTS,),
        keyword="fenced",
    ),
    Mutant(
        "host-retire-frees-a-newer-attempts-session",
        "fencing",
        "gym_adapter/host/_slots.py",
        'if self._owners.get(key, ("",))[0] == rollout_id:',
        "if key in self._owners:",
        (HOST_SLOTS,),
        keyword="retire",
    ),
    # the model capture: a restored attempt replays what an earlier one was answered, only that
    Mutant(
        "capture-replays-by-whole-key",
        "once",
        "gym_adapter/host/_episodes.py",
        "staged = calls.replay(digest)",
        "staged = calls.replay(digest) if key in ep.capture_keys else None",
        ("tests/test_host_episodes.py", UNALIGNED),
    ),
    Mutant(
        "capture-answers-a-changed-request",
        "once",
        "gym_adapter/host/_episodes.py",
        "staged = self.unreplayed.get(digest)",
        "staged = self.unreplayed.get(digest) or next(iter(self.unreplayed.values()), None)",
        ("tests/test_host_episodes.py",),
    ),
    # values a user hands over: finite plain data, or refused where they enter
    Mutant(
        "finite-host-takes-a-nan-reward",
        "finite",
        "gym_adapter/host/_episodes.py",
        "if not isinstance(reward, (int, float)) or not math.isfinite(reward):",
        "if not isinstance(reward, (int, float)):",
        (HOSTILE,),
        keyword="reward_that_is_not",
    ),
    Mutant(
        "finite-dispatcher-trusts-a-nan-reward",
        "finite",
        "nurseries/_dispatcher.py",
        "if type(reward) is float and math.isfinite(reward):",
        "if True:",
        (HOSTILE,),
        keyword="dispatcher_refuses",
    ),
    Mutant(
        "finite-ledger-writes-nan-as-null",
        "finite",
        "runtime/_snapshot_format.py",
        "if not math.isfinite(r.reward):",
        "if False:",
        (HOSTILE,),
        keyword="ledger_writer",
    ),
    Mutant(
        "data-failed-attempt-keeps-its-retained-session",
        "once",
        "gym_adapter/host/_host.py",
        "self._slots.release_quietly(ep.key, ep.rollout_id)",
        "pass",
        (HOSTILE, HOST_SLOTS),
        keyword="failed_attempts_retained or data_failed",
    ),
    # the retained sessions' journal: whole records, deterministic replay, failing closed
    Mutant(
        "journal-short-write-left-short",
        "journal",
        "gym_adapter/host/_journal.py",
        "while written < size:",
        "while False:",
        (JOURNAL,),
        keyword="short",
    ),
    Mutant(
        "journal-torn-tail-applied",
        "journal",
        "gym_adapter/host/_journal.py",
        "end = complete_length(data)",
        "end = len(data)",
        (JOURNAL,),
        keyword="torn",
    ),
    Mutant(
        "journal-io-error-escapes-as-oserror",
        "journal",
        "gym_adapter/host/_journal.py",
        'self._fail("appending a record", exc)',
        "raise",
        (JOURNAL,),
        keyword="full_disk",
    ),
    # trainer side: concurrent checkpoints, links in trainer files, the snapshot tools' lock
    Mutant(
        "pending-release-leaves-gym-parked",
        "S5",
        "nurseries/_pending.py",
        "if self._parked:",
        "if False:",
        ("tests/test_coordinator.py",),
        keyword="resume",
    ),
    Mutant(
        "checkpoint-concurrent-calls-not-serialized",
        "gate",
        "nurseries/_coordinator.py",
        "async with self._running:",
        "async with trio.CapacityLimiter(1):",
        ("tests/test_checkpoint_concurrency.py",),
    ),
    Mutant(
        "trainer-files-link-committed-as-a-link",
        "snapshot",
        "runtime/_store.py",
        "_copy_over(entry, entry)  # copyfile follows the link: the target's bytes",
        "pass",
        ("tests/test_trainer_files_links.py",),
        keyword="linked",
    ),
    # the snapshot format: strict records, versions checked
    Mutant(
        "marker-of-another-version-read",
        "snapshot",
        "runtime/_snapshot_format.py",
        "if marker.version != MARKER_VERSION:",
        "if False:",
        ("tests/test_snapshot_format.py",),
        keyword="version",
    ),
    Mutant(
        "records-read-in-the-role-their-keys-say",
        "snapshot",
        "runtime/_snapshot_format.py",
        "return structure(raw, expect if expect is not None else _role(raw), what)",
        "return structure(raw, _role(raw), what)",
        ("tests/test_snapshot_format.py",),
        keyword="another_role",
    ),
    Mutant(
        "converter-takes-any-iterable-as-a-list",
        "snapshot",
        "runtime/_converter.py",
        "if not isinstance(value, list | tuple):",
        "if False:",
        ("tests/test_snapshot_format.py",),
        keyword="bad_agent_records",
    ),
    Mutant(
        "prune-locks-the-directory-it-was-given",
        "lock",
        "app/snapshots.py",
        "lock_dir = workdir if workdir is not None else path",
        "lock_dir = path",
        ("tests/test_snapshot_tools_lock.py",),
        keyword="every_form",
    ),
    # SIGTERM paths
    Mutant(
        "preempt-second-signal-ignored",
        "preempt",
        "nurseries/_trainer.py",
        "self._final_scope.cancel()",
        "pass",
        (PREEMPT,),
        keyword="second_signal_cuts",
    ),
    Mutant(
        "preempt-final-checkpoint-unbounded",
        "preempt",
        "nurseries/_trainer.py",
        "with trio.move_on_after(self.preempt_timeout_s) as scope:",
        "with trio.CancelScope() as scope:",
        (PREEMPT,),
        keyword="bounded",
    ),
    Mutant(
        "preempt-waiting-trainer-not-woken",
        "preempt",
        "nurseries/_trainer.py",
        "for scope in self._waits:",
        "for scope in ():",
        (PREEMPT,),
        keyword="woken",
    ),
    # exactly once when an instance dies inside a journal write
    Mutant(
        "claim-lost-to-death-forgets-its-exported-id",
        "bug2",
        "runtime/_ledger_columns.py",
        "self._retire.setdefault(restored[_FROM], rep << 1)",
        "pass",
        ("tests/test_journal_failure_exactly_once.py",),
        keyword="whoever_settles",
    ),
    Mutant(
        "retire-answers-after-dying-inside-it",
        "fencing",
        "gym_adapter/host/_control.py",
        "raise GymInstanceDead(self.name, op)",
        "pass",
        ("tests/test_torn_retire_exactly_once.py",),
        keyword="dies_inside_a_retire",
    ),
    # -- the unaligned checkpoint's cut (issue 22) ----------------------------------------------
    # a reply produced after the cut is held until the checkpoint resumes
    Mutant(
        "unaligned-cut-does-not-hold-replies",
        "cut",
        "gym_adapter/host/_control.py",
        "self.streams.hold()",
        "pass",
        (UNALIGNED,),
        keyword="mid_turn_episode or scheduler_batch",
    ),
    Mutant(
        "unaligned-push-ignores-the-hold",
        "cut",
        "gym_adapter/host/_streams.py",
        "if self.holding:",
        "if False:",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-stream-with-held-replies-ends",
        "cut",
        "gym_adapter/host/_streams.py",
        "if st.rows_left <= 0 and not st.held:",
        "if st.rows_left <= 0:",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-resume-keeps-replies-held",
        "cut",
        "gym_adapter/host/_control.py",
        "self._reopen()",
        "self.parking.reopen()",
        (UNALIGNED,),
        nth=1,
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-lease-keeps-replies-held",
        "cut",
        "gym_adapter/host/_control.py",
        "self._reopen()",
        "self.parking.reopen()",
        (UNALIGNED,),
        nth=2,
        keyword="lease",
    ),
    Mutant(
        "unaligned-second-commit-keeps-the-first-cuts-replies-held",
        "cut",
        "gym_adapter/host/_control.py",
        "self.streams.release()  # held since an earlier cut of this checkpoint: before this one",
        "pass",
        (UNALIGNED,),
        keyword="second_commit",
    ),
    # a mid-turn episode is taken at its last step boundary, not as its turn left it
    Mutant(
        "unaligned-cut-exports-the-live-sessions",
        "cut",
        "gym_adapter/host/_cut.py",
        "dict(zip(names, states, strict=True)),",
        "{p.name: to_plain(p.export(c.ep.sessions[p.name])) for p in participants},",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-cut-marks-every-episode-where-it-is",
        "cut",
        "gym_adapter/host/_control.py",
        "            if ep.mark is None or ep.mark.turn != ep.turn:",
        "            if True:",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-mark-not-remade-at-the-next-boundary",
        "cut",
        "gym_adapter/host/_turns.py",
        "if armed and (ep.mark is None or ep.mark.turn != ep.turn):",
        "if armed and ep.mark is None:",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    Mutant(
        "unaligned-host-keeps-no-boundary-marks",
        "cut",
        "gym_adapter/host/_host.py",
        'if config.boundary_marks == "always" and self.environment.unaligned:',
        "if False:",
        (UNALIGNED,),
        keyword="mid_turn_episode",
    ),
    # what the cut took is fixed at the cut, not read again while the records are written
    Mutant(
        "unaligned-cut-shares-the-staged-calls",
        "cut",
        "gym_adapter/host/_cut.py",
        "taken.append(CutEpisode(ep, mark, tuple(ep.staged), ep.stepping))",
        "taken.append(CutEpisode(ep, mark, ep.staged, ep.stepping))",
        (UNALIGNED,),
        keyword="scheduler_batch",
    ),
    Mutant(
        "unaligned-cut-records-the-live-turn",
        "cut",
        "gym_adapter/host/_cut.py",
        "turn=c.mark.turn,",
        "turn=c.ep.turn,",
        (UNALIGNED,),
        keyword="scheduler_batch",
    ),
    # nothing parks; an environment that opts out parks
    Mutant(
        "unaligned-prepare-parks",
        "cut",
        "gym_adapter/host/_parking.py",
        "self.parks = park",
        "self.parks = True",
        (UNALIGNED,),
        keyword="parks_nothing",
    ),
    Mutant(
        "unaligned-held-episode-parks",
        "cut",
        "gym_adapter/host/_parking.py",
        "if not self.parks and ep.state == BOUNDARY:  # unaligned: a held episode goes on",
        "if False:",
        (UNALIGNED,),
        keyword="parks_nothing",
    ),
    Mutant(
        "unaligned-opted-out-environment-not-parked",
        "cut",
        "gym_adapter/host/_control.py",
        "park = mode is CheckpointMode.ALIGNED or not self.environment.unaligned",
        "park = mode is CheckpointMode.ALIGNED",
        (UNALIGNED,),
        keyword="opts_out",
    ),
    Mutant(
        "unaligned-trainer-prepares-aligned",
        "cut",
        "nurseries/_pending.py",
        "mode=config.checkpoint_mode,",
        "mode=CheckpointMode.ALIGNED,",
        (UNALIGNED,),
        keyword="through_the_trainer",
    ),
    # -- C7: the HTTP wire's security rules and acknowledgement ---------------------------------
    Mutant(
        "c7-token-prefix-accepted",
        "C7",
        "gym_adapter/transports/http/_guard.py",
        "if not hmac.compare_digest(given.strip(), token):",
        "if not token.startswith(given.strip()):",
        (HTTP_SECURITY,),
        keyword="bearer_token",
        sim_seeds=0,
    ),
    Mutant(
        "c7-symlink-out-of-the-state-root",
        "C7",
        "gym_adapter/transports/http/_guard.py",
        "resolved = candidate.resolve(strict=False)",
        'resolved = Path(__import__("os").path.abspath(candidate))',
        (HTTP_SECURITY,),
        keyword="outside_the_state_root",
        sim_seeds=0,
    ),
    Mutant(
        "c7-refused-request-applies-its-acks",
        "C7",
        "gym_adapter/transports/http/_app.py",
        'self._check_fault(req.fault, f"control {op}")',
        'self._outboxes.apply_acks(req.acks); self._check_fault(req.fault, f"control {op}")',
        (HTTP_SECURITY,),
        keyword="faults_are_refused",
        sim_seeds=0,
    ),
    Mutant(
        "c7-body-read-to-its-end-before-the-limit",
        "C7",
        "gym_adapter/transports/http/_guard.py",
        "if size > limit:",
        'if size > limit and not message.get("more_body", False):',
        (HTTP_SECURITY,),
        keyword="oversized_body",
        sim_seeds=0,
    ),
    Mutant(
        "c7-disconnect-not-watched",
        "C7",
        "gym_adapter/transports/http/_app.py",
        "nursery.start_soon(_cancel_when, _disconnected(receive), nursery.cancel_scope)",
        "pass",
        (HTTP_SERVER,),
        keyword="disconnect",
        sim_seeds=0,
    ),
    Mutant(
        "c7-reply-off-the-wire-when-sent",
        "C7",
        "gym_adapter/transports/http/_app.py",
        "seq = box.register(replies)",
        "seq = box.register(replies); box.ack(seq)",
        (HTTP_SERVER,),
        keyword="acks_free_them",
        sim_seeds=0,
    ),
    # concurrent model calls (issue 31 finding 2): a call is (turn, request digest, occurrence)
    Mutant(
        "call-id-from-start-order",
        "once",
        "gym_adapter/host/_episodes.py",
        "taken = self.taken.setdefault(digest[:CALL_DIGEST_HEX], set())",
        'taken = self.taken.setdefault("", set())',
        ("tests/test_host_episodes.py", "tests/test_concurrent_calls.py"),
        sim_seeds=0,
    ),
    Mutant(
        "call-occurrence-ignores-staged-calls",
        "once",
        "gym_adapter/host/_episodes.py",
        "while n in taken:",
        "while False:",
        ("tests/test_host_episodes.py", "tests/test_concurrent_calls.py"),
        sim_seeds=0,
    ),
    Mutant(
        "replay-by-start-order",
        "once",
        "gym_adapter/host/_episodes.py",
        "staged = self.unreplayed.get(digest)",
        "staged = next(iter(self.unreplayed.values()), None)",
        ("tests/test_concurrent_calls.py", "tests/test_host_episodes.py"),
        sim_seeds=0,
    ),
    Mutant(
        "replay-from-any-turn",
        "once",
        "gym_adapter/host/_episodes.py",
        "if call.turn == ep.turn:",
        "if call.turn <= ep.turn:",
        ("tests/test_host_episodes.py", "tests/test_concurrent_calls.py"),
        sim_seeds=0,
    ),
    Mutant(
        "restored-turn-may-leave-a-staged-call-unasked",
        "once",
        "gym_adapter/host/_turns.py",
        "if ep.inherited:  # a restored turn asked again every call staged for it",
        "if False:",
        ("tests/test_concurrent_calls.py", "tests/test_conformance_kit.py"),
    ),
    # -- row order, epochs, JSONL rows, policy version (issue 31: findings 1, 8, 11) ----------
    Mutant(
        "resume-from-max-row",
        "§2f",
        "nurseries/_trainer.py",
        "remaining = iter(range(ledger.next_row, len(order)))",
        "remaining = iter(p for p in range(len(order)) if order.row_at(p) >= ledger.next_row)",
        ("tests/test_row_order_crash.py",),
        keyword="shuffled",
        sim_seeds=0,
    ),
    Mutant(
        "epoch-order-not-seeded",
        "§2f",
        "runtime/_row_order.py",
        'f"gymckpt-row-order:{seed}:{epoch}"',
        'f"gymckpt-row-order:{epoch}"',
        ("tests/test_row_order.py",),
        keyword="pure_function",
        sim_seeds=0,
    ),
    Mutant(
        "epoch-order-same-every-epoch",
        "§2f",
        "runtime/_row_order.py",
        'f"gymckpt-row-order:{seed}:{epoch}"',
        'f"gymckpt-row-order:{seed}"',
        ("tests/test_row_order.py",),
        keyword="pure_function",
        sim_seeds=0,
    ),
    Mutant(
        "order-spec-not-checked",
        "§2f",
        "nurseries/_restore.py",
        "functools.partial(check_order, saved_order, order, ledger_snap.next_row, str(info.path))",
        "functools.partial(lambda *_: None, saved_order, order, ledger_snap.next_row, '')",
        ("tests/test_row_order.py",),
        keyword="another_seed",
        sim_seeds=0,
    ),
    Mutant(
        "repeated-rows-accepted",
        "§2f",
        "runtime/_row_order.py",
        "if first != position:",
        "if False:",
        ("tests/test_row_order.py",),
        keyword="bad_orders",
        sim_seeds=0,
    ),
    Mutant(
        "epoch-sessions-shared",
        "§2f",
        "gym_adapter/host/_episode.py",
        'return f"{self.row}-{self.slot}" if m is None else m.group(1)',
        'return f"{self.row}-{self.slot}"',
        ("tests/test_row_order.py",),
        keyword="two_slots",
        sim_seeds=0,
    ),
    Mutant(
        "policy-version-not-restored",
        "§2f",
        "nurseries/_trainer.py",
        "dispatcher.policy_version = restored.policy_version",
        "dispatcher.policy_version = 0",
        ("tests/test_row_order.py",),
        keyword="policy_version",
        sim_seeds=0,
    ),
    Mutant(
        "policy-version-not-saved",
        "§2f",
        "nurseries/_trainer.py",
        "StepRecord(self._first_step + self._handed, self.dispatcher.policy_version)",
        "StepRecord(self._first_step + self._handed)",
        ("tests/test_row_order.py",),
        keyword="policy_version",
        sim_seeds=0,
    ),
    Mutant(
        "jsonl-duplicate-keys-kept",
        "§2f",
        "runtime/_dataset.py",
        "if len(obj) != len(pairs):",
        "if False:",
        ("tests/test_dataset.py",),
        keyword="jsonl",
        sim_seeds=0,
    ),
    Mutant(
        "jsonl-big-int-becomes-float",
        "§2f",
        "runtime/_dataset.py",
        'task = decode(line.decode("utf-8"))',
        "task = orjson.loads(line)",
        ("tests/test_dataset.py",),
        keyword="jsonl",
        sim_seeds=0,
    ),
    # -- the simulation's real-usage dimension: liveness (issue 31 item 6) ---------------------
    Mutant(
        "sim-liveness-watch-not-bounding",
        "liveness",
        "app/simulation/life.py",
        "                self.liveness.scope,",
        "",
        ("tests/test_sim_usage.py",),
        keyword="liveness",
        sim_seeds=0,
    ),
    Mutant(
        "sim-liveness-moves-not-counted",
        "liveness",
        "app/simulation/liveness.py",
        '            self._liveness.moved(f"{len(replies)} attempt(s) resolved")',
        "            pass",
        ("tests/test_sim_usage.py",),
        keyword="liveness or moves",
        sim_seeds=0,
    ),
    # -- issue 31: one server per instance directory, paths confined, NeMo Gym's shapes ------
    Mutant(
        "serve-no-instance-lock",
        "2g",
        "gym_adapter/transports/http/_serve.py",
        "lock.acquire()  # first: a second server of this instance must change nothing",
        "pass",
        ("tests/test_http_instance_lock.py",),
        sim_seeds=0,
    ),
    Mutant(
        "host-no-instance-lock",
        "2g",
        "gym_adapter/host/_host.py",
        "lock.acquire()  # before the journal is opened (and, without recover, cut)",
        "pass",
        (JOURNAL,),
        keyword="second_host",
        sim_seeds=0,
    ),
    Mutant(
        "state-root-follows-symlink",
        "2g",
        "gym_adapter/transports/http/_guard.py",
        "if not stat.S_ISLNK(mode):",
        "if True:",
        (HTTP_SECURITY,),
        keyword="symlink_below",
        sim_seeds=0,
    ),
    Mutant(
        "token-file-no-excl",
        "2g",
        "runtime/_store.py",
        "flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC",
        "flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC",
        (HTTP_SECURITY,),
        keyword="link",
        sim_seeds=0,
    ),
    Mutant(
        "wire-flat-task",
        "2g",
        "gym_adapter/transports/http/_wire.py",
        "task: _Task",
        "task_input: _Task",
        ("tests/test_http_wire.py",),
        keyword="released_shapes",
        sim_seeds=0,
    ),
    Mutant(
        "wire-failure-stage-not-nemo",
        "2g",
        "gym_adapter/transports/http/_wire.py",
        'else KIND_DATA, "agent"',
        'else KIND_DATA, "rollout"',
        ("tests/test_http_wire.py",),
        keyword="released_shapes",
        sim_seeds=0,
    ),
    Mutant(
        "wire-failure-reason-not-cut",
        "2g",
        "gym_adapter/transports/http/_wire.py",
        "if len(message) > FAILURE_REASON_MAX:",
        "if False:",
        ("tests/test_http_wire.py",),
        keyword="released_shapes",
        sim_seeds=0,
    ),
    # -- trainer terms: a trainer can always come back (issue 31, finding 3) ---------------------
    Mutant(
        "term-restore-does-not-fence",
        "fencing",
        "nurseries/_restore.py",
        "await attach_trainer(gym, trainer, config)",
        "pass",
        (HTTP_FENCING,),
        keyword="mid_run",
        sim_seeds=0,
    ),
    Mutant(
        "term-takeover-without-fencing",
        "fencing",
        "gym_adapter/host/_host.py",
        "episodes, sessions, aborted = self._control.fence()",
        "episodes, sessions, aborted = 0, 0, None",
        (TENANCY,),
        sim_seeds=0,
    ),
    Mutant(
        "term-fence-keeps-sessions",
        "fencing",
        "gym_adapter/host/_control.py",
        "self.slots.install((), {}, ())",
        "pass",
        (TENANCY,),
        keyword="newer_term_fences",
        sim_seeds=0,
    ),
    Mutant(
        "term-fence-leaves-checkpoint-open",
        "fencing",
        "gym_adapter/host/_control.py",
        "if aborted is not None:",
        "if False:",
        (TENANCY,),
        keyword="newer_term_fences or prepare_of_the_fenced",
        sim_seeds=0,
    ),
    Mutant(
        "term-fenced-term-calls-admitted",
        "fencing",
        "gym_adapter/host/_tenancy.py",
        "if caller.term < holder.term:",
        "if False:",
        (TENANCY,),
        nth=2,
        sim_seeds=0,
    ),
    Mutant(
        "term-second-run-admitted",
        "fencing",
        "gym_adapter/host/_tenancy.py",
        "if holder.lineage != caller.lineage:",
        "if False:",
        (TENANCY,),
        keyword="another_lineage",
        sim_seeds=0,
    ),
    Mutant(
        "term-second-run-refusal-exits-3",
        "C4",
        "nurseries/_calls.py",
        "if in_use:  # another trainer holds the instance: that decides, as itself (exit code 2)",
        "if False:",
        (HTTP_FENCING,),
        keyword="second_trainer",
        sim_seeds=0,
    ),
    Mutant(
        "term-fenced-trainer-aborts-as-invariant",
        "C4",
        "nurseries/_coordinator.py",
        "except GymInUse:  # a newer trainer of this run fenced this one: it stops (exit 2)",
        "except ZeroDivisionError:",
        (TENANCY,),
        keyword="fenced_trainer_stops",
        sim_seeds=0,
    ),
    Mutant(
        "term-finished-run-keeps-its-servers",
        "fencing",
        "nurseries/_trainer.py",
        "await release_trainer(gym, trainer, config)",
        "pass",
        (TENANCY,),
        keyword="releases",
        sim_seeds=0,
    ),
    Mutant(
        "term-http-header-not-read",
        "fencing",
        "gym_adapter/transports/http/_app.py",
        "trainer = _trainer_of(headers)",
        "trainer = None",
        (HTTP_FENCING,),
        keyword="late_requests",
        sim_seeds=0,
    ),
    # -- liveness and outages (issue 31: findings 6, 7) -------------------------------------------
    Mutant(
        "last-inflight-failure-no-wakeup",
        "liveness",
        "nurseries/_dispatcher.py",
        "self._kick.set()",
        "pass",
        ("tests/test_liveness.py",),
        nth=3,
        sim_seeds=0,
    ),
    Mutant(
        "fastapi-detail-shown-raw",
        "model client",
        "gym_adapter/environments/openai_model.py",
        'if "error" not in value and "detail" in value:',
        "if False:",
        ("tests/test_openai_model.py",),
        keyword="fastapi",
        sim_seeds=0,
    ),
    Mutant(
        "infra-failure-spends-row-attempt",
        "outages",
        "runtime/_ledger.py",
        'spend=cls == "data"',
        "spend=True",
        ("tests/test_dispatcher.py", "tests/test_ledger.py"),
        keyword="outage or infra",
        sim_seeds=0,
    ),
    Mutant(
        "outage-budget-never-checked",
        "outages",
        "nurseries/_outage.py",
        "if down_s > self.config.outage_budget_s:",
        "if False:",
        ("tests/test_dispatcher.py",),
        keyword="past_its_budget",
        sim_seeds=0,
    ),
    Mutant(
        "replacement-no-backoff",
        "outages",
        "nurseries/_replace.py",
        "if delay > 0:",
        "if False:",
        ("tests/test_host_journal.py", "tests/test_replace.py"),
        keyword="1_5 or dies_before",
        sim_seeds=0,
    ),
    Mutant(
        "replacement-outage-charged-as-crash",
        "outages",
        "nurseries/_replace.py",
        "crashed = not outage.is_down",
        "crashed = True",
        ("tests/test_host_journal.py", "tests/test_replace.py"),
        keyword="1_5 or dies_before",
        sim_seeds=0,
    ),
    Mutant(
        "served-instance-stays-in-outage",
        "outages",
        "nurseries/_dispatcher.py",
        "self.replacer.served(instance)",
        "pass",
        ("tests/test_replace.py",),
        keyword="crashes_after",
        sim_seeds=0,
    ),
    Mutant(
        "unreachable-stream-spends-row-attempt",
        "outages",
        "nurseries/_dispatcher.py",
        "unreachable = exc",
        "pass",
        ("tests/test_dispatcher.py",),
        keyword="unreachable",
        sim_seeds=0,
    ),
    Mutant(
        "concurrent-model-unavailable-is-data",
        "outages",
        "gym_adapter/host/_turns.py",
        "unavailable = model_unavailable(exc)",
        "unavailable = exc if isinstance(exc, ModelUnavailable) else None",
        ("tests/test_host_turns.py",),
        keyword="concurrent_calls",
        sim_seeds=0,
    ),
    # -- a fence wrapped in the agent's own nursery is still the fence ---------------------------
    Mutant(
        "fence-in-a-nursery-is-data",
        "fencing",
        "gym_adapter/host/_turns.py",
        "if fenced_in(exc):  # the agent's own nursery or task group wrapped the fence",
        "if False:",
        ("tests/test_host_turns.py",),
        keyword="nursery",
        sim_seeds=0,
    ),
    # -- the simulation's real usage after the merges (sim2) ------------------------------------
    Mutant(
        "refused-attach-switches-the-embedded-term",
        "fencing",
        "gym_adapter/transports/_embedded.py",
        "reply = await sim.attach(trainer, deadline_ts)",
        "self._trainer = trainer; reply = await sim.attach(trainer, deadline_ts)",
        (TENANCY,),
        keyword="refused_attach",
        sim_seeds=0,
    ),
    Mutant(
        "restore-topology-does-not-replace-the-dead",
        "restore",
        "nurseries/_restore.py",
        "if not dead or not can_replace(gym) or replaced >= config.max_replacements:",
        "if True:",
        (TENANCY,),
        keyword="outlived",
        sim_seeds=0,
    ),
    Mutant(
        "sentinel-per-dataset-row",
        "verdict",
        "gym_adapter/environments/calendar.py",
        'f"sentinel:{key}:t{turn}"',
        "sentinel(info.row, info.slot, turn)",
        ("tests/test_sim_usage.py",),
        keyword="once_per_epoch",
        sim_seeds=0,
    ),
    # -- the alignment timeout: aligned checkpoints complete whatever the turn length ----------
    Mutant(
        "alignment-timeout-ignored",
        "align",
        "nurseries/_pending.py",
        "alignment_timeout_s=config.alignment_timeout_s,",
        "alignment_timeout_s=None,",
        (ALIGNMENT,),
        keyword="longer_than",
    ),
    Mutant(
        "alignment-timeout-ignored-by-the-host",
        "align",
        "gym_adapter/host/_control.py",
        "if alignment_timeout_s is not None and self.environment.unaligned:",
        "if False:",
        (ALIGNMENT,),
        keyword="longer_than",
    ),
    Mutant(
        "alignment-timeout-not-sent-over-http",
        "align",
        "gym_adapter/transports/_remote.py",
        'args["alignment_timeout_s"] = float(alignment_timeout_s)',
        "pass",
        (ALIGNMENT,),
        keyword="another_process and http",
        sim_seeds=0,
    ),
    Mutant(
        "alignment-timeout-ignored-by-the-server",
        "align",
        "gym_adapter/transports/_verbs.py",
        'args.get("alignment_timeout_s"),',
        "None,",
        (ALIGNMENT,),
        keyword="another_process and http",
        sim_seeds=0,
    ),
    Mutant(
        "timed-out-episode-dropped-from-cut",
        "align",
        "gym_adapter/host/_control.py",
        "if ep.state != DONE and not self.slots.fenced(ep)",
        "if ep.state != DONE and not self.slots.fenced(ep)"
        " and (ep.state == BOUNDARY or not self.parking.parks)",
        (ALIGNMENT,),
        keyword="longer_than",
    ),
    Mutant(
        "timed-out-commit-not-a-cut",
        "align",
        "gym_adapter/host/_control.py",
        "if not parking.parks or parking.alignment_timed_out:",
        "if not parking.parks:",
        (ALIGNMENT,),
        keyword="longer_than",
    ),
    Mutant(
        "alignment-timeout-cuts-an-opted-out-environment",
        "align",
        "gym_adapter/host/_control.py",
        "if alignment_timeout_s is not None and self.environment.unaligned:",
        "if alignment_timeout_s is not None:",
        (ALIGNMENT,),
        keyword="opts_out",
    ),
    Mutant(
        "alignment-timeout-not-below-the-control-timeout",
        "align",
        "runtime/_config.py",
        "if self.alignment_timeout_s >= self.control_timeout_s:",
        "if False:",
        (ALIGNMENT,),
        keyword="below",
        sim_seeds=0,
    ),
    # -- the backend conformance kit's real-usage checks (issue 31 item 10) --------------------
    Mutant(
        "kit-attach-fences-nothing",
        "trainer terms",
        "gym_adapter/host/_host.py",
        "episodes, sessions, aborted = self._control.fence()",
        "episodes, sessions, aborted = 0, 0, None",
        (BACKEND_KIT,),
        keyword="embedded_calendar",
        sim_seeds=0,
    ),
    Mutant(
        "kit-fence-leaves-episodes-running",
        "trainer terms",
        "gym_adapter/host/_control.py",
        "for ep in active:",
        "for ep in ():",
        (BACKEND_KIT,),
        keyword="embedded_calendar",
        sim_seeds=0,
    ),
    Mutant(
        "kit-fence-keeps-checkpoint-open",
        "trainer terms",
        "gym_adapter/host/_control.py",
        "if aborted is not None:",
        "if False:",
        (BACKEND_KIT,),
        keyword="embedded_calendar",
        sim_seeds=0,
    ),
    Mutant(
        "kit-second-lineage-attaches",
        "trainer terms",
        "gym_adapter/host/_tenancy.py",
        "if not self.released:",
        "if False:",
        (BACKEND_KIT,),
        keyword="embedded_calendar",
        sim_seeds=0,
    ),
    Mutant(
        "kit-shuffled-resume-from-max-row",
        "§2f",
        "nurseries/_trainer.py",
        "remaining = iter(range(ledger.next_row, len(order)))",
        "remaining = iter(p for p in range(len(order)) if order.row_at(p) >= ledger.next_row)",
        (BACKEND_KIT,),
        keyword="embedded_calendar",
        sim_seeds=0,
    ),
    Mutant(
        "kit-fence-leaves-taken-batches-on-wire",
        "trainer terms",
        "gym_adapter/host/_streams.py",
        "self.on_wire.clear()",
        "pass",
        (TENANCY,),
        keyword="transport_took",
        sim_seeds=0,
    ),
    Mutant(
        "kit-http-refused-ack-raises",
        "trainer terms",
        "gym_adapter/transports/http/_gym.py",
        "suppress(GymUnavailable, GymInUse)",
        "suppress(GymUnavailable)",
        ("tests/test_http_backend.py",),
        keyword="ack_refused",
        sim_seeds=0,
    ),
    # -- a replacement serves the dead instance's holder until a newer term attaches ----------
    Mutant(
        "replacement-adopts-the-newer-term",
        "fencing",
        "gym_adapter/transports/_embedded.py",
        "holder = old.trainer if old.trainer is not None else self._trainer",
        "holder = self._trainer if self._trainer is not None else old.trainer",
        ("tests/test_host_tenancy.py",),
        keyword="keeps_the_dead",
    ),
    Mutant(
        "replacement-keeps-a-released-holder",
        "fencing",
        "gym_adapter/transports/_embedded.py",
        "if old.released:",
        "if False:",
        ("tests/test_host_tenancy.py",),
        keyword="released_instance",
        sim_seeds=0,
    ),
    # -- docs: the reference and the help generated from the code (issue 32) ------------------
    Mutant(
        "c4-help-leaves-out-an-exit-code",
        "C4",
        "app/cli.py",
        "for code in ExitCode",
        "for code in ExitCode if code != ExitCode.INTERRUPTED",
        ("tests/test_docs.py",),
        keyword="exit_code",
        sim_seeds=0,
    ),
    Mutant(
        "docs-anchors-are-not-targets",
        "C1",
        "docs/_ext/gymckpt_docs.py",
        'source[0] = _ANCHOR.sub(r"(\\1)=", source[0])',
        "pass",
        ("tests/test_docs.py",),
        keyword="broken_link",
        sim_seeds=0,
    ),
    # -- benchmarks: results outside the package, verdicts, no function over 80 lines --------
    Mutant(
        "bench-results-default-inside-the-package",
        "bench",
        "benchmarks/cli.py",
        'DEFAULT_OUT = Path("benchmark-results")',
        'DEFAULT_OUT = Path(__file__).resolve().parent / "results"',
        ("tests/test_benchmarks_smoke.py",),
        keyword="current_directory_by_default",
        sim_seeds=0,
    ),
    Mutant(
        "bench-dirty-tree-written-into-the-committed-results",
        "bench",
        "benchmarks/cli.py",
        "if dirty and out.resolve() == COMMITTED_RESULTS.resolve() and not args.allow_dirty:",
        "if False:",
        ("tests/test_benchmarks_smoke.py",),
        keyword="dirty_tree",
        sim_seeds=0,
    ),
    Mutant(
        "bench-a-figure-at-another-size-meets-its-target",
        "bench",
        "benchmarks/report/_targets.py",
        "if ok is None or not exact_size",
        "if ok is None",
        ("tests/test_benchmarks_smoke.py",),
        keyword="targets_verdicts",
        sim_seeds=0,
    ),
    Mutant(
        "bench-ratio-over-zero",
        "bench",
        "benchmarks/report/_format.py",
        "return None if a is None or b is None or b <= 0 else a / b",
        "return None if a is None or b is None else a / b",
        ("tests/test_benchmark_report.py",),
        keyword="modes_section",
        sim_seeds=0,
    ),
    Mutant(
        "function-length-limit-off-by-one",
        "layout",
        "tests/test_function_length.py",
        "if lines > limit:",
        "if lines > limit + 1:",
        ("tests/test_function_length.py",),
        sim_seeds=0,
    ),
    # -- remote transports: the contract's verbs once over one primitive (issue 32) -------------
    Mutant(
        "remote-dead-instance-counts-a-call",
        "C3",
        "gym_adapter/transports/_remote.py",
        "self._incarnations.live(instance, op)  # a dead instance counts no call",
        "pass",
        ("tests/test_remote_gym.py",),
        sim_seeds=0,
    ),
    Mutant(
        "remote-attach-records-no-term",
        "trainer terms",
        "gym_adapter/transports/_remote.py",
        "self._trainer = trainer",
        "pass",
        ("tests/test_remote_gym.py",),
        sim_seeds=0,
    ),
    Mutant(
        "remote-view-draws-a-fault",
        "C3",
        "gym_adapter/transports/_remote.py",
        "return await self._call(instance, op, args or {}, None)",
        "return await self._call(instance, op, args or {}, None, self._plan.check(op))",
        ("tests/test_remote_gym.py",),
        sim_seeds=0,
    ),
    Mutant(
        "remote-dead-instance-reports-zeros",
        "statistics",
        "gym_adapter/transports/_remote.py",
        "self._last_stats[name] = st",
        "pass",
        ("tests/test_remote_gym.py",),
        sim_seeds=0,
    ),
    Mutant(
        "replacement-count-counts-every-instance",
        "replacement",
        "gym_adapter/transports/_deployment.py",
        "return sum(1 for r in self._replacements if r.instance == instance)",
        "return len(self._replacements)",
        ("tests/test_remote_gym.py", "tests/test_embedded.py"),
        sim_seeds=0,
    ),
    # -- issue 32, names: our packages share plumbing through a package's _shared only -------
    Mutant(
        "layers-private-module-beside-the-shared-door",
        "layers",
        "app/snapshots.py",
        "from gymckpt.runtime._shared import COMMIT_MARKER, RESTORED_DIR, SNAPSHOTS_DIR, tree_size",
        "from gymckpt.runtime._store import tree_size; "
        "from gymckpt.runtime._shared import COMMIT_MARKER, RESTORED_DIR, SNAPSHOTS_DIR",
        ("tests/test_layers.py",),
        keyword="layers_hold",
    ),
    # -- issue 32, the environments room: one seeding helper, the public episode API only ------
    Mutant(
        "derive-seed-drops-its-namespace",
        "environments",
        "gym_adapter/environments/_seeding.py",
        'digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()',
        'digest = hashlib.sha256(":".join(map(str, parts[1:])).encode()).digest()',
        ("tests/test_environment_seeding.py",),
        sim_seeds=0,
    ),
    Mutant(
        "host-imports-the-gymnasium-adapter",
        "layers",
        "gym_adapter/host/_load.py",
        "factory = getattr(importlib.import_module(module_name), attr)",
        "from ..environments.gymnasium import gymnasium_environment as factory",
        ("tests/test_layers.py",),
        keyword="the_layers_hold",
        sim_seeds=0,
    ),
    Mutant(
        "environment-imports-the-host-privately",
        "layers",
        "gym_adapter/environments/openai_model.py",
        "from gymckpt.gym_adapter import (",
        "from gymckpt.gym_adapter.host._episode import (",
        ("tests/test_layers.py",),
        keyword="the_layers_hold",
        sim_seeds=0,
    ),
    Mutant(
        "calendar-config-not-sent-to-a-server",
        "environments",
        "gym_adapter/environments/calendar.py",
        "return {CONFIG_ENV: json.dumps(attrs.asdict(self))}",
        "return {CONFIG_ENV: json.dumps({})}",
        ("tests/test_calendar_env.py",),
        keyword="crosses_to_a_server",
        sim_seeds=0,
    ),
    Mutant(
        "calendar-serve-path-ignores-the-agent-kind",
        "environments",
        "gym_adapter/environments/calendar.py",
        'return f"{__name__}:calendar_from_environ_{agent_kind}"',
        'return f"{__name__}:calendar_from_environ_simple_agent"',
        ("tests/test_load.py",),
        keyword="named_like_any_other",
        sim_seeds=0,
    ),
    # -- issue 33, chaos: a crash changes nothing, and chaos notices when it does ------------
    Mutant(
        "chaos-digests-never-compared",
        "chaos",
        "app/chaos/run.py",
        "return {name: self.digests.get(name) == hex for name, hex in baseline.digests.items()}",
        "return {name: True for name, hex in baseline.digests.items()}",
        ("tests/test_chaos.py",),
        keyword="not_exactly_once",
        sim_seeds=0,
    ),
    Mutant(
        "chaos-stage-kill-never-lands",
        "chaos",
        "app/chaos/points.py",
        "if kill_at == (stage, n):",
        "if kill_at == (stage, -n):",
        ("tests/test_chaos.py",),
        keyword="not_exactly_once",
        sim_seeds=0,
    ),
    Mutant(
        "demo-verdict-counts-steps-before-a-fresh-start",
        "S12",
        "app/demo/journal.py",
        "            steps = []",
        "            pass",
        ("tests/test_demo_crash.py", "tests/test_demo_journal.py"),
        sim_seeds=0,
    ),
    # -- gymckpt train: deterministic training (issue 33) ----------------------------------------
    Mutant(
        "train-batch-in-completion-order",
        "train-deterministic",
        "app/train/loop.py",
        "return sorted(batch, key=lambda group: group.position)",
        "return list(batch)",
        ("tests/test_train_crash.py",),
    ),
    Mutant(
        "train-sampling-seeded-by-attempt",
        "train-deterministic",
        "app/train/loop.py",
        "rng = sampling_rng(options.seed, info.session_key, call.turn, call.occurrence)",
        "rng = sampling_rng(options.seed, info.rollout_id, call.turn, call.occurrence)",
        ("tests/test_train_crash.py",),
    ),
    # A runtime bug only the learner's weights expose: an episode restored from a checkpoint
    # resumes one turn late, so its decisions sample other actions (an altered rollout). The
    # weights after a SIGKILL differ; `gymckpt chaos` on CartPole reports DIFFERS (issue 33).
    Mutant(
        "train-restored-episode-resumes-a-turn-late",
        "train-deterministic",
        "gym_adapter/host/_host.py",
        "            turn=old.turn,",
        "            turn=old.turn + 1,",
        ("tests/test_train_crash.py",),
        keyword="sigkill",
        sim_seeds=0,
    ),
    Mutant(
        "train-journal-not-restored",
        "train-deterministic",
        "app/train/loop.py",
        'str(saved.get("journal", EMPTY_JOURNAL))',
        "EMPTY_JOURNAL",
        ("tests/test_train_crash.py",),
        keyword="sigkill",
        sim_seeds=0,
    ),
    Mutant(
        "train-journal-ignores-results",
        "train-deterministic",
        "app/train/loop.py",
        "[[float(r.reward).hex(), r.turns] for r in g.results]",
        "len(g.results)",
        ("tests/test_train.py",),
        keyword="journal",
        sim_seeds=0,
    ),
    # -- issue 33, weights: the model server's weights across a trainer crash; require= ------
    Mutant(
        "weights-version-check-skipped",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "if response is not None and (expected is None or served == str(expected)):",
        "if response is not None:",
        ("tests/test_model_weight_sync.py",),
        sim_seeds=0,
    ),
    Mutant(
        "weights-restore-hook-not-called",
        "weights",
        "nurseries/_trainer.py",
        "await on_restore(restored.policy_version, files if is_dir else None)",
        "pass",
        ("tests/test_model_weight_sync.py",),
        keyword="resynced",
        sim_seeds=0,
    ),
    Mutant(
        "weights-require-ignored",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "            if not _has_field(response, name):",
        "            if False:",
        ("tests/test_model_weight_sync.py",),
        keyword="require",
        sim_seeds=0,
    ),
    Mutant(
        "weights-422-a-data-failure",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "                if status == 422:",
        "                if False:",
        ("tests/test_model_weight_sync.py",),
        keyword="422",
        sim_seeds=0,
    ),
    # -- issue 33, config failures (EpisodeConfigError stops the run) and vLLM's engine version -
    Mutant(
        "config-error-fails-as-data-on-the-host",
        "config",
        "gym_adapter/host/_turns.py",
        '        return "config", config[0]',
        "        pass",
        ("tests/test_episode_config_error.py",),
        sim_seeds=0,
    ),
    Mutant(
        "config-failure-in-session-open-is-data",
        "config",
        "gym_adapter/host/_host.py",
        'return Failed(rid, "config" if config else "data", message)',
        'return Failed(rid, "data", message)',
        ("tests/test_episode_config_error.py",),
        keyword="open",
        sim_seeds=0,
    ),
    Mutant(
        "config-failure-does-not-stop-the-run",
        "config",
        "nurseries/_dispatcher.py",
        "        _stop_on_config(replies, instance, outstanding)",
        "        pass",
        ("tests/test_episode_config_error.py",),
        keyword="stops_the_run",
        sim_seeds=0,
    ),
    Mutant(
        "config-failure-is-not-bad-input",
        "config",
        "runtime/_errors.py",
        "class EpisodeConfigFailed(BadInput, RuntimeError):",
        "class EpisodeConfigFailed(RuntimeError):",
        ("tests/test_episode_config_error.py",),
        keyword="stops_the_run",
        sim_seeds=0,
    ),
    Mutant(
        "config-kind-crosses-http-as-data",
        "config",
        "gym_adapter/transports/http/_wire.py",
        'KIND_CONFIG if reply.failure_class == "config" else KIND_DATA',
        "KIND_DATA",
        ("tests/test_episode_config_error.py",),
        keyword="wires",
        sim_seeds=0,
    ),
    Mutant(
        "config-422-is-not-a-config-error",
        "config",
        "gym_adapter/environments/openai_model.py",
        "class ModelServerIncompatible(ModelRequestRejected, EpisodeConfigError):",
        "class ModelServerIncompatible(ModelRequestRejected):",
        ("tests/test_episode_config_error.py",),
        keyword="beside",
        sim_seeds=0,
    ),
    Mutant(
        "config-422-real-run-fails-row-by-row",
        "config",
        "gym_adapter/environments/openai_model.py",
        "class ModelServerIncompatible(ModelRequestRejected, EpisodeConfigError):",
        "class ModelServerIncompatible(ModelRequestRejected):",
        ("tests/test_model_weight_sync.py",),
        keyword="one_model_call and embedded",
        sim_seeds=0,
    ),
    Mutant(
        "config-required-field-is-not-a-config-error",
        "config",
        "gym_adapter/environments/openai_model.py",
        "class ModelResponseIncomplete(ModelResponseInvalid, EpisodeConfigError):",
        "class ModelResponseIncomplete(ModelResponseInvalid):",
        ("tests/test_episode_config_error.py",),
        keyword="beside",
        sim_seeds=0,
    ),
    Mutant(
        "engine-version-source-ignored",
        "weights",
        "gym_adapter/environments/openai_model.py",
        'if self.weight_version_source == "response":',
        "if True:",
        ("tests/test_model_weight_sync.py",),
        keyword="engine",
        sim_seeds=0,
    ),
    Mutant(
        "engine-version-not-read-before-the-call",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "if expected is not None and before != str(expected):",
        "if False:",
        ("tests/test_model_weight_sync.py",),
        keyword="before_and_after",
        sim_seeds=0,
    ),
    Mutant(
        "engine-version-not-read-after-the-call",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "        if after != before:",
        "        if False:",
        ("tests/test_model_weight_sync.py",),
        keyword="before_and_after",
        sim_seeds=0,
    ),
    Mutant(
        "engine-weight-info-4xx-is-data",
        "weights",
        "gym_adapter/environments/openai_model.py",
        "                if body is None:",
        "                if False:",
        ("tests/test_model_weight_sync.py",),
        keyword="without_weight_info",
        sim_seeds=0,
    ),
    # -- issue 35, sandbox: a per-session tree as a manifest; captured steps -----------------
    Mutant(
        "sandbox-symlink-escape-not-refused",
        "sandbox",
        "gym_adapter/environments/_sandbox_tree.py",
        'if "\\0" in target or _link_escapes(manifest, rel):',
        'if "\\0" in target:',
        ("tests/test_sandbox.py",),
        keyword="symlink or hostile",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-restore-skips-the-checks",
        "sandbox",
        "gym_adapter/environments/sandbox.py",
        'tree = check_manifest(data["tree"], self.blobs, self.limits)',
        'tree = data["tree"]',
        ("tests/test_sandbox.py",),
        keyword="hostile or limit",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-mark-rehashes-unchanged-files",
        "sandbox",
        "gym_adapter/environments/_sandbox_tree.py",
        "if cached is not None and cached[0] == key:",
        "if False:",
        ("tests/test_sandbox.py",),
        keyword="mark",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-racily-clean-file-trusted",
        "sandbox",
        "gym_adapter/environments/_sandbox_tree.py",
        "if max(key[1], key[2]) < start - RACY_NS:",
        "if True:",
        ("tests/test_sandbox.py",),
        keyword="same_size",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-change-during-export-unnoticed",
        "sandbox",
        "gym_adapter/environments/_sandbox_tree.py",
        "if _stat_key(after) != _stat_key(before):",
        "if False:",
        ("tests/test_sandbox.py",),
        keyword="changed_while_hashed",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-file-api-follows-links-out",
        "sandbox",
        "gym_adapter/environments/sandbox.py",
        "if p != base and base not in p.parents:",
        "if False:",
        ("tests/test_sandbox.py",),
        keyword="file_api",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-deadline-kills-only-the-leader",
        "sandbox",
        "gym_adapter/environments/_sandbox_commands.py",
        "os.killpg(pid, signal.SIGKILL)",
        "os.kill(pid, signal.SIGKILL)",
        ("tests/test_sandbox.py",),
        keyword="never_ends",
        sim_seeds=0,
    ),
    Mutant(
        "sandbox-output-unbounded",
        "sandbox",
        "gym_adapter/environments/_sandbox_commands.py",
        "if len(chunk) > room:",
        "if False:",
        ("tests/test_sandbox.py",),
        keyword="bounded_output",
        sim_seeds=0,
    ),
    Mutant(
        "captured-step-replays-changed-arguments",
        "sandbox",
        "gym_adapter/host/_episodes.py",
        "if staged.request_digest != digest:",
        "if False:",
        ("tests/test_captured_step.py",),
        sim_seeds=0,
    ),
    Mutant(
        "captured-step-run-again-after-restore",
        "sandbox",
        "gym_adapter/host/_episodes.py",
        "staged = self.steps.get(identity[:CALL_DIGEST_HEX])",
        "staged = None",
        ("tests/test_captured_step.py", "tests/test_sandbox_crash.py"),
        sim_seeds=0,
    ),
    Mutant(
        "captured-step-result-not-checked",
        "sandbox",
        "gym_adapter/host/_episodes.py",
        'data = exact_json(result, f"{where}: result under capture key {key}")',
        "data = orjson.dumps(result)",
        ("tests/test_captured_step.py",),
        sim_seeds=0,
    ),
    # -- issue 34, marks: boundary marks on demand, unchanged sessions not exported again ----
    Mutant(
        "marks-on-demand-exports-from-the-start",
        "marks",
        "gym_adapter/host/_host.py",
        'if config.boundary_marks == "always" and self.environment.unaligned:',
        "if self.environment.unaligned:",
        ("tests/test_host_marks_on_demand.py",),
        sim_seeds=0,
    ),
    Mutant(
        "marks-cut-takes-an-unmarked-turn-at-its-live-state",
        "marks",
        "gym_adapter/host/_control.py",
        "if ep.stepping:  # its turn started before the marks were armed",
        "if False:",
        ("tests/test_host_marks_on_demand.py",),
        sim_seeds=0,
    ),
    Mutant(
        "marks-unaligned-prepare-does-not-arm",
        "marks",
        "gym_adapter/host/_control.py",
        "            parking.arm_marks()",
        "            pass",
        ("tests/test_host_marks_on_demand.py",),
        nth=1,
        sim_seeds=0,
    ),
    Mutant(
        "marks-alignment-timeout-does-not-arm",
        "marks",
        "gym_adapter/host/_control.py",
        "            parking.arm_marks()",
        "            pass",
        ("tests/test_host_marks_on_demand.py",),
        nth=2,
        sim_seeds=0,
    ),
    Mutant(
        "marks-version-reuse-ignores-the-version",
        "marks",
        "gym_adapter/host/_cut.py",
        "and prev.versions[i] == version",
        "and True",
        ("tests/test_host_mark_versions.py",),
        sim_seeds=0,
    ),
    Mutant(
        "marks-version-reuse-ignores-a-replaced-state",
        "marks",
        "gym_adapter/host/_cut.py",
        "and prev.objects[i] is state",
        "and True",
        ("tests/test_host_mark_versions.py",),
        sim_seeds=0,
    ),
    Mutant(
        "marks-versions-never-reused",
        "marks",
        "gym_adapter/host/_cut.py",
        "        return _mark_parts(participants, ep, versions)",
        "        pass",
        ("tests/test_host_mark_versions.py",),
        sim_seeds=0,
    ),
    # -- gymckpt train text: the character transformer's token-level GRPO (issue 33) ----------
    Mutant(
        "train-text-logprob-without-terminator",
        "train-text",
        "app/train/charlm.py",
        "return [*tokens, len(alphabet)] if len(move) < max_chars else tokens",
        "return tokens",
        ("tests/test_train_text.py",),
        sim_seeds=0,
    ),
    Mutant(
        "train-text-logprob-read-one-position-early",
        "train-text",
        "app/train/charlm.py",
        "logits = model(self.inputs[index])[:, self.prompt_len - 1 :]",
        "logits = model(self.inputs[index])[:, self.prompt_len - 2 : -1]",
        ("tests/test_train_text.py",),
        sim_seeds=0,
    ),
    Mutant(
        "train-text-group-plays-different-games",
        "train-text",
        "app/train/text.py",
        "return super().open(attrs.evolve(info, slot=0))",
        "return super().open(info)",
        ("tests/test_train_text.py",),
        sim_seeds=0,
    ),
    Mutant(
        "train-text-sampling-seeded-by-attempt",
        "train-text",
        "app/train/loop.py",
        "rng = sampling_rng(options.seed, info.session_key, call.turn, call.occurrence)",
        "rng = sampling_rng(options.seed, info.rollout_id, call.turn, call.occurrence)",
        ("tests/test_train_text_crash.py",),
        sim_seeds=0,
    ),
    # -- the coding demo (gymckpt demo --env sandbox:coding) ---------------------------------
    Mutant(
        "demo-sandbox-trajectories-always-match",
        "sandbox",
        "app/demo/envs.py",
        "mismatched += sum(1 for d in digests if d != ref)",
        "mismatched += 0",
        ("tests/test_demo_sandbox.py",),
        keyword="mismatch",
        sim_seeds=0,
    ),
    Mutant(
        "demo-sandbox-restore-forgets-turns-done",
        "sandbox",
        "gym_adapter/environments/coding.py",
        'return {"tried": list(state.tried), "rewards": list(state.rewards)}',
        'return {"tried": [], "rewards": []}',
        ("tests/test_demo_sandbox.py",),
        keyword="exactly_once",
        sim_seeds=0,
    ),
    Mutant(
        "demo-sandbox-restored-tree-is-the-template",
        "sandbox",
        "gym_adapter/environments/sandbox.py",
        "return self._session(label, tree)",
        "return self._session(label, self.template_tree())",
        ("tests/test_demo_sandbox.py",),
        keyword="exactly_once",
        sim_seeds=0,
    ),
    # -- HTTP reply channels (/mux/v1) -----------------------------------------------------------
    Mutant(
        "httpmux-reply-routed-to-wrong-group",
        "C7",
        "gym_adapter/transports/http/_mux.py",
        "stream = self._streams.get(item.sid)  # looked up after the slices: it may have closed",
        "stream = next(iter(self._streams.values()), None)",
        ("tests/test_http_mux.py",),
        keyword="bounded",
        sim_seeds=0,
    ),
    Mutant(
        "httpmux-ack-skips-multiplexed",
        "C7",
        "gym_adapter/transports/http/_mux.py",
        "if self._acks.on_ask(self._peer.acks, self._instance, self._sid, time.monotonic()):",
        "if False:",
        ("tests/test_http_mux.py",),
        keyword="bounded",
        sim_seeds=0,
    ),
    Mutant(
        "httpmux-decode-in-one-step",
        "C7",
        "gym_adapter/transports/http/_mux.py",
        "piece = raw[start : start + DECODE_SLICE]",
        "piece = raw[start:] if start == 0 else ()",
        ("tests/test_http_mux.py",),
        keyword="slice",
        sim_seeds=0,
    ),
    Mutant(
        "httpmux-acks-not-coalesced",
        "C7",
        "gym_adapter/transports/http/_gym.py",
        "if instance in self._acking:",
        "if False:",
        ("tests/test_http_mux.py",),
        keyword="bounded",
        sim_seeds=0,
    ),
    Mutant(
        "httpmux-health-does-not-advertise",
        "C7",
        "gym_adapter/transports/http/_app.py",
        "headers.append((FEATURES_HEADER.lower().encode(), MUX_FEATURE.encode()))",
        "pass",
        ("tests/test_http_mux.py",),
        keyword="bounded or advertises",
        sim_seeds=0,
    ),
)


def _copy_tree(dest: Path) -> Path:
    """Copy the tracked and untracked-but-not-ignored files to ``dest/gymckpt``."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    root = dest / "gymckpt"
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():
            continue
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return root


def _apply(root: Path, m: Mutant) -> str | None:
    """Apply ``m`` in the copy; None, or why it could not be applied (stale)."""
    assert "\n" not in m.old and "\n" not in m.new, m.name
    file = root / m.path
    if not file.is_file():
        return f"{m.path} does not exist"
    text = file.read_text()
    at = -1
    for _ in range(m.nth):
        at = text.find(m.old, at + 1)
        if at < 0:
            return f"{m.old!r} not found ({m.nth}. occurrence) in {m.path}"
    file.write_text(text[:at] + m.new + text[at + len(m.old) :])
    return None


def _apply_check(m: Mutant) -> str | None:
    """Why ``m`` no longer applies to the working tree, or None (the tree is not changed)."""
    with tempfile.TemporaryDirectory(prefix="gymckpt-stale-") as tmp:
        target = Path(tmp) / m.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / m.path).is_file():
            shutil.copy2(REPO / m.path, target)
        return _apply(Path(tmp), m)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return p.returncode, p.stdout[-3000:] + p.stderr[-2000:]


def _last_line(out: str, *marks: str) -> str:
    lines = [ln for ln in out.splitlines() if any(k in ln for k in marks)]
    return (lines[-1] if lines else out.strip().splitlines()[-1] if out.strip() else "")[:160]


def run_mutant(
    m: Mutant, seeds: int, sim_only: bool, test_timeout: int, control: bool = False
) -> tuple[str, str]:
    """("killed" | "survived" | "stale", by what). With ``control`` the line is left as it
    is: the same selection must pass on the unchanged tree, or a kill means nothing."""
    with tempfile.TemporaryDirectory(prefix=f"gymckpt-mutant-{m.name}-") as tmp:
        root = _copy_tree(Path(tmp))
        why = _apply(
            root,
            m
            if not control
            else Mutant(m.name, m.rule, m.path, m.old, m.old, m.tests, m.nth, m.keyword),
        )
        if why is not None:
            return "stale", why
        env = {**os.environ, "PYTHONPATH": tmp, "PYTHONHASHSEED": "0"}
        env.pop("PYTEST_ADDOPTS", None)
        if not sim_only:
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "not ray and not slow",
                "-o",
                f"timeout={test_timeout}",
                *m.tests,
            ]
            if m.keyword:
                cmd += ["-k", m.keyword]
            rc, out = _run(cmd, root, env, timeout=20 * test_timeout)
            if rc == 5:
                return "stale", f"no test selected by {m.tests} -k {m.keyword!r}"
            if rc != 0:
                return "killed", "tests: " + _last_line(out, "FAILED", "ERROR", "Timeout", "failed")
        n = m.sim_seeds if m.sim_seeds is not None else seeds
        if n > 0:
            cmd = [sys.executable, "-m", "gymckpt", "simulate", "--seeds", str(n)]
            rc, out = _run(cmd, root, env, timeout=max(600, 5 * n))
            if rc != 0:
                return "killed", "simulate: " + _last_line(out, "FAIL:", "failing seeds")
        return "survived", "tests and simulation passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("only", nargs="*", help="run mutants whose name contains one of these")
    parser.add_argument(
        "--seeds",
        type=int,
        default=30,
        help="simulation seeds for a mutant the tests did not kill (default 30)",
    )
    parser.add_argument(
        "--sim-only",
        action="store_true",
        help="skip the tests: does the simulation alone kill the mutants?",
    )
    parser.add_argument(
        "--test-timeout",
        type=int,
        default=60,
        help="per-test timeout in seconds (a hang is a kill); default 60",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--stale",
        action="store_true",
        help="only check that every mutant's line is still in the tree (fast)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="run each mutant's selection on the unchanged tree (must survive)",
    )
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name:55} {m.rule:8} {m.path}")
        return 0
    if args.stale:
        stale_ones = [(m, why) for m in chosen if (why := _apply_check(m)) is not None]
        for m, why in stale_ones:
            print(f"STALE    {m.name:55} {why}")
        print(f"{len(chosen) - len(stale_ones)}/{len(chosen)} mutants apply to the tree")
        return 1 if stale_ones else 0
    t0 = time.monotonic()
    results: list[tuple[Mutant, str, str, float]] = []
    for m in chosen:
        t = time.monotonic()
        status, by = run_mutant(m, args.seeds, args.sim_only, args.test_timeout, args.control)
        dt = time.monotonic() - t
        results.append((m, status, by, dt))
        print(f"{status.upper():8} {m.name:55} {dt:6.1f}s  {by}", flush=True)
    killed = sum(s == "killed" for _, s, _, _ in results)
    stale = sum(s == "stale" for _, s, _, _ in results)
    total = len(results)
    if args.control:
        print(f"control: {total - killed - stale}/{total} selections pass on the unchanged tree")
        return 0 if killed == 0 and stale == 0 else 1
    print(
        f"mutation score: {killed}/{total} killed ({100 * killed / max(total, 1):.0f}%), "
        f"{total - killed - stale} survived, {stale} stale, in {time.monotonic() - t0:.0f}s"
    )
    return 0 if killed == total else 1


if __name__ == "__main__":
    sys.exit(main())
