"""The layering of the installed namespace stays true: read every module's source with ``ast``.

Dependencies point one way: ``runtime`` <- ``gym_adapter`` <- ``nurseries`` <- the top
(``app``: CLI, demo, simulation; ``benchmarks``; ``testing``). Imports inside
functions count like the others. Checked:

- no upward import;
- no private module or name (``_x``) of another package imported, except that package's
  ``_shared`` module (``SHARED_DOOR``): the one private door through which gymckpt's own
  packages share plumbing, importable only where the package itself is (by the package and
  the ones above it), and only for the names in its ``__all__``. A package's ``lowlevel`` is
  public API for backend authors (as ``trio.lowlevel`` is trio's), so the plumbing is not
  there; and one named door, not "any private module from above", keeps every other private
  module free to move or change, keeps what the packages share listed in one ``__all__``
  that the front-door check reads, and keeps the upward check and the one-home check
  (a name is in a package's front door, its ``lowlevel`` or its ``_shared``, never two);
- no import cycle between modules, counting the imports under ``if TYPE_CHECKING:`` too (a
  cycle that only type checkers see is still two modules that cannot be read apart);
- no private attribute (``obj._x``) of another package's code used: every private name a
  package defines (``def _x``, ``class _X``, ``self._x = …``, an attrs field ``_x``, a private
  module-level or class-level assignment) is that package's own; ``x._name`` in another
  package that does not define ``_name`` itself is a violation. Dunder names are public;
- the rooms of ``gym_adapter`` (``ROOMS``): the host imports no transport and no environment,
  a transport imports no environment, and an environment imports only the public episode API
  (``ENVIRONMENT_MAY_IMPORT``: ``gymckpt.gym_adapter``'s front door, the runtime's public
  names) and its own room. ``gym_adapter``'s top-level modules ``_contract`` and ``_faults``
  are shared by the host and the transports. The host names the Gymnasium adapter
  by import path for ``gymnasium:ID`` (``host/_load.GYMNASIUM_FACTORY``), which is no import.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("runtime", "gym_adapter", "nurseries", "app", "benchmarks", "testing")

ALLOWED: Mapping[str, frozenset[str]] = {
    "gymckpt": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries"}),
    "gymckpt.__main__": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries", "app"}),
    "runtime": frozenset({"runtime"}),
    "gym_adapter": frozenset({"runtime", "gym_adapter"}),
    "nurseries": frozenset({"runtime", "gym_adapter", "nurseries"}),
    "testing": frozenset({"gymckpt", "runtime", "gym_adapter", "nurseries", "testing"}),
    "benchmarks": frozenset(
        {"gymckpt", "runtime", "gym_adapter", "nurseries", "testing", "benchmarks"}
    ),
    "app": frozenset(
        {"gymckpt", "runtime", "gym_adapter", "nurseries", "testing", "benchmarks", "app"}
    ),
}
"""Package -> the packages its modules may import (``gymckpt`` is the root package: the trainer
API, which imports no application module; ``python -m gymckpt`` is the one entry into the app)."""

ROOMS: Mapping[str, frozenset[str]] = {
    "gymckpt.gym_adapter.host": frozenset(
        {"gymckpt.gym_adapter.transports", "gymckpt.gym_adapter.environments"}
    ),
    "gymckpt.gym_adapter.transports": frozenset({"gymckpt.gym_adapter.environments"}),
}
"""A room of ``gym_adapter`` -> the rooms its modules must not import (the host is below the
transports, and environments are above both: they are what a deployment serves)."""

ENVIRONMENTS = "gymckpt.gym_adapter.environments"
ENVIRONMENT_MAY_IMPORT: frozenset[str] = frozenset(
    {"gymckpt.gym_adapter", "gymckpt.runtime", "gymckpt.runtime.lowlevel"}
)
"""What an environment module may import besides its own room: the public episode API
(``gymckpt.gym_adapter``'s front door) and the runtime's public names (``checked_json``, the
model client's request check, is in the runtime's documented low-level namespace)."""

KNOWN_TYPING_CYCLES: frozenset[tuple[str, ...]] = frozenset()
"""Cycles through ``TYPE_CHECKING`` imports still being taken apart, each exactly as
``cycles`` reports it (the modules of one strongly connected component, sorted, the first
repeated): only that exact cycle is let through, so one that grows or shrinks, or a new one,
fails."""

KNOWN_PRIVATE_USES: frozenset[tuple[str, str]] = frozenset()
"""``(file, attribute)`` pairs of private attributes still used across packages, being
removed: only those let through, only in that file."""


REEXPORTS: frozenset[tuple[str, str]] = frozenset(
    {
        # the GymUnavailable family lives in the runtime; backends raise these two
        ("gymckpt.gym_adapter", "GymControlError"),
        ("gymckpt.gym_adapter", "GymInstanceDead"),
    }
)
"""``(module, name)``: a name a public module re-exports from another package on purpose."""

LOWLEVEL = (
    "gymckpt.runtime.lowlevel",
    "gymckpt.gym_adapter.lowlevel",
)
"""The declared low-level namespaces: public API for backend authors (people writing a
``GymBackend`` or an environment) beyond the front door, as ``trio.lowlevel`` is trio's;
importable across packages like a front door, re-exported by none."""

SHARED_DOOR = "_shared"
"""The one private module of a package that gymckpt's other packages may import (see the
module docstring): ``gymckpt.<package>._shared``, at the package's top level."""


def is_shared_door(module: str) -> bool:
    """``gymckpt.runtime._shared`` (a package's shared door), not ``gymckpt.runtime._store``
    nor a ``_shared`` deeper down."""
    parts = module.split(".")
    return len(parts) == 3 and parts[1] in TOP_FOLDERS and parts[2] == SHARED_DOOR


def private_parts(module: str) -> list[str]:
    """The private parts of a module's dotted name, a package's shared door not counted."""
    if is_shared_door(module):
        return []
    return [p for p in module.split(".")[1:] if p.startswith("_") and p != "__version__"]


def library_files(root: Path = ROOT) -> Iterator[Path]:
    """Every module file of the root package and of the mapped folders, subpackages included."""
    yield from root.glob("*.py")
    for folder in TOP_FOLDERS:
        yield from (root / folder).rglob("*.py")


def library_modules(root: Path = ROOT) -> dict[str, Path]:
    """``gymckpt.…`` module name -> file, for the root package and every mapped folder."""
    modules: dict[str, Path] = {}
    for path in library_files(root):
        parts = ["gymckpt", *path.relative_to(root).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_of(module: str) -> str:
    """``gymckpt.app.cli`` -> ``app``; ``gymckpt._version`` -> ``gymckpt``."""
    if module == "gymckpt.__main__":
        return module
    parts = module.split(".")[1:]
    if parts and parts[0] in TOP_FOLDERS:
        return parts[0]
    return "gymckpt"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(
    module: str, path: Path, known: Mapping[str, Path], nodes: list[ast.AST] | None = None
) -> Iterator[tuple[str, int, bool]]:
    """``(imported gymckpt module, line, typing only)`` for every import in ``path``, nested
    ones included; *typing only* for an import under ``if TYPE_CHECKING:``, which never runs.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module."""
    is_package = path.stem == "__init__"
    if nodes is None:
        nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
    typing_only = {
        id(n)
        for block in nodes
        if isinstance(block, ast.If) and _is_type_checking(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in nodes:
        typing = id(node) in typing_only
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gymckpt":
                    yield alias.name, node.lineno, typing
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
                yield (sub if sub in known else target), node.lineno, typing
                if sub not in known and alias.name.startswith("_") and alias.name != "__version__":
                    yield f"{target}.{alias.name}", node.lineno, typing  # a private name


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_definitions(nodes: list[ast.AST]) -> set[str]:
    """The private names a module defines: functions, methods and classes, attributes it
    assigns (``self._x = …``, ``obj._x = …``), and names assigned or annotated at module or
    class level (attrs fields among them)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        names.add(stmt.target.id)
                    elif isinstance(stmt, ast.Assign):
                        names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        names.add(sub.attr)
        elif isinstance(node, ast.Module):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
    return {n for n in names if _private(n)}


def private_uses(nodes: list[ast.AST]) -> Iterator[tuple[str, int]]:
    """``(attribute, line)`` for every ``x._name`` the module reads, writes or calls, except
    on a module imported from outside gymckpt (``trio._core._run`` is trio's, not ours)."""
    foreign = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            foreign.update(
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] != "gymckpt"
            )
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] != "gymckpt"
        ):
            foreign.update(a.asname or a.name for a in node.names)
    for node in nodes:
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root: ast.expr = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in foreign):
                yield node.attr, node.lineno


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def room_violations(module: str, where: str, target: str, line: int) -> Iterator[str]:
    """An import across the rooms of ``gym_adapter`` that ``ROOMS`` and
    ``ENVIRONMENT_MAY_IMPORT`` forbid."""
    for room, forbidden in ROOMS.items():
        if _in(module, room):
            for other in forbidden:
                if _in(target, other):
                    yield f"{where}:{line}: {room} imports {target} (a room it must not import)"
    if (
        _in(module, ENVIRONMENTS)
        and target.split(".")[0] == "gymckpt"
        and not _in(target, ENVIRONMENTS)
        and target not in ENVIRONMENT_MAY_IMPORT
    ):
        yield (
            f"{where}:{line}: environment imports {target}: an environment uses only the "
            f"public episode API ({', '.join(sorted(ENVIRONMENT_MAY_IMPORT))})"
        )


def violations(root: Path = ROOT) -> list[str]:
    known = library_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    typing_graph: dict[str, set[str]] = {m: set() for m in known}
    nodes = {m: list(ast.walk(ast.parse(p.read_text(), str(p)))) for m, p in known.items()}
    defined: dict[str, set[str]] = {}
    for module, module_nodes in nodes.items():
        defined.setdefault(package_of(module), set()).update(private_definitions(module_nodes))
    found: list[str] = []
    for module, path in sorted(known.items()):
        pkg = package_of(module)
        where = f"{path.relative_to(root)}"
        for target, line, typing in imports(module, path, known, nodes[module]):
            tpkg = package_of(target)
            if tpkg not in ALLOWED[pkg]:
                found.append(f"{where}:{line}: upward import of {target} ({pkg} -> {tpkg})")
            if private_parts(target) and tpkg != pkg:
                found.append(f"{where}:{line}: private {target} of package {tpkg} imported")
            found += [v for v in room_violations(module, where, target, line) if v not in found]
            if target in known and target != module:
                typing_graph[module].add(target)
                if not typing:
                    graph[module].add(target)
        for name, line in private_uses(nodes[module]):
            owners = sorted(p for p, names in defined.items() if name in names and p != pkg)
            if (
                owners
                and name not in defined.get(pkg, set())
                and (where, name) not in KNOWN_PRIVATE_USES
            ):
                found.append(
                    f"{where}:{line}: private attribute {name} of package "
                    f"{', '.join(owners)} used in package {pkg}"
                )
        found += front_door_violations(module, where, nodes[module], nodes)
    found += exported_twice(nodes, {m for m, p in known.items() if p.stem == "__init__"})
    run_cycles = cycles(graph)
    found += [f"import cycle: {' -> '.join(c)}" for c in run_cycles]
    found += [
        f"import cycle through TYPE_CHECKING imports: {' -> '.join(c)}"
        for c in cycles(typing_graph)
        if c not in run_cycles and tuple(c) not in KNOWN_TYPING_CYCLES
    ]
    return found


def exports(module_nodes: list[ast.AST]) -> set[str] | None:
    """A module's front door: its ``__all__`` and the names it declares for type checkers
    only (``if TYPE_CHECKING: from ._ray import RayGym as RayGym``, exported lazily); None for
    a module without ``__all__``."""
    names: set[str] | None = None
    for node in module_nodes:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = {
                e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)
            }
    if names is None:
        return None
    for node in module_nodes:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    names.update(a.name for a in stmt.names if a.asname == a.name)
    return names


def front_door_violations(
    module: str, where: str, module_nodes: list[ast.AST], nodes: Mapping[str, list[ast.AST]]
) -> Iterator[str]:
    """A name imported from another package's public module that the module does not export:
    a package's front door is its ``__all__`` (and its low-level namespace's and its shared
    door's)."""
    pkg = package_of(module)
    for node in module_nodes:
        if not (isinstance(node, ast.ImportFrom) and not node.level and node.module in nodes):
            continue
        target = node.module
        if package_of(target) == pkg or private_parts(target):
            continue
        exported = exports(nodes[target])
        if exported is None:
            continue
        for alias in node.names:
            if alias.name not in exported and f"{target}.{alias.name}" not in nodes:
                yield (
                    f"{where}:{node.lineno}: {alias.name} is not exported by {target} "
                    "(its __all__); import it from the module that exports it"
                )


def origin(
    module: str, name: str, nodes: Mapping[str, list[ast.AST]], packages: set[str]
) -> tuple[str, str]:
    """Where ``module``'s ``name`` is defined: followed through the module-level imports."""
    seen = set()
    while (module, name) not in seen and module in nodes:
        seen.add((module, name))
        for node in nodes[module]:
            if isinstance(node, ast.ImportFrom) and node.col_offset == 0:
                alias = next((a for a in node.names if (a.asname or a.name) == name), None)
                if alias is not None:
                    if node.level:
                        base = module.split(".")
                        base = base[: len(base) - node.level + (1 if module in packages else 0)]
                        target = ".".join([*base, *([node.module] if node.module else [])])
                    else:
                        target = node.module or ""
                    module, name = target, alias.name
                    break
        else:
            break
    return module, name


def exported_twice(nodes: Mapping[str, list[ast.AST]], packages: set[str]) -> list[str]:
    """One object in the ``__all__`` of two public modules (or shared doors) of the library's
    packages: give it one home (the root package gathers the trainer API from all of them;
    ``REEXPORTS`` declares the deliberate re-exports)."""
    homes: dict[tuple[str, str], list[str]] = {}
    for module, module_nodes in sorted(nodes.items()):
        if package_of(module) not in {"runtime", "gym_adapter", "nurseries", "testing"}:
            continue
        if private_parts(module):
            continue
        for name in exports(module_nodes) or set():
            if (module, name) not in REEXPORTS:
                homes.setdefault(origin(module, name, nodes, packages), []).append(module)
    return [
        f"{name} is exported by {' and '.join(where)}: give it one home"
        for (_defined, name), where in sorted(homes.items())
        if len(where) > 1
    ]


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
    for name in (
        "gymckpt",
        "gymckpt.runtime._ledger",
        "gymckpt.gym_adapter.host._host",
        "gymckpt.nurseries._coordinator",
        "gymckpt.app.cli",
        "gymckpt.benchmarks.cli",
        "gymckpt.benchmarks.report._targets",
    ):
        assert name in modules


def test_the_layers_hold() -> None:
    assert violations() == []


def test_the_host_names_the_gymnasium_adapter_without_importing_it() -> None:
    """The one reference from the host to an environment is an import path, resolved when a
    ``gymnasium:ID`` source is loaded: it names a factory that exists."""
    from gymckpt.gym_adapter.host._load import GYMNASIUM_FACTORY

    module, _, name = GYMNASIUM_FACTORY.partition(":")
    assert module in library_modules() and module.startswith(ENVIRONMENTS + ".")
    assert f"def {name}(" in library_modules()[module].read_text()


def test_each_lowlevel_namespace_is_one_namespace_down() -> None:
    """A low-level namespace exists, every name in its ``__all__`` imports, and none is also
    in its package's front door."""
    known = library_modules()
    for module in LOWLEVEL:
        nodes = list(ast.walk(ast.parse(known[module].read_text())))
        front = list(ast.walk(ast.parse(known[module.rsplit(".", 1)[0]].read_text())))
        low, top = exports(nodes), exports(front)
        assert low and top is not None, module
        assert not low & top, (module, low & top)
        namespace = importlib.import_module(module)
        assert sorted(namespace.__all__) == sorted(low)
        for name in low:
            assert getattr(namespace, name) is not None, (module, name)
        package = importlib.import_module(module.rsplit(".", 1)[0])
        assert not [n for n in low if hasattr(package, n)], module  # not re-exported on top


def test_the_runtime_lowlevel_is_documented_backend_author_api() -> None:
    """``gymckpt.runtime.lowlevel`` is public API for backend authors, not the runtime's
    plumbing: a handful of names, each documented in its module docstring; what gymckpt's
    own packages share besides is in ``gymckpt.runtime._shared``."""
    import gymckpt.runtime._shared as shared
    import gymckpt.runtime.lowlevel as lowlevel

    doc = lowlevel.__doc__ or ""
    assert "backend author" in doc
    undocumented = [n for n in lowlevel.__all__ if f"``{n}``" not in doc]
    assert not undocumented, (
        f"document these in gymckpt.runtime.lowlevel's docstring: {undocumented}"
    )
    assert len(lowlevel.__all__) < 15, lowlevel.__all__
    assert not set(lowlevel.__all__) & set(shared.__all__)


def test_known_exceptions_are_still_needed() -> None:
    """Each known exception names something still in the tree (else remove the entry)."""
    known = library_modules()
    graph = {
        m: {t for t, _line, _typing in imports(m, p, known) if t in known and t != m}
        for m, p in known.items()
    }
    live = {tuple(c) for c in cycles(graph)}
    gone = [" -> ".join(c) for c in KNOWN_TYPING_CYCLES - live]
    for where, name in sorted(KNOWN_PRIVATE_USES):
        used = private_uses(list(ast.walk(ast.parse((ROOT / where).read_text()))))
        if name not in {n for n, _line in used}:
            gone.append(f"{where}: {name}")
    assert not gone, (
        "fixed, so delete from KNOWN_TYPING_CYCLES / KNOWN_PRIVATE_USES in tests/test_layers.py: "
        + "; ".join(gone)
    )


def _copy_tree(dest: Path) -> None:
    for path in library_files(ROOT):
        target = dest / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())


@pytest.mark.parametrize(
    ("where", "line", "says"),
    [
        (
            "runtime/_gate.py",
            "from gymckpt.nurseries import Dispatcher\n",
            "upward import of gymckpt.nurseries (runtime -> nurseries)",
        ),
        (
            "nurseries/_calls.py",
            "    from gymckpt.app import cli\n",
            "upward import of gymckpt.app.cli (nurseries -> app)",
        ),
        (
            "benchmarks/_common.py",
            "from gymckpt.app.demo.main import ToyTrainer\n",
            "upward import of gymckpt.app.demo.main (benchmarks -> app)",
        ),
        (
            "nurseries/_restore.py",
            "from gymckpt.runtime._ledger import LedgerSnapshot\n",
            "private gymckpt.runtime._ledger of package runtime imported",
        ),
        (
            "app/demo/main.py",
            "from gymckpt.gym_adapter.host import _host\n",
            "private gymckpt.gym_adapter.host._host of package gym_adapter imported",
        ),
        (
            "aio.py",
            "    from gymckpt.app import cli\n",
            "upward import of gymckpt.app.cli (gymckpt -> app)",
        ),
        (
            "__init__.py",
            "from gymckpt.app.verdict import judge\n",
            "upward import of gymckpt.app.verdict (gymckpt -> app)",
        ),
        (
            "runtime/_barrier.py",
            "from ._ledger import RecoveryLedger\n",
            "import cycle: gymckpt.runtime._barrier -> gymckpt.runtime._ledger",
        ),
        (
            "runtime/_barrier.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._ledger import X\n",
            "import cycle through TYPE_CHECKING imports: gymckpt.runtime._barrier -> "
            "gymckpt.runtime._ledger",
        ),
        (
            "benchmarks/report/_format.py",
            "from ._summary import write_summary\n",
            "-> gymckpt.benchmarks.report._format -> gymckpt.benchmarks.report._misses ->",
        ),
        (
            "nurseries/_restore.py",
            "from gymckpt.runtime import fsync_dir\n",
            "fsync_dir is not exported by gymckpt.runtime (its __all__)",
        ),
        (
            "benchmarks/_common.py",
            "    from gymckpt.nurseries._shared import STAGES\n",
            "STAGES is not exported by gymckpt.nurseries._shared",
        ),
        (
            "nurseries/_shared.py",
            "from ._coordinator import STAGES\n__all__ = ['PAUSE_HOLDER', 'READY', 'STAGES']\n",
            "STAGES is exported by gymckpt.nurseries and gymckpt.nurseries._shared",
        ),
        (
            "runtime/_shared.py",
            "from ._store import write_atomic\n__all__ = ['write_atomic']\n",
            "write_atomic is exported by gymckpt.runtime._shared and gymckpt.runtime.lowlevel",
        ),
        (
            "app/snapshots.py",
            "from gymckpt.runtime._store import tree_size\n",
            "private gymckpt.runtime._store of package runtime imported",
        ),
        (
            "gym_adapter/host/_records.py",
            "from gymckpt.nurseries._shared import leaf_errors\n",
            "upward import of gymckpt.nurseries._shared (gym_adapter -> nurseries)",
        ),
        (
            "app/demo/main.py",
            "from gymckpt.gym_adapter.host._shared import X\n",
            "private gymckpt.gym_adapter.host._shared of package gym_adapter imported",
        ),
        ("nurseries/_restore.py", "    RecoveryLedger()._row_block\n", "nurseries/_restore.py:"),
        (
            "gym_adapter/host/_load.py",
            "    from ..transports._embedded import EmbeddedGym\n",
            "gymckpt.gym_adapter.host imports gymckpt.gym_adapter.transports._embedded",
        ),
        (
            "gym_adapter/host/_cut.py",
            "    from gymckpt.gym_adapter.environments import calendar\n",
            "gymckpt.gym_adapter.host imports gymckpt.gym_adapter.environments.calendar",
        ),
        (
            "gym_adapter/transports/ray/_actor.py",
            "    from ...environments.calendar import CalendarConfig\n",
            "gymckpt.gym_adapter.transports imports gymckpt.gym_adapter.environments.calendar",
        ),
        (
            "gym_adapter/environments/calendar.py",
            "    from ..host._episodes import request_digest\n",
            "environment imports gymckpt.gym_adapter.host._episodes: an environment uses only",
        ),
        (
            "gym_adapter/environments/openspiel.py",
            "from gymckpt.gym_adapter.transports._embedded import EmbeddedGym\n",
            "environment imports gymckpt.gym_adapter.transports._embedded",
        ),
        (
            "gym_adapter/environments/textarena.py",
            "    from gymckpt.gym_adapter.lowlevel import RemoteGym\n",
            "environment imports gymckpt.gym_adapter.lowlevel: an environment uses only",
        ),
    ],
)
def test_a_violation_is_caught(tmp_path: Path, where: str, line: str, says: str) -> None:
    """The check fails on each kind of violation, planted in a copy of the tree."""
    _copy_tree(tmp_path)
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


def test_a_private_attribute_of_another_package_is_caught(tmp_path: Path) -> None:
    """``x._name`` counts when another package defines ``_name`` and this one does not; a
    name this package defines too, a dunder, or a name no package defines, does not."""
    _copy_tree(tmp_path)
    (tmp_path / "runtime" / "_planted.py").write_text(
        "class Store:\n    def __init__(self) -> None:\n        self._planted_rows = 0\n"
        "    def _compact(self) -> None:\n        pass\n"
    )
    (tmp_path / "nurseries" / "_planted.py").write_text(
        "def use(store, other) -> None:\n    store._compact()\n    print(store._planted_rows)\n"
        "    other._mine()\n    print(store.__dict__, other._no_package_defines_this)\n\n\n"
        "def _mine() -> None:\n    pass\n"
    )
    found = [v for v in violations(tmp_path) if "_planted" in v]
    assert found == [
        "nurseries/_planted.py:2: private attribute _compact of package runtime used in "
        "package nurseries",
        "nurseries/_planted.py:3: private attribute _planted_rows of package runtime used in "
        "package nurseries",
    ]
