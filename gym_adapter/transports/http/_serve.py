"""``serve_gym``: one Gym instance served over HTTP by hypercorn's trio worker, in one trio run.

The host (``GymHost``) and the ASGI server (``hypercorn.trio.serve``) run in one nursery of one
trio run, so a request handler calls the host directly. Lifecycle:

0. the instance directory (``<work_dir>/<instance>``, where the host journals its retained
   sessions) is locked (``runtime.WorkDirLock``, an ``flock`` the kernel drops when the process
   dies, SIGKILL included) before anything is opened or written: a second server of the same
   instance on the same work directory raises ``InstanceDirLocked`` naming the holder's pid
   (``gymckpt serve`` exits 2 with that line) and has changed nothing — it never reaches the
   journal (which a start without ``--recover`` begins afresh), the token or the state root.
   The lock is held until ``serve_gym`` returns;
1. the bearer token: read from ``token_file`` when it holds one, else 32 random bytes
   (``secrets.token_urlsafe``) written there (default ``<work_dir>/token``) atomically with mode
   0600 (``write_atomic``: a randomly named temporary file created ``O_EXCL | O_NOFOLLOW`` with
   mode 0600, fsync, rename, fsync of the directory). The token is never
   logged or printed: a client reads the file;
2. the incarnation: 32 random hex digits, new at every start, in every response's
   ``Gymckpt-Incarnation`` header and in ``/health``: a server that restarted is a new
   incarnation, which a client treats as a replacement, never as the same instance;
3. the host enters, then hypercorn binds (``port`` 0: a free port, reported) and the caller is
   told where it serves (``task_status.started(Serving)``); the command line then prints the
   readiness line;
4. SIGTERM (or SIGINT) stops it cleanly: every open ``/run`` body ends without its end line,
   hypercorn stops accepting and finishes the requests in progress (``graceful_timeout_s``),
   the host exits (episodes cancelled, journal closed) and ``serve_gym`` returns.

A bind other than loopback is only made when asked (``host``) and is logged as a warning: the
token is then all that guards the control plane; use TLS (``certfile``/``keyfile``, passed to
hypercorn's ``Config``) on any network you do not trust.
"""

from __future__ import annotations

import ipaddress
import secrets
import signal
from contextlib import nullcontext
from pathlib import Path
from typing import Final

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from gymckpt.runtime import InstanceDirLocked, WorkDirLock
from gymckpt.runtime.lowlevel import write_atomic

from ...host._host import GymHost, HostConfig
from ...host._load import load_environment
from ._app import GymHttpApp
from ._guard import LOG, Limits

__all__ = ["DEFAULT_PORT", "Serving", "is_loopback", "load_or_create_token", "serve_gym"]

DEFAULT_PORT: Final = 8100
TOKEN_BYTES: Final = 32
KEEP_ALIVE_TIMEOUT_S: Final = 30.0
"""How long the server keeps an idle keep-alive connection open (hypercorn's default is 5 s, the
same as httpx's expiry: a client could send on a connection the server was closing, which
fails as "Server disconnected without sending a response")."""


@attrs.frozen
class Serving:
    """Where ``serve_gym`` serves: ``url`` (``http://HOST:PORT``, the real port), the
    ``incarnation`` and the token's file."""

    instance: str
    url: str
    incarnation: str
    token_file: Path

    def readiness_line(self) -> str:
        """The one line ``gymckpt serve`` prints on stderr once it serves (spawners read it)."""
        return (
            f"gymckpt serve: instance {self.instance} serving at {self.url} "
            f"(incarnation {self.incarnation})"
        )


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_or_create_token(token_file: Path) -> bytes:
    """The token ``token_file`` holds (surrounding whitespace ignored), or a new one written
    there with mode 0600. A file others may read is used but warned about."""
    try:
        text = token_file.read_bytes().strip()
    except FileNotFoundError:
        text = b""
    if text:
        mode = token_file.stat().st_mode & 0o777
        if mode & 0o077:
            LOG.warning(
                "gymckpt serve: token file %s has mode %o: others may read it (chmod 600 it)",
                token_file,
                mode,
            )
        return text
    token = secrets.token_urlsafe(TOKEN_BYTES).encode()
    token_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(token_file, token + b"\n", mode=0o600)
    return token


def _prepare_dirs(
    work_dir: Path, state_root: Path | None, token_file: Path | None
) -> tuple[Path, Path, bytes]:
    """The work directory and the state root made, the state root resolved, the token read or
    created: ``(state_root, token_file, token)``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    root = (state_root if state_root is not None else work_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    token_path = token_file if token_file is not None else work_dir / "token"
    return root, token_path, load_or_create_token(token_path)


def _bind(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def serve_gym(
    environment: str,
    *,
    instance: str = "gym-0",
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    work_dir: Path,
    state_root: Path | None = None,
    token_file: Path | None = None,
    seed: int = 0,
    recover: bool = False,
    allow_faults: bool = False,
    limits: Limits | None = None,
    config: HostConfig | None = None,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    graceful_timeout_s: float = 3.0,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the environment ``environment`` (``"pkg.module:factory"``) as instance
    ``instance`` until SIGTERM/SIGINT (``handle_signals``) or cancellation; see the module
    docstring. ``state_root`` (default ``work_dir``): every path a request names stays inside
    it. ``certfile`` and ``keyfile``: serve HTTPS (both or neither)."""
    if (certfile is None) != (keyfile is None):
        raise ValueError("TLS needs both --certfile and --keyfile")
    lock = WorkDirLock(work_dir / instance, refusal=InstanceDirLocked)
    lock.acquire()  # first: a second server of this instance must change nothing
    try:
        root, token_path, token = _prepare_dirs(work_dir, state_root, token_file)
        incarnation = secrets.token_hex(16)
        cfg = _hypercorn_config(host, port, certfile, keyfile, graceful_timeout_s)
        signals = (
            trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) if handle_signals else None
        )
        gym = GymHost(
            instance,
            load_environment(environment),
            seed,
            work_dir,
            config or HostConfig(),
            recover=recover,
            instance_lock=lock,
        )
        with signals if signals is not None else nullcontext() as received:
            async with gym:
                app = GymHttpApp(
                    gym,
                    token,
                    root,
                    incarnation,
                    limits=limits or Limits(),
                    allow_faults=allow_faults,
                )
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    binds: list[str] = await nursery.start(_serve_app, app, cfg, stop)
                    task_status.started(Serving(instance, binds[0], incarnation, token_path))
                    if received is not None:
                        async for signum in received:
                            LOG.info("gymckpt serve: signal %d, stopping", signum)
                            break
                        app.stop()
                        stop.set()
    finally:
        lock.release()


def _hypercorn_config(
    host: str, port: int, certfile: Path | None, keyfile: Path | None, graceful_timeout_s: float
) -> Config:
    """hypercorn's configuration for binding ``host:port`` (HTTPS with ``certfile`` and
    ``keyfile``); warns when the bind reaches other machines."""
    if not is_loopback(host):
        LOG.warning(
            "gymckpt serve: binding %s, reachable from other machines: the bearer token is all "
            "that guards the control plane%s",
            host,
            "" if certfile else "; without TLS (--certfile/--keyfile) it crosses in clear",
        )
    cfg = Config()
    cfg.bind = [_bind(host, port)]
    cfg.accesslog = None
    cfg.errorlog = LOG.getChild("hypercorn")
    cfg.graceful_timeout = graceful_timeout_s
    # an idle connection is kept well past the client's own expiry (``HttpGym``'s
    # KEEPALIVE_EXPIRY_S): a client never sends on a connection the server is closing
    cfg.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_S
    if certfile is not None and keyfile is not None:
        cfg.certfile = str(certfile)
        cfg.keyfile = str(keyfile)
    return cfg


async def _serve_app(
    app: GymHttpApp,
    cfg: Config,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's trio worker serving ``app`` until ``stop``; started with the bound URLs."""
    await serve(app, cfg, shutdown_trigger=stop.wait, task_status=task_status)  # type: ignore[arg-type]
