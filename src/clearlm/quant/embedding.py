"""QuantEmbedding: a drop-in for nn.Embedding whose table stays block-quantized.

A lookup gathers the selected rows' codes, scales and mins (a Packed of T rows) and dequantizes
only those, so the result equals ``gguf.quants.dequantize(table)[ids]`` bit for bit. With a tied
head, the embedding and the QuantLinear head share one Packed (no second copy of the table).
"""

from __future__ import annotations

import torch
from torch import nn

from clearlm.quant.pack import Packed, dequantize_packed


class QuantEmbedding(nn.Module):
    """ids (...) int64 → (..., D) float32 rows of a (V, D) packed table."""

    def __init__(self, packed: Packed) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = packed.shape
        self.bits, self.block, self.qtype = packed.bits, packed.block, packed.qtype
        self.register_buffer("codes", packed.codes)
        self.register_buffer("scale", packed.scale)
        empty = torch.empty(0, dtype=packed.scale.dtype)
        self.register_buffer("min", packed.min if packed.min is not None else empty)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)  # (T,)
        mn = self.min[flat] if self.min.numel() else None
        rows = Packed(self.codes[flat], self.scale[flat], mn, self.bits, self.block, self.qtype)
        return dequantize_packed(rows).reshape(*ids.shape, self.embedding_dim)  # (..., D)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype}"
