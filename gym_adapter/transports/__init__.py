"""The transports: how the trainer's runtime reaches the hosts.

``EmbeddedGym`` (``_embedded``) calls hosts in the trainer's own process. The remote ones,
``ray/`` (one actor per instance, bridged through trio-asyncio) and ``http/`` (``gymckpt serve``
processes), subclass ``RemoteGym`` (``_remote``), which writes the contract's verbs once over
one call primitive; ``_verbs`` runs those verbs on a host on the instance's side. What every
remote transport shares sits beside them: acknowledgements (``_acks``), admission and the
``run`` shape (``_admission``), the lives of an instance (``_incarnations``), deadlines sent as
time left (``_deadlines``), errors by class (``_errors``), the reply outbox (``_outbox``), the
JSON wire (``_wire``) and a trio guest on an asyncio loop (``_trio_guest``). Every deployment
is a ``Deployment`` (``_deployment``) and reports ``GymStatistics`` (``_statistics``).

Invariant: a transport imports no environment (``tests/test_layers.py``).
"""
