"""QuantEmbedding: a drop-in for nn.Embedding whose table stays block-quantized.

A lookup gathers the selected rows' codes, scales and mins (a Packed of T rows) and dequantizes
only those, so the result equals ``gguf.quants.dequantize(table)[ids]`` bit for bit. With a tied
head, the embedding and the QuantLinear head share one Packed (no second copy of the table).
While traced (the compiled decode step), rows of K-quants with super-block heads
(quant/kheads.py) and of IQ4's table codes are dequantized by the kernel's operator (quant/ops.py:
compiled_dequant), since their eager path reinterprets bytes as float16 or builds a table.
"""

from __future__ import annotations

import torch

from clearlm.quant.iq4 import TABLE4
from clearlm.quant.kheads import is_heads
from clearlm.quant.ops import compiled_dequant
from clearlm.quant.pack import Packed, PackedModule, dequantize_packed


class QuantEmbedding(PackedModule):
    """ids (...) int64 → (..., D) float32 rows of a (V, D) packed table."""

    def __init__(self, packed: Packed) -> None:
        super().__init__(packed)
        self.num_embeddings, self.embedding_dim = packed.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Raises IndexError for an id outside 0 .. V - 1 (as nn.Embedding; the check is a host
        read, skipped while torch.compile traces, where the caller's ids are already checked)."""
        flat = ids.reshape(-1)  # (T,)
        if not torch.compiler.is_compiling() and flat.numel() and (
                flat.min() < 0 or flat.max() >= self.num_embeddings):
            raise IndexError(f"token id out of range: the embedding table has "
                             f"{self.num_embeddings} rows (ids 0 .. {self.num_embeddings - 1})")
        p = self.packed(flat)  # only the rows asked for
        kernel_only = is_heads(self.scale) or self.bits == TABLE4
        if kernel_only and torch.compiler.is_compiling():
            # K-quant heads' torch path reinterprets bytes as float16 and IQ4's builds a table
            # tensor: the kernel's
            # dequantization as one graph node (the same values bit for bit)
            mn = self.min if p.min is None else p.min
            rows = compiled_dequant(p.codes, p.scale, mn, self.bits, self.block)  # (T, D)
        else:
            rows = dequantize_packed(p)  # (T, D)
        return rows.reshape(*ids.shape, self.embedding_dim)  # (..., D)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype}"
