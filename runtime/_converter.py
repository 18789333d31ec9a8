"""The library's one cattrs converter (never cattrs' global one).

It is the orjson preconf converter with ``forbid_extra_keys=True``: snapshot data is JSON, never
pickle, and a misspelt or unknown key is an error naming it. ``loads``/``dumps`` wrap it and turn
every structural problem into ``ManifestError`` with the path of the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs
import orjson
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mutable_sequence,
    is_sequence,
    list_structure_factory,
)
from cattrs.preconf.orjson import make_converter

from ._errors import ManifestError

__all__ = ["converter", "dumps", "loads", "structure", "unstructure"]

T = TypeVar("T")

converter = make_converter(forbid_extra_keys=True, detailed_validation=True)


def _strict_str(value: object, _type: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_int(value: object, _type: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _strict_float(value: object, _type: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _strict_bool(value: object, _type: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {type(value).__name__}")
    return value


# cattrs would coerce 1 → "1" and "3" → 3; a manifest with the wrong type is bad input instead.
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(bool, _strict_bool)


def _strict_sequence(factory: Any) -> Any:
    """A hook factory that refuses what is not a JSON array before ``factory``'s hook runs
    (cattrs would take any iterable: a string as its characters, an object as its keys)."""

    def make(type_: Any, conv: cattrs.Converter) -> Any:
        hook = factory(type_, conv)

        def structure_sequence(value: object, cls: Any) -> Any:
            if not isinstance(value, list | tuple):
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return hook(value, cls)

        return structure_sequence

    return make


converter.register_structure_hook_factory(
    is_sequence, _strict_sequence(homogenous_tuple_structure_factory)
)
converter.register_structure_hook_factory(
    is_mutable_sequence, _strict_sequence(list_structure_factory)
)


def _format_problem(exc: BaseException, type_: Any) -> str:
    """A field's problem as cattrs says it, except a record's own validator (``type_`` None):
    its words say what is wrong (``step must be an integer >= 0, got -1``)."""
    if type_ is None and type(exc) is ValueError and str(exc):
        return str(exc)
    if isinstance(exc, TypeError) and str(exc).startswith("expected a list"):
        return f"invalid type ({exc})"
    return cattrs.v.format_exception(exc, type_)


def structure(data: Any, cls: type[T], what: str) -> T:
    """Structure ``data`` as ``cls``; any problem becomes a ``ManifestError`` naming the field."""
    if attrs.has(cls) and not isinstance(data, dict):
        raise ManifestError(f"{what}: expected a JSON object, got {type(data).__name__}")
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, cattrs.errors.ForbiddenExtraKeysError) as exc:
        problems = "; ".join(
            cattrs.transform_error(exc, path="$", format_exception=_format_problem)
        ) or str(exc)
        raise ManifestError(f"{what}: {problems}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise ManifestError(f"{what}: {exc}") from None


def unstructure(obj: Any) -> Any:
    return converter.unstructure(obj)


def dumps(obj: Any) -> bytes:
    """Serialise an attrs record to JSON bytes (indented, keys in field order)."""
    return orjson.dumps(converter.unstructure(obj), option=orjson.OPT_INDENT_2)


JSON_CHUNK = 2048
"""Items of a long list serialised per ``orjson.dumps`` call by ``dumps_chunked``."""


def dumps_chunked(obj: Mapping[str, Any], option: int = 0, chunk: int = JSON_CHUNK) -> bytes:
    """``orjson.dumps(obj, option=option)``, byte for byte, for a JSON object whose long list
    values are serialised ``chunk`` items per call.

    One ``orjson.dumps`` call holds the GIL from start to end: over 50k sessions that is a
    tenth of a second in which the event loop, in another thread, cannot run. Between chunks
    the interpreter hands the GIL over (its switch interval), so the loop waits one chunk at
    most. Compact output only (no ``OPT_INDENT_2``); keys in insertion order, or sorted with
    ``OPT_SORT_KEYS``."""
    if option & orjson.OPT_INDENT_2:
        raise ValueError("dumps_chunked writes compact JSON only (no OPT_INDENT_2)")
    keys = sorted(obj) if option & orjson.OPT_SORT_KEYS else list(obj)
    parts = [b"{"]
    for i, key in enumerate(keys):
        if not isinstance(key, str):
            raise TypeError(f"dumps_chunked: keys must be str, got {key!r}")
        value = obj[key]
        parts.append(b"," if i else b"")
        parts.append(orjson.dumps(key) + b":")
        if isinstance(value, list | tuple) and len(value) > chunk:
            pieces = [
                orjson.dumps(value[j : j + chunk], option=option)[1:-1]
                for j in range(0, len(value), chunk)
            ]
            parts.append(b"[" + b",".join(pieces) + b"]")
        else:
            parts.append(orjson.dumps(value, option=option))
    parts.append(b"}")
    return b"".join(parts)


def loads(data: bytes, cls: type[T], what: str) -> T:
    """Parse JSON bytes strictly as ``cls``; bad JSON or bad structure is ``ManifestError``."""
    if not data.strip():
        raise ManifestError(f"{what}: file is empty")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{what}: not valid JSON ({exc})") from None
    return structure(raw, cls, what)
