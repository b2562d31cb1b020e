"""Normalisation layers (seed stage 3): LayerNorm and RMSNorm, computed in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clearlm.config import ModelConfig
from clearlm.model.hooks import DirectCall


class RMSNorm(DirectCall):
    """Root-mean-square normalisation (Zhang & Sennrich 2019): y = x / √(mean(x²) + ε) · (w + o).

    Unlike LayerNorm it neither subtracts the mean nor adds a bias. ``offset`` o is 0 for Llama
    and 1 for Gemma, whose checkpoints store w - 1 (transformers' GemmaRMSNorm: x̂ · (1 + w)).
    Computed in float32 and cast back, as transformers does, so low-precision inputs keep their
    accuracy. Shapes: x (..., dim) → (..., dim), x's dtype.
    """

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype == torch.float32 and w.dtype == torch.float32:
            # torch's rms_norm computes the same x · rsqrt(mean(x²) + ε) · w in one call, not
            # the eight ops of :meth:`written_out` (bit-identical on CPU: test_decode_ops.py)
            return F.rms_norm(x, (x.shape[-1],), w + self.offset if self.offset else w, self.eps)
        return self.written_out(x)

    def written_out(self, x: torch.Tensor) -> torch.Tensor:
        """The formula op by op (any dtype: computed in float32, cast back as transformers)."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:  # Gemma multiplies in float32 before casting back
            return (x32 * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * x32.to(x.dtype)


class LayerNorm(DirectCall):
    """Layer normalisation (Ba et al. 2016), the seeds' formula: y = γ · (z − μ) / √(σ² + ε) + β.

    μ and σ² are the mean and the population variance over the last axis. Shapes: z (..., dim)
    → (..., dim), z's dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # γ
        self.bias = nn.Parameter(torch.zeros(dim))  # β
        self.eps = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z32 = z.float()
        mu = z32.mean(-1, keepdim=True)
        var = (z32 - mu).pow(2).mean(-1, keepdim=True)  # population variance, as the seeds
        y = (z32 - mu) * torch.rsqrt(var + self.eps)
        return (y * self.weight.float() + self.bias.float()).to(z.dtype)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """The norm a config asks for, over `dim` features (default d_model)."""
    dim = config.d_model if dim is None else dim
    if config.norm == "layer":
        return LayerNorm(dim, config.norm_eps)
    return RMSNorm(dim, config.norm_eps, config.norm_offset)
