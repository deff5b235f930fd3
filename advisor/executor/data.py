"""Deterministic synthetic training data: the same tokens for every rank and the reference run.

Each sequence follows a noisy affine recurrence x[i+1] = (a x[i] + c) mod V with a few random
tokens, so the loss falls visibly within a few steps (a uniformly random stream would sit at
log V and hide mistakes).
"""

from __future__ import annotations

import torch


def global_batch(step: int, batch: int, seq_length: int, vocab: int, seed: int) -> torch.Tensor:
    """[batch, seq_length + 1] token ids for one optimizer step (inputs and shifted targets)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.empty(batch, seq_length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=gen)
    a, c = 5, 3
    for i in range(seq_length):
        tokens[:, i + 1] = (a * tokens[:, i] + c) % vocab
    noise = torch.rand(batch, seq_length + 1, generator=gen) < 0.1
    tokens[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=gen)
    return tokens


def dp_slice(tokens: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    """The rows data-parallel rank ``dp_rank`` trains (contiguous blocks)."""
    rows = tokens.shape[0] // dp
    return tokens[dp_rank * rows: (dp_rank + 1) * rows]
