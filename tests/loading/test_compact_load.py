"""weights="compact": the model built straight from the mapped GGUF equals the float32 model with
its matrices swapped afterwards (loading/compact/swap.py ``quantize_model``, the reference for
packing:
pack_blocks on the whole tensor, checked bit for bit against gguf's dequantize in
test_quant.py): same module types at the same places, identical packed buffers, identical float
tensors, identical logits. On SmolLM2 (Q4_1/Q8_0, exact dequantization) compact and float32
give the same greedy text on the parity prompts; only float32 summation order differs."""

from __future__ import annotations

import warnings

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from real_parity import PROMPTS
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import SamplingParamsError
from clearlm.loading.checkpoint import GGUFCheckpoint, load_gguf_model
from clearlm.loading.compact import from_file
from clearlm.loading.compact.swap import quantize_model
from clearlm.loading.gguf import open_gguf
from clearlm.loading.held import NO_PACKER, FormatUse, warn_held_above_file
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.linear import QuantLinear

TOKENS = torch.tensor([[1, 72, 101, 108, 108, 111, 32, 119, 2]])  # (B, T)


def swapped_reference(path):
    """The float32 load, then quantize_model: what compact loading must reproduce."""
    ref = load_gguf_model(path)
    quantize_model(ref.model, open_gguf(path), ref.config)
    return ref.model


def assert_same_model(got: torch.nn.Module, want: torch.nn.Module) -> None:
    """Same module types by name, and every parameter and buffer equal (dtype, shape, values)."""
    kinds = {n: type(m) for n, m in got.named_modules()}
    assert kinds == {n: type(m) for n, m in want.named_modules()}
    a, b = got.state_dict(), want.state_dict()
    assert list(a) == list(b)
    for name in a:  # bit for bit; random Q2_K bytes may hold NaN scales: NaN == NaN here
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, equal_nan=True, msg=name)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL],
                         ids=lambda q: q.name)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_compact_load_equals_the_swap(tmp_path, monkeypatch, qtype: Q, tied: bool) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, tied=tied, seed=5)
    monkeypatch.setattr(from_file, "BAND_BYTES", 300)  # several bands per matrix
    got = clearlm.load(path, threads=1)  # compact is the default for a quantized GGUF
    want = swapped_reference(path)
    assert got.weights == "compact"
    assert_same_model(got.transformer, want)
    assert isinstance(got.transformer.embed_tokens, QuantEmbedding)
    assert isinstance(got.transformer.layers[1].mlp.down_proj, QuantLinear)
    if tied:  # one packed table behind the embedding and the head
        assert got.transformer.lm_head.codes is got.transformer.embed_tokens.codes
    with torch.inference_mode():
        assert torch.equal(got.transformer(TOKENS), want(TOKENS))
    assert got.weight_bytes == GGUFCheckpoint(path).planned_weights("compact")[1]


def test_types_not_packed_are_dequantized_as_float32(tmp_path) -> None:
    """F32 files load as the float32 path does, with nothing to say (F16 / BF16 matrices are
    kept 16-bit: tests/quant/test_quant_half.py)."""
    path = write_tiny_llama(tmp_path / "F32.gguf", matrix_type=Q.F32, d_model=256, d_ff=256,
                            seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = clearlm.load(path, threads=1)
    assert [str(w.message) for w in caught if str(w.message).startswith("clearlm: ")] == []
    assert got.weights == "float32"
    assert_same_model(got.transformer, load_gguf_model(path).model)


def test_the_float_held_warning_names_count_and_memory() -> None:
    """A type held as float32 for want of a compact form (an F16 / BF16 tensor a family
    converts, stacked experts) says so in one line: the count and the memory above the file's.
    The embedding (262 x 256) and 2 layers of 5 matrices of 256 x 256 and K, V of 128 x 256:
    2 bytes a value in the file, 4 in memory."""
    n = 262 * 256 + 2 * (5 * 256 * 256 + 2 * 128 * 256)
    assert n == 853_504  # 3.41 MB as float32, 1.71 MB as BF16
    use = FormatUse(NO_PACKER, count=15, file_bytes=2 * n, held_bytes=4 * n)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_held_above_file([("BF16", use)])
    assert [str(w.message) for w in caught] == [
        "clearlm: 15 BF16 tensors have no compact form and are held as float32: "
        "3.4 MB instead of the file's 1.7 MB (+1.7 MB)"]


def test_weights_values(tmp_path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0)
    assert clearlm.load(path, weights="float32").weights == "float32"
    assert clearlm.load(path, dtype="bfloat16").weights == "float32"  # half dtype: float
    with pytest.raises(SamplingParamsError, match="unknown weights 'int4'; use compact or float32"):
        clearlm.load(path, weights="int4")
    with pytest.raises(SamplingParamsError, match="compact weights compute in float32"):
        clearlm.load(path, weights="compact", dtype="bfloat16")


def test_compact_frees_the_file_map(tmp_path) -> None:
    """After a load the checkpoint no longer maps the file (the model holds copies only)."""
    ckpt = GGUFCheckpoint(write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q4_0))
    reader = ckpt.reader
    ckpt.load(weights="compact")
    assert reader._map.closed and "reader" not in ckpt.__dict__


def test_smollm2_compact_equals_the_swap(smollm2_path) -> None:
    """The real file (Q4_1 blocks, a Q8_0 embedding packed in many bands)."""
    got = clearlm.load(smollm2_path, threads=1)
    assert got.weights == "compact"
    assert_same_model(got.transformer, swapped_reference(smollm2_path))


def test_smollm2_compact_same_greedy_text_as_float32(smollm2_path, smollm2) -> None:
    compact = clearlm.load(smollm2_path, weights="compact")
    assert smollm2.weights == "float32" and compact.weights == "compact"
    assert compact.weight_bytes < smollm2.weight_bytes / 5
    worst = 0.0
    for name, text in PROMPTS.items():
        want = smollm2.generate(text, max_new_tokens=12, temperature=0)
        got = compact.generate(text, max_new_tokens=12, temperature=0)
        assert got.tokens == want.tokens, name
        # a whole prompt runs the dequantize + matmul path; 3 tokens the kernel (decode) path
        for ids in (smollm2.encode(text), smollm2.encode(text)[:3]):
            diff = (compact.logits(ids) - smollm2.logits(ids)).abs().max().item()
            worst = max(worst, diff)
    print(f"\nSmolLM2 compact vs float32: max |Δlogit| {worst:.2e} over {len(PROMPTS)} prompts")
    assert worst < 1e-3
