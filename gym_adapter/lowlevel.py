"""gymckpt.gym_adapter.lowlevel: the Gym host's plumbing that other packages read.

The session journal's file name inside a participant's state and the key the host captures an
episode's state under: the application and the tests read snapshots with them. ``serve_gym``
(with its ``Limits`` and ``Serving``) serves one instance over HTTP: ``gymckpt serve``. What an
environment or backend author needs is ``gymckpt.gym_adapter``.
"""

from __future__ import annotations

from .host._episode import call_id
from .host._episodes import capture_key as host_capture_key
from .host._journal import JOURNAL_FILE
from .transports._wire import decode as wire_decode
from .transports._wire import encode as wire_encode
from .transports.http._guard import Limits
from .transports.http._serve import DEFAULT_PORT, Serving, serve_gym

__all__ = [
    "DEFAULT_PORT",
    "JOURNAL_FILE",
    "Limits",
    "Serving",
    "call_id",
    "host_capture_key",
    "serve_gym",
    "wire_decode",
    "wire_encode",
]
