"""OLMoE (Muennighoff et al. 2024, "OLMoE: Open Mixture-of-Experts Language Models";
config.json model_type "olmoe"), read from transformers' ``models/olmoe/modeling_olmoe.py``
(v5): Llama's layers with

- stage 2: RMSNorm on q and k over the whole projection (``q_norm`` over H·Hd, ``k_norm`` over
  K·Hd), before the heads are split and rotated, unlike Qwen3's per-head norms; with
  ``clip_qkv`` q, k and v are clamped to ±clip_qkv after it;
- stage 3: a mixture of ``num_experts`` SwiGLU experts of width ``intermediate_size`` in every
  layer, ``num_experts_per_tok`` per token, renormalised only with ``norm_topk_prob`` (false
  for the released OLMoE-1B-7B).

GGUF: llama.cpp's "olmoe" (``attn_q_norm`` / ``attn_k_norm`` over the projection, stacked
experts of width ``feed_forward_length``, ``attention.clamp_kqv`` for clip_qkv; llm_build_olmoe
does not renormalise).
"""

from __future__ import annotations

from typing import Any

from clearlm.families.base import (
    COMMON_TENSORS,
    EXPERT_KEYS,
    EXPERT_TENSORS,
    HEAD_KEYS,
    QK_NORMS,
    ROPE_KEYS,
    Family,
    GGUFArch,
    HFConfig,
    moe_from_gguf,
)
from clearlm.families.llama import llama_config
from clearlm.families.transforms import split_experts


def olmoe_config(c: HFConfig) -> dict[str, Any]:
    """OlmoeConfig keys → ModelConfig fields."""
    clip = c.get("clip_qkv")
    return dict(
        llama_config(c),
        qk_norm=True,
        qk_norm_scope="all",
        clip_qkv=float(clip) if clip is not None else None,
        n_experts=int(c.get("num_experts") or c.req("num_local_experts")),
        n_experts_used=int(c.req("num_experts_per_tok")),
        norm_topk_prob=bool(c.get("norm_topk_prob", False)),
    )


def olmoe_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "olmoe": q/k norms over the projection, ``attention.clamp_kqv`` (0: none), experts
    without renormalisation."""
    clip = float(m.get(f"{a}.attention.clamp_kqv", 0.0))
    return dict(
        qk_norm=True,
        qk_norm_scope="all",
        clip_qkv=clip or None,
        **moe_from_gguf(m, a, norm_topk_prob=False),
    )


OLMOE = Family("OLMoE", ("olmoe",), olmoe_config)
FAMILIES = (OLMOE,)

GGUF_ARCHS = (
    GGUFArch(
        "olmoe",
        {**COMMON_TENSORS, **QK_NORMS, **EXPERT_TENSORS},
        family="OLMoE",
        config=olmoe_gguf_config,
        convert=split_experts,
        keys=ROPE_KEYS | HEAD_KEYS | EXPERT_KEYS | {"attention.clamp_kqv"},
    ),
)
