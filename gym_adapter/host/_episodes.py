"""Episodes on the Gym host: one attempt's sessions, its turn loop's context, its capture keys.

An ``_Episode`` holds every participant's session state for one attempt (the agent's included)
and the model calls staged for it. The host moves it between states:

    moving ──(step boundary while prepared)──▶ boundary ──(resume)──▶ moving
    (restore) ──▶ unclaimed ──(claim by attempt + 1)──▶ a new moving episode
    any ──▶ done (completed, failed, fenced, retired, instance shut down)

Only ``done`` is final; the host's ``end_episode`` is its one way in for an active episode.
``EpisodeTable`` is the instance's record of which episodes are active and which restored ones
wait unclaimed; ``StepContext`` reaches the host only through ``TurnHost``.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, Protocol, final

import attrs
import orjson

from gymckpt.runtime.lowlevel import checked_json

from .._contract import Completed, Failed, RunReply
from ._captured import (
    CapturedStepChanged,
    arguments_digest,
    exact_json,
    is_step,
    step_identity,
)
from ._episode import (
    CALL_DIGEST_HEX,
    KEY_SEPARATOR,
    POLICY_VERSION,
    Done,
    EpisodeFenced,
    EpisodeInfo,
    Model,
    ModelCall,
    call_id,
    parse_call_id,
    split_capture_key,
    to_plain,
)
from ._log import episode_label
from ._streams import RunStream

__all__ = [
    "BOUNDARY",
    "DONE",
    "MOVING",
    "UNCLAIMED",
    "Episode",
    "EpisodeTable",
    "ModelRequestChanged",
    "StagedModelCall",
    "StepContext",
    "TurnCalls",
    "TurnHost",
    "capture_key",
    "completed_reply",
]

MOVING: Final = "moving"
BOUNDARY: Final = "boundary"
UNCLAIMED: Final = "unclaimed"
DONE: Final = "done"


def capture_key(info: EpisodeInfo, turn: int, request_digest: str, occurrence: int) -> str:
    """The key a model call is staged under, in NeMo Gym's shape:
    ``"{attempt_key}:{call_id}"``, where the attempt key is the attempt's rollout id
    (``"{row}-{slot}"``, then ``"{row}-{slot}-a{n}"``) and the call id is
    ``"t{turn}-{request digest}-c{occurrence}"`` (``call_id``). It holds no ``/``, so either
    part can be a URL path segment."""
    return f"{info.rollout_id}{KEY_SEPARATOR}{call_id(turn, request_digest, occurrence)}"


class StagedModelCall(NamedTuple):
    """One model call as the host captured it, before the episode saw the response."""

    key: str
    response: Any
    request_digest: str
    """sha256 (hex) of the request's canonical JSON (sorted keys)."""
    policy_version: int
    """The newest trainer policy version the instance had been told when the call was made."""


class ModelRequestChanged(ValueError):
    """A restored turn ended without asking again a model call staged for it before the
    checkpoint: it did not replay as it ran (a changed request, a dropped call). A capture only
    answers the request it was made for, so the turn's other requests were asked of the model;
    the episode fails as data (``TurnCalls``)."""


def request_digest(data: bytes) -> str:
    """The digest a call's request is staged with: sha256 (hex) of its canonical JSON."""
    return hashlib.sha256(data).hexdigest()


@attrs.define(eq=False, slots=True)
class Episode:
    """One attempt on one instance (the host's record; users see ``StepContext``)."""

    info: EpisodeInfo
    sessions: dict[str, Any]
    state: str
    turn: int = 0
    stream: RunStream | None = None
    staged: list[StagedModelCall] = attrs.field(factory=list)
    inherited: int = 0
    """How many of ``staged`` earlier attempts made (restored with the episode): replayed."""
    replay: tuple[str, ...] | None = None
    """A restored continuation's capture keys as the manifest recorded them."""
    hold: bool = False
    """Held at its next step boundary until a checkpoint is prepared (``ctx.hold()``)."""
    mark: Any = None
    """Its ``BoundaryMark``: the session states it had at its current step boundary (kept for
    an unaligned cut; ``_host_cut``), or None before its first boundary."""
    stepping: bool = False
    """Inside a turn (the agent's ``step`` is running)."""
    rollout_id: str = attrs.field(init=False)
    key: str = attrs.field(init=False)
    """The slot's session key (``info.session_key``), kept: fencing checks it every turn."""
    scope: Any = attrs.field(default=None, init=False)
    """The cancel scope of the task running it now (None while it has none)."""

    def __attrs_post_init__(self) -> None:
        self.rollout_id = self.info.rollout_id
        self.key = self.info.session_key

    def stop(self) -> None:
        """Cancel the task running it, if any (its caller ends it with ``end_episode``)."""
        if self.scope is not None:
            self.scope.cancel()

    @property
    def capture_keys(self) -> tuple[str, ...]:
        return tuple([c.key for c in self.staged])


@final
@attrs.define(eq=False, slots=True, repr=False)
class EpisodeTable:
    """The episodes of one instance: ``active`` (moving or parked, by rollout ID: each has or
    had a task) and ``unclaimed`` (restored, waiting for attempt + 1 to claim them; no task).

    Invariant: a rollout ID is in at most one of the two. The host's ``end_episode`` removes an
    active episode; claims, fencing, retire and shutdown take unclaimed ones out, a restore
    installs them. Nothing else writes either map."""

    _active: dict[str, Episode] = attrs.field(factory=dict, init=False)
    _unclaimed: dict[str, Episode] = attrs.field(factory=dict, init=False)

    @property
    def active(self) -> Mapping[str, Episode]:
        return self._active

    @property
    def unclaimed(self) -> Mapping[str, Episode]:
        return self._unclaimed

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._active or rollout_id in self._unclaimed

    def get(self, rollout_id: str) -> Episode | None:
        """The active or unclaimed episode of ``rollout_id``."""
        return self._active.get(rollout_id) or self._unclaimed.get(rollout_id)

    def add(self, ep: Episode) -> None:
        """``ep`` becomes active (its task is about to start)."""
        self._active[ep.rollout_id] = ep

    def remove(self, ep: Episode) -> None:
        """``ep`` is no longer active (a newer episode of the same ID stays)."""
        if self._active.get(ep.rollout_id) is ep:
            del self._active[ep.rollout_id]

    def take_unclaimed(self, rollout_id: str | None) -> Episode | None:
        """Remove and return the unclaimed episode of ``rollout_id`` (marked ``DONE``: no task
        ever runs it again), or None."""
        ep = self._unclaimed.pop(rollout_id, None) if rollout_id is not None else None
        if ep is not None:
            ep.state = DONE
        return ep

    def install_unclaimed(self, restored: Mapping[str, Episode]) -> None:
        """A restore: ``restored`` are the unclaimed episodes from now on."""
        self._unclaimed = dict(restored)

    def clear_unclaimed(self) -> None:
        self._unclaimed.clear()

    def __repr__(self) -> str:
        return f"<EpisodeTable active={len(self._active)} unclaimed={len(self._unclaimed)}>"


class TurnHost(Protocol):
    """What one turn's ``StepContext`` reaches of its host."""

    @property
    def retained_names(self) -> frozenset[str]:
        """The participants whose sessions outlive their episode (journaled after a turn
        that fetched them)."""
        ...

    @property
    def model(self) -> Model | None: ...

    @property
    def policy_version(self) -> int:
        """The newest trainer policy version the instance has been told."""
        ...

    def fenced(self, ep: Episode) -> bool:
        """Whether ``ep`` no longer owns its slot's sessions."""
        ...

    def add_count(self, name: str, n: int) -> int:
        """Add ``n`` to the environment's counter ``name``; its new value."""
        ...

    def model_called(self, *, replayed: bool) -> None:
        """Count a model call (``replayed``: answered from a staged response)."""
        ...


@final
@attrs.define(eq=False, slots=True)
class TurnCalls:
    """The model calls of one turn of one episode: which call id each gets, and which calls
    staged for the turn by an earlier attempt are still to be replayed.

    A call is identified by (turn, request digest, occurrence), never by when it started: a
    call takes the lowest occurrence of its request not yet ``taken`` in the turn (a staged
    call's, or one this turn asked), so concurrent calls get the same ids in any order, and
    identical requests are interchangeable. In a restored turn (the one an unaligned cut took
    mid-turn) a call whose request has an ``unreplayed`` staged call is answered from it, by
    full digest; any other call is asked (it was in flight at the cut, or is a new request).
    When the turn ends, every staged call of it must have been replayed, else the turn did not
    replay as it ran: ``check_replayed`` raises ``ModelRequestChanged``. (It cannot be decided
    earlier: a request no capture answers may be the call that was in flight at the cut, asked
    before the calls that completed.)"""

    turn: int
    taken: dict[str, set[int]] = attrs.field(factory=dict)
    """Occurrences taken in this turn, by the call id's digest part."""
    unreplayed: dict[str, list[StagedModelCall]] = attrs.field(factory=dict)
    """Staged calls of this turn not yet answered again, by full request digest."""
    steps: dict[str, list[StagedModelCall]] = attrs.field(factory=dict)
    """Captured steps staged for this turn not yet answered again, by the call id's digest
    part (the step's name), lowest occurrence first (``_captured``)."""
    asked: list[str] = attrs.field(factory=list)
    """Digests this turn asked of the model while calls were still to be replayed."""

    @classmethod
    def of(cls, ep: Episode) -> TurnCalls:
        """``ep``'s current turn, with the calls earlier attempts staged for it."""
        calls = cls(ep.turn)
        if not ep.inherited:
            return calls
        inherited = ep.staged[: ep.inherited]
        if _call_turn(inherited[-1]) < ep.turn:  # a later turn than the cut's: nothing staged
            return calls
        for c in inherited:
            call = parse_call_id(split_capture_key(c.key)[1])
            if call.turn == ep.turn:
                calls.taken.setdefault(call.request, set()).add(call.occurrence)
                if is_step(call.request, c.request_digest):
                    calls.steps.setdefault(call.request, []).append(c)
                else:
                    calls.unreplayed.setdefault(c.request_digest, []).append(c)
        for staged in calls.steps.values():
            staged.sort(key=lambda c: parse_call_id(split_capture_key(c.key)[1]).occurrence)
        return calls

    def replay(self, digest: str) -> StagedModelCall | None:
        """The staged call that answers a request of ``digest``, now replayed, or None (the
        request is asked)."""
        staged = self.unreplayed.get(digest)
        if not staged:
            if self.unreplayed:
                self.asked.append(digest)
            return None
        call = staged.pop(0)
        if not staged:
            del self.unreplayed[digest]
        return call

    def replay_step(self, identity: str) -> StagedModelCall | None:
        """The staged captured step of ``identity`` (its name's digest) with the lowest
        occurrence not yet answered again, now replayed, or None (the step runs)."""
        staged = self.steps.get(identity[:CALL_DIGEST_HEX])
        if not staged:
            if self.unreplayed or self.steps:
                self.asked.append(identity)
            return None
        call = staged.pop(0)
        if not staged:
            del self.steps[identity[:CALL_DIGEST_HEX]]
        return call

    def occurrence(self, digest: str) -> int:
        """Take the lowest free occurrence of a request of ``digest`` in this turn."""
        taken = self.taken.setdefault(digest[:CALL_DIGEST_HEX], set())
        n = 0
        while n in taken:
            n += 1
        taken.add(n)
        return n

    def check_replayed(self, ep: Episode) -> None:
        """At the end of the turn: ``ModelRequestChanged`` if a staged call of it was not
        asked again (see the class docstring)."""
        if not self.unreplayed and not self.steps:
            return
        left = [c for staged in (*self.unreplayed.values(), *self.steps.values()) for c in staged]
        asked = f"; it asked {sorted(set(self.asked))} instead" if self.asked else ""
        raise ModelRequestChanged(
            f"{episode_label(ep.info)}: restored turn {self.turn} ended without asking again "
            f"{len(left)} model call(s) or captured step(s) staged for it before the checkpoint "
            f"({', '.join(f'{c.key} for request digest {c.request_digest}' for c in left)})"
            f"{asked}: the episode does not replay as it ran (is the agent's code or its input "
            "different from the run that made the snapshot?); a capture only answers its own "
            "request, so a turn's requests must follow from the session states at its step "
            "boundary and the task (not the attempt, the clock or an unseeded RNG)"
        )


def _call_turn(c: StagedModelCall) -> int:
    return parse_call_id(split_capture_key(c.key)[1]).turn


@attrs.define(eq=False, slots=True)
class StepContext:
    """The ``EpisodeContext`` of one turn of one episode."""

    _host: TurnHost
    _ep: Episode
    _calls: TurnCalls | None = None
    """This turn's calls (made by the turn's first call)."""
    touched: set[str] | None = None
    """The retained participants whose session this turn fetched (journaled after it)."""

    @property
    def info(self) -> EpisodeInfo:
        return self._ep.info

    @property
    def turn(self) -> int:
        return self._ep.turn

    def session(self, name: str) -> Any:
        self._check_owner()
        try:
            state = self._ep.sessions[name]
        except KeyError:
            raise KeyError(
                f"no participant {name!r} (participants: {', '.join(self._ep.sessions)})"
            ) from None
        self._touch(name)
        return state

    def replace_session(self, name: str, state: Any) -> None:
        self._check_owner()
        if name not in self._ep.sessions:
            raise KeyError(f"no participant {name!r}")
        self._ep.sessions[name] = state
        self._touch(name)

    def _touch(self, name: str) -> None:
        if name in self._host.retained_names:
            if self.touched is None:
                self.touched = set()
            self.touched.add(name)

    def count(self, name: str, n: int = 1) -> int:
        return self._host.add_count(name, n)

    def hold(self) -> None:
        self._ep.hold = True

    async def model(self, request: Any) -> Any:
        host, ep = self._host, self._ep
        model = host.model
        if model is None:
            raise RuntimeError("this environment has no model (give Environment(model=...))")
        self._check_owner()
        digest = request_digest(_check_request(ep, request))
        calls = self.turn_calls()
        staged = calls.replay(digest)
        if staged is not None:
            # staged before a checkpoint by an earlier attempt of the slot, for this very
            # request (its key keeps that attempt's key): never asked twice
            host.model_called(replayed=True)
            return _copy(staged.response)
        key = capture_key(ep.info, ep.turn, digest, calls.occurrence(digest))
        version = host.policy_version
        token = POLICY_VERSION.set(version)  # the version the model may check its answer by
        try:
            response = model(key, request, ep.info)
            if type(response) not in _SCALARS and inspect.isawaitable(response):
                response = await response
        finally:
            POLICY_VERSION.reset(token)
        self._check_owner()  # still the owner after the wait
        response = to_plain(response)
        if type(response) in _SCALARS:  # an int or a str needs no look, nor a copy
            ep.staged.append(StagedModelCall(key, response, digest, version))
            host.model_called(replayed=False)
            return response
        data = _check_response(ep, key, response)
        ep.staged.append(StagedModelCall(key, response, digest, version))
        host.model_called(replayed=False)
        # the episode gets its own copy: what it does to the response in place never reaches
        # the capture (a commit may be serialising it in a worker thread right now)
        return orjson.loads(data)

    def turn_calls(self) -> TurnCalls:
        """This turn's ``TurnCalls`` (made on first use)."""
        if self._calls is None:
            self._calls = TurnCalls.of(self._ep)
        return self._calls

    async def captured_step(self, name: str, args: Any, fn: Callable[[Any], Any]) -> Any:
        host, ep = self._host, self._ep
        if host.model is None:
            raise RuntimeError(
                "captured steps are committed with the model proxy's records, which an "
                "environment has only with a model: give Environment(model=...) (any model, "
                "also one the agent never asks)"
            )
        self._check_owner()
        identity = step_identity(name)
        where = f"{episode_label(ep.info)}: captured step {name!r} of turn {ep.turn}"
        args_json = exact_json(args, f"{where}: args")
        digest = arguments_digest(name, args_json)
        calls = self.turn_calls()
        staged = calls.replay_step(identity)
        if staged is not None:
            if staged.request_digest != digest:
                raise CapturedStepChanged(
                    f"{where}: capture key {staged.key} was staged before the checkpoint with "
                    f"arguments digest {staged.request_digest}, and is asked now with "
                    f"{digest}: the arguments differ, so the captured result does not answer "
                    "them (is the agent's code or its input different from the run that made "
                    "the snapshot?)"
                )
            return _copy(staged.response)
        key = capture_key(ep.info, ep.turn, identity, calls.occurrence(identity))
        result = fn(orjson.loads(args_json))
        if inspect.isawaitable(result):
            result = await result
        self._check_owner()  # still the owner after the wait
        data = exact_json(result, f"{where}: result under capture key {key}")
        ep.staged.append(StagedModelCall(key, orjson.loads(data), digest, host.policy_version))
        return orjson.loads(data)

    @property
    def calls(self) -> tuple[ModelCall, ...]:
        ep = self._ep
        return tuple(
            ModelCall(c.key, c.request_digest, c.policy_version, i < ep.inherited)
            for i, c in enumerate(ep.staged)
            if not is_step(parse_call_id(split_capture_key(c.key)[1]).request, c.request_digest)
        )

    def _check_owner(self) -> None:
        if self._host.fenced(self._ep):
            raise EpisodeFenced(
                f"{self._ep.rollout_id} no longer owns session {self._ep.key} "
                "(a newer attempt of this slot exists)"
            )


_SCALARS: Final = frozenset({int, str, bool, type(None)})
"""Types whose every value is finite plain data (a ``float`` may be ``nan``): no look needed."""


def _copy(response: Any) -> Any:
    """A staged response as the episode gets it: scalars as they are, anything else a copy."""
    if type(response) in _SCALARS:
        return response
    return orjson.loads(orjson.dumps(response))


_CANONICAL: Final = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _check_request(ep: Episode, request: Any) -> bytes:
    """A model call's request must be finite plain data (its digest is staged); its canonical
    JSON (sorted keys). One ``orjson.dumps`` when it holds no ``null``: ``checked_json`` (which
    names what is wrong) runs only when that one cannot tell."""
    try:
        data = orjson.dumps(request, option=_CANONICAL)
    except (TypeError, orjson.JSONEncodeError):
        data = None
    if data is None or b"null" in data:
        try:
            checked_json(request, "request")
        except ValueError as exc:
            raise ValueError(
                f"{episode_label(ep.info)}: model request of turn {ep.turn} is refused: {exc}"
            ) from None
        data = orjson.dumps(to_plain(request), option=_CANONICAL)
    return data


def _check_response(ep: Episode, key: str, response: Any) -> bytes:
    """A model response is staged (and committed) only if it is finite plain data; its JSON."""
    try:
        return checked_json(response, "response")
    except ValueError as exc:
        raise ValueError(
            f"{episode_label(ep.info)}: model response under capture key {key} is refused: {exc}"
        ) from None


_CONSTANTS: Final = frozenset({bool, type(None)})
_CONSTANT_SIZE: Final = {None: 4, True: 4, False: 5}
"""The JSON size of the payloads that need no ``checked_json``: ``null``, ``true``, ``false``."""


def completed_reply(instance: str, ep: Episode, done: Done, limit: int) -> RunReply:
    """The final reply of ``ep`` ending with ``done``: ``Completed``, or ``Failed`` (data) when
    ``done`` is not a ``Done``, its reward is not a finite number, its turns not a count, its
    payload is not finite plain data (a ``nan`` would be written ``null``: refused here, naming
    the place in it), or it is over ``limit`` bytes. One ``orjson.dumps`` of the payload
    (needed for its size) and a search of it for ``null``; none for a payload of None, True or
    False (the episode that returns no trajectory), whose JSON is known."""
    rid = ep.rollout_id
    if not isinstance(done, Done):
        got = type(done).__name__
        return Failed(
            rid, "data", f"{episode_label(ep.info)}: step returned {got}, expected Done or None"
        )
    reward: float | None = done.reward
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        reward = _number(reward)
        if reward is None:
            return Failed(
                rid,
                "data",
                f"{episode_label(ep.info)}: Done.reward is {done.reward!r}, not a finite number",
            )
    try:
        payload = to_plain(done.payload)
        size = _CONSTANT_SIZE.get(payload) if type(payload) in _CONSTANTS else None
        if size is None:
            size = len(checked_json(payload, "payload"))
    except (TypeError, ValueError) as exc:
        return Failed(
            rid, "data", f"{episode_label(ep.info)}: Done.payload is not plain data: {exc}"
        )
    if size > limit:
        return Failed(
            rid,
            "data",
            f"{episode_label(ep.info)}: payload is {size} bytes as JSON, over the limit of "
            f"{limit} (Environment(max_payload_bytes=...)); trim the trajectory",
        )
    turns = ep.turn if done.turns is None else done.turns
    if type(turns) is not int:  # a numpy integer counts; a bool, a float or a str does not
        integral = isinstance(turns, numbers.Integral) and not isinstance(turns, bool)
        turns = int(turns) if integral else -1
    if turns < 0:
        return Failed(
            rid,
            "data",
            f"{episode_label(ep.info)}: Done.turns is {done.turns!r}, "
            "not a count (an int >= 0, or None)",
        )
    return Completed(rid, float(reward), turns, payload)


def _number(value: object) -> float | None:
    """``value`` as a finite float (a numpy scalar, say), or None."""
    if not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
