"""HttpGym against real ``gymckpt serve`` processes on loopback: the backend conformance kit,
the reply stream, self-healing (a SIGKILLed server replaced, an external server restarted, a
server that stops answering) and no orphan server after the trainer dies.

Real time throughout (the servers are other processes); every wait is on a condition (a
readiness line, a process exit through its pidfd, an answer) under ``trio.fail_after``.
``open_for_conformance`` is the HTTP factory of the Gym conformance suite
(``tests/test_gym_conformance.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from gymckpt.gym_adapter import (
    Completed,
    GymControlError,
    GymInstanceDead,
    HttpGym,
    ReplyStream,
    RunReply,
    RunRow,
)
from gymckpt.gym_adapter.environments.calendar import (
    CONFIG_ENV,
    CalendarConfig,
    calendar_from_environ_path,
    calendar_sessions_of,
)
from gymckpt.gym_adapter.transports.http._process import ServerExited, ServerProcess
from gymckpt.runtime import (
    GymCallTimeout,
    GymCheckpointUnavailable,
    GymConnectionLost,
    TrainerTerm,
    rollout_id_for,
)
from gymckpt.testing import check_backend

pytestmark = pytest.mark.http

HTTP_TIME_SCALE = 5.0
"""The conformance suite's episodes run this many times slower over HTTP: its scenarios were
timed for a virtual clock (turns of 10-50 ms, events a few ms apart), and real replies cross a
socket and a JSON codec each way on a shared 2-core machine. Stretching the turns keeps every
assertion and widens the margins (as on Ray)."""


def calendar_on_http(
    instances: int = 1,
    agent_kinds: str | Sequence[str] = "simple_agent",
    config: CalendarConfig | None = None,
    work_dir: str | Path = ".",
    **kwargs: Any,
) -> AbstractAsyncContextManager[HttpGym]:
    """The calendar workplace on ``HttpGym.spawn`` (one agent kind per instance, the config in
    the servers' environment); ``kwargs`` are ``HttpGym.spawn``'s."""
    from test_gym_conformance import agent_kinds_of

    cfg = config if config is not None else CalendarConfig()
    paths = [calendar_from_environ_path(k) for k in agent_kinds_of(instances, agent_kinds)]
    return HttpGym.spawn(
        paths,
        instances,
        work_dir=work_dir,
        config=cfg.host_config(),
        environ=cfg.environ(),
        **kwargs,
    )


def open_for_conformance(**kwargs: Any) -> AbstractAsyncContextManager[Any]:
    """``calendar_on_http`` with the simulated turns ``HTTP_TIME_SCALE`` times slower."""
    config: CalendarConfig = kwargs.pop("config", None) or CalendarConfig()
    lo, hi = config.turn_s
    kwargs["config"] = attrs.evolve(config, turn_s=(lo * HTTP_TIME_SCALE, hi * HTTP_TIME_SCALE))
    return calendar_on_http(**kwargs)


CONFIG = CalendarConfig(turns=(2, 3), turn_s=(0.02, 0.05), mutation_p=1.0)
ENVIRONMENT = "gymckpt.gym_adapter.environments.calendar:calendar_from_environ_simple_agent"


def rows(n: int, start: int = 0) -> list[RunRow]:
    return [RunRow(rollout_id_for(r, 0, 0), r, 0, 0) for r in range(start, start + n)]


def deadline(seconds: float = 5.0) -> float:
    return trio.current_time() + seconds


async def drain(stream: ReplyStream) -> list[RunReply]:
    return [r async for batch in stream for r in batch]


@asynccontextmanager
async def http_gym(tmp_path: Path, **kwargs: Any) -> AsyncIterator[HttpGym]:
    kwargs.setdefault("config", CONFIG)
    kwargs.setdefault("state_root", tmp_path)
    async with calendar_on_http(work_dir=tmp_path / "gym", seed=5, **kwargs) as gym:
        yield gym


async def pid_exits(pid: int, within_s: float) -> None:
    """Wait (through a pidfd) until process ``pid``, not our child, has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.fail_after(within_s):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


# -- the conformance kit ---------------------------------------------------------------------


async def test_check_backend_passes_on_spawned_servers(tmp_path: Path) -> None:
    async with http_gym(tmp_path, instances=2) as gym:
        report = await check_backend(gym, tmp_path / "kit", rows=6)  # raises on any failure
    assert {"topology", "replies", "commit[aligned]", "commit[unaligned]", "cut[unaligned]"} <= set(
        report.checks
    )
    assert report.episodes > 0


async def test_an_ack_refused_because_another_run_took_over_is_dropped(tmp_path: Path) -> None:
    """A stream's acknowledgements go out in the background, with whatever term the facade
    carries when they leave. One that leaves after this facade moved on to another run (found
    by ``check_backend``: a run released, the next one attaching) is refused, acting on
    nothing (``GymInUse``): it is dropped, as a lost ack is, and the facade goes on (it
    raised in the facade's nursery, ending every call of the facade)."""
    first = TrainerTerm("0123456789abcdef0123456789abcdef", 1)
    second = TrainerTerm("fedcba9876543210fedcba9876543210", 1)
    async with http_gym(tmp_path, instances=2) as gym:
        for name in gym.instances:
            await gym.attach(name, first, deadline())
        stream: Any = await gym.run("gym-0", rows(2))
        got = [r async for batch in stream for r in batch]
        assert len(got) == 2
        for name in gym.instances:
            await gym.release(name, first, deadline())
        await gym.attach("gym-1", second, deadline())  # the facade carries the second run
        # what ``send_ack`` starts in the background for the first run's stream, awaited here
        await gym._ack("gym-0", stream._incarnation, stream.sid, 2)
        assert (await gym.attach("gym-0", second, deadline())).took_over


# -- the data plane --------------------------------------------------------------------------


async def test_a_run_that_finds_every_stream_connection_held_fails_naming_the_limit(
    tmp_path: Path,
) -> None:
    """Each open ``/run`` stream holds a connection until its episodes end (without reply
    channels, ``multiplex=False``, or an older server): with all ``max_streams`` held, the next
    run waits ``pool_timeout_s`` for one and then fails as a timeout saying which limit to raise
    (it once waited without end)."""
    long = CalendarConfig(turns=(40, 40), turn_s=(0.5, 0.5))  # 20 s per episode
    async with http_gym(
        tmp_path, config=long, max_streams=1, pool_timeout_s=0.5, multiplex=False
    ) as gym:
        held = await gym.run("gym-0", rows(1))
        with trio.fail_after(20), pytest.raises(GymCallTimeout, match=r"max_streams=1 is held"):
            await gym.run("gym-0", rows(1, start=1))
        await held.aclose()
        again = await gym.run("gym-0", rows(1, start=2))  # the connection is free again
        await again.aclose()


async def test_run_streams_every_reply_and_acks_ride_the_next_call(tmp_path: Path) -> None:
    async with http_gym(tmp_path) as gym:
        stream = await gym.run("gym-0", rows(6))
        replies = await drain(stream)
        assert sorted(r.rollout_id for r in replies) == sorted(r.rollout_id for r in rows(6))
        assert all(isinstance(r, Completed) for r in replies)
        inv = await gym.inventory("gym-0")  # carries the last acknowledgement
        assert inv.on_wire == () and inv.running == ()
        assert gym.acks.pending("gym-0") == 0  # settled: the call carried it
        await stream.aclose()
        await stream.aclose()


async def test_replies_come_in_batches_or_one_per_line_when_asked(tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, turns=(1, 1), turn_s=(0.05, 0.05), mutation_p=0.0)
    async with http_gym(tmp_path / "a", config=config) as gym:
        stream = await gym.run("gym-0", rows(12))
        batches = [tuple(b) async for b in stream]  # all finish together: a few lines
    assert sum(map(len, batches)) == 12 and len(batches) < 12
    async with http_gym(tmp_path / "b", config=config, batch_replies=False) as gym:
        stream = await gym.run("gym-0", rows(12))
        batches = [tuple(b) async for b in stream]
    assert [len(b) for b in batches] == [1] * 12


async def test_aclose_tells_the_server_how_far_the_consumer_got(tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, turn_s=(0.3, 0.6))
    async with http_gym(tmp_path, config=config) as gym:
        stream = await gym.run("gym-0", rows(4))
        first = await stream.__anext__()
        await stream.aclose()  # close_stream(sid, seq of ``first``): the rest is discarded
        inv = await gym.inventory("gym-0")
        assert not {r.rollout_id for r in first} & set(inv.on_wire)
        with trio.fail_after(20):
            while True:  # the other rows run on, their replies discarded
                inv = await gym.inventory("gym-0")
                if not inv.running:
                    break
                await trio.sleep(0.05)
        assert inv.on_wire == ()


async def test_a_fault_drawn_by_the_client_is_executed_by_the_server(tmp_path: Path) -> None:
    async with http_gym(tmp_path, faults=["prepare:error@1", "run:refuse@1"]) as gym:
        with pytest.raises(GymControlError, match="injected fault prepare:error@1"):
            await gym.prepare("gym-0", "c1", deadline())
        stream = await gym.run("gym-0", rows(2))
        refused = await drain(stream)
        assert {type(r).__name__ for r in refused} == {"Refused"}
        assert gym.faults.fired == (("prepare:error@1", 1), ("run:refuse@1", 1))


# -- self-healing ----------------------------------------------------------------------------


async def test_a_sigkilled_server_is_replaced_and_continues_its_sessions(
    tmp_path: Path,
) -> None:
    async with http_gym(tmp_path, instances=2) as gym:
        await drain(await gym.run("gym-0", rows(4)))
        before = await calendar_sessions_of(gym, "gym-0")
        assert before and all(s.sentinels for s in before.values())
        old_pid, old_incarnation = gym.pid("gym-0"), gym.incarnation("gym-0")
        assert old_pid is not None
        in_flight = await gym.run("gym-0", rows(2, start=10))

        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(GymInstanceDead):  # the stream: its server died
            await drain(in_flight)
        with pytest.raises(GymInstanceDead):  # and every call, without reaching anything
            await gym.inventory("gym-0")

        await gym.replace("gym-0", deadline(30))

        assert gym.pid("gym-0") not in (None, old_pid)
        assert gym.incarnation("gym-0") != old_incarnation
        (done,) = gym.replacements
        assert done.instance == "gym-0" and 0 < done.total_s < 30
        after = await calendar_sessions_of(gym, "gym-0")  # replayed from its journal
        assert {"10-0", "11-0"} <= set(after)  # the killed episodes' sessions, opened
        assert {k: after[k].sentinels for k in before} == {  # and every event, once
            k: s.sentinels for k, s in before.items()
        }
        inv = await gym.inventory("gym-0")
        assert inv.admission_open and not (inv.running or inv.parked or inv.on_wire)
        replies = await drain(await gym.run("gym-0", rows(2, start=20)))
        assert sorted(r.rollout_id for r in replies) == ["20-0", "21-0"]
        with pytest.raises(StopAsyncIteration):  # the old stream has ended for good
            await in_flight.__anext__()
        await in_flight.aclose()  # and sends nothing to the new server
        stats = await gym.statistics()
        assert not any(s.dead for s in stats.instances)


async def test_an_external_server_restarted_is_a_new_incarnation_never_the_same(
    tmp_path: Path,
) -> None:
    work = tmp_path / "served"
    work.mkdir()
    token_file = work / "token"
    token_file.write_text("t0k3n-for-the-test")
    token_file.chmod(0o600)
    env = {CONFIG_ENV: '{"turns": [2, 2], "turn_s": [0.02, 0.02], "mutation_p": 1.0}'}

    async def serve(port: int, *extra: str) -> tuple[ServerProcess, str]:
        cmd = [sys.executable, "-m", "gymckpt", "serve", ENVIRONMENT, "--port", str(port)]
        cmd += ["--work-dir", str(work), "--token-file", str(token_file), *extra]
        proc, ready = await ServerProcess.start(cmd, work / "serve.log", deadline(60), env)
        return proc, ready.url

    proc, url = await serve(0)
    port = int(url.rsplit(":", 1)[1])
    try:
        async with HttpGym([url], token="t0k3n-for-the-test") as gym:
            assert gym.instances == ("gym-0",) and not gym.spawned
            await drain(await gym.run("gym-0", rows(3)))
            before = await calendar_sessions_of(gym, "gym-0")
            first = gym.incarnation("gym-0")
            stream = await gym.run("gym-0", rows(2, start=10))

            await proc.kill()  # someone else's server dies ... and is restarted on its port
            await proc.aclose()
            proc, _ = await serve(port, "--recover")

            with pytest.raises(GymInstanceDead):  # an answer from another incarnation
                await gym.inventory("gym-0")
            with pytest.raises(GymInstanceDead):  # the stream went to the old incarnation
                await drain(stream)
            await stream.aclose()
            with pytest.raises(GymInstanceDead):  # dead until replaced: nothing is sent
                await gym.prepare("gym-0", "c1", deadline())

            await gym.replace("gym-0", deadline(30))  # adopts the new incarnation

            assert gym.incarnation("gym-0") != first
            (done,) = gym.replacements
            assert (done.old_incarnation, done.new_incarnation) == (first, gym.incarnation("gym-0"))
            after = await calendar_sessions_of(gym, "gym-0")  # it recovered its journal
            assert {k: after[k].sentinels for k in before} == {
                k: s.sentinels for k, s in before.items()
            }
            assert len(await drain(await gym.run("gym-0", rows(1, start=20)))) == 1
    finally:
        with trio.CancelScope(shield=True):
            await proc.stop()
            await proc.aclose()


async def test_replace_of_an_external_server_that_did_not_restart_times_out(
    tmp_path: Path,
) -> None:
    async with http_gym(tmp_path) as spawned:
        token = (tmp_path / "gym" / "http-token").read_text()
        async with HttpGym([spawned.url("gym-0")], token=token) as gym:
            with pytest.raises(GymCallTimeout, match="did not come back as a new incarnation"):
                await gym.replace("gym-0", deadline(0.5))
            with pytest.raises(GymInstanceDead):  # still dead: replace may be called again
                await gym.inventory("gym-0")


async def test_a_server_that_stops_answering_is_gym_unavailable_within_the_deadline(
    tmp_path: Path,
) -> None:
    async with http_gym(tmp_path, view_timeout_s=1.0) as gym:
        pid = gym.pid("gym-0")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # alive, connected, answering nothing
        try:
            t0 = trio.current_time()
            with pytest.raises(GymCallTimeout, match="gym-0"):
                await gym.prepare("gym-0", "c1", deadline(1.0))
            assert trio.current_time() - t0 < 1.0 + 1.0 + 0.5  # deadline + grace + slack
            with pytest.raises(GymCallTimeout, match="gym-0"):
                await gym.inventory("gym-0")  # a view: bounded by view_timeout_s
        finally:
            os.kill(pid, signal.SIGCONT)
        inv = await gym.inventory("gym-0")  # answering again: never marked dead
        assert inv.instance == "gym-0"


async def test_a_server_that_cannot_start_fails_the_spawn_saying_why(tmp_path: Path) -> None:
    with pytest.raises(ServerExited, match=r"exited with code 2.*no_such_module"):
        async with HttpGym.spawn("no_such_module:env", 2, work_dir=tmp_path):
            pass  # pragma: no cover
    with pytest.raises(TypeError, match="import path"):
        async with HttpGym.spawn([object()], 1, work_dir=tmp_path):  # type: ignore[list-item]
            pass  # pragma: no cover


async def test_leaving_stops_the_spawned_servers_cleanly(tmp_path: Path) -> None:
    async with http_gym(tmp_path, instances=2) as gym:
        pids = [gym.pid(n) for n in gym.instances]
    for pid in pids:
        assert pid is not None
        await pid_exits(pid, 1)  # already reaped: gone
    for name in ("gym-0", "gym-1"):
        log = (tmp_path / "gym" / f"{name}.serve.log").read_text()
        assert "signal 15, stopping" in log  # SIGTERM, a clean shutdown, no SIGKILL needed


async def test_a_wrong_token_or_no_server_fails_on_opening(tmp_path: Path) -> None:
    async with http_gym(tmp_path) as spawned:
        with pytest.raises(ValueError, match=r"refuses this client.*HTTP 401"):
            async with HttpGym([spawned.url("gym-0")], token="wrong"):
                pass
    with pytest.raises(GymConnectionLost, match="no gymckpt server answers"):
        async with HttpGym(["http://127.0.0.1:9"], token="x", connect_timeout_s=1.0):
            pass


# -- no orphans --------------------------------------------------------------------------------


@pytest.mark.subprocess
async def test_the_servers_die_with_a_sigkilled_trainer(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, trio
        from gymckpt.gym_adapter import HttpGym
        from gymckpt.gym_adapter.environments.calendar import calendar_from_environ_path

        async def main():
            async with HttpGym.spawn(
                calendar_from_environ_path(), 2, work_dir={str(tmp_path / "gym")!r}
            ) as gym:
                print(*(gym.pid(n) for n in gym.instances), flush=True)
                await trio.sleep_forever()

        trio.run(main)
        """
    )
    trainer = await trio.lowlevel.open_process(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert trainer.stdout is not None
        line = b""
        with trio.fail_after(60):
            while not line.endswith(b"\n"):
                chunk = await trainer.stdout.receive_some()
                assert chunk, "the trainer exited before it printed its servers' pids"
                line += chunk
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # serving
        trainer.kill()  # SIGKILL: no cleanup code of the trainer runs
        with trio.fail_after(10):
            await trainer.wait()
        for pid in pids:
            await pid_exits(pid, 10)  # the kernel killed them (PR_SET_PDEATHSIG)
    finally:
        if trainer.returncode is None:
            trainer.kill()
            with trio.CancelScope(shield=True):
                await trainer.wait()


async def test_an_error_that_cannot_cross_is_checkpoint_unavailable(tmp_path: Path) -> None:
    async with http_gym(tmp_path, faults=["prepare:unpicklable@1"]) as gym:
        with pytest.raises(GymCheckpointUnavailable, match="gym-0"):
            await gym.prepare("gym-0", "c1", deadline())


# -- the HTTP how-to's way: two servers someone started, a trainer killed and run again -------

HOWTO = Path(__file__).resolve().parent.parent / "docs" / "howto" / "http.md"


def _readme_http() -> tuple[list[list[str]], str]:
    """The HTTP how-to's two ``gymckpt serve`` command lines and its ``HttpGym`` trainer."""
    text = HOWTO.read_text()
    m = re.search(r"<!-- http-example -->\n```python\n(.*?)```\n<!-- /http-example -->", text, re.S)
    assert m, "docs/howto/http.md has no http-example block"
    shell = text[: m.start()].rsplit("```\ngymckpt serve", 1)[1].split("```", 1)[0]
    lines = ("gymckpt serve" + shell).replace("\\\n", " ").strip().splitlines()
    return [line.split() for line in lines], m.group(1)


@pytest.mark.subprocess
async def test_the_readme_trainer_on_two_served_instances_survives_a_sigkill(
    tmp_path: Path,
) -> None:
    commands, script = _readme_http()
    assert len(commands) == 2 and script.count("8101") == 1
    procs: list[ServerProcess] = []
    try:
        urls = []
        for n, cmd in enumerate(commands):  # one after the other: the second reads the token
            cmd[cmd.index("--port") + 1] = "0"  # a free port: this machine is shared
            argv = [sys.executable, "-m", "gymckpt", *cmd[1:]]
            proc, ready = await ServerProcess.start(
                argv, tmp_path / f"serve-{n}.log", deadline(60), cwd=tmp_path
            )
            procs.append(proc)
            urls.append(ready.url)
        assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
        program = tmp_path / "trainer.py"
        program.write_text(
            script.replace('["http://127.0.0.1:8101", "http://127.0.0.1:8102"]', repr(urls))
        )

        async def trainer() -> subprocess.CompletedProcess[bytes]:
            with trio.fail_after(120):
                return await trio.run_process(
                    [sys.executable, str(program)],
                    cwd=tmp_path,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )

        killed = await trio.lowlevel.open_process(
            [sys.executable, str(program)], cwd=tmp_path, stdout=subprocess.PIPE
        )
        assert killed.stdout is not None
        out = b""
        with trio.fail_after(120):
            while b"\n" not in out:  # its first checkpoint is published ...
                chunk = await killed.stdout.receive_some()
                assert chunk, "the trainer exited before its first checkpoint"
                out += chunk
        killed.kill()  # ... and it is SIGKILLed
        with trio.fail_after(10):
            await killed.wait()
        await killed.stdout.aclose()
        assert out.split()[:3] == [b"2", b"run-0001", b"True"]
        again = await trainer()  # restores it into the same servers and finishes
        assert again.returncode == 0, again.stderr.decode()[-3000:]
        steps = [int(line.split()[0]) for line in again.stdout.decode().splitlines()]
        assert steps and steps[0] > 2 and steps == sorted(steps)  # it went on from step 2
        done = await trainer()
        assert done.returncode == 0 and done.stdout == b""  # nothing left to do
    finally:
        with trio.CancelScope(shield=True):
            for proc in procs:
                await proc.stop()
                await proc.aclose()
