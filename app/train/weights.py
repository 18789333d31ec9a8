"""The final weights' digest, the line ``gymckpt train`` ends with.

``weights_sha256(state_dict)`` is the sha256 of the weights' canonical bytes: for each entry
of the state dict, in its key order (a module's ``state_dict()`` order: registration order),
the tensor's elements as raw bytes — ``tensor.detach().cpu().contiguous()`` viewed as its
dtype's native (little-endian on every machine we run) in-memory representation, row-major —
concatenated with nothing between them. Keys, shapes and dtypes are not hashed: two runs of
one learner share its architecture, and what differs between them is the values. Equal
digests mean bit-identical weights; one flipped bit anywhere changes the digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

__all__ = ["weights_sha256"]


def weights_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The hex sha256 of ``state_dict``'s tensors' raw bytes, in key order (module docstring)."""
    digest = hashlib.sha256()
    for tensor in state_dict.values():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
