"""quantize_model on tiny GGUFs: the swapped model computes the float32 model's logits.

Reference: the same file loaded by clearlm's float32 loader (itself checked against
transformers in test_gguf_parity.py); the compact model differs only by float32 summation order."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.compact.swap import quantize_model
from clearlm.loading.gguf import open_gguf
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.fields import preferred
from clearlm.quant.linear import QuantLinear

MATRICES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q5_1], ids=lambda q: q.name)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_quantize_model_matches_float32(tmp_path, qtype: Q, tied: bool) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", matrix_type=qtype, tied=tied, seed=3)
    ref = load_gguf_model(path)
    got = load_gguf_model(path)
    report = quantize_model(got.model, open_gguf(path), got.config)
    n_layers = got.config.n_layers
    assert len(report.swapped) == n_layers * len(MATRICES) + 2  # + embedding and head
    assert isinstance(got.model.lm_head, QuantLinear)
    assert isinstance(got.model.embed_tokens, QuantEmbedding)
    if tied:  # one packed table behind both
        assert got.model.lm_head.codes is got.model.embed_tokens.codes
    assert isinstance(got.model.layers[0].self_attn.q_proj, QuantLinear)
    # every matrix held once, at the layout's bytes per value (pack.py's table): codes + float16
    # scale (+ float16 min for Q5_1; Q4_0's centred codes have none) per 32 values
    # ; in row tiles (every matrix a linear layer reads) 5-bit codes are bit fields where the
    # kernel's build prefers them: 32 bytes per 6 fields of 8 codes (quant/fields.py); an
    # embedding read only by lookups stays as it is
    per_block = {Q.Q8_0: 32 + 2, Q.Q4_0: 16 + 2, Q.Q5_1: 20 + 4}[qtype]
    want = 0
    for t in open_gguf(path).tensors:
        if t.tensor_type != qtype:
            continue
        k, n = (int(d) for d in t.shape)  # GGUF order: row length first
        nb = k // 32
        tiled = (tied or t.name != "token_embd.weight") and n % 8 == 0
        if qtype == Q.Q5_1 and tiled and preferred():
            want += n * (32 * -(-4 * nb // 6) + 4 * nb)  # fields, then scale and min
        else:
            want += n * nb * per_block
    assert report.packed_bytes == want
    tokens = torch.tensor([[1, 72, 101, 108, 108, 111, 32, 119, 2]])  # (B, T)
    with torch.inference_mode():
        want = ref.model(tokens)  # (B, T, V)
        full = got.model(tokens)  # prefill path (T > 4: dequantize + matmul)
        last = got.model(tokens[:, :1])  # decode-sized path (kernel when built)
        want1 = ref.model(tokens[:, :1])
    assert (full - want).abs().max().item() < 1e-4
    assert (last - want1).abs().max().item() < 1e-4
    assert torch.equal(full.argmax(-1), want.argmax(-1))
