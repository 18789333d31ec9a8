"""The built-in environments, each written against the public episode API only, as a user's
would be: the calendar workplace (``calendar``), Gymnasium (``gymnasium``, with its state
codecs in ``_codecs``), TextArena (``textarena``), OpenSpiel (``openspiel``), and the
OpenAI-compatible model client with capture and replay (``openai_model``). ``_seeding`` is the
one way they derive seeds. Each is imported by its module path; none is imported by the host
or a transport (``tests/test_layers.py``)."""
