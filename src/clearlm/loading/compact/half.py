"""A compact load's F16 and BF16 matrices, kept 16-bit as the file stores them.

Where an F16 / BF16 tensor feeds a plain ``nn.Linear`` / ``nn.Embedding`` (the same test as
for packed types: loading/compact/load.py ``_plain``), its bytes are copied as they are into a
float16 / bfloat16 tensor, llama's Q/K rows un-permuted (a permutation of rows: no value
changes), and the module is replaced by a :class:`~clearlm.quant.half.HalfLinear` /
``HalfEmbedding``; a tied head shares the embedding's tensor; a mixture of experts' stacked
(E, F, D) tensor is read whole and expert e's layer holds its (F, D) view. Memory: the file's
bytes. Matrices a family converts stay float32 (and the load warns, loading/held.py).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from torch import nn

from clearlm.config import ModelConfig
from clearlm.families.transforms import unpermute_qk
from clearlm.loading.gguf_file import GGUFTensor
from clearlm.quant.half import HalfEmbedding, HalfLinear

HALF_TYPES = {GGMLQuantizationType.F16: torch.float16, GGMLQuantizationType.BF16: torch.bfloat16}


def half_weight(t: GGUFTensor, ours: str, unpermute: bool, config: ModelConfig) -> torch.Tensor:
    """The tensor as (out, in) float16 / bfloat16 (stacked experts: (E, F, D)), a copy of the
    file's bytes (the file is unmapped after the load), Q/K rows in rotate-half order where
    ``unpermute``."""
    shape = tuple(reversed(t.shape))  # GGUF lists [n_in, n_out]
    bits = t.data.view(np.uint16).reshape(shape)  # (out, in): the raw 16-bit patterns
    if unpermute:
        bits = unpermute_qk(ours, bits, config)
    return torch.from_numpy(np.array(bits, copy=True)).view(HALF_TYPES[t.tensor_type])


def swap_half(model: nn.Module, weight: torch.Tensor, paths: list[str]) -> None:
    """Put one 16-bit weight behind every module in ``paths`` (an embedding and its tied head
    share it); a bias stays a meta buffer until the float tensors are assigned."""
    for path in paths:
        old = model.get_submodule(path)
        new: nn.Module = (
            HalfEmbedding(weight) if type(old) is nn.Embedding else HalfLinear(weight, old.bias)
        )
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)


def half_state_keys(state: dict[str, torch.Tensor], model: nn.Module) -> set[str]:
    """The names in a Hugging Face state dict (ours, after the family's convert) to keep
    16-bit: float16 / bfloat16 ``*.weight`` matrices of a plain ``nn.Linear`` / ``nn.Embedding``
    of ``model`` (a skeleton; meta is fine) with the same shape."""
    keep = set()
    for name, v in state.items():
        if v.dtype not in HALF_TYPES.values() or v.dim() != 2 or not name.endswith(".weight"):
            continue
        try:
            m = model.get_submodule(name.removesuffix(".weight"))
        except AttributeError:
            continue
        if type(m) in (nn.Linear, nn.Embedding) and tuple(m.weight.shape) == tuple(v.shape):
            keep.add(name)
    return keep


def swap_half_modules(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` / ``nn.Embedding`` whose weight is float16 / bfloat16
    (assigned as the file holds it) by a HalfLinear / HalfEmbedding over the same tensor (a tied
    head's is the embedding's: still one table); returns how many."""
    swapped = [
        (n, m)
        for n, m in model.named_modules()
        if type(m) in (nn.Linear, nn.Embedding) and m.weight.dtype in HALF_TYPES.values()
    ]
    for path, old in swapped:
        w = old.weight.detach()
        bias = getattr(old, "bias", None)
        new: nn.Module = (
            HalfEmbedding(w)
            if type(old) is nn.Embedding
            else HalfLinear(w, None if bias is None else bias.detach())
        )
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    return len(swapped)
