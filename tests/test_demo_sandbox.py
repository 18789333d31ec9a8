"""``gymckpt demo --env sandbox:coding``: a coding agent in a sandbox (write a fix, run the tests,
log a line, rewarded by the tests; its model ``openai_model`` against the project's offline test
server) through the two-process run, a real SIGKILL after the first
checkpoint and a restore in a new process, in both checkpoint modes: every trained episode's
final tree is byte-identical to the uninterrupted run's, each ``work.log`` line once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from gymckpt.app.demo.envs import FAMILIES, env_choice, trajectory_verdict
from gymckpt.app.demo.gymnasium import trajectory_digest
from gymckpt.app.demo.journal import JOURNAL, read_journal
from gymckpt.gym_adapter import EpisodeInfo
from gymckpt.gym_adapter.environments.coding import (
    CANDIDATES,
    CORRECT,
    TEMPLATE,
    fix_of,
    fix_request,
    reference_result,
    scripted_model,
)
from gymckpt.runtime._shared import converter


def demo(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymckpt", "demo", "--json", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_the_coding_demo_is_exactly_once_with_trees_identical_to_an_uninterrupted_run(
    tmp_path: Path, mode: str
) -> None:
    done = demo(
        tmp_path / "w",
        "--env",
        "sandbox:coding",
        "--rows",
        "32",
        "--group-size",
        "2",
        "--checkpoint-every",
        "1",
        "--crash-after-checkpoint",
        "1",
        "--checkpoint-mode",
        mode,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["env"] == "sandbox:coding" and report["checkpoint_mode"] == mode
    assert report["exactly_once"] is True and report["trajectories_match"] is True, report
    assert report["killed_with_sigkill"] is True and report["restores"] == 1
    assert report["episodes"] == 64 and report["trajectories_mismatched"] == 0
    # the lineage: phase 1's steps after the checkpoint, lost with it, are not in it
    lineage, _ = read_journal(tmp_path / "w" / JOURNAL)
    trained = Counter((r, s) for x in lineage for r, s, _ in x["episodes"])
    assert sorted(trained) == [(r, s) for r in range(32) for s in range(2)]
    assert set(trained.values()) == {1}
    # phase 2 continued episodes the checkpoint took in flight, each from its restored tree
    lines = [orjson.loads(x) for x in (tmp_path / "w" / JOURNAL).read_bytes().splitlines()]
    claims = [x["restored_from"] for x in lines if "restored_from" in x]
    assert claims and len(claims) == len(set(claims))


def test_an_unknown_sandbox_task_stops_the_demo_with_one_line(tmp_path: Path) -> None:
    done = demo(tmp_path / "w", "--env", "sandbox:no_such_task")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no such sandbox task 'no_such_task'" in line and "coding" in line
    assert json.loads(done.stdout)["exit_code"] == 2


def test_the_reference_run_fixes_the_bug_or_runs_out_of_turns_logging_each_turn_once() -> None:
    results = [reference_result("coding", 0, row, 0) for row in range(6)]
    assert results[0] == reference_result("coding", 0, 0, 0)  # a function of its arguments
    assert sorted(results[0].tree) == sorted(TEMPLATE)
    for r in results:
        log = r.work_log.splitlines()
        assert len(log) == len(r.tried) == len(r.rewards) and len(set(log)) == len(log)
        assert all(line.startswith(f"turn {t}: return ") for t, line in enumerate(log))
        solved = r.rewards[-1] == 1.0
        assert solved == (r.tried[-1] == CORRECT) and sum(r.rewards) == float(solved)
    # the scripted model is wrong first in some episodes, right first in others
    assert {len(r.tried) for r in results} != {1}


def test_a_trained_episode_whose_tree_differs_is_a_mismatch() -> None:
    choice = env_choice("sandbox:coding")
    assert choice is not None
    reference = FAMILIES["sandbox:"].reference
    good = trajectory_digest(converter.unstructure(reference("coding", 0, 1, 0)))
    changed = reference("coding", 0, 1, 0)
    changed.work_log += changed.work_log.splitlines(keepends=True)[-1]  # a line logged twice
    bad = trajectory_digest(converter.unstructure(changed))
    ok = trajectory_verdict(choice, 0, [{"episodes": [[1, 0, good]]}])
    assert ok["trajectories_match"] is True and ok["trajectories_mismatched"] == 0
    verdict = trajectory_verdict(choice, 0, [{"episodes": [[1, 0, good], [1, 0, bad]]}])
    assert verdict["trajectories_match"] is False and verdict["trajectories_mismatched"] == 1


def test_the_fix_is_the_tool_call_argument_and_anything_else_fails_as_data() -> None:
    request = fix_request(0, "3-1", 1, ["a - b"])
    enum = request["tools"][0]["function"]["parameters"]["properties"]["expression"]["enum"]
    assert enum == [c for c in CANDIDATES if c != "a - b"]
    fix = fix_of(scripted_model("k", request, EpisodeInfo("", 3, 1, 0, 0, "")))
    assert fix in enum
    with pytest.raises(ValueError, match="no edit_calc call"):
        fix_of({"choices": [{"message": {"content": "a + b"}}]})
    with pytest.raises(ValueError, match="not one of"):
        fix_of(
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [{"function": {"arguments": '{"expression": "0"}'}}]
                        }
                    }
                ]
            }
        )


def test_the_demo_asks_the_offline_test_server_which_answers_as_the_reference_assumes() -> None:
    from gymckpt.gym_adapter.environments.openai_model import openai_model
    from gymckpt.testing.openai_server import chat_completion, open_openai_test_server

    assert FAMILIES["sandbox:"].model_server
    info = EpisodeInfo("", 2, 0, 0, 0, "")
    requests = [fix_request(0, "2-0", t, CANDIDATES[:t]) for t in range(3)]

    async def ask() -> list[Any]:
        async with open_openai_test_server() as server:
            model = openai_model(base_url=server.base_url, model=server.model)
            return [await model(f"k{i}", r, info) for i, r in enumerate(requests)]

    served = trio.run(ask)
    for request, response in zip(requests, served, strict=True):
        assert fix_of(response) == fix_of(chat_completion(request, response["model"]))
