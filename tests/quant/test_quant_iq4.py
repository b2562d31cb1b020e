"""IQ4_NL and IQ4_XS as Q4_0's nibbles valued through IQ4's table (quant/iq4.py).

References: ``gguf.quants.dequantize`` (llama.cpp's reference dequantization in Python) for the
values, bit for bit, on random blocks (every byte random: all 16 codes and all 64 IQ4_XS
sub-scales, negative and odd ones included) with float16 scales of both signs, the largest
finite one and subnormals; torch's float32 F.linear on those values for the products, within
the float32 summation bound |Δ| ≤ K·u·(|x| @ |W|ᵀ) (u = 2⁻²⁴, Higham §3.1) of
tests/quant/test_quant.py. The traced decode step is tests/quant/test_quant_kfiles.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import assert_within_float32_bound, random_blocks

from clearlm.quant.iq4 import TABLE4
from clearlm.quant.kernels import load_kernels
from clearlm.quant.pack import dequantize_packed, pack_blocks
from clearlm.quant.tiles import tile_rows

IQ4 = pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name)


def blocks(qtype: Q, n: int, k: int, seed: int) -> np.ndarray:
    """Random blocks (n, bytes per row) with some scales at float16's edges: 65504, -65504,
    the smallest subnormal and its negative, and zero."""
    raw = random_blocks(qtype, n, k, seed=seed)
    b = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])  # (n_blocks, bytes): d first in both
    edges = np.array([65504.0, -65504.0, 2.0**-24, -(2.0**-24), 0.0], np.float16)
    b[: len(edges), :2] = edges.view(np.uint8).reshape(-1, 2)
    return raw


def empty_min(p) -> torch.Tensor:
    return torch.empty(0, dtype=p.scale.dtype)


@IQ4
@pytest.mark.parametrize("tile", [1, 4, 8])
def test_values_equal_gguf_bit_for_bit(qtype: Q, tile: int) -> None:
    """The torch path, the kernel's dequantization and the traced operators give gguf's
    values bit for bit, row-major or in tiles; the weight holds exactly the file's bytes."""
    n, k = 16, 1024
    raw = blocks(qtype, n, k, seed=11)
    ref = dequantize(raw, qtype).reshape(n, k)  # (N, K) float32
    assert np.isfinite(ref).all()
    p = pack_blocks(raw, qtype, (n, k))
    assert p.bits == TABLE4 and p.nbytes() == raw.nbytes
    p = p if tile == 1 else tile_rows(p, tile)
    np.testing.assert_array_equal(dequantize_packed(p).numpy(), ref)
    np.testing.assert_array_equal(  # the operator a traced lookup calls without the kernel
        torch.ops.clearlm.dequant(p.codes, p.scale, empty_min(p), p.bits, p.block).numpy(), ref)
    kern = load_kernels()
    if kern is not None:
        got = kern.dequant(p.codes, p.scale, empty_min(p), p.bits, p.block, 0, n)
        np.testing.assert_array_equal(got.numpy(), ref)
        got = torch.ops.clearlm_kernels.dequant(p.codes, p.scale, empty_min(p), p.bits, p.block)
        np.testing.assert_array_equal(got.numpy(), ref)


@IQ4
@pytest.mark.parametrize("t", [1, 5, 21])  # decode, kernel with several rows, chunked prefill
@pytest.mark.parametrize("tile", [1, 8])
def test_product_within_the_float32_bound(qtype: Q, t: int, tile: int, path_kind: str) -> None:
    n, k = 40, 512
    assert_within_float32_bound(blocks(qtype, n, k, seed=2), qtype, n, k, t, path_kind, tile)


@pytest.mark.skipif(load_kernels() is None, reason="no C++ kernel (needs g++)")
@IQ4
def test_tiles_rows_and_int8_give_the_same_products(qtype: Q) -> None:
    """Each row sums in one order: tiled or row-major W, 7 rows of x at once or alone, give the
    same products bit for bit; int8 activations leave these layers exact (no int8 body)."""
    kern = load_kernels()
    n, k = 24, 512
    p = pack_blocks(blocks(qtype, n, k, seed=3), qtype, (n, k))
    x = torch.randn(7, k)  # (M, K)
    y = kern.qmm(x, p.codes, p.scale, empty_min(p), p.bits, p.block)  # (M, N)
    for tile in (4, 8):
        t = tile_rows(p, tile)
        assert torch.equal(y, kern.qmm(x, t.codes, t.scale, empty_min(t), t.bits, t.block))
    assert torch.equal(y, kern.qmm_i8(x, p.codes, p.scale, empty_min(p), p.bits, p.block))
    for m in range(7):
        one = kern.qmm(x[m : m + 1], p.codes, p.scale, empty_min(p), p.bits, p.block)
        assert torch.equal(y[m], one[0])
