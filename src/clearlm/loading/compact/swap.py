"""Swap a loaded model's linear (and embedding) layers for compact ones built from the GGUF.

``clearlm.load(weights="compact")`` builds the compact model directly (loading/compact/load.py,
no float32 copy); this swap after a float32 load is the reference tests compare it with.

``quantize_model(model, reader, config)`` walks the file's tensors, maps each name to ours with
the architecture's table (loading/gguf.py: ``gguf_to_ours``), and where the target module is an
``nn.Linear`` and the tensor's type is in :data:`clearlm.quant.pack.SUPPORTED`, replaces the
module by a QuantLinear holding the repacked blocks (no float32 copy is made of them). The same
layout fixes the float32 loader applies are applied to the packed rows: llama's Q/K row
un-permutation is a permutation of output rows, so it permutes codes, scales and mins alike.
The embedding (``nn.Embedding``) becomes a QuantEmbedding; a tied head (no ``output.weight``)
is a QuantLinear over the same packed table, so the table is held once. Tensors of other types
(F32, F16, Q2_K, ...) and modules that are not plain ``nn.Linear`` / ``nn.Embedding`` (GPT-2's
fused QKV, split at load) keep their float weights.
Last, as the compact load does, Q/K/V and gate/up with the same packed layout are fused into one
matrix each (clearlm.quant.fuse.fuse_projections).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.families import gguf_arch
from clearlm.families.transforms import unpermute_rope_rows
from clearlm.loading.compact.from_file import planned_tile
from clearlm.loading.gguf import gguf_to_ours
from clearlm.loading.gguf_file import GGUFFile
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.fuse import fuse_projections
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import SUPPORTED, Packed, pack_blocks
from clearlm.quant.tiles import tile_rows


@dataclass
class SwapReport:
    """What quantize_model changed: module names swapped, float bytes replaced (a tied table
    counts twice, as the loader's two views of it) and packed bytes held (each table once)."""

    swapped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    float_bytes: int = 0
    packed_bytes: int = 0


def _permute_rows(p: Packed, n_heads: int) -> Packed:
    """Apply llama's Q/K row un-permutation to every per-row array of a packed weight."""
    idx = torch.from_numpy(unpermute_rope_rows(np.arange(p.shape[0])[:, None], n_heads)[:, 0])
    mn = None if p.min is None else p.min[idx].contiguous()
    return Packed(p.codes[idx].contiguous(), p.scale[idx].contiguous(), mn, p.bits, p.block,
                  p.qtype)


def quantize_model(model: nn.Module, reader: GGUFFile, config: ModelConfig) -> SwapReport:
    """Replace, in place, every nn.Linear / nn.Embedding whose GGUF tensor is block-quantized.

    model: built from the same file (loading.load.load_gguf_model), parameter names as ours.
    Raises UnsupportedModelError (from gguf_arch) for an architecture clearlm does not know."""
    arch = gguf_arch(config.architecture, "")
    names = {t.name for t in reader.tensors}
    report = SwapReport()
    for t in reader.tensors:
        ours = gguf_to_ours(t.name, arch.tensors, config.n_layers)
        if ours is None or not ours.endswith(".weight") or len(t.shape) != 2:
            continue
        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists [n_in, n_out]
        targets = [ours.removesuffix(".weight")]
        if t.name == "token_embd.weight" and "output.weight" not in names:
            targets.append("lm_head")  # tied head: the embedding matrix doubles as the output
        packed = None
        for path in targets:
            try:
                old = model.get_submodule(path)
            except AttributeError:
                continue
            if type(old) not in (nn.Linear, nn.Embedding) or shape != tuple(old.weight.shape):
                continue  # a layout the loader converts (fused projections): keep it float
            if t.tensor_type not in SUPPORTED:
                report.kept.append(path)
                continue
            if packed is None:  # row tiles where a linear layer reads it (as gguf_compact.py)
                linear = any(type(_module(model, p)) is nn.Linear for p in targets)
                tile = planned_tile(t.tensor_type, shape, linear)
                packed = _pack(t, shape, path, arch.unpermute_qk, config, tile)
                report.packed_bytes += packed.nbytes()
            if type(old) is nn.Embedding:
                new: nn.Module = QuantEmbedding(packed)
            else:
                new = QuantLinear(packed, old.bias.detach() if old.bias is not None else None)
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
            report.swapped.append(path)
            report.float_bytes += old.weight.nbytes
    fuse_projections(model)  # as loading/compact/load.py: Q/K/V and gate/up fused
    return report


def _module(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _pack(t, shape: tuple[int, int], path: str, unpermute_qk: bool, config: ModelConfig,
          tile: int) -> Packed:
    """Repack one reader tensor, with llama's Q/K rows put back in rotate-half order, in row
    tiles of ``tile`` rows (1: row-major)."""
    packed = pack_blocks(t.data, t.tensor_type, shape)
    if unpermute_qk and path.endswith("q_proj"):
        packed = _permute_rows(packed, config.n_heads)
    elif unpermute_qk and path.endswith("k_proj"):
        packed = _permute_rows(packed, config.n_kv_heads)
    return packed if tile == 1 else tile_rows(packed, tile)
