"""Configuration from a TOML file, through the strict converter.

One file can configure several parts of a job, one table each (``[runtime]`` for
``RuntimeConfig``, ``[demo]`` for the demo's options); tables this reader is not asked for are
left to their owners. Within a table every key must be a field of the record and every value of
its type: an unknown or ill-typed key is a ``ManifestError`` naming the key, the table and the
file (exit code 2 on the command line), never a silently ignored setting. The same holds for a
table's key written at the top level of the file (above every table header, where TOML puts it
outside the table), whether the file has that table or not, and for a trainer setting that is
not the runtime's (``group_size`` in ``[runtime]``): the message says where it belongs.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._config import RuntimeConfig
from ._converter import structure
from ._errors import ManifestError

__all__ = ["load_toml_table", "runtime_config_from_toml", "structure_table"]

T = TypeVar("T")

_FIELDS: dict[str, frozenset[str]] = {
    "runtime": frozenset(a.name for a in attrs.fields(RuntimeConfig)),
}
"""Keys a table is known to take, to tell a key written outside its table."""

TRAINER_ARGUMENTS: frozenset[str] = frozenset(
    {
        "rows",
        "dataset",
        "group_size",
        "max_rows_in_flight",
        "batch_size",
        "checkpoint_every",
        "keep_snapshots",
        "restore",
        "run_id",
        "handle_signals",
        "preempt_timeout_s",
    }
)
"""Keyword arguments of ``open_rollouts`` (not ``RuntimeConfig`` fields): in ``[runtime]`` they
are refused with a message saying where they go (a test keeps this in step with the signature)."""


def load_toml_table(
    path: Path | str, table: str, keys: Collection[str] | None = None
) -> dict[str, Any]:
    """Table ``[table]`` of the TOML file at ``path`` (empty if the file has none).

    One of ``keys`` (the table's known keys; for ``runtime`` by default ``RuntimeConfig``'s
    fields) at the top level of the file is a ``ManifestError`` naming it and the table, with or
    without that table in the file; without the table, so is a table with a close name
    (``[runtim]``): a setting is never ignored because it was misplaced.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the configuration ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML ({exc})") from None
    fields = _FIELDS.get(table, ()) if keys is None else keys
    if table not in doc:
        _check_misspelt(doc, path, table)
    _check_loose(doc, path, table, fields)
    raw = doc.get(table, {})
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: [{table}] must be a table, got {type(raw).__name__}")
    if table == "runtime":
        _check_trainer_arguments(raw, path)
    return raw


def _check_misspelt(doc: dict[str, Any], path: Path, table: str) -> None:
    """A file without ``[table]`` may still mean it: a misspelt table name would otherwise be
    ignored in silence (the file is shared with other tools, so unknown tables as such are
    theirs)."""
    near = difflib.get_close_matches(
        table, [k for k, v in doc.items() if isinstance(v, dict)], n=1, cutoff=0.75
    )
    if near:
        raise ManifestError(
            f"{path}: no [{table}] table, but a [{near[0]}]: did you mean [{table}]?"
        )


def _check_loose(doc: dict[str, Any], path: Path, table: str, fields: Collection[str]) -> None:
    """The table's keys written at the top level (above every table header) are outside it:
    refused, whether or not the file also has the table (``rows = 16`` above ``[demo]`` would
    otherwise be ignored and the demo run its default)."""
    loose = sorted(k for k, v in doc.items() if not isinstance(v, dict) and k in fields)
    if loose:
        where = f"at the top level, outside [{table}]" if table in doc else "at the top level"
        raise ManifestError(
            f"{path}: {', '.join(loose)} {where}; put "
            f"{'it' if len(loose) == 1 else 'them'} under [{table}]"
        )


def _check_trainer_arguments(raw: dict[str, Any], path: Path) -> None:
    """``group_size`` and the other ``open_rollouts`` arguments are not runtime settings: say
    where they go instead of "extra fields found"."""
    found = sorted(k for k in raw if k in TRAINER_ARGUMENTS)
    if found:
        names = ", ".join(found)
        raise ManifestError(
            f"{path} [runtime]: {names} {'is' if len(found) == 1 else 'are'} not "
            f"{'a runtime setting' if len(found) == 1 else 'runtime settings'} but "
            f"{'an argument' if len(found) == 1 else 'arguments'} of open_rollouts "
            f"({found[0]}=...); for gymckpt demo put {'it' if len(found) == 1 else 'them'} "
            "under [demo]"
        )


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
