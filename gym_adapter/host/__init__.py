"""The host: one Gym instance's state and its episodes, whatever transport carries them.

``GymHost`` (``_host``) answers the contract's verbs for one instance; its parts each own one
concern: sessions and their slots (``_slots``, ``_episodes``), turns and the model calls in
them (``_turns``, ``_user_calls``), the boundary marks an unaligned cut takes (``_cut``),
parking for an aligned one (``_parking``), the control verbs (``_control``), the records a
commit writes and a restore reads (``_records``), the session journal (``_journal``), the
trainer's tenancy (``_tenancy``), the views a trainer may read (``_views``), streams of replies
(``_streams``) and the log (``_log``). The episode API an environment is written against is
``_episode`` and ``_environment``; ``_load`` turns an environment reference into one.

Invariant: the host imports no transport and no environment (``tests/test_layers.py``); a
transport drives it through the contract's verbs, an environment through the episode API.
"""
