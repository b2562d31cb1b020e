"""Llama 1/2/3 and SmolLM2, Mistral, Qwen2/2.5 and Qwen3: the shared layers with the
reference Llama's names, differing only in config (Llama is every default of ModelConfig).

- Llama: RoPE (with linear/dynamic/llama3 scaling), grouped-query attention, SwiGLU, RMSNorm.
- Mistral: + a sliding window on every layer.
- Qwen2: + biases on the Q, K and V projections; optional sliding window (off by default).
- Qwen3: + RMSNorm on each head's queries and keys; explicit head_dim.

GGUF: llama.cpp writes Llama, Mistral, SmolLM2 and Mixtral as architecture "llama" (Q/K rows
permuted for its RoPE layout; Llama 3.1+ carry their RoPE scaling in a ``rope_freqs.weight``
tensor), Qwen2/2.5 as "qwen2" and Qwen3 as "qwen3" (Q/K rows in transformers' order).
"""

from __future__ import annotations

from typing import Any

from clearlm.families.base import (
    COMMON_TENSORS,
    EXPERT_KEYS,
    EXPERT_TENSORS,
    HEAD_KEYS,
    QK_NORMS,
    QKV_BIASES,
    ROPE_KEYS,
    Family,
    GGUFArch,
    HFConfig,
    activation_from_hf,
    decoder_core,
    moe_from_gguf,
    rope_from_hf,
)
from clearlm.families.transforms import split_experts


def llama_config(c: HFConfig) -> dict[str, Any]:
    """LlamaConfig keys → ModelConfig fields (transformers' modeling_llama); raises
    InvalidModelFileError for a missing required key, UnsupportedModelError for an unknown
    activation or RoPE scaling."""
    return dict(
        decoder_core(c),
        **rope_from_hf(c),
        attn_bias=bool(c.get("attention_bias", False)),
        attn_out_bias=bool(c.get("attention_bias", False)),
        mlp_bias=bool(c.get("mlp_bias", False)),
        activation=activation_from_hf(c.get("hidden_act", "silu"), c.source),
    )


def mistral_config(c: HFConfig) -> dict[str, Any]:
    """Llama's fields plus ``sliding_window`` on every layer (transformers' modeling_mistral)."""
    window = c.get("sliding_window")
    return dict(llama_config(c), sliding_window=int(window) if window else None)


def qwen2_config(c: HFConfig) -> dict[str, Any]:
    """Llama's fields with Q/K/V biases; the window only when ``use_sliding_window`` is set."""
    cfg = dict(llama_config(c), attn_bias=True, attn_out_bias=False)
    window = c.get("sliding_window")
    if c.get("use_sliding_window", False) and window:
        # transformers: layers from max_window_layers on use the window.
        first = int(c.get("max_window_layers", cfg["n_layers"]))
        types = tuple("sliding" if i >= first else "full" for i in range(cfg["n_layers"]))
        cfg.update(sliding_window=int(window), layer_types=types)
    return cfg


def qwen3_config(c: HFConfig) -> dict[str, Any]:
    """Qwen2's fields with per-head q/k RMSNorm; biases only when ``attention_bias`` is set."""
    cfg = dict(qwen2_config(c), qk_norm=True)
    cfg["attn_bias"] = cfg["attn_out_bias"] = bool(c.get("attention_bias", False))
    return cfg


def llama_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "llama": ``attention.sliding_window``, which llama.cpp's converter never writes for
    this architecture, means Mistral's window on every layer (as transformers' Mistral reads
    config.json's ``sliding_window``); 0 or absent means none. ``expert_count`` and
    ``expert_used_count`` make it Mixtral (families/mixtral.py): experts of width
    feed_forward_length in every layer, renormalised (llama.cpp's llm_build_llama)."""
    window = int(m.get(f"{a}.attention.sliding_window", 0))
    moe = moe_from_gguf(m, a, norm_topk_prob=True)
    if moe:
        moe["family"] = "Mixtral"
    return {"sliding_window": window, **moe} if window else moe


LLAMA = Family("Llama", ("llama",), llama_config)
MISTRAL = Family("Mistral", ("mistral",), mistral_config)
QWEN2 = Family("Qwen2", ("qwen2",), qwen2_config)
QWEN3 = Family("Qwen3", ("qwen3",), qwen3_config)
FAMILIES = (LLAMA, MISTRAL, QWEN2, QWEN3)

GGUF_ARCHS = (
    # Llama, Mistral, SmolLM2; Mixtral with expert_count and the stacked ffn_*_exps tensors
    GGUFArch(
        "llama",
        {**COMMON_TENSORS, **EXPERT_TENSORS},
        unpermute_qk=True,
        family="Llama",
        config=llama_gguf_config,
        convert=split_experts,
        keys=ROPE_KEYS | HEAD_KEYS | EXPERT_KEYS | {"attention.sliding_window"},
        rope_freqs=True,
    ),
    # Qwen2/2.5: Q/K/V biases; Q/K rows are stored in transformers' order (no permutation).
    GGUFArch(
        "qwen2",
        {**COMMON_TENSORS, **QKV_BIASES},
        family="Qwen2",
        config=lambda m, a: {"attn_bias": True},
    ),
    # Qwen3: RMSNorm on each head's q and k instead of biases.
    GGUFArch(
        "qwen3",
        {**COMMON_TENSORS, **QK_NORMS},
        family="Qwen3",
        config=lambda m, a: {"qk_norm": True},
    ),
)
