"""``gymckpt.aio``: the trainer API for an asyncio trainer (through trio-asyncio).

``run(main)`` in place of ``asyncio.run(main())``; ``open_gym`` (any deployment: your own
environment with ``EmbeddedGym.host``, or ``RayGym``), ``open_embedded_gym``, ``open_rollouts`` and
the ``AioRollouts`` they yield behave as their trio twins in ``gymckpt``. See
``gymckpt.nurseries.aio``.
"""

from gymckpt.nurseries.aio import AioRollouts, open_embedded_gym, open_gym, open_rollouts, run

__all__ = ["AioRollouts", "open_embedded_gym", "open_gym", "open_rollouts", "run"]
