"""Built-in learners on the runtime (``gymckpt train``): PyTorch policies trained with GRPO
over the prompt groups gymckpt forms, their weights and optimizer in every snapshot.

``cartpole`` (``cartpole``) is the fast one, an MLP; ``text`` (``text``) a character
transformer trained from scratch on a TextArena game, writing its moves as text (``charlm``
its model). ``learner`` is what both are made of (the policy, optimizer, generator and the
GRPO update); ``loop`` the trainer loop they share (and the deterministic mode); ``grpo`` the
update's arithmetic; ``weights`` the final weights' digest; ``command`` the command line.
Importing this package does not import torch (the ``train`` extra).
"""
