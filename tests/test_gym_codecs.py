"""State codecs for Gymnasium environments (``gym_adapter.environments._codecs``):
``encode_value`` and
``decode_value`` are inverses through JSON for every tagged kind (arrays, numpy scalars,
tuples, dicts, big ints) and refuse what they cannot carry; ``AttributeCodec`` carries its
fields, the random generator and the ``TimeLimit`` count and refuses fields it does not know;
``codec_for`` looks up an id, then its name without version; ``register_state_codec`` refuses
what is not a codec."""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import numpy as np
import pytest

from gymckpt.gym_adapter.environments import _codecs as _gym_codecs
from gymckpt.gym_adapter.environments._codecs import (
    AttributeCodec,
    builtin_codec_names,
    codec_for,
    decode_value,
    encode_value,
    register_state_codec,
)


def through_json(value: Any) -> Any:
    return decode_value(json.loads(json.dumps(encode_value(value))))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        0.1,
        1e-310,
        "s",
        (1, (2.5, "x")),
        [1, [2, (3,)]],
        {"a": (1, 2), "b": {"c": None}},
        (1 << 63) - 1,
        -(1 << 63),
        1 << 63,
        -(1 << 63) - 1,
        1 << 128,
    ],
)
def test_plain_values_round_trip(value: Any) -> None:
    back = through_json(value)
    assert back == value
    assert type(back) is type(value)


def test_big_ints_are_tagged_exactly_beyond_64_bits() -> None:
    assert encode_value((1 << 63) - 1) == (1 << 63) - 1
    assert encode_value(-(1 << 63)) == -(1 << 63)
    assert encode_value(1 << 63) == {"$int": str(1 << 63)}
    assert encode_value(-(1 << 63) - 1) == {"$int": str(-(1 << 63) - 1)}


def test_bool_stays_bool_and_tuple_is_not_a_list() -> None:
    assert encode_value(True) is True
    assert encode_value((1,)) == {"$tuple": [1]}
    assert encode_value([1]) == [1]
    assert encode_value({"k": 1}) == {"$dict": {"k": 1}}


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1.5, -2.0], [3.25, 0.1]], dtype=np.float64),
        np.array([0.1, 1e-7], dtype=np.float32),
        np.arange(6, dtype=np.int64).reshape(2, 3, 1),
        np.array(3, dtype=np.int32),
        np.zeros((0, 2), dtype=np.uint8),
        np.array([True, False]),
    ],
)
def test_arrays_keep_dtype_shape_and_bits(array: np.ndarray) -> None:
    back = through_json(array)
    assert isinstance(back, np.ndarray)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()


@pytest.mark.parametrize(
    "scalar", [np.float32(0.1), np.float64(-2.5), np.int64(-3), np.uint8(200), np.bool_(True)]
)
def test_numpy_scalars_keep_their_type(scalar: np.generic) -> None:
    back = through_json(scalar)
    assert type(back) is type(scalar)
    assert back.tobytes() == scalar.tobytes()


class Text(str):
    pass


class Mapping(dict):  # type: ignore[type-arg]
    pass


def test_subclasses_and_mixed_keys_take_the_general_path() -> None:
    assert encode_value(Mapping(a=(1,))) == {"$dict": {"a": {"$tuple": [1]}}}
    assert encode_value({Text("k"): 1}) == {"$dict": {"k": 1}}
    assert type(encode_value(Text("v"))) is Text
    assert encode_value(np.float64(0.5)) == {"$np": "<f8", "v": 0.5}
    with pytest.raises(TypeError, match="only dicts with string keys"):
        encode_value({"a": 1, 2: "b"})  # refused whole, after a key that is a string


def test_refusals() -> None:
    with pytest.raises(TypeError, match="only dicts with string keys"):
        encode_value({1: "a"})
    with pytest.raises(TypeError, match="cannot encode a set as state"):
        encode_value({1, 2})
    with pytest.raises(TypeError, match="cannot encode a object as state"):
        encode_value([object()])
    with pytest.raises(ValueError, match=r"unknown encoded value with keys \['a', 'b'\]"):
        decode_value({"b": 1, "a": 2})
    with pytest.raises(ValueError, match="unknown encoded value"):
        decode_value([{"$nope": 1}])


def test_pcg64_state_round_trips() -> None:
    rng = np.random.default_rng(12345)
    rng.random(3)
    state = rng.bit_generator.state
    twin = np.random.default_rng(0)
    twin.bit_generator.state = through_json(state)
    assert twin.random(5).tolist() == rng.random(5).tolist()


def _cartpole(seed: int = 3) -> gymnasium.Env[Any, Any]:
    env = gymnasium.make("CartPole-v1")
    env.reset(seed=seed)
    return env


def test_attribute_codec_continues_a_run_bit_for_bit() -> None:
    codec = codec_for("CartPole-v1")
    assert codec is not None
    env = _cartpole()
    for _ in range(4):
        env.step(1)
    data = json.loads(json.dumps(codec.export(env)))
    assert data["elapsed_steps"] == 4
    assert set(data["fields"]) == {"state"}
    assert data["unset"] == ["steps_beyond_terminated"]  # None, named: no JSON null
    twin = _cartpole(seed=99)
    twin.unwrapped.steps_beyond_terminated = 7  # restored to None, not left as it was
    codec.restore(twin, data)
    assert twin._elapsed_steps == 4  # type: ignore[attr-defined]
    assert twin.unwrapped.steps_beyond_terminated is None
    for action in (0, 1, 1, 0):
        a, b = env.step(action), twin.step(action)
        assert a[0].tobytes() == b[0].tobytes() and a[1:4] == b[1:4]
    assert env.unwrapped.np_random.random() == twin.unwrapped.np_random.random()


def test_attribute_codec_leaves_out_missing_fields_and_has_no_limit_unwrapped() -> None:
    codec = AttributeCodec(("state", "no_such_attribute"))
    env = _cartpole().unwrapped
    data = codec.export(env)
    assert set(data["fields"]) == {"state"}
    assert "elapsed_steps" not in data and "unset" not in data
    wrapped = _cartpole()
    wrapped.step(0)
    codec.restore(wrapped, data)  # no count leaves the wrapper's count alone
    assert wrapped._elapsed_steps == 1  # type: ignore[attr-defined]


def test_attribute_codec_refuses_unknown_fields() -> None:
    data = AttributeCodec(("state", "steps_beyond_terminated")).export(_cartpole())
    env = _cartpole()
    before = env.unwrapped.state.copy()
    with pytest.raises(ValueError, match=r"fields this codec does not know: \['steps_beyond"):
        AttributeCodec(("state",)).restore(env, data)
    assert env.unwrapped.state.tobytes() == before.tobytes()  # refused before any change


def test_builtin_names() -> None:
    names = builtin_codec_names()
    assert set(names) >= {"CartPole", "MountainCar", "Pendulum", "FrozenLake", "Taxi", "Blackjack"}
    assert all(codec_for(f"{n}-v0") is not None for n in names)


def test_codec_for_prefers_the_id_over_the_name() -> None:
    by_name, by_id = AttributeCodec(("a",)), AttributeCodec(("b",))
    table = {"MyEnv": by_name, "MyEnv-v2": by_id}
    assert codec_for("MyEnv-v2", table) is by_id
    assert codec_for("MyEnv-v1", table) is by_name
    assert codec_for("MyEnv", table) is by_name
    assert codec_for("pkg.module:MyEnv-v7", table) is by_name
    assert codec_for("Other-v0", table) is None
    assert codec_for("CartPole-v1", table) is None  # a given table replaces the built-ins
    assert codec_for("NoSuchEnv-v0") is None


def test_codec_for_strips_only_a_version() -> None:
    """A trailing ``-v<digits>`` is a version; ``-vision`` is part of the name (gymnasium's
    ``parse_env_id`` reads ``"Foo-vision"`` as the name ``"Foo-vision"``, no version)."""
    codec = AttributeCodec(())
    assert codec_for("Foo-vision", {"Foo": codec}) is None
    assert codec_for("Foo-v12", {"Foo": codec}) is codec
    assert codec_for("pkg.mod:Foo-v0", {"Foo": codec}) is codec


def test_register_state_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gym_codecs, "_CODECS", dict(_gym_codecs._CODECS))
    codec = AttributeCodec(("s",))
    register_state_codec("GymckptT1Env", codec)
    assert codec_for("GymckptT1Env-v3") is codec

    class Half:
        def export(self, env: Any) -> Any:
            return None

    class NotCallable:
        export = restore = None

    for bad in (Half(), NotCallable(), object()):
        with pytest.raises(TypeError, match=r"has export\(env\) and restore\(env, data\)"):
            register_state_codec("GymckptT1Bad", bad)  # type: ignore[arg-type]
    assert codec_for("GymckptT1Bad") is None


def test_attribute_codec_exports_no_json_null() -> None:
    """A None field (CartPole's ``steps_beyond_terminated`` until it ends) is named in
    ``unset``, never written as ``null``: a mark of a state without ``null`` is finite on sight
    (``host/_cut.py`` ``_finite_json``), one with it pays a second encoding and a decoding."""
    codec = codec_for("CartPole-v1")
    assert codec is not None
    env = _cartpole()
    env.step(0)
    assert env.unwrapped.steps_beyond_terminated is None
    assert "null" not in json.dumps(codec.export(env))


def test_attribute_codec_restores_a_state_written_with_null() -> None:
    """A state exported before ``unset`` (its None fields and a missing count as ``null``)
    restores the same as today's."""
    codec = codec_for("CartPole-v1")
    assert codec is not None
    env = _cartpole()
    env.step(1)
    data = json.loads(json.dumps(codec.export(env)))
    old = {
        "fields": {**data["fields"], "steps_beyond_terminated": None},
        "rng": data["rng"],
        "elapsed_steps": data["elapsed_steps"],
    }
    twin = _cartpole(seed=99)
    twin.unwrapped.steps_beyond_terminated = 2
    codec.restore(twin, old)
    assert twin.unwrapped.steps_beyond_terminated is None
    assert twin._elapsed_steps == 1  # type: ignore[attr-defined]
    assert env.step(0)[0].tobytes() == twin.step(0)[0].tobytes()
    no_count = {**old, "elapsed_steps": None}
    codec.restore(twin, no_count)  # None leaves the wrapper's count alone
    assert twin._elapsed_steps == 2  # type: ignore[attr-defined]


def test_attribute_codec_refuses_unknown_unset_fields() -> None:
    env = _cartpole()
    with pytest.raises(ValueError, match=r"fields this codec does not know: \['x'\]"):
        AttributeCodec(("state",)).restore(env, {"fields": {}, "unset": ["x"], "rng": None})


def test_a_memo_reuses_the_generator_encoding_only_while_its_state_is_unchanged() -> None:
    """With an ``ExportMemo`` the generator's state is encoded again only when it changed: a
    draw (``reset``) is seen at the next export, which equals a memo-less one."""
    codec = AttributeCodec(("state",))
    env = _cartpole()
    memo = codec.memo(env)
    first = codec.export(env, memo)
    env.step(0)
    second = codec.export(env, memo)
    assert second["rng"] is first["rng"]  # unchanged: the same encoding, not a new one
    assert second == codec.export(env)
    env.reset()  # draws the initial state from the generator
    third = codec.export(env, memo)
    assert third["rng"] != first["rng"]
    assert third == codec.export(env)
    twin = _cartpole(seed=99)
    codec.restore(twin, json.loads(json.dumps(third)))
    assert twin.unwrapped.np_random.random() == env.unwrapped.np_random.random()


def test_a_memo_is_not_used_for_other_generators() -> None:
    """A generator other than PCG64 (MT19937's state holds an array) is encoded each time."""
    codec = AttributeCodec(("state",))
    env = _cartpole()
    env.unwrapped.np_random = np.random.Generator(np.random.MT19937(5))
    memo = codec.memo(env)
    first = codec.export(env, memo)
    env.unwrapped.np_random.random()
    second = codec.export(env, memo)
    assert second["rng"] != first["rng"] and second == codec.export(env)
