"""The i-quants with lattice codebooks (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and
the ternary TQ1_0 / TQ2_0 as int8 codes with one float32 scale per block of 16 or 32 values.

Each of these types stores, per 256-value super-block, a float16 ``d``, small sub-scales and, for
every 8 (or 4) values, an index into a fixed grid of points with small integer coordinates, plus
sign bits (ggml-common.h; gguf-py's quants.py dequantizes them). Every value is therefore

    W = db · q,   q a small integer:  IQ2_*: q ∈ ±{8, 25, 43}, db = d·(0.5 + s)·0.25
                                     IQ3_XXS: q ∈ ±{4, 12, …, 62}, db = d·(0.5 + s)·0.5
                                     IQ3_S: q ∈ ±{1, 3, …, 15}, db = d·(1 + 2s)
                                     IQ1_*: q = 8·(g + δ) ∈ {±1, ±7, ±9}, db = d·(2s + 1) / 8
                                     TQ*: q ∈ {-1, 0, 1}, db = d

and db·q is exact in float32 (d has 11 significant bits, the sub-scale factor at most 5, q at
most 6: ≤ 22 bits), so int8 codes q with float32 scales db, which the kernel's Q8_0 path
multiplies (bits 8, blocks of 16 or 32: csrc/qgemv.cpp), give gguf's dequantized values bit for
bit. :func:`int8_codes` takes the values from ``gguf.quants.dequantize`` itself, the scales from
the blocks as gguf computes them, and checks every value is its scale times an integer.

This holds 9 bits a value (10 with blocks of 16) where the file holds 1.6–3.4: less than float32's
32, but not the file's bytes (a codebook kernel would be). Memory per type: :data:`BLOCK`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from clearlm.errors import ClearLMError

Q = GGMLQuantizationType

# values per scale: the type's sub-scale block (TQ: one d per 256, repeated per 32)
BLOCK = {Q.IQ1_S: 32, Q.IQ1_M: 16, Q.IQ2_XXS: 32, Q.IQ2_XS: 16, Q.IQ2_S: 16, Q.IQ3_XXS: 32,
         Q.IQ3_S: 32, Q.TQ1_0: 32, Q.TQ2_0: 32}


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block, as float32 (n_blocks, 1)."""
    return b[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(b: np.ndarray) -> np.ndarray:
    """(n, m) uint8 → (n, 2m): each byte's low nibble, then its high one (gguf's order)."""
    return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1)


def block_scales(b: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """The float32 scale db of every block of :data:`BLOCK` values, as gguf-py's quants.py
    computes it (same operations, same order): b (n_blocks, type_size) uint8 →
    (n_blocks, 256 // BLOCK[qtype]) float32. IQ1's scales are divided by 8 (exact) so that its
    codes 8·(g + δ) are integers."""
    half = np.float32(0.5)
    if qtype == Q.IQ2_XXS:  # per 32 values: the top 4 bits of the second uint32 of 8 bytes
        aux = b[:, 2:66].copy().view(np.uint32).reshape(-1, 8, 2)[..., 1]
        return _f16(b, 0) * (half + (aux >> 28).astype(np.float32)) * np.float32(0.25)
    if qtype == Q.IQ2_XS:  # d, qs (64 bytes), 16 scale nibbles
        return _f16(b, 0) * (half + _nibbles(b[:, 66:74])) * np.float32(0.25)
    if qtype == Q.IQ2_S:  # d, qs (32), signs (32), qh (8), 16 scale nibbles
        return _f16(b, 0) * (half + _nibbles(b[:, 74:82])) * np.float32(0.25)
    if qtype == Q.IQ3_XXS:  # d, qs (64), 8 uint32 of signs with the scale in the top 4 bits
        aux = b[:, 66:98].copy().view(np.uint32)
        return _f16(b, 0) * (half + (aux >> 28).astype(np.float32)) * half
    if qtype == Q.IQ3_S:  # d, qs (64), qh (8), signs (32), 8 scale nibbles
        return _f16(b, 0) * (1 + 2 * _nibbles(b[:, 106:110]))
    if qtype == Q.IQ1_S:  # d, qs (32), 8 uint16 qh with the scale in bits 12..14
        qh = b[:, 34:50].copy().view(np.uint16)
        return _f16(b, 0) * (2 * ((qh >> 12) & 7) + 1) * np.float32(0.125)
    if qtype == Q.IQ1_M:  # qs (32), qh (16), 4 uint16: 3-bit scales, d in their top nibbles
        sc = b[:, 48:56].copy().view(np.uint16)
        d = sc & np.uint16(0xF000)
        d = (d[:, 0] >> 12) | (d[:, 1] >> 8) | (d[:, 2] >> 4) | d[:, 3]
        d = d.view(np.float16).astype(np.float32)[:, None]
        s = (sc[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
        return d * (2 * s.reshape(-1, 16) + 1) * np.float32(0.125)
    if qtype in (Q.TQ1_0, Q.TQ2_0):  # one d per 256 values, at the block's end
        return np.repeat(_f16(b, GGML_QUANT_SIZES[qtype][1] - 2), 8, axis=1)
    raise ValueError(f"{qtype.name} is not a lattice type")


def int8_codes(b: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """Blocks b (n_blocks, type_size) uint8 → (codes int8 (n_blocks, 256), scales float32
    (n_blocks, 256 // BLOCK[qtype])) with codes · scales == gguf's dequantized values bit for bit.

    Blocks whose scale is 0 or not finite (a corrupt file's) get codes 0: their values are 0,
    or NaN / inf either way.

    Raises:
        ClearLMError: a value that is not its scale times an integer in int8's range (cannot
            happen for these formats' blocks; checked all the same, since it is cheap).
    """
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        values = dequantize(b, qtype).reshape(b.shape[0], -1, BLOCK[qtype])  # (nb, scales, bs)
        scales = block_scales(b, qtype)  # (nb, scales)
        usable = np.isfinite(scales) & (scales != 0)
        q = np.where(usable[..., None], np.rint(values / scales[..., None]), 0)
        ok = ~usable[..., None] | ((q * scales[..., None] == values) & (np.abs(q) <= 127))
    if not ok.all():
        raise ClearLMError(f"{qtype.name} block values are not int8 multiples of their scales")
    return q.astype(np.int8).reshape(b.shape[0], -1), scales
