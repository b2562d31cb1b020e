"""Repack GGUF quantized blocks into the compact layout the kernel reads, without dequantizing.

Every supported type becomes *codes + one scale (+ one offset "min") per block of a row*:
``W[n, k] = scale[n, k // bs] * code[n, k] + min[n, k // bs]``, computed in float32 as one fused
multiply-add; without a min, 4/5-bit codes are centred as ggml's Q4_0 / Q5_0 define them,
``W = scale * (code - 8)`` or ``scale * (code - 16)`` (IQ4's: ``scale * kvalues[code]``), and
8-bit codes are signed. For every type below that expression reproduces
``gguf.quants.dequantize`` bit for bit, because ``scale * code`` is exact in float32 (a float16
scale has 11 significant bits, codes at most 7, sub-scales at most 8: ≤ 25 bits) and the
reference rounds the same sum once:

=======  =================================  ===========================  =====================
GGUF     codes                              scale / min (dtype, block)   bytes/value (file)
=======  =================================  ===========================  =====================
Q8_0     int8 q                             d / —        (f16, 32)       1.0625 (1.0625)
Q4_0     uint4 q, centred (q - 8)           d / —        (f16, 32)       0.5625 (0.5625)
Q4_1     uint4 q                            d / m        (f16, 32)       0.625  (0.625)
Q5_0     uint5 q, centred (q - 16): ggml's  d / —        (f16, 32)       0.6875 (0.6875)
         qs nibbles + qh
Q5_1     uint5 q                            d / m        (f16, 32)       0.75   (0.75)
Q4_K     uint4 q, repacked per 32           the file's d, dmin, 6-bit    0.5625 (0.5625)
                                            sc / m (quant/kheads.py)
Q6_K     uint6 q, centred (q - 32): 6-bit   the file's d, int8 sc        0.8203 (0.8203)
         fields, 64 per 48 bytes            (quant/kheads.py, 16)
Q3_K     uint3 q, centred (q - 4): 3-bit    the file's d, 6-bit sc       0.4297 (0.4297)
         fields, 64 per 24 bytes            (quant/kheads.py, 16)
Q2_K     uint2 q: 2-bit fields, 64 per 16   the file's d, dmin, 4-bit    0.3281 (0.3281)
         bytes                              sc / m (quant/kheads.py, 16)
IQ4_NL   uint4 q, valued kvalues[q]         d / —        (f16, 32)       0.5625 (0.5625)
IQ4_XS   uint4 q as IQ4_NL, per 32          the file's d, 6-bit sc       0.53125 (0.53125)
                                            (quant/kheads.py)
Q5_K     uint5 q as Q5_1's, per 32          as Q4_K's (quant/kheads.py)  0.6875 (0.6875)
IQ3_XXS  int8 q = grid point · sign         db / —   (f32, 32)           1.125  (0.3828)
IQ2_XS   (quant/lattice.py; IQ1_*, IQ2_*,   db / —   (f32, 16)           1.25   (0.2891)
         IQ3_S, TQ*: the same, per 16 / 32)
=======  =================================  ===========================  =====================

Why this form: one kernel with four code layouts (int8; nibbles; nibbles + a 32-bit high-bit
word, ggml's Q5 layout, the fifth bit one masked add per 16 codes; Q6_K's, Q3_K's and Q2_K's
fields, turned into int8 codes 64 at a time) covers the common types, and K-quants' two-level
scales collapse exactly into per-block float32 products (d·sc: 11 × 8 bits). Q4_0 and Q5_0 keep
the file's bytes: their offset is a fixed multiple of the scale, so the kernel computes
d·Σ(q - 16)·x per block (csrc/qgemv.cpp) with no min tensor; IQ4_NL is Q4_0 valued through IQ4's
16-value table (bits = TABLE4, quant/iq4.py). K-quants and IQ4_XS keep their super-blocks' heads
(d, dmin, sc, m as stored; quant/kheads.py), which the kernel turns into float32 d·sc (and
-dmin·m) 64 rows at a time in cache. The i-quants with lattice codebooks (IQ1_S, IQ1_M,
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and TQ1_0 / TQ2_0 become int8 codes with a float32 scale
per 16 or 32 values (quant/lattice.py: exact, but 9–10 bits a value for the file's 1.6–3.4).
F16 and BF16 matrices stay 16-bit: quant/half.py. Layouts:
ggml-common.h and gguf-py's quants.py. A compact load then arranges most matrices in row tiles
(quant/tiles.py), where 5-bit codes become bit fields (quant/fields.py: +8.6 % bytes at K = 896,
four vector operations per 8 codes instead of seven).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from clearlm.errors import ClearLMError
from clearlm.quant import kheads, lattice
from clearlm.quant.fields import WORD, from_fields, is_fields
from clearlm.quant.iq4 import TABLE4, split_iq4, table_values

Q = GGMLQuantizationType


class UnsupportedQuantError(ClearLMError):
    """A GGUF tensor type this module cannot keep compact (the caller keeps float32)."""


@dataclass(frozen=True)
class Packed:
    """A compact weight (N out, K in). codes: int8 (N, K) if bits == 8; uint8 (N, K // 2) if 4
    or TABLE4 (quant/iq4.py); uint8 (N, K // 32 * 20) if 5 (per block: 16 nibble bytes, then the
    high bits' uint32); uint8 (N, K // 64 * 8 · bits) if 6, 3 or 2 (Q6_K, Q3_K, Q2_K, block
    16: fields in code blocks of 64 values, tiled (N // T, K // 64, T * 8 · bits); kheads.py).
    scale / min: float16 or float32 (N, K // block); min None means 0 for 8-bit codes and
    centred 4/5-bit codes (W = scale * (code - 8) or (code - 16), ggml's Q4_0 / Q5_0).
    Row tiles (quant/tiles.py, the layout decode reads fastest): the same blocks, T rows
    interleaved block by block: codes (N // T, K // block, T * bytes per block), scale / min
    (N // T, K // block, T); 5-bit codes in tiles may be bit fields (quant/fields.py): codes
    (N // T, W, T * 32), W = ceil(4 * K // 32 / 6) words per row. Q4_K / Q6_K / Q3_K / IQ4_XS:
    scale = the file's super-block heads uint8 (N, K // 256, 16 / 18 / 14 / 8), tiled
    (N // T, K // 256, T, 16 / 18 / 14 / 8), min None (quant/kheads.py)."""

    codes: torch.Tensor
    scale: torch.Tensor
    min: torch.Tensor | None
    bits: int
    block: int
    qtype: str

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): output and input features."""
        per = kheads.SUPER if kheads.is_heads(self.scale) else self.block
        return self.scale.shape[0] * self.tile, self.scale.shape[1] * per

    @property
    def tile(self) -> int:
        """Rows per row tile: 1 for the row-major layout."""
        if kheads.is_heads(self.scale):
            return kheads.heads_tile(self.scale)
        return self.scale.shape[2] if self.scale.dim() == 3 else 1

    def nbytes(self) -> int:
        extra = self.min.nbytes if self.min is not None else 0
        return self.codes.nbytes + self.scale.nbytes + extra


REPACKED = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q3_K, Q.Q2_K,
            Q.IQ4_NL, Q.IQ4_XS)  # held at the file's bytes
WIDENED = tuple(lattice.BLOCK)  # lattice i-quants and TQ: int8 codes, above the file's bytes
SUPPORTED = REPACKED + WIDENED  # every type a compact load keeps compact


def _field(b: np.ndarray, start: int, fmt: str) -> np.ndarray:
    """One field of every block, contiguous: b (n_blocks, type_size) uint8, C-contiguous; fmt a
    numpy format at byte ``start`` ('<f2' → (n,) float16, little-endian as ggml stores it;
    'V16' → (n, 16) uint8). One copy through a structured view, 2-7× faster than copying a
    strided uint8 slice (6.7 M Q5_0 scales: 10 vs 71 ms)."""
    dt = np.dtype({"names": ["f"], "formats": [fmt], "offsets": [start], "itemsize": b.shape[1]})
    out = b.reshape(-1).view(dt)["f"].copy()
    return out.view(np.uint8).reshape(b.shape[0], -1) if fmt.startswith("V") else out


def _f16(b: np.ndarray, start: int = 0) -> np.ndarray:
    """The float16 at byte ``start`` of every block of b: (n_blocks,) float16."""
    return _field(b, start, "<f2")


def _q5_codes(b: np.ndarray, off: int) -> np.ndarray:
    """Q5 blocks → (n_blocks, 20) uint8: the 16 qs bytes at off + 4, then the 4 qh at off."""
    out = np.empty(b.shape[0], np.dtype([("qs", "V16"), ("qh", "V4")]))
    dt = np.dtype({"names": ["qh", "qs"], "formats": ["V4", "V16"], "offsets": [off, off + 4],
                   "itemsize": b.shape[1]})
    src = b.reshape(-1).view(dt)
    out["qs"], out["qh"] = src["qs"], src["qh"]
    return out.view(np.uint8).reshape(b.shape[0], 20)


def pack_blocks(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> Packed:
    """Repack raw GGUF bytes (uint8, any shape holding N rows) of a (N, K) matrix.

    raw: the reader's ``tensor.data`` (memory-mapped; read, never modified).
    Raises UnsupportedQuantError for other types or a K that is not a whole number of blocks."""
    qtype = Q(qtype)
    if qtype not in SUPPORTED:
        raise UnsupportedQuantError(f"cannot keep {qtype.name} compact; use --weights float32")
    n, k = shape
    block, type_size = GGML_QUANT_SIZES[qtype]
    if k % block:
        raise UnsupportedQuantError(f"row length {k} is not a multiple of {qtype.name}'s {block}")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, type_size)  # (n_blocks, type_size)
    per_row = k // 32

    def t(a: np.ndarray, cols: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).reshape(n, cols))

    if qtype == Q.Q8_0:
        codes = _field(b, 2, "V32").view(np.int8)
        return Packed(t(codes, k), t(_f16(b), per_row), None, 8, 32, "Q8_0")
    if qtype == Q.Q4_0:  # W = d * (q - 8): centred codes, no min
        return Packed(t(_field(b, 2, "V16"), k // 2), t(_f16(b), per_row), None, 4, 32, "Q4_0")
    if qtype in (Q.IQ4_NL, Q.IQ4_XS):  # Q4_0's nibbles valued kvalues[q] (quant/iq4.py)
        return Packed(*split_iq4(b, qtype, n, k), None, TABLE4, 32, qtype.name)
    if qtype in WIDENED:  # int8 codes, float32 scale per 16 or 32 (quant/lattice.py)
        codes, scales = lattice.int8_codes(b, qtype)
        bs = lattice.BLOCK[qtype]
        return Packed(t(codes, k), t(scales, k // bs), None, 8, bs, qtype.name)
    if qtype == Q.Q4_1:
        qs = _field(b, 4, "V16")
        return Packed(t(qs, k // 2), t(_f16(b), per_row), t(_f16(b, 2), per_row), 4, 32, "Q4_1")
    if qtype in (Q.Q5_0, Q.Q5_1):  # kept as ggml stores them: qs (16 bytes) then qh (4 bytes)
        d, off = _f16(b), 2 if qtype == Q.Q5_0 else 4
        codes = _q5_codes(b, off)  # (nb, 20)
        mn = t(_f16(b, 2), per_row) if qtype == Q.Q5_1 else None  # Q5_0: W = d * (q - 16)
        return Packed(t(codes, k // 32 * 20), t(d, per_row), mn, 5, 32, qtype.name)
    # Q4_K / Q5_K (codes repacked per 32), Q6_K / Q3_K / Q2_K (field codes): the file's heads
    codes, heads = kheads.split_k(b, qtype.value, n, k)
    bits = {Q.Q5_K: 5, Q.Q6_K: 6, Q.Q3_K: 3, Q.Q2_K: 2}.get(qtype, 4)
    return Packed(codes, heads, None, bits, 16 if bits in kheads.FIELD_BITS else 32, qtype.name)


def block_bytes(p: Packed) -> int:
    """Bytes of one code block: int8 codes 1 per value, 4-bit 16, 5-bit 20, Q6_K's 6-bit
    codes 48, Q3_K's 3-bit 24 and Q2_K's 2-bit 16 (code blocks of 64 values:
    :func:`code_blocks`)."""
    return p.block if p.bits == 8 else {4: 16, TABLE4: 16, 5: 20, 6: 48, 3: 24, 2: 16}[p.bits]


def code_blocks(p: Packed) -> int:
    """Code blocks per row: K // block, except Q6_K's / Q3_K's field codes (bits 6 / 3), whose
    code blocks hold 64 values (4 scale blocks of 16; kheads.py)."""
    return p.shape[1] // (kheads.FIELD if p.bits in kheads.FIELD_BITS else p.block)


def untile_rows(p: Packed) -> Packed:
    """The row-major form of a tiled ``p`` (new tensors); a row-major ``p`` as it is."""
    if p.tile == 1:
        return p
    tile, n = p.tile, p.shape[0]
    nb, bpb = code_blocks(p), block_bytes(p)
    if p.bits == 5 and is_fields(p.codes, tile):  # (N // T, W, T * 32) → (N, W, 32) → ggml's
        w = p.codes.shape[1]
        codes = from_fields(p.codes.reshape(n // tile, w, tile, WORD).transpose(1, 2)
                            .reshape(n, w, WORD), nb)
    else:
        codes = p.codes.reshape(n // tile, nb, tile, bpb).transpose(1, 2).reshape(n, nb * bpb)

    def per_block(s: torch.Tensor) -> torch.Tensor:  # (tiles, nS, rows, ...) → (N, nS, ...)
        return s.transpose(1, 2).reshape(n, s.shape[1], *s.shape[3:])

    mn = None if p.min is None else per_block(p.min).contiguous()
    return Packed(codes.contiguous(), per_block(p.scale).contiguous(), mn, p.bits, p.block,
                  p.qtype)


def select_rows(p: Packed, rows: torch.Tensor) -> Packed:
    """Rows ``rows`` (int64 (R,)) of ``p`` as a row-major Packed of R rows: an embedding
    lookup reads a tiled table without untiling it."""
    if p.tile == 1:
        mn = None if p.min is None else p.min[rows]
        return Packed(p.codes[rows], p.scale[rows], mn, p.bits, p.block, p.qtype)
    tile = p.tile
    nb, bpb = code_blocks(p), block_bytes(p)
    t, r = rows // tile, rows % tile  # (R,) tile and row within it
    if p.bits == 5 and is_fields(p.codes, tile):  # the rows' words, back to ggml's layout
        codes = from_fields(p.codes.view(-1, p.codes.shape[1], tile, WORD)[t, :, r], nb)
    else:
        codes = p.codes.view(-1, nb, tile, bpb)[t, :, r]  # (R, nb, bpb)

    def per_block(s: torch.Tensor) -> torch.Tensor:
        return s[t, :, r]  # (R, nb, ...)

    mn = None if p.min is None else per_block(p.min)
    return Packed(codes.reshape(rows.shape[0], nb * bpb), per_block(p.scale), mn, p.bits, p.block,
                  p.qtype)


def dequantize_packed(p: Packed) -> torch.Tensor:
    """Pure-torch float32 (N, K) weight: the reference for tests and the no-compiler fallback."""
    p = untile_rows(p)
    n, k = p.shape
    nb = k // p.block
    if kheads.is_heads(p.scale):  # K-quants: the float32 d·sc (and -dmin·m) per block (kheads.py)
        p = Packed(p.codes, *kheads.expand_heads(p.scale), p.bits, p.block, p.qtype)
    if p.bits == 8:
        q = p.codes.view(n, nb, p.block).float()  # (N, nb, bs)
    elif p.bits in kheads.FIELD_BITS:  # Q6_K / Q3_K centred (q - 32 / 4), Q2_K as they are
        c = p.codes.view(n, k // kheads.FIELD, 8 * p.bits)  # (N, code blocks, bytes)
        q = kheads.field_codes(c, p.bits).view(n, nb, p.block).float()
        q = q if p.bits == 2 else q - 2 ** (p.bits - 1)
    else:
        c = p.codes.view(n, nb, 20 if p.bits == 5 else 16)
        q = torch.cat([c[..., :16] & 0x0F, c[..., :16] >> 4], dim=-1)  # (N, nb, 32) codes
        q = table_values(q) if p.bits == TABLE4 else q.float()  # IQ4: kvalues[q] (iq4.py)
        if p.bits == 5:  # bit j of the little-endian uint32 qh is bit 4 of code j
            hb = c[..., 16:].long() << torch.tensor([0, 8, 16, 24])  # (N, nb, 4)
            qh = hb.sum(-1, keepdim=True)  # (N, nb, 1)
            q = q + 16 * ((qh >> torch.arange(32)) & 1).float()
        if p.min is None and p.bits != TABLE4:  # centred codes (Q4_0, Q5_0)
            q = q - (8 if p.bits == 4 else 16)
    w = q * p.scale.float()[..., None]  # exact products
    if p.min is not None:
        w = w + p.min.float()[..., None]  # one rounding, as the reference
    return w.reshape(n, k)


class PackedModule(nn.Module):
    """A module that holds one :class:`Packed` weight as buffers, so ``state_dict``, ``.to()``
    and sharing one table between tied modules work: ``codes``, ``scale`` and ``min`` (an empty
    tensor for formats without a per-block offset). QuantLinear and QuantEmbedding build on it.
    """

    def __init__(self, packed: Packed) -> None:
        super().__init__()
        self.bits, self.block, self.qtype = packed.bits, packed.block, packed.qtype
        self.register_buffer("codes", packed.codes)
        self.register_buffer("scale", packed.scale)
        empty = torch.empty(0, dtype=packed.scale.dtype)
        self.register_buffer("min", packed.min if packed.min is not None else empty)

    def packed(self, rows: torch.Tensor | None = None) -> Packed:
        """The weight as a Packed, or only the given rows (an int64 index tensor (R,)) as a
        row-major Packed of R rows, whatever the weight's layout."""
        mn = self.min if self.min.numel() else None
        whole = Packed(self.codes, self.scale, mn, self.bits, self.block, self.qtype)
        return whole if rows is None else select_rows(whole, rows)
