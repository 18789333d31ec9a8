"""The one seeding helper of the environments: a 63-bit integer derived from named parts.

Every environment derives the seeds of an episode (its ``reset`` seed, its policy's random
generator) from the deployment's seed and the episode's (row, slot, turn, ...) with
``derive_seed``, so an episode replays the same after a restore or on a replacement instance,
whichever process runs it.

Invariant: ``derive_seed(*parts)`` is a function of ``":".join(map(str, parts))`` only (sha256,
the first 8 bytes little-endian, shifted right by one: in ``[0, 2**63)``). Its values are part
of what a run does: changing it changes every environment's episodes.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: object) -> int:
    """A seed in ``[0, 2**63)`` from ``parts`` (their ``str`` joined by ``:``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
