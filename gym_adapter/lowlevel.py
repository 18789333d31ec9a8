"""gymckpt.gym_adapter.lowlevel: the Gym host's plumbing that other packages read.

The session journal's file name inside a participant's state and the key the host captures an
episode's state under: the application and the tests read snapshots with them. ``serve_gym``
(with its ``Limits`` and ``Serving``) serves one instance over HTTP: ``gymckpt serve``. What an
environment or backend author needs is ``gymckpt.gym_adapter``.
"""

from __future__ import annotations

from ._episode import call_id
from ._host_episodes import capture_key as host_capture_key
from ._host_journal import JOURNAL_FILE
from ._http_guard import Limits
from ._http_serve import DEFAULT_PORT, Serving, serve_gym
from ._wire import decode as wire_decode
from ._wire import encode as wire_encode

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
