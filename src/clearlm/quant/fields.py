"""5-bit codes as bit fields: the layout row tiles hold Q5_0 / Q5_1 codes in.

ggml's 5-bit block (pack.py: 16 bytes of low nibbles, then a little-endian uint32 of fifth bits)
costs the AVX2 kernel seven vector operations per 8 codes: the nibble's mask or shift, a variable
shift, a mask and an or for the fifth bit, the centring, the conversion and the FMA. In row tiles
(quant/tiles.py) clearlm holds 5-bit codes as bit fields instead, which the kernel reads in four
(csrc/qgemv.cpp, dot_tile_fields: and, subtract, convert, FMA):

    field f = 4b + j of a row holds codes 8j .. 8j + 7 of block b, code 8j + l in 32-bit lane l;
    a 32-byte word (8 little-endian uint32 lanes) holds six fields, field f in word f // 6 at
    bits 5 (f % 6) .. 5 (f % 6) + 4 of every lane (bits 30-31, and the last word's unused
    fields, are 0). A row of nb blocks is W = ceil(4 nb / 6) words:
    codes (N, nb * 20) in ggml's layout  →  (N, W, 32) as fields  →  tiles (N // T, W, T * 32).

Where: :func:`preferred` (the kernel's AVX2 and plain C++ builds; not AVX-512, not the torch
fallback); ``tile_rows(..., fields=True)`` forces them. The codes are the same numbers
(unsigned, 0 .. 31; Q5_0's centring and Q5_1's min apply as before) and the kernel's products
are bit-identical (tests/quant/test_quant_tiles.py); the price is memory: 32 W bytes per row instead
of 20 nb (K = 896: 608 instead of 560 bytes, +8.6 %; K = 640: 448 instead of 400, +12 %).
Measured on AVX2 (AMD Zen 3, 1 thread, bench/quant_gemv.py shapes): a 9728 × 896 Q5_0 product
0.64× the time of ggml's layout. The kernel multiplies the codes, read as code · 2^p, by x ·
2^-p; where an activation is too small for that to be exact (0 < |x| < 2^-101) it shifts the
codes down instead (same products). Scales and mins must stay below 2^100 (a GGUF's are
float16: below 65,504).
"""

from __future__ import annotations

import torch

WORD = 32  # bytes per word: 8 uint32 lanes
PER_WORD = 6  # 5-bit fields per 32-bit lane
GGML_BLOCK = 20  # bytes of one ggml 5-bit block's codes: 16 nibble bytes, 4 bytes of fifth bits
CHUNK = 4096  # rows converted at a time (bounds the int32 temporaries: ~0.5 MB per row of 896)


def preferred() -> bool:
    """Whether row tiles hold 5-bit codes as bit fields here: where the C++ kernel is built and
    its build reads them with the body whose summation order ggml's layout also gets (AVX2 or
    plain C++: bit-identical products). An AVX-512 build keeps ggml's blocks (its 16-lane body
    sums in another order, and its table lookups already read the fifth bits cheaply), and so
    does the pure-torch fallback (no kernel: nothing to gain)."""
    from clearlm.quant.kernels import load_kernels

    kern = load_kernels()
    return kern is not None and bool(kern.fields_preferred())


def is_fields(codes: torch.Tensor, tile: int) -> bool:
    """Whether a 5-bit weight's tiled codes (N // tile, ·, tile · bytes) are bit fields."""
    return tile > 1 and codes.dim() == 3 and codes.shape[2] == tile * WORD


def words(nb: int) -> int:
    """32-byte words per row of ``nb`` blocks of 32 codes."""
    return -(-4 * nb // PER_WORD)


def to_fields(codes: torch.Tensor) -> torch.Tensor:
    """ggml-layout 5-bit codes (N, nb * 20) uint8 → bit fields (N, W, 32) uint8."""
    n = codes.shape[0]
    nb = codes.shape[1] // GGML_BLOCK
    out = torch.empty(n, words(nb), WORD, dtype=torch.uint8, device=codes.device)
    for r0 in range(0, n, CHUNK):
        out[r0 : r0 + CHUNK] = _to_fields(codes[r0 : r0 + CHUNK], nb)
    return out


def _to_fields(codes: torch.Tensor, nb: int) -> torch.Tensor:
    n, dev = codes.shape[0], codes.device
    c = codes.reshape(n, nb, GGML_BLOCK)
    lo = c[..., :16].to(torch.int32)
    q = torch.cat([lo & 0x0F, lo >> 4], dim=-1)  # (n, nb, 32): codes' low 4 bits
    bit = torch.arange(8, dtype=torch.int32, device=dev)
    high = (c[..., 16:, None].to(torch.int32) >> bit) & 1  # (n, nb, 4, 8): bit 8i + t of qh
    q |= high.reshape(n, nb, 32) << 4  # (n, nb, 32): 5-bit codes
    f = q.reshape(n, 4 * nb, 8)  # (n, fields, lanes): field 4b + j, lane l = code 8j + l
    w = words(nb)
    f = torch.nn.functional.pad(f, (0, 0, 0, PER_WORD * w - 4 * nb))  # (n, 6W, 8)
    at = 5 * torch.arange(PER_WORD, dtype=torch.int32, device=dev)[:, None]  # (6, 1)
    lanes = (f.reshape(n, w, PER_WORD, 8) << at).sum(2, dtype=torch.int32)  # (n, W, 8)
    return lanes.contiguous().view(torch.uint8).reshape(n, w, WORD)  # little-endian lanes


def from_fields(fields: torch.Tensor, nb: int) -> torch.Tensor:
    """Bit fields (N, W, 32) uint8 of rows of ``nb`` blocks → ggml's layout (N, nb * 20) uint8."""
    n, dev = fields.shape[0], fields.device
    w = fields.shape[1]
    lanes = fields.contiguous().view(torch.int32).reshape(n, w, 1, 8)  # (n, W, 1, 8)
    at = 5 * torch.arange(PER_WORD, dtype=torch.int32, device=dev)[:, None]  # (6, 1)
    q = ((lanes >> at) & 31).reshape(n, PER_WORD * w, 8)[:, : 4 * nb]  # (n, fields, 8)
    q = q.reshape(n, nb, 32)  # (n, nb, 32): 5-bit codes
    qs = (q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)  # (n, nb, 16): nibble bytes
    bit = torch.arange(8, dtype=torch.int32, device=dev)
    qh = (((q >> 4) & 1).reshape(n, nb, 4, 8) << bit).sum(-1, dtype=torch.int32)  # (n, nb, 4)
    return torch.cat([qs, qh], dim=-1).to(torch.uint8).reshape(n, nb * GGML_BLOCK)
