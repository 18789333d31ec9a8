"""Tests for ``gymckpt.runtime._plain``: finite JSON values, checked where they enter.

``checked_json`` returns ``orjson.dumps`` of the value (numpy serialised) or raises
``NotPlainData`` naming the place that is wrong (``v.a[1].b is inf``): a non-finite number, a
non-str key, a value JSON has no word for. ``None`` and ``null`` in the output are fine.
``plain_problem`` and ``all_finite`` are the slow and the C paths behind it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import orjson
import pytest

from gymckpt.runtime._plain import NotPlainData, all_finite, checked_json, plain_problem

NAN = float("nan")
INF = float("inf")


def refused(value: Any, where: str = "v") -> str:
    with pytest.raises(NotPlainData) as info:
        checked_json(value, where)
    return str(info.value)


@dataclasses.dataclass
class Point:
    x: float
    y: Any = None


def test_plain_data_is_orjson_dumps_and_none_is_fine() -> None:
    for value in [
        None,
        {"a": [None, 1.5, (2, None)], "b": {"c": "null"}},
        [True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1],
        "text with null in it",
        [],
        {},
    ]:
        assert checked_json(value, "v") == orjson.dumps(value)
    assert checked_json(Point(1.0), "v") == b'{"x":1.0,"y":null}'


def test_not_plain_data_is_a_value_error() -> None:
    assert issubclass(NotPlainData, ValueError)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (NAN, "v is nan, not a finite number"),
        (-INF, "v is -inf, not a finite number"),
        ({"a": [1, {"b": INF}]}, "v.a[1].b is inf, not a finite number"),
        ((1, (2, NAN)), "v[1][1] is nan, not a finite number"),
        ({"x y": [0, -INF]}, "v['x y'][1] is -inf, not a finite number"),
        ({"p": Point(INF)}, "v.p.x is inf, not a finite number"),
        ([None, {"k": None}, NAN], "v[2] is nan, not a finite number"),
    ],
)
def test_a_non_finite_number_is_refused_naming_its_place(value: Any, message: str) -> None:
    assert refused(value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1: 2}, "v: key 1 is int, not str"),
        ({"k": {(1, 2): 0}}, "v.k: key (1, 2) is tuple, not str"),
        ({"s": {1, 2}}, "v.s is a set, not plain data (JSON values only)"),
        (b"x", "v is a bytes, not plain data (JSON values only)"),
        ([0, complex(1, 2)], "v[1] is a complex, not plain data (JSON values only)"),
        ([object()], "v[0] is a object, not plain data (JSON values only)"),
    ],
)
def test_a_value_json_has_no_word_for_is_refused_naming_its_place(value: Any, message: str) -> None:
    assert refused(value) == message


def test_an_integer_past_64_bits_is_refused() -> None:
    assert refused({"n": 2**64}, "payload").startswith("payload is not plain data (")
    assert refused(-(2**63) - 1, "payload").startswith("payload is not plain data (")


def test_the_first_problem_in_order_is_the_one_named() -> None:
    assert refused([1, [NAN], {"a": INF}]) == "v[1][0] is nan, not a finite number"
    assert refused({"a": 1, "b": {1}, "c": NAN}) == (
        "v.b is a set, not plain data (JSON values only)"
    )


def test_the_name_given_is_the_root_of_every_place() -> None:
    assert refused({"r": NAN}, "row 0 slot 1 reward") == (
        "row 0 slot 1 reward.r is nan, not a finite number"
    )


def test_plain_problem_without_types_counts_only_non_finite_numbers() -> None:
    assert plain_problem({"a": {1}}, "w", types=False) is None
    assert plain_problem({"a": [NAN]}, "w", types=False) == "w.a[0] is nan, not a finite number"
    assert plain_problem(Point(INF), "w", types=False) == "w.x is inf, not a finite number"
    assert plain_problem(Point(1.0), "w") == "w is a Point, not plain data (JSON values only)"
    assert plain_problem({"a": [1, None, "s", 2.5]}, "w") is None


def test_all_finite_asks_the_c_encoder_and_says_when_it_cannot_tell() -> None:
    assert all_finite([1.0, None, {"a": 2}]) is True
    assert all_finite([1.0, NAN]) is False
    assert all_finite({"a": -INF}) is False
    assert all_finite({1, 2}) is None
    assert all_finite(Point(1.0)) is None


def test_numpy_scalars_and_arrays() -> None:
    np = pytest.importorskip("numpy")
    assert checked_json(np.int64(3), "v") == b"3"
    assert checked_json(np.uint8(255), "v") == b"255"
    assert checked_json(np.float32(1.5), "v") == b"1.5"
    assert checked_json(np.bool_(True), "v") == b"true"
    assert checked_json({"a": np.array([[1, 2], [3, 4]])}, "v") == b'{"a":[[1,2],[3,4]]}'
    assert checked_json([np.array([0.5, 1.0]), None], "v") == b"[[0.5,1.0],null]"
    assert refused(np.float32("nan")) == "v is nan, not a finite number"
    assert refused({"s": [np.float16("-inf")]}) == "v.s[0] is -inf, not a finite number"
    msg = refused({"r": np.float64("nan")})  # a float subclass: named like a float
    assert msg.startswith("v.r is ") and msg.endswith("nan), not a finite number")
    assert re.match(
        r"v\.obs\[1\]\[0\] is .*inf.*, not a finite number$",
        refused({"obs": np.array([[0.0, 1.0], [np.inf, 2.0]]), "n": None}),
    )
    assert refused(np.array(["a"])) == "v is a numpy array of <U1, not plain data"
    assert refused({"o": np.array([object()])}) == "v.o is a numpy array of object, not plain data"


def test_a_finite_float_comes_back_as_the_same_number() -> None:
    values = [0.1, -0.0, 1e308, 5e-324, 2.5]
    back = orjson.loads(checked_json(values, "v"))
    assert back == values and math.copysign(1.0, back[1]) == -1.0
