"""Position-wise feed-forward networks (seed stage 3): the classic MLP and gated variants."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clearlm.config import ModelConfig
from clearlm.model.hooks import DirectCall, HookPoint

ACTIVATIONS = {
    "relu": F.relu,  # max(0, x): the original Transformer, OPT
    "gelu": F.gelu,  # x·Φ(x) (Hendrycks & Gimpel 2016), exact erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "silu": F.silu,  # x·σ(x) (Swish; Ramachandran et al. 2017)
}


class MLP(DirectCall):
    """FFN(x) = W2 · act(W1 · x + b1) + b2 (Vaswani et al. 2017, eq. 2); d_ff ≈ 4 · d_model.

    Named like transformers' gated MLPs: up_proj is W1, down_proj is W2.
    Shapes: (B, T, D) → (B, T, F) → (B, T, D).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.activation]
        self.hook_pre_act, self.hook_act, self.hook_out = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre_act(self.up_proj(x))  # (B, T, F)
        a = self.hook_act(self.act(pre))  # (B, T, F)
        return self.hook_out(self.down_proj(a))  # (B, T, D)


class GatedFFN(DirectCall):
    """Gated FFN (Shazeer 2020, "GLU Variants Improve Transformer"):
    W_down · (act(W_gate · x) ⊙ (W_up · x)); SwiGLU with SiLU (Llama), GeGLU with GELU (Gemma).

    Shapes: (B, T, D) → (B, T, F) → (B, T, D), or (N, D) → (N, D) for an expert's rows.
    ``d_ff`` (default config.d_ff) sets F; ``hooks=False`` leaves out the hook points (the
    experts of a mixture, model/moe.py, whose rows are a few tokens each: the mixture's own
    points show what they did).
    """

    def __init__(self, config: ModelConfig, d_ff: int | None = None, hooks: bool = True) -> None:
        super().__init__()
        d, bias = config.d_model, config.mlp_bias
        f = config.d_ff if d_ff is None else d_ff
        self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)
        self.act = ACTIVATIONS[config.activation]
        if hooks:
            self.hook_pre_act, self.hook_act, self.hook_out = HookPoint(), HookPoint(), HookPoint()
        else:
            self.hook_pre_act = self.hook_act = self.hook_out = _identity
        # (F, F) when gate and up are one compact matrix ``gate_up_proj`` (clearlm.quant.fuse)
        self.gate_up_split: tuple[int, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_split:  # one kernel call, split: the same values
            y = self.gate_up_proj(x)  # (B, T, 2F): gate, then up
            f = self.gate_up_split[0]
            gate, up = y[..., :f], y[..., f:]  # (B, T, F) each (slices: cheaper than split)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        pre = self.hook_pre_act(gate)  # (B, T, F): the gate
        a = self.hook_act(self.act(pre).mul_(up))  # (B, T, F); in place: one (B, T, F) less
        return self.hook_out(self.down_proj(a))  # (B, T, D)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def make_ffn(config: ModelConfig) -> nn.Module:
    """The FFN a config asks for."""
    return GatedFFN(config) if config.ffn == "gated" else MLP(config)
