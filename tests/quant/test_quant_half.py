"""F16 / BF16 matrices kept 16-bit (quant/half.py, csrc/qgemv_half.cpp, loading/compact/half.py).

The reference is the same 16-bit values widened to float32 (exact: every float16 and bfloat16
value is a float32 value) and multiplied in float64. The layers sum in float32 in another order
than the reference, so the bound is the standard one for a sum of K float32 products (Higham,
Accuracy and Stability of Numerical Algorithms, §3.1): |y - y_ref| ≤ K · 2^-24 · Σ_k |x_k w_k|
(per output; the kernel's 16 lanes and a final sum of 16 make its error smaller still).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

import clearlm
import clearlm.quant.half as half
import clearlm.quant.linear as qlinear
from clearlm.loading.checkpoint import FolderCheckpoint, GGUFCheckpoint, load_gguf_model
from clearlm.quant.half import HalfEmbedding, HalfLinear
from clearlm.quant.kernels import load_kernels

DTYPES = [torch.float16, torch.bfloat16]
TOKENS = torch.tensor([[1, 72, 101, 108, 108, 111, 32, 119, 2]])  # (B, T)


def assert_within_float32_sum(
    y: torch.Tensor, x: torch.Tensor, w16: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    """y (M, N) against x (M, K) @ w16.float().T (+ bias) in float64, within K · 2^-24 · Σ|x w|
    (+ one rounding of the bias add)."""
    w = w16.double()
    ref = x.double() @ w.T  # (M, N)
    bound = x.shape[1] * 2.0**-24 * (x.double().abs() @ w.abs().T)  # (M, N)
    if bias is not None:
        ref = ref + bias.double()
        bound = bound + 2.0**-24 * ref.abs()
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch) -> str:
    """Run a test on the C++ kernel and on the pure-torch fallback (load_kernels() None)."""
    if request.param == "kernel" and load_kernels() is None:
        pytest.skip("the C++ kernel is not built here")
    if request.param == "torch":
        monkeypatch.setattr(half, "load_kernels", lambda: None)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_products_equal_the_float32_reference(path: str, dtype: torch.dtype) -> None:
    """Odd shapes (N not a multiple of 4, K not of 16: the kernel's tails), decode-sized and
    prefill-sized M, with and without a bias."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(67, 100, generator=g).to(dtype)  # (N, K)
    bias = torch.randn(67, generator=g)
    for m in (1, 3, 5, 16, 40):  # <= 16: the kernel; 40: bands of float32 rows and torch.mm
        x = torch.randn(m, 100, generator=g)
        assert_within_float32_sum(HalfLinear(w)(x), x, w)
        assert_within_float32_sum(HalfLinear(w, bias)(x), x, w, bias)
    x3 = torch.randn(2, 3, 100, generator=g)  # (B, T, K) in, (B, T, N) out, in x's dtype
    assert HalfLinear(w)(x3).shape == (2, 3, 67)
    assert HalfLinear(w)(x3.to(torch.bfloat16)).dtype == torch.bfloat16


def test_bands_equal_one_product(monkeypatch) -> None:
    """Prefill widens a band of rows at a time (CHUNK_ELEMS values): cut into 3 bands of 64
    rows (and a remainder) the product is the same as F.linear on the whole widened matrix."""
    monkeypatch.setattr(qlinear, "CHUNK_ELEMS", 64 * 96)  # band_rows reads it there
    g = torch.Generator().manual_seed(1)
    w = torch.randn(150, 96, generator=g).to(torch.bfloat16)
    x = torch.randn(40, 96, generator=g)
    b = torch.randn(150, generator=g)
    assert torch.equal(half.banded_linear(x, w, b), F.linear(x, w.float(), b))
    assert torch.equal(half.banded_linear(x, w, None), F.linear(x, w.float()))


@pytest.mark.skipif(load_kernels() is None, reason="the C++ kernel is not built here")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_kernel_rows_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    """A row's sum has the same order whatever M: a batch's rows equal one-row calls bit for bit
    (a sequence decodes alike alone or in a batch)."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(33, 200, generator=g).to(dtype)
    x = torch.randn(7, 200, generator=g)
    kern = load_kernels()
    whole = kern.hmm(x, w)  # (7, 33)
    for m in range(7):
        assert torch.equal(whole[m], kern.hmm(x[m : m + 1], w)[0])


def test_memory_is_the_16_bit_bytes_and_the_embedding_gathers_rows() -> None:
    w = torch.randn(50, 32).to(torch.float16)
    lin, emb = HalfLinear(w), HalfEmbedding(w)
    assert lin.weight_nbytes() == 50 * 32 * 2 and lin.weight.dtype == torch.float16
    assert emb.weight.data_ptr() == lin.weight.data_ptr()  # a tied pair shares one table
    ids = torch.tensor([[3, 0, 49]])
    assert torch.equal(emb(ids), w.float()[ids])
    with pytest.raises(IndexError):
        emb(torch.tensor([50]))
    with pytest.raises(ValueError, match="2-d float16/bfloat16"):
        HalfLinear(w.float())


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16], ids=lambda q: q.name)
def test_tiny_gguf_loads_16_bit_with_the_float32_logits(tmp_path, path: str, qtype: Q) -> None:
    """A tiny llama (tied embedding and head, Q/K rows un-permuted) whose matrices are F16 /
    BF16: the compact load keeps them 16-bit (the file's bytes, no warning) and gives the
    float32 load's logits within float32 summation order (its logits are ~1e-1, sums of 256
    products: a difference ≤ 1e-5)."""
    gguf = write_tiny_llama(
        tmp_path / f"{qtype.name}.gguf", matrix_type=qtype, d_model=256, d_ff=256, seed=2
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = clearlm.load(gguf, threads=1)
    assert [str(w.message) for w in caught if str(w.message).startswith("clearlm: ")] == []
    model = got.transformer
    assert got.weights == "compact"
    assert isinstance(model.embed_tokens, HalfEmbedding)
    assert isinstance(model.layers[1].mlp.down_proj, HalfLinear)
    assert model.lm_head.weight is model.embed_tokens.weight  # tied: one table
    # 262 x 256 embedding, 2 layers of 5 matrices of 256 x 256 and K, V of 128 x 256: 2 bytes
    # a value in memory as in the file
    n = 262 * 256 + 2 * (5 * 256 * 256 + 2 * 128 * 256)
    halves = {
        id(m.weight): m.weight.nbytes
        for m in model.modules()
        if isinstance(m, HalfLinear | HalfEmbedding)
    }
    assert sum(halves.values()) == 2 * n
    ckpt = GGUFCheckpoint(gguf)
    matrices = [t for t in ckpt.reader.tensors if t.tensor_type == qtype and len(t.shape) == 2]
    assert sum(t.n_bytes for t in matrices) == 2 * n  # the file's bytes of those matrices
    assert got.weight_bytes == ckpt.planned_weights("compact")[1]
    ref = load_gguf_model(gguf).model  # every tensor float32
    with torch.inference_mode():
        for tokens in (TOKENS, TOKENS[:, :1]):  # prefill-sized and decode-sized products
            torch.testing.assert_close(model(tokens), ref(tokens), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_hf_folder_keeps_16_bit_matrices(tmp_path, dtype: torch.dtype) -> None:
    """A Hugging Face folder saved in float16 / bfloat16: compact weights keep its matrices
    16-bit (half the float32 bytes) with the float32 load's logits (same 16-bit values widened,
    float32 summation order: ≤ 1e-5 on logits of ~1e-1); the norms are float32."""
    from hf_tiny import TINY, save_tiny
    from transformers import LlamaConfig, LlamaForCausalLM

    model = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path / "f32")
    model.to(dtype).save_pretrained(tmp_path / "half")
    ckpt = FolderCheckpoint(tmp_path / "half")
    compact, ref = ckpt.load(weights="compact"), ckpt.load(weights="float32")
    assert compact.weights == "compact" and ref.weights == "float32"
    t = compact.model
    assert isinstance(t.layers[0].self_attn.q_proj, HalfLinear)
    assert isinstance(t.embed_tokens, HalfEmbedding) and t.lm_head.weight.dtype == dtype
    assert t.layers[0].input_layernorm.weight.dtype == torch.float32
    mode, planned, n = ckpt.planned_weights("compact")
    assert (mode, n) == ("compact", 2 + 7 * 2)  # embedding, head, 7 matrices a layer
    assert compact.weight_bytes == planned < ref.weight_bytes
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    with torch.inference_mode():
        for tokens in (ids, ids[:, :1]):
            torch.testing.assert_close(t(tokens), ref.model(tokens), rtol=0, atol=1e-5)
