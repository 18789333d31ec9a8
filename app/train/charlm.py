"""A small causal transformer over bytes, trained from scratch: the text learner's policy.

It reads bytes (``0..255``, plus ``BOS`` and ``PAD``: ``READ_VOCAB`` tokens) and writes from
a small alphabet of characters plus the terminator ``EOS`` (the output head has
``len(alphabet) + 1`` logits). A prompt is the tail of the observation's UTF-8 bytes, at most
``context`` of them, left-padded with ``PAD`` to ``context`` and preceded by ``BOS``: always
``context + 1`` tokens, so every position means the same thing in every call. The move follows
it, one character at a time; a character written is read back as its byte.

Pre-norm blocks (``LayerNorm``, causal self-attention, a GELU MLP), learned absolute
positions. Causal attention makes a position's logits a function of the tokens up to it, so
the log probability of a whole move is one forward pass over prompt and move
(``MoveBatch.log_probs`` sums it over the positions that predicted each written token, the
terminator included): what the sampler (``sample_move``) drew from, token by token, up to float
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "BOS",
    "PAD",
    "READ_VOCAB",
    "CharTransformer",
    "MoveBatch",
    "prompt_tokens",
    "sample_move",
    "written_tokens",
]

BOS = 256
PAD = 257
READ_VOCAB = 258


def prompt_tokens(text: str, context: int) -> list[int]:
    """``[PAD] * k + [BOS] + tail``: the last ``context`` UTF-8 bytes of ``text``, left-padded
    to ``context`` (``context + 1`` tokens in all)."""
    tail = list(text.encode("utf-8", "surrogatepass")[-context:])
    return [PAD] * (context - len(tail)) + [BOS] + tail


class _Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """``forward(tokens [B, T]) -> logits [B, T, writes]``: the logits at position ``i`` are
    the distribution of the token after position ``i``, over the ``writes`` output tokens.
    Positions up to ``max_len`` tokens."""

    def __init__(
        self, writes: int, max_len: int, *, d_model: int = 64, heads: int = 4, layers: int = 2
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(READ_VOCAB, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, writes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def sample_move(
    model: CharTransformer,
    prompt: Sequence[int],
    alphabet: str,
    max_chars: int,
    rng: np.random.Generator,
) -> str:
    """Write a move after ``prompt``: up to ``max_chars`` characters of ``alphabet``, each drawn
    from the model's softmax with one ``rng.random()``; ``EOS`` (output ``len(alphabet)``)
    ends it early. After ``max_chars`` characters no terminator is drawn."""
    tokens = list(prompt)
    move: list[str] = []
    eos = len(alphabet)
    with torch.inference_mode():
        for _ in range(max_chars):
            logits = model(torch.tensor([tokens]))[0, -1]
            cumulative = np.cumsum(torch.softmax(logits.double(), dim=-1).numpy())
            written = int(min(np.searchsorted(cumulative, rng.random(), side="right"), eos))
            if written == eos:
                break
            move.append(alphabet[written])
            tokens.append(ord(alphabet[written]))
    return "".join(move)


def written_tokens(move: str, alphabet: str, max_chars: int) -> list[int]:
    """The output tokens ``sample_move`` drew to write ``move``: its characters' indices in
    ``alphabet``, then ``EOS`` if it is shorter than ``max_chars``."""
    if len(move) > max_chars or any(c not in alphabet for c in move):
        raise ValueError(
            f"move {move!r:.40} was not written by this policy (at most {max_chars} "
            f"characters of {alphabet!r})"
        )
    tokens = [alphabet.index(c) for c in move]
    return [*tokens, len(alphabet)] if len(move) < max_chars else tokens


@attrs.frozen
class MoveBatch:
    """Moves with their prompts, as tensors for one forward pass each: ``inputs`` [N, P +
    max_chars - 1] (the prompt, then the move's characters as bytes, ``PAD`` after),
    ``targets`` [N, max_chars] (the written tokens, 0 after) and ``mask`` (1.0 where a token
    was written)."""

    prompt_len: int
    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def of(
        cls, prompts: Sequence[Sequence[int]], moves: Sequence[str], alphabet: str, max_chars: int
    ) -> MoveBatch:
        rows, targets, mask = [], [], []
        for prompt, move in zip(prompts, moves, strict=True):
            written = written_tokens(move, alphabet, max_chars)
            read = [ord(c) for c in move[: max_chars - 1]]
            rows.append([*prompt, *read, *[PAD] * (max_chars - 1 - len(read))])
            targets.append(written + [0] * (max_chars - len(written)))
            mask.append([1.0] * len(written) + [0.0] * (max_chars - len(written)))
        return cls(
            len(prompts[0]) if prompts else 0,
            torch.tensor(rows, dtype=torch.int64),
            torch.tensor(targets, dtype=torch.int64),
            torch.tensor(mask, dtype=torch.float32),
        )

    def log_probs(self, model: CharTransformer, index: torch.Tensor) -> torch.Tensor:
        """[len(index)]: each move's log probability under ``model`` (the sum over its written
        tokens, the terminator included), differentiable."""
        logits = model(self.inputs[index])[:, self.prompt_len - 1 :]
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(2, self.targets[index].unsqueeze(2)).squeeze(2)
        return (picked * self.mask[index]).sum(dim=1)
