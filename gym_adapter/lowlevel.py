"""gymckpt.gym_adapter.lowlevel: the Gym host's plumbing that other packages read.

The session journal's file name inside a participant's state and the key the host captures an
episode's state under: the application and the tests read snapshots with them. What an
environment or backend author needs is ``gymckpt.gym_adapter``.
"""

from __future__ import annotations

from ._episode import call_id
from ._host_episodes import capture_key as host_capture_key
from ._host_journal import JOURNAL_FILE

__all__ = [
    "JOURNAL_FILE",
    "call_id",
    "host_capture_key",
]
