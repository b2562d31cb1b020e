"""A compact load's F16 and BF16 matrices, kept 16-bit as the file stores them.

Where an F16 / BF16 tensor feeds a plain ``nn.Linear`` / ``nn.Embedding`` (the same test as
for packed types: loading/compact/load.py ``_plain``), its bytes are copied as they are into a
float16 / bfloat16 tensor, llama's Q/K rows un-permuted (a permutation of rows: no value
changes), and the module is replaced by a :class:`~clearlm.quant.half.HalfLinear` /
``HalfEmbedding``; a tied head shares the embedding's tensor. Memory: the file's bytes. Stacked
experts and matrices a family converts stay float32 (and the load warns, loading/held.py).
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
    """The tensor as (out, in) float16 / bfloat16, a copy of the file's bytes (the file is
    unmapped after the load), Q/K rows in rotate-half order where ``unpermute``."""
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
