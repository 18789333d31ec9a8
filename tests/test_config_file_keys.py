"""Configuration files: no key is ignored because it sits in the wrong place.

A table's key written at the top level (above every table header, so TOML puts it outside the
table) is refused whether or not the file also has the table; ``group_size`` and the other
``open_rollouts`` arguments in ``[runtime]`` are refused with a message saying where they go;
and the configuration how-to's example is a file that both readers accept.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import attrs
import pytest

from gymckpt.app.cli import _demo_file_defaults, _demo_file_runtime
from gymckpt.app.cli import main as cli_main
from gymckpt.app.demo.main import DemoOptions
from gymckpt.nurseries import open_rollouts
from gymckpt.runtime import ManifestError, RuntimeConfig, runtime_config_from_toml
from gymckpt.runtime._config_file import TRAINER_ARGUMENTS
from gymckpt.runtime._shared import load_toml_table

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "howto" / "configuration.md"


def test_a_top_level_key_above_its_table_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("rows = 16\n[demo]\ngroup_size = 2\n")  # rows is outside [demo]
    with pytest.raises(
        ManifestError,
        match=r"job.toml: rows at the top level, outside \[demo\]; "
        r"put it under \[demo\]",
    ):
        load_toml_table(job, "demo", ["rows", "group_size"])
    job.write_text("lease_s = 90\n[runtime]\nmax_consecutive_failures = 5\n")
    with pytest.raises(ManifestError, match=r"lease_s at the top level, outside \[runtime\]"):
        runtime_config_from_toml(job)
    # under its table it is taken; another table's key at the top level is not this one's
    job.write_text("rows = 16\n[runtime]\nlease_s = 90\n")
    assert runtime_config_from_toml(job).lease_s == 90.0


def test_demo_with_a_key_above_its_table_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "demo.toml"
    conf.write_text("rows = 16\n[demo]\ngroup_size = 2\n")
    assert cli_main(["demo", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert str(conf) in err and "rows at the top level, outside [demo]" in err, err


def test_group_size_in_runtime_says_where_it_goes(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[runtime]\nlease_s = 60.0\ngroup_size = 4\n")
    with pytest.raises(
        ManifestError,
        match=r"job.toml \[runtime\]: group_size is not a runtime "
        r"setting but an argument of open_rollouts "
        r"\(group_size=\.\.\.\); for gymckpt demo put it "
        r"under \[demo\]",
    ):
        runtime_config_from_toml(job)


def test_demo_with_group_size_in_runtime_exits_2_saying_where_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "demo.toml"
    conf.write_text("[runtime]\ngroup_size = 4\n")
    assert cli_main(["demo", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert f"{conf} [runtime]: group_size is not a runtime setting" in err, err
    assert "under [demo]" in err


def test_trainer_arguments_are_open_rollouts_keywords_and_no_runtime_field() -> None:
    params = inspect.signature(open_rollouts).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert TRAINER_ARGUMENTS.issubset(keywords)
    assert {"rows", "group_size", "keep_snapshots"} <= TRAINER_ARGUMENTS
    assert not TRAINER_ARGUMENTS & {a.name for a in attrs.fields(RuntimeConfig)}


def test_the_readme_configuration_example_is_accepted(tmp_path: Path) -> None:
    """The configuration how-to's example (it was the README's)."""
    text = CONFIGURATION.read_text()
    section = text[text.index("## A configuration file") : text.index("## Checkpoint modes")]
    # every `key = value` the section shows, in the table the section says it goes in
    shown = re.findall(r"`(\w+) = ([^`]+)` in `\[(\w+)\]`", section)
    assert ("group_size", "4", "demo") in shown and ("lease_s", "60.0", "runtime") in shown
    conf = tmp_path / "job.toml"
    tables: dict[str, list[str]] = {}
    for key, value, table in shown:
        tables.setdefault(table, []).append(f"{key} = {value}")
    conf.write_text("".join(f"[{t}]\n" + "\n".join(lines) + "\n" for t, lines in tables.items()))
    assert runtime_config_from_toml(conf).lease_s == 60.0
    assert load_toml_table(conf, "demo")["group_size"] == 4
    # the demo's two readers take it: [demo] as its options, [runtime] as its runtime settings
    assert _demo_file_defaults(str(conf))["group_size"] == 4
    opts = DemoOptions(runtime=_demo_file_runtime(str(conf)))
    assert opts.runtime_config(f"{conf} [runtime]").lease_s == 60.0


def test_outage_budget_is_a_runtime_key(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[runtime]\noutage_budget_s = 90.0\n")
    assert runtime_config_from_toml(job).outage_budget_s == 90.0
    assert RuntimeConfig().outage_budget_s == 300.0  # outlasts a model server's restart
    job.write_text("[runtime]\noutage_budget_s = 0.0\n")
    with pytest.raises(ManifestError, match="outage_budget_s"):
        runtime_config_from_toml(job)
