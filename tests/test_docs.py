"""The documentation site builds, with warnings as errors, and its generated reference agrees
with the code.

``docs/`` is a Sphinx site (MyST Markdown pages, autodoc for the Python API, and
``docs/_ext/gymckpt_docs.py`` generating the command line, exit codes, configuration keys and
metrics from the code). A link between pages that lands nowhere, a page left out of every
toctree, a docstring that is not valid reStructuredText, or a cross-reference to a name that no
longer exists is a warning, and ``-W`` makes it a failure here. The README is the pitch, the two
commands and the example, with links; the rest lives in the site.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gymckpt.app.cli import EXIT_CODE_SUMMARY, exit_codes_epilog
from gymckpt.nurseries import ExitCode

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

README_MAX_LINES = 250
FUNCTION_MAX_LINES = 80


def _sphinx(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``sphinx-build -W --keep-going -n -b html`` of ``source`` into ``out`` (nitpicky: every
    cross-reference must resolve)."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
    command += ["-d", str(out / ".doctrees"), str(source), str(out)]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.timeout(300)
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    built = _sphinx(DOCS, tmp_path / "html")
    assert built.returncode == 0, built.stderr[-5000:]
    # the generated reference is there: every subcommand's help, every exit code
    cli = (tmp_path / "html" / "reference" / "cli.html").read_text(encoding="utf-8")
    for command in ("gymckpt demo", "gymckpt snapshots prune", "gymckpt serve", "gymckpt bench"):
        assert f'id="{command.replace(" ", "-")}"' in cli, command
    for code in ExitCode:
        assert f'<code class="docutils literal notranslate"><span class="pre">{code.name}' in cli


@pytest.mark.timeout(120)
def test_a_broken_link_or_a_stale_reference_fails_the_build(tmp_path: Path) -> None:
    """Planted: a link to a page that does not exist, a reference to a Python name that does
    not, and a link to a rule anchor the design does not define; each is named."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(DOCS / "conf.py", site / "conf.py")
    shutil.copytree(DOCS / "_ext", site / "_ext")
    (site / "index.md").write_text("# planted\n\n```{toctree}\ndesign\npage\n```\n")
    (site / "design.md").write_text('# design\n\n<a id="s1"></a>\n## S1 A rule\n\nText.\n')
    (site / "page.md").write_text(
        "# page\n\n[ok](design.md#s1), [gone](nowhere.md), [no rule](design.md#s99),"
        " {py:class}`gymckpt.NoSuchName`\n"
    )
    built = _sphinx(site, tmp_path / "html")
    assert built.returncode != 0
    assert "nowhere" in built.stderr, built.stderr
    assert "s99" in built.stderr, built.stderr
    assert "gymckpt.NoSuchName" in built.stderr, built.stderr
    assert "'s1'" not in built.stderr, built.stderr  # the anchor marker is a target


def test_help_lists_every_exit_code() -> None:
    """``gymckpt --help`` names every code of ``ExitCode``, the one table of them, each with its
    words: the list is generated, so a new code cannot be left out."""
    out = subprocess.run(
        [sys.executable, "-m", "gymckpt", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},
    ).stdout
    epilog = " ".join(out[out.index("exit codes:") :].split())
    assert epilog == exit_codes_epilog()
    for code in ExitCode:
        assert f"{int(code)} {EXIT_CODE_SUMMARY[code]}" in epilog, code


def test_every_exit_code_has_its_words() -> None:
    assert set(EXIT_CODE_SUMMARY) == set(ExitCode)


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("module", ["app/cli.py", "app/serve.py"])
def test_no_function_of_the_command_line_is_long(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > FUNCTION_MAX_LINES  # type: ignore[operator]
    ]
    assert not long, long
