"""Q4_K's, Q6_K's and IQ4_XS's two-level scales kept as the file stores them.

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

Q6_K (block_q6_K: 6-bit codes q, 16 int8 sub-scales sc, one per 16 values, float16 ``d``;
``w = float32(d · sc_i) · (q_j - 32)``, exact: 11 × 8 bits) keeps its scale bytes as heads of
18 bytes, the file's sc[16] then d: ``scale`` uint8 (N, K // 256, 18), expanded by the kernel
as Q4_K's; and its codes at 6 bits (pack.py): code blocks of 64 values, 48 bytes each, a
little-endian stream of 6-bit fields (code j at bits 6j .. 6j + 5; :func:`six_bit_blocks`),
codes uint8 (N, K // 64 * 48) (row tiles: (N // T, K // 64, T * 48)). The kernel turns a block
into 64 int8 ``4 · (q - 32)`` (three AVX-512 VBMI operations: vpermb, vpmultishiftqb, one
ternary-logic op) and multiplies them by ``d · sc / 4``, which gives the same float32 weights
bit for bit (a power of two), then runs the int8 codes' body: 0.8203 bytes per value, the
file's (1.0703 with int8 codes, 1.25 with float32 scales per 16 too).

IQ4_XS (quant/iq4.py) keeps its first 8 bytes, d, scales_h, scales_l, as heads of
:data:`HEADX` bytes: ``scale`` uint8 (N, K // 256, 8), expanded into ``d · (sc - 32)`` per 32
(exact: 11 × 6 bits), its codes the file's: 0.53125 bytes per value, the file's.

Q4_K's 6-bit sc and m unpacking (ggml's get_scale_min_k4, gguf-py's Q4_K.get_scale_min):
bytes q[0..11], sub-block i < 4: sc = q[i] & 63, m = q[i + 4] & 63; i >= 4: sc = (q[i + 4] &
15) | (q[i - 4] >> 6) << 4, m = (q[i + 4] >> 4) | (q[i] >> 6) << 4.
"""

from __future__ import annotations

import numpy as np
import torch

from clearlm.quant.iq4 import HEADX, expand_xs

HEAD = 16  # bytes of one Q4_K head: d, dmin (float16), 12 bytes of 6-bit sc and m
HEAD6 = 18  # bytes of one Q6_K head: 16 int8 sc, d (float16)
SUPER = 256  # values per super-block
SIX, SIX_BYTES = 64, 48  # values and bytes of one code block of Q6_K's 6-bit codes


def is_heads(scale: torch.Tensor) -> bool:
    """Whether a Packed's ``scale`` holds K-quant super-block heads (uint8), not scales."""
    return scale.dtype == torch.uint8


def heads_tile(scale: torch.Tensor) -> int:
    """Rows per row tile of a heads tensor: (N, nS, 16) → 1, (N // T, nS, T, 16) → T."""
    return scale.shape[2] if scale.dim() == 4 else 1


def expand_heads(heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Row-major heads (N, nS, B) uint8 → Q4_K (B = 16): scale ``d · sc`` and min
    ``-(dmin · m)``, each (N, nS * 8) float32; Q6_K (B = 18): scale ``d · sc`` (N, nS * 16),
    min None; IQ4_XS (B = 8): scale ``d · (sc - 32)`` (N, nS * 8), min None. Sub-block i of
    super-block s in column s · blocks + i (exact products)."""
    n, ns = heads.shape[0], heads.shape[1]
    if heads.shape[2] == HEADX:
        return expand_xs(heads), None
    if heads.shape[2] == HEAD6:
        sc = heads[..., :16].contiguous().view(torch.int8).float()  # (N, nS, 16)
        d6 = heads[..., 16:18].contiguous().view(torch.float16).float()  # (N, nS, 1)
        return (d6 * sc).reshape(n, ns * 16), None
    d = heads[..., 0:2].contiguous().view(torch.float16).float()  # (N, nS, 1)
    dmin = heads[..., 2:4].contiguous().view(torch.float16).float()  # (N, nS, 1)
    q = heads[..., 4:16].to(torch.int32)  # (N, nS, 12)
    a, b, c = q[..., 0:4], q[..., 4:8], q[..., 8:12]  # (N, nS, 4) each
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1).float()  # (N, nS, 8)
    m = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1).float()  # (N, nS, 8)
    return (d * sc).reshape(n, ns * 8), (-(dmin * m)).reshape(n, ns * 8)


def six_bit_blocks(codes: np.ndarray) -> np.ndarray:
    """6-bit codes 0 .. 63 (n, ...) uint8 in value order, a multiple of 64 per row → the
    kernel's code blocks (n, values // 64 * 48) uint8: a little-endian stream of 6-bit fields,
    code j at bits 6j .. 6j + 5 (8 codes per 6 bytes)."""
    c = codes.reshape(codes.shape[0], -1, 8).astype(np.uint64)  # (n, groups, 8)
    v = (c << (6 * np.arange(8, dtype=np.uint64))).sum(axis=-1, dtype=np.uint64)  # (n, groups)
    b = v.astype("<u8").view(np.uint8).reshape(*v.shape, 8)[..., :6]  # (n, groups, 6)
    return np.ascontiguousarray(b).reshape(codes.shape[0], -1)


def six_bit_codes(blocks: torch.Tensor) -> torch.Tensor:
    """The kernel's 6-bit code blocks (..., 48) uint8 → their codes (..., 64) int64, 0 .. 63
    (:func:`six_bit_blocks` inverted)."""
    b = blocks.reshape(*blocks.shape[:-1], 8, 6).long()  # (..., 8 groups, 6 bytes)
    v = (b << (8 * torch.arange(6, device=blocks.device))).sum(-1, keepdim=True)  # (..., 8, 1)
    return ((v >> (6 * torch.arange(8, device=blocks.device))) & 63).flatten(-2)  # (..., 64)


def split_k(b: np.ndarray, six: bool, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K (``six`` False) or Q6_K blocks (n_blocks, type_size) uint8 of an (n, k) matrix →
    (codes, heads uint8 (n, k // 256, HEAD or HEAD6)). Q4_K: codes (n, k // 2) uint8, each 32
    values' nibbles in the kernel's 4-bit block (byte j = code j | code j + 16 << 4); Q6_K
    (ql[128] qh[64] sc[16] d): codes (n, k // 64 * 48), :func:`six_bit_blocks` of q."""
    nb = b.shape[0]
    if not six:  # d, dmin, sc/m (16 bytes) | qs[128]: 4 chunks of 64 values, low nibbles, high
        heads = torch.from_numpy(b[:, :HEAD].copy()).reshape(n, k // SUPER, HEAD)
        qs = b[:, HEAD:].reshape(nb, 4, 32)
        sub = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)  # (nb, 8 sub-blocks, 32)
        codes = (sub[..., :16] | (sub[..., 16:] << 4)).astype(np.uint8)  # (nb, 8, 16)
        return torch.from_numpy(codes.reshape(n, k // 2)), heads
    ql = b[:, :128].reshape(nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(nb, 8, 32)  # (nb, 8, 32) low 4 bits
    qh = b[:, 128:192].reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(nb, 8, 32)  # (nb, 8, 32) high 2 bits
    codes = six_bit_blocks(ql | (qh << 4))  # (nb, 4 code blocks × 48 bytes)
    heads = torch.from_numpy(b[:, 192:210].copy()).reshape(n, k // SUPER, HEAD6)  # sc, d
    return torch.from_numpy(codes.reshape(n, k // 64 * 48)), heads
