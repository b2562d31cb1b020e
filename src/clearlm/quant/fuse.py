"""Fuse projections that read the same input into one compact matrix: Q/K/V and gate/up.

A decode step calls the kernel once per matrix; each call costs a Python call, argument checks
and (with 2 threads) one OpenMP fork/join, and the small K/V matrices (SmolLM2: 192 rows) are
read at half the bandwidth of larger ones. Where the projections of one block have the same
packed layout (bits, block size, scale dtype, with or without mins and biases), their rows are
concatenated into one :class:`QuantLinear` (``self_attn.qkv_proj``: Q, K and V, or Q and K when
V's format differs, as in Qwen2.5's and Gemma 3's Q4_K_M files, whose V is Q8_0 in half the
layers; ``mlp.gate_up_proj``: gate then up) and the block computes that once and splits the
output. The original modules stay, their buffers now views of the fused ones (rows are
contiguous), so no byte is held twice (loading.load.held_bytes counts each storage once) and
code that reads ``q_proj`` still finds its weight. A compact load packs each group into shared
buffers as it goes (quant/from_file.pack_group), and fusing them is then a view, not a copy.

Numerics: the kernel sums every output row in the same order whatever rows are computed with it
(csrc/qgemv.cpp, dot_tile), so decode-sized calls (M ≤ SMALL_M) give bit-identical outputs;
prefill multiplies the dequantized rows with float32 matmul, where a larger N may change the
library's blocking and so the summation order (tests/quant/test_quant_fuse.py bounds both).
"""

from __future__ import annotations

import torch
from torch import nn

from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import Packed


def _layout(m: nn.Module) -> tuple | None:
    """What must agree for two QuantLinears to share one kernel call (None: not fusable)."""
    if type(m) is not QuantLinear:
        return None
    return (m.bits, m.block, m.scale.dtype, m.min.numel() > 0, m.bias is not None,
            m.in_features, m.int8, m.codes.device, m.packed().tile)


def join_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` along dim 0, or, where the parts already are consecutive row bands
    of one contiguous buffer (as quant/from_file.pack_group packs a group), a view of those rows
    of it: no copy."""
    first = parts[0]
    start = first.storage_offset()
    at = start
    for t in parts:
        if (not t.is_contiguous() or t.shape[1:] != first.shape[1:] or t.dtype != first.dtype
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != at):
            return torch.cat(parts, dim=0)
        at += t.numel()
    rows = sum(t.shape[0] for t in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), start)


def fuse_group(mods: list[QuantLinear]) -> QuantLinear:
    """One QuantLinear whose rows are ``mods``' rows in order; each of ``mods`` is repointed at
    its band of the fused buffers (views, no copy kept). ``mods`` must share :func:`_layout`."""
    def cat(name: str) -> torch.Tensor:
        return join_rows([m._buffers[name] for m in mods])

    first = mods[0]
    mn = cat("min") if first.min.numel() else None
    packed = Packed(cat("codes"), cat("scale"), mn, first.bits, first.block, first.qtype)
    bias = cat("bias") if first.bias is not None else None
    fused = QuantLinear(packed, bias)
    fused.int8 = first.int8
    tile = packed.tile  # codes / scale / min index whole tiles of rows (quant/tiles.py)
    r0 = 0
    for m in mods:
        r1 = r0 + m.out_features
        for name in ("codes", "scale", "min"):
            if name != "min" or mn is not None:
                setattr(m, name, fused._buffers[name][r0 // tile : r1 // tile])
        if m.bias is not None:
            m.bias = fused.bias[r0:r1]
        r0 = r1
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Fuse Q/K(/V) of every attention and gate/up of every gated FFN of ``model`` in place
    where their layouts agree; returns how many fused layers it made. Idempotent."""
    from clearlm.model.attention import Attention
    from clearlm.model.ffn import GatedFFN

    made = 0
    for mod in model.modules():
        if isinstance(mod, Attention) and not mod.qkv_split:
            q, k, v = mod.q_proj, mod.k_proj, mod.v_proj
            lay = _layout(q)
            if lay is None or _layout(k) != lay:
                continue
            group = [q, k, v] if _layout(v) == lay else [q, k]
            mod.qkv_proj = fuse_group(group)
            mod.qkv_split = tuple(m.out_features for m in group)
            made += 1
        elif isinstance(mod, GatedFFN) and not mod.gate_up_split:
            g, u = mod.gate_proj, mod.up_proj
            if _layout(g) is not None and _layout(g) == _layout(u):
                mod.gate_up_proj = fuse_group([g, u])
                mod.gate_up_split = (g.out_features, u.out_features)
                made += 1
    return made
