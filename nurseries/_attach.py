"""A trainer takes its Gym over: its term attached to every instance before anything else.

``open_rollouts`` takes the work directory's next trainer term (``runtime.TrainerTerm``: the
lineage stays, the term grows with each start) and attaches it to every instance
(``TrainerAware.attach``), concurrently and each bounded, before the restore asks Gym
anything. An instance still running the episodes of an older term of the same lineage (a
trainer that was killed while servers someone else runs went on), or still holding its
checkpoint open, fences that term there and is idle afterwards, so the restore (or a fresh
start) proceeds at once; an instance that serves another lineage refuses (``GymInUse``, exit
code 2) and the trainer stops, having changed nothing there. An instance found dead is replaced
(``ReplaceableGym``, within ``max_replacements``) and its replacement attached. A backend that
is not ``TrainerAware`` (every instance lives and dies with the trainer's process) is left as it
is. A run that finished (its dataset trained) releases its instances as ``open_rollouts``
closes (``release_trainer``), so another run may attach to them; a run that stops otherwise (a
crash, an error, a preemption) keeps them: it comes back.
"""

from __future__ import annotations

import functools
import logging

from gymckpt.gym_adapter import AttachReply, GymBackend, can_attach, can_replace
from gymckpt.runtime import RuntimeConfig, TrainerTerm

from ._calls import fan_out
from ._replace import dead_in, replace_now

__all__ = ["attach_trainer", "release_trainer"]

log = logging.getLogger("gymckpt")


async def attach_trainer(
    gym: GymBackend, trainer: TrainerTerm, config: RuntimeConfig
) -> dict[str, AttachReply]:
    """Attach ``trainer`` to every instance of ``gym`` (module docstring); the replies by
    instance (none for a backend that is not ``TrainerAware``). Logs one WARNING per instance
    where an older term was fenced."""
    if not can_attach(gym):
        return {}
    attach = gym.attach  # type: ignore[attr-defined]
    calls = {name: functools.partial(attach, name, trainer) for name in gym.instances}
    replaced = 0
    while True:
        try:
            replies: dict[str, AttachReply] = await fan_out("attach", calls, config)
        except Exception as exc:
            dead = sorted({d.instance for d in dead_in(exc)} & set(calls))
            if not dead or not can_replace(gym) or replaced >= config.max_replacements:
                raise
            replaced += 1
            log.warning("attach found %s dead: replacing, then attaching there", ", ".join(dead))
            for name in dead:
                await replace_now(gym, name, config)
            continue  # again everywhere: an instance attached already answers took_over False
        break
    for name, reply in sorted(replies.items()):
        if reply.took_over and (reply.previous is not None or reply.episodes or reply.aborted):
            was = reply.previous.describe() if reply.previous is not None else "an earlier trainer"
            aborted = f", aborted its checkpoint {reply.aborted}" if reply.aborted else ""
            log.warning(
                "gymckpt: instance %s served %s: fenced it (episodes ended: %d, slots freed: %d%s)",
                name,
                was,
                reply.episodes,
                reply.sessions,
                aborted,
            )
    return replies


async def release_trainer(gym: GymBackend, trainer: TrainerTerm, config: RuntimeConfig) -> None:
    """The run of ``trainer`` is done: every instance may serve another run now. Best effort,
    each call bounded: an instance that does not answer stays held (restart it for a new run),
    which is logged, never raised."""
    if not can_attach(gym):
        return
    release = gym.release  # type: ignore[attr-defined]
    calls = {name: functools.partial(release, name, trainer) for name in gym.instances}
    try:
        await fan_out("release", calls, config)
    except Exception as exc:
        log.warning("gymckpt: releasing the Gym instances for another run failed: %s", exc)
