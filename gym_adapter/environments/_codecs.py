"""State codecs for Gymnasium environments: a live ``gymnasium.Env`` as plain JSON data and back.

A Gymnasium environment has no checkpoint contract, so the host cannot export it by itself. A
**state codec** knows which attributes of the unwrapped environment change while it runs; with
the environment's random generator (its ``np_random`` bit generator state) and the
``TimeLimit`` wrapper's step count, that is everything a continuation needs to produce the same
observations, rewards and terminations, bit for bit, as an uninterrupted run.

Values are encoded as JSON with tags for what JSON lacks: ``{"$nd": dtype, "shape", "data"}``
for arrays, ``{"$np": dtype, "v"}`` for numpy scalars, ``{"$tuple": [...]}``,
``{"$dict": {...}}`` and ``{"$int": "..."}`` for integers beyond 64 bits (the PCG64 state).
Floats round-trip exactly through JSON (shortest repr), float32 through float64.
``AttributeCodec`` writes ``{"fields": {...}, "unset": [...], "rng": ..., "elapsed_steps": n}``:
a field whose value is None is named in ``"unset"`` (no JSON ``null``: the host's boundary mark
of a state without one is finite on sight), ``"unset"`` and ``"elapsed_steps"`` are left out
when empty or without a ``TimeLimit``; a state written with ``null`` restores the same.

Built-in codecs cover the classic-control (CartPole, MountainCar, MountainCarContinuous,
Acrobot, Pendulum) and toy-text (FrozenLake, Taxi, CliffWalking, Blackjack) environments; a user
registers their own with ``register_state_codec(name, codec)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Protocol

import attrs
import gymnasium
import numpy as np

__all__ = [
    "AttributeCodec",
    "ExportMemo",
    "StateCodec",
    "builtin_codec_names",
    "codec_for",
    "decode_value",
    "encode_value",
    "register_state_codec",
]

_INT64: Final = 1 << 63


_AS_IS: Final = frozenset({float, str, bool, type(None)})


def encode_value(value: Any) -> Any:
    """``value`` (numpy arrays and scalars, tuples, dicts, big ints included) as JSON data."""
    t = type(value)  # the exact types first: one lookup each (an export runs at every boundary)
    if t in _AS_IS:
        return value
    if t is int:
        return value if -_INT64 <= value < _INT64 else {"$int": str(value)}
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                return _encode_other(value)
            out[k] = encode_value(v)
        return {"$dict": out}
    return _encode_other(value)


def _encode_other(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"$nd": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
    if isinstance(value, np.generic):
        return {"$np": value.dtype.str, "v": value.item()}
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else {"$int": str(value)}
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v) for v in value]}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only dicts with string keys can be encoded")
        return {"$dict": {k: encode_value(v) for k, v in value.items()}}
    raise TypeError(f"cannot encode a {type(value).__name__} as state")


def decode_value(data: Any) -> Any:
    """The inverse of ``encode_value``."""
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "$nd" in data:
        return np.array(data["data"], dtype=np.dtype(data["$nd"])).reshape(data["shape"])
    if "$np" in data:
        return np.dtype(data["$np"]).type(data["v"])
    if "$int" in data:
        return int(data["$int"])
    if "$tuple" in data:
        return tuple(decode_value(v) for v in data["$tuple"])
    if "$dict" in data:
        return {k: decode_value(v) for k, v in data["$dict"].items()}
    raise ValueError(f"unknown encoded value with keys {sorted(data)}")


class StateCodec(Protocol):
    """Exports a live environment's dynamic state and restores it into a fresh one made by
    ``gymnasium.make`` of the same id (and reset once)."""

    def export(self, env: gymnasium.Env[Any, Any]) -> Any: ...

    def restore(self, env: gymnasium.Env[Any, Any], data: Any) -> None: ...


def _time_limit(env: gymnasium.Env[Any, Any]) -> Any:
    e: Any = env
    while isinstance(e, gymnasium.Wrapper):
        if isinstance(e, gymnasium.wrappers.TimeLimit):
            return e
        e = e.env
    return None


@attrs.define(slots=True, eq=False)
class ExportMemo:
    """What ``AttributeCodec.export`` keeps of one live environment between its exports: the
    unwrapped environment and its ``TimeLimit`` (fixed for the environment's life), and its
    generator's last state with that state's encoding (reused while the state is unchanged:
    a classic-control environment draws only at ``reset``)."""

    unwrapped: Any
    time_limit: Any
    rng_state: Any = None
    rng_data: Any = None


@attrs.frozen
class AttributeCodec:
    """A codec that saves ``fields`` of the unwrapped environment (missing ones as absent),
    its ``np_random`` state and the ``TimeLimit`` step count.

    A field whose value is None is named in ``"unset"`` rather than written as JSON ``null``
    (so the host's mark of the state stays on its fast path: output without ``null`` is
    finite); ``"elapsed_steps"`` is left out without a ``TimeLimit``. A state written with
    ``null`` (before this encoding) restores the same."""

    fields: tuple[str, ...]

    def memo(self, env: gymnasium.Env[Any, Any]) -> ExportMemo:
        """A fresh ``ExportMemo`` of ``env`` for ``export``."""
        return ExportMemo(env.unwrapped, _time_limit(env))

    def export(self, env: gymnasium.Env[Any, Any], memo: ExportMemo | None = None) -> Any:
        """``env``'s state as JSON data. With ``memo`` (of this ``env``, from ``memo``), the
        generator's encoding is reused while its state is unchanged: the same object, so an
        export is read-only data (the host serialises it at once)."""
        if memo is None:
            memo = self.memo(env)
        u = memo.unwrapped
        out: dict[str, Any] = {}
        fields: dict[str, Any] = {}
        unset: list[str] = []
        for f in self.fields:
            value = getattr(u, f, _ABSENT)
            if value is None:
                unset.append(f)
            elif value is not _ABSENT:
                fields[f] = encode_value(value)
        out["fields"] = fields
        if unset:
            out["unset"] = unset
        out["rng"] = _rng_data(u.np_random.bit_generator, memo)
        tl = memo.time_limit
        if tl is not None:
            out["elapsed_steps"] = tl._elapsed_steps
        return out

    def restore(self, env: gymnasium.Env[Any, Any], data: Any) -> None:
        u = env.unwrapped
        unset = data.get("unset", ())
        unknown = (set(data["fields"]) | set(unset)) - set(self.fields)
        if unknown:
            raise ValueError(f"state has fields this codec does not know: {sorted(unknown)}")
        for name, value in data["fields"].items():
            setattr(u, name, decode_value(value))
        for name in unset:
            setattr(u, name, None)
        u.np_random.bit_generator.state = decode_value(data["rng"])
        tl = _time_limit(env)
        elapsed = data.get("elapsed_steps")
        if tl is not None and elapsed is not None:
            tl._elapsed_steps = int(elapsed)


_ABSENT: Final = object()


def _rng_data(bit_generator: Any, memo: ExportMemo) -> Any:
    """``bit_generator``'s state encoded, reusing ``memo``'s encoding of an equal state (PCG64
    only: its state is plain ints, compared exactly; another generator is encoded each time)."""
    state = bit_generator.state
    if type(bit_generator) is not np.random.PCG64:
        return encode_value(state)
    if memo.rng_data is None or state != memo.rng_state:
        memo.rng_state, memo.rng_data = state, encode_value(state)
    return memo.rng_data


_CODECS: dict[str, StateCodec] = {
    "CartPole": AttributeCodec(("state", "steps_beyond_terminated")),
    "MountainCar": AttributeCodec(("state",)),
    "MountainCarContinuous": AttributeCodec(("state",)),
    "Acrobot": AttributeCodec(("state",)),
    "Pendulum": AttributeCodec(("state", "last_u")),
    "FrozenLake": AttributeCodec(("s", "lastaction")),
    "Taxi": AttributeCodec(("s", "lastaction", "taxi_orientation", "fickle_step")),
    "CliffWalking": AttributeCodec(("s", "lastaction")),
    "Blackjack": AttributeCodec(
        ("dealer", "player", "dealer_top_card_suit", "dealer_top_card_value_str")
    ),
}
_BUILTIN: Final = tuple(_CODECS)


def builtin_codec_names() -> tuple[str, ...]:
    """Environment names (ids without version) with a built-in codec."""
    return _BUILTIN


def register_state_codec(name: str, codec: StateCodec) -> None:
    """Register ``codec`` for environment ``name``: an id (``"MyEnv-v2"``) or a name without
    version (``"MyEnv"``, every version). An id takes precedence over its name."""
    if not callable(getattr(codec, "export", None)) or not callable(
        getattr(codec, "restore", None)
    ):
        raise TypeError("a state codec has export(env) and restore(env, data)")
    _CODECS[name] = codec


_VERSION_SUFFIX: Final = re.compile(r"-v\d+$")


def codec_for(env_id: str, codecs: Mapping[str, StateCodec] | None = None) -> StateCodec | None:
    """The codec of ``env_id`` (by id, then by name without its version), or None.

    The version is a trailing ``-v<digits>``, as gymnasium's ``parse_env_id`` reads it: an id
    like ``"Foo-vision"`` has no version and is looked up whole, never as ``"Foo"``."""
    table = _CODECS if codecs is None else codecs
    if env_id in table:
        return table[env_id]
    name = _VERSION_SUFFIX.sub("", env_id.split(":")[-1])
    return table.get(name)
