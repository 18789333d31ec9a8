"""The episode API: what a user writes to run their own environment on the Gym host.

An **environment** is an agent (the episode's loop), zero or more environment participants and
an optional model (or policy). The host owns everything about checkpoints; the user's code only
has to keep its per-session state exportable as plain data:

    class Counter:                      # an environment participant
        name, kind = "counter", "environment"
        def open(self, info): return {"n": 0}
        def export(self, state): return state          # JSON value
        def restore(self, data): return data

    class Agent:                        # the agent: one call of ``step`` per turn
        name, kind = "agent", "simple_agent"
        def open(self, info): return {"rewards": []}
        def export(self, state): return state
        def restore(self, data): return data
        async def step(self, ctx, state):
            action = await ctx.model(state["rewards"])          # captured under a capture key
            counter = ctx.session("counter")                    # fenced: only the owner gets it
            counter["n"] += action
            state["rewards"].append(1.0)
            return Done(sum(state["rewards"]), payload=state) if ctx.turn >= 3 else None

    env = Environment(agent=Agent(), participants=(Counter(),), model=my_policy)

Why it is shaped like this
--------------------------
- **Step boundaries are between calls of** ``step``. A checkpoint parks an episode there, so every
  session state is between two turns: exported state never holds half a mutation, and a restored
  continuation calls ``step`` for turn ``ctx.turn`` exactly where the exported attempt stopped.
  A coroutine's stack cannot be exported; a session state can.
- **Sessions are per (row, slot)** and owned by one attempt. A fresh attempt of a slot opens new
  sessions; the old attempt is *fenced*: ``ctx.session`` raises ``EpisodeFenced`` for it, and
  whatever it still mutates lives in state objects the host no longer holds (never exported,
  never replied). That is how a mutation happens once across any crash.
- **Model calls are captured.** ``await ctx.model(request)`` stages the response under a capture
  key in NeMo Gym's shape (``"{attempt_key}:t{turn}-{request digest}-c{occurrence}"``: the
  attempt's rollout id, then the call id, ``call_id``; ``split_capture_key``,
  ``parse_call_id``) with a digest of the request and the trainer's policy version. The call id
  says which question the call is, never when it started, so calls made at once (a nursery, a
  task group, ``asyncio.gather``) have the same ids in any order. The keys of a checkpointed
  episode go into the manifest; after a restore a request of the turn an unaligned cut took
  mid-turn is answered from a staged call of the same request without calling the model again
  (identical requests interchangeably), any other is asked, and a restored turn that ends
  without asking again every call staged for it fails the episode (data,
  ``ModelRequestChanged``), naming them. ``ctx.calls`` lists the episode's calls
  (``ModelCall``).
- **Any side effect can be captured.** ``await ctx.captured_step(name, args, fn)`` runs
  ``fn(args)`` (a web search, a remote tool) once across any crash: its result is staged with
  the model calls under a key of the step's place in the turn, with a digest of its
  arguments, and replayed after a restore without calling ``fn``; changed arguments fail
  closed (``CapturedStepChanged``). Commands in a sandbox need no capture: they run again
  against the restored tree.
- **Plain data only.** ``export`` returns JSON values (dicts, lists, str, int, float, bool,
  None), or an attrs instance which the host unstructures through the project's strict cattrs
  converter; ``restore`` gets the JSON value back. Nothing is ever pickled. ``StateParticipant``
  does the attrs round trip for you. Numbers must be finite: a ``nan`` or ``inf`` (which JSON
  cannot hold) in a reward, a payload, a model response or a session state is refused where it
  is handed over, and the episode fails (data) with a message naming the place
  (``payload[3].x``); so is anything else that is not plain data (a ``set``, say).
- **Sessions may outlive the episode.** A participant with ``retained = True`` (an environment
  whose state the world keeps: a calendar, a file system, a database) keeps a slot's session
  after the episode ends, until the attempt is retired or a newer attempt of the slot opens new
  sessions; such sessions are in every commit and restore. With a ``work_dir`` the host also
  journals them (``work_dir/<instance>/sessions.journal``, one ``write`` per change), so the
  replacement of a dead instance continues them: a session is journaled when it opens, after
  every turn that fetched it with ``ctx.session``, when a claim takes it over and when it is
  freed.
- **Kinds are open.** A participant's ``kind`` names its *role* through a registry
  (``register_participant_kind``): ``agent``, ``legacy_agent``, ``environment``,
  ``model_proxy``, or ``passive`` (state only). ``check_environment`` runs when a deployment
  starts and names what is wrong.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

import attrs

from gymckpt.runtime import BadInput
from gymckpt.runtime._shared import PARTICIPANT_KIND_RE, converter, structure

__all__ = [
    "CALL_DIGEST_HEX",
    "KEY_SEPARATOR",
    "ROLES",
    "AgentParticipant",
    "AgentWrapper",
    "CallId",
    "Done",
    "EnvironmentSpecError",
    "EpisodeConfigError",
    "EpisodeContext",
    "EpisodeFenced",
    "EpisodeInfo",
    "ModelCall",
    "ModelUnavailable",
    "Participant",
    "PayloadTooLarge",
    "StateParticipant",
    "call_id",
    "check_environment",
    "is_retained",
    "parse_call_id",
    "participant_kinds",
    "policy_version_in_force",
    "register_participant_kind",
    "split_capture_key",
    "to_plain",
]

S = TypeVar("S")
JSONValue = Any

ROLES: Final = ("agent", "legacy_agent", "environment", "model_proxy", "passive")
_KIND_RE: Final = PARTICIPANT_KIND_RE
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KINDS: dict[str, str] = {
    "simple_agent": "agent",
    "legacy_agent": "legacy_agent",
    "environment": "environment",
    "model_proxy": "model_proxy",
}


def register_participant_kind(kind: str, role: str) -> None:
    """Declare a participant kind and the role the host gives it (one of ``ROLES``).

    Registering the same kind with the same role again is a no-op; another role is an error.
    """
    if not _KIND_RE.fullmatch(kind):
        raise ValueError(f"participant kind {kind!r} must match {_KIND_RE.pattern}")
    if role not in ROLES:
        raise ValueError(f"role of kind {kind!r} must be one of {', '.join(ROLES)}, got {role!r}")
    have = _KINDS.get(kind)
    if have is not None and have != role:
        raise ValueError(f"participant kind {kind!r} is already registered as role {have!r}")
    _KINDS[kind] = role


def participant_kinds() -> Mapping[str, str]:
    """Every registered kind and its role."""
    return dict(_KINDS)


class EnvironmentSpecError(BadInput, ValueError):
    """An environment cannot be hosted as given (raised when the deployment starts; exit
    code 2 under ``gymckpt.run``)."""


class EpisodeFenced(RuntimeError):
    """This attempt no longer owns its sessions (a newer attempt of the slot exists); the host
    stops the episode and drops its reply."""


class EpisodeConfigError(Exception):
    """The run is configured wrong for every row, not for this one: raised from an episode
    (``step``, a model, a tool, a participant's ``open``), the host answers the row
    ``Failed(..., "config", ...)`` and the trainer stops the run at the first such failure
    (``EpisodeConfigFailed``, exit code 2 under ``gymckpt.run``) with this error's message,
    which names what is wrong and what to change. No row is failed for it: the rows stay in
    the ledger, and a rerun after fixing the configuration resumes from the last snapshot.

    For errors every attempt of every row would meet (a model server that refuses a request
    field, or never returns a field the trainer requires); an error of one row's data is a
    plain exception (data), a server that is down ``ModelUnavailable`` (infra). The model
    client's ``ModelServerIncompatible`` and ``ModelResponseIncomplete`` are ones. A mixin:
    a subclass may also derive from the built-in error it is (``ValueError`` ...)."""


class ModelUnavailable(RuntimeError):
    """The model could not answer for a reason outside the episode (its server is down, timed
    out, or answered 5xx after every retry). Raised from ``ctx.model``, it fails the episode as
    **infra**: the trainer retries the row on a fresh attempt. Any other exception out of
    ``step`` fails it as data."""


POLICY_VERSION: Final[contextvars.ContextVar[int | None]] = contextvars.ContextVar(
    "gymckpt_policy_version", default=None
)
"""The trainer's policy version a model call is asked under, set by the host around the
call of the model (``policy_version_in_force``)."""


def policy_version_in_force() -> int | None:
    """Inside a model's call: the trainer's policy version the host records the call under
    (``ModelCall.policy_version``), so a model can check the weights that answer it; None
    outside a call made by the host."""
    return POLICY_VERSION.get()


class PayloadTooLarge(ValueError):
    """An episode's trajectory payload is over the host's limit."""


@attrs.frozen
class EpisodeInfo:
    """Who an episode is: its attempt identity, the deployment seed, the instance, and its
    ``task`` from the trainer's dataset (a JSON value, the same for every attempt of the row;
    None when the trainer gave no dataset and the environment reads its data by ``row``)."""

    rollout_id: str
    row: int
    slot: int
    attempt: int
    seed: int
    instance: str
    task: Any = None

    @property
    def session_key(self) -> str:
        """The slot's sessions, shared by its attempts: the rollout ID without its attempt
        suffix, ``"{position}-{slot}"`` (the trainer's rows are positions in its row order:
        a dataset row trained in two epochs is two slots, with sessions of their own). For
        the default order that is ``"{row}-{slot}"``, which is also the key of an ID that is
        not canonical (``rollout_id_for``)."""
        m = _CANONICAL_ID.match(self.rollout_id)
        return f"{self.row}-{self.slot}" if m is None else m.group(1)


_CANONICAL_ID: Final = re.compile(r"((?:0|[1-9][0-9]*)-(?:0|[1-9][0-9]*))(?:-a[1-9][0-9]*)?\Z")
"""A canonical rollout ID; group 1 is its slot key."""

KEY_SEPARATOR: Final = ":"
"""Between a capture key's attempt key and its call id."""


CALL_DIGEST_HEX: Final = 16
"""How many hex digits of a request's digest a call id carries."""
_CALL_ID_RE: Final = re.compile(rf"t(\d+)-([0-9a-f]{{{CALL_DIGEST_HEX}}})-c(\d+)")


def call_id(turn: int, request_digest: str, occurrence: int) -> str:
    """A model call's id within its episode: ``"t{turn}-{d}-c{occurrence}"``, where ``d`` is
    the first ``CALL_DIGEST_HEX`` hex digits of the sha256 of the request's canonical JSON and
    ``occurrence`` counts the calls of the same request the turn asked before it (0 for the
    first). It says which question it is, never when it was asked: concurrent calls of a turn
    (a nursery, a task group, ``asyncio.gather``) get the same ids whatever order they start in,
    and every attempt of the slot gets the same ids, so a restored attempt replays its staged
    calls by id."""
    if len(request_digest) < CALL_DIGEST_HEX:
        raise ValueError(f"request digest {request_digest!r} is shorter than {CALL_DIGEST_HEX}")
    return f"t{turn}-{request_digest[:CALL_DIGEST_HEX]}-c{occurrence}"


@attrs.frozen
class CallId:
    """A call id's parts (``parse_call_id``): its ``turn``, the ``request`` digest's first
    ``CALL_DIGEST_HEX`` hex digits, its ``occurrence`` among the turn's calls of that request."""

    turn: int
    request: str
    occurrence: int


def parse_call_id(call: str) -> CallId:
    """The parts of call id ``call`` (``call_id``); ``ValueError`` for another shape (the
    ``"t{turn}-c{n}"`` of manifest version 3, say)."""
    m = _CALL_ID_RE.fullmatch(call)
    if m is None:
        raise ValueError(f'call id {call!r} is not "t{{turn}}-{{request digest}}-c{{occurrence}}"')
    return CallId(int(m[1]), m[2], int(m[3]))


def split_capture_key(key: str) -> tuple[str, str]:
    """``(attempt_key, call_id)`` of capture key ``key``; ``ValueError`` for a key of another
    shape (an old ``"{row}-{slot}/t{turn}/c{n}"`` key, say)."""
    attempt, sep, call = key.rpartition(KEY_SEPARATOR)
    if not sep or not attempt or not call or "/" in key:
        raise ValueError(f'capture key {key!r} is not "{{attempt_key}}:{{call_id}}"')
    return attempt, call


@attrs.frozen
class ModelCall:
    """One model call of an episode as the host captured it (``EpisodeContext.calls``): its
    capture ``key``, the sha256 (hex) of its request's canonical JSON, the trainer's
    ``policy_version`` the instance knew when the call was asked, and ``replayed``: made by an
    earlier attempt and restored with the episode (so its response and version are the
    original's; this attempt did not ask the model)."""

    key: str
    request_digest: str
    policy_version: int
    replayed: bool


@attrs.frozen
class Done:
    """The end of an episode: its reward and its trajectory payload for the trainer (a JSON
    value or an attrs instance, unstructured through the project's converter). ``turns`` is
    the turn count the trainer sees; None: the calls of ``step``, this one included (give it
    when the last call only reports the end, as the calendar workplace's agent does)."""

    reward: float
    payload: Any = None
    turns: int | None = None


@runtime_checkable
class Participant(Protocol):
    """A participant of every instance. ``open`` makes a session's state for an episode;
    ``export``/``restore`` turn it into plain data and back (the host checks the round trip
    is JSON). ``name`` is the server name, ``kind`` a registered participant kind. An optional
    class attribute ``retained = True`` keeps its sessions after the episode (module docstring).

    An optional method ``state_version(state) -> int | str | None`` lets the host skip
    exporting a state that did not change: the host takes an episode's boundary mark (what an
    unaligned cut takes it at) at every step boundary, and a state whose version equals, not
    None, the one at the episode's previous mark (the same state object, not replaced
    meanwhile) is not exported again; its bytes from that mark are reused. The version must
    change whenever what ``export`` would return changes (a counter bumped on every
    mutation); None means "unknown: export it". Without the method every mark exports.

    Objects (state too large for JSON, such as a sandbox's files): a participant MAY keep them
    in an attribute ``objects: ObjectStore`` (``gymckpt.runtime.lowlevel``: content-addressed,
    immutable) and name them in its exported states, with a method ``object_refs(data) ->
    Iterable[str]`` returning the ``"sha256:<hex>"`` references one exported state names. At a
    commit the host puts every object the committed states name into the snapshot (shared
    between snapshots: an object already stored is only linked, never written again); one
    missing from ``objects`` fails the commit, naming the participant and the reference. At a
    restore, before ``restore(data)`` is called, every object the committed states name that
    ``objects`` lacks is put there from the snapshot (checked against its reference), so
    ``restore`` finds them however fresh the store. The participant keeps each object it named
    in an exported state (it never deletes or rewrites one): a later commit of an unaligned
    cut may still name it. Both or neither: with only one of them, the host ignores both.
    """

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    def open(self, info: EpisodeInfo) -> Any: ...

    def export(self, state: Any) -> JSONValue: ...

    def restore(self, data: JSONValue) -> Any: ...


def is_retained(participant: Any) -> bool:
    """Whether ``participant``'s sessions outlive their episode (``retained = True``)."""
    return getattr(participant, "retained", False) is True


@runtime_checkable
class AgentParticipant(Participant, Protocol):
    """The agent: a participant whose ``step`` runs one turn of the episode (between two step
    boundaries) and returns ``Done`` to finish it, or None to go on."""

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None: ...


@attrs.frozen
class AgentWrapper:
    """An agent that wraps another (``inner``): the same name, kind and session state (``open``,
    ``export`` and ``restore`` are the inner agent's), and by default the same ``step``. A
    subclass overrides ``step`` to act around the inner agent's turn (fan calls out, inject a
    fault, log) and adds its own fields as keyword-only ones."""

    inner: AgentParticipant
    name: str = attrs.field(init=False)
    kind: str = attrs.field(init=False)

    @name.default
    def _inner_name(self) -> str:
        return self.inner.name

    @kind.default
    def _inner_kind(self) -> str:
        return self.inner.kind

    def open(self, info: EpisodeInfo) -> Any:
        return self.inner.open(info)

    def export(self, state: Any) -> Any:
        return self.inner.export(state)

    def restore(self, data: Any) -> Any:
        return self.inner.restore(data)

    async def step(self, ctx: EpisodeContext, state: Any) -> Done | None:
        return await self.inner.step(ctx, state)


@attrs.frozen
class StateParticipant:
    """A participant whose session state is an attrs class (``state_type``), made by
    ``factory(info)``; export and restore go through the project's strict cattrs converter."""

    name: str
    kind: str
    state_type: type[Any]
    factory: Callable[[EpisodeInfo], Any]
    retained: bool = False

    def open(self, info: EpisodeInfo) -> Any:
        return self.factory(info)

    def export(self, state: Any) -> JSONValue:
        return converter.unstructure(state)

    def restore(self, data: JSONValue) -> Any:
        return structure(data, self.state_type, f"participant {self.name} session state")


_PLAIN: Final = frozenset({dict, list, str, int, float, bool, type(None)})


def to_plain(value: Any) -> JSONValue:
    """``value`` as a JSON value: attrs instances through the project's converter."""
    if type(value) in _PLAIN:  # the common case, asked once per session in every commit
        return value
    if attrs.has(type(value)):
        return converter.unstructure(value)
    return value


Model = Callable[[str, Any, EpisodeInfo], Any | Awaitable[Any]]
"""A model or policy: ``model(capture_key, request, info)`` returns (or awaits) a JSON value."""


class EpisodeContext(Protocol):
    """What ``AgentParticipant.step`` gets from the host for one turn."""

    @property
    def info(self) -> EpisodeInfo: ...

    @property
    def turn(self) -> int:
        """Turns done before this one (the step boundary the episode is at)."""
        ...

    def session(self, name: str) -> Any:
        """The state of participant ``name``'s session; ``EpisodeFenced`` if this attempt no
        longer owns the slot."""
        ...

    def replace_session(self, name: str, state: Any) -> None:
        """Replace participant ``name``'s session state (for immutable states)."""
        ...

    async def model(self, request: Any) -> Any:
        """Call the environment's model under this request's capture key in the turn; after a
        restore, a response staged for the same request in this turn is returned without
        calling it. Concurrent calls are fine: their keys do not depend on start order."""
        ...

    async def captured_step(self, name: str, args: Any, fn: Callable[[Any], Any]) -> Any:
        """``fn(args)`` (awaited if it returns an awaitable), its result captured like a model
        call: staged under the capture key of (this turn, ``name``, its occurrence among the
        turn's steps of that name) with the sha256 of its arguments, committed with the
        episode, and after a restore returned without calling ``fn`` again. Arguments that
        differ from the staged ones fail closed (``CapturedStepChanged``, naming the key and
        both digests). ``args`` and the result must round-trip exactly through JSON, else
        ``NotExactJSON`` names the place. Steps of one name in a turn are matched in the order
        they are asked: give concurrent steps distinct names. Needs the environment's model
        proxy (``Environment(model=...)``): the captures are its records."""
        ...

    @property
    def calls(self) -> tuple[ModelCall, ...]:
        """Every model call of the episode so far, in order, earlier attempts' included: put
        them in the payload so the trajectory says which policy version produced each turn."""
        ...

    def count(self, name: str, n: int = 1) -> int:
        """Add ``n`` to the instance's counter ``name`` (in ``HostStatistics.counters``) and
        return its new value; allowed for a fenced attempt too."""
        ...

    def hold(self) -> None:
        """Fault injection: stay at the next step boundary until a checkpoint is prepared (and
        then, parked, until it resumes). Makes "an episode parked right after this turn"
        deterministic in a test."""
        ...


def check_environment(agent: Any, participants: tuple[Any, ...], has_model: bool) -> None:
    """Check an environment before a deployment starts; ``EnvironmentSpecError`` names every
    problem (unknown kind, missing method, duplicate or reserved name, roles)."""
    problems: list[str] = []
    every = (agent, *participants)
    names: list[str] = []
    for p in every:
        label = f"participant {getattr(p, 'name', p)!r}"
        name, kind = getattr(p, "name", None), getattr(p, "kind", None)
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            problems.append(f"{label}: name must be a string matching {_NAME_RE.pattern}")
        else:
            names.append(name)
        if not isinstance(kind, str) or kind not in _KINDS:
            problems.append(
                f"{label}: kind {kind!r} is not registered (known: {', '.join(sorted(_KINDS))}; "
                "add one with gymckpt.gym_adapter.register_participant_kind(kind, role))"
            )
        for method in ("open", "export", "restore"):
            if not callable(getattr(p, method, None)):
                problems.append(f"{label}: has no {method}() method")
    if not callable(getattr(agent, "step", None)):
        problems.append(f"agent {getattr(agent, 'name', agent)!r}: has no async step(ctx, state)")
    if _KINDS.get(getattr(agent, "kind", ""), "") not in ("agent", "legacy_agent"):
        problems.append(
            f"agent {getattr(agent, 'name', agent)!r}: kind {getattr(agent, 'kind', None)!r} "
            "does not have the agent or legacy_agent role"
        )
    for p in participants:
        role = _KINDS.get(getattr(p, "kind", ""), "")
        if role in ("agent", "legacy_agent", "model_proxy"):
            problems.append(
                f"participant {getattr(p, 'name', p)!r}: role {role} is the host's "
                "(give the agent as agent=, the model as model=)"
            )
    if is_retained(agent):
        problems.append(
            f"agent {getattr(agent, 'name', agent)!r}: an agent's sessions end with its episode "
            "(retained = True is for environment participants)"
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"participant names used twice: {', '.join(dupes)}")
    if has_model and "model_proxy" in names:
        problems.append("participant name 'model_proxy' is reserved for the model proxy")
    if problems:
        raise EnvironmentSpecError("environment cannot be hosted: " + "; ".join(problems))
