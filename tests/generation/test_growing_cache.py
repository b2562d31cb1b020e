"""A generation's KV cache starts at the prompt rounded up to FIRST_COLUMNS positions and doubles
as the text grows (generation/loop.py make_room), instead of holding room for max_new_tokens from
the start: each decode step reads the whole cache, so room that is never used slowed every step.

Reference: the same steps run in a cache sized for the whole generation at once (what generation
did before): the same greedy tokens, logits within float32 summation noise."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.generation.loop import (
    FIRST_COLUMNS,
    decode_step,
    generation_cache,
    generation_limit,
    make_room,
    prefill,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("g") / "t.gguf",
                                         context_length=2048), threads=1)


def test_grow_keeps_the_filled_columns(tiny) -> None:
    tf = tiny.transformer
    cache = generation_cache(tf, 10, 1000, growing=True)
    assert cache.max_seq_len == FIRST_COLUMNS  # 10 + 1 rounded up, not 1010
    with torch.inference_mode():
        prefill(tf, torch.arange(10)[None] + 3, cache)
    before = [k[:, :, :10].clone() for k in cache.keys]
    make_room(tf, cache, 255, 1010)  # fits: unchanged
    assert cache.max_seq_len == FIRST_COLUMNS
    make_room(tf, cache, 600, 1010)  # 256 → 512 → 1024, capped at the limit
    assert cache.max_seq_len == 1010 and cache.keys[0].shape[2] == 1011
    assert all(torch.equal(k[:, :, :10], b) for k, b in zip(cache.keys, before, strict=True))
    assert cache.offset == 10
    with pytest.raises(ValueError, match="cannot shrink"):
        cache.grow(500)


def test_growing_generation_equals_a_cache_sized_at_once(tiny) -> None:
    """700 greedy tokens cross the 256 and 512 boundaries: the same tokens as steps run in one
    cache of 1,000 positions, logits within 1e-5."""
    tf, prompt, n = tiny.transformer, [5, 6, 7], 700
    got = tiny.generate(prompt, max_new_tokens=n, temperature=0, ignore_eos=True)
    assert len(got.tokens) == n
    cache = generation_cache(tf, len(prompt), 1000)  # one size, as before
    assert cache.max_seq_len == generation_limit(tf, len(prompt), 1000) == 1003
    tokens, gap = [], 0.0
    with torch.inference_mode():
        logits = prefill(tf, torch.tensor([prompt]), cache)
        for i in range(n):
            token = int(logits.argmax())
            tokens.append(token)
            gap = max(gap, abs(float(torch.log_softmax(logits.float(), -1)[0, token])
                               - got.logprobs[i]))
            logits = decode_step(tf, torch.tensor([[token]]), cache)
    assert tokens == got.tokens
    assert gap <= 1e-5
