"""Plain data a user hands over: finite JSON values, checked where they enter.

A JSON writer that meets ``nan`` or ``inf`` writes ``null`` (orjson does): the value comes back
as ``None``, or a strict reader rejects the file, so a snapshot written that way is not what was
committed. Every value a user's code hands to gymckpt (a reward, a payload, a session state, a
model response) is checked once, where it is handed over, and refused with the place in it
that is wrong (``payload[3].x``).

The check costs one ``orjson.dumps`` (which the caller needs anyway: the size, the bytes to
write) and a search of its output for ``null``: a non-finite float can only be in the value if
the output holds ``null``. Only then is it asked of the standard library's C encoder, which
refuses a non-finite float, and only if that refuses (or cannot tell) is the value walked, to
name the place.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

__all__ = ["NotPlainData", "all_finite", "checked_json", "plain_problem"]

_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY
_SCALARS: Final = (str, bool, int, type(None))


class NotPlainData(ValueError):
    """A value handed over is not a finite JSON value; the message names where in it."""


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def plain_problem(
    value: Any, where: str, *, types: bool = True, json_only: bool = False
) -> str | None:
    """The first place in ``value`` that is not a finite JSON value (dicts with str keys,
    lists, tuples, str, int, bool, None, finite floats, numpy arrays and scalars), as
    ``"<where>[3].x is nan"``; None when there is none. Without ``types`` only non-finite
    numbers count (a value orjson serialised already); with ``json_only`` a tuple or a numpy
    value counts too (what must come back from JSON as itself). A walk in Python: see
    ``checked_json`` for the fast path."""
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return f"{path} is {v!r}, not a finite number"
        elif isinstance(v, _SCALARS):
            continue
        elif isinstance(v, dict):
            items = list(v.items())
            for k, _ in items:
                if not isinstance(k, str):
                    return f"{path}: key {k!r} is {type(k).__name__}, not str"
            stack.extend((_key_path(path, k), x) for k, x in reversed(items))
        elif isinstance(v, (list, tuple)):
            if json_only and isinstance(v, tuple):
                return f"{path} is a tuple, not a JSON list (it would come back as a list)"
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif hasattr(type(v), "__dataclass_fields__"):  # orjson writes a dataclass's fields
            if types:
                return f"{path} is a {type(v).__name__}, not plain data (JSON values only)"
            stack.extend(
                (f"{path}.{name}", getattr(v, name))
                for name in reversed(list(type(v).__dataclass_fields__))
            )
        elif type(v).__module__ == "numpy":
            if json_only:
                return f"{path} is a numpy {type(v).__name__}, not plain JSON (use .tolist())"
            problem = _numpy_problem(path, v)
            if problem is not None:
                return problem
        elif types:
            return f"{path} is a {type(v).__name__}, not plain data (JSON values only)"
    return None


def _numpy_problem(path: str, v: Any) -> str | None:
    import numpy as np

    if isinstance(v, np.ndarray):
        if v.dtype.kind in "fc":
            bad = np.argwhere(~np.isfinite(v))
            if len(bad):
                index = "".join(f"[{int(i)}]" for i in bad[0])
                return f"{path}{index} is {v[tuple(bad[0])]!r}, not a finite number"
        elif v.dtype.kind not in "biu":
            return f"{path} is a numpy array of {v.dtype}, not plain data"
        return None
    if isinstance(v, np.floating) and not math.isfinite(float(v)):
        return f"{path} is {float(v)!r}, not a finite number"
    if isinstance(v, (np.generic,)):
        return None
    return f"{path} is a {type(v).__name__}, not plain data (JSON values only)"


def checked_json(value: Any, where: str) -> bytes:
    """``orjson.dumps(value)`` (numpy serialised), refused with ``NotPlainData`` naming the place
    (``where`` is the name of the value, e.g. ``"payload"``) when ``value`` is not a finite
    JSON value. One pass when the output holds no ``null``."""
    try:
        data = orjson.dumps(value, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        problem = plain_problem(value, where)
        raise NotPlainData(problem or f"{where} is not plain data ({exc})") from None
    if b"null" in data and all_finite(value) is not True:
        problem = plain_problem(value, where, types=False)
        if problem is not None:
            raise NotPlainData(problem)
    return data


def all_finite(value: Any) -> bool | None:
    """Whether every number in ``value`` is finite, asked of the standard library's C JSON
    encoder (``allow_nan=False`` refuses ``nan`` and ``inf``; no object is built, so it costs a
    few ``orjson.dumps`` of the value, not a walk in Python). None when it cannot tell (a type
    it does not serialise: a numpy array, a dataclass): walk the value then."""
    try:
        json.dumps(value, allow_nan=False, check_circular=False)
    except ValueError:
        return False
    except Exception:
        return None
    return True
