"""IQ4_NL and IQ4_XS: ggml's Q4_0 nibbles, valued through a 16-entry table.

An IQ4_NL block (ggml-common.h block_iq4_nl) is a float16 ``d`` and 16 bytes of 4-bit codes,
byte j holding code j in its low nibble and code j + 16 in its high one: Q4_0's layout. Only
the value of a code differs: ``d · kvalues[q]`` (the non-linear table below) instead of
``d · (q - 8)``. An IQ4_XS super-block (block_iq4_xs: 256 values) is ``d`` (float16), 6-bit
sub-scales ``sc`` per 32 (``scales_h`` uint16: 2 high bits each; ``scales_l[4]``: 4 low bits
each) and the same 16 code bytes per 32: value j of sub-block i is ``(d · (sc_i - 32)) ·
kvalues[q_j]``. gguf.quants computes both in float32, every product exact (11 × 6 × 7 bits:
at most 24), so the kernel's float32 scale times the table's value is the same number.

pack.py keeps both in the file's bytes, under the code layout ``bits = TABLE4`` (the 4-bit
layout of csrc/qgemv.cpp whose codes the kernel looks up in this table instead of centring):
IQ4_NL as Q4_0 is kept (codes (N, K // 2) uint8, ``scale`` d float16 (N, K // 32)); IQ4_XS as
Q4_K is (codes per 32 unchanged, the first :data:`HEADX` bytes of every super-block, d,
scales_h, scales_l, kept as its "heads" (N, K // 256, 8) uint8, which the kernel expands a band
of rows at a time into the float32 ``d · (sc - 32)`` per 32: quant/kheads.py). Memory: the
file's bytes. Row tiles, prefetch and the AVX-512 body are Q4_0's (a vpermps over the table);
the AVX2 body looks 16 codes up at once with pshufb on the int8 table. Products sum
``s_b · (x · kvalues[q])_b`` per block as Q4_0's do (tests/quant/test_quant_iq4.py).

int8 activations (linear.set_int8_activations) leave these layers exact, as before: the int8
kernel (csrc/qgemv_i8.cpp) has no body for table codes (llama.cpp has one: its IQ4 dot products
look the int8 values up with pshufb and multiply them by q8 activations); with float32
activations these formats already read at Q4_0's speed, and exact products are the default.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

TABLE4 = 14  # Packed.bits of 4-bit codes valued KVALUES[q] (pack.py's 4, 5, 8: other layouts)
HEADX = 8  # bytes of one IQ4_XS head: d (float16), scales_h (uint16), scales_l[4]
# ggml-common.h kvalues_iq4nl (gguf-py quants.py IQ4_NL.kvalues)
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def table_values(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0 .. 15 (any integer dtype, any shape) → KVALUES[code] float32, same shape."""
    table = torch.tensor(KVALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def expand_xs(heads: torch.Tensor) -> torch.Tensor:
    """IQ4_XS heads (N, nS, 8) uint8 → float32 scales d · (sc - 32) (N, nS * 8), sub-block i
    of super-block s in column 8s + i (exact products, as gguf.quants)."""
    n, ns = heads.shape[0], heads.shape[1]
    d = heads[..., 0:2].contiguous().view(torch.float16).float()  # (N, nS, 1)
    hi = heads[..., 2:4].to(torch.int32)  # (N, nS, 2): scales_h, little-endian
    hi = (hi[..., 0:1] | (hi[..., 1:2] << 8)) >> (2 * torch.arange(8))  # (N, nS, 8)
    lo = heads[..., 4:8].to(torch.int32)  # (N, nS, 4): scales_l
    lo = torch.stack([lo & 15, lo >> 4], dim=-1).reshape(n, ns, 8)  # (N, nS, 8)
    sc = (lo | ((hi & 3) << 4)) - 32  # (N, nS, 8): -32 .. 31
    return (d * sc.float()).reshape(n, ns * 8)


def split_iq4(b: np.ndarray, qtype: GGMLQuantizationType, n: int,
              k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4 blocks (n_blocks, type_size) uint8 of an (n, k) matrix → (codes (n, k // 2) uint8,
    scale): IQ4_NL's float16 d (n, k // 32); IQ4_XS's heads (n, k // 256, HEADX) uint8. Copies
    of the file's bytes: the codes are already Q4_0's nibbles, 16 bytes per 32 values."""
    if qtype == GGMLQuantizationType.IQ4_NL:  # d (f16), qs[16]
        d = b[:, :2].copy().view("<f2").reshape(n, k // 32)
        return torch.from_numpy(b[:, 2:].copy().reshape(n, k // 2)), torch.from_numpy(d)
    heads = b[:, :HEADX].copy().reshape(n, k // 256, HEADX)  # IQ4_XS: d, scales_h, scales_l
    return torch.from_numpy(b[:, HEADX:].copy().reshape(n, k // 2)), torch.from_numpy(heads)
