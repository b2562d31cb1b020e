"""Q4_K's two-level scales kept as the file stores them: 16 bytes per 256 values.

A Q4_K super-block (ggml-common.h block_q4_K) is ``d`` (float16), ``dmin`` (float16), 12 bytes
of 6-bit sub-scales ``sc`` and sub-mins ``m`` (8 each, one per 32 values) and 128 bytes of
4-bit codes. gguf.quants dequantizes value j of sub-block i as

    w = float32(d · sc_i) · q_j - float32(dmin · m_i)        (both products exact: 11 × 6 bits)

pack.py repacks the codes into the kernel's 4-bit blocks and keeps the first 16 bytes of every
super-block, unchanged, as the weight's "heads": ``scale`` uint8 (N, K // 256, 16) (row tiles:
(N // T, K // 256, T, 16), quant/tiles.py), ``min`` None. The kernel (csrc/qgemv.cpp,
expand_k4_heads) turns a band of 64 rows' heads into the float32 per-32 scale ``d · sc`` and
min ``-(dmin · m)`` in a small buffer that stays in cache, then runs the same fused
multiply-add per weight as before, ``fmaf(scale, q, min)``: the same float32 values bit for bit
(one rounding, as the reference), from 0.5625 bytes per value (the file's) instead of 0.75
with float32 scales and mins per 32 (1.33×). A float16 scale per 32 would not do: ``d · sc``
has up to 17 significant bits.

The 6-bit unpacking (ggml's get_scale_min_k4, gguf-py's Q4_K.get_scale_min): bytes q[0..11],
sub-block i < 4: sc = q[i] & 63, m = q[i + 4] & 63; i >= 4: sc = (q[i + 4] & 15) | (q[i - 4]
>> 6) << 4, m = (q[i + 4] >> 4) | (q[i] >> 6) << 4.
"""

from __future__ import annotations

import torch

HEAD = 16  # bytes of one super-block's head: d, dmin (float16), 12 bytes of 6-bit sc and m
SUPER = 256  # values per super-block


def is_heads(scale: torch.Tensor) -> bool:
    """Whether a Packed's ``scale`` holds Q4_K super-block heads (uint8) rather than scales."""
    return scale.dtype == torch.uint8


def heads_tile(scale: torch.Tensor) -> int:
    """Rows per row tile of a heads tensor: (N, nS, 16) → 1, (N // T, nS, T, 16) → T."""
    return scale.shape[2] if scale.dim() == 4 else 1


def expand_heads(heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major heads (N, nS, 16) uint8 → scale ``d · sc`` and min ``-(dmin · m)``, each
    (N, nS * 8) float32, sub-block i of super-block s in column 8 s + i (exact products)."""
    n, ns = heads.shape[0], heads.shape[1]
    d = heads[..., 0:2].contiguous().view(torch.float16).float()  # (N, nS, 1)
    dmin = heads[..., 2:4].contiguous().view(torch.float16).float()  # (N, nS, 1)
    q = heads[..., 4:16].to(torch.int32)  # (N, nS, 12)
    a, b, c = q[..., 0:4], q[..., 4:8], q[..., 8:12]  # (N, nS, 4) each
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1).float()  # (N, nS, 8)
    m = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1).float()  # (N, nS, 8)
    return (d * sc).reshape(n, ns * 8), (-(dmin * m)).reshape(n, ns * 8)
