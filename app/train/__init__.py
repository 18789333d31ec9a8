"""Built-in learners on the runtime (``gymckpt train``): PyTorch policies trained with GRPO
over the prompt groups gymckpt forms, their weights and optimizer in every snapshot.

``cartpole`` (``cartpole``) is the fast one; ``loop`` is the trainer loop they share (and the
deterministic mode); ``grpo`` the update; ``weights`` the final weights' digest; ``command``
the command line. Importing this package does not import torch (the ``train`` extra).
"""
