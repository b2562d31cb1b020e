"""quant/kheads.py: Q4_K / Q6_K scales kept as the file's super-block heads, Q6_K's 6-bit codes.
The values are checked against gguf in test_quant.py (every format, both layouts); here: the
bytes held, a traced embedding lookup (the kernel's dequant operator) equal to the eager one, and
Q6_K's 6-bit code blocks: gguf's values bit for bit, and products bit-identical to those of the
int8 codes (q - 32) Q6_K was held as before (bits 8, which the kernel still reads)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import random_blocks

from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.kernels import load_kernels
from clearlm.quant.kheads import SIX, SIX_BYTES, six_bit_codes
from clearlm.quant.pack import Packed, dequantize_packed, pack_blocks
from clearlm.quant.tiles import tile_rows

N, K = 64, 512


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("tile", [1, 8])
def test_bytes_held(qtype: Q, tile: int) -> None:
    """Exactly the file's bytes (Q6_K: 6-bit codes, 48 bytes per 64, and the 18-byte heads)."""
    raw = random_blocks(qtype, N, K)
    p = pack_blocks(raw, qtype, (N, K))
    p = p if tile == 1 else tile_rows(p, tile)
    assert p.nbytes() == raw.nbytes and p.shape == (N, K) and p.tile == tile


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_traced_embedding_equals_eager(qtype: Q) -> None:
    raw = random_blocks(qtype, N, K, seed=3)
    ref = torch.from_numpy(dequantize(raw, qtype).reshape(N, K))  # (N, K) gguf's values
    emb = QuantEmbedding(pack_blocks(raw, qtype, (N, K)))
    ids = torch.tensor([[3, 17, 63]])  # (1, 3)
    eager = emb(ids)
    assert torch.equal(eager, ref[ids])
    assert torch.equal(torch.compile(emb, fullgraph=True, backend="eager")(ids), eager)


def int8_codes(p: Packed) -> Packed:
    """A row-major Q6_K Packed with its codes as int8 q - 32 (N, K): the layout (bits 8) Q6_K
    was held in before its 6-bit code blocks."""
    n, k = p.shape
    q = six_bit_codes(p.codes.view(n, k // SIX, SIX_BYTES)).reshape(n, k) - 32  # (N, K)
    return Packed(q.to(torch.int8), p.scale, None, 8, 16, "Q6_K")


@pytest.mark.parametrize("tile", [1, 4, 8])
def test_q6_k_six_bit_blocks_exact_and_products_as_int8_codes(tile: int) -> None:
    """Random blocks (every code pattern): dequantized (torch, kernel, every row range) equal to
    gguf.quants.dequantize, and products for 1, 2, 3, 4 and 8 rows of x bit-identical to the
    int8 codes' (the same float32 weights summed in the same order)."""
    n, k = 64, 768
    raw = random_blocks(Q.Q6_K, n, k, seed=7)
    ref = torch.from_numpy(dequantize(raw, Q.Q6_K).reshape(n, k))  # (N, K) gguf's values
    p = pack_blocks(raw, Q.Q6_K, (n, k))
    old = int8_codes(p)
    t = p if tile == 1 else tile_rows(p, tile)
    assert torch.equal(dequantize_packed(t), ref)
    kern = load_kernels()
    if kern is None:
        pytest.skip("no C++ kernel")
    empty = torch.empty(0, dtype=torch.uint8)
    assert torch.equal(kern.dequant(t.codes, t.scale, empty, 6, 16, 0, n), ref)
    assert torch.equal(kern.dequant(t.codes, t.scale, empty, 6, 16, 5, 13), ref[5:13])
    o = old if tile == 1 else tile_rows(old, tile)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(1))  # (8, K)
    for m in (1, 2, 3, 4, 8):
        got = kern.qmm(x[:m], t.codes, t.scale, empty, 6, 16)  # (m, N)
        assert torch.equal(got, kern.qmm(x[:m], o.codes, o.scale, empty, 8, 16))
        assert torch.equal(got, kern.qmm_i8(x[:m], t.codes, t.scale, empty, 6, 16))  # exact
