"""Load a GGUF with its block-quantized matrices kept compact (``weights="compact"``).

The chain (style.md: build on the meta device and assign, so nothing is held twice):

1. the module tree on the meta device (loading/load.py ``skeleton``): no weight memory;
2. each tensor of the file whose module is a plain ``nn.Linear`` / ``nn.Embedding`` and whose
   type pack.py keeps compact (Q8_0, Q4_0/1, Q5_0/1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, repacked at
   the file's bytes; the lattice i-quants IQ1 .. IQ3 and TQ as int8 codes, above the file's
   bytes, with one warning line per type as below: quant/lattice.py) is packed straight from the
   mapped bytes, a band of rows at a time (loading/compact/from_file.py), in row tiles (4 or 8
   rows) where a linear layer reads it (quant/tiles.py), and its module replaced by a
   QuantLinear / QuantEmbedding; a tied head shares the embedding's Packed. No float32 copy of
   these matrices ever exists, and their file pages are dropped from the process once packed. A
   mixture of experts' stacked ``ffn_*_exps`` tensor (E, F, D) is packed as one (E·F, D) matrix
   and each expert's layer gets its row band (``row_bands``: views, no copy); The first such
   load keeps what it packed on disk and later loads of the unchanged file map that copy instead
   of packing (loading/compact/pack_cache.py; ``CLEARLM_PACK_CACHE=0``: off);
3. every other tensor (norms, biases, F32/F16 matrices, types pack.py does not keep compact,
   fused projections the family splits) goes through the float32 loader's own steps
   (dequantize → un-permute → un-shift → the family's convert) and is assigned in place, but
   an F16 / BF16 matrix of a plain module, kept 16-bit as stored (loading/compact/half.py:
   HalfLinear / HalfEmbedding, the file's bytes; stacked experts' (E, F, D) tensor split into
   E views); an F16 / BF16 tensor held as float32 all the same (a matrix the family
   converts) costs one warning line per type,
   with the count and the memory above the file's bytes (:func:`warn_held_above_file`);
4. a block's Q/K/V and gate/up with the same packed layout become one matrix each
   (quant/fuse.py: one kernel call instead of three / two; the originals keep views of it),
   packed into shared buffers as a group (quant/from_file.pack_group), so fusing copies nothing.

The packed modules give the GGUF's dequantized values exactly (pack.py); only the float32
summation order of the products differs from ``weights="float32"``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch
from gguf import GGMLQuantizationType
from torch import nn

from clearlm.config import ModelConfig
from clearlm.families import gguf_arch
from clearlm.families.transforms import STACKED_EXPERTS, unpermute_qk, unshift_norm
from clearlm.loading.compact import pack_cache
from clearlm.loading.compact.from_file import pack_group, packed_nbytes, planned_tile
from clearlm.loading.compact.half import HALF_TYPES, half_weight, swap_half
from clearlm.loading.gguf import SUPPORTED_TENSOR_TYPES, dequantize_tensor, our_name, to_torch
from clearlm.loading.gguf_file import GGUFFile, GGUFTensor
from clearlm.loading.held import (
    HALF_HELD,
    NO_PACKER,
    NOT_READ,
    WIDE_HELD,
    FormatUse,
    warn_held_above_file,
)
from clearlm.loading.load import check_shapes, skeleton
from clearlm.model.transformer import Transformer
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.fuse import fuse_projections
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import SUPPORTED, WIDENED, Packed

TOKEN_EMBD, OUTPUT = "token_embd.weight", "output.weight"


@dataclass
class CompactPlan:
    """Which file tensors stay packed (``packed``) or 16-bit (``half``): GGUF name → the module
    paths (ours) that hold it (two for a tied embedding + head), and the bytes the weights will
    hold in memory, in all and per (GGUF type, how it is held)."""

    packed: dict[str, list[str]] = field(default_factory=dict)
    half: dict[str, list[str]] = field(default_factory=dict)  # F16 / BF16 kept 16-bit
    tiles: dict[str, int] = field(default_factory=dict)  # rows per row tile (quant/tiles.py)
    experts: dict[str, int] = field(default_factory=dict)  # stacked (E, F, D) tensors → E
    packed_bytes: int = 0  # packed matrices and 16-bit ones (half), in memory
    float_bytes: int = 0  # float tensors, at the load dtype's size
    formats: dict[tuple[str, str], FormatUse] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return self.packed_bytes + self.float_bytes

    def note(self, qtype: str, held_as: str, file_bytes: int, held_bytes: int) -> None:
        use = self.formats.setdefault((qtype, held_as), FormatUse(held_as))
        use.count += 1
        use.file_bytes += file_bytes
        use.held_bytes += held_bytes

    def above_file(self) -> list[tuple[str, FormatUse]]:
        """(type, use) of the tensors held above the file's bytes only because their type has
        no compact form at its size: as float32, or as int8 codes (the lattice i-quants, TQ).
        F32 tensors are not: they are float in the file too."""
        return [(q, u) for (q, how), u in self.formats.items() if how in (NO_PACKER, WIDE_HELD)]




def compact_plan(
    file: GGUFFile, config: ModelConfig, model: nn.Module, dtype: torch.dtype, source: str = ""
) -> CompactPlan:
    """Decide, from the tensor table and the module tree (meta is fine), what is packed.

    Raises UnsupportedModelError: a tensor name the architecture's table does not know."""
    arch = gguf_arch(config.architecture, source)
    names = {t.name for t in file.tensors}
    plan = CompactPlan()
    for t in file.tensors:
        ours = our_name(t, arch, config, source)
        if ours is None:
            continue
        paths = [ours.removesuffix(".weight")] if ours.endswith(".weight") else []
        if t.name == TOKEN_EMBD and OUTPUT not in names and config.tie_word_embeddings:
            paths.append("lm_head")  # tied: the embedding matrix is the output projection
        shape = each = tuple(reversed(t.shape))
        stacked = STACKED_EXPERTS.search(ours)
        if stacked is not None and len(shape) == 3:  # (E, F, D): E experts' row bands
            paths = [f"{ours[: stacked.start()]}.mlp.experts.{e}.{stacked.group(1)}_proj"
                     for e in range(shape[0])]
            each, shape = shape[1:], (shape[0] * shape[1], shape[2])
        if t.tensor_type in SUPPORTED and paths and all(_plain(model, p, each) for p in paths):
            plan.packed[t.name] = paths
            if stacked is not None and len(paths) > 1:
                plan.experts[t.name] = len(paths)
            plan.tiles[t.name] = _tile(model, paths, each, t.tensor_type)
            held = packed_nbytes(t.tensor_type, shape,  # type: ignore[arg-type]
                                 plan.tiles[t.name])
            plan.packed_bytes += held
            how = WIDE_HELD if t.tensor_type in WIDENED else "packed"
        elif t.tensor_type in HALF_TYPES and paths and all(_plain(model, p, each)
                                                            for p in paths):
            plan.half[t.name] = paths
            held = t.n_elements * 2  # the file's bytes
            plan.packed_bytes += held
            how = HALF_HELD
        else:
            held = t.n_elements * dtype.itemsize
            plan.float_bytes += held
            how = (f"{dtype_name(dtype)}, as stored" if t.tensor_type in FLOAT_AS_STORED
                   else f"{dtype_name(dtype)}, as its module needs" if t.tensor_type in SUPPORTED
                   or (t.tensor_type in HALF_TYPES and len(t.shape) == 1)  # norms, biases
                   else NO_PACKER if t.tensor_type in SUPPORTED_TENSOR_TYPES
                   else NOT_READ)  # the load refuses the file, naming the type
        plan.note(t.tensor_type.name, how, t.n_bytes, held)
    return plan


FLOAT_AS_STORED = (GGMLQuantizationType.F32,)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_compact(
    file: GGUFFile, config: ModelConfig, dtype: torch.dtype = torch.float32, source: str = ""
) -> tuple[Transformer, CompactPlan]:
    """The model with its block-quantized matrices packed (see the module docstring).

    Raises:
        UnsupportedModelError: an unknown tensor name or a type neither packed nor dequantized.
        InvalidModelFileError: a tensor is truncated, has the wrong shape, is missing or extra.
    """
    arch = gguf_arch(config.architecture, source)
    model = skeleton(config)
    plan = compact_plan(file, config, model, dtype, source)
    jobs = pack_jobs(file, plan, arch, config, source)
    tensors = [[t for t, _, _ in members] for members in jobs]
    tiles = [[plan.tiles[t.name] for t in job] for job in tensors]
    done = pack_cache.read(file.path, tensors, tiles)  # a packed copy: mapped, not packed
    state: dict[str, torch.Tensor] = {}
    # Packing is numpy copies that release the GIL: torch's thread count packs tensors side by
    # side while this thread dequantizes the float ones (same bytes, same results).
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        futures = [] if done is not None else [
            pool.submit(pack_group, file,
                        [(t, heads, plan.tiles[t.name]) for t, heads, _ in members])
            for members in jobs
        ]
        for t in file.tensors:
            ours = our_name(t, arch, config, source)
            if ours is None or t.name in plan.packed:
                continue
            if t.name in plan.half:  # kept 16-bit: the file's bytes, rows un-permuted
                w16 = half_weight(t, ours, arch.unpermute_qk, config)  # (out, in) or (E, F, D)
                if w16.dim() == 3:  # stacked experts: expert e's layer holds w16[e], a view
                    for e, path in enumerate(plan.half[t.name]):
                        swap_half(model, w16[e], [path])
                else:
                    swap_half(model, w16, plan.half[t.name])
                file.release(t.data_offset, t.n_bytes)
                continue
            w = dequantize_tensor(t, source)  # (out, in) float32, as loading/gguf.py
            if arch.unpermute_qk:
                w = unpermute_qk(ours, w, config)
            state[ours] = to_torch(unshift_norm(ours, w, arch.norm_shift), dtype)
            file.release(t.data_offset, t.n_bytes)
        fresh = done is None
        if fresh:
            done = [job.result() for job in futures]
    for members, packed_each in zip(jobs, done, strict=True):
        for (t, _, paths), packed in zip(members, packed_each, strict=True):
            if t.name in plan.experts:  # one packed (E·F, D) matrix: a row band per expert
                for path, band in zip(paths, row_bands(packed, len(paths)), strict=True):
                    _swap(model, band, [path])
            else:
                _swap(model, packed, paths)
    state = arch.convert(state, config)
    tied_float = config.tie_word_embeddings and "embed_tokens.weight" in state
    if tied_float:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    check_shapes(model, state, source, meta_only=True)  # the float rest, still on meta
    if fresh:  # written once the whole file is known good: a refused file leaves no copy
        pack_cache.write(file.path, tensors, done)
    model.load_state_dict(state, strict=False, assign=True)
    if tied_float:
        model.lm_head.weight = model.embed_tokens.weight
    model.init_derived()
    fuse_projections(model)  # Q/K/V and gate/up as one kernel call each where formats agree
    if plan.packed or plan.half:
        load_kernels()  # built here on first use (a minute, said on stderr), not in the prefill
    warn_held_above_file(plan.above_file())  # once the file is known good: no line before an error
    return model.eval(), plan


# the projections quant/fuse.py joins, by their parent module's name: how many make a group
FUSE_GROUPS = {"self_attn": 3, "mlp": 2}
_FUSED = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp"}


def _fuse_group_of(paths: list[str]) -> str | None:
    """The parent module (``layers.3.self_attn``, ``layers.3.mlp``) whose fused matrix this
    tensor will be part of, or None."""
    if len(paths) != 1:
        return None
    parent, _, name = paths[0].rpartition(".")
    kind = _FUSED.get(name)
    return parent if kind is not None and parent.endswith("." + kind) else None


def _fuse_rank(member: tuple) -> int:
    """Where a member (tensor, rope heads, module paths) sits in its fused matrix."""
    return list(_FUSED).index(member[2][0].rpartition(".")[2])


def pack_jobs(file: GGUFFile, plan: CompactPlan, arch, config: ModelConfig,
              source: str = "") -> list[list[tuple]]:
    """The packing jobs of a compact load, in file order: each a list of (tensor, rope heads,
    module paths) members packed together (a block's Q/K/V or gate/up, in that order:
    quant/from_file.pack_group), or one tensor alone."""
    jobs: list[list[tuple]] = []
    groups: dict[str, list] = {}  # a block's Q/K/V or gate/up, until all its members are seen
    for t in file.tensors:
        if t.name not in plan.packed or our_name(t, arch, config, source) is None:
            continue
        paths = plan.packed[t.name]
        if t.name in plan.experts:  # packed as one (E·F, D) matrix, split after (row_bands)
            t = flat_experts(t)
        heads = _rope_heads(paths[0], config) if arch.unpermute_qk else None
        group = _fuse_group_of(paths)
        if group is None:
            jobs.append([(t, heads, paths)])
            continue
        members = groups.setdefault(group, [])
        members.append((t, heads, paths))
        if len(members) == FUSE_GROUPS[group.rpartition(".")[2]]:
            # in the order fuse.py joins them (q, k, v / gate, up), not the file's: GGUF
            # writers often sort names (attn_k before attn_q), and members packed k-then-q
            # are not the leading rows fuse_group needs for a view, so it copied them
            jobs.append(sorted(groups.pop(group), key=_fuse_rank))
    # incomplete groups last (a V or up that is not packed), their members in fused order too
    return jobs + [sorted(members, key=_fuse_rank) for members in groups.values()]


def flat_experts(t: GGUFTensor) -> GGUFTensor:
    """A stacked expert tensor (GGUF shape (D, F, E), innermost first) seen as one (E·F, D)
    matrix: the same bytes, each expert's F rows after the previous one's."""
    k, f, e = t.shape
    return replace(t, shape=(k, f * e), data=t.data.reshape(f * e, -1))


def row_bands(p: Packed, n: int) -> list[Packed]:
    """``p`` cut into n equal bands of rows (views: no copy), one per expert; each band is
    whole row tiles, since the plan tiles a stacked tensor by one expert's rows."""
    step = p.codes.shape[0] // n  # rows, or tiles of rows

    def cut(a: torch.Tensor | None, i: int) -> torch.Tensor | None:
        return None if a is None else a[i * step : (i + 1) * step]

    return [Packed(cut(p.codes, i), cut(p.scale, i), cut(p.min, i), p.bits, p.block,  # type: ignore[arg-type]
                   p.qtype) for i in range(n)]


def _plain(model: nn.Module, path: str, shape: tuple[int, ...]) -> bool:
    """Is ``path`` a plain nn.Linear / nn.Embedding whose weight has this (out, in) shape?"""
    try:
        m = model.get_submodule(path)
    except AttributeError:
        return False
    return type(m) in (nn.Linear, nn.Embedding) and tuple(m.weight.shape) == shape


def _tile(model: nn.Module, paths: list[str], shape: tuple[int, ...], qtype: object) -> int:
    """Rows per row tile for a packed tensor of this GGML type (quant/from_file.planned_tile):
    tiles where a decode product reads it (an nn.Linear, a tied head included) and its rows
    fill whole tiles; row-major for an embedding alone."""
    linear = any(type(model.get_submodule(p)) is nn.Linear for p in paths)
    return planned_tile(qtype, shape, linear)  # type: ignore[arg-type]


def _rope_heads(path: str, config: ModelConfig) -> int | None:
    """Heads whose rows llama.cpp permuted in this projection (None: not Q or K)."""
    if path.endswith("q_proj"):
        return config.n_heads
    return config.n_kv_heads if path.endswith("k_proj") else None


def _swap(model: nn.Module, packed: Packed, paths: list[str]) -> None:
    """Put one packed tensor behind every module in ``paths``; a bias stays a meta buffer until
    the float tensors are assigned."""
    for path in paths:
        old = model.get_submodule(path)
        if type(old) is nn.Embedding:
            new: nn.Module = QuantEmbedding(packed)
        else:
            new = QuantLinear(packed, old.bias)  # old.bias: None or a meta tensor, assigned later
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
