"""The HTTP transport: ``HttpGym`` (``_gym``) over ``gymckpt serve`` processes, given as URLs
or spawned and supervised (``_spawn``, ``_process``); the client's control calls (``_calls``)
and ``/run`` streams (``_stream``); the server (``_serve``, ``_app``) with its guard (tokens,
body limits, confined paths: ``_guard``); the wire's request and reply forms (``_wire``,
described in ``docs/http-wire.md``)."""
