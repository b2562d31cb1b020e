"""Qwen2-MoE (Qwen1.5-MoE; model_type "qwen2_moe") and Qwen3-MoE ("qwen3_moe"): Qwen2's and
Qwen3's attention with a sparse mixture of experts, read from transformers'
``models/qwen2_moe/modeling_qwen2_moe.py`` and ``models/qwen3_moe/modeling_qwen3_moe.py`` (v5).

- stage 3: ``mlp.gate`` routes each token to ``num_experts_per_tok`` of ``num_experts`` SwiGLU
  experts of width ``moe_intermediate_size``; the top-k probabilities are renormalised only
  with ``norm_topk_prob`` (Qwen1.5-MoE: no; Qwen3-MoE: yes). Layers in ``mlp_only_layers``, or
  whose index + 1 is not a multiple of ``decoder_sparse_step``, keep a dense FFN of width
  ``intermediate_size``. Qwen2-MoE adds ``mlp.shared_expert`` (width
  ``shared_expert_intermediate_size``) that every token uses, times σ(``shared_expert_gate``·x).
- stage 2: Qwen2-MoE has biases on Q, K and V (``qkv_bias``); Qwen3-MoE RMSNorms each head's
  q and k. ``use_sliding_window`` (off in every released checkpoint) is refused.

GGUF: llama.cpp's "qwen2moe" and "qwen3moe" (Q/K rows in transformers' order; the expert
width in ``expert_feed_forward_length``, the shared expert's in
``expert_shared_feed_forward_length``). llama.cpp does not renormalise for qwen2moe and does
for qwen3moe (llm_build_qwen2moe / llm_build_qwen3moe), as the released models' config.json.
"""

from __future__ import annotations

from typing import Any

from clearlm.config import ModelConfig
from clearlm.errors import UnsupportedModelError
from clearlm.families.base import (
    COMMON_TENSORS,
    EXPERT_KEYS,
    EXPERT_TENSORS,
    HEAD_KEYS,
    QK_NORMS,
    QKV_BIASES,
    ROPE_KEYS,
    SHARED_EXPERT_TENSORS,
    Family,
    GGUFArch,
    HFConfig,
    moe_from_gguf,
)
from clearlm.families.llama import llama_config
from clearlm.families.transforms import StateDict, split_experts


def qwen_moe_experts(c: HFConfig, n_layers: int) -> dict[str, Any]:
    """The expert fields Qwen2-MoE and Qwen3-MoE spell alike (``num_experts`` 0: dense)."""
    if c.get("use_sliding_window", False):
        raise UnsupportedModelError(f"{c.source}: use_sliding_window is not supported")
    # transformers ≥ 5 saves Qwen3-MoE's count as num_local_experts; released files: num_experts
    n = int(c.get("num_experts", c.get("num_local_experts", 0)))
    if n == 0:
        return {}
    step, only = int(c.get("decoder_sparse_step", 1)), set(c.get("mlp_only_layers", []))
    # transformers: a layer is sparse iff not in mlp_only_layers and (i + 1) % step == 0
    dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    return dict(
        n_experts=n,
        n_experts_used=int(c.req("num_experts_per_tok")),
        expert_d_ff=int(c.req("moe_intermediate_size")),
        norm_topk_prob=bool(c.get("norm_topk_prob", False)),
        dense_layers=dense,
    )


def qwen2_moe_config(c: HFConfig) -> dict[str, Any]:
    """Qwen2MoeConfig keys → ModelConfig fields."""
    cfg = dict(llama_config(c), attn_bias=bool(c.get("qkv_bias", True)), attn_out_bias=False)
    cfg.update(qwen_moe_experts(c, cfg["n_layers"]))
    if cfg.get("n_experts"):
        cfg["shared_expert_d_ff"] = int(c.get("shared_expert_intermediate_size", 0))
    return cfg


def qwen3_moe_config(c: HFConfig) -> dict[str, Any]:
    """Qwen3MoeConfig keys → ModelConfig fields (per-head q/k RMSNorm, as Qwen3)."""
    cfg = dict(llama_config(c), qk_norm=True)
    cfg.update(qwen_moe_experts(c, cfg["n_layers"]))
    return cfg


def shared_gate_row(state: StateDict, config: ModelConfig) -> StateDict:
    """Stacked experts split per expert; the shared expert's gate, (D,) in a GGUF, as the
    (1, D) weight of its nn.Linear."""
    state = split_experts(state, config)
    for name, t in state.items():
        if name.endswith("shared_expert_gate.weight"):
            state[name] = t.reshape(1, -1)  # (1, D)
    return state


def qwen2moe_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "qwen2moe": Q/K/V biases, experts of width expert_feed_forward_length, the shared
    expert's width; llama.cpp does not renormalise the top-k weights for this architecture."""
    cfg = dict(attn_bias=True, **moe_from_gguf(m, a, norm_topk_prob=False))
    cfg["expert_d_ff"] = int(m.get(f"{a}.expert_feed_forward_length", 0))
    cfg["shared_expert_d_ff"] = int(m.get(f"{a}.expert_shared_feed_forward_length", 0))
    return cfg


def qwen3moe_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "qwen3moe": per-head q/k RMSNorm, renormalised top-k weights (llama.cpp)."""
    cfg = dict(qk_norm=True, **moe_from_gguf(m, a, norm_topk_prob=True))
    cfg["expert_d_ff"] = int(m.get(f"{a}.expert_feed_forward_length", 0))
    return cfg


QWEN2_MOE = Family("Qwen2-MoE", ("qwen2_moe",), qwen2_moe_config)
QWEN3_MOE = Family("Qwen3-MoE", ("qwen3_moe",), qwen3_moe_config)
FAMILIES = (QWEN2_MOE, QWEN3_MOE)

MOE_KEYS = ROPE_KEYS | HEAD_KEYS | EXPERT_KEYS | {"expert_feed_forward_length"}
GGUF_ARCHS = (
    GGUFArch(
        "qwen2moe",
        {**COMMON_TENSORS, **QKV_BIASES, **EXPERT_TENSORS, **SHARED_EXPERT_TENSORS},
        family="Qwen2-MoE",
        config=qwen2moe_gguf_config,
        convert=shared_gate_row,
        keys=MOE_KEYS | {"expert_shared_feed_forward_length"},
    ),
    GGUFArch(
        "qwen3moe",
        {**COMMON_TENSORS, **QK_NORMS, **EXPERT_TENSORS},
        family="Qwen3-MoE",
        config=qwen3moe_gguf_config,
        convert=split_experts,
        keys=MOE_KEYS,
    ),
)
