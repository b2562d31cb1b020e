"""The K-quants that had no layout of their own in the kernel once (Q2_K, Q3_K, Q5_K: 2/3-bit
field codes and 5-bit blocks with the file's super-block heads, quant/kheads.py) and IQ4's table
codes, from blocks of real weights and from tiny GGUF files.

References: ``gguf.quants.dequantize`` (llama.cpp's reference dequantization in Python) for the
values, bit for bit, on blocks of real SmolLM2 weights quantized by a simple per-block quantizer
(random blocks of every format: tests/quant/test_quant.py); torch's float32 F.linear on those
values for the products, within the float32 summation bound |Δ| ≤ K·u·(|x| @ |W|ᵀ) (u = 2⁻²⁴,
Higham §3.1) that tests/quant/test_quant.py holds every format to; and the float32 load of the
same tiny GGUF.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_compact_load import TOKENS
from test_quant import assert_within_float32_bound, random_blocks
from tiny_gguf import random_raw, write_tiny_llama

import clearlm
from clearlm.errors import InvalidModelFileError
from clearlm.loading.checkpoint import GGUFCheckpoint
from clearlm.loading.gguf import open_gguf
from clearlm.quant import linear as qlinear
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import dequantize_packed, pack_blocks
from clearlm.quant.tiles import tile_rows

needs_kernel = pytest.mark.skipif(load_kernels() is None, reason="no C++ kernel (needs g++)")
KQ = pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q5_K], ids=lambda q: q.name)


def assert_every_path_gives(p, ref: np.ndarray) -> None:
    """``p`` dequantized by torch, by the operator a traced embedding lookup calls without the
    kernel (quant/ops.py), and with it (the kernel's dequant, csrc/qgemv_ops.cpp): ``ref`` (N, K)
    bit for bit."""
    np.testing.assert_array_equal(dequantize_packed(p).numpy(), ref)
    mn = p.min if p.min is not None else torch.empty(0, dtype=p.scale.dtype)
    np.testing.assert_array_equal(
        torch.ops.clearlm.dequant(p.codes, p.scale, mn, p.bits, p.block).numpy(), ref)
    if load_kernels() is not None:
        np.testing.assert_array_equal(kernel_dequant(p), ref)
        np.testing.assert_array_equal(
            torch.ops.clearlm_kernels.dequant(p.codes, p.scale, mn, p.bits, p.block).numpy(), ref)


def kernel_dequant(p) -> np.ndarray:
    mn = p.min if p.min is not None else torch.empty(0, dtype=p.scale.dtype)
    return load_kernels().dequant(p.codes, p.scale, mn, p.bits, p.block, 0, p.shape[0]).numpy()


@KQ
@pytest.mark.parametrize("tile", [1, 4, 8])
def test_random_blocks_exact(qtype: Q, tile: int) -> None:
    """The torch path and the kernel give gguf's values bit for bit, row-major or in tiles;
    the packed weight holds exactly the file's bytes."""
    n, k = 16, 1024
    raw = random_blocks(qtype, n, k, seed=7)
    ref = dequantize(raw, qtype).reshape(n, k)  # (N, K) float32
    assert np.isfinite(ref).all()
    p = pack_blocks(raw, qtype, (n, k))
    assert p.nbytes() == raw.nbytes
    p = p if tile == 1 else tile_rows(p, tile)
    assert_every_path_gives(p, ref)


def simple_quantize(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Blocks close to ``w`` (rows, values) without gguf's quantizer (it has none for these
    types): random blocks whose d / dmin are set from each block's range, codes random. Only
    the scales' magnitudes follow the data: enough to give realistic float16 scale ranges."""
    raw = random_raw(rng, w.shape, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, size)
    amax = np.abs(w.reshape(-1, block)).max(axis=1)  # (n_blocks,)
    d = (amax / 63 / 31).astype(np.float16)
    at = {Q.Q2_K: 80, Q.Q3_K: 108}.get(qtype, 0)
    blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


@KQ
def test_scales_from_real_weights_exact(qtype: Q, smollm2) -> None:
    """Blocks whose float16 scales span a real matrix's range (SmolLM2's first down
    projection) instead of random ones: still gguf's values bit for bit."""
    w = smollm2.transformer.layers[0].mlp.down_proj.weight.detach().numpy()[:64]  # (64, 1536)
    raw = simple_quantize(w, qtype, np.random.default_rng(3))
    ref = dequantize(raw, qtype).reshape(w.shape)
    p = pack_blocks(raw, qtype, w.shape)
    assert_every_path_gives(p, ref)


@KQ
@pytest.mark.parametrize("t", [1, 5, 21])  # decode, kernel with several rows, chunked prefill
@pytest.mark.parametrize("tile", [1, 8])
def test_product_within_the_float32_bound(qtype: Q, t: int, tile: int, path_kind: str,
                                          monkeypatch) -> None:
    n, k = 40, 512
    monkeypatch.setattr(qlinear, "CHUNK_ELEMS", 16 * k)  # several bands on the prefill path
    raw = random_blocks(qtype, n, k, seed=2)
    assert_within_float32_bound(raw, qtype, n, k, t, path_kind, tile)


@needs_kernel
@KQ
def test_kernel_row_does_not_depend_on_the_rows_beside_it(qtype: Q) -> None:
    """Each row of x and of W sums in one order: 7 rows of x at once or alone, and row-major or
    tiled W, give the same products bit for bit."""
    kern = load_kernels()
    n, k = 24, 512
    p = pack_blocks(random_blocks(qtype, n, k, seed=3), qtype, (n, k))
    t = tile_rows(p, 8)
    mn = p.min if p.min is not None else torch.empty(0, dtype=torch.float16)
    tmn = t.min if t.min is not None else torch.empty(0, dtype=torch.float16)
    x = torch.randn(7, k)  # (M, K)
    y = kern.qmm(x, p.codes, p.scale, mn, p.bits, p.block)  # (M, N)
    assert torch.equal(y, kern.qmm(x, t.codes, t.scale, tmn, t.bits, t.block))
    if qtype != Q.Q5_K:  # field codes have no int8 body (Q5_K's is test_quant_i8.py's)
        assert torch.equal(y, kern.qmm_i8(x, p.codes, p.scale, mn, p.bits, p.block))
    for m in range(7):
        assert torch.equal(y[m], kern.qmm(x[m : m + 1], p.codes, p.scale, mn, p.bits, p.block)[0])


@KQ
def test_tiny_gguf_loads_compact(tmp_path, qtype: Q) -> None:
    """Every matrix packed, memory = the file's bytes for them, and the logits equal the float32
    load's within the bound the other formats keep on SmolLM2 (test_compact_load.py)."""
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, d_model=256, d_ff=256,
                            seed=4, tied=False)
    got = clearlm.load(path, threads=1)
    want = clearlm.load(path, threads=1, weights="float32")
    assert got.weights == "compact"
    file = open_gguf(path)
    quantized = [t for t in file.tensors if t.tensor_type == qtype]
    assert len(quantized) == 16  # embedding, head, 2 layers of 7
    mode, held, n_packed = GGUFCheckpoint(path).planned_weights("compact")
    f32 = sum(t.n_bytes for t in file.tensors if t.tensor_type == Q.F32)
    assert (mode, n_packed) == ("compact", 16)
    assert held - f32 == sum(t.n_bytes for t in quantized) == got.weight_bytes - f32
    layer = got.transformer.layers[1].mlp.down_proj
    assert isinstance(layer, QuantLinear) and layer.qtype == qtype.name
    with torch.inference_mode():
        for ids in (TOKENS, TOKENS[:, :1]):  # prefill bands, then the decode kernel
            a, b = got.transformer(ids), want.transformer(ids)
            assert torch.isfinite(b).all()
            assert (a - b).abs().max().item() < 1e-3 * max(1.0, b.abs().max().item())


def test_traced_decode_step_equals_eager(tmp_path) -> None:
    """The decode step of a model of Q2_K's / Q3_K's field codes, Q5_K's heads and IQ4's
    table codes (the embedding IQ4_NL, whose eager lookup builds a table tensor) traces whole
    with torch.export, as the compiled steps trace it (clearlm.runtime.aot_build), and the
    traced graph's logits equal the eager step's: the embedding's rows through the
    dequantization operator, the products through qmm."""
    from clearlm.generation.loop import decode_step, prefill
    from clearlm.model.kv_cache import KVCache
    from clearlm.runtime.aot_build import _Step, rope_tables, tables_as_inputs

    types = {"token_embd": Q.IQ4_NL, "output": Q.Q2_K, "ffn_down": Q.Q3_K, "attn_v": Q.IQ4_XS}
    path = write_tiny_llama(tmp_path / "t.gguf", n_layers=1, matrix_type=Q.Q5_K, d_model=256,
                            d_ff=256, seed=4, tied=False, tensor_types=types)
    net = clearlm.load(path, threads=1).transformer
    held = {m.qtype for m in net.modules() if hasattr(m, "qtype")}
    assert held == {"IQ4_NL", "IQ4_XS", "Q3_K", "Q2_K", "Q5_K"}
    cache = net.new_cache(1, 12)
    with torch.inference_mode():
        prefill(net, TOKENS[:, :5], cache)
    token = torch.tensor([[int(TOKENS[0, 5])]])  # (1, 1)
    tables = rope_tables(net)  # inputs of the step (read before the stand-ins replace them)
    args = lambda c: (token, c.lengths, *tables, *c.keys, *c.values)  # noqa: E731
    with tables_as_inputs(net) as rows, torch.no_grad():
        traced = torch.export.export(_Step(net, rows).eval(), args(cache), strict=False).module()
        copy = KVCache.from_buffers([k.clone() for k in cache.keys],
                                    [v.clone() for v in cache.values], cache.lengths.clone())
        got = traced(*args(copy))  # (1, V)
    with torch.inference_mode():
        want = decode_step(net, token, cache)  # (1, V)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(copy.keys[0], cache.keys[0], rtol=0, atol=1e-6)


def write_ragged(path, qtype: Q) -> None:
    """A GGUF whose one tensor, of ``qtype``, has rows of 100 values: not whole blocks. gguf's
    writer refuses to write one, so a file of 4 rows of one block is written and its tensor
    table's row length (GGUF: name, n_dims uint32, dims uint64 innermost first) edited."""
    name = b"blk.0.ffn_down.weight"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    raw = np.zeros((4, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)  # (rows, bytes per row)
    w.add_tensor(name.decode(), raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    at = data.index(name) + len(name) + 4  # dims[0]: the row length
    data[at : at + 8] = (100).to_bytes(8, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("qtype", [Q.Q5_K, Q.IQ4_NL, Q.Q8_0], ids=lambda q: q.name)
def test_rows_not_whole_blocks_one_clear_error(tmp_path, qtype: Q) -> None:
    path = tmp_path / "ragged.gguf"
    write_ragged(path, qtype)
    block = GGML_QUANT_SIZES[qtype][0]
    with pytest.raises(InvalidModelFileError) as e:
        open_gguf(path)
    msg = str(e.value)
    assert msg == (f"{path}: tensor blk.0.ffn_down.weight is {qtype.name} with rows of 100 "
                   f"values, not a whole number of its {block}-value blocks (llama.cpp refuses "
                   "such a file too); the file was written wrong: convert the model again")
    assert "reshape" not in msg and "download" not in msg


def test_cli_info_and_warning_name_each_format(tmp_path) -> None:
    """`clearlm info` lists every GGUF type with how a load holds it; BF16 matrices are kept
    16-bit (the file's bytes), so a load has no `warning:` line to print."""
    from test_cli import cli

    path = write_tiny_llama(tmp_path / "mixed.gguf", matrix_type=Q.Q5_K, d_model=256, d_ff=256,
                            tensor_types={"ffn_up": Q.BF16, "attn_v": Q.IQ4_NL}, seed=1)
    info = cli("info", str(path))
    assert info.returncode == 0, info.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in info.stdout.splitlines() if line.count("│") == 6}
    # (tensors, file MiB, memory MiB, held as): BF16 ffn_up 256 x 256 twice, 2 bytes a value
    assert rows["BF16"] == ["2", "0.2", "0.2", "compact: 16-bit, as stored"]
    # the tied embedding and 2 layers of 7 matrices, less the 2 ffn_up and the 2 attn_v
    assert rows["Q5_K"][0] == "11" and rows["Q5_K"][3] == "compact: codes + scales"
    assert rows["Q5_K"][1] == rows["Q5_K"][2]  # the file's bytes
    assert rows["IQ4_NL"][0] == "2" and rows["IQ4_NL"][3] == "compact: codes + scales"
    assert rows["IQ4_NL"][1] == rows["IQ4_NL"][2]  # the file's bytes
    assert rows["F32"][3] == "float32, as stored"
    gen = cli("generate", "-m", str(path), "hi", "-n", "1", "--temperature", "0")
    assert gen.returncode == 0, gen.stderr
    lines = gen.stderr.splitlines()
    assert not any(line.startswith("warning:") for line in lines)
    assert lines[0].startswith("loading mixed.gguf") and "compact weights" in lines[0]
