"""The Gym manifest ``gym_checkpoint.json`` and its records (S8, C6).

Per instance: its participants (server name, kind, state directory relative to the snapshot,
records digest). Per episode: its owner (the participant that exported it), replica and
``capture_keys``. A manifest without participant topology is invalid. The records, their
version and their strict parsing live with the rest of the snapshot's format in
``_snapshot_format``; this module re-exports them for the modules that import them from here.
"""

from __future__ import annotations

from ._snapshot_format import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    PARTICIPANT_KIND_RE,
    PARTICIPANT_KINDS,
    EpisodeRecord,
    GymManifest,
    InstanceRecord,
    ParticipantRecord,
    dump_manifest,
    load_manifest,
)

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
