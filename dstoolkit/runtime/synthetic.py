"""The synthetic training data of real runs: a deterministic, learnable token stream (a fixed random bigram chain
over a small subset of the vocabulary, with noise) and the best loss reachable on it. A pure function of (seed,
step, rank); no dataset is ever downloaded.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from dstoolkit.models.shape import ModelShape
from dstoolkit.runtime.model import _name_seed

BIGRAM_FOLLOW_PROB = 0.9
"""synthetic_batch: probability that the next token follows the fixed bigram map (else uniform noise)."""


SYNTHETIC_ACTIVE_VOCAB = 64
"""synthetic_batch draws from this many token ids (a fixed random subset of the vocabulary), so even a
2048-token vocabulary shows a falling loss within ~10 steps: first ln(V) -> ln(64), then the bigram."""


def _synthetic_tables(vocab_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """(active token ids, next-token map over all ids) for synthetic_batch; depends on `seed` only."""
    gen = torch.Generator().manual_seed(_name_seed(seed, "synthetic_batch.bigram"))
    k = min(vocab_size, SYNTHETIC_ACTIVE_VOCAB)
    active = torch.randperm(vocab_size, generator=gen)[:k]
    nxt = torch.zeros(vocab_size, dtype=torch.long)
    nxt[active] = active[torch.randperm(k, generator=gen)]
    return active, nxt


def synthetic_batch(
    shape: ModelShape, micro_batch: int, seq_len: int, *, step: int, rank: int, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """A deterministic, learnable batch: a fixed random bigram chain over 64 token ids with 10% noise.

    Tokens come from a fixed subset of min(V, 64) ids; token t+1 is `next[token t]` with probability
    BIGRAM_FOLLOW_PROB, else a uniform draw from the subset. The tables depend on `seed` only, so the
    pattern is shared by every rank and step, and the loss falls from ln(V) towards `loss_floor` within a
    few tens of steps. The batch itself is a pure function of (seed, step, rank).

    Args:
        shape: model shape (vocab_size is used).
        micro_batch: sequences in the batch.
        seq_len: tokens per sequence.
        step: data position (micro-batch index on this rank); each value gives a new batch.
        rank: data-parallel rank.
        seed: data seed.

    Returns:
        (input_ids, labels), both int64 of shape (micro_batch, seq_len); labels are inputs shifted by one.
    """
    if micro_batch <= 0 or seq_len <= 0:
        raise ValueError(f"micro_batch={micro_batch} and seq_len={seq_len} must both be > 0")
    active, nxt = _synthetic_tables(shape.vocab_size, seed)
    k = active.numel()
    gen = torch.Generator().manual_seed(
        (seed * 1_000_003 + step * 7_919 + rank * 104_729 + 17) & 0x7FFFFFFFFFFF
    )
    tokens = torch.empty(micro_batch, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = active[torch.randint(0, k, (micro_batch,), generator=gen)]
    noise = active[torch.randint(0, k, (micro_batch, seq_len), generator=gen)]
    follow = torch.rand(micro_batch, seq_len, generator=gen) < BIGRAM_FOLLOW_PROB
    for t in range(seq_len):
        tokens[:, t + 1] = torch.where(follow[:, t], nxt[tokens[:, t]], noise[:, t])
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_floor(shape: ModelShape) -> float:
    """Entropy (nats) of the synthetic next-token distribution: the best achievable loss on synthetic_batch."""
    k = min(shape.vocab_size, SYNTHETIC_ACTIVE_VOCAB)
    p_follow = BIGRAM_FOLLOW_PROB + (1 - BIGRAM_FOLLOW_PROB) / k
    p_other = (1 - BIGRAM_FOLLOW_PROB) / k
    return -(p_follow * math.log(p_follow) + (k - 1) * p_other * math.log(p_other))
