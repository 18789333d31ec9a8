"""The spawned servers of one ``HttpGym.spawn`` deployment: how each ``gymckpt serve`` process is
started (``ServeSpec``) and who watches them (``Supervisor``).

Every instance runs ``[sys.executable, "-m", "gymckpt", "serve", PATH, ...]`` on a loopback port
the kernel picks (``--port 0``, the readiness line names it), all sharing one ``work_dir`` (each
journals under ``work_dir/<instance>/``, as embedded and on Ray) and one bearer token
(``work_dir/http-token``, written atomically through a randomly named temporary file created
``O_EXCL | O_NOFOLLOW`` with mode 0600: never through a link planted there), accepting paths
inside ``state_root``, with the host's ``HostConfig`` in ``work_dir/host-config.json`` (when it
is not the default) and ``--allow-faults`` when the deployment has a fault plan, each
``instance_niceness`` steps below the trainer (``transports/_niceness``). A replacement
runs the same command with ``--recover``. The supervisor holds each instance's process and the
incarnation it serves, and a watcher task per process (in the deployment's nursery) copies its
log and reports its exit (``on_exit``), so a server that dies is known dead before any call
finds out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, final

import attrs
import trio

from gymckpt.runtime.lowlevel import write_atomic

from ...host._host import HostConfig
from .._errors import as_if_no_nursery
from .._niceness import INSTANCE_NICENESS, check_instance_niceness
from .._wire import encode
from ._process import Ready, ServerProcess

__all__ = ["TOKEN_FILE", "ServeSpec", "Supervisor"]

TOKEN_FILE: Final = "http-token"
"""The bearer token a spawned deployment's servers share, in ``work_dir`` (mode 0600)."""


@attrs.frozen
class ServeSpec:
    """How to start an instance's ``gymckpt serve`` process."""

    environments: tuple[tuple[str, str], ...]
    """(instance, import path) for every instance."""
    seed: int
    work_dir: Path
    state_root: Path
    token_file: Path
    host_config_file: Path | None
    allow_faults: bool
    extra_args: tuple[str, ...]
    environ: tuple[tuple[str, str], ...]
    instance_niceness: int = INSTANCE_NICENESS
    """How many steps below the trainer each server runs (``transports/_niceness``)."""

    @classmethod
    def prepare(
        cls,
        environments: Mapping[str, str],
        seed: int,
        work_dir: str | Path,
        state_root: str | Path | None,
        token: str,
        config: HostConfig | None,
        *,
        allow_faults: bool,
        extra_args: tuple[str, ...],
        environ: Mapping[str, str],
        instance_niceness: int = INSTANCE_NICENESS,
    ) -> ServeSpec:
        """The spec, with ``work_dir`` made and the token (and host config) written there."""
        check_instance_niceness(instance_niceness)
        wd = Path(work_dir).resolve()
        wd.mkdir(parents=True, exist_ok=True)
        root = Path(state_root).resolve() if state_root is not None else wd
        token_file = wd / TOKEN_FILE
        write_atomic(token_file, token.encode(), mode=0o600)
        config_file: Path | None = None
        if config is not None and config != HostConfig():
            config_file = wd / "host-config.json"
            write_atomic(config_file, encode(config), mode=0o600)
        return cls(
            tuple(environments.items()),
            seed,
            wd,
            root,
            token_file,
            config_file,
            allow_faults,
            extra_args,
            tuple(sorted(environ.items())),
            instance_niceness,
        )

    def command(self, name: str, recover: bool) -> list[str]:
        cmd = [sys.executable, "-m", "gymckpt", "serve", dict(self.environments)[name]]
        cmd += ["--instance", name, "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--work-dir", str(self.work_dir), "--state-root", str(self.state_root)]
        cmd += ["--token-file", str(self.token_file), "--seed", str(self.seed)]
        if self.host_config_file is not None:
            cmd += ["--host-config", str(self.host_config_file)]
        if recover:
            cmd.append("--recover")
        if self.allow_faults:
            cmd.append("--allow-faults")
        return [*cmd, *self.extra_args]


@final
class Supervisor:
    """The spawned servers of one deployment: each process, the incarnation it serves, and a
    watcher task (in the deployment's nursery) that copies its log and reports its exit."""

    def __init__(self, nursery: trio.Nursery, spec: ServeSpec) -> None:
        self._nursery = nursery
        self.spec = spec
        self._procs: dict[str, tuple[int, ServerProcess]] = {}
        self._all: list[ServerProcess] = []
        self.on_exit: Callable[[str, int], None] = lambda _name, _incarnation: None

    def process(self, name: str) -> ServerProcess | None:
        entry = self._procs.get(name)
        return entry[1] if entry is not None else None

    async def start(self, name: str, incarnation: int, deadline_ts: float, recover: bool) -> Ready:
        log = self.spec.work_dir / f"{name}.serve.log"
        proc, ready = await ServerProcess.start(
            self.spec.command(name, recover),
            log,
            deadline_ts,
            dict(self.spec.environ),
            instance_niceness=self.spec.instance_niceness,
        )
        self._all.append(proc)
        if ready.name != name:
            with trio.CancelScope(shield=True):
                await proc.kill()
            raise RuntimeError(f"gymckpt serve started as instance {ready.name!r}, not {name!r}")
        self._procs[name] = (incarnation, proc)
        self._nursery.start_soon(self._watch, name, incarnation, proc)
        return ready

    async def start_all(self, names: Sequence[str], deadline_ts: float) -> dict[str, Ready]:
        """Start the first incarnation of every instance in ``names`` at once."""
        readies: dict[str, Ready] = {}

        async def start(name: str) -> None:
            readies[name] = await self.start(name, 0, deadline_ts, recover=False)

        with as_if_no_nursery():
            async with trio.open_nursery() as starting:
                for name in names:
                    starting.start_soon(start, name)
        return readies

    async def _watch(self, name: str, incarnation: int, proc: ServerProcess) -> None:
        await proc.drain()
        await proc.wait()
        self.on_exit(name, incarnation)

    async def exited(self, name: str, incarnation: int, within_s: float) -> bool:
        """Has incarnation ``incarnation``'s process of ``name`` exited (waiting up to
        ``within_s`` for it)? True too for an incarnation that was replaced since."""
        entry = self._procs.get(name)
        if entry is None or entry[0] != incarnation:
            return True
        proc = entry[1]
        with trio.move_on_after(within_s):
            await proc.wait()
        return proc.exited()

    async def kill(self, name: str) -> None:
        proc = self.process(name)
        if proc is not None:
            await proc.kill()

    async def stop_all(self) -> None:
        """SIGTERM every server, SIGKILL those still there after a bound; release them."""
        async with trio.open_nursery() as nursery:
            for proc in self._all:
                nursery.start_soon(proc.stop)
        for proc in self._all:
            await proc.aclose()
