"""Where a Gym host gets its environment: an ``Environment``, a factory, an import path (with
arguments: ``EnvironmentRef``), or a Gymnasium id.

A deployment whose instances run in other processes sends the environment *by name*: an import
path, or an ``EnvironmentRef`` (the path of a factory and the arguments to call it with, which
must pickle or be plain data). The receiving process imports and builds it itself, so user code
is never pickled. Every environment, the calendar workplace included, is named this way.

Its own module so that ``_environment`` stays below everything that builds environments.

The host imports no environment. A ``gymnasium:ID`` source names the Gymnasium adapter's
factory by import path (``GYMNASIUM_FACTORY``), resolved only when such a source is loaded, as
any user environment is: the adapter needs the optional ``gymnasium`` extra, and it builds on
the public episode API, which sits above this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ._environment import Environment

__all__ = ["GYMNASIUM_FACTORY", "EnvironmentRef", "EnvironmentSource", "load_environment"]

GYMNASIUM_FACTORY: Final = "gymckpt.gym_adapter.environments.gymnasium:gymnasium_environment"
"""The factory ``load_environment("gymnasium:ID")`` calls with ``ID``, named by import path: the
host's one reference to an environment, and not an import (``tests/test_layers.py``)."""


def _frozen_kwargs(kwargs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(dict(kwargs).items()))


@attrs.frozen
class EnvironmentRef:
    """An environment named by the import path of its factory (``package.module:name``) and
    the keyword arguments to call it with (``kwargs``, kept sorted by name)."""

    path: str
    kwargs: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_frozen_kwargs)

    def __attrs_post_init__(self) -> None:
        _split(self.path)

    @classmethod
    def to(cls, factory: Callable[..., Environment], **kwargs: Any) -> EnvironmentRef:
        """The reference to module-level ``factory`` called with ``kwargs``."""
        return cls(f"{factory.__module__}:{factory.__qualname__}", kwargs)


EnvironmentSource = str | EnvironmentRef | Environment | Callable[[], Environment]
"""What ``load_environment`` takes."""


def _split(path: str) -> tuple[str, str]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"environment path {path!r} must look like 'package.module:name'")
    return module_name, attr


def _resolve(path: str) -> Any:
    module_name, attr = _split(path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"environment path {path!r}: cannot import {module_name}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"environment path {path!r}: {module_name} has no {attr}") from None


def load_environment(path: EnvironmentSource) -> Environment:
    """An ``Environment`` from ``"package.module:name"`` (an ``Environment`` or a zero-argument
    factory of one), an ``EnvironmentRef`` (its factory called with its arguments),
    ``"gymnasium:ID"`` (that Gymnasium id with a random policy), a factory, or an environment
    (returned as is)."""
    if isinstance(path, Environment):
        return path
    if isinstance(path, EnvironmentRef):
        factory = _resolve(path.path)
        if not callable(factory):
            raise ValueError(f"environment path {path.path!r} names no factory")
        env: Any = factory(**dict(path.kwargs))
    elif isinstance(path, str) and path.startswith("gymnasium:"):
        module_name, attr = _split(GYMNASIUM_FACTORY)
        # the optional gymnasium extra: a missing one raises ModuleNotFoundError naming it
        factory = getattr(importlib.import_module(module_name), attr)
        return factory(path.removeprefix("gymnasium:"))
    elif callable(path):
        env = path()
    elif isinstance(path, str):
        env = _resolve(path)
        if not isinstance(env, Environment) and callable(env):
            env = env()
    else:
        raise ValueError(
            f"environment {path!r} is a {type(path).__name__}: give an Environment, a factory "
            "of one, an EnvironmentRef or an import path 'package.module:name'"
        )
    if not isinstance(env, Environment):
        raise ValueError(f"environment {path!r} is a {type(env).__name__}, not an Environment")
    return env
