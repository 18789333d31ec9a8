"""Configuration from a TOML file, through the strict converter.

One file can configure several parts of a job, one table each (``[runtime]`` for
``RuntimeConfig``, ``[demo]`` for the demo's options); tables this reader is not asked for are
left to their owners. Within a table every key must be a field of the record and every value of
its type: an unknown or ill-typed key is a ``ManifestError`` naming the key, the table and the
file (exit code 2 on the command line), never a silently ignored setting.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from ._config import RuntimeConfig
from ._converter import structure
from ._errors import ManifestError

__all__ = ["load_toml_table", "runtime_config_from_toml", "structure_table"]

T = TypeVar("T")


def load_toml_table(path: Path | str, table: str) -> dict[str, Any]:
    """Table ``[table]`` of the TOML file at ``path`` (empty if the file has none)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the configuration ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML ({exc})") from None
    raw = doc.get(table, {})
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: [{table}] must be a table, got {type(raw).__name__}")
    return raw


def structure_table(raw: dict[str, Any], cls: type[T], where: str) -> T:
    """``raw`` as ``cls``, strictly; a validator's complaint keeps its own words."""
    try:
        return structure(raw, cls, where)
    except ManifestError as exc:
        if not str(exc).endswith("invalid value @ $"):
            raise  # an unknown key or a value of the wrong type, named by the converter
        try:  # known keys of the right types that a validator refused: say why
            cls(**raw)
        except ValueError as refused:
            raise ManifestError(f"{where}: {refused}") from None
        except TypeError:
            pass
        raise


def runtime_config_from_toml(path: Path | str, table: str = "runtime") -> RuntimeConfig:
    """``RuntimeConfig`` from table ``[runtime]`` of a TOML file; missing keys keep defaults."""
    return structure_table(load_toml_table(path, table), RuntimeConfig, f"{path} [{table}]")
