"""The seeds' stages as small modules: norms, positions (RoPE), attention, feed-forward, block.

Shape letters used throughout: B batch, T new tokens in this pass, S keys visible (cached + new),
D d_model, H n_heads, K n_kv_heads, G = H / K query heads per key/value head, Hd head_dim,
F d_ff, V vocab_size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clearlm.config import ModelConfig
from clearlm.kv_cache import KVCache


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · w.

    Unlike LayerNorm it neither subtracts the mean nor adds a bias. Computed in float32 and cast
    back, as Hugging Face's LlamaRMSNorm does, so low-precision inputs keep their accuracy.

    Shapes: x (..., D) → (..., D), same dtype as x.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding tables (Su et al. 2021, "RoFormer", eq. 34).

    Position p rotates each pair of a head's dimensions by the angle p · θ_j with
    θ_j = base^(-2j / d), j = 0 … d/2 - 1. We pair dimension j with j + d/2 (the "rotate_half"
    layout of Hugging Face and Meta's Llama) rather than 2j with 2j+1 (llama.cpp's layout);
    GGUF Q/K rows are un-permuted at load time (loading/gguf.py) so both give the same numbers.

    cos/sin are precomputed in float32 for every position up to max_positions: (P, d).
    """

    def __init__(self, rope_dim: int, base: float, max_positions: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            base ** (torch.arange(0, rope_dim, 2, dtype=torch.int64).float() / rope_dim)
        )
        pos = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = torch.outer(pos, inv_freq)  # (P, d/2): angle p·θ_j
        emb = torch.cat((freqs, freqs), dim=-1)  # (P, d): same angle for j and j + d/2
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) int64 → (cos, sin), each (T, d) float32."""
        return self.cos[positions], self.sin[positions]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., d) → (..., d): [x1, x2] ↦ [-x2, x1], the 90° rotation of each (j, j + d/2) pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys: x (B, n, T, Hd), cos/sin (T, Hd) → (B, n, T, Hd), x's dtype.

    x·cos + rotate_half(x)·sin is the 2-D rotation [[cos, -sin], [sin, cos]] on every pair.
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def causal_mask(positions: torch.Tensor, n_keys: int) -> torch.Tensor | None:
    """Which keys each new query may see, given a KV cache that already holds earlier tokens.

    Query t sits at position positions[t]; key s sits at position s (the cache stores keys in
    position order). Causality means s ≤ positions[t]. Three cases:
    - one new token (decode): it may see every key, so no mask is needed (None);
    - a fresh prompt at positions 0 … T-1: the classic lower triangle;
    - new tokens after cached ones (chunked prefill): the triangle shifted right by the offset.

    Returns:
        (T, S) bool, True where attention is allowed, or None when all keys are allowed.
    """
    if positions.shape[0] == 1 and int(positions[0]) == n_keys - 1:
        return None
    keys = torch.arange(n_keys, device=positions.device)
    return keys[None, :] <= positions[:, None]  # (T, S)


class Attention(nn.Module):
    """Multi-head causal self-attention with grouped-query heads (Ainslie et al. 2023, GQA).

    Each of the H query heads computes softmax(q·kᵀ / √Hd + mask) · v (Vaswani et al. 2017,
    eq. 1); K < H key/value heads are shared by groups of G = H / K query heads. The heads'
    outputs are concatenated and projected back to D by o_proj.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.head_dim
        d, hd = config.d_model, config.head_dim
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
    ) -> torch.Tensor:
        """x (B, T, D) → (B, T, D). With a cache, new keys/values are stored at `positions`."""
        B, T, _ = x.shape
        H, K, Hd = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, Hd).transpose(1, 2)  # (B, H, T, Hd)
        k = self.k_proj(x).view(B, T, K, Hd).transpose(1, 2)  # (B, K, T, Hd)
        v = self.v_proj(x).view(B, T, K, Hd).transpose(1, 2)  # (B, K, T, Hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, int(positions[0]), k, v)  # (B, K, S, Hd)
        mask = causal_mask(positions, k.shape[2])  # (T, S) or None
        # enable_gqa lets each group of G = H / K query heads share one key/value head
        # without materialising repeated copies of k and v.
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=K != H
        )  # (B, H, T, Hd)
        out = out.transpose(1, 2).reshape(B, T, H * Hd)  # (B, T, H·Hd): heads concatenated
        return self.o_proj(out)  # (B, T, D)


class SwiGLU(nn.Module):
    """Gated feed-forward network (Shazeer 2020, "GLU Variants Improve Transformer").

    FFN(x) = W_down · (SiLU(W_gate · x) ⊙ (W_up · x)); x (B, T, D) → (B, T, D) via (B, T, F).
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One pre-norm Transformer block (Xiong et al. 2020; as in GPT-3 and Llama).

    h = x + Attn(RMSNorm(x)); out = h + FFN(RMSNorm(h)). Shapes (B, T, D) → (B, T, D).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.d_ff)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache)
        return h + self.mlp(self.post_attention_layernorm(h))
