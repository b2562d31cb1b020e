"""clearlm.quant: packing is exact against gguf.quants.dequantize; QuantLinear matches F.linear.

References: gguf-py's own quantize/dequantize (llama.cpp's reference implementation in Python)
and torch's float32 F.linear on the dequantized weight. The matmul bound is the classic float32
summation bound |Δ| ≤ K·u·(|x| @ |W|ᵀ) (u = 2⁻²⁴, Higham, Accuracy and Stability, §3.1)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tiny_gguf import random_raw

from clearlm.loading.gguf_file import GGUFFile
from clearlm.quant import linear as qlinear
from clearlm.quant.kernels import load_kernels
from clearlm.quant.lattice import BLOCK
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import SUPPORTED, UnsupportedQuantError, dequantize_packed, pack_blocks

CACHE = Path.home() / ".cache" / "clearlm"
REAL = [
    CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    CACHE / "gemma-3-270m-q4_k_m.gguf",
]
U = 2.0**-24


def random_blocks(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random raw bytes for an (n, k) tensor of qtype with every float16 field a finite number:
    covers every code pattern, including those gguf's quantizer never produces."""
    rng = np.random.default_rng(seed)
    if qtype in BLOCK:  # lattice i-quants, TQ: float16 fields elsewhere (IQ1_M: in nibbles)
        return random_raw(rng, (n, k), qtype, scale=0.01).reshape(n, -1)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    f16_fields = {Q.Q6_K: [208], Q.Q4_K: [0, 2], Q.Q4_1: [0, 2], Q.Q5_1: [0, 2], Q.Q5_K: [0, 2],
                  Q.Q2_K: [80, 82], Q.Q3_K: [108]}.get(qtype, [0])
    for off in f16_fields:
        d = (rng.standard_normal(raw.shape[0]) * 0.01).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


def assert_exact(raw: np.ndarray, qtype: Q, n: int, k: int) -> None:
    ref = dequantize(raw, qtype).reshape(n, k)  # (N, K) float32
    p = pack_blocks(raw, qtype, (n, k))
    np.testing.assert_array_equal(dequantize_packed(p).numpy(), ref)
    kern = load_kernels()
    if kern is not None:
        mn = p.min if p.min is not None else torch.empty(0, dtype=p.scale.dtype)
        got = kern.dequant(p.codes, p.scale, mn, p.bits, p.block, 0, n).numpy()
        np.testing.assert_array_equal(got, ref)  # equal values (+0.0 == -0.0)


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_pack_random_blocks_exact(qtype: Q) -> None:
    assert_exact(random_blocks(qtype, 6, 512), qtype, 6, 512)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
def test_pack_quantized_by_gguf_exact(qtype: Q) -> None:
    w = np.random.default_rng(1).standard_normal((5, 256)).astype(np.float32)
    assert_exact(quantize(w, qtype), qtype, 5, 256)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("-q4")[0])
def test_pack_real_gguf_tensors_exact(path: Path, smollm2_path: Path) -> None:
    """One tensor of each quantized type per real file (the smallest, to keep the test quick).
    Read with clearlm's GGUFFile (equal to GGUFReader: tests/loading/test_gguf_file.py), which
    skips GGUFReader's ~10-20 s parse of a large vocabulary."""
    for file in (path, smollm2_path):
        if not file.exists():
            pytest.skip(f"{file} not pulled")
    smallest: dict[str, object] = {}
    for file in (path, smollm2_path):
        for t in GGUFFile(file).tensors:
            if t.tensor_type in SUPPORTED and len(t.shape) == 2:
                best = smallest.get(t.tensor_type.name)
                if best is None or t.n_bytes < best.n_bytes:
                    smallest[t.tensor_type.name] = t
    assert len(smallest) >= 3
    for t in smallest.values():
        assert_exact(t.data, t.tensor_type, int(t.shape[1]), int(t.shape[0]))


def test_unsupported_type_raises() -> None:
    with pytest.raises(UnsupportedQuantError, match="MXFP4"):
        pack_blocks(np.zeros((1, 17), np.uint8), Q.MXFP4, (1, 32))
    with pytest.raises(UnsupportedQuantError, match="multiple"):
        pack_blocks(np.zeros((1, 34), np.uint8), Q.Q8_0, (1, 40))


def assert_within_float32_bound(raw: np.ndarray, qtype: Q, n: int, k: int, t: int,
                                path_kind: str, tile: int = 1) -> None:
    """QuantLinear on the blocks ``raw`` of an (n, k) weight (in row tiles of ``tile``), with a
    bias, against F.linear on gguf's dequantized weight, for x (2, t, k): within the float32
    summation bound, and equal where both run torch's matmul on the same dequantized weight."""
    from clearlm.quant.tiles import tile_rows

    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))  # (N, K)
    p = pack_blocks(raw, qtype, (n, k))
    bias = torch.randn(n)
    layer = QuantLinear(p if tile == 1 else tile_rows(p, tile), bias)
    x = torch.randn(2, t, k)  # (B, T, K)
    y, ref = layer(x), F.linear(x, w, bias)
    assert y.shape == ref.shape == (2, t, n)
    bound = k * U * (x.abs() @ w.abs().T + bias.abs())
    excess = ((y - ref).abs() - bound).max().item()
    assert excess <= 0, f"max |Δ| {(y - ref).abs().max().item():.3g} exceeds the bound"
    if path_kind == "torch" or t > qlinear.SMALL_M:
        # the same dequantized weight and torch's matmul: identical to the reference
        assert torch.equal(y, ref)


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
@pytest.mark.parametrize("t", [1, 3, 8, 21])  # decode, kernel: 6 and 16 (SMALL_M) rows, prefill
def test_quant_linear_matches_f_linear(qtype: Q, t: int, path_kind: str, monkeypatch) -> None:
    n, k = 80, 512
    monkeypatch.setattr(qlinear, "CHUNK_ELEMS", 32 * k)  # force several chunks on the prefill path
    assert_within_float32_bound(random_blocks(qtype, n, k, seed=2), qtype, n, k, t, path_kind)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q4_K], ids=lambda q: q.name)
@pytest.mark.parametrize("fields", [False, True], ids=["bytes", "fields"])
def test_torch_path_dequantizes_only_the_band(qtype: Q, fields: bool, monkeypatch) -> None:
    """Without the kernel, a band of rows of a tiled weight is dequantized from those rows alone
    (it was the whole matrix, sliced, for every band: 0.5 tok/s on SmolLM2) and equals the
    whole matrix's rows; a prefill through bands equals F.linear with the dequantized weight."""
    from clearlm.quant import pack
    from clearlm.quant.tiles import tile_rows

    n, k = 128, 512
    monkeypatch.setattr(qlinear, "load_kernels", lambda: None)
    raw = random_blocks(qtype, n, k, seed=5)
    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))  # (N, K)
    tiled = tile_rows(pack_blocks(raw, qtype, (n, k)), 8, fields=fields and qtype == Q.Q5_0)
    layer = QuantLinear(tiled)
    sizes = []
    real = qlinear.dequantize_packed

    def spy(p: pack.Packed) -> torch.Tensor:
        sizes.append(p.shape[0])
        return real(p)

    monkeypatch.setattr(qlinear, "dequantize_packed", spy)
    assert torch.equal(layer.dequantized(64, 128), w[64:128])
    assert torch.equal(layer.dequantized(8, 24), w[8:24])
    assert sizes == [64, 16]
    monkeypatch.setattr(qlinear, "CHUNK_ELEMS", 64 * k)  # two bands of 64 rows
    x = torch.randn(20, k)  # (M, K): the prefill path
    assert torch.equal(layer(x), F.linear(x, w))
    assert sizes[2:] == [64, 64]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q6_K], ids=lambda q: q.name)
def test_kernel_row_does_not_depend_on_batch_rows(qtype: Q) -> None:
    """The kernel computes 7 rows of x in tiles of 4, 2 and 1 rows: each row's result equals,
    bit for bit, the same row computed alone (the summation order is per row)."""
    kern = load_kernels()
    if kern is None:
        pytest.skip("no C++ compiler: kernel path unavailable")
    n, k = 24, 512
    p = pack_blocks(random_blocks(qtype, n, k, seed=3), qtype, (n, k))
    mn = p.min if p.min is not None else torch.empty(0, dtype=p.scale.dtype)
    x = torch.randn(7, k)  # (M, K)
    y = kern.qmm(x, p.codes, p.scale, mn, p.bits, p.block)  # (M, N)
    for m in range(7):
        assert torch.equal(y[m], kern.qmm(x[m : m + 1], p.codes, p.scale, mn, p.bits, p.block)[0])


def test_quant_linear_bf16_input_and_bad_width() -> None:
    raw = random_blocks(Q.Q8_0, 16, 64)
    layer = QuantLinear(pack_blocks(raw, Q.Q8_0, (16, 64)))
    x = torch.randn(1, 1, 64).bfloat16()
    assert layer(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="64 input features"):
        layer(torch.randn(1, 1, 32))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_quant_embedding_rows_exact(qtype: Q) -> None:
    from clearlm.quant.embedding import QuantEmbedding

    n, k = 40, 256
    raw = random_blocks(qtype, n, k, seed=4)
    table = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))  # (V, D)
    emb = QuantEmbedding(pack_blocks(raw, qtype, (n, k)))
    ids = torch.tensor([[3, 0, 39, 3], [7, 7, 1, 20]])  # (B, T)
    got = emb(ids)
    assert got.shape == (2, 4, k)
    assert torch.equal(got, F.embedding(ids, table))


def test_a_kernel_build_says_so_on_stderr(tmp_path, monkeypatch, capsys) -> None:
    """A first use that must compile the kernel (~1 minute) prints one line first, rather than
    leaving the user at a silent prompt (a fresh-user run found that)."""
    import types

    import torch.utils.cpp_extension as cpp

    from clearlm.quant import kernels

    monkeypatch.setattr(kernels, "_loaded", [])  # as in a fresh process
    monkeypatch.setattr(kernels, "build_dir", lambda: tmp_path / "qgemv-test")
    monkeypatch.delenv("CLEARLM_NO_KERNELS", raising=False)
    built = types.ModuleType("fake_kernel")
    monkeypatch.setattr(cpp, "load", lambda **kwargs: built)  # the build itself, skipped
    assert kernels.load_kernels() is built
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"clearlm: building the quantized kernel once into {tmp_path / 'qgemv-test'} "
                   "(about a minute on 2 cores; `make kernels` does it ahead)"]


def test_the_build_target_is_in_the_key(monkeypatch) -> None:
    """CLEARLM_KERNEL_MARCH picks -march and keys the build directory (builds never mix); an
    unset or empty variable is native, the default build's key; a flag-like value is refused."""
    from clearlm.quant import kernels

    monkeypatch.delenv(kernels.MARCH_ENV, raising=False)
    native = kernels.build_dir()
    assert kernels.cflags() == ["-O3", "-march=native", "-fopenmp"]
    monkeypatch.setenv(kernels.MARCH_ENV, "")
    assert kernels.build_dir() == native
    dirs = {native}
    for march in ("haswell", "x86-64"):
        monkeypatch.setenv(kernels.MARCH_ENV, march)
        assert f"-march={march}" in kernels.cflags()
        dirs.add(kernels.build_dir())
    assert len(dirs) == 3
    monkeypatch.setenv(kernels.MARCH_ENV, "native -O0")
    with pytest.raises(ValueError, match="not a -march target name"):
        kernels.cflags()


@pytest.mark.skipif(load_kernels() is None, reason="no C++ kernel (needs g++)")
def test_the_loaded_build_is_the_target_asked_for() -> None:
    """Under `make kernel-isa-check` the loaded kernel is the body asked for: haswell (AVX2 +
    FMA + F16C) has the int8 body and wants 5-bit bit fields and tiles of 4; x86-64 (plain C++)
    has no int8 body. The native build is whatever this CPU has."""
    from clearlm.quant import kernels

    kern = load_kernels()
    march = os.environ.get(kernels.MARCH_ENV) or "native"
    if march == "haswell":
        assert kern.fields_preferred() and kern.qmm_i8_available()
        assert kern.preferred_tile(4, 32) == 4
    elif march == "x86-64":
        assert kern.fields_preferred() and not kern.qmm_i8_available()
        assert kern.preferred_tile(4, 32) == 4
