"""``gymckpt serve MODULE:FACTORY``: one Gym instance as an HTTP service (``gymckpt-http/2``).

The command line of ``gym_adapter``'s ``serve_gym``: flags (and table ``[serve]`` of a TOML
``--config`` file, whose keys are the flags' names with underscores; a flag given on the command
line wins), logging on stderr (logger ``gymckpt.serve``: the readiness line, a warning per
refused request or failed call), exit codes: 0 after SIGTERM or SIGINT, 2 for bad input (a flag,
an environment that does not load, a port that cannot be bound, a TLS file that cannot be read,
an instance directory another server holds: one line naming it and the holder's pid, nothing
changed).
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio

from gymckpt.gym_adapter import HostConfig
from gymckpt.gym_adapter._shared import instance_switch_interval
from gymckpt.gym_adapter.lowlevel import DEFAULT_PORT, Limits, serve_gym, wire_decode
from gymckpt.nurseries import ExitCode
from gymckpt.runtime import InstanceDirLocked, ManifestError

__all__ = ["add_serve_parser", "main_serve"]

_DEFAULTS: Final[dict[str, Any]] = {
    "instance": "gym-0",
    "host": "127.0.0.1",
    "port": DEFAULT_PORT,
    "work_dir": "gymckpt-serve",
    "state_root": None,
    "token_file": None,
    "seed": 0,
    "host_config": None,
    "recover": False,
    "allow_faults": False,
    "max_body_bytes": Limits().max_body_bytes,
    "max_rows": Limits().max_rows,
    "max_streams": Limits().max_streams,
    "certfile": None,
    "keyfile": None,
}
"""Every option and its default (``--config``'s ``[serve]`` table takes the same keys)."""


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``gymckpt`` subcommands ``sub``."""
    serve: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve one Gym instance over HTTP (gymckpt-http/2) for HttpGym",
        description=(
            "Serves one Gym instance - the same host and environment as the embedded and the Ray "
            "backends - over HTTP, on hypercorn's trio worker, for an HttpGym trainer on this or "
            "another machine. Routes: GET /health (no token), POST /run (episodes, NeMo Gym "
            "shapes, NDJSON stream), POST /control/v1/<op> (the checkpoint control plane); see "
            "docs/http-wire.md. Every route but /health needs 'Authorization: Bearer TOKEN'. "
            "Once it serves it prints one line on stderr: 'gymckpt serve: instance NAME serving "
            "at http://HOST:PORT (incarnation HEX)'. SIGTERM stops it cleanly (exit 0)."
        ),
        epilog="exit codes: 0 stopped by SIGTERM/SIGINT, 2 bad input (flag, environment, "
        "port, TLS files, an instance directory another gymckpt serve holds)",
    )
    serve.add_argument(
        "environment",
        metavar="MODULE:FACTORY",
        help="import path of a function returning the Environment to serve, e.g. "
        "gymckpt.gym_adapter.environments.calendar:calendar_environment",
    )
    _add_place_flags(serve)
    serve.add_argument("--seed", type=int, metavar="S", help="the instance's seed (default 0)")
    serve.add_argument(
        "--host-config",
        metavar="FILE",
        help="the host's settings (HostConfig: lease_s, max_batch, ...) as the JSON of its wire "
        "form, read strictly (an unknown or mistyped key is exit 2); HttpGym.spawn writes it "
        "for the servers it starts; default: HostConfig()'s defaults",
    )
    serve.add_argument(
        "--recover",
        action="store_true",
        default=None,
        help="continue the retained sessions journaled under WORK_DIR/NAME/ (a replacement "
        "of a dead server); without it the journal starts afresh",
    )
    serve.add_argument(
        "--allow-faults",
        action="store_true",
        default=None,
        help="honour the fault a request carries (tests, the fault matrix); without it such a "
        "request is refused 403",
    )
    _add_limit_flags(serve)
    serve.set_defaults(handler=main_serve)
    return serve


def _add_place_flags(serve: argparse.ArgumentParser) -> None:
    """Where the instance serves and keeps its files: name, address, directories, token."""
    serve.add_argument(
        "--instance",
        metavar="NAME",
        help="the instance's name, as the trainer's topology lists it (default gym-0)",
    )
    serve.add_argument(
        "--host",
        metavar="HOST",
        help="address to bind (default 127.0.0.1, loopback only); any other address is "
        "reachable from other machines and logged as a warning: use TLS there",
    )
    serve.add_argument(
        "--port",
        type=int,
        metavar="PORT",
        help=f"TCP port (default {DEFAULT_PORT}; 0: a free port, the readiness line names it)",
    )
    serve.add_argument(
        "--work-dir",
        metavar="DIR",
        help="the instance's directory: its journal of retained sessions under DIR/NAME/, "
        "and the token file unless --token-file (default ./gymckpt-serve); one server per "
        "DIR/NAME/ (an OS lock: a second one exits 2 and changes nothing)",
    )
    serve.add_argument(
        "--state-root",
        metavar="DIR",
        help="every path a request names (commit and restore state_root, a restore's "
        "participant dirs) must resolve inside DIR, symlinks followed; a relative one is "
        "joined to it; anything else is refused 403 (default: the work dir)",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help="the bearer token: read from FILE if it holds one, else 32 random bytes are "
        "written there with mode 0600 (default WORK_DIR/token); it is never printed or logged",
    )


def _add_limit_flags(serve: argparse.ArgumentParser) -> None:
    """What one request may hold, TLS, and the ``--config`` file."""
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help="largest request body read, refused 413 beyond "
        f"(default {_DEFAULTS['max_body_bytes']})",
    )
    serve.add_argument(
        "--max-rows",
        type=int,
        metavar="N",
        help=f"most rows one /run submits, refused 413 beyond (default {_DEFAULTS['max_rows']})",
    )
    serve.add_argument(
        "--max-streams",
        type=int,
        metavar="N",
        help="most /run response bodies open at once, refused 429 beyond "
        f"(default {_DEFAULTS['max_streams']})",
    )
    serve.add_argument(
        "--certfile",
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (chain); needs --keyfile",
    )
    serve.add_argument("--keyfile", metavar="FILE", help="the PEM private key of --certfile")
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="read the options from table [serve] of a TOML file (keys are the option names "
        "with underscores, e.g. max_rows = 500); flags given on the command line win",
    )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The options: the command line, then ``--config``'s ``[serve]`` table, then defaults."""
    from gymckpt.runtime._shared import load_toml_table

    table = load_toml_table(args.config, "serve", list(_DEFAULTS)) if args.config else {}
    unknown = set(table) - set(_DEFAULTS)
    if unknown:
        raise ManifestError(
            f"{args.config} [serve]: unknown keys {', '.join(sorted(unknown))} "
            f"(known: {', '.join(_DEFAULTS)})"
        )
    opts: dict[str, Any] = {}
    for key, default in _DEFAULTS.items():
        value = getattr(args, key)
        if value is None:
            value = table.get(key, default)
        if default is not None and value is not None and type(value) is not type(default):
            raise ManifestError(
                f"{args.config} [serve]: {key} must be a {type(default).__name__}, got {value!r}"
            )
        opts[key] = value
    return opts


def _host_config(file: str | None) -> HostConfig | None:
    """The ``HostConfig`` in ``file`` (its JSON wire form), or None for the defaults;
    ``ValueError`` naming the file for one that cannot be read or is not one."""
    if file is None:
        return None
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise ValueError(f"--host-config {file}: cannot read it ({exc.strerror})") from None
    try:
        config: HostConfig = wire_decode(data, HostConfig)
    except ValueError as exc:  # WireFormatError
        raise ValueError(f"--host-config {file}: {exc}") from None
    return config


def _configure_logging() -> None:
    log = logging.getLogger("gymckpt.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("gymckpt.serve.hypercorn").setLevel(logging.WARNING)


def main_serve(args: argparse.Namespace) -> int:
    """Run ``gymckpt serve`` with the parsed ``args``; the exit code."""
    try:
        opts = _options(args)
        limits = Limits(opts["max_body_bytes"], opts["max_rows"], opts["max_streams"])
        host_config = _host_config(opts["host_config"])
        if not 0 <= opts["port"] <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {opts['port']}")
    except (ManifestError, ValueError, TypeError) as exc:
        print(f"gymckpt: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    _configure_logging()

    def path(key: str) -> Path | None:
        return Path(opts[key]) if opts[key] is not None else None

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            serving = await nursery.start(
                partial(
                    serve_gym,
                    args.environment,
                    instance=opts["instance"],
                    host=opts["host"],
                    port=opts["port"],
                    work_dir=Path(opts["work_dir"]),
                    state_root=path("state_root"),
                    token_file=path("token_file"),
                    seed=opts["seed"],
                    recover=bool(opts["recover"]),
                    allow_faults=bool(opts["allow_faults"]),
                    limits=limits,
                    config=host_config,
                    certfile=path("certfile"),
                    keyfile=path("keyfile"),
                )
            )
            print(serving.readiness_line(), file=sys.stderr, flush=True)

    instance_switch_interval()  # this process is the instance's own
    try:
        trio.run(run)
    except BaseException as exc:  # sorted below: bad input, else re-raised
        bad = _bad_input(exc)
        if bad is None:
            raise
        print(f"gymckpt: error: serve: {bad}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    return 0


def _bad_input(exc: BaseException) -> BaseException | None:
    """The bad-input error ``exc`` is (an environment that does not load, a port that cannot be
    bound, a TLS file that cannot be read, an instance directory another server holds),
    possibly wrapped alone in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    bad = (ValueError, OSError, ManifestError, InstanceDirLocked)
    return exc if isinstance(exc, bad) else None
