"""quant/kheads.py: Q4_K / Q6_K / Q3_K scales kept as the file's super-block heads, Q6_K's 6-bit
and Q3_K's 3-bit field codes. The values are checked against gguf in test_quant.py (every format,
both layouts); here: the bytes held, a traced embedding lookup (the kernel's dequant operator)
equal to the eager one, and the field code blocks: gguf's values bit for bit, and products
bit-identical to those of the same weights as int8 codes (q - 32 or q - 4) with float32 scales
per 16 (bits 8, block 16: the kernel's plain int8 body)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import random_blocks

from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.kernels import load_kernels
from clearlm.quant.kheads import FIELD, expand_heads, field_codes, q3_k_scales
from clearlm.quant.pack import Packed, dequantize_packed, pack_blocks
from clearlm.quant.tiles import tile_rows

N, K = 64, 512


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda q: q.name)
@pytest.mark.parametrize("tile", [1, 8])
def test_bytes_held(qtype: Q, tile: int) -> None:
    """Exactly the file's bytes (Q6_K: 6-bit codes, 48 bytes per 64, and the 18-byte heads;
    Q3_K: 3-bit codes, 24 bytes per 64, and the 14-byte heads; Q2_K: 16 per 64, 20-byte heads)."""
    raw = random_blocks(qtype, N, K)
    p = pack_blocks(raw, qtype, (N, K))
    p = p if tile == 1 else tile_rows(p, tile)
    assert p.nbytes() == raw.nbytes and p.shape == (N, K) and p.tile == tile


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda q: q.name)
def test_traced_embedding_equals_eager(qtype: Q) -> None:
    raw = random_blocks(qtype, N, K, seed=3)
    ref = torch.from_numpy(dequantize(raw, qtype).reshape(N, K))  # (N, K) gguf's values
    emb = QuantEmbedding(pack_blocks(raw, qtype, (N, K)))
    ids = torch.tensor([[3, 17, 63]])  # (1, 3)
    eager = emb(ids)
    assert torch.equal(eager, ref[ids])
    assert torch.equal(torch.compile(emb, fullgraph=True, backend="eager")(ids), eager)


def int8_codes(p: Packed) -> Packed:
    """A row-major Q6_K / Q3_K / Q2_K Packed (bits 6 / 3 / 2) as int8 codes q - 32 / q - 4 / q
    (N, K) with float32 scales d · sc (and Q2_K's mins -(dmin · m)) per 16 (N, K // 16): the
    same weights in the plain int8 layout."""
    n, k = p.shape
    q = field_codes(p.codes.view(n, k // FIELD, 8 * p.bits), p.bits).reshape(n, k)  # (N, K)
    centre = 0 if p.bits == 2 else 2 ** (p.bits - 1)
    return Packed((q - centre).to(torch.int8), *expand_heads(p.scale), 8, 16, p.qtype)


def test_q3_k_scales_as_ggml_unpacks_them() -> None:
    """The 12 bytes of every Q3_K head unpacked as ggml's kmask1 / kmask2 words do (written out
    here per byte from dequantize_row_q3_K), on every byte value."""
    heads = torch.randint(0, 256, (300, 12), dtype=torch.uint8, generator=torch.Generator()
                          .manual_seed(2))
    b = heads.long()
    want = torch.stack([(b[:, i % 8] >> (4 * (i // 8)) & 15) | ((b[:, 8 + i % 4] >> (2 * (i // 4))
                        & 3) << 4) for i in range(16)], dim=1)  # (300, 16)
    assert torch.equal(q3_k_scales(heads).long(), want)


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda q: q.name)
@pytest.mark.parametrize("tile", [1, 4, 8])
def test_field_code_blocks_exact_and_products_as_int8_codes(qtype: Q, tile: int) -> None:
    """Random blocks (every code pattern): dequantized (torch, kernel, every row range) equal to
    gguf.quants.dequantize, and products for 1, 2, 3, 4 and 8 rows of x bit-identical to the
    int8 codes' (the same float32 weights summed in the same order)."""
    n, k = 64, 768
    raw = random_blocks(qtype, n, k, seed=7)
    ref = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))  # (N, K) gguf's values
    p = pack_blocks(raw, qtype, (n, k))
    bits = p.bits
    old = int8_codes(p)
    t = p if tile == 1 else tile_rows(p, tile)
    assert torch.equal(dequantize_packed(t), ref)
    kern = load_kernels()
    if kern is None:
        pytest.skip("no C++ kernel")
    empty = torch.empty(0, dtype=torch.uint8)
    assert torch.equal(kern.dequant(t.codes, t.scale, empty, bits, 16, 0, n), ref)
    assert torch.equal(kern.dequant(t.codes, t.scale, empty, bits, 16, 5, 13), ref[5:13])
    o = old if tile == 1 else tile_rows(old, tile)
    omin = o.min if o.min is not None else torch.empty(0)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(1))  # (8, K)
    for m in (1, 2, 3, 4, 8):
        got = kern.qmm(x[:m], t.codes, t.scale, empty, bits, 16)  # (m, N)
        assert torch.equal(got, kern.qmm(x[:m], o.codes, o.scale, omin, 8, 16))
        assert torch.equal(got, kern.qmm_i8(x[:m], t.codes, t.scale, empty, bits, 16))  # exact
