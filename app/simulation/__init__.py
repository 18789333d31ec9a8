"""``gymckpt simulate``: seeded scenarios (backends, modes, faults, crashes, real usage) run
deterministically on a mock clock, each judged by the exactly-once checks and replayable from
its seed. ``main`` is the command; ``scenario`` draws a seed's scenario, ``runner`` runs it,
``life`` one life of the simulated trainer, ``checks`` and ``reports`` judge it."""
