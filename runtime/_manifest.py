"""The Gym manifest ``gym_checkpoint.json`` and its records (S8, C6).

Per instance: its participants (server name, kind, state directory relative to the snapshot,
records digest). Per episode: its owner (the participant that exported it), replica and
``capture_keys``. A manifest without participant topology is invalid. Parsing is strict through
the library's converter (see ``_converter``): unknown or missing keys and wrong types are errors
that name the field.
"""

from __future__ import annotations

import re
from typing import Final

import attrs
import orjson

from ._converter import dumps, structure
from ._errors import ManifestError
from ._layout import MANIFEST_NAME

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "PARTICIPANT_KINDS",
    "PARTICIPANT_KIND_RE",
    "EpisodeRecord",
    "GymManifest",
    "InstanceRecord",
    "ParticipantRecord",
    "dump_manifest",
    "load_manifest",
]

MANIFEST_VERSION: Final = 1
PARTICIPANT_KINDS: Final = frozenset({"simple_agent", "legacy_agent", "environment", "model_proxy"})
"""The built-in participant kinds. Kinds are open: a deployment may register more (the Gym host's
``register_participant_kind``), so a manifest's kind must only be a well-formed name; whether the
live deployment has it is the restore's topology check."""
PARTICIPANT_KIND_RE: Final = re.compile(r"[a-z][a-z0-9_.-]{0,63}")


@attrs.frozen
class ParticipantRecord:
    """One participant of one instance as committed: where its records are, and their digest."""

    server_name: str
    kind: str
    state_dir: str
    records_digest: str


@attrs.frozen
class InstanceRecord:
    """One Gym instance (replica) and its participants, in topology order."""

    name: str
    participants: tuple[ParticipantRecord, ...]


@attrs.frozen
class EpisodeRecord:
    """An episode Gym exported at commit: who owns it, where it runs, its staged model calls."""

    rollout_id: str
    owner: str
    replica: str
    capture_keys: tuple[str, ...] = ()


@attrs.frozen
class GymManifest:
    """The whole manifest. ``version`` must equal ``MANIFEST_VERSION``."""

    version: int
    checkpoint_id: str
    instances: tuple[InstanceRecord, ...]
    episodes: tuple[EpisodeRecord, ...]


def dump_manifest(manifest: GymManifest) -> bytes:
    """The manifest's bytes on disk (JSON through the library's converter)."""
    return dumps(manifest)


def load_manifest(data: bytes) -> GymManifest:
    """Parse ``gym_checkpoint.json`` strictly: a non-empty JSON object of the supported version
    with exactly the known keys, else a ``ManifestError`` naming the file and the field.

    Structure only: ``load_snapshot`` also checks names, kinds, digests and paths."""
    if not data.strip():
        raise ManifestError(f"{MANIFEST_NAME}: file is empty")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{MANIFEST_NAME}: not valid JSON, truncated? ({exc})") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{MANIFEST_NAME}: expected a JSON object, got {type(raw).__name__}")
    version = raw.get("version")
    if "version" in raw and version != MANIFEST_VERSION:
        raise ManifestError(
            f"{MANIFEST_NAME}: version {version!r} is not supported "
            f"(this runtime reads version {MANIFEST_VERSION})"
        )
    return structure(raw, GymManifest, MANIFEST_NAME)
