"""The documentation's own Sphinx extension: the reference pages generated from the code.

Every table here is read from the code when the site is built, so a reference page cannot
drift from what it describes:

- ``gymckpt-api MODULE``: the public names of a module (its ``__all__``) through autodoc; a
  name that ``API_MODULES`` documents under an earlier module (the root package gathers the
  trainer API from the packages that define it) is a link to that entry, not a second one;
- ``gymckpt-cli``: ``gymckpt --help`` and every subcommand's ``--help``, from
  ``gymckpt.app.cli.build_parser`` itself;
- ``gymckpt-exit-codes``: ``ExitCode``, each code with the words ``--help`` says and the
  member's own docstring;
- ``gymckpt-config TARGET TABLE``: the keys of a TOML table, from the fields of the attrs class
  (or the mapping of options) that reads it, with defaults and docstrings;
- ``gymckpt-metrics``: every metric name the library sets, found in its source.

Markdown pages mark a stable anchor with ``<a id="s9"></a>`` on the line before a heading (so
that links do not depend on the heading's words, and work on GitHub too); ``source-read`` turns
each into a MyST target, ``(s9)=``, so ``[S9](design.md#s9)`` resolves in the site.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from functools import cache
from pathlib import Path
from typing import Any

import attrs
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

API_MODULES = (
    "gymckpt.runtime",
    "gymckpt.gym_adapter",
    "gymckpt.nurseries",
    "gymckpt",
    "gymckpt.aio",
    "gymckpt.gym_adapter.environments.calendar",
    "gymckpt.gym_adapter.environments.gymnasium",
    "gymckpt.gym_adapter.environments.textarena",
    "gymckpt.gym_adapter.environments.openspiel",
    "gymckpt.gym_adapter.environments.openai_model",
    "gymckpt.gym_adapter.environments.sandbox",
    "gymckpt.gym_adapter.environments.coding",
    "gymckpt.testing",
)
"""The modules whose public names the reference documents, in this order: an object exported
by several is documented under the first that exports it."""

ROOT = Path(__file__).resolve().parents[2]
_ANCHOR = re.compile(r'^<a id="([a-z0-9-]+)"></a>[ \t]*$', re.M)
_METRIC = re.compile(r"""["'](?:f["'])?((?:rollout|checkpoint)/[a-z0-9_{}<>]+)["']""")


def _anchors_to_targets(app: Sphinx, docname: str, source: list[str]) -> None:
    if str(app.env.doc2path(docname)).endswith(".md"):
        source[0] = _ANCHOR.sub(r"(\1)=", source[0])


@cache
def homes() -> dict[int, str]:
    """Each public object's documented place, ``module.name``: the first of ``API_MODULES``
    that exports it."""
    found: dict[int, str] = {}
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            found.setdefault(id(getattr(module, name)), f"{module_name}.{name}")
    return found


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "data"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 and "\n" not in text else f"{type(value).__name__}(…)"


@cache
def _module_docs() -> dict[str, str]:
    """The docstrings written under module-level names (a string literal after the assignment),
    by name, across every ``gymckpt`` module imported: a constant is documented where it is
    defined, usually a private module."""
    import sys

    found: dict[str, str] = {}
    for module_name in sorted(sys.modules):
        if module_name != "gymckpt" and not module_name.startswith("gymckpt."):
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # a module without source (a namespace, a compiled one)
            continue
        for (scope, name), lines in docs.items():
            if scope == "" and any(line.strip() for line in lines):
                found.setdefault(name, "\n".join(lines).strip())
    return found


def _data_doc(name: str) -> str:
    return _module_docs().get(name, "")


def _attr_docs(cls: type) -> dict[str, str]:
    """The docstrings written under the attributes of ``cls``."""
    docs = ModuleAnalyzer.for_module(cls.__module__).find_attr_docs()
    return {
        name: " ".join(" ".join(lines).split())
        for (scope, name), lines in docs.items()
        if scope == cls.__qualname__
    }


def _cell(text: str) -> str:
    return text.replace("\n", " ") or "\\ "


def _table(header: list[str], rows: list[list[str]], widths: list[int]) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", f"   :widths: {' '.join(map(str, widths))}"]
    out.append("")
    for row in [header, *rows]:
        out += [("   * - " if i == 0 else "     - ") + _cell(c) for i, c in enumerate(row)]
    return [*out, ""]


class _Generated(SphinxDirective):
    """A directive whose content is reStructuredText it generates."""

    def parse(self, lines: list[str]) -> list[nodes.Node]:
        node = nodes.container()
        self.state.nested_parse(StringList(lines, source="(generated)"), 0, node)
        return list(node.children)


class ApiDirective(_Generated):
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        lines: list[str] = []
        elsewhere: list[str] = []
        for name in sorted(module.__all__, key=str.lower):
            obj = getattr(module, name)
            home = homes()[id(obj)]
            if home != f"{module_name}.{name}":
                elsewhere.append(f":py:obj:`{name} <{home}>`")
                continue
            kind = _kind(obj)
            if kind == "data":  # autodoc would show the docstring of the value's type
                lines += [f".. py:data:: {home}", f"   :value: {_short_repr(obj)}", ""]
                lines += [f"   {line}" for line in _data_doc(name).splitlines()]
                lines.append("")
                continue
            lines.append(f".. auto{kind}:: {home}")
            if kind in ("class", "exception"):
                lines += ["   :members:", "   :show-inheritance:"]
            lines.append("")
        if elsewhere:
            lines = [f"Also exported here: {', '.join(elsewhere)}.", "", *lines]
        return self.parse(lines)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """``(prog, parser)`` of ``parser`` and of every subcommand under it, depth first."""
    out = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                if sub.add_help:  # ``bench`` hands its arguments to a parser of its own
                    out += _subcommands(sub)
    return out


class CliDirective(_Generated):
    def run(self) -> list[nodes.Node]:
        import os

        from gymckpt.app.cli import build_parser
        from gymckpt.benchmarks.cli import build_parser as bench_parser

        os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for the page
        result: list[nodes.Node] = []
        bench = bench_parser()
        bench.prog = "gymckpt bench"
        for prog, parser in [*_subcommands(build_parser()), ("gymckpt bench", bench)]:
            anchor = nodes.make_id(prog)
            result.append(nodes.rubric(prog, prog, ids=[anchor]))
            text = parser.format_help()
            result.append(nodes.literal_block(text, text, language="text"))
        return result


class ExitCodesDirective(_Generated):
    def run(self) -> list[nodes.Node]:
        from gymckpt.app.cli import EXIT_CODE_SUMMARY
        from gymckpt.nurseries import ExitCode

        docs = _attr_docs(ExitCode)
        rows = [
            [f"``{int(c)}``", f"``{c.name}``", EXIT_CODE_SUMMARY.get(c, ""), docs.get(c.name, "")]
            for c in ExitCode
        ]
        return self.parse(
            _table(["code", "ExitCode", "gymckpt --help", "meaning"], rows, [6, 20, 24, 50])
        )


class ConfigDirective(_Generated):
    required_arguments = 2

    def run(self) -> list[nodes.Node]:
        module_name, _, attr = self.arguments[0].rpartition(".")
        target = getattr(importlib.import_module(module_name), attr)
        table = self.arguments[1]
        rows: list[list[str]] = []
        if attrs.has(target):
            docs = _attr_docs(target)
            for f in attrs.fields(target):
                if not f.init or f.name.startswith("_"):
                    continue
                default = f.default
                if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    default = default.factory()  # type: ignore[union-attr]
                value = getattr(default, "value", default)
                type_name = getattr(f.type, "__name__", None) or str(f.type)
                rows.append(
                    [f"``{f.name}``", f"``{type_name}``", f"``{value!r}``", docs.get(f.name, "")]
                )
        else:  # a mapping of option -> default
            for name, default in target.items():
                rows.append(
                    [f"``{name}``", f"``{type(default).__name__}``", f"``{default!r}``", ""]
                )
        header = [f"key in ``[{table}]``", "type", "default", "meaning"]
        return self.parse(_table(header, rows, [22, 12, 14, 52]))


class MetricsDirective(_Generated):
    def run(self) -> list[nodes.Node]:
        where: dict[str, set[str]] = {}
        for folder in ("runtime", "gym_adapter", "nurseries"):
            for path in sorted((ROOT / folder).rglob("*.py")):
                for name in _METRIC.findall(path.read_text(encoding="utf-8")):
                    where.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
        rows = [
            [f"``{name}``", ", ".join(f"``{p}``" for p in sorted(paths))]
            for name, paths in sorted(where.items())
            if not name.endswith("/")
        ]
        return self.parse(_table(["metric", "set in"], rows, [45, 55]))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _anchors_to_targets)
    app.add_directive("gymckpt-api", ApiDirective)
    app.add_directive("gymckpt-cli", CliDirective)
    app.add_directive("gymckpt-exit-codes", ExitCodesDirective)
    app.add_directive("gymckpt-config", ConfigDirective)
    app.add_directive("gymckpt-metrics", MetricsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
