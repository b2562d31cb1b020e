"""GGUF blocks kept as the file stores them: Q5_K.

These formats' two-level scales do not collapse into one float16 scale per block, and turning
them into float32 scales per 16 or 32 values (as pack.py does for Q4_K and Q6_K) would cost
1.3-1.7× the file's bytes. So a weight keeps each block's bytes exactly: the float16 super-block
scale ``d`` (and ``dmin`` where the format has one) moved into ``scale`` / ``min`` tensors
(N, K // block) float16, every other byte of the block (sub-block scales, codes) as ``codes``
(N, K // block * rest) uint8, in the block's own order. Memory: the file's bytes, exactly.

The kernel (csrc/qgemv_raw.cpp) rebuilds each block's weights in registers with the float32
operations ``gguf.quants.dequantize`` does (ggml-common.h's layouts, gguf-py's quants.py):

=======  =====  ======================================  ================================
GGUF     block  codes (bytes after d / dmin)            weight
=======  =====  ======================================  ================================
Q5_K     256    scales[12] qh[32] qs[128]               (d·sc)·q - (dmin·m), q 5-bit
=======  =====  ======================================  ================================

Every product in brackets and every product with a code is exact in float32 (a float16 scale has
11 significant bits, sub-scales at most 6, codes at most 5: ≤ 22 bits), so the only rounding is
the one subtraction of the min, done once by the reference and once by the kernel's fused
multiply-add: the same float32 values bit for bit (tests/quant/test_quant_raw.py). Without the
kernel, :func:`dequantize_raw` puts the blocks back together and calls ``gguf.quants.dequantize``
itself.

Speed: the kernel unpacks 16 codes at a time in vector registers (loops unrolled, the sub-block
scales computed 16 at a time) and, for a decode product (M = 1), feeds them
straight into the row's sums instead of through a block buffer (the same sums in the same
order). A 896 × 4864 decode product (1 thread, AVX-512, weights in cache, best of 30, on a
shared, busy machine: ±30 %), before → after: Q2_K 0.96 → 0.51 ms, Q3_K 1.28 → 1.09, Q5_K
1.07 → 0.79 (earlier, idle: Q5_1 0.40, Q4_K 0.24 and float32 F.linear 0.31-0.46); from memory,
where decode spends its time, they read the fewest bytes. int8 activations
(linear.set_int8_activations) leave these layers exact: the int8 kernel has no body for them.
IQ4_NL and IQ4_XS, once kept here too, are Q4_0's layout with a table of values (quant/iq4.py)
and go through the main kernel, at Q4_0's speed; Q3_K (1.09 ms above) goes through it as 3-bit
field codes, as Q6_K's 6-bit ones, and Q2_K (0.51 ms) as 2-bit field codes (quant/kheads.py).

A format is named in a Packed by ``bits`` = RAW_BASE + its GGML type id (pack.py's 4, 5, 8 name
the repacked code layouts).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

Q = GGMLQuantizationType
RAW_BASE = 100  # bits = RAW_BASE + GGML type id: a block kept as the file stores it

# type → (byte of d, byte of dmin or None): the block's other bytes are its codes, in order
FIELDS: dict[GGMLQuantizationType, tuple[int, int | None]] = {
    Q.Q5_K: (0, 2),
}
RAW_TYPES = tuple(FIELDS)


def is_raw(bits: int) -> bool:
    """Whether a Packed's ``bits`` names a block kept as the file stores it (not 4, 5 or 8)."""
    return bits >= RAW_BASE


def raw_type(bits: int) -> GGMLQuantizationType:
    """The GGML type a raw ``bits`` value names."""
    return Q(bits - RAW_BASE)


def rest_span(qtype: GGMLQuantizationType) -> tuple[int, int]:
    """(first byte, byte count) of a block's codes: the bytes that are not d / dmin (those
    lead or trail the block in every format here, so the rest is one run)."""
    d, dmin = FIELDS[qtype]
    size = GGML_QUANT_SIZES[qtype][1]
    scales = 2 if dmin is None else 4
    return (scales, size - scales) if d == 0 else (0, size - scales)


def code_bytes(bits: int) -> int:
    """Bytes of one block's codes for a raw ``bits`` value."""
    return rest_span(raw_type(bits))[1]


def split_blocks(b: np.ndarray, qtype: GGMLQuantizationType):
    """Blocks (n_blocks, type_size) uint8 → codes (n_blocks, rest) uint8, d (n_blocks,) float16,
    dmin (n_blocks,) float16 or None: copies of the fields (fresh arrays)."""
    d_at, dmin_at = FIELDS[qtype]
    start, n = rest_span(qtype)

    def f16(at: int) -> np.ndarray:
        return b[:, at : at + 2].copy().view("<f2")[:, 0]

    dmin = None if dmin_at is None else f16(dmin_at)
    return b[:, start : start + n].copy(), f16(d_at), dmin


def join_blocks(codes: np.ndarray, d: np.ndarray, dmin: np.ndarray | None,
                qtype: GGMLQuantizationType) -> np.ndarray:
    """The inverse of :func:`split_blocks`: (n_blocks, type_size) uint8 blocks as in the file."""
    d_at, dmin_at = FIELDS[qtype]
    start, n = rest_span(qtype)
    out = np.empty((codes.shape[0], GGML_QUANT_SIZES[qtype][1]), np.uint8)
    out[:, start : start + n] = codes
    out[:, d_at : d_at + 2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    if dmin_at is not None and dmin is not None:
        out[:, dmin_at : dmin_at + 2] = dmin.astype("<f2").view(np.uint8).reshape(-1, 2)
    return out


def dequantize_raw(codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor | None,
                   bits: int) -> torch.Tensor:
    """Row-major raw weight → float32 (N, K) with gguf's own dequantization (the reference, and
    the path without the kernel). codes (N, nb * rest) uint8, scale / mn (N, nb) float16."""
    qtype = raw_type(bits)
    n, nb = scale.shape
    rest = code_bytes(bits)
    blocks = join_blocks(codes.reshape(n * nb, rest).numpy(), scale.reshape(-1).numpy(),
                         None if mn is None else mn.reshape(-1).numpy(), qtype)
    with np.errstate(invalid="ignore", over="ignore"):  # garbage scales: NaN, said elsewhere
        w = dequantize(blocks, qtype)  # (n * nb, block) float32
    return torch.from_numpy(np.ascontiguousarray(w).reshape(n, -1))
