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
