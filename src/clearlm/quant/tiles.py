"""Row tiles: a packed weight's blocks rearranged so a decode product reads one stream.

The row-major layout (pack.py) stores row n's blocks one after another. The kernel computes
several output rows at once, sharing each load of x, so row-major it reads one stream per row;
on an AMD Zen 4 (2 cores) a 262,144 × 640 Q8_0 product read 7.5 GB/s on one core (14.7 on
two) that way, and 11.6 (23.0 on two) in the same run when the 8 rows' blocks b lie side by
side, so that the whole product is one sequential read (bench/quant_gemv.py shows both).
llama.cpp repacks for the same reason (ggml-cpu's repack.cpp: block_q4_0x8, block_q8_0x8 and
others for AVX2 / AVX-512).

A tile of T rows n0 .. n0 + T - 1 (n0 a multiple of T) holds block 0 of each row, then block 1
of each row, and so on (T: :func:`tile_size`, what the kernel's build reads fastest: 8 with
AVX-512, whose body computes 8 rows at once; with AVX2, 4, the rows of one pass, except Q8_0,
read 8 rows a pass; measurements in csrc/qgemv.cpp, qgemv_preferred_tile):

    codes (N, nb * bpb)  →  (N // T, nb, T * bpb)     bpb: bytes of one block's codes
                                                     (Q6_K: code blocks of 64 values, 48 B)
    scale / min (N, nb)  →  (N // T, nb, T)
    Q4_K's heads (N, nS, 16)  →  (N // T, nS, T, 16)   (quant/kheads.py)

The values are the same bytes, only moved, except 5-bit codes (Q5_0, Q5_1), which tiles hold as
bit fields where the kernel's build prefers them (quant/fields.py: the same codes, in 32-byte
words the AVX2 kernel reads in fewer operations; codes (N // T, W, T * 32)). The kernel
(csrc/qgemv.cpp) sums every row in the same order either way, so a tiled weight gives bit-
identical products (tests/quant/test_quant_tiles.py).
This module writes tiles; pack.py reads either layout (``untile_rows``, ``select_rows``,
``dequantize_packed``).
"""

from __future__ import annotations

import torch

from clearlm.quant.fields import WORD, preferred, to_fields
from clearlm.quant.kernels import load_kernels
from clearlm.quant.kheads import is_heads
from clearlm.quant.pack import Packed, block_bytes, code_blocks

TILE = 8  # rows per tile without the kernel (the torch fallback converts tiles back anyway)


def tile_size(bits: int, block: int) -> int:
    """Rows per row tile for a weight of ``bits``-bit codes (pack.py: 4, 5 or 8) in blocks of
    ``block`` values, on this machine's kernel build: 4 or 8 (:data:`TILE` without a kernel)."""
    kern = load_kernels()
    return TILE if kern is None else int(kern.preferred_tile(bits, block))


def can_tile(p: Packed, tile: int | None = None) -> bool:
    """Whether ``p`` is row-major with a whole number of tiles of ``tile`` rows (None:
    :func:`tile_size`'s for its format). Raises ValueError for a tile below 1."""
    tile = tile_size(p.bits, p.block) if tile is None else tile
    if tile < 1:
        raise ValueError(f"a row tile holds at least one row, got {tile}")
    return p.tile == 1 and p.shape[0] % tile == 0


def tile_rows(p: Packed, tile: int | None = None, fields: bool | None = None) -> Packed:
    """``p`` (row-major, N a multiple of ``tile``) in row tiles of ``tile`` rows (None:
    :func:`tile_size`'s for its format): new tensors, the same bytes (5-bit codes as bit fields
    where ``fields``; None: where quant/fields.preferred() says; never Q5_K's, whose heads the
    fields' body does not read).

    Raises ValueError when N is not a multiple of ``tile``, ``tile`` is below 1 or ``p`` is
    already tiled."""
    tile = tile_size(p.bits, p.block) if tile is None else tile
    if not can_tile(p, tile):
        raise ValueError(f"cannot tile a {p.shape} weight (tile {p.tile}) in tiles of {tile} rows")
    n, _ = p.shape
    nb, bpb = code_blocks(p), block_bytes(p)

    def codes(c: torch.Tensor) -> torch.Tensor:
        units, size = nb, bpb  # blocks, or for 5-bit codes the words of their bit fields
        if p.bits == 5 and not is_heads(p.scale) and (preferred() if fields is None else fields):
            c = to_fields(c)  # (N, W, 32)
            units, size = c.shape[1], WORD
        c = c.reshape(n // tile, tile, units, size)  # (tiles, rows, blocks or words, bytes)
        return c.transpose(1, 2).reshape(n // tile, units, tile * size).contiguous()

    def per_block(s: torch.Tensor) -> torch.Tensor:  # (N, nb, ...) → (tiles, nb, rows, ...)
        return s.reshape(n // tile, tile, *s.shape[1:]).transpose(1, 2).contiguous()

    mn = None if p.min is None else per_block(p.min)
    return Packed(codes(p.codes), per_block(p.scale), mn, p.bits, p.block, p.qtype)
