"""Every rule reference in the repository resolves to ``docs/design.md``, and nothing points
outside the repository.

Comments, docstrings, error messages and documents cite the design by rule: ``S1`` … ``S14``
(behaviour), ``C1`` … ``C7`` (contracts), ``§2b``-style sections. A reference is only worth
something if a reader of a fresh clone can follow it, so each one must name a heading of
``docs/design.md``; and the repository must never send a reader to a document it does not
hold (a design file by another name, a ``shared`` folder beside the clone). The design document
itself must agree with the tree: every file path it names exists, every test it names
(``tests/test_x.py::test_name``) is defined there, and every relative link of a Markdown file
lands inside the repository.

The scan reads every ``.py`` and ``.md`` file of the repository (library, tests, benchmarks,
testing, README, docs), this one included, line by line, strings and all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN_DOC = Path("docs") / "design.md"

RULES = {f"S{n}" for n in range(1, 15)} | {f"C{n}" for n in range(1, 8)}
"""Every rule the design document must define, under a heading of its own."""

_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist"})
_RULE_REF = re.compile(r"\b([SC]\d+)\b")
_SECTION_REF = re.compile(r"§\s*(\d+[a-z]?)")
# a design document by name, or a folder beside the clone; spelt so this file does not match
_OUTSIDE = re.compile(r"\bD[E]SIGN\b|\.[.]/shared\b|/work[/]shared\b|\.[.]/main\b")
_HEADING = re.compile(r"^#{1,4}\s+(§\d+[a-z]?|[SC]\d+)\b")
_ANCHOR = re.compile(r'^<a id="([a-z0-9-]+)"></a>\s*$')
_MUTANT_IN_TICKS = re.compile(r"`([a-z][a-z0-9]*(?:-[a-z0-9]+){2,})`")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH_IN_TICKS = re.compile(
    r"`((?:runtime|gym_adapter|nurseries|benchmarks|testing|tests|docs|\.ci)/[\w./-]+"
    r"|[\w-]+\.(?:py|md|toml))(?:::(\w+))?`"
)


@attrs.frozen
class Problem:
    """One reference that does not resolve, at ``path:line``."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def scanned_files(root: Path = ROOT) -> Iterator[Path]:
    """Every ``.py`` and ``.md`` file under ``root``, hidden folders, caches and symbolic links to
    folders (``.typecheck/gymckpt`` is the clone itself) left out; sorted, so reports are
    stable."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):  # does not follow links to folders
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")
        ]
        found += [Path(folder) / f for f in files if f.endswith((".py", ".md"))]
    return iter(sorted(found))


def anchor_of(key: str) -> str:
    """The stable anchor of a heading key: ``S9`` -> ``s9``, ``§2b`` -> ``section-2b``."""
    return f"section-{key[1:]}" if key.startswith("§") else key.lower()


def headings(design: Path) -> tuple[set[str], list[Problem]]:
    """The keys the design document defines (``S1``, ``C6``, ``§2b`` …), and its own problems:
    a key defined twice, or a heading without its anchor on the line before it."""
    keys: set[str] = set()
    problems: list[Problem] = []
    lines = design.read_text(encoding="utf-8").splitlines()
    for i, text in enumerate(lines):
        m = _HEADING.match(text)
        if not m:
            continue
        key = m.group(1)
        if key in keys:
            problems.append(Problem(str(DESIGN_DOC), i + 1, f"{key} is defined twice"))
        keys.add(key)
        before = _ANCHOR.match(lines[i - 1]) if i else None
        if before is None or before.group(1) != anchor_of(key):
            problems.append(
                Problem(
                    str(DESIGN_DOC),
                    i + 1,
                    f'heading {key} needs the anchor <a id="{anchor_of(key)}"></a> on the line '
                    "before it (links to it must not depend on the heading's wording)",
                )
            )
    return keys, problems


def reference_problems(root: Path = ROOT) -> list[Problem]:
    """Every reference under ``root`` that does not resolve to a heading of the design document,
    and every pointer outside the repository."""
    design = root / DESIGN_DOC
    if not design.is_file():
        return [
            Problem(
                str(DESIGN_DOC), 0, "the design document is missing: rule references cannot resolve"
            )
        ]
    keys, problems = headings(design)
    for path in scanned_files(root):
        rel = path.relative_to(root).as_posix()
        for n, text in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            for m in _OUTSIDE.finditer(text):
                problems.append(
                    Problem(
                        rel,
                        n,
                        f"{m.group(0)!r} points outside the repository; cite "
                        "docs/design.md (a rule like S9, or a section like §2b) instead",
                    )
                )
            for m in _RULE_REF.finditer(text):
                if m.group(1) not in keys:
                    problems.append(
                        Problem(
                            rel,
                            n,
                            f"{m.group(1)} is not a rule of docs/design.md (it defines "
                            f"{', '.join(sorted(keys - _sections(keys), key=_natural))})",
                        )
                    )
            for m in _SECTION_REF.finditer(text):
                if "§" + m.group(1) not in keys:
                    problems.append(
                        Problem(
                            rel,
                            n,
                            f"§{m.group(1)} is not a section of docs/design.md "
                            f"(it has {', '.join(sorted(_sections(keys)))})",
                        )
                    )
    return problems


def _sections(keys: set[str]) -> set[str]:
    return {k for k in keys if k.startswith("§")}


def _natural(key: str) -> tuple[str, int]:
    return key[0], int(key[1:])


def path_problems(root: Path = ROOT) -> list[Problem]:
    """What the Markdown files say about the tree that is not so: a relative link that leaves
    the repository or lands nowhere; in ``docs/``, a backticked file path that does not exist,
    or a test (``tests/test_x.py::test_name``) that file does not define, or a mutant
    (``s1-some-mutant``) ``tests/mutation.py`` does not define."""
    problems: list[Problem] = []
    mutation = root / "tests" / "mutation.py"
    mutants = set(
        re.findall(r'Mutant\(\s*"([^"]+)"', mutation.read_text(encoding="utf-8"))
        if mutation.exists()
        else ()
    )
    for path in scanned_files(root):
        if path.suffix != ".md":
            continue
        rel = path.relative_to(root).as_posix()
        in_docs = rel.startswith("docs/")
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _MD_LINK.finditer(text):
                target, _, anchor = m.group(1).partition("#")
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL
                where = (path.parent / target).resolve() if target else path
                if not where.is_relative_to(root.resolve()):
                    problems.append(Problem(rel, n, f"link {target!r} leaves the repository"))
                elif not where.exists():
                    problems.append(Problem(rel, n, f"link {target!r} names no file"))
                elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                    problems.append(Problem(rel, n, f"link {m.group(1)!r} names no anchor"))
            if not in_docs:
                continue
            for m in _MUTANT_IN_TICKS.finditer(text):
                if m.group(1) not in mutants:
                    problems.append(
                        Problem(rel, n, f"tests/mutation.py has no mutant {m.group(1)}")
                    )
            for m in _PATH_IN_TICKS.finditer(text):
                name, test = m.group(1), m.group(2)
                if "/" not in name and not (root / name).exists():
                    continue  # a bare file name (``records.json``) is not a repository path
                target = root / name
                if not target.exists():
                    problems.append(Problem(rel, n, f"{name} does not exist"))
                elif test is not None and not re.search(
                    rf"^\s*(?:async\s+)?def {test}\(", target.read_text(encoding="utf-8"), re.M
                ):
                    problems.append(Problem(rel, n, f"{name} defines no {test}"))
    return problems


def anchors(doc: Path) -> set[str]:
    """The anchors a Markdown file defines: explicit ``<a id>`` ones, and the ones GitHub derives
    from its headings."""
    found: set[str] = set()
    for text in doc.read_text(encoding="utf-8").splitlines():
        if m := _ANCHOR.match(text):
            found.add(m.group(1))
        elif m := re.match(r"^#{1,6}\s+(.*)$", text):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


def _report(problems: list[Problem]) -> str:
    return "\n".join(str(p) for p in problems)


def test_every_rule_has_its_heading() -> None:
    keys, problems = headings(ROOT / DESIGN_DOC)
    assert not problems, _report(problems)
    missing = RULES - keys
    assert not missing, f"docs/design.md has no heading for {', '.join(sorted(missing))}"


def test_every_reference_resolves_to_the_design_document() -> None:
    problems = reference_problems()
    assert not problems, _report(problems)


def test_the_documents_agree_with_the_tree() -> None:
    problems = path_problems()
    assert not problems, _report(problems)


# -- the checks themselves, on planted trees -----------------------------------------------------

_PLANTED_DESIGN = """\
# design

<a id="section-2b"></a>
## §2b Around the rules

<a id="s1"></a>
### S1 Dispatch under the gate

<a id="c4"></a>
### C4 Exit codes
"""


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_planted_references_are_named_by_file_and_line(tmp_path: Path) -> None:
    outside = "DES" + "IGN"
    _plant(
        tmp_path,
        {
            "docs/design.md": _PLANTED_DESIGN,
            "runtime/_gate.py": '"""Admission (S1, §2b)."""\nX = 1  # exit 2 (C4)\n',
            "runtime/_ledger.py": f'"""Fencing ({outside} §2b)."""\n\n\nY = "see S{15}"\n',
            "README.md": "ok\n\nthe design: ../" + "shared/" + outside + ".md\n",
            "tests/test_x.py": 'def test_x():\n    raise AssertionError("§5 says so")\n',
        },
    )
    got = {(p.path, p.line) for p in reference_problems(tmp_path)}
    assert got == {
        ("runtime/_ledger.py", 1),  # the name of a document outside
        ("runtime/_ledger.py", 4),  # no such rule
        ("README.md", 3),  # twice: the folder beside the clone, the document's name
        ("tests/test_x.py", 2),  # an error message's section that does not exist
    }
    assert len([p for p in reference_problems(tmp_path) if p.path == "README.md"]) == 2


def test_a_heading_without_its_anchor_is_refused(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "docs/design.md": '# design\n\n### S1 Dispatch\n\n<a id="c4"></a>\n'
            '### C4 Exit codes\n\n<a id="c4"></a>\n### C4 again\n'
        },
    )
    got = [(p.line, p.what.split()[0]) for p in headings(tmp_path / DESIGN_DOC)[1]]
    assert got == [(3, "heading"), (9, "C4")]


def test_no_design_document_is_one_problem(tmp_path: Path) -> None:
    _plant(tmp_path, {"runtime/_gate.py": '"""(S1)."""\n'})
    assert [p.what.split(":")[0] for p in reference_problems(tmp_path)] == [
        "the design document is missing"
    ]


def test_planted_paths_and_links_are_checked(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "docs/design.md": (
                '<a id="s1"></a>\n'
                "`runtime/_gate.py` and `tests/test_gate.py::test_close_waits` and"
                " `tests/test_gate.py::test_gone`; `runtime/_gone.py`; `records.json`; mutants"
                " `s1-gate-left-open` and `s9-no-such-mutant`\n"
                "[up](../../elsewhere.md) [ok](../README.md) [none](missing.md) [web](https://x.y)\n"
            ),
            "runtime/_gate.py": "",
            "tests/test_gate.py": "async def test_close_waits():\n    pass\n",
            "tests/mutation.py": 'MUTANTS = [Mutant("s1-gate-left-open", "S1")]\n',
            "README.md": "[design](docs/design.md#s1) [bad](docs/nothing.md)"
            " [gone](docs/design.md#s9) [own](#bring-your-own) [not](#nowhere)"
            "\n\n## Bring your own\n",
        },
    )
    got = sorted(str(p) for p in path_problems(tmp_path))
    assert got == [
        "README.md:1: link '#nowhere' names no anchor",
        "README.md:1: link 'docs/design.md#s9' names no anchor",
        "README.md:1: link 'docs/nothing.md' names no file",
        "docs/design.md:2: runtime/_gone.py does not exist",
        "docs/design.md:2: tests/mutation.py has no mutant s9-no-such-mutant",
        "docs/design.md:2: tests/test_gate.py defines no test_gone",
        "docs/design.md:3: link '../../elsewhere.md' leaves the repository",
        "docs/design.md:3: link 'missing.md' names no file",
    ]


@pytest.mark.parametrize(
    "text", ["S1-S14", "S1\N{EN DASH}S11, S13", "(S8/C6)", '"S7"', "C3 ``run:error``"]
)
def test_rule_references_are_found_in_every_spelling(text: str) -> None:
    assert _RULE_REF.findall(text), text


S14_NAMES = (
    "admission_closed",
    "GymAdmissionClosed",
    "retire_restored",
    "restore_retire",
    "capture_keys",
    "unclaimed",
    "rollout/gym_admission_closed_rows_total",
)
"""The names S14 fixes: the contract's words, on both sides."""


def test_s14_names_are_the_ones_the_code_uses() -> None:
    """Each name of S14 is used by the library, and named in the design document."""
    library = "\n".join(
        p.read_text(encoding="utf-8")
        for folder in ("runtime", "gym_adapter", "nurseries")
        for p in sorted((ROOT / folder).rglob("*.py"))
    )
    design = (ROOT / DESIGN_DOC).read_text(encoding="utf-8")
    section = design[design.index('<a id="s14">') :]
    for name in S14_NAMES:
        assert re.search(rf"(?<![\w/]){re.escape(name)}(?!\w)", library), name
        assert name in section[: section.index("<a id=", 1)], name
