"""The Gym side's plumbing that gymckpt's own packages share: private, not API.

``JOURNAL_FILE``: the session journal's file name inside an instance's state directory, read
by the conformance kits that inspect a Gym's state (``gymckpt.testing``); ``step_identity``:
the digest that names a captured step in its call ids, by which the environment kit tells the
steps a snapshot captured; ``RACY_NS``: how recently written a sandbox file is hashed again at
the next mark (``gymckpt bench sandbox`` waits it out before timing a mark);
``instance_switch_interval``: the interpreter setting of a process that hosts an instance
(``gymckpt serve``); ``check_instance_niceness``: the check of a deployment's
``instance_niceness`` (``gymckpt bench checkpoint --instance-niceness``).

This is the one private module of ``gymckpt.gym_adapter`` that another gymckpt package may
import (``tests/test_layers.py``); what a backend author may use is
``gymckpt.gym_adapter.lowlevel``, and no name is in both. Nothing here is stable.
"""

from __future__ import annotations

from .environments._sandbox_tree import RACY_NS
from .host._captured import step_identity
from .host._journal import JOURNAL_FILE
from .transports._interpreter import instance_switch_interval
from .transports._niceness import check_instance_niceness

__all__ = [
    "JOURNAL_FILE",
    "RACY_NS",
    "check_instance_niceness",
    "instance_switch_interval",
    "step_identity",
]
