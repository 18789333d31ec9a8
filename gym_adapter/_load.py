"""Where a Gym host gets its environment: an ``Environment``, a factory, an import path, or a
Gymnasium id.

Its own module so that ``_environment`` and ``gymnasium_env`` (which builds on it, and needs
the optional ``gymnasium`` extra, so it is imported only for a ``gymnasium:`` id) do not import
each other: ``load_environment`` sits above both.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ._environment import Environment

__all__ = ["load_environment"]


def load_environment(path: str | Environment | Callable[[], Environment]) -> Environment:
    """An ``Environment`` from ``"package.module:name"`` (an ``Environment`` or a zero-argument
    factory of one), ``"gymnasium:ID"`` (that Gymnasium id with a random policy), a factory, or
    an environment (returned as is)."""
    if isinstance(path, Environment):
        return path
    if isinstance(path, str) and path.startswith("gymnasium:"):
        from .gymnasium_env import gymnasium_environment  # the optional gymnasium extra

        return gymnasium_environment(path.removeprefix("gymnasium:"))
    if callable(path):
        env: Any = path()
    else:
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise ValueError(f"environment path {path!r} must look like 'package.module:name'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"environment path {path!r}: cannot import {module_name}: {exc}"
            ) from None
        try:
            env = getattr(module, attr)
        except AttributeError:
            raise ValueError(f"environment path {path!r}: {module_name} has no {attr}") from None
        if not isinstance(env, Environment) and callable(env):
            env = env()
    if not isinstance(env, Environment):
        raise ValueError(f"environment {path!r} is a {type(env).__name__}, not an Environment")
    return env
