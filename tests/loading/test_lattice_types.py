"""The i-quants with lattice codebooks (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and
the ternary TQ1_0 / TQ2_0: held as int8 codes with float32 scales (quant/lattice.py), whose
values equal gguf's dequantization bit for bit, and read as float32 by ``--weights float32``.

References: transformers loading the same tiny GGUF (its loader dequantizes every tensor through
``gguf.quants.dequantize``, llama.cpp's reference dequantization in Python): logits ≤ 1e-4. The
blocks are random bytes with finite float16 scales (tests/helpers/tiny_gguf.py ``random_raw``):
any byte pattern is a valid block of these types, so every codebook entry and sign pattern can
occur."""

from __future__ import annotations

import warnings

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama
from transformers import AutoModelForCausalLM

import clearlm
from clearlm.loading.checkpoint import GGUFCheckpoint
from clearlm.loading.held import WIDE_HELD
from clearlm.quant.lattice import BLOCK
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import dequantize_packed

LATTICE = [Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.TQ1_0, Q.TQ2_0]


@pytest.mark.parametrize("qtype", LATTICE, ids=lambda q: q.name)
def test_lattice_types_load_with_a_warning_and_equal_transformers(tmp_path, qtype: Q) -> None:
    """A tiny llama (d_model = d_ff = 256: whole 256-value blocks) whose matrices, embedding
    included, are ``qtype``: the default (compact) load warns once, naming the type, the count
    (1 embedding + 2 layers × 7 matrices) and the memory; its weights are gguf's values bit for
    bit (the float32 load's), and its logits equal transformers'."""
    path = write_tiny_llama(tmp_path / f"{qtype.name}.gguf", matrix_type=qtype, d_model=256,
                            d_ff=256, n_heads=4, n_kv_heads=2, seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = clearlm.load(path, threads=1)
    said = [str(w.message) for w in caught if str(w.message).startswith("clearlm: ")]
    assert len(said) == 1 and said[0].startswith(
        f"clearlm: 15 {qtype.name} tensors have no compact form at the file's size and are held "
        "as int8 codes: ")
    use = dict(GGUFCheckpoint(path).weight_formats("compact"))[qtype.name]
    assert use.held_as == WIDE_HELD
    n = 262 * 256 + 2 * (5 * 256 * 256 + 2 * 128 * 256)  # values in the 15 matrices
    assert use.held_bytes == n + 4 * n // BLOCK[qtype]  # int8 codes, a float32 scale per block
    down = ours.transformer.layers[1].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.bits == 8
    exact = clearlm.load(path, weights="float32", threads=1).transformer
    assert torch.equal(dequantize_packed(down.packed()), exact.layers[1].mlp.down_proj.weight)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                               dtype=torch.float32).eval()
    tokens = torch.randint(0, 262, (2, 12), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.inference_mode():
        diff = (ours.transformer(tokens) - ref(tokens).logits).abs().max().item()
    print(f"\n{qtype.name}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4
