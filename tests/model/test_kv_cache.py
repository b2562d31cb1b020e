"""Decoding with the KV cache must give the logits of a full forward pass over the same tokens."""

from __future__ import annotations

import torch

from clearlm.generation.loop import new_cache


def test_cached_decode_equals_full_forward(smollm2):
    model = smollm2.transformer
    ids = torch.tensor([smollm2.encode("One, two, three, four, five, six, seven")])  # (1, T)
    T = ids.shape[1]
    with torch.inference_mode():
        full = model(ids)[0]  # (T, V)
        cache = new_cache(model, 1, T)
        split = T - 6
        stepwise = [model(ids[:, :split], cache=cache)[0]]  # prefill: (split, V)
        for t in range(split, T):
            stepwise.append(model(ids[:, t : t + 1], cache=cache)[0])  # (1, V) per step
    stepwise = torch.cat(stepwise)
    assert cache.offset == T
    assert (stepwise - full).abs().max().item() < 1e-4


def test_chunked_prefill_equals_full_forward(smollm2):
    """Two prompt chunks: the second chunk's mask is the causal triangle shifted by the offset."""
    model = smollm2.transformer
    ids = torch.tensor([smollm2.encode("The quick brown fox jumps over the lazy dog again")])
    T = ids.shape[1]
    with torch.inference_mode():
        full = model(ids)[0]
        cache = new_cache(model, 1, T)
        a = model(ids[:, :4], cache=cache)[0]
        b = model(ids[:, 4:], cache=cache)[0]
    assert (torch.cat([a, b]) - full).abs().max().item() < 1e-4


def test_batch_rows_are_independent(smollm2):
    """Two different sequences in one batch give each row's single-sequence logits."""
    model = smollm2.transformer
    a = smollm2.encode("Hello there, my friend")
    b = smollm2.encode("Numbers: 1 2 3 4 5 6")
    n = min(len(a), len(b))
    batch = torch.tensor([a[:n], b[:n]])  # (2, n)
    with torch.inference_mode():
        both = model(batch)  # (2, n, V)
        one = model(batch[1:])[0]
    assert (both[1] - one).abs().max().item() < 1e-4
