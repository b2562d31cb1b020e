"""How far one model's next-token distributions are from a reference's on the same tokens.

Used to bound the compact-weight mode against float32 (issue 10, item 2; the README's
"Compact weights: distance from float32" table, tests/inspect/test_quant_distance.py), but any two
Transformers with one vocabulary can be compared.

Per position t, with reference logits z (V,) and the other model's z' (V,):
- |Δlogit|_t = max_i |z_i − z'_i|;
- KL_t = KL(P || P') = Σ_i P_i (log P_i − log P'_i), P = softmax(z), P' = softmax(z'), in nats,
  computed in float64 from the float32 logits (so the KL of two nearly equal distributions is
  not drowned by the rounding of the KL itself);
- top-1 agreement: argmax z == argmax z'.
Reported: max |Δlogit|, mean and max KL, and the share of positions whose top-1 agrees.

Where the positions come from:
- :func:`window_distances`: windows of ``window`` tokens starting every ``stride`` tokens; every
  position of every window counts (a token seen with a different left context is a different
  position), so N tokens give about ``(N - window) / stride + 1`` windows of ``window``
  positions. The reference runs one forward pass per window; the other model either the same
  (the prefill path) or a few tokens at a time through a KV cache (the decode path);
- :func:`greedy`: the logits of each greedy step (prefill, then decode_step), to compare two
  models' continuations of a prompt, tokens and logits.
The float32 model's own distance from transformers is bounded in tests/model/test_model_parity.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from clearlm.errors import ClearLMError
from clearlm.generation.loop import decode_step, prefill
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer


@dataclass(frozen=True)
class Distance:
    """Distance summary over ``n_positions`` positions (KL in nats)."""

    max_abs_logit: float
    mean_kl: float
    max_kl: float
    top1_agreement: float
    n_positions: int


class Accumulator:
    """Running maxima / sums of the per-position statistics; ``add`` logits of the same
    positions, ``result`` the summary (raises ClearLMError before any position)."""

    def __init__(self) -> None:
        self.max_abs, self.kl_sum, self.kl_max, self.agree, self.n = 0.0, 0.0, 0.0, 0, 0

    def add(self, ref: torch.Tensor, other: torch.Tensor) -> None:
        """ref, other: (T, V) logits of the same T positions."""
        if ref.shape != other.shape:
            raise ClearLMError(f"logit shapes differ: {tuple(ref.shape)} vs {tuple(other.shape)}")
        r, o = ref.double(), other.double()  # (T, V)
        self.max_abs = max(self.max_abs, (r - o).abs().max().item())
        kl = kl_divergence(r, o)  # (T,)
        self.kl_sum += kl.sum().item()
        self.kl_max = max(self.kl_max, kl.max().item())
        self.agree += int((r.argmax(-1) == o.argmax(-1)).sum().item())
        self.n += r.shape[0]

    def result(self) -> Distance:
        if self.n == 0:
            raise ClearLMError("no positions to compare (the token sequence is too short)")
        return Distance(self.max_abs, self.kl_sum / self.n, self.kl_max, self.agree / self.n,
                        self.n)


def kl_divergence(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref) || softmax(other)) per row, in nats: (..., V), (..., V) → (...,).

    Computed in float64; clamped at 0 (a true KL is ≥ 0; rounding can give −1e-17)."""
    lp = torch.log_softmax(ref.double(), dim=-1)
    lq = torch.log_softmax(other.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)


def window_spans(n_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """[begin, end) of each full window of ``window`` tokens starting every ``stride`` tokens;
    one window of all the tokens when there are fewer than ``window``."""
    if window < 1 or stride < 1:
        raise ClearLMError(f"window and stride must be >= 1, got {window} and {stride}")
    if n_tokens <= window:
        return [(0, n_tokens)] if n_tokens else []
    return [(b, b + window) for b in range(0, n_tokens - window + 1, stride)]


def cache_for(model: Transformer, max_seq_len: int) -> KVCache:
    """A batch-1 KV cache in the dtype of the model's first float parameter (a compact model's
    embedding has no ``.weight``, so generation.new_cache cannot be used for it)."""
    c = model.config
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return KVCache(c.n_layers, 1, c.n_kv_heads, c.head_dim, max_seq_len, dtype)


@torch.inference_mode()
def greedy(model: Transformer, prompt: Sequence[int], n_new: int) -> tuple[list[int], torch.Tensor]:
    """n_new greedy (argmax) token ids after ``prompt`` through prefill / decode_step, and the
    logits each was chosen from, (n_new, V) float32."""
    cache = cache_for(model, len(prompt) + n_new)
    logits = prefill(model, torch.tensor([list(prompt)], dtype=torch.long), cache)  # (1, V)
    out: list[int] = []
    steps = []
    for _ in range(n_new):
        steps.append(logits[0].float())
        out.append(int(logits[0].argmax()))
        if len(out) < n_new:
            logits = decode_step(model, torch.tensor([[out[-1]]], dtype=torch.long), cache)
    return out, torch.stack(steps)


@torch.inference_mode()
def window_distances(
    reference: Transformer,
    other: Transformer,
    tokens: Sequence[int],
    window: int = 128,
    stride: int = 26,
    chunks: Sequence[int | None] = (None, 4),
) -> dict[int | None, Distance]:
    """Distance over every position of windows of ``tokens``, one result per way of running
    ``other``; the reference always runs one forward pass per window (its prefill logits,
    computed once per window for all of ``chunks``).

    chunk None: ``other`` runs one forward pass per window too (the prefill path). chunk k:
    each window is fed to ``other`` k tokens at a time through a fresh KV cache (with k <= 4,
    QuantLinear's single-row kernel, as in decoding; k = 1 is decode_step itself). Only one
    window's logits, (W, V) float32 per model, are held at a time."""
    ids = torch.tensor([list(tokens)], dtype=torch.long)  # (1, N)
    accs = {c: Accumulator() for c in chunks}
    for begin, end in window_spans(ids.shape[1], window, stride):
        win = ids[:, begin:end]  # (1, W)
        ref = reference(win)[0]  # (W, V)
        for chunk, acc in accs.items():
            if chunk is None:
                acc.add(ref, other(win)[0])  # (W, V)
                continue
            cache = cache_for(other, end - begin)
            for c0 in range(0, end - begin, chunk):
                part = win[:, c0 : c0 + chunk]  # (1, k)
                acc.add(ref[c0 : c0 + chunk], other(part, cache=cache)[0])  # (k, V) each
    return {c: acc.result() for c, acc in accs.items()}
