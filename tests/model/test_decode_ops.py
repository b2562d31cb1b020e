"""The decode step's faster forms compute the written-out formulas number for number.

RMSNorm runs torch's fused ``rms_norm`` for float32 inputs (one op instead of eight) and RoPE
rotates by ``roll`` against a sign-flipped sine table (four ops instead of eight). References:
the formulas written out op by op here (RMSNorm: x · rsqrt(mean(x²) + ε) · (o + w), Zhang &
Sennrich 2019, Gemma's o = 1; RoPE: x·cos + rotate_half(x)·sin, transformers' apply_rotary_pos_emb,
with the angles p · base^(−2j/d) computed here)."""

from __future__ import annotations

import pytest
import torch

from clearlm.model.norms import RMSNorm
from clearlm.model.positions import RotaryEmbedding, apply_rope, rotate_half


@pytest.mark.parametrize("dim", [16, 64, 576, 640, 896])
@pytest.mark.parametrize("offset", [0.0, 1.0])  # Llama, Gemma (x̂ · (1 + w))
def test_rms_norm_matches_the_formula(dim: int, offset: float) -> None:
    g = torch.Generator().manual_seed(dim)
    norm = RMSNorm(dim, 1e-6, offset)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
    x = torch.randn(3, 5, dim, generator=g) * 4  # (B, T, D)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + norm.weight)
    got = norm(x)
    assert torch.equal(got, want.detach())
    assert torch.equal(got, norm.written_out(x))
    half = x.to(torch.bfloat16)  # other dtypes take the written-out path: float32 inside
    assert torch.equal(norm(half), norm.written_out(half))


def textbook(x: torch.Tensor, positions: torch.Tensor, d: int, base: float) -> torch.Tensor:
    """x (B, n, T, Hd) rotated: the first d dimensions by x·cos + rotate_half(x)·sin."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # (d/2,)
    angles = positions.float()[..., None] * inv_freq  # (..., T, d/2)
    emb = torch.cat((angles, angles), dim=-1)  # (..., T, d)
    cos, sin = emb.cos(), emb.sin()
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
    rot = x[..., :d] * cos + rotate_half(x[..., :d]) * sin
    return torch.cat((rot, x[..., d:]), dim=-1)


@pytest.mark.parametrize("d", [64, 32])  # full and partial rotary (head_dim 64)
def test_rope_rotates_as_the_formula(d: int) -> None:
    g = torch.Generator().manual_seed(d)
    rope = RotaryEmbedding(d, 10000.0, 256)
    x = torch.randn(2, 3, 7, 64, generator=g).transpose(1, 2)  # (B, n, T, Hd), a strided view
    shared = torch.tensor([0, 5, 200])  # (T,)
    assert torch.equal(apply_rope(x, *rope(shared)), textbook(x, shared, d, 10000.0))
    per_row = torch.tensor([[3, 4, 5], [100, 101, 102]])  # (B, T)
    assert torch.equal(apply_rope(x, *rope(per_row)), textbook(x, per_row, d, 10000.0))


@pytest.mark.parametrize("softcap", [None, 50.0])  # Gemma 2 caps the scores
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_one_query_attention_matches_the_formula_and_compiles(softcap, n_kv_heads) -> None:
    """attend_one_query (the compiled decode step's attention) against softmax(q·kᵀ·scale,
    capped, masked)·v written out here, per query head h reading kv head h // G; eager, and
    compiled as the decode step compiles it (Inductor options of clearlm.runtime.compiled)."""
    from clearlm.config import ModelConfig
    from clearlm.model.attention import Attention
    from clearlm.runtime.compiled import CHECKS_OFF, DECODE_INDUCTOR

    config = ModelConfig(architecture="llama", vocab_size=8, d_model=32, n_layers=1, n_heads=4,
                         n_kv_heads=n_kv_heads, head_dim=8, d_ff=16, norm_eps=1e-6,
                         context_length=64, tie_word_embeddings=False, attn_softcap=softcap)
    attn = Attention(config, 0)
    g = torch.Generator().manual_seed(n_kv_heads)
    B, H, K, S, Hd = 2, 4, n_kv_heads, 37, 8
    q = torch.randn(B, H, 1, Hd, generator=g) * 3
    k, v = torch.randn(B, K, S, Hd, generator=g) * 3, torch.randn(B, K, S, Hd, generator=g)
    mask = torch.rand(B, 1, 1, S, generator=g) > 0.3  # (B, 1, 1, S) bool
    mask[..., 0] = True  # every row keeps a key

    kv = torch.arange(H) // (H // K)  # the kv head each query head reads
    s = torch.einsum("bhd,bhsd->bhs", q[:, :, 0], k[:, kv]) * attn.scale  # (B, H, S)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask[:, 0], float("-inf"))
    want = torch.einsum("bhs,bhsd->bhd", torch.softmax(s, -1), v[:, kv])[:, :, None]

    torch.testing.assert_close(attn.attend_one_query(q, k, v, mask), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(attn.attend_explicitly(q, k, v, mask), want, rtol=0, atol=1e-5)
    compiled = torch.compile(attn.attend, fullgraph=True,
                             options={**CHECKS_OFF, **DECODE_INDUCTOR})
    torch.testing.assert_close(compiled(q, k, v, mask), want, rtol=0, atol=1e-5)
