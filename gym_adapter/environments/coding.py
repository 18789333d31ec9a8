"""A multi-turn coding task in a sandbox: make a small Python project's failing test pass.

    from gymckpt.gym_adapter.environments.coding import coding_environment
    env = coding_environment("coding", work_dir=Path("gym-live"))
    async with EmbeddedGym.host(env, instances=2, work_dir=Path("gym-live")) as gym: ...

Every session's tree starts as the project ``TEMPLATE`` (``calc.py``, whose ``add`` returns
``a - b``, and ``test_calc.py``, which fails on it), written under ``work_dir`` when the
environment is made. Each turn the agent:

1. asks the model for a fix through the model proxy (the call is captured, so a restored turn
   is answered as the first asking was): a chat-completions request (``fix_request``: the
   task, the fixes tried so far, a ``seed`` drawn from the deployment seed, the slot and the
   turn) offering one tool, ``edit_calc``, whose ``expression`` is an enum of the untried
   ``CANDIDATES``; the fix is the tool call's argument (``fix_of``). The first turns are often
   wrong, and an episode may run out of turns;
2. writes ``calc.py`` with it, and runs ``python -B test_calc.py`` in the tree (a subprocess
   with a deadline; ``-B`` keeps the tree free of bytecode, whose header holds an mtime);
3. appends one line to ``work.log`` in the tree (the turn, the fix, pass or fail).

The reward is 1 when the tests pass (the episode ends), else 0 until ``max_turns``. The
episode's payload is ``CodingResult``: the fixes tried, the rewards, the final tree's manifest
entries (path → sha256, size, mode) and ``work.log``'s text. A restore that re-runs a turn
against the tree of its step boundary leaves that payload as an uninterrupted run's
(``reference_result``), bit for bit: each ``work.log`` line once.

The model is any ``Environment.model`` answering chat completions with tool calls:
``openai_model`` against a server (``gymckpt demo --env sandbox:coding`` runs the project's
offline test server, ``gymckpt.testing.openai_server``, whose answer is a function of the
request), or by default ``scripted_model``, in process, which picks the enum value from the
request's seed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from gymckpt.gym_adapter import (
    Done,
    Environment,
    EnvironmentSpecError,
    EpisodeContext,
    EpisodeInfo,
)

from ._seeding import derive_seed
from .sandbox import Sandbox, SandboxSession

__all__ = [
    "CANDIDATES",
    "CORRECT",
    "TASKS",
    "TEMPLATE",
    "CodingAgent",
    "CodingResult",
    "coding_environment",
    "fix_of",
    "fix_request",
    "reference_result",
    "scripted_model",
    "write_template",
]

TASKS: Final = ("coding",)
"""The task ids ``coding_environment`` runs."""

CALC: Final = '"""A calculator."""\n\n\ndef add(a, b):\n    return {expr}\n'
TEMPLATE: Final[dict[str, str]] = {
    "calc.py": CALC.format(expr="a - b"),
    "test_calc.py": (
        "from calc import add\n\n\n"
        "def test_add():\n"
        "    assert add(2, 3) == 5\n"
        "    assert add(-1, 1) == 0\n\n\n"
        'if __name__ == "__main__":\n'
        "    test_add()\n"
        '    print("1 passed")\n'
    ),
    "work.log": "",
}
"""The project every session's tree starts as: path → text."""
CANDIDATES: Final = ("a - b", "b - a", "a * b", "a + b")
"""The fixes the scripted model chooses among (one each turn, never one tried before)."""
CORRECT: Final = "a + b"
"""The candidate that makes the test pass."""
TEST_COMMAND: Final = (sys.executable, "-B", "test_calc.py")
TEST_TIMEOUT_S: Final = 60.0
SANDBOX: Final = "sandbox"


def write_template(directory: Path) -> Path:
    """Write ``TEMPLATE`` into ``directory`` (made if missing; files there rewritten with the
    same bytes) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, text in TEMPLATE.items():
        path = directory / rel
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return directory


def fix_request(seed: int, session_key: str, turn: int, tried: list[str]) -> dict[str, Any]:
    """The chat-completions request of ``turn`` of slot ``session_key`` after ``tried``."""
    untried = [c for c in CANDIDATES if c not in tried] or [CORRECT]
    source = CALC.format(expr=tried[-1] if tried else "a - b")
    return {
        "messages": [
            {"role": "system", "content": "Fix calc.py so that test_calc.py passes."},
            {"role": "user", "content": f"calc.py:\n{source}\ntried: {', '.join(tried)}"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "edit_calc",
                    "description": "Replace the expression add returns.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string", "enum": untried}},
                        "required": ["expression"],
                    },
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "edit_calc"}},
        "seed": derive_seed("gymckpt-coding", seed, session_key, turn) % 2**31,
    }


def fix_of(response: Any) -> str:
    """The expression of the response's ``edit_calc`` call; ValueError (the episode fails as
    data) when there is none or it is not one of ``CANDIDATES``."""
    try:
        call = response["choices"][0]["message"]["tool_calls"][0]["function"]
        fix = json.loads(call["arguments"])["expression"]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"the model's response has no edit_calc call: {exc!r}") from None
    if fix not in CANDIDATES:
        raise ValueError(f"the model's fix {fix!r} is not one of {CANDIDATES}")
    return str(fix)


def scripted_model(key: str, request: Any, info: EpisodeInfo) -> dict[str, Any]:
    """An ``Environment.model`` without a server: the ``edit_calc`` call whose expression is
    the enum value the request's ``seed`` picks (a function of the request alone)."""
    enum = request["tools"][0]["function"]["parameters"]["properties"]["expression"]["enum"]
    fix = enum[request["seed"] % len(enum)]
    function = {"name": "edit_calc", "arguments": json.dumps({"expression": fix})}
    call = {"id": "call_0", "type": "function", "function": function}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


@attrs.define(slots=True)
class CodingResult:
    """An episode's payload: the fixes ``tried`` (one a turn), their ``rewards``, the final
    tree's manifest entries and ``work.log``'s text."""

    tried: list[str] = attrs.field(factory=list)
    rewards: list[float] = attrs.field(factory=list)
    tree: dict[str, Any] = attrs.field(factory=dict)
    work_log: str = ""


async def coding_turn(box: SandboxSession, turn: int, fix: str) -> float:
    """One turn's work in ``box``: write the fix, run the tests, log the line; the reward."""
    box.write("calc.py", CALC.format(expr=fix))
    result = await box.run(list(TEST_COMMAND), timeout_s=TEST_TIMEOUT_S)
    passed = result.returncode == 0
    box.append("work.log", f"turn {turn}: return {fix} -> {'pass' if passed else 'fail'}\n")
    return 1.0 if passed else 0.0


def _finish(box: SandboxSession, state: CodingResult) -> CodingResult:
    state.tree = box.tree()
    state.work_log = box.read("work.log").decode()
    return state


@attrs.frozen
class CodingAgent:
    """The agent (see the module docstring); ``max_turns`` ends an unsolved episode."""

    max_turns: int = 3
    name: str = "agent"
    kind: str = "simple_agent"

    def open(self, info: EpisodeInfo) -> CodingResult:
        return CodingResult()

    def export(self, state: CodingResult) -> Any:
        return {"tried": list(state.tried), "rewards": list(state.rewards)}

    def restore(self, data: Any) -> CodingResult:
        return CodingResult(tried=list(data["tried"]), rewards=list(data["rewards"]))

    async def step(self, ctx: EpisodeContext, state: CodingResult) -> Done | None:
        turn, info = len(state.tried), ctx.info
        fix = fix_of(await ctx.model(fix_request(info.seed, info.session_key, turn, state.tried)))
        reward = await coding_turn(ctx.session(SANDBOX), turn, fix)
        state.tried.append(fix)
        state.rewards.append(reward)
        if reward == 1.0 or len(state.tried) >= self.max_turns:
            return Done(reward, payload=_finish(ctx.session(SANDBOX), state))
        return None


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise EnvironmentSpecError(
            f"no such sandbox task {task!r}: the sandbox family runs {', '.join(TASKS)}"
        )


def coding_environment(
    task: str,
    work_dir: Path,
    *,
    max_turns: int = 3,
    model: Callable[[str, Any, EpisodeInfo], Any] = scripted_model,
) -> Environment:
    """The coding task's ``Environment``: ``CodingAgent`` and a ``Sandbox`` whose blobs and
    trees live under ``work_dir`` (its template written at ``work_dir/coding-template``);
    ``model`` answers ``fix_request``'s requests (``openai_model``, or ``scripted_model``).
    An unknown ``task`` is an ``EnvironmentSpecError`` naming ``TASKS``."""
    _check_task(task)
    template = write_template(Path(work_dir) / "coding-template")
    return Environment(
        agent=CodingAgent(max_turns),
        participants=(Sandbox(template, work_dir, name=SANDBOX),),
        model=model,
    )


def reference_result(
    task: str,
    seed: int,
    row: int,
    slot: int,
    answer: Callable[[dict[str, Any]], Any] | None = None,
    max_turns: int = 3,
) -> CodingResult:
    """The uninterrupted run of episode (row, slot) under deployment ``seed``, in a temporary
    sandbox without a host: the payload a hosted episode must equal, crash and restore or not.
    ``answer(request)``: the model's response (None: ``scripted_model``'s); it must be what the
    hosted episode's model answers to the same request."""
    _check_task(task)
    info = EpisodeInfo("", row, slot, 0, seed, "")
    with tempfile.TemporaryDirectory(prefix="gymckpt-coding-") as tmp:
        sandbox = Sandbox(write_template(Path(tmp) / "template"), Path(tmp) / "work")
        box = sandbox.open(info)
        state = CodingResult()

        async def play() -> None:
            while len(state.tried) < max_turns and 1.0 not in state.rewards:
                turn = len(state.tried)
                request = fix_request(seed, info.session_key, turn, state.tried)
                response = answer(request) if answer else scripted_model("", request, info)
                fix = fix_of(response)
                state.rewards.append(await coding_turn(box, turn, fix))
                state.tried.append(fix)

        trio.run(play)
        return _finish(box, state)
