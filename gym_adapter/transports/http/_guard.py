"""The HTTP server's security rules: what a request must be before it reaches the instance.

The control plane of ``gymckpt serve`` can retire and restore environment state, so the server
checks every request before anything on the instance moves, in this order, and refuses the first
rule broken with a ``Refusal`` (a 4xx, a JSON body, one log line on logger ``gymckpt.serve``):

1. the route: an unknown path is 404, a known path with another method 405;
2. the token: every route but ``GET /health`` needs ``Authorization: Bearer TOKEN``, compared in
   constant time (``hmac.compare_digest``); missing, malformed or wrong is 401 (the token is
   never logged, nor the header);
3. the body size: a ``Content-Length`` over the limit is 413 before a byte of the body is read;
   a body without one (chunked) is read chunk by chunk and refused as soon as it passes the
   limit, so the server never holds more than the limit plus one chunk;
4. the body: not the wire form of the request (``http/_wire``) is 400;
5. the rows of one ``/run``: more than the limit is 413;
6. faults: a request carrying one (a control call's ``fault``, a ``/run`` shape other than the
   plain one) is 403 unless the server was started with ``--allow-faults``;
7. paths: a ``state_root`` (commit, restore) is resolved inside the server's state root — a
   relative path is joined to it, an absolute one must lie inside it once symlinks are resolved
   — and so must every participant's ``state_dir`` of a restore's record; then every path the
   instance will touch below it (a commit's ``<instance>/<participant>/records.json``, a
   restore's ``<state_dir>/records.json``) is walked component by component (``confine_below``):
   an existing component that is a symbolic link must resolve inside the state root too (a
   ``<state_root>/<instance>`` linked out would have the commit write outside). Anything else is
   403. (The walk is made when the request arrives: the state root is the operator's directory,
   and whoever can swap links in it between that walk and the write can write there anyway.);
8. open streams: a ``/run`` beyond the limit of open response bodies is 429.

A refused request changed nothing: the checks only read the request, and the acknowledgements
it carries are applied only once every check passed.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final

import attrs

from ._wire import Refusal

__all__ = [
    "LOG",
    "Limits",
    "RefusedRequest",
    "check_bearer",
    "confine",
    "confine_below",
    "content_length",
    "read_body",
]

LOG: Final = logging.getLogger("gymckpt.serve")
"""The server's logger: the readiness line, one line per refused request, one per failed call."""


@attrs.frozen
class Limits:
    """What one request may ask of the server."""

    max_body_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=attrs.validators.gt(0))
    """The largest request body read (``/run`` rows, a restore's records)."""
    max_rows: int = attrs.field(default=10_000, validator=attrs.validators.gt(0))
    """The most rows one ``/run`` submits."""
    max_streams: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    """The most ``/run`` response bodies open at once."""


class RefusedRequest(Exception):
    """A request broke one of the server's rules: answer ``status`` with ``refusal``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(status, reason, message)
        self.status = status
        self.refusal = Refusal(reason, message)


def check_bearer(headers: Mapping[bytes, bytes], token: bytes) -> None:
    """``Authorization: Bearer <token>`` or ``RefusedRequest`` 401; the comparison takes the
    same time whatever the given token shares with the right one."""
    value = headers.get(b"authorization")
    if value is None:
        raise RefusedRequest(401, "Unauthorized", "missing 'Authorization: Bearer TOKEN' header")
    scheme, _, given = value.partition(b" ")
    if scheme.lower() != b"bearer" or not given.strip():
        raise RefusedRequest(401, "Unauthorized", "the Authorization header is not 'Bearer TOKEN'")
    if not hmac.compare_digest(given.strip(), token):
        raise RefusedRequest(401, "Unauthorized", "wrong bearer token")


def content_length(headers: Mapping[bytes, bytes], limit: int) -> int | None:
    """The declared body length (None: not declared); over ``limit`` is 413, a malformed one
    400."""
    value = headers.get(b"content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise RefusedRequest(400, "BadRequest", f"Content-Length {value!r} is not a number")
    n = int(value)
    if n > limit:
        raise RefusedRequest(
            413,
            "BodyTooLarge",
            f"body of {n} bytes over the server's limit of {limit} (--max-body-bytes)",
        )
    return n


Receive = Callable[[], Awaitable[Mapping[str, Any]]]


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body, read until its end or refused 413 as soon as it passes ``limit``
    (nothing after that chunk is read). A client that disconnects mid-body is 400."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RefusedRequest(400, "BadRequest", "the client disconnected mid-body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RefusedRequest(
                413,
                "BodyTooLarge",
                f"body over the server's limit of {limit} bytes (--max-body-bytes)",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def confine(path: str, root: Path, what: str) -> Path:
    """``path`` resolved inside ``root`` (already resolved): relative paths are joined to it,
    symlinks are followed; outside it (``..``, an absolute path elsewhere, a symlink out) is
    ``RefusedRequest`` 403."""
    if "\x00" in path or not path:
        raise RefusedRequest(403, "PathOutsideStateRoot", f"{what}: {path!r} is not a path")
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve(strict=False)
    if resolved != root and root not in resolved.parents:
        raise RefusedRequest(
            403,
            "PathOutsideStateRoot",
            f"{what} {path!r} resolves to {resolved}, outside the server's state root {root} "
            "(--state-root): name a path inside it",
        )
    return resolved


def _refuse_path(what: str, path: object, why: str, root: Path) -> RefusedRequest:
    return RefusedRequest(
        403,
        "PathOutsideStateRoot",
        f"{what}: {str(path)!r} {why}; name a path inside the server's state root {root} "
        "(--state-root) whose links stay inside it",
    )


def confine_below(base: Path, rel: str, root: Path, what: str) -> None:
    """Walk ``base/rel`` component by component (``base``: resolved, inside ``root``, which is
    resolved): an existing component that is a symbolic link must resolve, whole, inside
    ``root``, and the walk goes on from where it lands; a dangling link, a loop, or a link out
    is ``RefusedRequest`` 403. The walk stops at the first component that does not exist (the
    instance creates the rest as plain directories under a checked one). ``rel`` is relative,
    without ``..`` (the caller's own path or one ``confine`` already passed)."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or "\x00" in rel:
        raise _refuse_path(what, rel, "is not a relative path below the state root", root)
    current = base
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _refuse_path(
                what, current, f"cannot be examined ({exc.strerror})", root
            ) from None
        if not stat.S_ISLNK(mode):
            continue
        try:
            target = current.resolve(strict=True)
        except (OSError, RuntimeError):  # dangling, or a loop
            why = "is a symbolic link to nothing (dangling, or a loop)"
            raise _refuse_path(what, current, why, root) from None
        if target != root and root not in target.parents:
            why = f"is a symbolic link to {target}, outside the state root"
            raise _refuse_path(what, current, why, root)
        current = target
