"""Tests for ``gymckpt.runtime._converter``: the library's one strict cattrs converter.

``structure``/``loads`` refuse extra, missing and wrong-typed fields, a non-list where a list is
declared and a non-object where a record is, each as a ``ManifestError`` that starts with the
caller's ``what`` and names the field's path (``@ $.x[3].n``); a record's own validator keeps its
words. ``dumps`` and ``dumps_chunked`` write what ``loads`` and ``orjson`` read.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import orjson
import pytest

from gymckpt.runtime._converter import dumps, dumps_chunked, loads, structure, unstructure
from gymckpt.runtime._errors import ManifestError


@attrs.frozen
class Inner:
    n: int
    s: str = "d"


def _non_negative(_inst: object, _attr: object, value: int) -> None:
    if value < 0:
        raise ValueError(f"step must be an integer >= 0, got {value}")


@attrs.frozen
class Outer:
    x: list[Inner]
    t: tuple[int, ...] = ()
    f: float = 0.0
    b: bool = False
    step: int = attrs.field(default=0, validator=_non_negative)


def refused(data: Any, cls: Any = Outer, what: str = "m") -> str:
    with pytest.raises(ManifestError) as info:
        structure(data, cls, what)
    return str(info.value)


def test_a_well_formed_record_is_structured_and_round_trips() -> None:
    data = {"x": [{"n": 1}, {"n": 2, "s": "e"}], "t": [3, 4], "f": 3, "b": True, "step": 5}
    got = structure(data, Outer, "m")
    assert got == Outer([Inner(1), Inner(2, "e")], (3, 4), 3.0, True, 5)
    assert isinstance(got.f, float)  # an integer is a number: taken as a float
    assert loads(dumps(got), Outer, "m") == got
    assert unstructure(got)["x"] == [{"n": 1, "s": "d"}, {"n": 2, "s": "e"}]


def test_dumps_is_indented_json_in_field_order() -> None:
    data = dumps(Outer([Inner(1)]))
    assert data.startswith(b'{\n  "x": [')
    assert list(orjson.loads(data)) == ["x", "t", "f", "b", "step"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"x": [], "extra": 1}, "m: extra fields found (extra) @ $"),
        ({"x": [{"n": 1, "zz": 2}]}, "m: extra fields found (zz) @ $.x[0]"),
        ({}, "m: required field missing @ $.x"),
        (
            {"x": [{"n": 1}, {"n": 2}, {"n": 3}, {"n": "4"}]},
            "m: invalid value for type, expected int @ $.x[3].n",
        ),
        ({"x": [], "t": [1, True]}, "m: invalid value for type, expected int @ $.t[1]"),
        ({"x": [], "f": True}, "m: invalid value for type, expected float @ $.f"),
        ({"x": [], "f": "1.5"}, "m: invalid value for type, expected float @ $.f"),
        ({"x": [], "b": 1}, "m: invalid value for type, expected bool @ $.b"),
        ({"x": [{"n": 1, "s": 1}]}, "m: invalid value for type, expected str @ $.x[0].s"),
    ],
)
def test_extra_missing_and_wrong_typed_fields_are_refused_with_their_path(
    data: Any, message: str
) -> None:
    assert refused(data) == message


def test_every_problem_of_a_record_is_named_not_only_the_first() -> None:
    msg = refused({"x": [{"s": 1}]})
    assert msg == (
        "m: required field missing @ $.x[0].n; invalid value for type, expected str @ $.x[0].s"
    )


@pytest.mark.parametrize(
    ("data", "got"), [({"x": "abc"}, "str"), ({"x": {"n": 1}}, "dict"), ({"x": 7}, "int")]
)
def test_a_non_list_where_a_list_is_declared_is_refused(data: Any, got: str) -> None:
    # cattrs alone would take a string as its characters and an object as its keys
    assert refused(data) == f"m: invalid type (expected a list, got {got}) @ $.x"


def test_a_non_list_for_a_tuple_is_refused_too() -> None:
    assert refused({"x": [], "t": "12"}) == "m: invalid type (expected a list, got str) @ $.t"
    assert refused("ab", list[int], "w") == "w: expected a list, got str"
    assert refused(["a"], list[int], "w") == "w: invalid value for type, expected int @ $[0]"


@pytest.mark.parametrize(("data", "got"), [([1], "list"), ("s", "str"), (None, "NoneType")])
def test_a_non_object_for_a_record_is_refused(data: Any, got: str) -> None:
    assert refused(data) == f"m: expected a JSON object, got {got}"


def test_a_non_object_inside_a_list_of_records_is_refused_at_its_index() -> None:
    assert refused({"x": [{"n": 1}, 5]}) == "m: invalid value for type, expected Inner @ $.x[1]"


def test_a_validators_own_message_is_kept() -> None:
    assert refused({"x": [], "step": -1}) == "m: step must be an integer >= 0, got -1 @ $"


@pytest.mark.parametrize(
    ("value", "cls", "message"),
    [
        (1, str, "expected a string, got int"),
        ("3", int, "expected an integer, got str"),
        (True, int, "expected an integer, got bool"),
        (1.0, int, "expected an integer, got float"),
        (False, float, "expected a number, got bool"),
        (0, bool, "expected true or false, got int"),
    ],
)
def test_scalars_are_never_coerced(value: Any, cls: type, message: str) -> None:
    assert refused(value, cls, "w") == f"w: {message}"


def test_loads_refuses_empty_bad_and_non_object_json() -> None:
    for data in (b"", b"  \n"):
        with pytest.raises(ManifestError, match=r"^f\.json: file is empty$"):
            loads(data, Outer, "f.json")
    with pytest.raises(ManifestError, match=r"^f\.json: not valid JSON \("):
        loads(b'{"x": [', Outer, "f.json")
    with pytest.raises(ManifestError, match=r"^f\.json: expected a JSON object, got list$"):
        loads(b"[1]", Outer, "f.json")
    with pytest.raises(ManifestError, match=re.escape("f.json: extra fields found (y) @ $")):
        loads(b'{"x": [], "y": 0}', Outer, "f.json")


@pytest.mark.parametrize("option", [0, orjson.OPT_SORT_KEYS])
@pytest.mark.parametrize("length", [0, 1, 4, 5, 9, 12])
def test_dumps_chunked_is_orjson_byte_for_byte(option: int, length: int) -> None:
    obj = {
        "z": list(range(length)),
        "a": [{"k": i, "v": [i, None]} for i in range(length)],
        "m": tuple(f"s{i}" for i in range(length)),
        "plain": {"n": 1.5, "s": "x"},
    }
    assert dumps_chunked(obj, option, chunk=4) == orjson.dumps(obj, option=option)


def test_dumps_chunked_refuses_indent_and_non_str_keys() -> None:
    with pytest.raises(ValueError, match="compact JSON only"):
        dumps_chunked({"a": 1}, orjson.OPT_INDENT_2)
    with pytest.raises(TypeError, match="keys must be str, got 1"):
        dumps_chunked({1: 2})  # type: ignore[dict-item]
