"""clearlm.quant.fuse: Q/K/V and gate/up as one compact matrix give the unfused model's values.

Reference: the same loaded model with fusion switched off (``qkv_split`` / ``gate_up_split``
emptied: the original q/k/v/gate/up modules, whose buffers are views of the fused ones, are
called one by one). Decode-sized calls go through the kernel, which sums each output row in the
same order whatever rows are computed with it: bit-identical. Prefill dequantizes and uses
torch's float32 matmul on a larger N: equal up to float32 summation order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_quant import random_blocks
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.generation.loop import decode_step, prefill
from clearlm.inspect.distance import cache_for
from clearlm.model.attention import Attention
from clearlm.model.ffn import GatedFFN
from clearlm.quant import fuse
from clearlm.quant.fuse import fuse_projections, join_rows
from clearlm.quant.half import HalfLinear
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import pack_blocks

TOKENS = torch.tensor([[1, 72, 101, 108, 108, 111, 32, 119, 2]])  # (B, T)


def set_fused(model: torch.nn.Module, on: bool, saved: dict) -> None:
    """Switch fusion off (remembering the splits) or back on, in place."""
    for m in model.modules():
        for attr in ("qkv_split", "gate_up_split"):
            if hasattr(m, attr):
                if not on:
                    saved.setdefault(id(m), {})[attr] = getattr(m, attr)
                    setattr(m, attr, ())
                else:
                    setattr(m, attr, saved[id(m)][attr])


def run(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor], dict]:
    """Prefill logits (1, V), 3 decode steps' logits, and every q/k/v/gate hook's recording."""
    rec: dict[str, torch.Tensor] = {}
    points = [p for n, p in model.hooks.points.items() if n.endswith(("q", "k", "v", "pre_act"))]
    for p in points:
        p.record = rec
    try:
        with torch.inference_mode():
            cache = cache_for(model, 16)
            first = prefill(model, TOKENS[:, :5], cache)  # (1, V)
            steps = [decode_step(model, TOKENS[:, 5 + i : 6 + i], cache) for i in range(3)]
    finally:
        for p in points:
            p.record = None
    return first, steps, rec


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_0], ids=lambda q: q.name)
def test_fused_model_equals_unfused(tmp_path, qtype: Q) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, seed=7)
    model = clearlm.load(path, threads=1).transformer
    attn, ffn = model.layers[0].self_attn, model.layers[0].mlp
    assert attn.qkv_split == (4 * 16, 2 * 16, 2 * 16)  # H·Hd, K·Hd, K·Hd rows
    assert ffn.gate_up_split == (128, 128)
    # the original modules hold views of the fused rows: every byte once
    for fused, parts in ((attn.qkv_proj, (attn.q_proj, attn.k_proj, attn.v_proj)),
                         (ffn.gate_up_proj, (ffn.gate_proj, ffn.up_proj))):
        for name in ("codes", "scale", "min"):
            whole = getattr(fused, name)
            assert torch.equal(torch.cat([getattr(m, name) for m in parts]), whole)
            assert {getattr(m, name).untyped_storage().data_ptr() for m in parts} == {
                whole.untyped_storage().data_ptr()}
    first, steps, rec = run(model)
    saved: dict = {}
    set_fused(model, False, saved)
    first0, steps0, rec0 = run(model)
    set_fused(model, True, saved)
    torch.testing.assert_close(first, first0, rtol=1e-5, atol=1e-5)  # prefill: float32 order
    assert rec.keys() == rec0.keys() and len(rec) == 2 * 4  # 2 layers × q, k, v, pre_act
    for name in rec:  # the hooks see the same values (recorded last at the decode step)
        if load_kernels() is not None:
            assert torch.equal(rec[name], rec0[name]), name
        torch.testing.assert_close(rec[name], rec0[name], rtol=1e-5, atol=1e-5)
    for a, b in zip(steps, steps0, strict=True):
        if load_kernels() is not None:  # decode: the kernel, same order per row
            assert torch.equal(a, b)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def quant(qtype: Q, n: int, k: int, seed: int, bias: bool = True) -> QuantLinear:
    b = torch.randn(n, generator=torch.Generator().manual_seed(seed)) if bias else None
    return QuantLinear(pack_blocks(random_blocks(qtype, n, k, seed), qtype, (n, k)), b)


def test_mixed_formats_fuse_what_agrees(tmp_path) -> None:
    """Q8_0 V beside Q5_0 Q/K (Qwen2.5's and Gemma 3's Q4_K_M files): Q and K fused, V alone;
    biases fused with their rows; a Q8_0 up beside a Q5_0 gate: not fused."""
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.F32, seed=1)
    model = clearlm.load(path, threads=1).transformer  # float32: nothing to fuse
    assert fuse_projections(model) == 0
    attn, ffn = model.layers[0].self_attn, model.layers[0].mlp
    assert isinstance(attn, Attention) and isinstance(ffn, GatedFFN)
    attn.q_proj, attn.k_proj = quant(Q.Q5_0, 64, 64, 1), quant(Q.Q5_0, 32, 64, 2)
    attn.v_proj = quant(Q.Q8_0, 32, 64, 3)
    ffn.gate_proj, ffn.up_proj = quant(Q.Q5_0, 128, 64, 4, False), quant(Q.Q8_0, 128, 64, 5, False)
    x = torch.randn(1, 1, 64)
    with torch.inference_mode():
        want = model.layers[0](x, None, torch.tensor([0]))
        assert fuse_projections(model) == 1 and fuse_projections(model) == 0  # idempotent
        assert attn.qkv_split == (64, 32) and ffn.gate_up_split == ()
        got = model.layers[0](x, None, torch.tensor([0]))
    assert torch.equal(attn.qkv_proj.bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias]))
    if load_kernels() is not None:
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_join_rows_views_consecutive_bands_and_copies_the_rest() -> None:
    buf = torch.arange(24.0).view(6, 4)  # (rows, columns)
    joined = join_rows([buf[0:2], buf[2:5], buf[5:6]])
    assert torch.equal(joined, buf) and joined.data_ptr() == buf.data_ptr()  # a view
    for parts in ([buf[0:2].clone(), buf[2:6].clone()], [buf[2:4], buf[0:2]], [buf[0:2], buf[3:5]]):
        got = join_rows(parts)  # separate buffers, out of order, a gap: a copy
        assert torch.equal(got, torch.cat(parts)) and got.data_ptr() != buf.data_ptr()


@pytest.mark.parametrize("v_type", [None, Q.F16], ids=["v-packed", "v-F16"])
@pytest.mark.parametrize("sorted_names", [False, True], ids=["qkv-order", "name-order"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
def test_compact_load_fuses_without_a_copy(tmp_path, monkeypatch, qtype: Q,
                                           sorted_names: bool, v_type: Q | None) -> None:
    """A compact load packs each block's Q/K/V and gate/up into shared buffers as it goes
    (quant/from_file.pack_group), so fusing them is a view: no buffer is held twice at the
    peak of the load. Also where the file lists attn_k before attn_q (real files sort names:
    packed in file order, K's rows came first and fusing Q, K, V copied them), and where V is
    not packed (F16: kept 16-bit, a HalfLinear), so Q and K fuse alone (an incomplete group; a
    breaker's case)."""
    views = []

    def spy(parts):
        out = join_rows(parts)
        views.append(out.data_ptr() == parts[0].data_ptr())
        return out

    monkeypatch.setattr(fuse, "join_rows", spy)
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, seed=3,
                            sorted_names=sorted_names,
                            tensor_types={"attn_v": v_type} if v_type else None)
    model = clearlm.load(path, threads=1).transformer
    attn = model.layers[0].self_attn
    assert len(attn.qkv_split) == (2 if v_type else 3) and model.layers[0].mlp.gate_up_split
    assert isinstance(attn.v_proj, HalfLinear if v_type else QuantLinear)
    n_layers = len(model.layers)
    per = 3 if qtype == Q.Q4_1 else 2  # codes, scale (and min for Q4_1)
    assert len(views) == 2 * n_layers * per and all(views)


QWEN = Path.home() / ".cache" / "clearlm" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.mark.skipif(not QWEN.is_file(), reason="run `clearlm pull qwen2.5-coder-0.5b-instruct`")
def test_pack_group_shares_the_leading_members_that_agree() -> None:
    """Qwen2.5's layer 0 has Q5_0 Q and K and a Q8_0 V: Q and K are packed into one buffer
    (fuse.py fuses exactly those two), V apart, each with the bytes pack_tensor gives alone, in
    row tiles as a compact load packs them (quant/tiles.tile_size), or row-major."""
    from clearlm.loading.compact.from_file import pack_group, pack_tensor
    from clearlm.loading.gguf_file import GGUFFile

    f = GGUFFile(QWEN)
    by_name = {t.name: t for t in f.tensors}
    for tile in (8, 1):
        members = [(by_name[f"blk.0.attn_{x}.weight"], None, tile) for x in ("q", "k", "v")]
        assert [t.tensor_type.name for t, _, _ in members] == ["Q5_0", "Q5_0", "Q8_0"]
        q, k, v = pack_group(f, members)
        assert q.tile == k.tile == v.tile == tile
        assert k.codes.untyped_storage().data_ptr() == q.codes.untyped_storage().data_ptr()
        assert k.codes.storage_offset() == q.codes.numel()
        assert v.codes.untyped_storage().data_ptr() != q.codes.untyped_storage().data_ptr()
        for got, (t, _, _) in zip((q, k, v), members, strict=True):
            want = pack_tensor(f, t, tile=tile)
            assert torch.equal(got.codes, want.codes) and torch.equal(got.scale, want.scale)
            assert torch.equal(got.min, want.min) if want.min is not None else got.min is None
