"""A trainer can always come back to Gym servers that outlived it (issue 31, finding 3).

Real ``gymckpt serve`` processes on loopback, started as the README's HTTP recipe starts them
(someone else's servers: they outlive the trainer), and real trainer processes killed with a
real SIGKILL. The environment's turns are long (seconds), so the dead trainer's episodes are
still running in the servers when it is run again at once:

- killed mid-run, rerun at once: it fences the dead term, restores and ends exactly once;
- killed between ``prepare`` and ``resume`` (both servers hold the checkpoint open, for a
  lease of 60 s): the rerun proceeds at once, without waiting for the lease;
- a second trainer (another work directory) against the same servers while the first runs: a
  clear refusal (exit 2, one line naming the run that holds them), and the first run ends
  exactly once; once it finished, the second run may have the servers;
- a fenced term's late requests (two ``HttpGym`` clients in this process): refused 409.

"Exactly once": the trainer's state (checkpointed with every step) lists the rows it trained;
the run that ends lists every row once. Every wait is on a condition (a line, an exit) under
``trio.fail_after``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from gymckpt.gym_adapter import HttpGym, RunRow
from gymckpt.gym_adapter.transports.http._process import ServerProcess
from gymckpt.runtime import GymInUse, TrainerTerm, rollout_id_for
from gymckpt.testing._http_serve_process import serve_process

pytestmark = [pytest.mark.http, pytest.mark.subprocess]

ROWS = 8

ENVIRONMENT = textwrap.dedent(
    """
    from gymckpt.testing.examples import task_reader

    def long_turns():
        return task_reader(turns=2, turn_s=2.5)
    """
)

TRAINER = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path

    import trio

    import gymckpt

    urls, token, workdir, mode = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]


    class KillBeforeResume:
        '''The backend; the first resume of the second checkpoint SIGKILLs the trainer, so
        every instance holds that checkpoint open (prepared, committed, never resumed).'''

        def __init__(self, gym):
            self._gym, self._resumes = gym, 0

        def __getattr__(self, name):
            return getattr(self._gym, name)

        async def resume(self, instance, checkpoint_id, deadline_ts):
            self._resumes += 1
            if self._resumes > len(self._gym.instances):
                print("killed before resume", checkpoint_id, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return await self._gym.resume(instance, checkpoint_id, deadline_ts)


    async def main():
        async with gymckpt.HttpGym(urls, token=Path(token).read_text().strip()) as http:
            gym = KillBeforeResume(http) if mode == "kill-before-resume" else http
            async with gymckpt.open_rollouts(
                gym, workdir, rows=%(rows)d, group_size=2, max_rows_in_flight=4
            ) as ro:
                state = json.loads(ro.trainer_state or b'{"trained": []}')
                checkpointed = False
                async for batch in ro.batches(groups_per_step=1):
                    state["trained"] += [g.row for g in batch]
                    outcome = await ro.checkpoint(json.dumps(state).encode())
                    if checkpointed or not (outcome.ok and outcome.episodes):
                        continue
                    checkpointed = True  # episodes are running in Gym now
                    print("checkpointed", outcome.checkpoint_id, flush=True)
                    if mode == "kill-after-checkpoint":
                        os.kill(os.getpid(), signal.SIGKILL)
                    if mode == "wait-after-checkpoint":  # until the test says go on
                        await trio.to_thread.run_sync(sys.stdin.readline)
                print("trained", json.dumps(sorted(state["trained"])), flush=True)


    gymckpt.run(main)
    """.replace("%(rows)d", str(ROWS))
)


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[list[str]]:
    """Two ``gymckpt serve`` processes as the README starts them (the second reads the token
    the first wrote), serving the long-turn environment; their URLs."""
    (tmp_path / "fence_env.py").write_text(ENVIRONMENT)
    procs: list[ServerProcess] = []
    try:
        urls = []
        for n in range(2):
            argv = [sys.executable, "-m", "gymckpt", "serve", "fence_env:long_turns"]
            argv += ["--instance", f"gym-{n}", "--port", "0", "--work-dir", "gym-live"]
            argv += ["--state-root", ".", "--token-file", "token"]
            proc, ready = await ServerProcess.start(
                argv,
                tmp_path / f"serve-{n}.log",
                trio.current_time() + 60,
                environ={"PYTHONPATH": os.pathsep.join([str(tmp_path), *_pythonpath()])},
                cwd=tmp_path,
            )
            procs.append(proc)
            urls.append(ready.url)
        yield urls
    finally:
        with trio.CancelScope(shield=True):
            for proc in procs:
                await proc.stop()
                await proc.aclose()


def _pythonpath() -> list[str]:
    """This process's ``PYTHONPATH`` (``tests/mutation.py`` imports its copy through it)."""
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _command(tmp_path: Path, urls: list[str], workdir: str, mode: str) -> list[str]:
    program = tmp_path / "trainer.py"
    program.write_text(TRAINER)
    return [sys.executable, str(program), ",".join(urls), "token", workdir, mode]


async def _run(tmp_path: Path, urls: list[str], workdir: str, mode: str = "plain") -> tuple:
    with trio.fail_after(180):
        done = await trio.run_process(
            _command(tmp_path, urls, workdir, mode),
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def _killed(tmp_path: Path, urls: list[str], workdir: str, mode: str) -> str:
    """Run the trainer until it SIGKILLs itself; its stdout."""
    code, out, err = await _run(tmp_path, urls, workdir, mode)
    assert code == -9, err[-3000:]  # a real SIGKILL
    return out


def _trained(out: str) -> list[int]:
    [line] = [line for line in out.splitlines() if line.startswith("trained ")]
    return json.loads(line.removeprefix("trained "))


async def test_a_trainer_killed_mid_run_comes_back_at_once_and_ends_exactly_once(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as urls:
        out = await _killed(tmp_path, urls, "work", "kill-after-checkpoint")
        assert out.startswith("checkpointed run-"), out
        # at once: the servers still run the dead trainer's episodes (turns of 2.5 s)
        code, out, err = await _run(tmp_path, urls, "work")
        assert code == 0, err[-3000:]
        assert "fenced it" in err, err[-3000:]  # it said what it did to the dead term's work
        assert _trained(out) == list(range(ROWS))  # every row trained once


async def test_a_trainer_killed_between_prepare_and_resume_is_not_held_by_the_lease(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as urls:
        out = await _killed(tmp_path, urls, "work", "kill-before-resume")
        assert "killed before resume run-0002" in out, out
        start = trio.current_time()
        code, out, err = await _run(tmp_path, urls, "work")
        assert code == 0, err[-3000:]
        assert "aborted its checkpoint run-0002" in err, err[-3000:]
        assert _trained(out) == list(range(ROWS))
        assert trio.current_time() - start < 60  # the lease of 60 s was not waited out


async def test_a_second_trainer_is_refused_and_the_first_ends_exactly_once(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as urls:
        first = await trio.lowlevel.open_process(
            _command(tmp_path, urls, "work", "wait-after-checkpoint"),
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert first.stdin is not None and first.stdout is not None
        try:
            out = b""
            with trio.fail_after(120):
                while b"\n" not in out:  # its first checkpoint, episodes running
                    chunk = await first.stdout.receive_some()
                    assert chunk, "the first trainer exited before its first checkpoint"
                    out += chunk
            assert out.startswith(b"checkpointed run-"), out
            code, _out, err = await _run(tmp_path, urls, "other-work")
            assert code == 2, err[-3000:]
            [line] = err.splitlines()  # one line, no traceback
            assert line.startswith("gymckpt: error: instance gym-"), line
            assert "serves another training run" in line and "work directory" in line, line
            assert str(tmp_path / "work") in line, line  # it names the run that holds it
            await first.stdin.send_all(b"go\n")
            rest = b""
            with trio.fail_after(120):
                while chunk := await first.stdout.receive_some():
                    rest += chunk
                assert await first.wait() == 0
            assert _trained((out + rest).decode()) == list(range(ROWS))
            # the first run finished and let go of the servers: the other run may have them now
            code, out2, err = await _run(tmp_path, urls, "other-work")
            assert code == 0, err[-3000:]
            assert _trained(out2) == list(range(ROWS))
        finally:
            with trio.CancelScope(shield=True):
                if first.returncode is None:
                    first.kill()
                    await first.wait()
                await first.stdin.aclose()
                await first.stdout.aclose()


async def test_a_fenced_terms_late_requests_are_refused_over_http(tmp_path: Path) -> None:
    """Two trainer terms of one run, each with its own ``HttpGym``: once the newer attached,
    every request of the older (the term rides the ``Gymckpt-Trainer`` header) is refused 409
    ``GymInUse`` before it acts, and its stream ends without a reply; another run's attach is
    refused naming the holder."""
    lineage = "0123456789abcdef0123456789abcdef"
    old, new = TrainerTerm(lineage, 1, "/runs/a"), TrainerTerm(lineage, 2, "/runs/a")
    async with serve_process(tmp_path, "gymckpt.testing.examples:slow_task_reader") as proc:
        async with HttpGym([proc.url], token=proc.token) as first:
            await first.attach("gym-0", old, trio.current_time() + 10)
            rows = [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(3)]
            stream = await first.run("gym-0", rows)
            async with HttpGym([proc.url], token=proc.token) as second:
                reply = await second.attach("gym-0", new, trio.current_time() + 10)
                assert reply.took_over and reply.previous == old and reply.episodes == 3
                with trio.fail_after(10):
                    assert [r async for batch in stream for r in batch] == []
                for call in (
                    lambda: first.prepare("gym-0", "run-0002", trio.current_time() + 10),
                    lambda: first.run("gym-0", rows[:1]),
                    lambda: first.retire("gym-0", [rows[0].rollout_id], trio.current_time() + 10),
                ):
                    with pytest.raises(GymInUse, match="was fenced"):
                        await call()
                assert (await second.inventory("gym-0")).admission_open
                with pytest.raises(GymInUse, match=r"serves another training run.*/runs/a"):
                    other = TrainerTerm("f" * 32, 1, "/runs/b")
                    await second.attach("gym-0", other, trio.current_time() + 10)
