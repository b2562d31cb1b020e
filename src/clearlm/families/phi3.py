"""Phi-3 and Phi-4 (Abdin et al. 2024, "Phi-3 Technical Report"; config.json model_type
"phi3"): Llama's layers with fused projections, read from transformers'
``models/phi3/modeling_phi3.py`` and ``configuration_phi3.py`` (v5).

- stage 2: one ``qkv_proj`` produces Q, K and V (rows [Q | K | V]: H·Hd, K·Hd, K·Hd), split here
  into q/k/v_proj; RoPE may rotate only the first ``partial_rotary_factor`` · Hd dimensions of
  each head (Phi-4-mini: 0.75); ``sliding_window``, when set, applies to every layer
  (Phi-3-mini-4k: 2047);
- stage 3: one ``gate_up_proj`` produces the SwiGLU gate and up projections (rows [gate | up],
  transformers' ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``), split here.

The 128k-context checkpoints (Phi-3-*-128k, Phi-3.5, Phi-4-mini) use "longrope" (LongRoPE,
Ding et al. 2024: per-frequency rescaling factors switched on past the original context, plus an
attention-logit factor); clearlm does not implement it and says so. Old files name it "su" or
"yarn", which transformers also maps to longrope.

llama.cpp's GGUF architecture "phi3" keeps both fusions (``attn_qkv``, and ``ffn_up`` holding
[gate | up]); PHI3_TENSORS maps them to the same fused names so ``split_fused`` serves both
formats.
"""

from __future__ import annotations

from typing import Any

from clearlm.config import ModelConfig
from clearlm.errors import UnsupportedModelError
from clearlm.families.base import (
    COMMON_TENSORS,
    HEAD_KEYS,
    ROPE_KEYS,
    Family,
    GGUFArch,
    HFConfig,
    activation_from_hf,
    decoder_core,
    rope_from_hf,
)
from clearlm.families.transforms import StateDict, split_gate_up, split_qkv

LONGROPE = ("longrope", "su", "yarn")


def phi3_config(c: HFConfig) -> dict[str, Any]:
    """config.json → ModelConfig fields (absent optional keys take Phi3Config's defaults)."""
    params = dict(c.get("rope_parameters") or {})
    scaling = c.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind in LONGROPE:
        raise UnsupportedModelError(
            f"{c.source}: rope scaling 'longrope' (rope_type {kind!r}; Phi-3 128k, Phi-3.5, "
            "Phi-4-mini) is not supported"
        )
    cfg = dict(decoder_core(c), **rope_from_hf(c))
    factor = float(params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
    # transformers: dim = int(head_dim · partial_rotary_factor) (Phi3RotaryEmbedding).
    cfg["rope_dim"] = int(cfg["head_dim"] * factor)
    window = c.get("sliding_window")
    cfg.update(
        sliding_window=int(window) if window else None,
        activation=activation_from_hf(c.get("hidden_act", "silu"), c.source),
    )
    return cfg


def split_fused(state: StateDict, config: ModelConfig) -> StateDict:
    """qkv_proj → q/k/v_proj and gate_up_proj → gate/up_proj (Hugging Face and GGUF files)."""
    return split_gate_up(split_qkv(state, config), config)


def phi3_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "phi3" (llama.cpp's Phi3MiniModel): ``rope.dimension_count`` already carries the
    partial rotary size. The converter writes ``rope.scaling.attn_factor`` (and the
    rope_factors_long/short tensors) only for longrope models, which are refused. Its
    ``attention.sliding_window`` (config.json's, e.g. 2047 for Phi-3-mini-4k) applies to every
    layer, as in transformers' Phi3 on the original folder; llama.cpp's loader and transformers'
    GGUF loader leave it out, which changes the numbers only past the window. 0: no window."""
    if f"{a}.rope.scaling.attn_factor" in m:
        raise UnsupportedModelError(
            f"{a}.rope.scaling.attn_factor is set: rope scaling 'longrope' is not supported"
        )
    window = int(m.get(f"{a}.attention.sliding_window", 0))
    return {"sliding_window": window or None}


PHI3 = Family("Phi-3", ("phi3",), phi3_config, convert=split_fused)
FAMILIES = (PHI3,)

# Phi-3 (Phi3MiniModel): fused attn_qkv (rows [Q | K | V]) and ffn_up holding [gate | up].
PHI3_TENSORS = COMMON_TENSORS | {
    "blk.{i}.attn_qkv.weight": "layers.{i}.self_attn.qkv_proj.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.mlp.gate_up_proj.weight",
}
GGUF_ARCHS = (
    GGUFArch(
        "phi3",
        PHI3_TENSORS,
        family="Phi-3",
        config=phi3_gguf_config,
        convert=split_fused,
        keys=ROPE_KEYS | HEAD_KEYS | {"attention.sliding_window", "rope.scaling.attn_factor"},
    ),
)
