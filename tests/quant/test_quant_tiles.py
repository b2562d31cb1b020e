"""clearlm.quant.tiles: row tiles hold the same blocks and give bit-identical products.

References: the row-major Packed that pack_blocks gives (its values are checked against
gguf.quants.dequantize in tests/quant/test_quant.py) and the kernel's own row-major product: a tile
only moves bytes, and the kernel sums each row in the same order in either layout, so every
comparison here is exact equality, not a tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_quant import random_blocks

import clearlm
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.fields import is_fields, preferred
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear
from clearlm.quant.ops import int8_available
from clearlm.quant.pack import SUPPORTED, dequantize_packed, pack_blocks, select_rows, untile_rows
from clearlm.quant.tiles import can_tile, tile_rows, tile_size

needs_kernel = pytest.mark.skipif(load_kernels() is None, reason="no C++ kernel (needs g++)")
N, K = 48, 512  # 6 tiles of 8 rows or 12 of 4; K: 16 blocks of 32, 32 of 16 (Q6_K)


def packed_pair(qtype: Q, n: int = N, k: int = K, tile: int | None = None):
    p = pack_blocks(random_blocks(qtype, n, k), qtype, (n, k))
    return p, tile_rows(p, tile)


def mins(p) -> torch.Tensor:
    return p.min if p.min is not None else torch.empty(0)


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_tiles_hold_the_same_blocks(qtype: Q) -> None:
    p, t = packed_pair(qtype)
    assert t.tile == tile_size(p.bits, p.block) in (4, 8) and t.shape == p.shape == (N, K)
    assert t.codes.shape[0] == t.scale.shape[0] == N // t.tile
    if qtype in (Q.Q5_0, Q.Q5_1) and preferred():  # bit fields: 11 words of 32 B per 16 blocks
        assert t.codes.shape[1:] == (11, t.tile * 32)
        assert t.nbytes() - p.nbytes() == N * (11 * 32 - 16 * 20)
    else:
        assert t.nbytes() == p.nbytes()
    back = untile_rows(t)
    assert torch.equal(back.codes, p.codes) and torch.equal(back.scale, p.scale)
    assert (back.min is None) == (p.min is None)
    if p.min is not None:
        assert torch.equal(back.min, p.min)
    assert torch.equal(dequantize_packed(t), dequantize_packed(p))  # the torch fallback
    rows = torch.tensor([0, 7, 8, 47, 13, 13])  # an embedding lookup: any rows, repeats
    assert torch.equal(dequantize_packed(select_rows(t, rows)), dequantize_packed(p)[rows])


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
@pytest.mark.parametrize("fields", [False, True], ids=["ggml", "fields"])
def test_five_bit_tiles_either_way(qtype: Q, fields: bool) -> None:
    """Both tiled forms of 5-bit codes (ggml's blocks, bit fields) convert back exactly, and the
    kernel reads both: dequantized rows equal the reference bit for bit; products are within
    float32 rounding of it, and bit-identical to row-major where the build prefers that form."""
    p = pack_blocks(random_blocks(qtype, N, 224), qtype, (N, 224))  # 7 blocks: a part word
    t = tile_rows(p, fields=fields)
    assert t.codes.shape[1:] == ((5, t.tile * 32) if fields else (7, t.tile * 20))
    assert torch.equal(untile_rows(t).codes, p.codes)
    rows = torch.tensor([47, 0, 8, 8])
    assert torch.equal(select_rows(t, rows).codes, p.codes[rows])
    assert torch.equal(dequantize_packed(t), dequantize_packed(p))
    kern = load_kernels()
    if kern is None:
        return
    assert torch.equal(kern.dequant(t.codes, t.scale, mins(t), 5, 32, 3, 41),
                       dequantize_packed(p)[3:41])
    torch.manual_seed(1)
    for m in (1, 3, 16):
        x = torch.randn(m, 224)
        got = kern.qmm(x, t.codes, t.scale, mins(t), 5, 32)
        ref = x.double() @ dequantize_packed(p).double().T
        assert (got.double() - ref).abs().max() < 1e-3
        if fields == preferred():
            assert torch.equal(got, kern.qmm(x, p.codes, p.scale, mins(p), 5, 32))


@needs_kernel
@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
def test_fields_with_tiny_activations(qtype: Q) -> None:
    """x below 2^-101 cannot be scaled by 2^-25 exactly: such products read the fields with
    shifts instead, and stay bit-identical to row-major (a breaker's case: x ~ 1e-36)."""
    kern = load_kernels()
    p = pack_blocks(random_blocks(qtype, N, 896), qtype, (N, 896))
    t = tile_rows(p, fields=True)
    torch.manual_seed(2)
    for x in (torch.randn(1, 896) * 1e-36, torch.randn(3, 896).index_fill_(1, torch.arange(20),
                                                                            1e-44)):
        got = kern.qmm(x, t.codes, t.scale, mins(t), 5, 32)
        w = dequantize_packed(p).double()
        ref, size = x.double() @ w.T, x.double().abs() @ w.abs().T  # (M, N)
        assert ((got.double() - ref).abs() <= 1e-5 * size + 1e-43).all()  # float32 rounding
        if preferred():
            assert torch.equal(got, kern.qmm(x, p.codes, p.scale, mins(p), 5, 32))


def test_five_bit_fields_layout() -> None:
    """quant/fields.py's layout, checked against its definition on ggml's own bytes: field
    f = 4b + j in word f // 6 at bit 5 (f % 6) of lane l holds code 8j + l of block b, for rows
    whose block count leaves the last word part empty (7 blocks: 28 fields in 5 words)."""
    from gguf.quants import dequantize

    from clearlm.quant.fields import from_fields, to_fields, words

    raw = random_blocks(Q.Q5_0, 3, 7 * 32)  # (3 rows, 7 blocks of 22 bytes)
    p = pack_blocks(raw, Q.Q5_0, (3, 224))
    f = to_fields(p.codes)
    assert f.shape == (3, words(7), 32) == (3, 5, 32)
    lanes = f.view(torch.int32).long() & 0xFFFFFFFF  # (3, 5, 8)
    d = torch.from_numpy(raw.reshape(3, 7, 22)[..., :2].copy().view("<f2")).float()  # (3, 7, 1)
    w = torch.from_numpy(dequantize(raw, Q.Q5_0).reshape(3, 7, 32))  # d * (code - 16)
    code = (w / d + 16).round().long()  # (3, 7, 32), where d != 0
    for b in range(7):
        for j in range(4):
            fld = 4 * b + j
            got = (lanes[:, fld // 6] >> (5 * (fld % 6))) & 31  # (3, 8)
            ok = d[:, b, 0] != 0
            assert torch.equal(got[ok], code[ok, b, 8 * j : 8 * j + 8])
    assert torch.equal((lanes[:, 4] >> 20), torch.zeros(3, 8, dtype=torch.long))  # fields 28, 29
    assert torch.equal(from_fields(f, 7), p.codes)


@needs_kernel
@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
@pytest.mark.parametrize("k", [K, 224, 640], ids=lambda k: f"K{k}")  # 16, 7, 20 blocks of 32
@pytest.mark.parametrize("tile", [4, 8])  # each build prefers one per format (tile_size)
def test_kernel_products_are_bit_identical(qtype: Q, k: int, tile: int) -> None:
    if k != K and qtype not in (Q.Q5_0, Q.Q5_1, Q.Q8_0):
        pytest.skip("other row lengths: the 5-bit fields' last word (K-quants need 256)")
    kern = load_kernels()
    p, t = packed_pair(qtype, k=k, tile=tile)
    torch.manual_seed(0)
    for m in (1, 2, 3, 4, 7, 16):  # every tile of x rows the kernel uses (4, 2, 1)
        x = torch.randn(m, k)
        want = kern.qmm(x, p.codes, p.scale, mins(p), p.bits, p.block)  # (M, N)
        got = kern.qmm(x, t.codes, t.scale, mins(t), t.bits, t.block)
        assert torch.equal(got, want), (m, (got - want).abs().max())
        ref = x.double() @ dequantize_packed(p).double().T
        assert (got.double() - ref).abs().max() < 1e-3  # and it is the product at all
        if int8_available() and k % 64 == 0:  # (the int8 kernel's rows: whole 64s)
            exact = p.bits == 5 and is_fields(t.codes, tile)  # fields: int8 mode is exact on them
            want = kern.qmm_i8(x, p.codes, p.scale, mins(p), p.bits, p.block) if not exact else got
            got = kern.qmm_i8(x, t.codes, t.scale, mins(t), t.bits, t.block)
            assert torch.equal(got, want)
    for r0, r1 in ((0, N), (3, 40), (8, 16), (47, 48)):  # prefill bands: any row range
        want = kern.dequant(p.codes, p.scale, mins(p), p.bits, p.block, r0, r1)
        got = kern.dequant(t.codes, t.scale, mins(t), t.bits, t.block, r0, r1)
        assert torch.equal(got, want) and torch.equal(want, dequantize_packed(p)[r0:r1])


@needs_kernel
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0], ids=lambda q: q.name)
@pytest.mark.parametrize("tiled", [False, True], ids=["rows", "tiles"])
def test_centred_codes_with_inf_and_nan(qtype: Q, tiled: bool) -> None:
    """Centred codes (code - 8 / 16) with infinities and NaNs in x: each row equals itself
    computed alone, bit for bit, and its infs and NaNs are F.linear's. (A kernel that summed
    x · code from -C · Σx, to save the subtract per code, made such rows NaN where F.linear
    gives ±inf; it was reverted for its rounding, see docs/speed-log.md, "Centred Q4_0 / Q5_0".)"""
    kern = load_kernels()
    p = pack_blocks(random_blocks(qtype, N, K, seed=5), qtype, (N, K))
    w = tile_rows(p) if tiled else p
    torch.manual_seed(3)
    x = torch.randn(6, K)
    x[1, 5] = float("inf")  # every y[1, n] is +-inf, or NaN where W[n, 5] is 0
    x[3, 40] = float("-inf")
    x[4, 9] = float("nan")
    got = kern.qmm(x, w.codes, w.scale, mins(w), w.bits, w.block)  # (6, N)
    ref = x @ dequantize_packed(p).T
    for m in range(6):
        alone = kern.qmm(x[m : m + 1], w.codes, w.scale, mins(w), w.bits, w.block)[0]
        assert torch.equal(got[m].nan_to_num(), alone.nan_to_num()), m
        assert torch.equal(got[m].isnan(), ref[m].isnan()), m
        assert torch.equal(got[m].isinf(), ref[m].isinf()), m
        assert torch.equal(got[m].isinf() & (got[m] > 0), ref[m].isinf() & (ref[m] > 0)), m
    assert torch.isinf(got[1]).sum() > N // 2 and torch.isnan(got[4]).all()
    rows = [0, 2, 5]  # finite: within float32 rounding of the product
    assert (got[rows].double() - ref[rows].double()).abs().max() < 1e-3


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q4_K], ids=lambda q: q.name)
@pytest.mark.parametrize("t", [1, 3, 21])  # decode, several rows, chunked prefill
def test_quant_linear_on_tiles_equals_row_major(qtype: Q, t: int) -> None:
    p, tiled = packed_pair(qtype)
    bias = torch.randn(N)
    x = torch.randn(2, t, K)
    want, got = QuantLinear(p, bias)(x), QuantLinear(tiled, bias)(x)  # (2, t, N)
    assert torch.equal(got, want)


def test_embedding_lookup_on_a_tiled_table() -> None:
    p, t = packed_pair(Q.Q8_0)
    ids = torch.tensor([[0, 9, 47], [8, 8, 1]])
    assert torch.equal(QuantEmbedding(t)(ids), QuantEmbedding(p)(ids))
    assert torch.equal(QuantEmbedding(t)(ids), dequantize_packed(p)[ids])
    for bad in (-1, 48):  # 48 rows: a negative id must not wrap to the last row
        for table in (p, t):
            with pytest.raises(IndexError, match=r"token id out of range: .* 48 rows"):
                QuantEmbedding(table)(torch.tensor([0, bad]))


def test_what_cannot_be_tiled() -> None:
    p = pack_blocks(random_blocks(Q.Q4_0, 12, K), Q.Q4_0, (12, K))
    assert not can_tile(p, 8) and can_tile(p, 4)
    with pytest.raises(ValueError, match="tiles of 8 rows"):
        tile_rows(p, 8)
    for bad in (0, -4):
        with pytest.raises(ValueError, match="at least one row"):
            tile_rows(p, bad)
    p, t = packed_pair(Q.Q4_0)
    with pytest.raises(ValueError, match=f"tile {t.tile}"):
        tile_rows(t)  # already tiled
    assert untile_rows(p) is p


@needs_kernel
def test_kernel_refuses_other_tile_sizes() -> None:
    kern = load_kernels()
    p = pack_blocks(random_blocks(Q.Q8_0, 16, 64), Q.Q8_0, (16, 64))
    t = tile_rows(p, 2)  # a valid arrangement, but the kernel computes tiles of 4 or 8 rows
    with pytest.raises(RuntimeError, match="4 or 8 rows"):
        kern.qmm(torch.randn(1, 64), t.codes, t.scale, mins(t), t.bits, t.block)


def test_a_compact_load_tiles_what_linear_layers_read(smollm2_path: Path, monkeypatch) -> None:
    """SmolLM2 (tied head, k_proj of 192 rows): every QuantLinear and the tied table are tiled
    (tile_size's rows for each format), and the logits of a 4-token prompt (the kernel's path)
    equal, bit for bit, those of the same load kept row-major."""
    ids = [1, 504, 2444, 314]
    model = clearlm.load(str(smollm2_path), weights="compact")
    mods = [m for m in model.transformer.modules() if isinstance(m, (QuantLinear, QuantEmbedding))]
    assert mods and all(m.packed().tile == tile_size(m.bits, m.block) for m in mods)
    got = model.logits(ids)
    monkeypatch.setattr("clearlm.loading.compact.load._tile", lambda *args: 1)
    plain = clearlm.load(str(smollm2_path), weights="compact")
    assert all(m.packed().tile == 1 for m in plain.transformer.modules() if hasattr(m, "packed"))
    assert torch.equal(got, plain.logits(ids))
