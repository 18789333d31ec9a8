"""gymckpt.gym_adapter.lowlevel: what a Gym backend author may use, beyond the public names.

``gymckpt.gym_adapter`` is enough to write an environment and to run one on the three
backends (``EmbeddedGym``, ``RayGym``, ``HttpGym``). This namespace is for writing a backend:
documented, kept stable like the public names, but a level down (as ``trio.lowlevel``).

A transport to instances in other processes:

- ``RemoteGym``: the contract's verbs written once over one call primitive; a transport
  implements ``_call(instance, op, args, deadline_ts, fault)``, ``run`` and ``replace``
  (``RayGym`` and ``HttpGym`` are two). It stands on ``Deployment`` (instance names, the fault
  plan, ``replacements``), ``Incarnations`` (which life of an instance a call went to),
  ``AckBook`` (acknowledgements carried by the next call), ``WireDeadline`` (a deadline sent as
  the time left) and ``RunShape`` (what a ``refuse`` or ``drop`` fault does to a ``run``);
- on the instance's side, ``call_host`` runs a control verb on a ``GymHost`` by its named
  arguments, and ``wire_encode``/``wire_decode`` give every contract record and error its JSON
  wire form;
- ``serve_gym`` (with ``Limits``, ``Serving`` and ``DEFAULT_PORT``) serves one instance over
  HTTP, as ``gymckpt serve`` does.

The plumbing our own packages share (the session journal's file name, which the conformance
kits read) is in the private ``gymckpt.gym_adapter._shared``, not here.
"""

from __future__ import annotations

from .transports._acks import AckBook
from .transports._admission import RunShape
from .transports._deadlines import WireDeadline
from .transports._deployment import Deployment
from .transports._incarnations import Incarnations
from .transports._remote import RemoteGym
from .transports._verbs import call_host
from .transports._wire import decode as wire_decode
from .transports._wire import encode as wire_encode
from .transports.http._guard import Limits
from .transports.http._serve import DEFAULT_PORT, Serving, serve_gym

__all__ = [
    "DEFAULT_PORT",
    "AckBook",
    "Deployment",
    "Incarnations",
    "Limits",
    "RemoteGym",
    "RunShape",
    "Serving",
    "WireDeadline",
    "call_host",
    "serve_gym",
    "wire_decode",
    "wire_encode",
]
