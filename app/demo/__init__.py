"""``gymckpt demo``: a trio trainer loop against Gym with periodic rollout checkpoints, and with
``--crash-after-checkpoint`` a real two-process crash (SIGKILL) and restore, judged by the
exactly-once verdict. ``main`` runs it; ``parent`` the two phases as processes, ``phase`` one
phase, ``crash`` the kill points, ``journal`` what each phase trained, ``verdict`` the report."""
