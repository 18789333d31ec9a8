"""Captured steps: any side effect of an agent (a web search, a remote tool, an HTTP API) asked
once across every crash, the way a model call is.

``await ctx.captured_step(name, args, fn)`` calls ``fn(args)`` and stages its result with the
turn's model calls (``StagedModelCall``: the same capture keys, the same manifest records,
the same restore). What identifies the step is its place in the episode: the turn, its
``name`` and its occurrence among the turn's steps of that name (``"t{turn}-{d}-c{n}"``,
``d`` the first ``CALL_DIGEST_HEX`` hex digits of ``step_identity(name)``); the arguments
are checked, not part of the key: the staged call's request digest is ``arguments_digest``
(sha256 of the canonical JSON of ``{"args": args, "step": name}``). After a restore, a
restored turn's step of the same name and occurrence is answered from the capture without
calling ``fn``; if its arguments' digest differs, the step fails closed with
``CapturedStepChanged`` naming the key and both digests.

A staged call is a captured step exactly when its call id's digest part is not the prefix of
its request digest (a model call's always is; a step's identity digest is of a JSON array, its
arguments' digest of a JSON object, so the two never coincide): no field is added to the
snapshot format.

Arguments and results must round-trip exactly through JSON (dicts with string keys, lists,
str, int within 64 bits, finite floats, bool, None): anything else (a tuple, a set, ``nan``,
an int key) is refused where it enters, naming the step and the place.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Final

import orjson

from ._episode import CALL_DIGEST_HEX

__all__ = [
    "CapturedStepChanged",
    "NotExactJSON",
    "arguments_digest",
    "exact_json",
    "is_step",
    "step_identity",
]

_IDENTITY: Final = "gymckpt.captured_step"
_MAX_NAME: Final = 200


class CapturedStepChanged(ValueError):
    """A restored turn asked a captured step with other arguments than the run that staged it:
    the episode does not replay as it ran; it fails as data, naming the key and both digests."""


class NotExactJSON(ValueError):
    """A captured step's arguments or result would not read back from JSON as they are."""


def step_identity(name: str) -> str:
    """The sha256 (hex) that names captured step ``name`` in its call ids."""
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ValueError(f"a captured step's name is a string of 1 to {_MAX_NAME} characters")
    return hashlib.sha256(orjson.dumps([_IDENTITY, name])).hexdigest()


def arguments_digest(name: str, args_json: bytes) -> str:
    """sha256 (hex) of ``{"args": args, "step": name}`` as canonical JSON (``args_json``:
    ``exact_json(args)``)."""
    return hashlib.sha256(
        b'{"args":' + args_json + b',"step":' + orjson.dumps(name) + b"}"
    ).hexdigest()


def is_step(call_digest_part: str, request_digest: str) -> bool:
    """Whether a staged call (its call id's digest part, its request digest) is a captured
    step (module docstring)."""
    return request_digest[:CALL_DIGEST_HEX] != call_digest_part


def exact_json(value: Any, where: str) -> bytes:
    """``value`` as canonical JSON (sorted keys), or ``NotExactJSON`` naming the first place
    (``where``, then ``[i]`` / ``.key``) that would not read back as it is."""
    _check(value, where)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _check(value: Any, where: str) -> None:
    t = type(value)
    if t is str or t is bool or value is None:
        return
    if t is int:
        if not -(1 << 63) <= value < (1 << 64):
            raise NotExactJSON(f"{where} is an int beyond 64 bits ({value})")
        return
    if t is float:
        if not math.isfinite(value):
            raise NotExactJSON(f"{where} is {value!r}, which JSON cannot hold")
        return
    if t is list:
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]")
        return
    if t is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise NotExactJSON(f"{where} has the key {key!r}, not a str")
            _check(item, f"{where}.{key}")
        return
    raise NotExactJSON(
        f"{where} is a {t.__name__}, which would not read back from JSON as it is (use dicts "
        "with str keys, lists, str, int, finite float, bool, None)"
    )
