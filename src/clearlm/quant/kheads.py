"""K-quants' (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) and IQ4_XS's two-level scales kept as the file stores
them.

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

Q5_K (block_q5_K: Q4_K's 16 bytes of d, dmin, sc and m, then qh[32] and qs[128], 5-bit codes,
``w = float32(d · sc_i) · q_j - float32(dmin · m_i)``) keeps the same heads and its codes in the
kernel's 5-bit blocks (ggml's Q5_0 / Q5_1 layout, pack.py: per 32 values 16 nibble bytes and a
little-endian uint32 of fifth bits): 0.6875 bytes per value, the file's.

Q6_K (block_q6_K: 6-bit codes q, 16 int8 sub-scales sc, one per 16 values, float16 ``d``;
``w = float32(d · sc_i) · (q_j - 32)``, exact: 11 × 8 bits) keeps its scale bytes as heads of
18 bytes, the file's sc[16] then d: ``scale`` uint8 (N, K // 256, 18), expanded by the kernel
as Q4_K's; and its codes at 6 bits (pack.py): code blocks of 64 values, 48 bytes each, a
little-endian stream of 6-bit fields (code j at bits 6j .. 6j + 5; :func:`field_blocks`),
codes uint8 (N, K // 64 * 48) (row tiles: (N // T, K // 64, T * 48)). The kernel turns a block
into 64 int8 ``4 · (q - 32)`` (three AVX-512 VBMI operations: vpermb, vpmultishiftqb, one
ternary-logic op) and multiplies them by ``d · sc / 4``, which gives the same float32 weights
bit for bit (a power of two), then runs the int8 codes' body: 0.8203 bytes per value, the
file's (1.0703 with int8 codes, 1.25 with float32 scales per 16 too).

Q3_K (block_q3_K: hmask[32], qs[64], 12 bytes of 6-bit sub-scales, float16 ``d``; code j of
sub-block i (16 values) q = low 2 bits + 4 · high bit, ``w = float32(d · (sc_i - 32)) · (q_j -
4)``, exact: 11 × 6 × 3 bits) keeps its last 14 bytes, the sub-scales then d, as heads of
:data:`HEAD3` bytes (``scale`` uint8 (N, K // 256, 14)) and its codes as Q6_K's, at 3 bits: code
blocks of 64 values, 24 bytes each (:func:`field_blocks` with width 3; the hmask and qs bit
planes put back in value order). The kernel reads them as Q6_K's (int8 ``32 · (q - 4)``): 0.4297
bytes per value, the file's (1.25 with float32 scales per 16 and int8 codes).

Q2_K (block_q2_K: 16 bytes of 4-bit sub-scales sc (low nibble) and sub-mins m (high nibble),
qs[64], float16 ``d`` and ``dmin``; ``w = float32(d · sc_i) · q_j - float32(dmin · m_i)``, q 2
bits, both products exact) keeps its sub-scales, d and dmin as heads of :data:`HEAD2` bytes
(``scale`` uint8 (N, K // 256, 20), expanded into scale ``d · sc`` and min ``-(dmin · m)`` per
16) and its codes as 2-bit fields, 64 values per 16 bytes, in value order (not centred: the
kernel rebuilds ``fmaf(d · sc, q, -(dmin · m))``, one rounding as the reference): 0.3281 bytes
per value, the file's.

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

Q2_K, Q3_K, Q5_K, Q6_K = 10, 11, 13, 14  # GGML type ids (gguf.GGMLQuantizationType)

HEAD = 16  # bytes of one Q4_K head: d, dmin (float16), 12 bytes of 6-bit sc and m
HEAD6 = 18  # bytes of one Q6_K head: 16 int8 sc, d (float16)
HEAD3 = 14  # bytes of one Q3_K head: 12 bytes of 6-bit sc, d (float16)
HEAD2 = 20  # bytes of one Q2_K head: 16 bytes of 4-bit sc and m, d, dmin (float16)
SUPER = 256  # values per super-block
FIELD = 64  # values per code block of field codes (Q6_K's, Q3_K's, Q2_K's): 8 · width bytes
FIELD_BITS = (2, 3, 6)  # Packed.bits of field codes: their width; 3 and 6 centred (q - 2^(w-1))


def is_heads(scale: torch.Tensor) -> bool:
    """Whether a Packed's ``scale`` holds K-quant super-block heads (uint8), not scales."""
    return scale.dtype == torch.uint8


def heads_tile(scale: torch.Tensor) -> int:
    """Rows per row tile of a heads tensor: (N, nS, 16) → 1, (N // T, nS, T, 16) → T."""
    return scale.shape[2] if scale.dim() == 4 else 1


def q3_k_scales(q: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes of 6-bit sub-scales (..., 12) uint8 → the 16 sub-scales (..., 16) int32,
    0 .. 63 (ggml's dequantize_row_q3_K with kmask1 / kmask2, gguf-py's Q3_K: sub-scale i's low 4
    bits in nibble i // 8 of byte i % 8, its high 2 bits at bit 2 · (i // 4) of byte 8 + i % 4)."""
    q = q.to(torch.int32)
    lo = torch.cat([q[..., :8] & 15, q[..., :8] >> 4], dim=-1)  # (..., 16) low 4 bits
    shifts = torch.arange(4, device=q.device).repeat_interleave(4) * 2  # (16,) 0,0,0,0,2,..,6
    hi = (q[..., 8:12].repeat(*([1] * (q.dim() - 1)), 4) >> shifts) & 3  # (..., 16) high 2 bits
    return lo | (hi << 4)


def expand_heads(heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Row-major heads (N, nS, B) uint8 → Q4_K (B = 16): scale ``d · sc`` and min
    ``-(dmin · m)``, each (N, nS * 8) float32; Q6_K (B = 18): scale ``d · sc`` (N, nS * 16),
    min None; Q3_K (B = 14): scale ``d · (sc - 32)`` (N, nS * 16), min None; Q2_K (B = 20):
    scale ``d · sc`` and min ``-(dmin · m)`` (N, nS * 16); IQ4_XS (B = 8):
    scale ``d · (sc - 32)`` (N, nS * 8), min None. Sub-block i of super-block s in column
    s · blocks + i (exact products)."""
    n, ns = heads.shape[0], heads.shape[1]
    if heads.shape[2] == HEADX:
        return expand_xs(heads), None
    if heads.shape[2] == HEAD2:
        q = heads[..., :16].to(torch.int32)  # (N, nS, 16)
        d2 = heads[..., 16:18].contiguous().view(torch.float16).float()  # (N, nS, 1)
        dmin = heads[..., 18:20].contiguous().view(torch.float16).float()  # (N, nS, 1)
        return (d2 * (q & 15).float()).reshape(n, ns * 16), (-(dmin * (q >> 4).float())).reshape(
            n, ns * 16)
    if heads.shape[2] == HEAD3:
        sc = (q3_k_scales(heads[..., :12]) - 32).float()  # (N, nS, 16)
        d3 = heads[..., 12:14].contiguous().view(torch.float16).float()  # (N, nS, 1)
        return (d3 * sc).reshape(n, ns * 16), None
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


def field_blocks(codes: np.ndarray, width: int) -> np.ndarray:
    """``width``-bit codes (n, ...) uint8 in value order, a multiple of 64 per row → the kernel's
    code blocks (n, values // 64 * 8 * width) uint8: a little-endian stream of ``width``-bit
    fields, code j at bits width · j .. width · j + width - 1 (8 codes per ``width`` bytes)."""
    c = codes.reshape(codes.shape[0], -1, 8).astype(np.uint64)  # (n, groups, 8)
    v = (c << (width * np.arange(8, dtype=np.uint64))).sum(axis=-1, dtype=np.uint64)  # (n, groups)
    b = v.astype("<u8").view(np.uint8).reshape(*v.shape, 8)[..., :width]  # (n, groups, width)
    return np.ascontiguousarray(b).reshape(codes.shape[0], -1)


def field_codes(blocks: torch.Tensor, width: int) -> torch.Tensor:
    """The kernel's code blocks (..., 8 · width) uint8 → their codes (..., 64) int64, 0 ..
    2^width - 1 (:func:`field_blocks` inverted)."""
    b = blocks.reshape(*blocks.shape[:-1], 8, width).long()  # (..., 8 groups, width bytes)
    v = (b << (8 * torch.arange(width, device=blocks.device))).sum(-1, keepdim=True)  # (..., 8, 1)
    mask = (1 << width) - 1
    return ((v >> (width * torch.arange(8, device=blocks.device))) & mask).flatten(-2)  # (..., 64)


def split_k(b: np.ndarray, qtype: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K, Q5_K, Q6_K, Q3_K or Q2_K blocks (n_blocks, type_size) uint8 of an (n, k) matrix
    (``qtype`` the GGML type id) → (codes, heads uint8 (n, k // 256, HEAD, HEAD6, HEAD3 or
    HEAD2)). Q5_K (d, dmin, sc/m, qh[32], qs[128]): codes (n, k // 32 * 20), per 32 values
    the kernel's 5-bit block (16 nibble bytes as Q4_K's, then the little-endian uint32 of
    fifth bits). Q4_K: codes (n, k // 2) uint8, each 32 values' nibbles in the kernel's
    4-bit block (byte j = code j | code j + 16 << 4); Q6_K (ql[128] qh[64] sc[16] d): codes
    (n, k // 64 * 48), :func:`field_blocks` of q at 6 bits; Q3_K (hmask[32] qs[64] sc[12]
    d): codes (n, k // 64 * 24), :func:`field_blocks` of q at 3 bits; Q2_K (sc[16] qs[64] d
    dmin): codes (n, k // 64 * 16) at 2 bits."""
    nb = b.shape[0]
    shift = np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)  # 4h + j
    if qtype == Q2_K:  # value 128h + 32j + l: qs[32h + l] >> 2j (2 bits)
        low = b[:, 16:80].reshape(nb, 2, 1, 32) >> (2 * (shift % 4))  # (nb, 2, 4, 32)
        codes = field_blocks((low & 3).reshape(nb, SUPER), 2)  # (nb, 4 code blocks × 16 bytes)
        heads = np.concatenate([b[:, :16], b[:, 80:84]], axis=1)  # (nb, 20): sc, d, dmin
        return (torch.from_numpy(codes.reshape(n, k // FIELD * 16)),
                torch.from_numpy(heads).reshape(n, k // SUPER, HEAD2))
    if qtype == Q3_K:  # value 128h + 32j + l: qs[32h + l] >> 2j (2 bits), hmask[l] bit 4h + j
        low = b[:, 32:96].reshape(nb, 2, 1, 32) >> (2 * (shift % 4))  # (nb, 2, 4, 32)
        high = b[:, :32].reshape(nb, 1, 1, 32) >> shift  # (nb, 2, 4, 32)
        q = ((low & 3) | ((high & 1) << 2)).reshape(nb, SUPER)  # (nb, 256) 3-bit codes
        codes = field_blocks(q, 3)  # (nb, 4 code blocks × 24 bytes)
        heads = torch.from_numpy(b[:, 96:110].copy()).reshape(n, k // SUPER, HEAD3)  # sc, d
        return torch.from_numpy(codes.reshape(n, k // FIELD * 24)), heads
    if qtype != Q6_K:  # Q4_K / Q5_K: d, dmin, sc/m (16 bytes) [| qh[32]] | qs[128]: 4 chunks of 64
        heads = torch.from_numpy(b[:, :HEAD].copy()).reshape(n, k // SUPER, HEAD)
        qs = b[:, -128:].reshape(nb, 4, 32)  # low nibbles: sub-block 2c, high: 2c + 1
        sub = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)  # (nb, 8 sub-blocks, 32)
        codes = (sub[..., :16] | (sub[..., 16:] << 4)).astype(np.uint8)  # (nb, 8, 16)
        if qtype == Q5_K:  # fifth bit of code l of sub-block j: bit j of qh[l]
            high = (b[:, 16:48].reshape(nb, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1
            qh = np.packbits(high, axis=-1, bitorder="little")  # (nb, 8, 4): uint32, bit l
            return torch.from_numpy(np.concatenate([codes, qh], -1).reshape(n, k // 32 * 20)), heads
        return torch.from_numpy(codes.reshape(n, k // 2)), heads
    ql = b[:, :128].reshape(nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(nb, 8, 32)  # (nb, 8, 32) low 4 bits
    qh = b[:, 128:192].reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(nb, 8, 32)  # (nb, 8, 32) high 2 bits
    codes = field_blocks(ql | (qh << 4), 6)  # (nb, 4 code blocks × 48 bytes)
    heads = torch.from_numpy(b[:, 192:210].copy()).reshape(n, k // SUPER, HEAD6)  # sc, d
    return torch.from_numpy(codes.reshape(n, k // FIELD * 48)), heads
