"""``gymckpt demo --checkpoint-mode``: the flag, its ``--help``, the ``--config`` file's
``[demo] checkpoint_mode``, and a bad value (one line, exit 2); the options reach
``run_demo`` (stubbed here: the runs themselves are in ``test_demo_unaligned``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymckpt.app.cli import main as cli_main
from gymckpt.app.demo import main as demo
from gymckpt.app.demo.options import CHECKPOINT_MODES, DemoOptions


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[DemoOptions]:
    """The options ``gymckpt demo`` would run with (nothing runs)."""
    seen: list[DemoOptions] = []

    def run_demo(opts: DemoOptions, as_json: bool) -> int:
        seen.append(opts)
        return 0

    monkeypatch.setattr(demo, "run_demo", run_demo)
    return seen


def test_aligned_is_the_default_and_the_flag_sets_the_trainers_mode(
    ran: list[DemoOptions],
) -> None:
    assert CHECKPOINT_MODES == ("aligned", "unaligned")
    assert cli_main(["demo"]) == 0
    assert cli_main(["demo", "--checkpoint-mode", "unaligned"]) == 0
    assert [o.checkpoint_mode for o in ran] == ["aligned", "unaligned"]
    assert ran[1].runtime_config().checkpoint_mode.value == "unaligned"


def test_help_explains_the_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["demo", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--checkpoint-mode {aligned,unaligned}" in text
    assert "aligned (default) parks every episode at its next step boundary" in text
    assert "unaligned parks nothing" in text and "counts the episodes taken mid-turn" in text


def test_the_config_file_sets_it_and_the_command_line_wins(
    tmp_path: Path, ran: list[DemoOptions]
) -> None:
    conf = tmp_path / "demo.toml"
    conf.write_text('[demo]\ncheckpoint_mode = "unaligned"\n[runtime]\nlease_s = 60.0\n')
    assert cli_main(["demo", "--config", str(conf)]) == 0
    assert cli_main(["demo", "--config", str(conf), "--checkpoint-mode", "aligned"]) == 0
    assert [o.checkpoint_mode for o in ran] == ["unaligned", "aligned"]
    config = ran[0].runtime_config()
    assert config.checkpoint_mode.value == "unaligned" and config.lease_s == 60.0


@pytest.mark.parametrize("as_json", [False, True])
def test_a_bad_value_on_the_command_line_is_one_line_exit_2(
    as_json: bool, ran: list[DemoOptions], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["demo", "--checkpoint-mode", "sideways", *(["--json"] if as_json else [])])
    assert exit_.value.code == 2 and ran == []
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "gymckpt demo: error: argument --checkpoint-mode: invalid choice: 'sideways' "
        "(choose from 'aligned', 'unaligned') (see --help)"
    ]
    if as_json:
        report = json.loads(out)
        assert report["exit_code"] == 2 and report["exactly_once"] is False
        assert "--checkpoint-mode" in report["error"] and report["episodes_mid_turn"] == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            '[demo]\ncheckpoint_mode = "sideways"\n',
            "[demo]: --checkpoint-mode must be aligned or unaligned, got 'sideways'",
        ),
        (
            '[runtime]\ncheckpoint_mode = "unaligned"\n',
            "[runtime]: checkpoint_mode is the demo's option: set it as checkpoint_mode in "
            "[demo] or with --checkpoint-mode, not in [runtime]",
        ),
    ],
)
def test_a_bad_value_in_the_config_file_is_one_line_exit_2(
    tmp_path: Path,
    body: str,
    says: str,
    ran: list[DemoOptions],
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = tmp_path / "demo.toml"
    conf.write_text(body)
    assert cli_main(["demo", "--config", str(conf)]) == 2 and ran == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gymckpt: error: {conf} ") and says in err[0], err
