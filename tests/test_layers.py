"""The layering of the installed namespace stays true: read every module's imports with ``ast``.

Dependencies point one way: ``runtime`` <- ``gym_adapter`` <- ``nurseries`` <- the top
(``nurseries.app``: CLI, demo, simulation; ``benchmarks``; ``testing``). Imports inside
functions count like the others. Checked: no import cycle between modules, no upward import,
no private module or name (``_x``) of another package imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "gym_adapter", "nurseries", "nurseries/app", "benchmarks", "testing")

ALLOWED: Mapping[str, frozenset[str]] = {
    "gymckpt": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries"}),
    "gymckpt.__main__": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries",
                                   "nurseries.app"}),
    "runtime": frozenset({"runtime"}),
    "gym_adapter": frozenset({"runtime", "gym_adapter"}),
    "nurseries": frozenset({"runtime", "gym_adapter", "nurseries"}),
    "testing": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries", "testing"}),
    "benchmarks": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries", "testing",
                             "benchmarks"}),
    "nurseries.app": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries", "testing",
                                "benchmarks", "nurseries.app"}),
}
"""Package -> the packages its modules may import (``gymckpt`` is the root package: the trainer
API, which imports no application module; ``python -m gymckpt`` is the one entry into the app)."""


def library_modules(root: Path = ROOT) -> dict[str, Path]:
    """``gymckpt.…`` module name -> file, for the root package and every mapped folder."""
    modules = {f"gymckpt.{p.stem}" if p.stem != "__init__" else "gymckpt": p
               for p in root.glob("*.py")}
    for folder in PACKAGES:
        for path in (root / folder).glob("*.py"):
            dotted = "gymckpt." + folder.replace("/", ".")
            modules[dotted if path.stem == "__init__" else f"{dotted}.{path.stem}"] = path
    return modules


def package_of(module: str) -> str:
    """``gymckpt.nurseries.app.cli`` -> ``nurseries.app``; ``gymckpt._version`` -> ``gymckpt``."""
    if module == "gymckpt.__main__":
        return module
    parts = module.split(".")[1:]
    if parts[:2] == ["nurseries", "app"]:
        return "nurseries.app"
    if parts and parts[0] in {"runtime", "gym_adapter", "nurseries", "benchmarks", "testing"}:
        return parts[0]
    return "gymckpt"


def imports(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """``(imported gymckpt module, line)`` for every import in ``path``, nested ones included.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module."""
    is_package = path.stem == "__init__"
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {  # ``if TYPE_CHECKING:`` imports never run
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
        and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gymckpt":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "gymckpt":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno
                if sub not in known and alias.name.startswith("_") and alias.name != "__version__":
                    yield f"{target}.{alias.name}", node.lineno  # a private name


def violations(root: Path = ROOT) -> list[str]:
    known = library_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    found: list[str] = []
    for module, path in sorted(known.items()):
        pkg = package_of(module)
        where = f"{path.relative_to(root)}"
        for target, line in imports(module, path, known):
            tpkg = package_of(target)
            if tpkg not in ALLOWED[pkg]:
                found.append(f"{where}:{line}: upward import of {target} ({pkg} -> {tpkg})")
            private = [p for p in target.split(".")[1:] if p.startswith("_") and p != "__version__"]
            if private and tpkg != pkg:
                found.append(f"{where}:{line}: private {target} of package {tpkg} imported")
            if target in known and target != module:
                graph[module].add(target)
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return found


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append([*sorted(component), sorted(component)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_library_module_is_seen() -> None:
    modules = library_modules()
    for name in ("gymckpt", "gymckpt.runtime._ledger", "gymckpt.gym_adapter._host",
                 "gymckpt.nurseries._coordinator", "gymckpt.nurseries.app.cli",
                 "gymckpt.benchmarks.cli"):
        assert name in modules


def test_the_layers_hold() -> None:
    assert violations() == []


@pytest.mark.parametrize(
    ("where", "line", "says"),
    [
        ("runtime/_gate.py", "from gymckpt.nurseries import Dispatcher\n",
         "upward import of gymckpt.nurseries (runtime -> nurseries)"),
        ("nurseries/_calls.py", "    from gymckpt.nurseries.app import cli\n",
         "upward import of gymckpt.nurseries.app.cli (nurseries -> nurseries.app)"),
        ("benchmarks/_common.py", "from gymckpt.nurseries.app.demo import ToyTrainer\n",
         "upward import of gymckpt.nurseries.app.demo (benchmarks -> nurseries.app)"),
        ("nurseries/_restore.py", "from gymckpt.runtime._ledger import LedgerSnapshot\n",
         "private gymckpt.runtime._ledger of package runtime imported"),
        ("nurseries/app/demo.py", "from gymckpt.gym_adapter import _host\n",
         "private gymckpt.gym_adapter._host of package gym_adapter imported"),
        ("aio.py", "    from gymckpt.nurseries.app import cli\n",
         "upward import of gymckpt.nurseries.app.cli (gymckpt -> nurseries.app)"),
        ("__init__.py", "from gymckpt.nurseries.app.verdict import judge\n",
         "upward import of gymckpt.nurseries.app.verdict (gymckpt -> nurseries.app)"),
        ("runtime/_barrier.py", "from ._ledger import RecoveryLedger\n",
         "import cycle: gymckpt.runtime._barrier -> gymckpt.runtime._ledger"),
    ],
)
def test_a_violation_is_caught(tmp_path: Path, where: str, line: str, says: str) -> None:
    """The check fails on each kind of violation, planted in a copy of the tree."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        for path in (ROOT / folder).glob("*.py"):
            (tmp_path / folder / path.name).write_bytes(path.read_bytes())
    for path in ROOT.glob("*.py"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    assert violations(tmp_path) == []
    target = tmp_path / where
    source = target.read_text()
    if line.startswith("    "):  # inside a function: imports there count too
        source += "\n\ndef _planted() -> None:\n" + line
    else:
        source += "\n" + line
    target.write_text(source)
    found = violations(tmp_path)
    assert any(says in v for v in found), found
