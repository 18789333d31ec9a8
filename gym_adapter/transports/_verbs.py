"""The contract's control verbs run on an instance's ``GymHost``, by name: the server side of
``RemoteGym._call``, shared by the HTTP server (``http/_app.py``) and the Ray actor
(``ray/_actor.py``).

``args`` are the call's named arguments as ``RemoteGym`` sends them (the HTTP wire's names).
The caller has checked the trainer's term, applied the acknowledgements, executed the call's
fault and re-anchored its deadline on its own clock (``deadline_ts``); an ``attach`` that took
the instance over leaves the caller to forget the older term's streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gymckpt.runtime import CheckpointMode, TrainerTerm

from ..host._host import GymHost

__all__ = ["CONTROL_VERBS", "call_host"]

CONTROL_VERBS: Final = frozenset(
    {"prepare", "commit", "resume", "retire", "retire_restored", "restore", "attach", "release"}
)
"""The contract's calls that carry a deadline."""


async def call_host(
    host: GymHost,
    op: str,
    args: Mapping[str, Any],
    deadline_ts: float,
    trainer: TrainerTerm | None,
) -> Any:
    """Run control verb ``op`` of ``host`` with ``args`` by ``deadline_ts`` (host's clock), for
    ``trainer``'s term; ``ValueError`` for an operation the contract does not have."""
    if op == "prepare":
        return await host.prepare(
            args["checkpoint_id"],
            deadline_ts,
            args.get("mode", CheckpointMode.ALIGNED),
            args.get("alignment_timeout_s"),
            trainer=trainer,
        )
    if op == "commit":
        return await host.commit(
            args["checkpoint_id"], args["state_root"], deadline_ts, trainer=trainer
        )
    if op == "resume":
        return await host.resume(args["checkpoint_id"], deadline_ts, trainer=trainer)
    if op in ("retire", "retire_restored"):
        call = host.retire if op == "retire" else host.retire_restored
        return await call(list(args["rollout_ids"]), deadline_ts, trainer=trainer)
    if op == "restore":
        return await host.restore(
            args["state_root"], args["record"], list(args["episodes"]), deadline_ts, trainer=trainer
        )
    if op == "attach":
        return await host.attach(args["trainer"], deadline_ts)
    if op == "release":
        return await host.release(args["trainer"], deadline_ts)
    raise ValueError(f"unknown control operation {op!r}")
