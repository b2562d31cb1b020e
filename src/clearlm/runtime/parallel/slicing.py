"""Read only one rank's part of a checkpoint: whole tensors, some rows, or a column range.

A rank's *plan* says, for each of our parameter names, what it keeps (:class:`Take`) or None
(not this rank's). Tensors are read one at a time and only the kept part stays, so a rank never
holds the whole model (tensor.py and pipeline.py make the plans).

GGUF (the file is memory-mapped; a tensor's ``data`` is (rows, bytes per row)):
- a row selection indexes the stored rows first and dequantizes only those: GGUF rows are the
  output features, and each row's quantization blocks lie inside it;
- a column range [c0, c1) (the input features of o_proj / down_proj) is cut from the bytes
  when c0 and c1 fall on the type's block boundaries (32 or 256 values); otherwise the rows
  are dequantized whole, one tensor at a time, then cut (Q4_K with 448 = 7 heads of 64);
- llama's Q/K rows were permuted per head by llama.cpp's converter; a plan takes whole heads,
  so the un-permutation (families/transforms.py) is applied to the taken heads alone;
- fused tensors (GPT-2's attn_qkv, Phi-3's qkv and gate_up) are read whole, split by the
  family's ``convert``, then cut.
Safetensors folders are read one layer at a time (the family's ``convert`` needs a layer's
tensors together: GPT-2's Conv1D transposes and fused QKV), and each kept part is copied out.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf.quants import dequantize
from safetensors import safe_open

from clearlm.config import ModelConfig
from clearlm.families import family_for, gguf_arch
from clearlm.families.transforms import unpermute_rope_rows, unshift_norm
from clearlm.loading.gguf import _stored_shape, dequantize_tensor, our_name
from clearlm.loading.hf import safetensors_files


@dataclass(frozen=True)
class Take:
    """What a rank keeps of one tensor: all of it (the default), the rows ``rows`` (output
    features, in order), or the columns [cols[0], cols[1]) (input features)."""

    rows: tuple[int, ...] | None = None
    cols: tuple[int, int] | None = None

    def apply(self, w: torch.Tensor) -> torch.Tensor:
        """The kept part of a whole tensor (a copy, so the whole can be freed)."""
        if self.rows is not None:
            w = w[torch.tensor(self.rows, dtype=torch.long)]
        if self.cols is not None:
            w = w[..., self.cols[0] : self.cols[1]]
        return w.clone()


Plan = Callable[[str], Take | None]
FUSED = ("qkv_proj", "gate_up_proj")


def _wanted(plan: Plan, name: str) -> bool:
    """Does the rank keep anything of ``name`` (a fused name: of the parts it splits into)?"""
    if any(f in name for f in FUSED):
        parts = [name.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
        parts += [name.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")]
        return any(plan(p) is not None for p in parts if p != name)
    return plan(name) is not None


def _read_gguf_part(t, take: Take, source: str) -> np.ndarray:
    """The kept part of GGUF tensor ``t`` in float32, reading as few bytes as the type allows."""
    shape = _stored_shape(t)
    if len(shape) != 2:  # norms and biases: small, read whole
        w = dequantize_tensor(t, source)
        return take.apply(torch.from_numpy(np.array(w, dtype=np.float32))).numpy()
    data, n_in = t.data, shape[1]
    if take.rows is not None:
        data = data[np.asarray(take.rows)]  # (r, bytes per row): only these rows are read
    if take.cols is not None:
        c0, c1 = take.cols
        block, nbytes = GGML_QUANT_SIZES[t.tensor_type]
        if c0 % block == 0 and c1 % block == 0:  # whole blocks: cut the bytes
            if data.shape[1] == n_in:  # F32/F16 come as values, not bytes
                data, n_in = data[:, c0:c1], c1 - c0
            else:  # bytes: nbytes per block of `block` values
                data, n_in = data[:, c0 // block * nbytes : c1 // block * nbytes], c1 - c0
            w = dequantize(np.ascontiguousarray(data), t.tensor_type)
            return np.asarray(w, dtype=np.float32).reshape(len(data), n_in)
        w = dequantize(np.ascontiguousarray(data), t.tensor_type).reshape(len(data), n_in)
        return np.array(w[:, c0:c1], dtype=np.float32)
    w = dequantize(np.ascontiguousarray(data), t.tensor_type)
    return np.asarray(w, dtype=np.float32).reshape(len(data), n_in)


def read_gguf_part(
    reader: GGUFReader, config: ModelConfig, plan: Plan, source: str = ""
) -> dict[str, torch.Tensor]:
    """Our parameter name → the kept part, float32, for every tensor the plan keeps.

    Raises: what loading/gguf.py raises for unknown names, types and truncated data."""
    arch = gguf_arch(config.architecture, source)
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        ours = our_name(t, arch, config, source)
        if ours is None or not _wanted(plan, ours):
            continue  # not this rank's: its bytes are never touched
        if any(f in ours for f in FUSED):
            w = unshift_norm(ours, dequantize_tensor(t, source), arch.norm_shift)
            whole = torch.from_numpy(np.array(w, dtype=np.float32))
            for name, part in arch.convert({ours: whole}, config).items():
                take = plan(name)
                if take is not None:
                    out[name] = take.apply(part)
            continue
        take = plan(ours)
        assert take is not None
        w = _read_gguf_part(t, take, source)
        if arch.unpermute_qk and ours.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute_rope_rows(w, w.shape[0] // config.head_dim)  # whole heads only
        w = unshift_norm(ours, w, arch.norm_shift)
        out[ours] = torch.from_numpy(np.array(w, dtype=np.float32))
    return out


def read_hf_part(folder: Path, config: ModelConfig, plan: Plan) -> dict[str, torch.Tensor]:
    """The same for a safetensors folder, one layer's tensors at a time.

    Raises: InvalidModelFileError, ModelNotFoundError, UnsupportedModelError (loading/hf.py)."""
    import json

    raw = json.loads((folder / "config.json").read_text())
    family = family_for(raw.get("model_type"), str(folder / "config.json"))
    out: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        groups: dict[int, list[tuple[object, str, str]]] = {}
        for f in safetensors_files(folder):
            sf = stack.enter_context(safe_open(str(f), framework="pt"))
            for key in sf.keys():
                ours = family.rename(key)
                if not ours:
                    continue
                layer = int(ours.split(".")[1]) if ours.startswith("layers.") else -1
                groups.setdefault(layer, []).append((sf, key, ours))
        for members in groups.values():
            if not any(_wanted(plan, ours) for _, _, ours in members):
                continue  # a layer another rank holds: nothing read
            state = {ours: sf.get_tensor(key) for sf, key, ours in members}  # type: ignore[attr-defined]
            for name, w in family.convert(state, config).items():
                take = plan(name)
                if take is not None:
                    out[name] = take.apply(w.float())
    return out
