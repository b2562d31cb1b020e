"""Multi-head causal self-attention (seed stage 2), with the variants real models use.

Shape letters: B batch, T new tokens, S keys visible (cached + new), D d_model, H n_heads,
K n_kv_heads, G = H / K query heads per key/value head, Hd head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clearlm.config import ModelConfig
from clearlm.model.hooks import DirectCall, HookPoint
from clearlm.model.kv_cache import CacheRows
from clearlm.model.norms import make_norm
from clearlm.model.positions import apply_rope


def attention_mask(
    positions: torch.Tensor, keys: torch.Tensor | int, window: int | None = None
) -> torch.Tensor:
    """Which keys each new query may see: causal, and within a sliding window when one is set.

    Query t of row b sits at position positions[b, t]; key s at position keys[b, s] (a KV cache
    stores keys in position order, so there keys is arange(S); without a cache the keys are the
    new tokens themselves). Causality means key ≤ query; a sliding window of W also requires
    key > query − W (the last W positions, the query's own included; transformers'
    sliding-window mask). Position −1 marks padding: a padding key is seen by nobody. Covers a
    fresh prompt (the classic lower triangle), new tokens after cached ones (chunked prefill,
    decode: the triangle shifted right by each row's own offset) and rows at different lengths.

    A query that may see no key at all (a padding query) sees every key instead: its output is
    discarded, and this keeps softmax from computing 0/0 = NaN in any backend or dtype
    (transformers' ``_unmask_unattended`` does the same).

    Args:
        positions: (B, T) or (T,) int64 query positions.
        keys: (B, S) or (S,) int64 key positions, or an int S for arange(S).

    Returns:
        (B, T, S) bool (or (T, S) when both inputs are 1-D), True where attention is allowed.
    """
    # SymInt: a cache size left symbolic (clearlm.runtime.aot)
    if isinstance(keys, int | torch.SymInt):
        keys = torch.arange(keys, device=positions.device)
    q, k = positions[..., :, None], keys[..., None, :]  # (B, T, 1), (B, 1, S)
    mask = (k <= q) & (k >= 0)  # (B, T, S)
    if window is not None:
        mask &= k > q - window
    return mask | ~mask.any(dim=-1, keepdim=True)


class Attention(DirectCall):
    """Multi-head causal self-attention with grouped-query heads (Ainslie et al. 2023, GQA).

    Each of the H query heads computes softmax(q·kᵀ · scale + mask) · v (Vaswani et al. 2017,
    eq. 1; scale = 1/√Hd unless the config sets it); K ≤ H key/value heads are shared by groups
    of G = H / K query heads. The heads' outputs are concatenated and projected back to D by
    o_proj. Options: Q/K/V and output biases, RMSNorm on each head's q and k (Qwen3, Gemma 3),
    tanh soft-capping of the scores (Gemma 2), a sliding window.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = hd = config.head_dim
        d = config.d_model
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=config.attn_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.attn_bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.attn_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=config.attn_out_bias)
        # q/k-norm over each head's Hd values (Qwen3, Gemma 3) or over the whole projection
        # before it is split into heads (OLMoE: q_norm over H·Hd, k_norm over K·Hd)
        self.qk_norm_all = config.qk_norm and config.qk_norm_scope == "all"
        if config.qk_norm:
            self.q_norm = make_norm(config, self.n_heads * hd if self.qk_norm_all else hd)
            self.k_norm = make_norm(config, self.n_kv_heads * hd if self.qk_norm_all else hd)
        self.qk_norm = config.qk_norm
        self.clip_qkv = config.clip_qkv  # OLMoE: q, k and v clamped to ±c after the norms
        self.scale = config.attn_scale if config.attn_scale is not None else hd**-0.5
        self.softcap = config.attn_softcap
        sliding = config.layer_types[layer_idx] == "sliding"
        self.window = config.sliding_window if sliding else None
        self.use_rope = config.position == "rope"
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_z, self.hook_out = HookPoint(), HookPoint()
        # rows of each projection in ``qkv_proj`` (Q, K and maybe V fused into one compact
        # matrix by clearlm.quant.fuse); empty: q_proj, k_proj, v_proj are called one by one
        self.qkv_split: tuple[int, ...] = ()

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        positions: torch.Tensor,
        cache: CacheRows | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, T, D) → (B, T, D). With a cache, new keys/values are stored at their positions.

        rope: (cos, sin_rot), each (T, rope_dim) or per row (B, T, rope_dim) / (B, 1, T,
        rope_dim), when the model uses RoPE, else None. positions: (T,) or (B, T) int64.
        mask: (B, 1, T, S) bool, built once per forward pass by the Transformer; None (a block
        run on its own, without a cache) builds the causal mask of ``positions`` here.
        """
        B, T, _ = x.shape
        H, Hd = self.n_heads, self.head_dim
        q, k, v = self.project(x, rope)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if cache is not None:
            k, v = cache.update_and_fetch(self.layer_idx, k, v)  # (B, K, S, Hd)
        if mask is None:
            keys = positions if cache is None else k.shape[2]  # key positions: (B, S) or (S,)
            mask = attention_mask(positions, keys, self.window)  # (B, T, S) or (T, S)
            mask = mask.view(-1, 1, *mask.shape[-2:])  # (B or 1, 1, T, S)
        if self.hook_scores.active or self.hook_pattern.active:
            out = self.attend_traced(q, k, v, mask)  # the pattern exists only when wanted
        else:
            out = self.attend(q, k, v, mask)  # (B, H, T, Hd)
        out = self.hook_z(out.transpose(1, 2))  # (B, T, H, Hd)
        out = self.o_proj(out.reshape(B, T, H * Hd))  # (B, T, H·Hd): heads concatenated → (B, T, D)
        return self.hook_out(out)

    def project(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) → q (B, H, T, Hd) and k (B, K, T, Hd) after q/k-norm and RoPE, v
        (B, K, T, Hd); views where possible (hooks see the same values either way).

        With Q, K (and V) fused into ``qkv_proj`` (clearlm.quant.fuse) the projections are one
        kernel call, and without q/k-norm the H + K heads of q and k, adjacent in its output,
        are rotated by one apply_rope: elementwise, so the same values as two calls."""
        B, T, _ = x.shape
        H, K, Hd = self.n_heads, self.n_kv_heads, self.head_dim
        if self.qkv_split:
            y = self.qkv_proj(x)  # (B, T, (H + 2K)·Hd), or (B, T, (H + K)·Hd) without V
            v = y[..., (H + K) * Hd :] if len(self.qkv_split) == 3 else self.v_proj(x)
            v = v.view(B, T, K, Hd).transpose(1, 2)  # (B, K, T, Hd)
            if not self.qk_norm and self.clip_qkv is None:
                qk = y[..., : (H + K) * Hd].view(B, T, H + K, Hd).transpose(1, 2)
                if rope is not None:
                    qk = apply_rope(qk, *rope)  # (B, H + K, T, Hd)
                return qk[:, :H], qk[:, H:], v
            q, k = y[..., : H * Hd], y[..., H * Hd : (H + K) * Hd]
        else:
            q, k = self.q_proj(x), self.k_proj(x)
            v = self.v_proj(x).view(B, T, K, Hd).transpose(1, 2)  # (B, K, T, Hd)
        if self.qk_norm_all:  # over all heads at once: (B, T, H·Hd) and (B, T, K·Hd)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:  # OLMoE (transformers' OlmoeAttention): after the norms
            c = self.clip_qkv
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q, k = q.view(B, T, H, Hd), k.view(B, T, K, Hd)
        if self.qk_norm and not self.qk_norm_all:  # per head, over Hd, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, Hd), (B, K, T, Hd)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(scores) · v: q (B, H, T, Hd), k/v (B, K, S, Hd), mask (B, 1, T, S) bool
        → (B, H, T, Hd).

        By scaled_dot_product_attention, whose enable_gqa lets each group of G query heads
        share one key/value head without materialising repeated copies of k and v; written out
        when the scores are soft-capped (SDPA cannot cap them), and in a compiled CPU decode
        step (T = 1, :meth:`attend_one_query`): there Inductor would call SDPA's CPU flash
        kernel, which costs 45 µs per call at 264 keys and 435 µs at 2,048 (SmolLM2's shapes,
        one thread), while written out it is a few µs (same values up to float32 summation
        order).
        """
        decode_compiled = (  # (is_compiling first: the eager step skips the other checks)
            torch.compiler.is_compiling() and q.shape[2] == 1 and q.device.type == "cpu"
        )
        if self.softcap is None and not decode_compiled:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1]
            )
        if decode_compiled:
            return self.attend_one_query(q, k, v, mask)
        return self.attend_explicitly(q, k, v, mask)

    def attend_one_query(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """attend_explicitly for one query position, written as products and sums.

        q (B, H, 1, Hd), k/v (B, K, S, Hd), mask (B, 1, 1, S) bool or None → (B, H, 1, Hd).

        For the compiled decode step: Inductor fuses the scores, the mask, the softmax and the
        weighted sum of v into one loop nest with the layer's RoPE and cache write, where
        ``q @ kᵀ`` and ``pattern @ v`` (:meth:`attend_explicitly`) were two calls of MKL's
        batched sgemm per layer, each a parallel region of its own with a few rows of work
        (3 of the 11 parallel regions of a SmolLM2 layer, 4 % of a step's CPU samples). Per
        step, AOT packages, 2 threads, one process, steps alternating: SmolLM2 −4 to −5 %,
        Qwen2.5-0.5B −1 %, Gemma 3 270M −2 to −3 % (with clearlm.runtime.compiled.DECODE_INDUCTOR).
        """
        B, H, _, Hd = q.shape
        K = k.shape[1]
        qg = q.reshape(B, K, H // K, 1, Hd)  # (B, K, G, 1, Hd): a group's heads share k and v
        s = self.capped((qg * k[:, :, None]).sum(-1) * self.scale)  # (B, K, G, S)
        if mask is not None:
            s = s.masked_fill(~mask.view(mask.shape[0], 1, 1, -1), float("-inf"))
        pattern = torch.softmax(s.float(), dim=-1).to(q.dtype)  # (B, K, G, S)
        out = (pattern[..., None] * v[:, :, None]).sum(-2)  # (B, K, G, Hd)
        return out.view(B, H, 1, Hd)

    def capped(self, s: torch.Tensor) -> torch.Tensor:
        """Scores s (any shape) soft-capped as Gemma 2 does, cap · tanh(s / cap) (Gemma 2
        report; transformers' Gemma2 attention), or s itself when the model has no cap."""
        if self.softcap is None:
            return s
        return torch.tanh(s / self.softcap) * self.softcap

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q·kᵀ · scale, soft-capped (Gemma 2: cap · tanh(s / cap)), masked with −inf.

        q (B, H, T, Hd), k (B, K, S, Hd), mask (B, 1, T, S) bool or None → (B, H, T, S).
        """
        B, H, T, Hd = q.shape
        K = k.shape[1]
        G = H // K
        # query head h reads kv head h // G: the G heads of a group and their T queries stacked
        # as the rows of one product, so k is read as it is (never repeated G times)
        qg = q.reshape(B, K, G * T, Hd)  # (B, K, G·T, Hd)
        s = self.capped((qg @ k.transpose(-1, -2)).view(B, K, G, T, -1) * self.scale)
        if mask is not None:  # s: (B, K, G, T, S)
            s = s.masked_fill(~mask[:, :, None], float("-inf"))  # (B, 1, 1, T, S) over G
        return s.reshape(B, H, T, -1)  # (B, H, T, S)

    @staticmethod
    def mix(pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """pattern (B, H, T, S) weights over values v (B, K, S, Hd) → (B, H, T, Hd)."""
        B, H, T, S = pattern.shape
        K = v.shape[1]
        out = pattern.reshape(B, K, H // K * T, S) @ v  # (B, K, G·T, Hd), as scores groups q
        return out.view(B, H, T, -1)

    def attend_explicitly(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(scores) · v written out (needed for Gemma 2's soft-capping).

        q (B, H, T, Hd), k/v (B, K, S, Hd), mask (B, 1, T, S) bool or None → (B, H, T, Hd).
        """
        pattern = torch.softmax(self.scores(q, k, mask).float(), dim=-1).to(q.dtype)
        return self.mix(pattern, v)

    def attend_traced(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention with the scores and pattern exposed to hooks.

        When no hook replaces either, the output is computed exactly as the plain forward pass
        computes it (so traced runs are bit-identical to untraced ones); a replaced pattern
        (e.g. an ablated head) is mixed with the values explicitly.
        """
        s = self.scores(q, k, mask)
        s2 = self.hook_scores(s)
        pattern = torch.softmax(s2.float(), dim=-1).to(q.dtype)  # (B, H, T, S)
        pattern2 = self.hook_pattern(pattern)
        if s2 is s and pattern2 is pattern:
            return self.attend(q, k, v, mask)
        return self.mix(pattern2, v)
