"""Greedy decoding through a given decode step, for comparing compiled steps with the eager one
(tests/runtime/test_compiled.py, tests/runtime/test_aot.py)."""

from __future__ import annotations

import torch

from clearlm.generation.loop import prefill
from clearlm.model.kv_cache import KVCache


def greedy_steps(model, step, prompt: torch.Tensor, cache: KVCache,
                 n: int) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill ``prompt`` (1, T) eagerly into ``cache``, then n steps of ``step(model, token,
    cache)`` each fed the argmax of the logits before it; every step's logits (1, V) and the
    tokens fed."""
    logits = prefill(model, prompt, cache)  # (1, V)
    out, toks = [], []
    for _ in range(n):
        tok = logits.argmax(-1, keepdim=True)  # (1, 1)
        toks.append(int(tok))
        logits = step(model, tok, cache)
        out.append(logits)
    return out, toks
