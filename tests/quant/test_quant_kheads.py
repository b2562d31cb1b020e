"""quant/kheads.py: Q4_K / Q6_K scales kept as the file's super-block heads. The values are
checked against gguf in test_quant.py (every format, both layouts); here: the bytes held, and a
traced embedding lookup (the kernel's dequant operator) equal to the eager one."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import random_blocks

from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.pack import pack_blocks
from clearlm.quant.tiles import tile_rows

N, K = 64, 512


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("tile", [1, 8])
def test_bytes_held(qtype: Q, tile: int) -> None:
    """Q4_K: exactly the file's bytes; Q6_K: int8 codes plus the file's 18-byte heads."""
    raw = random_blocks(qtype, N, K)
    p = pack_blocks(raw, qtype, (N, K))
    p = p if tile == 1 else tile_rows(p, tile)
    want = raw.nbytes if qtype == Q.Q4_K else N * K + N * K // 256 * 18
    assert p.nbytes() == want and p.shape == (N, K) and p.tile == tile


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_traced_embedding_equals_eager(qtype: Q) -> None:
    raw = random_blocks(qtype, N, K, seed=3)
    ref = torch.from_numpy(dequantize(raw, qtype).reshape(N, K))  # (N, K) gguf's values
    emb = QuantEmbedding(pack_blocks(raw, qtype, (N, K)))
    ids = torch.tensor([[3, 17, 63]])  # (1, 3)
    eager = emb(ids)
    assert torch.equal(eager, ref[ids])
    assert torch.equal(torch.compile(emb, fullgraph=True, backend="eager")(ids), eager)
