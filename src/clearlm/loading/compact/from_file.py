"""Pack one GGUF tensor straight from the memory-mapped file, a band of rows at a time.

:func:`clearlm.quant.pack.pack_blocks` on a whole vocabulary-sized matrix makes several
temporaries the size of the tensor (Q6_K's low and high bit planes, int8 codes: ~1 byte per
value each, 136 MB apiece for Qwen2.5's 151,936 × 896 table). Here the output buffers are
allocated once at their final size and filled BAND_BYTES of file bytes at a time, and the file
pages of each band are dropped from the process right after (``GGUFFile.release``), so a load
never holds more than a band of temporaries or of mapped file pages beyond the packed weights.
Each band packs to exactly the rows pack_blocks gives for the whole tensor (blocks never cross
rows); tests/loading/test_compact_load.py checks the buffers are identical.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES

from clearlm.families.transforms import unpermute_rope_rows
from clearlm.loading.gguf_file import GGUFFile, GGUFTensor
from clearlm.quant.pack import Packed, pack_blocks
from clearlm.quant.tiles import tile_rows, tile_size

BAND_BYTES = 4 << 20  # file bytes packed per step


def pack_tensor(file: GGUFFile, t: GGUFTensor, rope_heads: int | None = None,
                tile: int = 1) -> Packed:
    """The tensor ``t`` of ``file`` as a Packed (N, K) weight, N = t.shape[1], K = t.shape[0].

    rope_heads: undo llama.cpp's Q/K row permutation for this many heads (None: rows as stored).
    tile: rows per row tile (quant/tiles.py; 1: row-major); N must be a multiple of it.
    Raises UnsupportedQuantError (pack.py) for a type or row length pack_blocks refuses."""
    k, n = t.shape  # GGUF order: innermost first
    raw = t.data.reshape(n, -1)  # (N, bytes per row): a view of the map
    rows = max(1, min(n, BAND_BYTES // raw.shape[1]))
    if tile > 1:  # bands of whole tiles (N is a multiple of tile)
        rows = max(tile, rows - rows % tile)
    first = pack_blocks(raw[:rows], t.tensor_type, (rows, k))
    if rows == n or rope_heads is not None:  # one band, or a permutation of the whole
        whole = first if rows == n else pack_blocks(raw, t.tensor_type, (n, k))
        file.release(t.data_offset, t.n_bytes)
        return _tiled(_permuted(whole, rope_heads), tile)
    out = _empty_like(_tiled(first, tile), n // tile)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        band = first if r0 == 0 else pack_blocks(raw[r0:r1], t.tensor_type, (r1 - r0, k))
        band = _tiled(band, tile)
        out.codes[r0 // tile : r1 // tile] = band.codes
        out.scale[r0 // tile : r1 // tile] = band.scale
        if out.min is not None:
            out.min[r0 // tile : r1 // tile] = band.min
        file.release(t.data_offset + r0 * raw.shape[1], (r1 - r0) * raw.shape[1])
    return out


def pack_group(file: GGUFFile,
               members: list[tuple[GGUFTensor, int | None, int]]) -> list[Packed]:
    """Pack the tensors a block will fuse (Q/K/V, or gate/up: quant/fuse.py), in order, and,
    where their packed layouts agree, copy them into one buffer each for codes, scales and mins
    right away: the returned Packed are then consecutive row bands of those buffers (views), so
    fuse.fuse_group later joins them without a copy. Done here, while the other tensors are still
    being packed, each group's separate buffers are freed before the next is allocated; joining
    every group only after the whole load (as fuse.py does on its own) kept all the originals
    alive beside their copies or left them as holes too small to reuse: +36 MiB of peak RSS on
    SmolLM2, +27 MiB on Gemma 3 270M. Where only the leading members agree (Qwen2.5's and
    Gemma 3's Q/K with a V of another format), those share buffers, as fuse.py fuses them.

    members: (tensor, rope_heads, tile) as pack_tensor takes them."""
    packed = [pack_tensor(file, t, heads, tile) for t, heads, tile in members]
    same = 1  # the leading members with the first one's layout, as fuse.py fuses them
    while same < len(packed) and _layout_key(packed[same]) == _layout_key(packed[0]):
        same += 1
    if same < 2:
        return packed
    lead = packed[:same]
    codes = torch.cat([p.codes for p in lead])
    scale = torch.cat([p.scale for p in lead])
    mn = None if lead[0].min is None else torch.cat([p.min for p in lead])  # type: ignore[misc]
    out, r0 = [], 0
    for p in lead:
        r1 = r0 + p.codes.shape[0]  # rows, or tiles of rows
        band = None if mn is None else mn[r0:r1]
        out.append(Packed(codes[r0:r1], scale[r0:r1], band, p.bits, p.block, p.qtype))
        r0 = r1
    return out + packed[same:]


def _layout_key(p: Packed) -> tuple:
    """What must agree for packed tensors to share buffers (as fuse.py's layout does)."""
    mn = None if p.min is None else p.min.dtype
    return (p.bits, p.block, p.codes.dtype, p.codes.shape[1:], p.scale.dtype, p.scale.shape[1:],
            mn)


@functools.lru_cache(maxsize=64)
def row_layout(qtype: object, k: int) -> Packed:
    """One packed all-zero row of K values of this type: pack.py's dtypes and per-row widths.
    Kept per (type, K), since a load asks once per tensor for a handful of pairs (the plan's
    byte count, then pack_cache's layout check); read it, never write into it.
    Raises UnsupportedQuantError as pack_blocks."""
    block, type_size = GGML_QUANT_SIZES[qtype]  # type: ignore[index]
    row = np.zeros((1, k // block * type_size), dtype=np.uint8)  # d = 0: a valid block
    return pack_blocks(row, qtype, (1, k))  # type: ignore[arg-type]


def planned_tile(qtype: object, shape: tuple[int, int], linear: bool) -> int:
    """Rows per row tile a load packs a (N, K) matrix of this type in: quant/tiles.tile_size's
    for its format where a linear layer reads it (decode products) and N fills whole tiles,
    else 1 (row-major: an embedding alone is only read a row at a time).
    Raises UnsupportedQuantError as pack_blocks."""
    row = row_layout(qtype, shape[1])
    tile = tile_size(row.bits, row.block)
    return tile if linear and shape[0] % tile == 0 else 1


def packed_nbytes(qtype: object, shape: tuple[int, int], tile: int = 1) -> int:
    """Bytes a (N, K) matrix of this type holds once packed (pack.py's layout, from one row), in
    row tiles of ``tile`` rows (N a multiple of it; 5-bit codes take more there: fields.py)."""
    n, k = shape
    if tile == 1:
        return row_layout(qtype, k).nbytes() * n
    return tile_layout(qtype, k, tile).nbytes() // tile * n


@functools.lru_cache(maxsize=64)
def tile_layout(qtype: object, k: int, tile: int) -> Packed:
    """One tile of ``tile`` packed all-zero rows of K values (quant/tiles.py): the dtypes and
    per-tile shapes a tiled matrix of this type has. Read it, never write into it.
    Raises UnsupportedQuantError as pack_blocks."""
    row = row_layout(qtype, k)
    rows = [None if a is None else a.expand(tile, *a.shape[1:]).contiguous()
            for a in (row.codes, row.scale, row.min)]
    return tile_rows(Packed(*rows, row.bits, row.block, row.qtype), tile)


def _tiled(p: Packed, tile: int) -> Packed:
    return p if tile == 1 else tile_rows(p, tile)


def _empty_like(p: Packed, n: int) -> Packed:
    """Empty buffers like ``p``'s with n rows (tiles of rows where ``p`` is tiled)."""

    def grow(a: torch.Tensor) -> torch.Tensor:
        return torch.empty((n, *a.shape[1:]), dtype=a.dtype)

    mn = None if p.min is None else grow(p.min)
    return Packed(grow(p.codes), grow(p.scale), mn, p.bits, p.block, p.qtype)


def _permuted(p: Packed, heads: int | None) -> Packed:
    """llama's Q/K row un-permutation applied to every per-row array (a permutation of rows)."""
    if heads is None:
        return p
    idx = torch.from_numpy(unpermute_rope_rows(np.arange(p.shape[0])[:, None], heads)[:, 0])
    mn = None if p.min is None else p.min[idx].contiguous()
    return Packed(p.codes[idx].contiguous(), p.scale[idx].contiguous(), mn, p.bits, p.block,
                  p.qtype)
