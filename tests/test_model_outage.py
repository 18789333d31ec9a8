"""A model server that goes down is waited out, not charged to rows (issue 31, finding 7), with
the real test server process (``gymckpt.testing.openai_server``) on loopback and the LLM
example's tool agent: a 503 outage and a restart (nothing listening) far longer than the old
row-attempts budget, and an outage past ``outage_budget_s`` that ends the run with exit 8 and
one line naming the model server.

The clock is real (the server is another process), so the client retries fast
(``backoff_s=0.01``): one row attempt then fails within about 0.1 s, and three attempts — the
old budget, after which rows were given up — within half a second, while the outages here
last seconds. The same rules in virtual time, at the scale of a 60 s outage: the dispatcher's
tests (``test_an_outage_longer_than_the_attempts_budget_is_waited_out``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio.to_thread
import pytest
import trio

from gymckpt.gym_adapter import EmbeddedGym, Environment
from gymckpt.gym_adapter.environments.openai_model import openai_model
from gymckpt.nurseries import ExitCode, open_rollouts
from gymckpt.runtime import RuntimeConfig
from gymckpt.testing.llm_agent import Calculator, ToolAgent, dataset
from gymckpt.testing.openai_server import OpenAITestServer, open_openai_test_server

pytestmark = pytest.mark.subprocess

ROWS = 16


@pytest.fixture
def server() -> Iterator[OpenAITestServer]:
    with open_openai_test_server() as s:
        yield s


def environment(server: OpenAITestServer) -> Environment:
    model = openai_model(
        base_url=server.base_url,
        model=server.model,
        timeout_s=10.0,
        max_retries=2,
        backoff_s=0.01,
        max_backoff_s=0.05,
    )
    return Environment(agent=ToolAgent(), participants=(Calculator(),), model=model)


@pytest.mark.parametrize("outage", ["503", "restart"])
async def test_a_model_server_outage_is_waited_out_and_every_row_trains_once(
    tmp_path: Path, server: OpenAITestServer, outage: str
) -> None:
    """After the first step the server answers 503 for 3 s (``outage``), or stops and comes
    back on its port 3 s later (``restart``: connections refused meanwhile). The episodes in
    flight fail as infra again and again, and every row still trains exactly once: no row
    given up, no row attempt spent."""
    config = RuntimeConfig(checkpoint_mode="unaligned")
    trained: list[int] = []
    async with EmbeddedGym.host(environment(server), instances=2, work_dir=tmp_path / "gym") as gym:
        async with open_rollouts(
            gym,
            tmp_path / "work",
            dataset=dataset(ROWS),
            group_size=2,
            config=config,
            max_rows_in_flight=8,
            handle_signals=False,
        ) as ro:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(120):
                    async for batch in ro.batches(groups_per_step=2):
                        if not trained:
                            if outage == "503":
                                await anyio.to_thread.run_sync(server.outage, 3.0)
                            else:
                                nursery.start_soon(anyio.to_thread.run_sync, server.restart, 3.0)
                        trained.extend(g.row for g in batch)
                        ro.set_policy_version(ro.step + 1)
                        assert (await ro.checkpoint()).ok
            stats = ro.ledger.statistics()
            infra = ro.metrics.get("rollout/episode_failures_infra_total")
            outage_clock = ro.dispatcher.outage.statistics()
    assert sorted(trained) == list(range(ROWS))  # every row once
    assert stats.rows_failed == 0 and stats.row_attempts_spent == 0 and stats.data_failures == 0
    # the outage hit episodes in flight, many times over the old budget of 3 attempts
    assert infra >= 3, infra
    assert outage_clock.outages >= 1 and outage_clock.down_s is None  # it ended
    if outage == "503":
        assert server.stats()["statuses"].get("503", 0) >= 3


TRAINER = textwrap.dedent("""
    import sys
    import gymckpt
    from gymckpt.gym_adapter import Environment
    from gymckpt.gym_adapter.environments.openai_model import openai_model
    from gymckpt.testing.llm_agent import Calculator, ToolAgent, dataset

    async def main() -> None:
        model = openai_model(base_url=sys.argv[1], model="gymckpt-test", max_retries=1,
                             backoff_s=0.01, max_backoff_s=0.05)
        env = Environment(agent=ToolAgent(), participants=[Calculator()], model=model)
        config = gymckpt.RuntimeConfig(outage_budget_s=2.0)
        async with gymckpt.EmbeddedGym.host(env, instances=2, work_dir="gym-live") as gym:
            async with gymckpt.open_rollouts(gym, "work", dataset=dataset(8), group_size=2,
                                             config=config) as rollouts:
                async for batch in rollouts.batches(groups_per_step=2):
                    print("step", flush=True)
        print("finished", flush=True)

    gymckpt.run(main)
""")


def test_an_outage_past_the_budget_ends_the_run_with_exit_8_naming_the_server(
    tmp_path: Path, server: OpenAITestServer
) -> None:
    server.outage(600.0)  # down for the whole run
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    done = subprocess.run(
        [sys.executable, str(script), server.base_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == ExitCode.INFRA_OUTAGE == 8, done.stderr[-3000:]
    assert "finished" not in done.stdout and "step" not in done.stdout
    assert "Exception Group" not in done.stderr  # (each failure's WARNING has its traceback)
    last = done.stderr.strip().splitlines()[-1]
    # one line: what is down, for how long, the budget, and the model server's URL
    assert last.startswith("gymckpt: run stopped: infrastructure (every episode failed as "), last
    assert "past outage_budget_s=2" in last and "model unavailable" in last, last
    assert f"{server.base_url}/chat/completions" in last and "HTTP 503" in last, last
    assert "rows failed" not in done.stderr  # no row was given up
